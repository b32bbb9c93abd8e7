// SPDX-License-Identifier: Apache-2.0
/// @file stream_workload.hpp
/// The token stream and optimizer shared by the streaming benchmarks (bench_spine.cpp, bench_moment_closure.cpp)
/// and written identically in pytorch_spine.py / pytorch_moment_closure.py: token (r, p) of row r at absolute
/// position p is a Lehmer hash, h = (48271 p + 1000003 r + 1) mod M, then h ← 48271 h mod M twice, token = h mod
/// vocab, with M = 2³¹ − 1; AdamW with lr 1e-3 and weight decay 0.01.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

namespace attnmix::bench {

constexpr int64_t kStreamVocab = 256;
constexpr double kStreamLr = 1e-3;
constexpr double kStreamWeightDecay = 0.01;

/// Tokens of rows 0 … batch−1 at absolute positions start … start+length−1: (batch, length) int64.
inline torch::Tensor stream_tokens(int64_t batch, int64_t start, int64_t length) {
  constexpr int64_t kModulus = 2147483647;
  const auto p = torch::arange(start, start + length, torch::kLong).unsqueeze(0);
  const auto r = torch::arange(batch, torch::kLong).unsqueeze(1);
  auto h = torch::remainder(p * 48271 + r * 1000003 + 1, kModulus);
  h = torch::remainder(h * 48271, kModulus);
  h = torch::remainder(h * 48271, kModulus);
  return torch::remainder(h, kStreamVocab);
}

/// Chunk c of the stream: x = tokens c·chunk … c·chunk+chunk−1, y = the tokens one position later.
inline std::pair<torch::Tensor, torch::Tensor> stream_chunk(int64_t batch, int64_t chunk, int64_t c) {
  return {stream_tokens(batch, c * chunk, chunk), stream_tokens(batch, c * chunk + 1, chunk)};
}

/// AdamW over the module's parameters with the benchmarks' settings.
template <class Module>
torch::optim::AdamW make_optimizer(Module& model) {
  return torch::optim::AdamW(model->parameters(),
                             torch::optim::AdamWOptions(kStreamLr).weight_decay(kStreamWeightDecay));
}

}  // namespace attnmix::bench
