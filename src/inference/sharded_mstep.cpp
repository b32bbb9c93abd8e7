// SPDX-License-Identifier: Apache-2.0
// The sharded M-step's collectives (inference/sharded_mstep.hpp).
#include "attnmix/inference/sharded_mstep.hpp"

#include <algorithm>
#include <span>

#include "attnmix/stats/log_math.hpp"
#include "attnmix/stats/simplex.hpp"

namespace attnmix {

SymbolShard symbol_shard(const Communicator& comm, Index symbols) {
  SymbolShard shard{even_blocks(symbols, comm.size())};
  for (int q = 0; q < comm.rank(); ++q) shard.begin += shard.blocks[static_cast<size_t>(q)];
  shard.end = shard.begin + shard.blocks[static_cast<size_t>(comm.rank())];
  return shard;
}

void sum_owned_statistics(FlatStats& stats, const Communicator& comm, const StatsSplit& split) {
  const std::span<double> flat = stats.flat();
  Index whole_begin = 0;  // the start of the entries in no run, not yet summed
  const auto sum_whole_up_to = [&](Index end) {
    if (end > whole_begin)
      comm.sum(flat.subspan(static_cast<size_t>(whole_begin), static_cast<size_t>(end - whole_begin)));
  };
  for (const StatsSplit::Run& run : split.runs) {
    sum_whole_up_to(run.offset);
    Index size = 0;
    for (int64_t b : run.blocks) size += b;
    comm.sum_own_block(flat.subspan(static_cast<size_t>(run.offset), static_cast<size_t>(size)), run.blocks);
    whole_begin = run.offset + size;
  }
  sum_whole_up_to(stats.flat_size());
}

double run_total(const FlatStats& stats, const StatsSplit::Run& run, const Communicator& comm) {
  Index first = run.offset;
  for (int q = 0; q < comm.rank(); ++q) first += run.blocks[static_cast<size_t>(q)];
  const auto own = static_cast<size_t>(run.blocks[static_cast<size_t>(comm.rank())]);
  double total = accurate_sum(stats.flat().subspan(static_cast<size_t>(first), own));
  comm.sum({&total, 1});
  return total;
}

void gather_rows(double* table, Index width, const SymbolShard& shard, const Communicator& comm) {
  const StatsSplit::Run rows = table_run(0, width, shard);
  Index size = 0;
  for (int64_t b : rows.blocks) size += b;
  comm.gather_blocks({table, static_cast<size_t>(size)}, rows.blocks);
}

Matrix smoothed_emission(const ConstMatrixMap& counts, double eps, const SymbolShard& shard, const Communicator* comm) {
  Matrix emission(counts.rows(), counts.cols());
  smoothed_row_normalise_rows(counts, eps, shard.begin, shard.end, emission);
  if (comm) gather_rows(emission.data(), emission.cols(), shard, *comm);
  return emission;
}

}  // namespace attnmix
