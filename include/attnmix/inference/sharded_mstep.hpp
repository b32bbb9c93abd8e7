// SPDX-License-Identifier: Apache-2.0
/// @file sharded_mstep.hpp
/// The sharded M-step of a distributed fit (OptimizeOptions::sharded_mstep, `docs/SCALING.md`). The plain path sums
/// all statistics on every rank (an allreduce of M entries) and then runs the whole M-step, over all S symbols, on
/// every rank. The sharded path splits the per-symbol work:
///   1. each rank sums only its own symbols' rows of the per-symbol statistics (a reduce-scatter), and the small
///      global fields whole;
///   2. each rank estimates the parameters of its symbols;
///   3. the parameter rows are gathered on every rank (an allgather).
/// Rank r of P owns symbols [S·r/P, S·(r+1)/P). The wire carries the bytes of one ring allreduce; the per-symbol
/// M-step work per rank falls from O(M) to O(M/P). The model has the bits of the plain path, because the
/// Communicator adds in rank order in both (communicator.hpp) and a symbol's parameters depend only on its own rows
/// and the global fields.
#pragma once

#include <vector>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/inference/communicator.hpp"

namespace attnmix {

/// The symbols of a sharded M-step: every rank's count in rank order, and this rank's range [begin, end).
struct SymbolShard {
  std::vector<int64_t> blocks;  ///< the symbols of each rank, in rank order (even_blocks)
  Index begin = 0;              ///< this rank's first symbol
  Index end = 0;                ///< one past this rank's last symbol
};

/// This rank's share of `symbols` symbols (no communication).
[[nodiscard]] SymbolShard symbol_shard(const Communicator& comm, Index symbols);
/// Every symbol on one process: the shard of the unsharded M-step.
[[nodiscard]] inline SymbolShard all_symbols(Index symbols) { return {{symbols}, 0, symbols}; }

/// The run of a table at flat offset whose symbol s holds entries [first(s), first(s + 1)), split by the symbols of
/// shard: a dense symbols × width table has first(s) = s·width, a compressed sparse one its row starts.
template <class First>
[[nodiscard]] StatsSplit::Run symbol_run(Index offset, const SymbolShard& shard, First first) {
  StatsSplit::Run run{offset, {}};
  Index s = 0;
  for (int64_t count : shard.blocks) {
    run.blocks.push_back(first(s + count) - first(s));
    s += count;
  }
  return run;
}

/// The run of a dense table of symbols × width entries at flat offset, split by the symbols of shard.
[[nodiscard]] inline StatsSplit::Run table_run(Index offset, Index width, const SymbolShard& shard) {
  return symbol_run(offset, shard, [width](Index s) { return s * width; });
}

/// stats ← its sum over the ranks of comm, in this rank's blocks only for the entries of split's runs, every other
/// entry whole; the other ranks' blocks keep this rank's own statistics. split.rank must be comm.rank(). Collective.
/// Cost: the bytes of one allreduce of stats, O(M/P) additions for the runs.
void sum_owned_statistics(FlatStats& stats, const Communicator& comm, const StatsSplit& split);

/// The sum of run's entries over the ranks: each rank adds its own block (accurate_sum), and the ranks' totals are
/// summed in rank order. A mass-law total of statistics summed by sum_owned_statistics. Collective.
[[nodiscard]] double run_total(const FlatStats& stats, const StatsSplit::Run& run, const Communicator& comm);

/// Every rank's rows of a table of shard's symbols × width doubles (row-major), in place: each rank has filled its
/// own rows. Collective.
void gather_rows(double* table, Index width, const SymbolShard& shard, const Communicator& comm);

/// The emission B = (counts + ε) row-normalised (stats/simplex.hpp) from summed counts [S, T]: shard's rows
/// estimated here, the others gathered from the ranks of comm; without comm, shard must cover every symbol.
/// Collective with comm. Cost: O(T·(end − begin)) here, the bytes of B on the wire.
[[nodiscard]] Matrix smoothed_emission(const ConstMatrixMap& counts, double eps, const SymbolShard& shard,
                                       const Communicator* comm);

}  // namespace attnmix
