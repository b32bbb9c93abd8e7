// SPDX-License-Identifier: Apache-2.0
// Responsibility-attention data files: JSON Lines and .npz readers with strict, located validation
// (SPEC.md §1.2).
#include "data_io.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "attnmix/core/errors.hpp"
#include "jsonl.hpp"
#include "npz.hpp"

namespace attnmix::cli {

using nlohmann::json;

std::string RaRows::locate(Index row) const {
  if (is_npz || line_of_row.empty()) return source + ": row " + std::to_string(row);
  return source + ": line " + std::to_string(line_of_row[static_cast<size_t>(row)]);
}

namespace {

constexpr std::array<std::string_view, 3> kFields{"context", "query", "target"};

std::string expected_fields() { return "expected context, query, target"; }

std::string dim_text(const char* symbol, const Dim& dim) {
  return std::string(symbol) + " = " + std::to_string(dim.value) + " (from " + dim.from + ")";
}

std::string number_text(double x) {
  std::array<char, 64> buf{};
  std::snprintf(buf.data(), buf.size(), "%.17g", x);
  return buf.data();
}

/// Range check of an exact id: ValueError "where: field: out-of-range ID v (must be in [0, S); S =
/// 16 (from …))".
void check_id_range(int64_t id, const std::string& where, const std::string& field,
                    const char* symbol, const std::optional<Dim>& bound) {
  if (id < 0)
    throw ValueError(where + ": " + field + ": out-of-range ID " + std::to_string(id) +
                     " (ids must be >= 0)");
  if (bound && id >= bound->value)
    throw ValueError(where + ": " + field + ": out-of-range ID " + std::to_string(id) +
                     " (must be in [0, " + std::to_string(bound->value) + "); " +
                     dim_text(symbol, *bound) + ")");
}

/// A real that must be an exact integer id (integral floats such as 2.0 are accepted).
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

/// Accumulates rows and fixes N and D from the declared dims or the first row.
struct RowSink {
  RaDims dims;  // N and D become set once the first row is seen
  std::vector<int64_t> contexts;
  std::vector<double> queries;
  std::vector<int64_t> targets;
  Index n_rows = 0;

