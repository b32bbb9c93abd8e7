// SPDX-License-Identifier: Apache-2.0
/// @file memory_bench_record.hpp
/// The results of the recall runs and of a memory-benchmark sweep as JSON records: the "runs" and "cases" of the file
/// `attnmix lm memory-bench --json` writes (and reads back to resume a sweep), and the dicts Python's run_recall and
/// run_memory_benchmark return (docs/far-field.md). One function builds each, so the program and Python cannot
/// disagree on a field. Cost: O(runs + cases).
#pragma once

#include <nlohmann/json.hpp>

#include <vector>

#include "attnmix/stream/memory_benchmark.hpp"

namespace attnmix::stream {

/// {mechanism, accuracy, cross_entropy, first_loss, last_loss, state_bytes, seconds}, in that order.
[[nodiscard]] nlohmann::ordered_json recall_record(const RecallResult& result);

/// {"runs": [recall_record plus task, setting and seed], "cases": [{task, setting, mechanism, seeds, accuracy,
/// accuracy_min, accuracy_max, cross_entropy, chance, state_bytes, seconds, share_of_full_gain (null when none)}]}.
[[nodiscard]] nlohmann::ordered_json memory_bench_record(const MemoryBenchReport& report);

/// The runs of a record's "runs" array, as memory_bench_record wrote them.
/// @throws nlohmann::json::exception for a missing field or one of the wrong type.
[[nodiscard]] std::vector<MemoryBenchRun> memory_bench_runs(const nlohmann::json& runs);

}  // namespace attnmix::stream
