// SPDX-License-Identifier: Apache-2.0
// The streaming language-model spine (issue 8, docs/mechanisms.md#streaming-language-model): TBPTT training throughput
// against the PyTorch baseline bench/pytorch_spine.py, E1-3 (80 vs 40 chunks), and the flat-memory check of a long
// streaming evaluation (STYLE.md §12). Built only with ATTNMIX_WITH_TORCH.
//
// Problem: SlidingWindowSpine(vocab 256, d_model d, 2 layers, 2 heads, window 64), batch 8, chunks of 64 tokens,
// AdamW(lr 1e-3, weight decay 0.01), parameters from torch::manual_seed(kSeed). Token (row r, absolute position p)
// of the stream is lehmer(lehmer((48271·p + 1000003·r + 1) mod M)) mod vocab with lehmer(h) = 48271·h mod M,
// M = 2³¹ − 1 (bench/stream_workload.hpp; pytorch_spine.py computes the same); chunk c is
// x = stream[:, 64c : 64c + 64], y = the next tokens.
//
//   BM_SpineTrainStep/d_model:d   one TBPTT update at detach_horizon 1 (TbpttRunner::feed: step, loss.item(),
//                                 zero_grad, backward, AdamW step, detach) in steady state: the state already
//                                 holds a full window (cache 64 + chunk 64 = 128 keys per query block). The chunks
//                                 cycle through 16 pre-built ones. items = tokens (batch · chunk).
//   BM_DenseProduct/kernel:k/m/k/n  one float32 product (m × k)(k × n) of the spine's shapes on each kernel of
//                                 src/stream/dense_products.cpp (kernel 0 Eigen, 1 the BLAS): how the kernel is chosen
//   BM_AdamWStep/fused:f/d_model:d  one optimizer step over the spine's parameters (random gradients): libtorch's
//                                 torch::optim::AdamW (f = 0) against FusedAdamW (f = 1, what lm train and these
//                                 benchmarks use; equal to the bit).
//   BM_SpineStream/chunks:n       E1-3: train_tbptt over n chunks from an empty state (d_model 32), wall clock
//                                 (after an untimed warm-up over 3 chunks). A bounded state makes 80 chunks cost
//                                 about twice 40 (docs/mechanisms.md#streaming-language-model: ≤ 2.3×).
//
// Extra modes (our flags; they print JSON and exit without running benchmarks):
//   --spine_rss_tokens=N       streaming evaluation without autograd (NoGradGuard, step(), loss summed) over at
//                              least N tokens (whole chunks), then getrusage's ru_maxrss; run it in a fresh process
//                              per N (bench/compare.py spine does): peak RSS at 1e6 tokens within 10 % of 1e5.
//   --spine_check_losses=K     the first K training losses from an empty state (printed to 9 digits), for
//                              `pytorch_spine.py --check` (same seed and data → same parameters and losses).
//   --spine_serve=d            lock-step server of BM_SpineTrainStep at d_model d for `compare.py spine` (which
//                              alternates it with `pytorch_spine.py --serve` a few steps at a time): prints "ready",
//                              then runs n steps per line n read from stdin and prints their wall and CPU time.
//   --spine_d_model=d          d_model of --spine_rss_tokens and --spine_check_losses (default 32).
//   --spine_threads=k          at::set_num_threads(k) for everything (default 1, like the PyTorch baseline).
//
// Run: build-bench/bench/attnmix_bench_spine --benchmark_filter=BM_SpineTrainStep
//      /usr/bin/python3 bench/compare.py spine          (both programs, lock-step and rounds; docs/PERFORMANCE.md)
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/fused_adamw.hpp"
#include "stream/dense_products_impl.hpp"  // white-box: the two product kernels (src/ is on this target's path)
#include "stream_workload.hpp"