  void check_width(const char* what, const char* symbol, std::optional<Dim>& dim, size_t width,
                   const std::string& where, const std::string& first_row) {
    if (width == 0) throw ValueError(where + ": " + what + " must be non-empty");
    if (!dim) dim = Dim{static_cast<int64_t>(width), first_row};
    if (static_cast<int64_t>(width) != dim->value)
      throw ValueError(where + ": " + what + " has " + std::to_string(width) +
                       " entries; expected " + dim_text(symbol, *dim));
  }
};

RaRows finish(RowSink& sink, RaRows rows) {
  if (sink.n_rows == 0)
    throw ValueError(rows.source + ": contains no observations (the file is empty)");
  const Index N = sink.dims.context_length->value;
  const Index D = sink.dims.query_dim->value;
  rows.contexts = Eigen::Map<const IdMatrix>(sink.contexts.data(), sink.n_rows, N);
  rows.queries = Eigen::Map<const Matrix>(sink.queries.data(), sink.n_rows, D);
  rows.targets = rows.has_targets
                     ? IdVector(Eigen::Map<const IdVector>(sink.targets.data(), sink.n_rows))
                     : IdVector(IdVector::Zero(sink.n_rows));
  return rows;
}

RaRows read_jsonl(const std::string& path, const RaDims& declared, TargetPolicy policy) {
  RaRows rows;
  rows.source = path;
  RowSink sink{declared, {}, {}, {}, 0};
  std::optional<bool> rows_have_targets;
  for_each_json_line(path, [&](int64_t line, const json& object) {
    const std::string where = path + ": line " + std::to_string(line);
    for (const auto& item : object.items())
      if (std::find(kFields.begin(), kFields.end(), item.key()) == kFields.end())
        throw ValueError(where + ": unknown field '" + item.key() + "' (" + expected_fields() +
                         ")");
    for (const char* field : {"context", "query"})
      if (!object.contains(field)) throw ValueError(where + ": missing field '" + field + "'");
    const bool has_target = object.contains("target");
    if (policy == TargetPolicy::kRequired && !has_target)
      throw ValueError(where + ": missing field 'target'");
    if (!rows_have_targets) rows_have_targets = has_target;
    if (*rows_have_targets != has_target)
      throw ValueError(where +
                       (has_target ? ": has a 'target' but the lines before it do not"
                                   : ": missing field 'target' (the lines before it have one)") +
                       "; either every line carries a target or none does");
    const std::string first_row =
        "line " + std::to_string(sink.n_rows == 0 ? line : rows.line_of_row.front());

    const json& context = object["context"];
    if (!context.is_array())
      throw TypeError(where + ": context: must be an array of integer ids (got " +
                      json_kind(context) + ")");
    sink.check_width("context", "N", sink.dims.context_length, context.size(), where, first_row);
    for (size_t i = 0; i < context.size(); ++i)
      sink.contexts.push_back(json_id(context[i], where, "context[" + std::to_string(i) + "]", "S",
                                      sink.dims.n_symbols));

    const json& query = object["query"];
    if (!query.is_array())
      throw TypeError(where + ": query: must be an array of numbers (got " + json_kind(query) +
                      ")");
    sink.check_width("query", "D", sink.dims.query_dim, query.size(), where, first_row);
    for (size_t d = 0; d < query.size(); ++d) {
      const json& x = query[d];
      if (!x.is_number())
        throw TypeError(where + ": query[" + std::to_string(d) +
                        "]: must be a finite number (got " + json_kind(x) + ")");
      sink.queries.push_back(x.get<double>());
    }
    if (has_target)
      sink.targets.push_back(json_id(object["target"], where, "target", "T", sink.dims.n_targets));
    rows.line_of_row.push_back(line);
    ++sink.n_rows;
  });
  rows.has_targets = rows_have_targets.value_or(true);
  return finish(sink, std::move(rows));
}

RaRows read_npz_rows(const std::string& path, const RaDims& declared, TargetPolicy policy) {
  RaRows rows;
  rows.source = path;
  rows.is_npz = true;
  std::map<std::string, NpyArray> arrays = read_npz(path);
  for (const auto& [name, array] : arrays)
    if (std::find(kFields.begin(), kFields.end(), name) == kFields.end())
      throw ValueError(path + ": unknown array '" + name + "' (" + expected_fields() + ")");
  for (const char* field : {"context", "query"})
    if (!arrays.count(field)) throw ValueError(path + ": missing array '" + field + "'");
  rows.has_targets = arrays.count("target") > 0;
  if (policy == TargetPolicy::kRequired && !rows.has_targets)
    throw ValueError(path + ": missing array 'target'");

  const NpyArray& context = arrays["context"];
  const NpyArray& query = arrays["query"];
  if (context.kind == NpyArray::Kind::kBool)
    throw TypeError(path + ": context: ids must be integers, not bools (dtype " + context.descr +
                    ")");
  if (context.shape.size() != 2)
    throw ValueError(path + ": context: must be 2-D (n, N) (got shape " + context.shape_text() +
                     ")");
  if (query.kind == NpyArray::Kind::kBool)
    throw TypeError(path + ": query: must be real numbers, not bools (dtype " + query.descr + ")");
  if (query.shape.size() != 2)
    throw ValueError(path + ": query: must be 2-D (n, D) (got shape " + query.shape_text() + ")");
  const int64_t n = context.shape[0];
  if (query.shape[0] != n)
    throw ValueError(path + ": query: has " + std::to_string(query.shape[0]) +
                     " rows but context has " + std::to_string(n));
  const NpyArray* target = rows.has_targets ? &arrays["target"] : nullptr;
  if (target) {
    if (target->kind == NpyArray::Kind::kBool)
      throw TypeError(path + ": target: ids must be integers, not bools (dtype " + target->descr +
                      ")");
    if (target->shape.size() != 1 || target->shape[0] != n)
      throw ValueError(path + ": target: must have shape (" + std::to_string(n) + ",) (got " +
                       target->shape_text() + ")");
  }
  RowSink sink{declared, {}, {}, {}, 0};
  if (n > 0) {
    sink.check_width("context", "N", sink.dims.context_length,
                     static_cast<size_t>(context.shape[1]), path + ": context",
                     "the context array");
    sink.check_width("query", "D", sink.dims.query_dim, static_cast<size_t>(query.shape[1]),
                     path + ": query", "the query array");
  }
  const auto index_text = [](const char* name, int64_t r, int64_t c) {
    return std::string(name) + "[" + std::to_string(r) + (c >= 0 ? ", " + std::to_string(c) : "") +
           "]";
  };
  const auto id_at = [&](const NpyArray& a, size_t k, const char* name, int64_t r, int64_t c,
                         const char* symbol, const std::optional<Dim>& bound) {
    const std::string field = index_text(name, r, c);
    const int64_t id =
        a.kind == NpyArray::Kind::kFloat ? exact_real_id(a.reals[k], path, field) : a.ints[k];
    check_id_range(id, path, field, symbol, bound);
    return id;
  };
  const int64_t N = n > 0 ? context.shape[1] : 0;
  const int64_t D = n > 0 ? query.shape[1] : 0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < N; ++i)
      sink.contexts.push_back(id_at(context, static_cast<size_t>(r * N + i), "context", r, i, "S",
                                    sink.dims.n_symbols));
    for (int64_t d = 0; d < D; ++d) {
      const size_t k = static_cast<size_t>(r * D + d);
      const double x = query.kind == NpyArray::Kind::kFloat ? query.reals[k]
                                                            : static_cast<double>(query.ints[k]);
      if (!std::isfinite(x))
        throw ValueError(path + ": " + index_text("query", r, d) + ": must be finite (got " +
                         number_text(x) + ")");
      sink.queries.push_back(x);
    }
    if (target)
      sink.targets.push_back(
          id_at(*target, static_cast<size_t>(r), "target", r, -1, "T", sink.dims.n_targets));
    ++sink.n_rows;
  }
  return finish(sink, std::move(rows));
}

}  // namespace

