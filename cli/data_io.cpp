// SPDX-License-Identifier: Apache-2.0
// Responsibility-attention data files: JSON Lines and .npz readers with strict, located validation
// (SPEC.md §1.2).
#include "data_io.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "attnmix/core/errors.hpp"
#include "jsonl.hpp"
#include "npz.hpp"
#include "row_table.hpp"

namespace attnmix::cli {

using nlohmann::json;

namespace {

constexpr auto kFieldList = "context=..., query=..., target=...";

/// Takes the rows in place (row_table.hpp) and fixes N and D from the declared dims or the first row.
struct RowSink {
  RaDims dims;  // N and D become set once the first row is seen
  RowTable<IdMatrix> contexts;
  RowTable<Matrix> queries;
  RowTable<IdVector> targets;
  Index capacity = 0;  // the rows of the stripe, counted before parsing
  Index n_rows = 0;
};

RaRows finish(RowSink& sink, RaRows rows, const RowStripe& stripe) {
  if (sink.n_rows == 0) {
    if (!stripe.shard)
      throw ValueError(rows.source + ": contains no observations (the file is empty)");
    // An empty shard: no rows, with the widths known so far (the fit settles the rest).
    rows.contexts.resize(0, sink.dims.context_length ? sink.dims.context_length->value : 0);
    rows.queries.resize(0, sink.dims.query_dim ? sink.dims.query_dim->value : 0);
    rows.targets.resize(0);
    return rows;
  }
  rows.contexts = std::move(sink.contexts).take(sink.n_rows);
  rows.queries = std::move(sink.queries).take(sink.n_rows);
  rows.targets = rows.has_targets ? std::move(sink.targets).take(sink.n_rows)
                                  : IdVector(IdVector::Zero(sink.n_rows));
  return rows;
}

RaRows read_jsonl(const std::string& path, const RaDims& declared, TargetPolicy policy,
                  const RowStripe& stripe) {
  RaRows rows;
  rows.source = path;
  RowSink sink{declared, {}, {}, {}, 0};
  TargetPresence targets_seen(policy);
  const auto on_row_count = [&](int64_t count) {
    sink.capacity = count;
    rows.line_of_row.reserve(static_cast<size_t>(count));
  };
  const auto visit = [&](int64_t line, const json& object) {
    const std::string where = path + ": line " + std::to_string(line);
    check_json_fields(object, where, {"context", "query", "target"}, {"context", "query"});
    const bool has_target = object.contains("target");
    targets_seen.see(has_target, where);
    const std::string first_row =
        "line " + std::to_string(sink.n_rows == 0 ? line : rows.line_of_row.front());

    const json& context = object["context"];
    if (!context.is_array())
      throw TypeError(where + ": context: must be an array of integer ids (got " +
                      json_kind(context) + ")");
    check_width("context", "N", sink.dims.context_length, context.size(), where, first_row);
    sink.contexts.allocate(sink.capacity, sink.dims.context_length->value);
    for (size_t i = 0; i < context.size(); ++i)
      sink.contexts.push_back(json_id(context[i], where, "context[" + std::to_string(i) + "]", "S",
                                      sink.dims.n_symbols));

    const json& query = object["query"];
    if (!query.is_array())
      throw TypeError(where + ": query: must be an array of numbers (got " + json_kind(query) +
                      ")");
    check_width("query", "D", sink.dims.query_dim, query.size(), where, first_row);
    sink.queries.allocate(sink.capacity, sink.dims.query_dim->value);
    for (size_t d = 0; d < query.size(); ++d) {
      const json& x = query[d];
      if (!x.is_number())
        throw TypeError(where + ": query[" + std::to_string(d) +
                        "]: must be a finite number (got " + json_kind(x) + ")");
      sink.queries.push_back(bounded_real(x.get<double>(), where, "query[" + std::to_string(d) + "]"));
    }
    if (has_target) {
      sink.targets.allocate(sink.capacity, 1);
      sink.targets.push_back(json_id(object["target"], where, "target", "T", sink.dims.n_targets));
    }
    rows.line_of_row.push_back(line);
    ++sink.n_rows;
  };
  for_each_json_line(path, stripe, visit, on_row_count);
  rows.has_targets = targets_seen.has_targets();
  return finish(sink, std::move(rows), stripe);
}

RaRows read_npz_rows(const std::string& path, const RaDims& declared, TargetPolicy policy,
                     const RowStripe& stripe) {
  RaRows rows;
  rows.source = path;
  rows.is_npz = true;
  std::map<std::string, NpyArray> arrays = read_npz(path, stripe.part, stripe.parts);
  std::vector<std::string> names;
  for (const auto& [name, array] : arrays) names.push_back(name);
  check_npz_arrays(names, path, {"context", "query", "target"}, {"context", "query"});
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
    check_width("context", "N", sink.dims.context_length,
                     static_cast<size_t>(context.shape[1]), path + ": context",
                     "the context array");
    check_width("query", "D", sink.dims.query_dim, static_cast<size_t>(query.shape[1]),
                     path + ": query", "the query array");
  }
  const auto id_at = [&](const NpyArray& a, size_t k, const char* name, int64_t r, int64_t c,
                         const char* symbol, const std::optional<Dim>& bound) {
    return npz_id(a, k, path, index_text(name, r, c), symbol, bound);
  };
  const int64_t N = n > 0 ? context.shape[1] : 0;
  const int64_t D = n > 0 ? query.shape[1] : 0;
  // read_npz decoded only the stripe's rows; they are validated and kept (messages give their
  // index in the file).
  const auto [begin, end] = stripe.range(n);
  rows.first_row = begin;
  sink.capacity = end - begin;
  sink.contexts.allocate(sink.capacity, N);
  sink.queries.allocate(sink.capacity, D);
  if (target) sink.targets.allocate(sink.capacity, 1);
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t i = 0; i < N; ++i)
      sink.contexts.push_back(id_at(context, context.at(r, i), "context", r, i, "S", sink.dims.n_symbols));
    for (int64_t d = 0; d < D; ++d) {
      const size_t k = query.at(r, d);
      const double x = query.kind == NpyArray::Kind::kFloat ? query.reals[k]
                                                            : static_cast<double>(query.ints[k]);
      sink.queries.push_back(bounded_real(x, path, index_text("query", r, d)));
    }
    if (target)
      sink.targets.push_back(
          id_at(*target, target->at(r), "target", r, -1, "T", sink.dims.n_targets));
    ++sink.n_rows;
  }
  return finish(sink, std::move(rows), stripe);
}

}  // namespace

