// SPDX-License-Identifier: Apache-2.0
#include "attnmix/stream/memory_bench_record.hpp"

#include <utility>

namespace attnmix::stream {

nlohmann::ordered_json recall_record(const RecallResult& result) {
  return {{"mechanism", result.mechanism},   {"accuracy", result.accuracy},   {"cross_entropy", result.cross_entropy},
          {"first_loss", result.first_loss}, {"last_loss", result.last_loss}, {"state_bytes", result.state_bytes},
          {"seconds", result.seconds}};
}

nlohmann::ordered_json memory_bench_record(const MemoryBenchReport& report) {
  nlohmann::ordered_json out{{"runs", nlohmann::ordered_json::array()}, {"cases", nlohmann::ordered_json::array()}};
  for (const MemoryBenchRun& run : report.runs) {
    nlohmann::ordered_json record = recall_record(run.result);
    record["task"] = run.task;
    record["setting"] = run.setting;
    record["seed"] = run.seed;
    out["runs"].push_back(std::move(record));
  }
  for (const MemoryBenchCase& c : report.cases) {
    out["cases"].push_back({{"task", c.task},
                            {"setting", c.setting},
                            {"mechanism", c.mechanism},
                            {"seeds", c.seeds},
                            {"accuracy", c.accuracy},
                            {"accuracy_min", c.accuracy_min},
                            {"accuracy_max", c.accuracy_max},
                            {"cross_entropy", c.cross_entropy},
                            {"chance", c.chance},
                            {"state_bytes", c.state_bytes},
                            {"seconds", c.seconds},
                            {"share_of_full_gain", c.share_of_full_gain ? nlohmann::ordered_json(*c.share_of_full_gain)
                                                                        : nlohmann::ordered_json(nullptr)}});
  }
  return out;
}

std::vector<MemoryBenchRun> memory_bench_runs(const nlohmann::json& runs) {
  std::vector<MemoryBenchRun> out;
  for (const nlohmann::json& r : runs) {
    MemoryBenchRun run;
    run.task = r.at("task").get<std::string>();
    run.setting = r.at("setting").get<std::string>();
    run.seed = r.at("seed").get<uint64_t>();
    run.result.mechanism = r.at("mechanism").get<std::string>();
    run.result.accuracy = r.at("accuracy").get<double>();
    run.result.cross_entropy = r.at("cross_entropy").get<double>();
    run.result.first_loss = r.at("first_loss").get<double>();
    run.result.last_loss = r.at("last_loss").get<double>();
    run.result.state_bytes = r.at("state_bytes").get<int64_t>();
    run.result.seconds = r.at("seconds").get<double>();
    out.push_back(std::move(run));
  }
  return out;
}

}  // namespace attnmix::stream
