// SPDX-License-Identifier: Apache-2.0
// The JSON field reader that names file and field in every error, and the matrix and vector writers
// (core/json.hpp).
#include "attnmix/core/json.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"

namespace attnmix {

using nlohmann::json;

// ----- ModelJsonField
// ---------------------------------------------------------------------------------------------

namespace {

std::string type_name_of(const json& v) {
  if (v.is_boolean()) return "a bool";
  if (v.is_null()) return "null";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "a number";
}

std::string join_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

}  // namespace

ModelJsonField::ModelJsonField(const json& value, std::string source, std::string path)
    : value_(&value), source_(std::move(source)), path_(std::move(path)) {}

std::string ModelJsonField::where(std::string_view message) const {
  std::string out = source_;
  if (!path_.empty()) out += ": " + path_;
  out += ": ";
  out += message;
  return out;
}

void ModelJsonField::fail(std::string_view message) const { throw ValueError(where(message)); }

void ModelJsonField::expect_object(std::span<const std::string_view> required,
                                   std::span<const std::string_view> optional) const {
  if (!value_->is_object()) fail("must be a JSON object (got " + type_name_of(*value_) + ")");
  for (std::string_view key : required)
    if (!value_->contains(key)) fail("missing field '" + std::string(key) + "'");
  for (const auto& item : value_->items()) {
    bool known = false;
    for (std::string_view key : required) known = known || key == item.key();
    for (std::string_view key : optional) known = known || key == item.key();
    if (!known) {
      std::string expected;
      for (std::string_view key : required)
        expected += (expected.empty() ? "" : ", ") + std::string(key);
      for (std::string_view key : optional)
        expected += (expected.empty() ? "" : ", ") + std::string(key);
      fail("unknown field '" + item.key() + "' (expected " + expected + ")");
    }
  }
}

bool ModelJsonField::has(std::string_view key) const {
  return value_->is_object() && value_->contains(key);
}

ModelJsonField ModelJsonField::operator[](std::string_view key) const {
  if (!value_->is_object()) fail("must be a JSON object (got " + type_name_of(*value_) + ")");
  const auto it = value_->find(key);
  if (it == value_->end()) fail("missing field '" + std::string(key) + "'");
  return {*it, source_, join_path(path_, key)};
}

std::vector<ModelJsonField> ModelJsonField::elements() const {
  if (!value_->is_array()) fail("must be an array (got " + type_name_of(*value_) + ")");
  std::vector<ModelJsonField> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i)
    out.emplace_back((*value_)[i], source_, path_ + "[" + std::to_string(i) + "]");
  return out;
}

double ModelJsonField::as_double() const {
  if (!value_->is_number()) fail("must be a number (got " + type_name_of(*value_) + ")");
  const double x = value_->get<double>();
  if (!std::isfinite(x)) fail("must be finite");
  return x;
}

int64_t ModelJsonField::as_int() const {
  // An integer field is written as a JSON integer (save_model writes one): 1e15 or 3.0 is a float in JSON, and a
  // float would round every integer above 2^53, so it is rejected rather than converted.
  if (value_->is_number_unsigned() && value_->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail("must be an integer of at most " + std::to_string(INT64_MAX) + " (got " + value_->dump() + ")");
  if (value_->is_number_integer()) return value_->get<int64_t>();
  if (value_->is_number_float())
    fail("must be an integer, written without a fraction or an exponent (got " + value_->dump() + ")");
  fail("must be an integer (got " + type_name_of(*value_) + ")");
}

std::string ModelJsonField::as_string() const {
  if (!value_->is_string()) fail("must be a string (got " + type_name_of(*value_) + ")");
  return value_->get<std::string>();
}

Vector ModelJsonField::as_vector() const {
  if (!value_->is_array()) fail("must be an array of numbers (got " + type_name_of(*value_) + ")");
  Vector out(static_cast<Index>(value_->size()));
  for (size_t i = 0; i < value_->size(); ++i) {
    const json& x = (*value_)[i];
    if (!x.is_number())
      fail("entry " + std::to_string(i) + " must be a number (got " + type_name_of(x) + ")");
    out[static_cast<Index>(i)] = x.get<double>();
  }
  return out;
}

namespace {
constexpr const char* kSparseRows = "sparse_rows";
}  // namespace

bool is_sparse_table(const json& v) {
  return v.is_object() && v.contains("layout") && v["layout"].is_string() && v["layout"] == kSparseRows;
}

Matrix ModelJsonField::as_matrix() const {
  if (value_->is_object()) return as_sparse_table();
  if (!value_->is_array())
    fail("must be a 2-D array of numbers (got " + type_name_of(*value_) + ")");
  const size_t rows = value_->size();
  size_t cols = 0;
  for (size_t r = 0; r < rows; ++r) {
    const json& row = (*value_)[r];
    if (!row.is_array())
      fail("row " + std::to_string(r) + " must be an array of numbers (got " + type_name_of(row) +
           ")");
    if (r == 0) cols = row.size();
    if (row.size() != cols)
      fail("row " + std::to_string(r) + " has " + std::to_string(row.size()) +
           " entries (row 0 has " + std::to_string(cols) + "); the array must be rectangular");
  }
  Matrix out(static_cast<Index>(rows), static_cast<Index>(cols));
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) {
      const json& x = (*value_)[r][c];
      if (!x.is_number())
        fail("entry [" + std::to_string(r) + ", " + std::to_string(c) + "] must be a number (got " +
             type_name_of(x) + ")");
      out(static_cast<Index>(r), static_cast<Index>(c)) = x.get<double>();
    }
  return out;
}

