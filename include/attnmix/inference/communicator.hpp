// SPDX-License-Identifier: Apache-2.0
/// @file communicator.hpp
/// The processes of one distributed fit, as the EM driver sees them: a rank, a size, an element-wise sum of a
/// buffer, and agreement on failures (issue 6). optimize() uses one through OptimizeOptions::communicator; without
/// one (the default) a fit is a single process. attnmix::mpi provides the MPI implementation (mpi/mpi.hpp); the core
/// library never depends on MPI.
///
/// Sharding contract: the P processes hold disjoint, consecutive row ranges of one data set, in rank order
/// (rank r holds rows [offset_r, offset_r + n_r), offset_r = Σ_{q<r} n_q; a shard may be empty). Every process
/// builds the same estimator and passes the same options (seed included), so initialisation, the subset weights and
/// every model are identical on every rank, and the fitted model equals the single-process fit of the concatenated
/// rows up to the order of floating-point additions. An empty shard's batch must still have the data set's width.
/// Initialisation replays the single-process draws: each rank draws the subset weights of all rows, and its
/// accumulator's initialize_shard makes the initialisation draws of the other ranks' rows and drops them, without the
/// rows: O(total rows) time once per fit, memory for the shard only (optimize.hpp).
#pragma once

#include <cstdint>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace attnmix {

/// The processes of one distributed fit, as optimize() uses them (see the file comment and
/// `docs/design.md#distributed-fits`). attnmix::mpi's MpiCommunicator (mpi/mpi.hpp) implements it over MPI. The
/// collective calls must be made by every rank, in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This process's rank r, in [0, size()).
  [[nodiscard]] virtual int rank() const noexcept = 0;
  /// The number of processes P of the fit (≥ 1).
  [[nodiscard]] virtual int size() const noexcept = 0;
  /// values ← the element-wise sum over ranks, in place, with the same bits on every rank. Collective.
  /// Implementations add in rank order, ((v₀ + v₁) + v₂) + …, so that sum() agrees bit for bit with
  /// sum_own_block() followed by gather_blocks() (the sharded M-step, sharded_mstep.hpp).
  virtual void sum(std::span<double> values) const = 0;
  /// The reduce half of sum(): values holds size() consecutive blocks in rank order, block q of blocks[q] entries
  /// (Σ blocks = values.size()). On return this rank's block holds the element-wise sum over ranks, with the bits
  /// sum() gives it; the other blocks are left as they were. Collective; every rank passes the same blocks.
  virtual void sum_own_block(std::span<double> values, std::span<const int64_t> blocks) const = 0;
  /// The gather half of sum(): on return every block q of values (laid out as in sum_own_block) holds rank q's block.
  /// Collective; every rank passes the same blocks.
  virtual void gather_blocks(std::span<double> values, std::span<const int64_t> blocks) const = 0;
  /// Every rank's count, in rank order. Collective.
  [[nodiscard]] virtual std::vector<int64_t> all_counts(int64_t own) const = 0;
  /// Every rank's values, concatenated in rank order (ranks may give different numbers of values). Collective.
  [[nodiscard]] virtual std::vector<int64_t> all_values(std::span<const int64_t> own) const = 0;
  /// Failure agreement, collective: every rank passes its own error message ("" when it succeeded) and receives
  /// "" when every rank succeeded, else "rank r: message" of the lowest failing rank r.
  [[nodiscard]] virtual std::string first_failure(const std::string& own) const = 0;
};

/// items split into `parts` consecutive blocks as evenly as possible: block q holds items·(q+1)/parts − items·q/parts
/// (the sharded M-step's symbols per rank, the pieces of sum()).
[[nodiscard]] inline std::vector<int64_t> even_blocks(int64_t items, int parts) {
  std::vector<int64_t> blocks(static_cast<size_t>(parts));
  for (int q = 0; q < parts; ++q) blocks[static_cast<size_t>(q)] = items * (q + 1) / parts - items * q / parts;
  return blocks;
}

/// The shard of this rank: its first global row and the global row count.
struct RowShard {
  /// The global index of this rank's first row: the rows held by the lower ranks, offset_r = Σ_{q<r} n_q.
  int64_t offset = 0;
  /// The rows of all ranks together.
  int64_t total = 0;
};

/// RowShard of a rank holding `rows` rows (collective over comm).
[[nodiscard]] inline RowShard row_shard(const Communicator& comm, int64_t rows) {
  const std::vector<int64_t> counts = comm.all_counts(rows);
  RowShard shard;
  for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
    if (r < comm.rank()) shard.offset += counts[static_cast<size_t>(r)];
    shard.total += counts[static_cast<size_t>(r)];
  }
  return shard;
}

/// What an MPI launcher (mpirun, mpiexec) tells the processes it starts, read from the environment: Open MPI sets
/// OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_RANK, PMI-based launchers PMI_SIZE and PMI_RANK (PMIx: PMIX_RANK).
/// Without a launcher: {false, 1, 0}; a size or rank that is not a decimal integer reads as 1 or 0.
struct LauncherWorld {
  /// True when a launcher's variables are set (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK).
  bool launched = false;
  /// The number of processes the launcher started (≥ 1).
  int size = 1;
  /// This process's rank among them (≥ 0).
  int rank = 0;
};

/// The launcher's world of this process (no MPI call: usable in builds without MPI, before MPI_Init).
[[nodiscard]] LauncherWorld launcher_world() noexcept;

/// Thrown on the ranks that did not fail themselves when another rank failed (the message names that rank).
class RemoteRankError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
/// Runs f on every rank of comm (just f without one) and agrees on failure before anyone goes on: when any rank
/// failed, the failing ranks rethrow their own error and the others throw RemoteRankError naming the first one.
template <class F>
void on_every_rank(const Communicator* comm, F&& f) {
  if (!comm) {
    f();
    return;
  }
  std::exception_ptr own;
  std::string message;
  try {
    f();
  } catch (const std::exception& e) {
    own = std::current_exception();
    message = e.what();
    if (message.empty()) message = "error";
  }
  const std::string first = comm->first_failure(message);
  if (own) std::rethrow_exception(own);
  if (!first.empty()) throw RemoteRankError("another process of this fit failed: " + first);
}
}  // namespace detail

}  // namespace attnmix
