// SPDX-License-Identifier: Apache-2.0
// The memory benchmark's sweep; see include/attnmix/stream/memory_benchmark.hpp.
#include "attnmix/stream/memory_benchmark.hpp"

#include "attnmix/core/errors.hpp"
#include "attnmix/stream/memory_tasks.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

namespace attnmix::stream {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string str(int64_t v) { return std::to_string(v); }

// A task setting of the sweep: its label, its chance accuracy, the answers scored per sequence and its sequences.
struct Setting {
  std::string task;
  std::string label;
  double chance = 0.0;
  int64_t answers_per_sequence = 0;
  SequenceTask sequences;
};

std::vector<Setting> settings(const MemoryBenchOptions& o) {
  std::vector<Setting> out;
  const auto runs = [&](const char* task) { return contains(o.tasks, task); };
  if (runs("recall")) {
    for (const int64_t gap : o.recall_gaps) {
      for (const int64_t pairs : o.recall_pairs) {
        RecallTaskOptions t = o.training.task;
        t.gap = gap;
        t.pairs = pairs;
        t.queries = pairs;
        t.keys = std::max(t.keys, pairs);
        out.push_back({"recall", "gap " + str(gap) + ", pairs " + str(pairs), 1.0 / static_cast<double>(t.values),
                       t.queries, recall_task(t)});
      }
    }
  }
  if (runs("mqar")) {
    for (const int64_t length : o.mqar_lengths) {
      MqarTaskOptions t;
      t.pairs = o.mqar_pairs;
      t.length = length;
      validate_mqar_task(t);
      out.push_back({"mqar", "length " + str(length) + ", pairs " + str(t.pairs), 1.0 / static_cast<double>(t.values),
                     t.pairs, {"mqar", mqar_vocab(t), t.length, [t](Rng& rng, int64_t batch) { return mqar_sequences(rng, t, batch); }}});
    }
  }
  if (runs("passkey")) {
    for (const int64_t length : o.passkey_lengths) {
      PasskeyTaskOptions t;
      t.length = length;
      validate_passkey_task(t);
      out.push_back({"passkey", "length " + str(length), 0.1, t.digits,
                     {"passkey", 256, t.length, [t](Rng& rng, int64_t batch) { return passkey_sequences(rng, t, batch); }}});
    }
  }
  return out;
}

MemoryBenchCase summarise(const Setting& setting, const std::string& mechanism,
                          const std::vector<const RecallResult*>& results) {
  MemoryBenchCase c;
  c.task = setting.task;
  c.setting = setting.label;
  c.mechanism = mechanism;
  c.chance = setting.chance;
  c.seeds = static_cast<int64_t>(results.size());
  c.accuracy_min = 1.0;
  for (const RecallResult* r : results) {
    c.accuracy += r->accuracy;
    c.cross_entropy += r->cross_entropy;
    c.seconds += r->seconds;
    c.accuracy_min = std::min(c.accuracy_min, r->accuracy);
    c.accuracy_max = std::max(c.accuracy_max, r->accuracy);
    c.state_bytes = std::max(c.state_bytes, r->state_bytes);
  }
  const auto n = static_cast<double>(results.size());
  c.accuracy /= n;
  c.cross_entropy /= n;
  c.seconds /= n;
  return c;
}

}  // namespace

void validate(const MemoryBenchOptions& o) {
  if (o.mechanisms.empty()) throw ValueError("memory-bench: mechanisms must not be empty");
  for (const auto& m : o.mechanisms) {
    try {
      check_sequence_mechanism(m);
    } catch (const ValueError& e) {
      throw ValueError(std::string("memory-bench: mechanisms: ") + e.what());
    }
  }
  if (o.tasks.empty()) throw ValueError("memory-bench: tasks must not be empty");
  for (const auto& t : o.tasks) {
    if (!contains(kMemoryBenchTasks, t)) throw ValueError("memory-bench: tasks: unknown task \"" + t + "\" (recall, mqar or passkey)");
  }
  if (o.seeds.empty()) throw ValueError("memory-bench: seeds must not be empty");
  const auto non_empty = [&](const char* task, const char* field, size_t size) {
    if (contains(o.tasks, task) && size == 0) throw ValueError(std::string("memory-bench: ") + field + " must not be empty");
  };
  non_empty("recall", "recall_gaps", o.recall_gaps.size());
  non_empty("recall", "recall_pairs", o.recall_pairs.size());
  non_empty("mqar", "mqar_lengths", o.mqar_lengths.size());
  non_empty("passkey", "passkey_lengths", o.passkey_lengths.size());
  (void)settings(o);  // every task setting is valid
  validate_training(o.training);
}