RaRows read_ra_rows(const std::string& path, const RaDims& declared, TargetPolicy policy,
                    const RowStripe& stripe) {
  return data_file_kind(path, kFieldList) == DataFileKind::kNpz
             ? read_npz_rows(path, declared, policy, stripe)
             : read_jsonl(path, declared, policy, stripe);
}

RaDims infer_ra_dims(const RaDims& declared, const std::vector<const RaRows*>& row_sets,
                     const Communicator* comm) {
  RaDims dims = declared;
  const RaRows& first = *row_sets.front();
  if (!dims.context_length) dims.context_length = Dim{first.contexts.cols(), first.source};
  if (!dims.query_dim) dims.query_dim = Dim{first.queries.cols(), first.source};
  if (!dims.n_symbols) {
    LargestId largest("the largest context id");
    for (const RaRows* rows : row_sets) largest.see(rows->contexts, *rows, "context");
    dims.n_symbols = largest.dim(comm);
  }
  if (!dims.n_targets) {
    LargestId largest("the largest target");
    for (const RaRows* rows : row_sets)
      if (rows->has_targets) largest.see(rows->targets, *rows, "target");
    dims.n_targets = largest.dim(comm);
  }
  return dims;
}

ResponsibilityAttentionBatch encode_ra_rows(RaRows rows, const RaDims& dims) {
  const ResponsibilityAttentionEncoder encoder{dims.n_symbols->value, dims.context_length->value,
                                               dims.query_dim->value, dims.n_targets->value};
  return encoder.encode(std::move(rows.contexts), std::move(rows.queries), std::move(rows.targets));
}

}  // namespace attnmix::cli
