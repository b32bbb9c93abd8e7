// SPDX-License-Identifier: Apache-2.0
// The memory benchmark's tasks (stream/memory_tasks.hpp), checked by reading the sequences back: every MQAR key
// asked once and answered with its stored value, the passkey's answer equal to the hidden key, lengths, token
// ranges and validation.
#include "attnmix/stream/memory_tasks.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/stream/memory_benchmark.hpp"

namespace attnmix::stream {
namespace {

TEST(MemoryTasks, MqarAsksEveryStoredKeyOnceAndAnswersWithItsValue) {
  MqarTaskOptions task;
  task.keys = 20;
  task.values = 10;
  task.filler = 3;
  task.pairs = 6;
  task.length = 40;
  Rng rng(5);
  const auto s = mqar_sequences(rng, task, 7);
  ASSERT_EQ(s.length, 40);
  ASSERT_EQ(s.tokens.size(), 7U * 40U);
  ASSERT_EQ(s.answers.size(), 7U * 39U);
  std::set<int64_t> query_positions;
  for (int64_t b = 0; b < 7; ++b) {
    const int64_t* x = s.tokens.data() + b * 40;
    std::map<int64_t, int64_t> stored;
    for (int64_t i = 0; i < task.pairs; ++i) {
      ASSERT_LT(x[2 * i], task.keys);
      ASSERT_GE(x[2 * i + 1], task.keys);
      ASSERT_LT(x[2 * i + 1], task.keys + task.values);
      ASSERT_TRUE(stored.emplace(x[2 * i], x[2 * i + 1]).second) << "keys are distinct";
    }
    std::set<int64_t> asked;
    for (int64_t p = 2 * task.pairs; p < 40; ++p) {
      const bool answer_next = p < 39 && s.answers[static_cast<size_t>(b * 39 + p)] == 1;
      if (answer_next) {
        ASSERT_EQ(stored.count(x[p]), 1U) << "a query is a stored key";
        EXPECT_EQ(x[p + 1], stored[x[p]]);
        EXPECT_EQ((p - 2 * task.pairs) % 2, 0) << "queries sit in aligned slots";
        asked.insert(x[p]);
        query_positions.insert(p);
        ++p;  // the answer itself
      } else {
        EXPECT_GE(x[p], task.keys + task.values) << "the rest is filler";
        EXPECT_LT(x[p], mqar_vocab(task));
      }
    }
    EXPECT_EQ(asked.size(), static_cast<size_t>(task.pairs));
  }
  EXPECT_GT(query_positions.size(), static_cast<size_t>(task.pairs)) << "the query slots vary between sequences";
  for (int64_t p = 0; p < 2 * task.pairs; ++p) EXPECT_EQ(s.answers[static_cast<size_t>(p)], 0);
}

TEST(MemoryTasks, PasskeyAnswerIsTheHiddenKey) {
  PasskeyTaskOptions task;
  task.length = 300;
  Rng rng(9);
  const auto s = passkey_sequences(rng, task, 5);
  std::set<size_t> depths;
  for (int64_t b = 0; b < 5; ++b) {
    std::string text;
    for (int64_t i = 0; i < 300; ++i) {
      const int64_t byte = s.tokens[static_cast<size_t>(b * 300 + i)];
      ASSERT_GE(byte, 0);
      ASSERT_LT(byte, 256);
      text += static_cast<char>(byte);
    }
    const std::string key = text.substr(295);
    for (char c : key) EXPECT_TRUE(c >= '0' && c <= '9') << text;
    const size_t needle = text.find(" The pass key is " + key + ". Remember it. " + key + " is the pass key. ");
    ASSERT_NE(needle, std::string::npos) << text;
    depths.insert(needle);
    EXPECT_EQ(text.substr(295 - 39, 39), " What is the pass key? The pass key is ");
    for (int64_t p = 0; p < 299; ++p) {
      EXPECT_EQ(s.answers[static_cast<size_t>(b * 299 + p)], p >= 294 ? 1 : 0) << p;
    }
  }
  EXPECT_GT(depths.size(), 1U) << "the needle's depth is drawn";
  EXPECT_EQ(passkey_min_length(5), 60 + 39 + 5 + 1);
}

TEST(MemoryTasks, InvalidTasksAreRejectedNamingTheField) {
  Rng rng(1);
  MqarTaskOptions mqar;
  mqar.length = 63;
  EXPECT_THROW((void)mqar_sequences(rng, mqar, 1), ValueError);
  mqar.length = 60;  // < 4 x 16 pairs
  EXPECT_THROW(validate_mqar_task(mqar), ValueError);
  mqar = MqarTaskOptions{};
  mqar.pairs = 70;  // > 64 keys
  EXPECT_THROW(validate_mqar_task(mqar), ValueError);
  EXPECT_THROW((void)mqar_sequences(rng, MqarTaskOptions{}, 0), ValueError);
  PasskeyTaskOptions passkey;
  passkey.digits = 0;
  EXPECT_THROW(validate_passkey_task(passkey), ValueError);
  passkey.digits = 5;
  passkey.length = passkey_min_length(5) - 1;
  try {
    validate_passkey_task(passkey);
    ADD_FAILURE() << "no exception";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("passkey: length must be at least 105"), std::string::npos) << e.what();
  }
  passkey.length = passkey_min_length(5);
  EXPECT_EQ(passkey_sequences(rng, passkey, 2).length, 105);
}

/// The share of full attention's gain needs a gain beyond noise. MQAR with 16 pairs scores 512 × 16 = 8192 answers
/// at chance 1/64, whose four standard errors are 4·sqrt((1/64)(63/64)/8192) = 0.0055: at length 64 full attention's
/// 0.063 against the window's 0.0156 is a gain, and each mechanism gets (accuracy − 0.0156) / (0.063 − 0.0156); at
/// length 512 full attention's 0.0163 is not, and no mechanism gets a share (it would be 0.0004 / 0.0007 = 57 %).
TEST(MemoryBenchCases, ShareOfFullGainNeedsAGainBeyondNoise) {
  MemoryBenchOptions o;
  o.mechanisms = {"window", "linear", "full"};
  o.tasks = {"mqar"};
  o.mqar_lengths = {64, 512};
  ASSERT_EQ(o.mqar_pairs, 16);
  ASSERT_EQ(o.training.eval_sequences, 512);
  const std::map<std::string, std::vector<double>> accuracy = {{"length 64, pairs 16", {0.0156, 0.5, 0.063}},
                                                               {"length 512, pairs 16", {0.0156, 0.016, 0.0163}}};
  std::vector<MemoryBenchRun> runs;
  for (const auto& [setting, values] : accuracy)
    for (size_t m = 0; m < o.mechanisms.size(); ++m) {
      MemoryBenchRun run;
      run.task = "mqar";
      run.setting = setting;
      run.result.mechanism = o.mechanisms[m];
      run.result.accuracy = values[m];
      runs.push_back(run);
    }
  const auto cases = memory_bench_cases(o, runs);
  ASSERT_EQ(cases.size(), 6u);
  EXPECT_EQ(cases[0].setting, "length 64, pairs 16");
  ASSERT_TRUE(cases[0].share_of_full_gain && cases[1].share_of_full_gain && cases[2].share_of_full_gain);
  EXPECT_DOUBLE_EQ(*cases[0].share_of_full_gain, 0.0);
  EXPECT_DOUBLE_EQ(*cases[1].share_of_full_gain, (0.5 - 0.0156) / (0.063 - 0.0156));
  EXPECT_DOUBLE_EQ(*cases[2].share_of_full_gain, 1.0);
  for (size_t i = 3; i < 6; ++i) EXPECT_FALSE(cases[i].share_of_full_gain) << cases[i].mechanism;
}

}  // namespace
}  // namespace attnmix::stream
