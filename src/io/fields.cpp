// SPDX-License-Identifier: Apache-2.0
// Located, strict parsing of data-file fields shared by every family's reader (docs/mechanisms.md#building-blocks).
#include "attnmix/io/fields.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "attnmix/core/check.hpp"
#include "attnmix/core/sizes.hpp"
#include "attnmix/io/input_file.hpp"
#include "attnmix/io/jsonl.hpp"

namespace attnmix {

using nlohmann::json;

std::string RowOrigin::locate(Index row) const {
  if (is_npz || line_of_row.empty()) return source + ": row " + std::to_string(first_row + row);
  return source + ": line " + std::to_string(line_of_row[static_cast<size_t>(row)]);
}

void rethrow_with_lines(const ImpossibleEvidenceError& error, const RowOrigin& origin) {
  const std::vector<int64_t>& bad = error.rows();
  const bool by_row = origin.is_npz || origin.line_of_row.empty();
  std::string where = origin.source + (by_row ? ": rows " : (bad.size() == 1 ? ": line " : ": lines "));
  const size_t shown = std::min<size_t>(bad.size(), 10);
  for (size_t k = 0; k < shown; ++k) {
    const int64_t row = bad[k];
    where +=
        (k ? ", " : "") + std::to_string(by_row ? origin.first_row + row
                                                : origin.line_of_row[static_cast<size_t>(row)]);
  }
  if (bad.size() > shown) where += " and " + std::to_string(bad.size() - shown) + " more";
  throw ValueError(where + ": impossible evidence: the model gives " +
                   (bad.size() == 1 ? "this row" : "these rows") +
                   " probability zero (log p = -inf), so EM cannot use " +
                   (bad.size() == 1 ? "it" : "them") +
                   "; a positive --emission-smoothing keeps every target possible");
}

DataFileKind data_file_kind(const std::string& path, std::string_view fields) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    throw std::runtime_error(path + ": cannot open the data file: " + std::strerror(errno));
  // A pipe, such as <(zcat rows.jsonl.gz), could be read only once.
  check_input_file(path, "the data file", "a data file is read more than once, so save the rows to a file first");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open the data file: " + std::strerror(errno));
  std::array<char, 6> magic{};
  in.read(magic.data(), magic.size());
  const std::string head(magic.data(), static_cast<size_t>(in.gcount()));
  if (head.rfind("PK", 0) == 0) return DataFileKind::kNpz;
  if (head.rfind("\x93NUMPY", 0) == 0)
    throw ValueError(path + ": a single .npy array is not a data file; save the arrays together with " +
                     "numpy.savez(path, " + std::string(fields) + ")");
  return DataFileKind::kJsonLines;
}

std::string dim_text(const char* symbol, const Dim& dim) {
  return std::string(symbol) + " = " + std::to_string(dim.value) + " (from " + dim.from + ")";
}

std::string number_text(double x) {
  std::array<char, 64> buf{};
  std::snprintf(buf.data(), buf.size(), "%.17g", x);
  return buf.data();
}

void check_id_range(int64_t id, const std::string& where, const std::string& field,
                    const char* symbol, const std::optional<Dim>& bound) {
  if (id < 0)
    throw ValueError(where + ": " + field + ": out-of-range ID " + std::to_string(id) +
                     " (ids must be >= 0)");
  // A dimension taken from the data is 1 + the largest id: the bound keeps it representable.
  if (!bound && id >= kMaxElements)
    throw ValueError(where + ": " + field + ": out-of-range ID " + std::to_string(id) +
                     " (ids must be below 2^48 = " + std::to_string(kMaxElements) + ")");
  if (bound && id >= bound->value)
    throw ValueError(where + ": " + field + ": out-of-range ID " + std::to_string(id) +
                     " (must be in [0, " + std::to_string(bound->value) + "); " +
                     dim_text(symbol, *bound) + ")");
}

double bounded_real(double x, const std::string& where, const std::string& field) {
  static_assert(check::kMaxMagnitude == 1e50, "the message below quotes the bound");
  if (!(std::fabs(x) <= check::kMaxMagnitude))
    throw ValueError(where + ": " + field + ": must be finite with magnitude at most 1e+50 (got " + number_text(x) +
                     ")");
  return x;
}