SparseRows ModelJsonField::as_sparse_rows() const { return sparse_rows(/*dense_limits=*/false); }

SparseRows ModelJsonField::sparse_rows(bool dense_limits) const {
  constexpr std::array<std::string_view, 5> kFields{"layout", "shape", "default", "columns", "values"};
  expect_object(kFields, {});
  const ModelJsonField layout = (*this)["layout"];
  if (layout.as_string() != kSparseRows)
    layout.fail(std::string("must be \"") + kSparseRows + "\" (got \"" + layout.as_string() + "\")");
  const ModelJsonField shape = (*this)["shape"];
  const std::vector<ModelJsonField> extent = shape.elements();
  if (extent.size() != 2) shape.fail("must be [rows, columns] (got " + std::to_string(extent.size()) + " entries)");
  SparseRows table;
  table.rows = extent[0].as_int();
  table.cols = extent[1].as_int();
  if (table.rows < 1 || table.cols < 1) shape.fail("must be two positive sizes");
  if (dense_limits && table.cols > kSparseTableMaxCells / table.rows)
    shape.fail(std::to_string(table.rows) + " x " + std::to_string(table.cols) + " is more than " +
               std::to_string(kSparseTableMaxCells) + " cells, the most a sparse table may hold");
  table.defaults = (*this)["default"].as_vector();
  const std::vector<ModelJsonField> columns = (*this)["columns"].elements();
  const std::vector<ModelJsonField> values = (*this)["values"].elements();
  for (const auto& [name, size] :
       {std::pair<const char*, size_t>{"default", static_cast<size_t>(table.defaults.size())},
        {"columns", columns.size()}, {"values", values.size()}})
    if (size != static_cast<size_t>(table.rows))
      (*this)[name].fail("must have one entry per row, " + std::to_string(table.rows) + " (got " +
                         std::to_string(size) + ")");
  Index cells = 0;
  for (const ModelJsonField& row : columns)
    cells += row.value().is_array() ? static_cast<Index>(row.value().size()) : 0;
  if (table.cols > kSparseCellsPerNumber * (table.rows + cells) / table.rows)
    shape.fail(std::to_string(table.rows) + " x " + std::to_string(table.cols) + " cells from " +
               std::to_string(table.rows + cells) + " numbers: a sparse table implies at most " +
               std::to_string(kSparseCellsPerNumber) + " cells per number it holds");
  table.row_begin.reserve(static_cast<size_t>(table.rows) + 1);
  table.row_begin.push_back(0);
  std::vector<double> listed;
  for (size_t r = 0; r < static_cast<size_t>(table.rows); ++r) {
    const std::vector<ModelJsonField> at = columns[r].elements();
    const Vector v = values[r].as_vector();
    if (static_cast<size_t>(v.size()) != at.size())
      values[r].fail("has " + std::to_string(v.size()) + " values but columns row " + std::to_string(r) + " has " +
                     std::to_string(at.size()));
    int64_t previous = -1;
    for (size_t k = 0; k < at.size(); ++k) {
      const int64_t c = at[k].as_int();
      if (c <= previous || c >= table.cols)
        at[k].fail("must be a column index above " + std::to_string(previous) + " and below " +
                   std::to_string(table.cols) + " (the columns of a row increase)");
      table.columns.push_back(c);
      listed.push_back(v[static_cast<Index>(k)]);
      previous = c;
    }
    table.row_begin.push_back(static_cast<int64_t>(table.columns.size()));
  }
  table.values = Eigen::Map<const Vector>(listed.data(), static_cast<Index>(listed.size()));
  return table;
}

