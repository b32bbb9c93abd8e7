// SPDX-License-Identifier: Apache-2.0
/// @file distributed.hpp
/// `attnmix fit` under mpirun (issue 6): the pieces the CLI adds on top of the library's
/// Communicator (inference/communicator.hpp). The library agrees on failures inside optimize(); the
/// CLI reads and checks its data before that, so it agrees on its own failures the same way: every
/// process runs a phase, then all of them learn whether any failed (Communicator::first_failure)
/// and, if one did, every process throws the same AgreedError (the exit code and message of the
/// lowest failing rank). main.cpp prints an AgreedError once, on rank 0; every process exits with
/// its code.
///
/// Sharded input: with P processes, rank r reads stripe r of P of the rows of --data (RowStripe),
/// or, when the path holds the placeholder {rank}, the whole file with {rank} replaced by r (one
/// file per process, in rank order).
#pragma once

#include <cstdint>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnmix/inference/communicator.hpp"
#include "cli_support.hpp"
#include "attnmix/io/fields.hpp"

namespace attnmix::cli {

/// A failure every process of a distributed fit agreed on and throws alike: the exit code
/// (kExitUsage or kExitData) and the message of the lowest failing rank.
class AgreedError : public std::runtime_error {
 public:
  AgreedError(int exit_code, int rank, int n_ranks, const std::string& message)
      : std::runtime_error(message), exit_code_(exit_code), rank_(rank), n_ranks_(n_ranks) {}
  [[nodiscard]] int exit_code() const noexcept { return exit_code_; }
  /// The rank whose failure this is, and the number of processes.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int n_ranks() const noexcept { return n_ranks_; }

 private:
  int exit_code_;
  int rank_;
  int n_ranks_;
};

/// The exit code and message main.cpp gives an exception (UsageError: 1; out of memory and every
/// other error: 2).
struct FailureReport {
  int exit_code = kExitOk;
  std::string message;
};
[[nodiscard]] FailureReport report_of(const std::exception_ptr& error);

/// Collective failure agreement (every process calls it): `own` is this process's error (null when
/// it succeeded). Returns when no process failed; otherwise every process throws the AgreedError of
/// the lowest failing rank.
void agree_on_failure(const Communicator& comm, const std::exception_ptr& own);

/// Runs f and agrees on its failure with the other processes (collective); without comm just f(),
/// so a single process keeps its exceptions unchanged. An AgreedError from inside f (a nested
/// agreement, thrown by every process alike) passes through.
template <class F>
void agree(const Communicator* comm, F&& f) {
  if (!comm) {
    f();
    return;
  }
  std::exception_ptr own;
  try {
    f();
  } catch (const AgreedError&) {
    throw;
  } catch (...) {
    own = std::current_exception();
  }
  agree_on_failure(*comm, own);
}

/// Whether a path holds the placeholder {rank} (one file per process).
[[nodiscard]] bool has_rank_placeholder(const std::string& path);

/// `pattern` with every {rank} replaced by the rank.
[[nodiscard]] std::string rank_path(const std::string& pattern, int rank);

/// What one process of a distributed fit reads of a --data or --valid argument.
struct ShardFile {
  std::string pattern;    // the argument as given
  std::string path;       // the file this process reads
  RowStripe stripe;       // its rows in that file
  bool per_rank = false;  // {rank}: one whole file per process
  /// How messages name the file of rank r: "part-2.jsonl", or "" for the stripes of one file (the
  /// file is the one every process reads).
  [[nodiscard]] std::string file_of(int rank) const {
    return per_rank ? rank_path(pattern, rank) : std::string();
  }
};

/// This process's part of `pattern`: its stripe of the file, or its own file for a {rank} pattern.
[[nodiscard]] ShardFile shard_file(const std::string& pattern, const Communicator& comm);

}  // namespace attnmix::cli