int64_t exact_real_id(double x, const std::string& where, const std::string& field) {
  if (!std::isfinite(x))
    throw ValueError(where + ": " + field + ": ids must be finite (got " + number_text(x) + ")");
  if (x != std::floor(x))
    throw ValueError(where + ": " + field + ": ids must be integers (got " + number_text(x) + ")");
  if (std::fabs(x) > 9.0e15)
    throw ValueError(where + ": " + field + ": out-of-range ID " + number_text(x) + " (too large)");
  return static_cast<int64_t>(x);
}

int64_t json_id(const json& v, const std::string& where, const std::string& field,
                const char* symbol, const std::optional<Dim>& bound) {
  int64_t id = 0;
  if (v.is_boolean())
    throw TypeError(where + ": " + field + ": ids must be integers, not bools (got " + v.dump() +
                    ")");
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX))
      throw ValueError(where + ": " + field + ": out-of-range ID " + v.dump() + " (too large)");
    id = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    id = v.get<int64_t>();
  } else if (v.is_number_float()) {
    id = exact_real_id(v.get<double>(), where, field);
  } else {
    throw TypeError(where + ": " + field + ": must be an integer id (got " + json_kind(v) + ")");
  }
  check_id_range(id, where, field, symbol, bound);
  return id;
}

int64_t npz_id(const NpyArray& a, size_t k, const std::string& path, const std::string& field,
               const char* symbol, const std::optional<Dim>& bound) {
  const int64_t id =
      a.kind == NpyArray::Kind::kFloat ? exact_real_id(a.reals[k], path, field) : a.ints[k];
  check_id_range(id, path, field, symbol, bound);
  return id;
}

std::string index_text(const char* name, int64_t r, int64_t c) {
  return std::string(name) + "[" + std::to_string(r) + (c >= 0 ? ", " + std::to_string(c) : "") +
         "]";
}

namespace {

std::string expected_text(const std::vector<std::string>& known) {
  std::string text = "expected ";
  for (const std::string& name : known) text += (text.size() > 9 ? ", " : "") + name;
  return text;
}

bool is_known(const std::string& name, const std::vector<std::string>& known) {
  return std::find(known.begin(), known.end(), name) != known.end();
}

}  // namespace

void check_json_fields(const json& object, const std::string& where, const std::vector<std::string>& known,
                       const std::vector<std::string>& required) {
  for (const auto& item : object.items())
    if (!is_known(item.key(), known))
      throw ValueError(where + ": unknown field '" + item.key() + "' (" + expected_text(known) +
                       ")");
  for (const std::string& field : required)
    if (!object.contains(field)) throw ValueError(where + ": missing field '" + field + "'");
}

void check_npz_arrays(const std::vector<std::string>& names, const std::string& path,
                      const std::vector<std::string>& known, const std::vector<std::string>& required) {
  for (const std::string& name : names)
    if (!is_known(name, known))
      throw ValueError(path + ": unknown array '" + name + "' (" + expected_text(known) + ")");
  for (const std::string& field : required)
    if (std::find(names.begin(), names.end(), field) == names.end())
      throw ValueError(path + ": missing array '" + field + "'");
}

void check_width(const char* what, const char* symbol, std::optional<Dim>& dim, size_t width,
                 const std::string& where, const std::string& first_row) {
  if (width == 0) throw ValueError(where + ": " + what + " must be non-empty");
  if (!dim) dim = Dim{static_cast<int64_t>(width), first_row};
  if (static_cast<int64_t>(width) != dim->value)
    throw ValueError(where + ": " + what + " has " + std::to_string(width) + " entries; expected " +
                     dim_text(symbol, *dim));
}

void TargetPresence::see(bool has_target, const std::string& where) {
  if (policy_ == TargetPolicy::kRequired && !has_target)
    throw ValueError(where + ": missing field 'target'");
  if (!seen_) seen_ = has_target;
  if (*seen_ != has_target)
    throw ValueError(where +
                     (has_target ? ": has a 'target' but the lines before it do not"
                                 : ": missing field 'target' (the lines before it have one)") +
                     "; either every line carries a target or none does");
}

}  // namespace attnmix
