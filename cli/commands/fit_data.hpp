// SPDX-License-Identifier: Apache-2.0
/// @file fit_data.hpp
/// The training and validation rows of `attnmix fit`, read by the family's schema (io/rows.hpp) the same way for
/// every family, alone or as one process of a distributed fit (FitArgs::communicator; distributed.hpp).
///
/// One process reads --data and --valid whole; the validation rows must have the training rows'
/// widths, and S, T come from the largest ids of both.
///
/// A distributed fit reads shards (rank r: its stripe of each file, or its own file of a {rank}
/// pattern) and agrees on everything the single-process reader would take from the data:
///   1. the widths (N, and D for responsibility attention): each process peeks at the first row of
///   its
///      shard, and the first non-empty shard in rank order decides, so every process checks its
///      rows against the width of the data set's first row, in the single-process words ("expected
///      N = 3 (from line 1)"); declared flags win;
///   2. reading, with failure agreement (a bad row on one process fails every process, with that
///      process's file:line:field message);
///   3. the widths again, for .npz files (whose widths come from each archive) and empty shards,
///   which
///      take the agreed width;
///   4. S and T: the maximum over every process (infer_dims, collective).
/// Every process calls read_fit_rows with the same arguments, so they all run the same collectives.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "attnmix/core/types.hpp"
#include "attnmix/inference/communicator.hpp"
#include "attnmix/io/jsonl.hpp"
#include "attnmix/io/rows.hpp"
#include "commands/fit_problem.hpp"
#include "distributed.hpp"

