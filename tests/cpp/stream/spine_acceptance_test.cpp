// SPDX-License-Identifier: Apache-2.0
// Context-spine acceptance rows that train or stream long (labels: slow, torch).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/core/rng.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "testing/all_close.hpp"

namespace attnmix::stream {
namespace {

using Chunks = std::vector<std::pair<torch::Tensor, torch::Tensor>>;

// The lag-5 copy task of E1-2.
constexpr int64_t kVocab = 16;
constexpr int64_t kBatch = 8;
constexpr int64_t kChunk = 8;
constexpr int64_t kLag = 5;
constexpr int64_t kSteps = 25;

SpineOptions copy_task_options(std::optional<int64_t> window) {
  SpineOptions o;
  o.vocab = kVocab;
  o.d_model = 32;
  o.n_layer = 2;
  o.n_head = 2;
  o.window = window;
  return o;
}

/// One stream per batch row, uniform ids; chunk c reads x = s[lag + 8c, lag + 8c + 8) and predicts
/// y = s[8c, 8c + 8), so at every absolute position i, y_i = x_{i−5} (the first 5 targets precede the stream).
Chunks copy_task_chunks(uint64_t seed, int64_t steps) {
  Rng rng(seed);
  auto stream = torch::empty({kBatch, kLag + kChunk * steps}, torch::kLong);
  int64_t* p = stream.data_ptr<int64_t>();
  for (int64_t i = 0; i < stream.numel(); ++i) p[i] = static_cast<int64_t>(rng.uniform_int(kVocab));
  Chunks chunks;
  for (int64_t c = 0; c < steps; ++c) {
    chunks.emplace_back(stream.narrow(1, kLag + kChunk * c, kChunk), stream.narrow(1, kChunk * c, kChunk));
  }
  return chunks;
}

/// `steps` TBPTT steps (one chunk of 8 per update, Adam lr 1e-2) from torch::manual_seed(seed): the chunk losses.
std::vector<double> train_copy_task(std::optional<int64_t> window, uint64_t seed, int64_t steps) {
  torch::manual_seed(seed);
  SlidingWindowSpine spine(copy_task_options(window));
  torch::optim::Adam optimizer(spine->parameters(), torch::optim::AdamOptions(1e-2));
  return train_tbptt(*spine, spine->init_state(kBatch), copy_task_chunks(seed, steps), optimizer).losses;
}

double mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
double head_mean(const std::vector<double>& v, size_t n) { return mean(std::vector<double>(v.begin(), v.begin() + n)); }
double tail_mean(const std::vector<double>& v, size_t n) { return mean(std::vector<double>(v.end() - n, v.end())); }

/// E1-2: lag-5 copy task (y_t = x_{t−5}; vocab 16, batch 8, d_model 32, 2 layers, 2 heads): windowed multi-chunk
/// TBPTT with window 13 = chunk 8 + lag 5 against full attention (window unbounded), 25 steps of one chunk each,
/// Adam lr 1e-2, the same seeds for the parameters and the data: the relative difference of the mean losses is at
/// most 2 % (reference 0.21 %; this build 0.87 % at the default seed, 0.45–1.24 % over seeds 1–5). In 25 steps
/// neither run learns the copy yet — both spend them undoing the large logits of the N(0, 1) tied embedding (first
/// loss ≈ 26, last ≈ 2.9 ≈ log 16) — so the row compares training trajectories; the next test shows the copy itself.
TEST(SlidingWindowSpineAcceptanceTest, WindowedTbpttMatchesFullAttentionOnLagFiveCopy) {
  const uint64_t seed = testing::test_seed(11);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto windowed = train_copy_task(kChunk + kLag, seed, kSteps);
  const auto full = train_copy_task(std::nullopt, seed, kSteps);
  ASSERT_EQ(windowed.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(full.size(), static_cast<size_t>(kSteps));
  const double mw = mean(windowed), mf = mean(full);
  const double gap = std::fabs(mw - mf) / mf;
  std::printf("E1-2 lag-5 copy, 25 steps: mean loss windowed (13) %.5f, full %.5f, relative difference %.3f %%\n", mw,
              mf, 100.0 * gap);
  std::printf("  mean of the first 5 / last 5 chunk losses: windowed %.4f / %.4f, full %.4f / %.4f\n",
              head_mean(windowed, 5), tail_mean(windowed, 5), head_mean(full, 5), tail_mean(full, 5));
  EXPECT_LE(gap, 0.02);
  EXPECT_EQ(windowed.front(), full.front());  // the first chunk (8 tokens) fits in the window: identical
  EXPECT_LT(tail_mean(windowed, 5), head_mean(windowed, 5));
  EXPECT_LT(tail_mean(full, 5), head_mean(full, 5));
}

/// Beyond the E1-2 row (which stops at 25 steps): trained for 150 steps on the same task, the spine with window 13
/// learns the copy — mean loss of the last 10 chunks below 1.5 (0.91 at the default seed, 0.34–1.04 over seeds 1–5)
/// against log 16 ≈ 2.77 for guessing — although 5 of every 8 targets sit in the previous chunk and reach the model
/// only through the carried raw-key cache; with window 4 (< lag 5) the target is never visible and the loss stays
/// above 2.5.
TEST(SlidingWindowSpineAcceptanceTest, CopyIsLearnedOnlyWhenTheWindowCoversTheLag) {
  const uint64_t seed = testing::test_seed(11);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t steps = 150;
  const double covered = tail_mean(train_copy_task(kChunk + kLag, seed, steps), 10);
  const double too_short = tail_mean(train_copy_task(4, seed, steps), 10);
  std::printf("lag-5 copy, 150 steps: mean of the last 10 chunk losses, window 13 %.4f, window 4 %.4f\n", covered,
              too_short);
  EXPECT_LT(covered, 1.5);
  EXPECT_GT(too_short, 2.5);
}

/// E1-3 (bounded state): window 13, chunks of 8, batch 4: after 40 and after 80 chunks every layer's cache holds
/// exactly 13 positions and SlidingWindowState::bytes() is the same, 2 layers × {k, v} × 4 × 13 × 32 floats; under
/// full attention (window unbounded) the state grows with the stream (twice the bytes after 80 chunks as after 40),
/// which shows the check can fail. The wall-clock part of E1-3 (80 chunks ≤ 2.3× the time of 40) is measured by the
/// benchmark, not here: timing on a shared test machine would make a flaky gate.
TEST(SlidingWindowSpineAcceptanceTest, StateStaysBoundedOverLongStreams) {
  const uint64_t seed = testing::test_seed(12);
  Rng rng(seed);
  const int64_t batch = 4, window = kChunk + kLag;
  auto stream = torch::empty({batch, kChunk * 80}, torch::kLong);
  int64_t* p = stream.data_ptr<int64_t>();
  for (int64_t i = 0; i < stream.numel(); ++i) p[i] = static_cast<int64_t>(rng.uniform_int(kVocab));
  torch::NoGradGuard no_grad;
  for (const std::optional<int64_t> w : {std::optional<int64_t>{window}, std::optional<int64_t>{}}) {
    SCOPED_TRACE(w ? "window 13" : "window unbounded");
    torch::manual_seed(seed);
    SlidingWindowSpine spine(copy_task_options(w));
    auto state = spine->init_state(batch);
    int64_t bytes_at_40 = 0;
    for (int64_t c = 0; c < 80; ++c) {
      state = spine->advance(state, stream.narrow(1, kChunk * c, kChunk)).state;
      if (c + 1 == 40) bytes_at_40 = state.bytes();
    }
    const int64_t bytes_at_80 = state.bytes();
    EXPECT_EQ(state.pos, 80 * kChunk);
    std::printf("E1-3 %s: state bytes after 40 chunks %lld, after 80 chunks %lld\n", w ? "window 13" : "unbounded",
                static_cast<long long>(bytes_at_40), static_cast<long long>(bytes_at_80));
    if (w) {
      EXPECT_EQ(bytes_at_80, bytes_at_40);
      EXPECT_EQ(bytes_at_80, 2 * 2 * batch * window * 32 * static_cast<int64_t>(sizeof(float)));
      for (size_t l = 0; l < state.cache_k.size(); ++l) {
        EXPECT_EQ(state.cache_k[l].size(1), window) << "layer " << l;
        EXPECT_EQ(state.cache_v[l].size(1), window) << "layer " << l;
      }
    } else {
      EXPECT_EQ(bytes_at_80, 2 * bytes_at_40);
    }
  }
}

}  // namespace
}  // namespace attnmix::stream