MemoryBenchReport run_memory_benchmark(const MemoryBenchOptions& o, const MemoryBenchHooks& hooks) {
  validate(o);
  const auto cases = settings(o);
  MemoryBenchReport report;
  const auto total = static_cast<int64_t>(cases.size() * o.mechanisms.size() * o.seeds.size());
  int64_t index = 0;
  for (const Setting& setting : cases) {
    for (const std::string& mechanism : o.mechanisms) {
      for (const uint64_t seed : o.seeds) {
        ++index;
        const auto earlier = std::find_if(hooks.done.begin(), hooks.done.end(), [&](const MemoryBenchRun& r) {
          return r.task == setting.task && r.setting == setting.label && r.result.mechanism == mechanism &&
                 r.seed == seed;
        });
        if (earlier != hooks.done.end()) {
          report.runs.push_back(*earlier);
          report.runs.back().length = setting.sequences.length;
        } else {
          MemoryBenchRun run{setting.task, setting.label, setting.sequences.length, seed, {}};
          run.result.mechanism = mechanism;
          if (hooks.on_run) hooks.on_run(index, total, run);
          RecallRunOptions training = o.training;
          training.seed = seed;
          run.result = run_sequence_task(mechanism, setting.sequences, training, hooks.on_step);
          report.runs.push_back(std::move(run));
        }
        if (hooks.on_result) hooks.on_result(report);
      }
    }
  }
  report.cases = memory_bench_cases(o, report.runs);
  return report;
}

std::vector<MemoryBenchCase> memory_bench_cases(const MemoryBenchOptions& o, const std::vector<MemoryBenchRun>& runs) {
  std::vector<MemoryBenchCase> out;
  for (const Setting& setting : settings(o)) {
    const size_t first_case = out.size();
    for (const std::string& mechanism : o.mechanisms) {
      std::vector<const RecallResult*> results;
      for (const uint64_t seed : o.seeds)
        for (const MemoryBenchRun& run : runs)
          if (run.task == setting.task && run.setting == setting.label && run.result.mechanism == mechanism &&
              run.seed == seed) {
            results.push_back(&run.result);
            break;
          }
      if (results.size() == o.seeds.size()) out.push_back(summarise(setting, mechanism, results));
    }
    const auto find = [&](const char* name) -> const MemoryBenchCase* {
      for (size_t i = first_case; i < out.size(); ++i) {
        if (out[i].mechanism == name) return &out[i];
      }
      return nullptr;
    };
    const MemoryBenchCase* window = find("window");
    const MemoryBenchCase* full = find("full");
    // The share needs a gain to share: full attention above the window by more than four standard errors of an
    // accuracy at chance over the answers scored (below that the ratio is noise over noise).
    const double answers = static_cast<double>(o.training.eval_sequences * setting.answers_per_sequence) *
                           static_cast<double>(o.seeds.size());
    const double noise = 4.0 * std::sqrt(setting.chance * (1.0 - setting.chance) / answers);
    if (window && full && full->accuracy - window->accuracy > noise) {
      const double gain = full->accuracy - window->accuracy, base = window->accuracy;
      for (size_t i = first_case; i < out.size(); ++i) out[i].share_of_full_gain = (out[i].accuracy - base) / gain;
    }
  }
  return out;
}

}  // namespace attnmix::stream