namespace attnmix::cli {

/// The rows of a fit (this process's shard when distributed) and the settled dimensions.
struct FitRows {
  Rows train;
  std::optional<Rows> valid;
  Dims dims;
  std::vector<int64_t> train_counts;  // training rows of each process, in rank order
  int64_t valid_total = 0;            // validation rows of every process
};

namespace shard_reading {

/// The widths of the schema (each width size once, with the field that has it), in field order.
inline std::vector<const DataField*> width_fields(const RowSchema& schema) {
  std::vector<const DataField*> out;
  for (const DataField& f : schema.fields)
    if (!f.width.empty() && f.pairs_with.empty()) out.push_back(&f);
  return out;
}

/// Step 1: the widths not declared, from the first row of the first non-empty JSON Lines shard in
/// rank order (collective). An .npz shard contributes nothing here (step 3 settles its widths).
inline void agree_on_first_row_widths(const RowSchema& schema, Dims& declared, const ShardFile& file,
                                      const Communicator& comm) {
  const std::vector<const DataField*> widths = width_fields(schema);
  if (std::all_of(widths.begin(), widths.end(), [&](const DataField* w) { return declared.count(w->width) > 0; }))
    return;  // the same on every process: the flags are
  bool json_lines = false;
  try {
    json_lines = data_file_kind(file.path, "") == DataFileKind::kJsonLines;
  } catch (...) {  // reading the shard reports it
  }
  const auto first = json_lines ? first_json_object(file.path, file.stripe) : std::nullopt;
  const std::vector<int64_t> lines = comm.all_counts(first ? first->first : 0);
  for (const DataField* w : widths) {
    if (declared.count(w->width)) continue;
    const std::string field(w->name);
    int64_t own = 0;
    if (first && first->second.contains(field) && first->second[field].is_array())
      own = static_cast<int64_t>(first->second[field].size());
    const std::vector<int64_t> all = comm.all_counts(own);
    for (int q = 0; q < comm.size(); ++q) {
      const auto k = static_cast<size_t>(q);
      if (all[k] <= 0) continue;
      const std::string line = "line " + std::to_string(lines[k]);
      declared[std::string(w->width)] = Dim{all[k], file.per_rank ? file.file_of(q) + ": " + line : line};
      break;
    }
  }
}

/// Step 3: every shard with rows has the agreed widths (else every process fails with the message
/// of the first that does not), and shards without rows take them. Returns the rows of each
/// process.
inline std::vector<int64_t> settle_widths(const RowSchema& schema, Rows& rows, Dims& dims, const ShardFile& file,
                                          const Communicator& comm) {
  const std::vector<int64_t> counts = comm.all_counts(rows.n_rows());
  for (const auto& [symbol, width] : row_widths(schema, rows)) {
    const int64_t own = rows.n_rows() > 0 ? width : 0;
    const std::vector<int64_t> widths = comm.all_counts(own);
    const auto q = std::find_if(widths.begin(), widths.end(), [](int64_t x) { return x > 0; });
    if (q == widths.end()) continue;  // no process has rows: the caller reports it
    const int first = static_cast<int>(q - widths.begin());
    const auto declared = dims.find(symbol);
    std::optional<Dim> agreed;
    if (declared != dims.end()) agreed = declared->second;
    if (!agreed) agreed = Dim{*q, file.per_rank ? file.file_of(first) : file.path};
    const DataField& field = *std::find_if(schema.fields.begin(), schema.fields.end(),
                                           [&, s = symbol](const DataField& f) { return f.width == s; });
    agree(&comm, [&] {
      if (own > 0 && own != agreed->value)
        check_width(std::string(field.name).c_str(), std::string(symbol).c_str(), agreed, static_cast<size_t>(own),
                    file.path + ": " + std::string(field.name), "");
    });
    if (rows.n_rows() == 0) set_empty_width(schema, rows, symbol, agreed->value);
    dims[std::string(symbol)] = *agreed;
  }
  return counts;
}

/// Steps 1–3 for one shard file (collective). `counts` receives the rows of each process.
inline Rows read_shard(const RowSchema& schema, Dims& declared, const ShardFile& file, const Communicator& comm,
                       std::vector<int64_t>& counts) {
  agree_on_first_row_widths(schema, declared, file, comm);
  Rows rows;
  agree(&comm, [&] { rows = read_rows(file.path, schema, declared, TargetPolicy::kRequired, file.stripe); });
  counts = settle_widths(schema, rows, declared, file, comm);
  if (std::accumulate(counts.begin(), counts.end(), int64_t{0}) == 0)  // the same on every process
    throw AgreedError(kExitData, 0, comm.size(),
                      file.pattern + ": contains no observations (" +
                          (file.per_rank ? "the file of every process is empty)" : "the file is empty)"));
  return rows;
}

}  // namespace shard_reading

/// Reads --data (and --valid) for a fit with the declared dimensions (collective when distributed).
/// @throws what the reader throws (one process), AgreedError (distributed).
[[nodiscard]] inline FitRows read_fit_rows(const FitArgs& args, const Dims& declared, const RowSchema& schema) {
  const Communicator* comm = args.communicator;
  FitRows out;
  Dims train_declared = declared;
  if (!comm) {
    out.train = read_rows(args.data, schema, declared, TargetPolicy::kRequired);
    out.train_counts = {out.train.n_rows()};
  } else {
    out.train = shard_reading::read_shard(schema, train_declared, shard_file(args.data, *comm), *comm,
                                          out.train_counts);
  }
  if (!args.valid.empty()) {
    Dims valid_declared = declared;  // the validation rows must have the training rows' widths
    for (const auto& [symbol, width] : row_widths(schema, out.train)) {
      if (valid_declared.count(symbol)) continue;
      const auto agreed = train_declared.find(symbol);
      const int64_t value = !comm ? width : agreed == train_declared.end() ? 0 : agreed->second.value;
      if (value > 0)  // 0: training rows given as symbols, which show no width
        valid_declared[std::string(symbol)] = Dim{value, "the training data " + args.data};
    }
    std::vector<int64_t> valid_counts;
    if (!comm) {
      out.valid = read_rows(args.valid, schema, valid_declared, TargetPolicy::kRequired);
      valid_counts = {out.valid->n_rows()};
    } else {
      out.valid = shard_reading::read_shard(schema, valid_declared, shard_file(args.valid, *comm), *comm, valid_counts);
    }
    out.valid_total = std::accumulate(valid_counts.begin(), valid_counts.end(), int64_t{0});
  }
  std::vector<const Rows*> sets{&out.train};
  if (out.valid) sets.push_back(&*out.valid);
  // One process: N (and D) from the training rows, as before. Distributed: agreed above.
  out.dims = infer_dims(schema, comm ? train_declared : declared, sets, comm);
  return out;
}

/// The fit's sources, row counts, training-row origin and batches from rows read_fit_rows read, encoded by the
/// family's encoder (the row matrices move into the batches: no copy).
inline void take_fit_rows(FitProblem& problem, FitRows rows, const FitArgs& args,
                          AnyBatch (*encode)(Rows rows, const Dims& dims)) {
  problem.train_source = args.data;
  if (rows.valid) problem.valid_source = args.valid;
  problem.train_counts = std::move(rows.train_counts);
  problem.valid_total = rows.valid_total;
  problem.train_origin = std::move(static_cast<RowOrigin&>(rows.train));
  problem.train = encode(std::move(rows.train), rows.dims);
  if (rows.valid) problem.valid = encode(std::move(*rows.valid), rows.dims);
}

}  // namespace attnmix::cli
