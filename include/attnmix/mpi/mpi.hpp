// SPDX-License-Identifier: Apache-2.0
/// @file mpi.hpp
/// attnmix::mpi (CMake option ATTNMIX_WITH_MPI): the EM driver's Communicator over MPI, and the MPI session of a
/// program. A distributed fit runs the same program on every rank (mpirun -np P ...); each rank holds a shard of the
/// rows and passes an MpiCommunicator in OptimizeOptions::communicator (inference/communicator.hpp).
///   sum            in-place MPI_Allreduce (MPI_SUM, MPI_DOUBLE) of the buffer, in pieces of at most 2²⁰ entries
///   all_counts     MPI_Allgather of one int64 per rank
///   all_values     all_counts, then MPI_Allgatherv of each rank's int64 values
///   first_failure  MPI_Allgather of the message lengths, then MPI_Bcast of the lowest failing rank's message
/// Cost of one EM iteration's reduction: an allreduce of the family's flat statistics (8 bytes per entry) plus one of
/// the score (docs/SCALING.md).
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "attnmix/inference/communicator.hpp"

namespace attnmix {

/// The Communicator of a distributed fit over MPI ranks (`docs/design.md#distributed-fits`). sum() is a
/// reduce-scatter (each rank receives the other ranks' parts of its block and adds them in rank order) followed by an
/// allgather, by point-to-point messages in pieces of at most 8 MiB: the bytes on the wire of an allreduce, and bits
/// that do not depend on which algorithm the MPI library would pick for a message size.
class MpiCommunicator final : public Communicator {
 public:
  /// A communicator that must stay valid while this object is used (MPI_COMM_WORLD by default).
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD);
  [[nodiscard]] int rank() const noexcept override { return rank_; }  ///< this process's rank in the communicator
  [[nodiscard]] int size() const noexcept override { return size_; }  ///< the number of ranks
  void sum(std::span<double> values) const override;
  void sum_own_block(std::span<double> values, std::span<const int64_t> blocks) const override;
  void gather_blocks(std::span<double> values, std::span<const int64_t> blocks) const override;
  [[nodiscard]] std::vector<int64_t> all_counts(int64_t own) const override;
  [[nodiscard]] std::vector<int64_t> all_values(std::span<const int64_t> own) const override;
  [[nodiscard]] std::string first_failure(const std::string& own) const override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

/// MPI_Init_thread (MPI_THREAD_FUNNELED: only the main thread calls MPI; the E-step's threads never do) for the
/// lifetime of the object, MPI_Finalize at the end. Errors return from MPI calls (MPI_ERRORS_RETURN on
/// MPI_COMM_WORLD) and become std::runtime_error.
class MpiSession {
 public:
  /// Initialises MPI with the program's arguments. @throws std::runtime_error when MPI cannot start.
  MpiSession(int& argc, char**& argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

}  // namespace attnmix
