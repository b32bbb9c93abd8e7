// SPDX-License-Identifier: Apache-2.0
// Chained-attention data files: JSON Lines and .npz readers with strict, located validation
// (SPEC.md §1.2), written with the shared field parsers of data_fields.hpp.
#include "chained_data_io.hpp"

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

constexpr auto kFieldList = "keys=..., values=..., query=..., target=...";

/// Gives rows without data width N.
void empty_rows(CaRows& rows, Index N) {
  rows.keys.resize(0, N);
  rows.values.resize(0, N);
  rows.queries.resize(0);
  rows.targets.resize(0);
}

/// Takes the rows in place (row_table.hpp); N becomes set from the declared dims or the first row.
struct CaSink {
  CaDims dims;
  RowTable<IdMatrix> keys, values;
  RowTable<IdVector> queries, targets;
  Index capacity = 0;  // the rows of the stripe, counted before parsing
  Index n_rows = 0;

  CaRows finish(CaRows rows, const RowStripe& stripe) {
    if (n_rows == 0) {
      if (!stripe.shard)
        throw ValueError(rows.source + ": contains no observations (the file is empty)");
      empty_rows(rows, dims.context_length ? dims.context_length->value : 0);
      return rows;
    }
    rows.keys = std::move(keys).take(n_rows);
    rows.values = std::move(values).take(n_rows);
    rows.queries = std::move(queries).take(n_rows);
    rows.targets = rows.has_targets ? std::move(targets).take(n_rows) : IdVector(IdVector::Zero(n_rows));
    return rows;
  }
};

const json& id_array(const json& object, const char* field, const std::string& where) {
  const json& a = object[field];
  if (!a.is_array())
    throw TypeError(where + ": " + field + ": must be an array of integer ids (got " +
                    json_kind(a) + ")");
  return a;
}

