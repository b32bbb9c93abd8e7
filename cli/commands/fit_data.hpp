// SPDX-License-Identifier: Apache-2.0
/// @file fit_data.hpp
/// The training and validation rows of `attnmix fit`, read the same way for every family that reads
/// data files (fit_responsibility.cpp, fit_chained.cpp, fit_variational.cpp), alone or as one
/// process of a distributed fit (FitArgs::communicator; distributed.hpp).
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
///   4. S and T: the maximum over every process (the family's infer function, collective).
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
#include "chained_data_io.hpp"
#include "commands/fit_problem.hpp"
#include "data_fields.hpp"
#include "distributed.hpp"
#include "jsonl.hpp"

namespace attnmix::cli {

/// A width every row of a family shares (N, D): the JSON field or npz array that has it, its
/// symbol, where the family's dims hold it, and how to read it from rows and give it to rows
/// without data.
template <class Rows, class Dims>
struct RowWidth {
  const char* field;
  const char* symbol;
  std::optional<Dim> Dims::*dim;
  Index (*width)(const Rows&);
  void (*set_empty)(Rows&, Index);
};

/// How a family reads its data files: its reader, its dimension inference and its widths.
template <class Rows, class Dims>
struct RowFormat {
  Rows (*read)(const std::string&, const Dims&, TargetPolicy, const RowStripe&);
  Dims (*infer)(const Dims&, const std::vector<const Rows*>&, const Communicator*);
  std::vector<RowWidth<Rows, Dims>> widths;
};

/// The rows of a fit (this process's shard when distributed) and the settled dimensions.
template <class Rows, class Dims>
struct FitRows {
  Rows train;
  std::optional<Rows> valid;
  Dims dims;
  std::vector<int64_t> train_counts;  // training rows of each process, in rank order
  int64_t valid_total = 0;            // validation rows of every process
};

namespace shard_reading {

/// Step 1: the widths not declared, from the first row of the first non-empty JSON Lines shard in
/// rank order (collective). An .npz shard contributes nothing here (step 3 settles its widths).
template <class Rows, class Dims>
void agree_on_first_row_widths(const RowFormat<Rows, Dims>& format, Dims& declared,
                               const ShardFile& file, const Communicator& comm) {
  bool undeclared = false;
  for (const auto& w : format.widths) undeclared = undeclared || !(declared.*w.dim);
  if (!undeclared) return;  // the same on every process: the flags are
  bool json_lines = false;
  try {
    json_lines = data_file_kind(file.path, "") == DataFileKind::kJsonLines;
  } catch (...) {  // reading the shard reports it
  }
  const auto first = json_lines ? first_json_object(file.path, file.stripe) : std::nullopt;
  const std::vector<int64_t> lines = comm.all_counts(first ? first->first : 0);
  for (const auto& w : format.widths) {
    if (declared.*w.dim) continue;
    int64_t own = 0;
    if (first && first->second.contains(w.field) && first->second[w.field].is_array())
      own = static_cast<int64_t>(first->second[w.field].size());
    const std::vector<int64_t> widths = comm.all_counts(own);
    for (int q = 0; q < comm.size(); ++q) {
      const auto k = static_cast<size_t>(q);
      if (widths[k] <= 0) continue;
      const std::string line = "line " + std::to_string(lines[k]);
      declared.*w.dim = Dim{widths[k], file.per_rank ? file.file_of(q) + ": " + line : line};
      break;
    }
  }
}

/// Step 3: every shard with rows has the agreed widths (else every process fails with the message
/// of the first that does not), and shards without rows take them. Returns the rows of each
/// process.
template <class Rows, class Dims>
std::vector<int64_t> settle_widths(const RowFormat<Rows, Dims>& format, Rows& rows, Dims& dims,
                                   const ShardFile& file, const Communicator& comm) {
  const std::vector<int64_t> counts = comm.all_counts(rows.n_rows());
  for (const auto& w : format.widths) {
    const int64_t own = rows.n_rows() > 0 ? w.width(rows) : 0;
    const std::vector<int64_t> widths = comm.all_counts(own);
    const auto q = std::find_if(widths.begin(), widths.end(), [](int64_t x) { return x > 0; });
    if (q == widths.end()) continue;  // no process has rows: the caller reports it
    const int first = static_cast<int>(q - widths.begin());
    std::optional<Dim> agreed = dims.*w.dim;
    if (!agreed) agreed = Dim{*q, file.per_rank ? file.file_of(first) : file.path};
    agree(&comm, [&] {
      if (own > 0 && own != agreed->value)
        check_width(w.field, w.symbol, agreed, static_cast<size_t>(own), file.path + ": " + w.field,
                    "");
    });
    if (rows.n_rows() == 0) w.set_empty(rows, agreed->value);
    dims.*w.dim = agreed;
  }
  return counts;
}

/// Steps 1–3 for one shard file (collective). `counts` receives the rows of each process.
template <class Rows, class Dims>
Rows read_shard(const RowFormat<Rows, Dims>& format, Dims& declared, const ShardFile& file,
                const Communicator& comm, std::vector<int64_t>& counts) {
  agree_on_first_row_widths(format, declared, file, comm);
  Rows rows;
  agree(&comm,
        [&] { rows = format.read(file.path, declared, TargetPolicy::kRequired, file.stripe); });
  counts = settle_widths(format, rows, declared, file, comm);
  if (std::accumulate(counts.begin(), counts.end(), int64_t{0}) == 0)  // the same on every process
    throw AgreedError(
        kExitData, 0, comm.size(),
        file.pattern + ": contains no observations (" +
            (file.per_rank ? "the file of every process is empty)" : "the file is empty)"));
  return rows;
}

}  // namespace shard_reading

/// Reads --data (and --valid) for a fit with the declared dimensions (collective when distributed).
/// @throws what the family's reader throws (one process), AgreedError (distributed).
template <class Rows, class Dims>
[[nodiscard]] FitRows<Rows, Dims> read_fit_rows(const FitArgs& args, const Dims& declared,
                                                const RowFormat<Rows, Dims>& format) {
  const Communicator* comm = args.communicator;
  FitRows<Rows, Dims> out;
  Dims train_declared = declared;
  if (!comm) {
    out.train = format.read(args.data, declared, TargetPolicy::kRequired, RowStripe{});
    out.train_counts = {out.train.n_rows()};
  } else {
    out.train = shard_reading::read_shard(format, train_declared, shard_file(args.data, *comm),
                                          *comm, out.train_counts);
  }
  if (!args.valid.empty()) {
    Dims valid_declared = declared;  // the validation rows must have the training rows' widths
    for (const auto& w : format.widths)
      if (!(valid_declared.*w.dim))
        valid_declared.*w.dim = Dim{comm ? (train_declared.*w.dim)->value : w.width(out.train),
                                    "the training data " + args.data};
    std::vector<int64_t> valid_counts;
    if (!comm) {
      out.valid = format.read(args.valid, valid_declared, TargetPolicy::kRequired, RowStripe{});
      valid_counts = {out.valid->n_rows()};
    } else {
      out.valid = shard_reading::read_shard(format, valid_declared, shard_file(args.valid, *comm),
                                            *comm, valid_counts);
    }
    out.valid_total = std::accumulate(valid_counts.begin(), valid_counts.end(), int64_t{0});
  }
  std::vector<const Rows*> sets{&out.train};
  if (out.valid) sets.push_back(&*out.valid);
  // One process: N (and D) from the training rows, as before. Distributed: agreed above.
  out.dims = format.infer(comm ? train_declared : declared, sets, comm);
  return out;
}

/// The rows of chained attention and variational multi-hop attention: the keys (and values) width N
/// (fit_chained.cpp).
[[nodiscard]] const RowFormat<CaRows, CaDims>& chained_row_format();

}  // namespace attnmix::cli