namespace attnmix::stream {
namespace {

constexpr int64_t kVocab = bench::kStreamVocab;
constexpr int64_t kLayers = 2;
constexpr int64_t kHeads = 2;
constexpr int64_t kWindow = 64;
constexpr int64_t kBatch = 8;
constexpr int64_t kChunk = 64;
constexpr uint64_t kSeed = 1234;
constexpr int64_t kPool = 16;  // distinct chunks cycled through by BM_SpineTrainStep

int g_threads = 1;

SpineOptions spine_options(int64_t d_model) {
  SpineOptions o;
  o.vocab = kVocab;
  o.d_model = d_model;
  o.n_layer = kLayers;
  o.n_head = kHeads;
  o.window = kWindow;
  return o;
}

using bench::current_rss_kib;
using bench::make_optimizer;

/// Chunk c of the benchmark stream (bench/stream_workload.hpp): x = tokens 64c … 64c+63, y = one position later.
std::pair<torch::Tensor, torch::Tensor> spine_chunk(int64_t c) { return bench::stream_chunk(kBatch, kChunk, c); }

void BM_SpineTrainStep(benchmark::State& st) {
  at::set_num_threads(g_threads);
  torch::manual_seed(kSeed);
  SlidingWindowSpine spine(spine_options(st.range(0)));
  auto optimizer = make_optimizer(spine);
  TbpttRunner<SlidingWindowSpineImpl> runner(*spine, optimizer, TbpttOptions{});
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pool;
  for (int64_t c = 0; c < kPool; ++c) pool.push_back(spine_chunk(c));
  auto state = spine->init_state(kBatch);
  // Warm-up: the first chunk fills the window; two more reach the steady-state shapes of every tensor.
  int64_t next = 0;
  for (; next < 3; ++next) runner.feed(state, pool[next].first, pool[next].second);
  double loss = 0.0;
  for (auto _ : st) {
    const auto& [x, y] = pool[static_cast<size_t>(next++ % kPool)];
    loss = runner.feed(state, x, y);
  }
  benchmark::DoNotOptimize(loss);
  st.SetItemsProcessed(st.iterations() * kBatch * kChunk);
  st.counters["cache_len"] = static_cast<double>(state.cache_k[0].size(1));
  st.counters["threads"] = at::get_num_threads();
}
BENCHMARK(BM_SpineTrainStep)->ArgName("d_model")->Arg(32)->Arg(128)->Arg(256)->Arg(512)
    ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

void BM_DenseProduct(benchmark::State& st) {
  const auto kernel = st.range(0) != 0 ? detail::GemmKernel::kBlas : detail::GemmKernel::kEigen;
  const detail::GemmKernel previous = detail::set_gemm_kernel(kernel);
  torch::manual_seed(kSeed);
  const auto x = torch::randn({st.range(1), st.range(2)});
  const auto w = torch::randn({st.range(3), st.range(2)});  // linear's (out, in) weight: x wᵀ
  torch::NoGradGuard no_grad;
  for (auto _ : st) benchmark::DoNotOptimize(detail::fast_linear(x, w, torch::Tensor()).data_ptr());
  detail::set_gemm_kernel(previous);
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(st.range(1) * st.range(2) * st.range(3)),
                                              benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
// (tokens, in, out) of the spine's projections at d_model 32 … 512 (qkv 3d, proj d, fc1 4d, fc2 back to d, the tied
// head 256) and a per-head attention product (64 queries, head width, 128 keys).
BENCHMARK(BM_DenseProduct)->ArgNames({"kernel", "m", "k", "n"})
    ->ArgsProduct({{0, 1}, {512}, {32}, {96, 256}})
    ->ArgsProduct({{0, 1}, {512}, {128}, {384, 512}})
    ->ArgsProduct({{0, 1}, {512}, {512}, {128}})
    ->ArgsProduct({{0, 1}, {512}, {256}, {768, 1024}})
    ->ArgsProduct({{0, 1}, {512}, {512}, {1536, 2048}})
    ->ArgsProduct({{0, 1}, {512}, {2048}, {512}})
    ->ArgsProduct({{0, 1}, {64}, {16, 64, 256}, {128}})
    ->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_AdamWStep(benchmark::State& st) {
  at::set_num_threads(g_threads);
  torch::manual_seed(kSeed);
  SlidingWindowSpine spine(spine_options(st.range(1)));
  for (auto& p : spine->parameters()) p.mutable_grad() = torch::randn_like(p);
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(0.01);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (st.range(0) != 0) optimizer = std::make_unique<FusedAdamW>(spine->parameters(), options);
  else optimizer = std::make_unique<torch::optim::AdamW>(spine->parameters(), options);
  optimizer->step();  // the moments exist from here on
  int64_t elements = 0;
  for (const auto& p : spine->parameters()) elements += p.numel();
  for (auto _ : st) optimizer->step();
  st.SetItemsProcessed(st.iterations() * elements);
}
BENCHMARK(BM_AdamWStep)->ArgNames({"fused", "d_model"})->ArgsProduct({{0, 1}, {32, 128, 512}})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_SpineStream(benchmark::State& st) {
  at::set_num_threads(g_threads);
  const int64_t n = st.range(0);
  torch::manual_seed(kSeed);
  SlidingWindowSpine spine(spine_options(32));
  auto optimizer = make_optimizer(spine);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> chunks;
  for (int64_t c = 0; c < n; ++c) chunks.push_back(spine_chunk(c));
  const std::vector<std::pair<torch::Tensor, torch::Tensor>> warm_up(chunks.begin(), chunks.begin() + 3);
  train_tbptt(*spine, spine->init_state(kBatch), warm_up, optimizer);
  double last = 0.0;
  for (auto _ : st) {
    auto result = train_tbptt(*spine, spine->init_state(kBatch), chunks, optimizer);
    last = result.losses.back();
  }
  benchmark::DoNotOptimize(last);
  st.SetItemsProcessed(st.iterations() * n * kBatch * kChunk);
}
BENCHMARK(BM_SpineStream)->ArgName("chunks")->Arg(40)->Arg(80)->Unit(benchmark::kMillisecond)->UseRealTime()
    ->MinTime(1.0);

int run_rss(int64_t tokens, int64_t d_model) {
  at::set_num_threads(g_threads);
  torch::NoGradGuard no_grad;
  torch::manual_seed(kSeed);
  SlidingWindowSpine spine(spine_options(d_model));
  spine->eval();
  auto state = spine->init_state(kBatch);
  const int64_t per_chunk = kBatch * kChunk;
  const int64_t n_chunks = (tokens + per_chunk - 1) / per_chunk;
  const auto start = std::chrono::steady_clock::now();
  double loss_sum = 0.0;
  long rss_after_first = 0;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const auto [x, y] = spine_chunk(c);
    auto out = spine->step(state, x, y);
    state = std::move(out.state);
    loss_sum += out.loss.item<double>();
    if (c == 0) rss_after_first = current_rss_kib();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf(
      "{\"mode\": \"rss\", \"implementation\": \"cpp\", \"d_model\": %lld, \"tokens\": %lld, \"chunks\": %lld, "
      "\"max_rss_kib\": %ld, \"rss_after_first_chunk_kib\": %ld, \"rss_end_kib\": %ld, \"state_bytes\": %lld, "
      "\"mean_loss\": %.9g, \"seconds\": %.6g, \"tokens_per_s\": %.6g, \"threads\": %d}\n",
      static_cast<long long>(d_model), static_cast<long long>(n_chunks * per_chunk),
      static_cast<long long>(n_chunks), usage.ru_maxrss, rss_after_first, current_rss_kib(),
      static_cast<long long>(state.bytes()), loss_sum / static_cast<double>(n_chunks), seconds,
      static_cast<double>(n_chunks * per_chunk) / seconds, at::get_num_threads());
  return 0;
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Lock-step server for bench/compare.py: the steady-state training step of BM_SpineTrainStep, run on request.
/// Prints "ready" after the warm-up, then for every line n read from stdin runs n steps and prints
/// {"steps": n, "wall_s": …, "cpu_s": …, "tokens_per_s": …}; ends at EOF or at a line that is not a positive
/// integer.
int run_serve(int64_t d_model) {
  at::set_num_threads(g_threads);
  torch::manual_seed(kSeed);
  SlidingWindowSpine spine(spine_options(d_model));
  auto optimizer = make_optimizer(spine);
  TbpttRunner<SlidingWindowSpineImpl> runner(*spine, optimizer, TbpttOptions{});
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pool;
  for (int64_t c = 0; c < kPool; ++c) pool.push_back(spine_chunk(c));
  auto state = spine->init_state(kBatch);
  int64_t next = 0;
  for (; next < 3; ++next) runner.feed(state, pool[next].first, pool[next].second);
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    const int64_t n = std::atoll(line.c_str());
    if (n < 1) break;
    const double cpu0 = cpu_seconds();
    const auto wall0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) {
      const auto& [x, y] = pool[static_cast<size_t>(next++ % kPool)];
      runner.feed(state, x, y);
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
    const double cpu = cpu_seconds() - cpu0;
    std::printf("{\"steps\": %lld, \"wall_s\": %.9g, \"cpu_s\": %.9g, \"tokens_per_s\": %.9g}\n",
                static_cast<long long>(n), wall, cpu, static_cast<double>(n * kBatch * kChunk) / wall);
    std::fflush(stdout);
  }
  return 0;
}

int run_check(int64_t steps, int64_t d_model) {
  at::set_num_threads(g_threads);
  torch::manual_seed(kSeed);
  SlidingWindowSpine spine(spine_options(d_model));
  double param_sum = 0.0;
  for (const auto& p : spine->parameters()) param_sum += p.detach().to(torch::kDouble).sum().item<double>();
  auto optimizer = make_optimizer(spine);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> chunks;
  for (int64_t c = 0; c < steps; ++c) chunks.push_back(spine_chunk(c));
  const auto result = train_tbptt(*spine, spine->init_state(kBatch), chunks, optimizer);
  std::printf("{\"mode\": \"check\", \"implementation\": \"cpp\", \"d_model\": %lld, \"param_sum\": %.12g, "
              "\"losses\": [",
              static_cast<long long>(d_model), param_sum);
  for (size_t i = 0; i < result.losses.size(); ++i) std::printf("%s%.9g", i ? ", " : "", result.losses[i]);
  std::printf("]}\n");
  return 0;
}

}  // namespace
}  // namespace attnmix::stream

int main(int argc, char** argv) {
  try {
    int64_t rss_tokens = 0, check_steps = 0, serve_d_model = 0, d_model = 32, threads = 1;
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
      const std::string_view arg(argv[i]);
      if (i > 0 && (attnmix::bench::positive_flag(arg, "--spine_rss_tokens", rss_tokens) ||
                    attnmix::bench::positive_flag(arg, "--spine_check_losses", check_steps) ||
                    attnmix::bench::positive_flag(arg, "--spine_serve", serve_d_model) ||
                    attnmix::bench::positive_flag(arg, "--spine_d_model", d_model) ||
                    attnmix::bench::positive_flag(arg, "--spine_threads", threads))) {
        continue;
      }
      args.push_back(argv[i]);
    }
    attnmix::stream::g_threads = static_cast<int>(threads);
    if (rss_tokens > 0) return attnmix::stream::run_rss(rss_tokens, d_model);
    if (check_steps > 0) return attnmix::stream::run_check(check_steps, d_model);
    if (serve_d_model > 0) return attnmix::stream::run_serve(serve_d_model);
    return attnmix::bench::run_benchmarks(args, threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnmix_bench_spine: %s\n", e.what());
    return 1;
  }
  return 0;
}
