// SPDX-License-Identifier: Apache-2.0
/// @file stream_workload.hpp
/// What the streaming benchmarks (bench_spine.cpp, bench_moment_closure.cpp) share: their command-line plumbing
/// (our "--name=value" flags, then Google Benchmark on the rest), the process RSS, and the token stream and
/// optimizer, written identically in pytorch_spine.py / pytorch_moment_closure.py: token (r, p) of row r at absolute
/// position p is a Lehmer hash, h = (48271 p + 1000003 r + 1) mod M, then h ← 48271 h mod M twice, token = h mod
/// vocab, with M = 2³¹ − 1; AdamW with lr 1e-3 and weight decay 0.01.
#pragma once

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/stream/fused_adamw.hpp"

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

/// AdamW over the module's parameters with the benchmarks' settings (the fused pass `lm train` uses).
template <class Module>
attnmix::stream::FusedAdamW make_optimizer(Module& model) {
  return attnmix::stream::FusedAdamW(model->parameters(),
                                     torch::optim::AdamWOptions(kStreamLr).weight_decay(kStreamWeightDecay));
}

/// "--name=value" → value; nullopt when arg is another argument.
inline std::optional<std::string> flag_value(std::string_view arg, std::string_view name) {
  if (!arg.starts_with(name) || arg.size() <= name.size() || arg[name.size()] != '=') return std::nullopt;
  return std::string(arg.substr(name.size() + 1));
}

/// Parses "--name=value" into value, a positive integer (exits with status 2 otherwise); false for another argument.
inline bool positive_flag(std::string_view arg, std::string_view name, int64_t& value) {
  const auto text = flag_value(arg, name);
  if (!text) return false;
  value = std::atoll(text->c_str());
  if (value < 1) {
    std::fprintf(stderr, "%s must be a positive integer\n", std::string(name).c_str());
    std::exit(2);
  }
  return true;
}

/// VmRSS of this process in KiB (/proc/self/status), −1 when unreadable.
inline long current_rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

/// Google Benchmark over the arguments our flags left (args[0] the program); 1 on an argument it does not know.
inline int run_benchmarks(std::vector<char*> args, int64_t torch_threads) {
  int n_args = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&n_args, args.data());
  if (benchmark::ReportUnrecognizedArguments(n_args, args.data())) return 1;
  benchmark::AddCustomContext("torch_threads", std::to_string(torch_threads));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace attnmix::bench
