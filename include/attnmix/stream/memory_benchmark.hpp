// SPDX-License-Identifier: Apache-2.0
/// @file memory_benchmark.hpp
/// The memory benchmark: how much each mechanism remembers, against the distance to the evidence, the load on the
/// memory and the state it carries. Torch-free interface (the runs train the mechanisms of far_field.hpp).
///
/// The sweep, for each mechanism and seed (every mechanism starts from the same backbone parameters and sees the
/// same sequences for a seed):
///   recall   far_field.hpp's associative recall at every gap × pairs (queries = pairs: every pair is asked);
///   mqar     multi-query associative recall (memory_tasks.hpp) at every length, with mqar_pairs pairs;
///   passkey  the byte-level passkey (memory_tasks.hpp) at every length.
/// Each case reports accuracy and cross-entropy at the answers (mean over seeds, with the smallest and largest
/// accuracy), the state carried at the end of one sequence, the training time, the chance accuracy, and — where the
/// window and full attention ran on the same case — the share of full attention's gain over the window that the
/// mechanism recovers, (acc − acc_window) / (acc_full − acc_window).
#pragma once

#include "attnmix/stream/far_field.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace attnmix::stream {

/// Every task of the benchmark, in the order a sweep runs them.
inline const std::vector<std::string> kMemoryBenchTasks = {"recall", "mqar", "passkey"};

/// What `attnmix lm memory-bench` sweeps (docs/far-field.md): the mechanisms, the tasks and their settings, and the
/// seeds. validate() checks them.
struct MemoryBenchOptions {
  /// The mechanisms to train, each one of kSequenceMechanisms; the sweep and the cases follow this order, and the
  /// share of full attention's gain needs "window" and "full" among them.
  std::vector<std::string> mechanisms = {"window", "moment-closure", "moment-closure+outliers", "linear",
                                         "frequent-directions", "tensor-sketch", "full"};
  std::vector<std::string> tasks = kMemoryBenchTasks;  ///< the tasks to run, in this order
  /// recall: the gaps (filler tokens between the last pair and the first query) to sweep.
  std::vector<int64_t> recall_gaps = {24, 64, 256, 1024};
  /// recall: the numbers of pairs to sweep at every gap, each asked once (keys are raised to at least the pairs;
  /// values and filler are training.task's).
  std::vector<int64_t> recall_pairs = {1, 4, 16};
  std::vector<int64_t> mqar_lengths = {64, 128, 256, 512};  ///< mqar: the sequence lengths to sweep (even)
  /// mqar: key-value pairs per sequence at every length (the other sizes are MqarTaskOptions' defaults).
  int64_t mqar_pairs = 16;
  /// passkey: the sequence lengths in bytes to sweep (a 5-digit key, PasskeyTaskOptions' default).
  std::vector<int64_t> passkey_lengths = {1024, 4096};
  std::vector<uint64_t> seeds = {0};  ///< one run per seed of every task setting and mechanism (RecallRunOptions::seed)
  /// Model and training settings of every run (its task and seed fields are set per run).
  RecallRunOptions training;
};

/// Checks the options (every list non-empty where its task runs, known mechanisms and tasks, valid tasks) before
/// anything trains. @throws ValueError naming the field.
void validate(const MemoryBenchOptions& options);

/// One training run.
struct MemoryBenchRun {
  std::string task;     ///< "recall", "mqar" or "passkey"
  std::string setting;  ///< e.g. "gap 256, pairs 4", "length 256, pairs 16", "length 4096"
  int64_t length = 0;   ///< tokens per sequence
  uint64_t seed = 0;     ///< the run's RecallRunOptions::seed (parameters and data)
  RecallResult result;  ///< what the run measured; result.mechanism names the mechanism
};

/// One case: a task setting and a mechanism, over the seeds.
struct MemoryBenchCase {
  std::string task;       ///< "recall", "mqar" or "passkey"
  std::string setting;    ///< the task setting, as MemoryBenchRun::setting
  std::string mechanism;  ///< one of kSequenceMechanisms
  int64_t seeds = 0;      ///< runs summarised (every seed of the options)
  double accuracy = 0.0;  ///< mean over the seeds
  double accuracy_min = 0.0;  ///< the smallest accuracy over the seeds
  double accuracy_max = 0.0;  ///< the largest accuracy over the seeds
  double cross_entropy = 0.0;  ///< mean over the seeds (nats at the answers)
  double chance = 0.0;         ///< accuracy of a uniform guess
  int64_t state_bytes = 0;     ///< at the end of one sequence
  double seconds = 0.0;        ///< mean training time
  /// (accuracy − window's) / (full's − window's): needs window and full on the case, and full above the window by more
  /// than four standard errors of an accuracy at chance over the answers scored.
  std::optional<double> share_of_full_gain;
};

/// What run_memory_benchmark returns: every run, and the cases they make.
struct MemoryBenchReport {
  std::vector<MemoryBenchRun> runs;    ///< in sweep order
  std::vector<MemoryBenchCase> cases;  ///< in sweep order: task, setting, then the mechanisms' order
};

/// Called before each run that trains: its 1-based index, the total number of runs and the run (without a result
/// yet).
using MemoryBenchProgress = std::function<void(int64_t index, int64_t total, const MemoryBenchRun& run)>;

/// How a sweep reports while it goes, and what it may reuse.
struct MemoryBenchHooks {
  MemoryBenchProgress on_run;                                ///< before each run that trains
  std::function<void(int64_t step, double loss)> on_step;    ///< after every training step of every run
  std::function<void(const MemoryBenchReport& so_far)> on_result;  ///< after each run, with every run so far
  /// Runs finished earlier with the same options (a resumed sweep): a planned run with the same task, setting,
  /// mechanism and seed takes its result from here instead of training again; the others are ignored.
  std::vector<MemoryBenchRun> done;
};

/// Runs the sweep. @throws ValueError for invalid options (before any run).
MemoryBenchReport run_memory_benchmark(const MemoryBenchOptions& options, const MemoryBenchHooks& hooks = {});

/// The cases of `runs`: one per task setting and mechanism whose runs for every seed are all there, in sweep order,
/// with the share of full attention's gain where window and full attention are complete too.
[[nodiscard]] std::vector<MemoryBenchCase> memory_bench_cases(const MemoryBenchOptions& options,
                                                              const std::vector<MemoryBenchRun>& runs);

}  // namespace attnmix::stream