RaRows read_ra_rows(const std::string& path, const RaDims& declared, TargetPolicy policy) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    throw std::runtime_error(path + ": cannot open the data file: " + std::strerror(errno));
  if (S_ISDIR(info.st_mode))
    throw std::runtime_error(path + ": cannot read the data file: it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open the data file: " + std::strerror(errno));
  std::array<char, 6> magic{};
  in.read(magic.data(), magic.size());
  const std::string head(magic.data(), static_cast<size_t>(in.gcount()));
  if (head.rfind("PK", 0) == 0) return read_npz_rows(path, declared, policy);
  if (head.rfind("\x93NUMPY", 0) == 0)
    throw ValueError(
        path +
        ": a single .npy array is not a data file; save context, query and target together "
        "with numpy.savez(path, context=..., query=..., target=...)");
  return read_jsonl(path, declared, policy);
}

RaDims infer_ra_dims(const RaDims& declared, const std::vector<const RaRows*>& row_sets) {
  RaDims dims = declared;
  const RaRows& first = *row_sets.front();
  if (!dims.context_length) dims.context_length = Dim{first.contexts.cols(), first.source};
  if (!dims.query_dim) dims.query_dim = Dim{first.queries.cols(), first.source};
  if (!dims.n_symbols) {
    int64_t max_id = 0;
    for (const RaRows* rows : row_sets) max_id = std::max(max_id, rows->contexts.maxCoeff());
    dims.n_symbols = Dim{max_id + 1, "the largest context id"};
  }
  if (!dims.n_targets) {
    int64_t max_id = 0;
    for (const RaRows* rows : row_sets)
      if (rows->has_targets) max_id = std::max(max_id, rows->targets.maxCoeff());
    dims.n_targets = Dim{max_id + 1, "the largest target"};
  }
  return dims;
}

ResponsibilityAttentionBatch encode_ra_rows(const RaRows& rows, const RaDims& dims) {
  const ResponsibilityAttentionEncoder encoder{dims.n_symbols->value, dims.context_length->value,
                                               dims.query_dim->value, dims.n_targets->value};
  return encoder.encode(rows.contexts, rows.queries, rows.targets);
}

void rethrow_with_lines(const ImpossibleEvidenceError& error, const RaRows& rows) {
  const std::vector<int64_t>& bad = error.rows();
  std::string where =
      rows.source + (rows.is_npz ? ": rows " : (bad.size() == 1 ? ": line " : ": lines "));
  const size_t shown = std::min<size_t>(bad.size(), 10);
  for (size_t k = 0; k < shown; ++k) {
    const int64_t row = bad[k];
    where += (k ? ", " : "") + std::to_string(rows.is_npz || rows.line_of_row.empty()
                                                  ? row
                                                  : rows.line_of_row[static_cast<size_t>(row)]);
  }
  if (bad.size() > shown) where += " and " + std::to_string(bad.size() - shown) + " more";
  throw ValueError(where + ": impossible evidence: the model gives " +
                   (bad.size() == 1 ? "this row" : "these rows") +
                   " probability zero (log p = -inf), so EM cannot use " +
                   (bad.size() == 1 ? "it" : "them") +
                   "; a positive --emission-smoothing keeps every target possible");
}

}  // namespace attnmix::cli
