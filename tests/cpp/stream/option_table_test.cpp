// SPDX-License-Identifier: Apache-2.0
// The option tables of the streaming models (stream/option_table.hpp): every entry reaches a field of its own, names
// and flags are unique and follow the naming rule, and what a checkpoint keeps is what the checkpoint format
// (docs/lm.md) has always stored and fixed.
#include "attnmix/stream/option_table.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace attnmix::stream {
namespace {

/// Every entry's value in `options`, as text.
template <class Options>
std::map<std::string, std::string> values_of(Options options, const OptionTableOf<Options>& table) {
  std::map<std::string, std::string> out;
  for (const auto& option : table) {
    out[std::string(option.name)] = std::visit(
        [&](const auto& field) {
          const auto& value = field(options);
          using T = std::remove_cvref_t<decltype(value)>;
          if constexpr (std::is_enum_v<T>) {
            return NamedValues<T>::name(value);
          } else if constexpr (std::is_same_v<T, std::optional<double>>) {
            return value ? std::to_string(*value) : std::string("none");
          } else if constexpr (std::is_arithmetic_v<T>) {
            return std::to_string(value);
          } else {
            std::string text;
            for (const auto& item : value) text += std::string(",") + [&] {
              if constexpr (std::is_same_v<std::remove_cvref_t<decltype(item)>, std::string>) {
                return item;
              } else {
                return std::to_string(item);
              }
            }();
            return text;
          }
        },
        option.field);
  }
  return out;
}

/// Changes the field `option` reaches in `options` to another value.
template <class Options>
void change(Options& options, const StreamOption<Options>& option) {
  std::visit(
      [&](const auto& field) {
        auto& value = field(options);
        using T = std::remove_cvref_t<decltype(value)>;
        if constexpr (std::is_enum_v<T>) {
          value = value == NamedValues<T>::kValues[0] ? NamedValues<T>::kValues[1] : NamedValues<T>::kValues[0];
        } else if constexpr (std::is_same_v<T, std::optional<double>>) {
          value = 1.25;
        } else if constexpr (std::is_arithmetic_v<T>) {
          value = static_cast<T>(value + 3);
        } else {
          value.emplace_back();
        }
      },
      option.field);
}

/// Writing through one entry changes that entry's value and no other's: no two entries share a field.
template <class Options>
void expect_own_fields(const OptionTableOf<Options>& table) {
  const auto defaults = values_of(Options{}, table);
  for (const auto& option : table) {
    Options changed;
    change(changed, option);
    const auto after = values_of(changed, table);
    for (const auto& [name, value] : after)
      EXPECT_EQ(value != defaults.at(name), name == option.name) << "writing " << option.name << " changed " << name;
  }
}

/// Names are unique, flags unique; a flag is the name with dashes, but where `renamed` says otherwise.
template <class Options>
void expect_names(const OptionTableOf<Options>& table, const std::map<std::string, std::string>& renamed) {
  std::set<std::string_view> names, flags;
  for (const auto& option : table) {
    EXPECT_TRUE(names.insert(option.name).second) << option.name;
    if (option.flag.empty()) continue;
    EXPECT_TRUE(flags.insert(option.flag).second) << option.flag;
    std::string expected = "--" + std::string(option.name);
    for (char& c : expected)
      if (c == '_') c = '-';
    const auto it = renamed.find(std::string(option.name));
    EXPECT_EQ(option.flag, it == renamed.end() ? expected : it->second);
  }
}

TEST(StreamOptionTable, EveryEntryReachesAFieldOfItsOwn) {
  expect_own_fields(train_option_table());
  expect_own_fields(generate_option_table());
  expect_own_fields(recall_option_table());
  expect_own_fields(memory_bench_option_table());
}

TEST(StreamOptionTable, NamesAndFlags) {
  expect_names(train_option_table(), {{"outlier_capacity", "--outliers"}});
  expect_names(generate_option_table(), {});
  expect_names(recall_option_table(), {{"outlier_capacity", "--outliers"}});
  expect_names(memory_bench_option_table(),
               {{"outlier_capacity", "--outliers"}, {"recall_gaps", "--gaps"}, {"recall_pairs", "--pairs"}});
}

TEST(StreamOptionTable, MemoryBenchReachesTheRecallSettingsUnderTraining) {
  MemoryBenchOptions options;
  for (const auto& option : memory_bench_option_table())
    if (option.name == "window" || option.name == "keys") change(options, option);
  EXPECT_EQ(options.training.window, RecallRunOptions{}.window + 3);
  EXPECT_EQ(options.training.task.keys, RecallTaskOptions{}.keys + 3);
}

// What the checkpoint keeps: the options the format has stored since version 1, the far field's and the sketches'
// only for their mechanisms (the table must not change a checkpoint's contents or what a resumed run may change).
TEST(StreamOptionTable, TheCheckpointKeepsTheFormatsOptions) {
  std::map<std::string, Kept> kept;
  std::map<std::string, std::optional<Mechanism>> only_for;
  for (const auto& option : train_option_table()) {
    kept[std::string(option.name)] = option.kept;
    only_for[std::string(option.name)] = option.only_for;
  }
  for (const char* name : {"mechanism", "vocab", "d_model", "n_layer", "n_head", "window", "batch", "chunk",
                           "detach_horizon", "lr", "min_lr_ratio", "schedule", "weight_decay", "clip", "seed"}) {
    EXPECT_EQ(kept.at(name), Kept::kFixed) << name;
    EXPECT_FALSE(only_for.at(name)) << name;
  }
  EXPECT_EQ(kept.at("steps"), Kept::kStored);
  for (const char* name : {"threads", "checkpoint_every", "eval_every"}) EXPECT_EQ(kept.at(name), Kept::kNo) << name;
  for (const char* name : {"max_clusters", "birth_threshold", "merge_threshold", "outlier_capacity", "cluster_rule"}) {
    EXPECT_EQ(kept.at(name), Kept::kFixed) << name;
    EXPECT_EQ(only_for.at(name), Mechanism::kMomentClosure) << name;
  }
  EXPECT_EQ(only_for.at("sketch_rows"), Mechanism::kFrequentDirections);
  EXPECT_EQ(only_for.at("sketch_dim"), Mechanism::kTensorSketch);
  EXPECT_EQ(only_for.at("sketch_degree"), Mechanism::kTensorSketch);
  EXPECT_EQ(kept.size(), 27u);  // every field of TrainOptions: 14 of ModelConfig, 13 of its own
}

TEST(StreamOptionTable, NamedValuesReadBackTheirNames) {
  for (const Mechanism m : NamedValues<Mechanism>::kValues) EXPECT_EQ(parse_mechanism(mechanism_name(m)), m);
  EXPECT_EQ(value_names<Mechanism>().size(), 6u);
  EXPECT_EQ(value_names<Schedule>(), (std::vector<std::string>{"cosine", "constant"}));
  EXPECT_EQ(value_names<ClusterRule>(), (std::vector<std::string>{"threshold", "budget"}));
  EXPECT_EQ(value_names<WindowCache>(), (std::vector<std::string>{"float32", "int8"}));
}

}  // namespace
}  // namespace attnmix::stream