Matrix ModelJsonField::as_sparse_table() const {
  const SparseRows table = sparse_rows(/*dense_limits=*/true);
  Matrix out(table.rows, table.cols);
  for (Index r = 0; r < table.rows; ++r) {
    out.row(r).setConstant(table.defaults[r]);
    for (int64_t k = table.row_begin[static_cast<size_t>(r)]; k < table.row_begin[static_cast<size_t>(r) + 1]; ++k)
      out(r, table.columns[static_cast<size_t>(k)]) = table.values[k];
  }
  return out;
}

void ModelJsonField::rethrow_constructor_error(std::string_view family_where,
                                               std::string_view message) const {
  const std::string prefix = std::string(family_where) + ": ";
  if (message.substr(0, prefix.size()) == prefix) {
    const std::string_view rest = message.substr(prefix.size());
    if (value_->is_object())
      for (const auto& item : value_->items()) {
        const std::string& key = item.key();
        if (rest.size() > key.size() && rest.substr(0, key.size()) == key &&
            rest[key.size()] == ' ')
          throw ValueError(source_ + ": " + join_path(path_, key) +
                           std::string(rest.substr(key.size())));
      }
    fail(rest);
  }
  fail(message);
}

// ----- writers
// ----------------------------------------------------------------------------------------------------

json matrix_to_json(const Matrix& m) {
  json rows = json::array();
  for (Index r = 0; r < m.rows(); ++r) {
    json row = json::array();
    for (Index c = 0; c < m.cols(); ++c) row.push_back(m(r, c));
    rows.push_back(std::move(row));
  }
  return rows;
}

namespace {
/// The value that occurs most often in row r (the smallest of equally frequent ones; the bits decide, so 0.0 and
/// −0.0 are distinct values).
double most_frequent(const Matrix& m, Index r) {
  std::vector<double> sorted(m.row(r).begin(), m.row(r).end());
  const auto bits = [](double x) { return std::bit_cast<uint64_t>(x); };
  std::sort(sorted.begin(), sorted.end(), [&](double a, double b) { return bits(a) < bits(b); });
  double best = sorted.front();
  size_t best_run = 0;
  for (size_t begin = 0; begin < sorted.size();) {
    size_t end = begin;
    while (end < sorted.size() && bits(sorted[end]) == bits(sorted[begin])) ++end;
    if (end - begin > best_run) {
      best_run = end - begin;
      best = sorted[begin];
    }
    begin = end;
  }
  return best;
}
}  // namespace

json sparse_rows_to_json(const SparseRows& table) {
  json columns = json::array(), values = json::array();
  for (size_t r = 0; r < static_cast<size_t>(table.rows); ++r) {
    json at = json::array(), value = json::array();
    for (int64_t k = table.row_begin[r]; k < table.row_begin[r + 1]; ++k) {
      at.push_back(table.columns[static_cast<size_t>(k)]);
      value.push_back(table.values[k]);
    }
    columns.push_back(std::move(at));
    values.push_back(std::move(value));
  }
  return json{{"layout", kSparseRows},
              {"shape", {table.rows, table.cols}},
              {"default", std::vector<double>(table.defaults.begin(), table.defaults.end())},
              {"columns", std::move(columns)},
              {"values", std::move(values)}};
}

json table_to_json(const Matrix& m) {
  const Index cells = m.rows() * m.cols();
  if (cells < kSparseTableMinCells || cells > kSparseTableMaxCells) return matrix_to_json(m);
  SparseRows table{.rows = m.rows(), .cols = m.cols(), .defaults = Vector(m.rows()), .row_begin = {0}, .columns = {},
                   .values = {}};
  std::vector<double> listed;
  const auto bits = [](double x) { return std::bit_cast<uint64_t>(x); };
  for (Index r = 0; r < m.rows(); ++r) {
    table.defaults[r] = most_frequent(m, r);
    for (Index c = 0; c < m.cols(); ++c)
      if (bits(m(r, c)) != bits(table.defaults[r])) {
        table.columns.push_back(c);
        listed.push_back(m(r, c));
      }
    table.row_begin.push_back(static_cast<int64_t>(listed.size()));
  }
  const auto n_listed = static_cast<Index>(listed.size());
  if (n_listed > cells / 4 || cells > kSparseCellsPerNumber * (m.rows() + n_listed)) return matrix_to_json(m);
  table.values = Eigen::Map<const Vector>(listed.data(), n_listed);
  return sparse_rows_to_json(table);
}

json vector_to_json(const Vector& v) {
  json out = json::array();
  for (Index i = 0; i < v.size(); ++i) out.push_back(v[i]);
  return out;
}

}  // namespace attnmix
