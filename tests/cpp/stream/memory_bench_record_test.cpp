// SPDX-License-Identifier: Apache-2.0
// The JSON records of recall runs and memory-benchmark sweeps (stream/memory_bench_record.hpp): runs read back as they
// were written (what `lm memory-bench --resume` relies on), and the fields are those docs/far-field.md names.
#include "attnmix/stream/memory_bench_record.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace attnmix::stream {
namespace {

MemoryBenchReport a_report() {
  MemoryBenchReport report;
  report.runs.push_back({"recall", "gap 24, pairs 4", 96, 3, {"window", 0.0625, 2.77, 3.1, 2.9, 1234, 1.5}});
  report.runs.push_back({"passkey", "length 1024", 1024, 18446744073709551615ULL,
                         {"moment-closure", 0.1 + 0.2, 1e-300, 0.0, -0.0, 0, 0.125}});
  MemoryBenchCase c;
  c.task = "recall";
  c.setting = "gap 24, pairs 4";
  c.mechanism = "window";
  c.seeds = 1;
  c.accuracy = c.accuracy_min = c.accuracy_max = 0.0625;
  report.cases.push_back(c);
  c.mechanism = "full";
  c.share_of_full_gain = 1.0;
  report.cases.push_back(c);
  return report;
}

TEST(MemoryBenchRecord, RunsReadBackBitForBit) {
  const MemoryBenchReport report = a_report();
  // Through text, as the --json file stores them.
  const auto record = nlohmann::json::parse(memory_bench_record(report).dump());
  const std::vector<MemoryBenchRun> runs = memory_bench_runs(record.at("runs"));
  ASSERT_EQ(runs.size(), report.runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const MemoryBenchRun &a = runs[i], &b = report.runs[i];
    EXPECT_EQ(a.task, b.task);
    EXPECT_EQ(a.setting, b.setting);
    EXPECT_EQ(a.seed, b.seed);
    EXPECT_EQ(a.result.mechanism, b.result.mechanism);
    EXPECT_EQ(a.result.accuracy, b.result.accuracy);
    EXPECT_EQ(a.result.cross_entropy, b.result.cross_entropy);
    EXPECT_EQ(a.result.first_loss, b.result.first_loss);
    EXPECT_EQ(a.result.last_loss, b.result.last_loss);
    EXPECT_EQ(a.result.state_bytes, b.result.state_bytes);
    EXPECT_EQ(a.result.seconds, b.result.seconds);
  }
}

TEST(MemoryBenchRecord, FieldsInTheDocumentedOrder) {
  const auto record = memory_bench_record(a_report());
  std::vector<std::string> run_keys, case_keys;
  for (const auto& [key, value] : record.at("runs").at(0).items()) run_keys.push_back(key);
  for (const auto& [key, value] : record.at("cases").at(0).items()) case_keys.push_back(key);
  EXPECT_EQ(run_keys, (std::vector<std::string>{"mechanism", "accuracy", "cross_entropy", "first_loss", "last_loss",
                                                "state_bytes", "seconds", "task", "setting", "seed"}));
  EXPECT_EQ(case_keys, (std::vector<std::string>{"task", "setting", "mechanism", "seeds", "accuracy", "accuracy_min",
                                                 "accuracy_max", "cross_entropy", "chance", "state_bytes", "seconds",
                                                 "share_of_full_gain"}));
  EXPECT_TRUE(record.at("cases").at(0).at("share_of_full_gain").is_null());
  EXPECT_EQ(record.at("cases").at(1).at("share_of_full_gain"), 1.0);
}

TEST(MemoryBenchRecord, AMalformedRunIsAJsonError) {
  auto record = nlohmann::json::parse(memory_bench_record(a_report()).dump());
  record["runs"][1].erase("accuracy");
  EXPECT_THROW((void)memory_bench_runs(record["runs"]), nlohmann::json::exception);
  record["runs"][1]["accuracy"] = "high";
  EXPECT_THROW((void)memory_bench_runs(record["runs"]), nlohmann::json::exception);
}

}  // namespace
}  // namespace attnmix::stream
