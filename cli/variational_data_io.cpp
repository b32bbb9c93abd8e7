// SPDX-License-Identifier: Apache-2.0
// Variational-embedding-attention data files: JSON Lines and .npz readers with strict, located
// validation (SPEC.md §1.2), written with the shared field parsers of data_fields.hpp.
#include "variational_data_io.hpp"

#include <algorithm>
#include <map>
#include <utility>

#include "attnmix/core/errors.hpp"
#include "jsonl.hpp"
#include "npz.hpp"
#include "row_table.hpp"

namespace attnmix::cli {

using nlohmann::json;

namespace {

constexpr auto kFieldList = "context=..., query=..., target=...";

/// Gives rows without data width N.
void empty_rows(VeaRows& rows, Index N) {
  rows.contexts.resize(0, N);
  rows.queries.resize(0);
  rows.targets.resize(0);
}

/// Takes the rows in place (row_table.hpp); N becomes set from the declared dims or the first row.
struct VeaSink {
  VeaDims dims;
  RowTable<IdMatrix> contexts;
  RowTable<IdVector> queries, targets;
  Index capacity = 0;  // the rows of the stripe, counted before parsing
  Index n_rows = 0;

  VeaRows finish(VeaRows rows, const RowStripe& stripe) {
    if (n_rows == 0) {
      if (!stripe.shard)
        throw ValueError(rows.source + ": contains no observations (the file is empty)");
      empty_rows(rows, dims.context_length ? dims.context_length->value : 0);
      return rows;
    }
    rows.contexts = std::move(contexts).take(n_rows);
    rows.queries = std::move(queries).take(n_rows);
    rows.targets = rows.has_targets ? std::move(targets).take(n_rows) : IdVector(IdVector::Zero(n_rows));
    return rows;
  }
};

VeaRows read_jsonl(const std::string& path, const VeaDims& declared, TargetPolicy policy,
                   const RowStripe& stripe) {
  VeaRows rows;
  rows.source = path;
  VeaSink sink{declared, {}, {}, {}, 0};
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
    sink.queries.allocate(sink.capacity, 1);
    for (size_t i = 0; i < context.size(); ++i)
      sink.contexts.push_back(json_id(context[i], where, "context[" + std::to_string(i) + "]", "S",
                                      sink.dims.n_symbols));
    // The query is one symbol id (json_id rejects an array, as responsibility attention's vector
    // query would be, with "must be an integer id (got an array)").
    sink.queries.push_back(json_id(object["query"], where, "query", "S", sink.dims.n_symbols));
    if (has_target) {
      sink.targets.allocate(sink.capacity, 1);
      sink.targets.push_back(json_id(object["target"], where, "target", "T", sink.dims.n_targets));
    }
    rows.line_of_row.push_back(line);
    ++sink.n_rows;
  };
  for_each_json_line(path, stripe, visit, on_row_count);
  rows.has_targets = targets_seen.has_targets();
  return sink.finish(std::move(rows), stripe);
}

VeaRows read_npz_rows(const std::string& path, const VeaDims& declared, TargetPolicy policy,
                      const RowStripe& stripe) {
  VeaRows rows;
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
  check_id_array(context, "context", 2, -1, "context", path);
  const int64_t n = context.shape[0];
  check_id_array(query, "query", 1, n, "context", path);
  const NpyArray* target = rows.has_targets ? &arrays["target"] : nullptr;
  if (target) check_id_array(*target, "target", 1, n, "context", path);

  VeaSink sink{declared, {}, {}, {}, 0};
  if (n > 0)
    check_width("context", "N", sink.dims.context_length, static_cast<size_t>(context.shape[1]),
                path + ": context", "the context array");
  const int64_t N = n > 0 ? context.shape[1] : 0;
  const std::optional<Dim>& S = sink.dims.n_symbols;
  // read_npz decoded only the stripe's rows; they are validated and kept (messages give their
  // index in the file).
  const auto [begin, end] = stripe.range(n);
  rows.first_row = begin;
  sink.capacity = end - begin;
  sink.contexts.allocate(sink.capacity, N);
  sink.queries.allocate(sink.capacity, 1);
  if (target) sink.targets.allocate(sink.capacity, 1);
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t i = 0; i < N; ++i)
      sink.contexts.push_back(
          npz_id(context, context.at(r, i), path, index_text("context", r, i), "S", S));
    sink.queries.push_back(npz_id(query, query.at(r), path, index_text("query", r, -1), "S", S));
    if (target)
      sink.targets.push_back(
          npz_id(*target, target->at(r), path, index_text("target", r, -1), "T", sink.dims.n_targets));
    ++sink.n_rows;
  }
  return sink.finish(std::move(rows), stripe);
}

}  // namespace

VeaRows read_vea_rows(const std::string& path, const VeaDims& declared, TargetPolicy policy,
                      const RowStripe& stripe) {
  return data_file_kind(path, kFieldList) == DataFileKind::kNpz
             ? read_npz_rows(path, declared, policy, stripe)
             : read_jsonl(path, declared, policy, stripe);
}

VeaDims infer_vea_dims(const VeaDims& declared, const std::vector<const VeaRows*>& row_sets,
                       const Communicator* comm) {
  VeaDims dims = declared;
  const VeaRows& first = *row_sets.front();
  if (!dims.context_length) dims.context_length = Dim{first.contexts.cols(), first.source};
  if (!dims.n_symbols) {
    LargestId largest("the largest context or query id");
    for (const VeaRows* rows : row_sets) {
      largest.see(rows->contexts, *rows, "context");
      largest.see(rows->queries, *rows, "query");
    }
    dims.n_symbols = largest.dim(comm);
  }
  if (!dims.n_targets) {
    LargestId largest("the largest target");
    for (const VeaRows* rows : row_sets)
      if (rows->has_targets) largest.see(rows->targets, *rows, "target");
    dims.n_targets = largest.dim(comm);
  }
  return dims;
}

VariationalEmbeddingAttentionBatch encode_vea_rows(VeaRows rows, const VeaDims& dims) {
  VariationalEmbeddingAttentionEncoder encoder;
  encoder.n_symbols = dims.n_symbols->value;
  encoder.context_length = dims.context_length->value;
  encoder.n_targets = dims.n_targets->value;
  return encoder.encode(std::move(rows.contexts), std::move(rows.queries), std::move(rows.targets));
}

}  // namespace attnmix::cli