CaRows read_jsonl(const std::string& path, const CaDims& declared, TargetPolicy policy,
                  const RowStripe& stripe) {
  CaRows rows;
  rows.source = path;
  CaSink sink{declared, {}, {}, {}, {}, 0};
  TargetPresence targets_seen(policy);
  const auto on_row_count = [&](int64_t count) {
    sink.capacity = count;
    rows.line_of_row.reserve(static_cast<size_t>(count));
  };
  const auto visit = [&](int64_t line, const json& object) {
    const std::string where = path + ": line " + std::to_string(line);
    check_json_fields(object, where, {"keys", "values", "query", "target"},
                      {"keys", "values", "query"});
    const bool has_target = object.contains("target");
    targets_seen.see(has_target, where);
    const std::string first_row =
        "line " + std::to_string(sink.n_rows == 0 ? line : rows.line_of_row.front());

    const json& keys = id_array(object, "keys", where);
    const json& values = id_array(object, "values", where);
    if (keys.size() != values.size())
      throw ValueError(where + ": values has " + std::to_string(values.size()) +
                       " entries but keys has " + std::to_string(keys.size()) +
                       " (position j pairs keys[j] with values[j])");
    check_width("keys", "N", sink.dims.context_length, keys.size(), where, first_row);
    sink.keys.allocate(sink.capacity, sink.dims.context_length->value);
    sink.values.allocate(sink.capacity, sink.dims.context_length->value);
    sink.queries.allocate(sink.capacity, 1);
    for (size_t j = 0; j < keys.size(); ++j)
      sink.keys.push_back(json_id(keys[j], where, "keys[" + std::to_string(j) + "]", "S",
                                  sink.dims.n_symbols));
    for (size_t j = 0; j < values.size(); ++j)
      sink.values.push_back(json_id(values[j], where, "values[" + std::to_string(j) + "]", "S",
                                    sink.dims.n_symbols));
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

CaRows read_npz_rows(const std::string& path, const CaDims& declared, TargetPolicy policy,
                     const RowStripe& stripe) {
  CaRows rows;
  rows.source = path;
  rows.is_npz = true;
  std::map<std::string, NpyArray> arrays = read_npz(path, stripe.part, stripe.parts);
  std::vector<std::string> names;
  for (const auto& [name, array] : arrays) names.push_back(name);
  check_npz_arrays(names, path, {"keys", "values", "query", "target"},
                   {"keys", "values", "query"});
  rows.has_targets = arrays.count("target") > 0;
  if (policy == TargetPolicy::kRequired && !rows.has_targets)
    throw ValueError(path + ": missing array 'target'");

  const NpyArray& keys = arrays["keys"];
  const NpyArray& values = arrays["values"];
  const NpyArray& query = arrays["query"];
  check_id_array(keys, "keys", 2, -1, "keys", path);
  const int64_t n = keys.shape[0];
  check_id_array(values, "values", 2, n, "keys", path);
  if (values.shape[1] != keys.shape[1])
    throw ValueError(path + ": values: has shape " + values.shape_text() + " but keys has " +
                     keys.shape_text() + " (position j pairs keys[r, j] with values[r, j])");
  check_id_array(query, "query", 1, n, "keys", path);
  const NpyArray* target = rows.has_targets ? &arrays["target"] : nullptr;
  if (target) check_id_array(*target, "target", 1, n, "keys", path);

  CaSink sink{declared, {}, {}, {}, {}, 0};
  if (n > 0)
    check_width("keys", "N", sink.dims.context_length, static_cast<size_t>(keys.shape[1]),
                path + ": keys", "the keys array");
  const int64_t N = n > 0 ? keys.shape[1] : 0;
  const std::optional<Dim>& S = sink.dims.n_symbols;
  // read_npz decoded only the stripe's rows; they are validated and kept (messages give their
  // index in the file).
  const auto [begin, end] = stripe.range(n);
  rows.first_row = begin;
  sink.capacity = end - begin;
  sink.keys.allocate(sink.capacity, N);
  sink.values.allocate(sink.capacity, N);
  sink.queries.allocate(sink.capacity, 1);
  if (target) sink.targets.allocate(sink.capacity, 1);
  for (int64_t r = begin; r < end; ++r) {
    for (int64_t j = 0; j < N; ++j) {
      sink.keys.push_back(npz_id(keys, keys.at(r, j), path, index_text("keys", r, j), "S", S));
      sink.values.push_back(npz_id(values, values.at(r, j), path, index_text("values", r, j), "S", S));
    }
    sink.queries.push_back(npz_id(query, query.at(r), path, index_text("query", r, -1), "S", S));
    if (target)
      sink.targets.push_back(
          npz_id(*target, target->at(r), path, index_text("target", r, -1), "T", sink.dims.n_targets));
    ++sink.n_rows;
  }
  return sink.finish(std::move(rows), stripe);
}

}  // namespace

CaRows read_ca_rows(const std::string& path, const CaDims& declared, TargetPolicy policy,
                    const RowStripe& stripe) {
  return data_file_kind(path, kFieldList) == DataFileKind::kNpz
             ? read_npz_rows(path, declared, policy, stripe)
             : read_jsonl(path, declared, policy, stripe);
}

CaDims infer_ca_dims(const CaDims& declared, const std::vector<const CaRows*>& row_sets,
                     const Communicator* comm) {
  CaDims dims = declared;
  const CaRows& first = *row_sets.front();
  if (!dims.context_length) dims.context_length = Dim{first.keys.cols(), first.source};
  if (!dims.n_symbols) {
    LargestId largest("the largest key, value or query id");
    for (const CaRows* rows : row_sets) {
      largest.see(rows->keys, *rows, "keys");
      largest.see(rows->values, *rows, "values");
      largest.see(rows->queries, *rows, "query");
    }
    dims.n_symbols = largest.dim(comm);
  }
  if (!dims.n_targets) {
    LargestId largest("the largest target");
    for (const CaRows* rows : row_sets)
      if (rows->has_targets) largest.see(rows->targets, *rows, "target");
    dims.n_targets = largest.dim(comm);
  }
  return dims;
}

ChainedAttentionBatch encode_ca_rows(CaRows rows, const CaDims& dims) {
  ChainedAttentionEncoder encoder;
  encoder.n_symbols = dims.n_symbols->value;
  encoder.n_targets = dims.n_targets->value;
  return encoder.encode(std::move(rows.keys), std::move(rows.values), std::move(rows.queries),
                        std::move(rows.targets));
}

}  // namespace attnmix::cli
