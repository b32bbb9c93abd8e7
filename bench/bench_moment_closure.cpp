// SPDX-License-Identifier: Apache-2.0
// Moment-closure attention (issue 9, docs/mechanisms.md#moment-closure-far-field): TBPTT training throughput against
// the window-only spine at the same window and against the PyTorch implementation bench/pytorch_moment_closure.py, and
// the per-token cost and state size of a long streaming evaluation at 10⁴ and 10⁶ tokens (STYLE.md §12). Built only
// with ATTNMIX_WITH_TORCH.
//
// Problem: MomentClosureAttention(vocab 256, d_model 32, 2 layers, 2 heads, window 16, max_clusters 4,
// birth_threshold −2, default merge rule) — the documented defaults (docs/mechanisms.md#moment-closure-far-field) —
// AdamW(lr 1e-3, weight decay 0.01), parameters from torch::manual_seed(kSeed). Token (row r, absolute position p) of
// the stream is lehmer(lehmer((48271·p + 1000003·r + 1) mod M)) mod vocab with lehmer(h) = 48271·h mod M, M = 2³¹ − 1
// (the stream of bench_spine.cpp); chunk c is x = stream[:, c·T : (c+1)·T], y = the next tokens.
// Training runs batch 8 (8 streams, 8 banks per layer) and chunk T = 64 (the spine benchmark's chunk): every step
// then evicts 64 tokens per stream and layer into the banks (cache 16 + chunk 64 → keep 16), so every step runs the
// whole far-field path — MGF logits/outputs and the joint softmax, birth test, merge scan, misfit receipt, soft
// Chan/Welford update and the conservation receipts. T = 16 (= window) is also timed: the per-step bookkeeping is
// then amortised over 4× fewer tokens, the harder case for the 0.5× criterion.
//
//   BM_MomentClosureTrainStep/chunk:T   one TBPTT update at detach_horizon 1 (TbpttRunner::feed: step, loss.item(),
//                                       zero_grad, backward, AdamW step, detach) in steady state (3 warm-up steps;
//                                       the first births one cluster per stream and layer). Chunks cycle through 16
//                                       pre-built ones. items = tokens (batch · chunk).
//   BM_MomentClosureTrainStepBusy/chunk:T  the same with birth_threshold 10 and merge_threshold 0.2: births and
//                                       merges in most streams at every step (1–4 live clusters, different per
//                                       stream) — the bookkeeping-heavy case.
//   BM_WindowTrainStep/chunk:T          the same update for SlidingWindowSpine(window 16) over the same parameters:
//                                       the far field may not cost more than the near field (MCA ≥ 0.5× window).
//   BM_MomentClosureStream/tokens:N     streaming evaluation without autograd, batch 1, chunk 64: the state after N
//                                       tokens is built once (untimed, cached), then each iteration steps the next
//                                       chunk from that same state. items = tokens; counters state_bytes and
//                                       clusters. N = 10⁴ and 10⁶: per-token time and state bytes within 10 %.
//
// Extra modes (our flags; each prints one JSON object and exits without running benchmarks):
//   --mca_check_losses=K       the first K training losses from an empty state (17 digits), births and merges per
//                              step, the live clusters and per-layer sums of the bank tensors at the end, for
//                              `pytorch_moment_closure.py --check K` (same seed and data → same parameters).
//   --mca_dtype=float64        (check mode) convert the seeded float32 parameters to float64 before training.
//   --mca_birth_threshold=x, --mca_merge_threshold=x   (check and stream modes) override the far-field settings.
//   --mca_batch=b, --mca_chunk=T   (check and stream modes; default 8 and 64, stream batch 1).
//   --mca_stream_tokens=N      streaming evaluation (no grad) to N tokens per stream, keeping the state after
//                              --mca_stream_early tokens (default 10⁴); then the next chunk is stepped from that
//                              early state and from the final state alternately, --mca_stream_probe times each
//                              (default 64): median seconds per token (wall and thread CPU) at both ends under the
//                              same load, their ratio, the state bytes at both ends and the RSS. Also the median
//                              chunk times of the stream's own first and last probe chunks.
//   --mca_count_ops=K          K training steps of MCA and of the window-only spine (after 3 warm-up steps, batch 8,
//                              --mca_chunk): the top-level libtorch operations per step by name (forward ops and
//                              backward nodes), {"name": [mca, window]}, and their totals.
//   --mca_threads=k            at::set_num_threads(k) for everything (default 1, like the PyTorch baseline).
//   --mca_d_model=d            the model width for every mode (default 32; 2 heads, so head_dim d/2).
//
// Run: build-mca-bench/bench/attnmix_bench_moment_closure --benchmark_filter=TrainStep
//      /usr/bin/python3 bench/compare.py moment-closure --rounds 5
#include <ATen/record_function.h>
#include <benchmark/benchmark.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "stream_workload.hpp"

namespace attnmix::stream {
namespace {

constexpr int64_t kVocab = bench::kStreamVocab;
constexpr int64_t kLayers = 2;
constexpr int64_t kHeads = 2;
constexpr int64_t kWindow = 16;
constexpr int64_t kMaxClusters = 4;
constexpr int64_t kBatch = 8;
constexpr int64_t kChunk = 64;
constexpr uint64_t kSeed = 1234;
constexpr int64_t kPool = 16;  // distinct chunks cycled through by the training benchmarks

int g_threads = 1;
int64_t g_d_model = 32;  // --mca_d_model

MomentClosureOptions mca_options(double birth_threshold = -2.0, std::optional<double> merge_threshold = {}) {
  MomentClosureOptions o;
  o.vocab = kVocab;
  o.d_model = g_d_model;
  o.n_layer = kLayers;
  o.n_head = kHeads;
  o.window = kWindow;
  o.max_clusters = kMaxClusters;
  o.birth_threshold = birth_threshold;
  o.merge_threshold = merge_threshold;
  return o;
}

SpineOptions window_options() {
  SpineOptions o;
  o.vocab = kVocab;
  o.d_model = g_d_model;
  o.n_layer = kLayers;
  o.n_head = kHeads;
  o.window = kWindow;
  return o;
}

using bench::current_rss_kib;
using bench::make_optimizer;
using bench::stream_chunk;
using bench::stream_tokens;

/// Births and merges of the last step, over layers and streams.
std::pair<int64_t, int64_t> events(const MomentClosureAttentionImpl& m) {
  int64_t births = 0, merges = 0;
  for (const auto& layer : m.last_receipts()) {
    for (const auto& s : layer.streams) {
      births += s.birthed ? 1 : 0;
      merges += static_cast<int64_t>(s.merged.size());
    }
  }
  return {births, merges};
}

double mean_live_clusters(const MomentClosureState& state) {
  double sum = 0.0, n = 0.0;
  for (const auto& bank : state.banks) {
    for (const int64_t c : bank.n_clusters) sum += static_cast<double>(c), n += 1.0;
  }
  return n > 0.0 ? sum / n : 0.0;
}

/// The timed loop of the training benchmarks: 3 warm-up steps (the first births one cluster per stream and layer),
/// then one TBPTT step per iteration over kPool distinct chunks of st.range(0) tokens; after_step(model) runs after
/// each timed step. Returns the final state.
template <class Model, class AfterStep>
auto train_steps(benchmark::State& st, Model& model, AfterStep&& after_step) {
  at::set_num_threads(g_threads);
  const int64_t chunk = st.range(0);
  auto optimizer = make_optimizer(model);
  TbpttRunner<typename Model::ContainedType> runner(*model, optimizer, TbpttOptions{});
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pool;
  for (int64_t c = 0; c < kPool; ++c) pool.push_back(stream_chunk(kBatch, chunk, c));
  auto state = model->init_state(kBatch);
  int64_t next = 0;
  for (; next < 3; ++next) {
    const auto& [x, y] = pool[static_cast<size_t>(next)];
    runner.feed(state, x, y);
  }
  double loss = 0.0;
  for (auto _ : st) {
    const auto& [x, y] = pool[static_cast<size_t>(next++ % kPool)];
    loss = runner.feed(state, x, y);
    after_step(*model);
  }
  benchmark::DoNotOptimize(loss);
  st.SetItemsProcessed(st.iterations() * kBatch * chunk);
  st.counters["state_bytes"] = static_cast<double>(state.bytes());
  st.counters["threads"] = at::get_num_threads();
  return state;
}

void train_moment_closure(benchmark::State& st, const MomentClosureOptions& options) {
  torch::manual_seed(kSeed);
  MomentClosureAttention model(options);
  int64_t births = 0, merges = 0;
  const auto state = train_steps(st, model, [&](const MomentClosureAttentionImpl& m) {
    const auto [b, e] = events(m);
    births += b, merges += e;
  });
  const double steps = static_cast<double>(std::max<int64_t>(st.iterations(), 1));
  st.counters["births_per_step"] = static_cast<double>(births) / steps;
  st.counters["merges_per_step"] = static_cast<double>(merges) / steps;
  st.counters["clusters"] = mean_live_clusters(state);
}

void BM_MomentClosureTrainStep(benchmark::State& st) { train_moment_closure(st, mca_options()); }
BENCHMARK(BM_MomentClosureTrainStep)->ArgName("chunk")->Arg(64)->Arg(16)->Unit(benchmark::kMillisecond)
    ->UseRealTime()->MinTime(1.0);

void BM_MomentClosureTrainStepBusy(benchmark::State& st) { train_moment_closure(st, mca_options(10.0, 0.2)); }
BENCHMARK(BM_MomentClosureTrainStepBusy)->ArgName("chunk")->Arg(64)->Arg(16)->Unit(benchmark::kMillisecond)
    ->UseRealTime()->MinTime(1.0);

void BM_WindowTrainStep(benchmark::State& st) {
  torch::manual_seed(kSeed);
  SlidingWindowSpine spine(window_options());
  train_steps(st, spine, [](const SlidingWindowSpineImpl&) {});
}
BENCHMARK(BM_WindowTrainStep)->ArgName("chunk")->Arg(64)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime()
    ->MinTime(1.0);

/// The evaluation model and its state after `tokens` tokens of one stream (chunk 64, no grad), built once per N.
struct StreamSnapshot {
  MomentClosureAttention model{nullptr};
  MomentClosureState state;
  int64_t chunks = 0;
};

StreamSnapshot& stream_snapshot(int64_t tokens) {
  static std::map<int64_t, StreamSnapshot> cache;
  auto it = cache.find(tokens);
  if (it != cache.end()) return it->second;
  torch::NoGradGuard no_grad;
  torch::manual_seed(kSeed);
  StreamSnapshot s;
  s.model = MomentClosureAttention(mca_options());
  s.model->eval();
  s.state = s.model->init_state(1);
  s.chunks = (tokens + kChunk - 1) / kChunk;
  for (int64_t c = 0; c < s.chunks; ++c) {
    const auto x = stream_tokens(1, c * kChunk, kChunk);
    s.state = s.model->advance(s.state, x).state;
  }
  return cache.emplace(tokens, std::move(s)).first->second;
}

void BM_MomentClosureStream(benchmark::State& st) {
  at::set_num_threads(g_threads);
  auto& snap = stream_snapshot(st.range(0));
  torch::NoGradGuard no_grad;
  const auto [x, y] = stream_chunk(1, kChunk, snap.chunks);
  double loss = 0.0;
  for (auto _ : st) {
    auto out = snap.model->step(snap.state, x, y);
    loss = out.loss.item<double>();
  }
  benchmark::DoNotOptimize(loss);
  st.SetItemsProcessed(st.iterations() * kChunk);
  st.counters["state_bytes"] = static_cast<double>(snap.state.bytes());
  st.counters["clusters"] = mean_live_clusters(snap.state);
  st.counters["position"] = static_cast<double>(snap.state.near.pos);
  st.counters["threads"] = at::get_num_threads();
}
BENCHMARK(BM_MomentClosureStream)->ArgName("tokens")->Arg(10000)->Arg(1000000)->Unit(benchmark::kMicrosecond)
    ->UseRealTime()->MinTime(1.0);

struct ModeOptions {
  int64_t check_steps = 0;
  int64_t count_ops_steps = 0;
  int64_t stream_tokens = 0;
  int64_t stream_probe = 64;
  int64_t stream_early = 10000;
  int64_t batch = 0;  // 0: the mode's default
  int64_t chunk = kChunk;
  bool float64 = false;
  double birth_threshold = -2.0;
  std::optional<double> merge_threshold;
};

void print_doubles(const char* name, const std::vector<double>& v, bool comma = true) {
  std::printf("\"%s\": [", name);
  for (size_t i = 0; i < v.size(); ++i) std::printf("%s%.17g", i ? ", " : "", v[i]);
  std::printf("]%s", comma ? ", " : "");
}

int run_check(const ModeOptions& o) {
  at::set_num_threads(g_threads);
  const int64_t batch = o.batch > 0 ? o.batch : kBatch;
  torch::manual_seed(kSeed);
  MomentClosureAttention model(mca_options(o.birth_threshold, o.merge_threshold));
  if (o.float64) model->to(torch::kFloat64);
  double param_sum = 0.0;
  for (const auto& p : model->parameters()) param_sum += p.detach().to(torch::kDouble).sum().item<double>();
  auto optimizer = make_optimizer(model);
  TbpttRunner<MomentClosureAttentionImpl> runner(*model, optimizer, TbpttOptions{});
  auto state = model->init_state(batch);
  std::vector<double> losses, births, merges;
  for (int64_t c = 0; c < o.check_steps; ++c) {
    const auto [x, y] = stream_chunk(batch, o.chunk, c);
    losses.push_back(runner.feed(state, x, y));
    const auto [b, m] = events(*model);
    births.push_back(static_cast<double>(b));
    merges.push_back(static_cast<double>(m));
  }
  std::printf("{\"mode\": \"check\", \"implementation\": \"cpp\", \"dtype\": \"%s\", \"batch\": %lld, "
              "\"chunk\": %lld, \"birth_threshold\": %.17g, \"param_sum\": %.15g, ",
              o.float64 ? "float64" : "float32", static_cast<long long>(batch), static_cast<long long>(o.chunk),
              o.birth_threshold, param_sum);
  print_doubles("losses", losses);
  print_doubles("births", births);
  print_doubles("merges", merges);
  std::printf("\"n_clusters\": [");
  for (size_t l = 0; l < state.banks.size(); ++l) {
    std::printf("%s[", l ? ", " : "");
    const auto& n = state.banks[l].n_clusters;
    for (size_t s = 0; s < n.size(); ++s) std::printf("%s%lld", s ? ", " : "", static_cast<long long>(n[s]));
    std::printf("]");
  }
  std::printf("], \"bank_sums\": [");
  for (size_t l = 0; l < state.banks.size(); ++l) {
    const auto& b = state.banks[l];
    std::printf("%s[", l ? ", " : "");
    int i = 0;
    for (const auto* t : {&b.count, &b.mu_k, &b.mu_v, &b.sigma_kk, &b.sigma_vk}) {
      std::printf("%s%.17g", i++ ? ", " : "", t->detach().to(torch::kDouble).sum().item<double>());
    }
    std::printf("]");
  }
  std::printf("], \"misfit\": %.17g}\n", model->last_misfit());
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// Streams o.stream_tokens tokens per stream (no grad) and keeps the state reached after o.stream_early tokens; then
/// steps the next chunk from that early state and from the final state alternately, o.stream_probe times each, so
/// that both ends are timed under the same machine load. Also: the median chunk time of chunks 1 … probe and of the
/// last probe chunks of the stream itself, the state bytes at both ends and the RSS.
int run_stream(const ModeOptions& o) {
  at::set_num_threads(g_threads);
  const int64_t batch = o.batch > 0 ? o.batch : 1;
  torch::NoGradGuard no_grad;
  torch::manual_seed(kSeed);
  MomentClosureAttention model(mca_options(o.birth_threshold, o.merge_threshold));
  model->eval();
  auto state = model->init_state(batch);
  const int64_t n_chunks = (o.stream_tokens + o.chunk - 1) / o.chunk;
  const int64_t early_chunks = std::min((o.stream_early + o.chunk - 1) / o.chunk, n_chunks);
  const int64_t probe = std::min(o.stream_probe, n_chunks / 2);
  std::vector<double> seconds;
  seconds.reserve(static_cast<size_t>(n_chunks));
  MomentClosureState early_state;
  long rss_early = 0;
  double loss_sum = 0.0;
  const auto begin = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n_chunks; ++c) {
    const auto [x, y] = stream_chunk(batch, o.chunk, c);
    const auto start = std::chrono::steady_clock::now();
    MechanismStep<MomentClosureState> out;
    try {
      out = model->step(state, x, y);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "attnmix_bench_moment_closure: chunk %lld (tokens %lld … %lld per stream): %s\n",
                   static_cast<long long>(c), static_cast<long long>(c * o.chunk),
                   static_cast<long long>((c + 1) * o.chunk - 1), e.what());
      throw;
    }
    state = std::move(out.state);
    loss_sum += out.loss.item<double>();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (c + 1 == early_chunks) {
      early_state = state;
      rss_early = current_rss_kib();
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  const long rss_end = current_rss_kib();
  const double per_chunk = static_cast<double>(batch * o.chunk);
  // Skip the first chunk (no bank yet): chunks 1 … probe, and the last `probe` chunks.
  const double first = median({seconds.begin() + 1, seconds.begin() + 1 + probe}) / per_chunk;
  const double last = median({seconds.end() - probe, seconds.end()}) / per_chunk;
  // Both ends alternately: the next chunk after each state, stepped from the same state each time.
  const auto [xe, ye] = stream_chunk(batch, o.chunk, early_chunks);
  const auto [xl, yl] = stream_chunk(batch, o.chunk, n_chunks);
  std::vector<double> wall_e, wall_l, cpu_e, cpu_l;
  const auto time_step = [&](const MomentClosureState& s, const torch::Tensor& x, const torch::Tensor& y,
                             std::vector<double>& wall, std::vector<double>& cpu) {
    const auto w0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    auto out = model->step(s, x, y);
    benchmark::DoNotOptimize(out.loss.item<double>());
    cpu.push_back((thread_cpu_seconds() - c0) / per_chunk);
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() / per_chunk);
  };
  for (int64_t i = 0; i < 4; ++i) {  // warm-up
    time_step(early_state, xe, ye, wall_e, cpu_e);
    time_step(state, xl, yl, wall_l, cpu_l);
  }
  wall_e.clear(), wall_l.clear(), cpu_e.clear(), cpu_l.clear();
  for (int64_t i = 0; i < std::max<int64_t>(o.stream_probe, 8); ++i) {
    if (i % 2 == 0) {
      time_step(early_state, xe, ye, wall_e, cpu_e);
      time_step(state, xl, yl, wall_l, cpu_l);
    } else {
      time_step(state, xl, yl, wall_l, cpu_l);
      time_step(early_state, xe, ye, wall_e, cpu_e);
    }
  }
  const double we = median(wall_e), wl = median(wall_l), ce = median(cpu_e), cl = median(cpu_l);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf(
      "{\"mode\": \"stream\", \"implementation\": \"cpp\", \"batch\": %lld, \"chunk\": %lld, "
      "\"tokens_per_stream\": %lld, \"early_tokens_per_stream\": %lld, \"alternations\": %lld, "
      "\"early_s_per_token\": %.6g, \"late_s_per_token\": %.6g, \"late_over_early\": %.6g, "
      "\"early_cpu_s_per_token\": %.6g, \"late_cpu_s_per_token\": %.6g, \"late_over_early_cpu\": %.6g, "
      "\"stream_first_s_per_token\": %.6g, \"stream_last_s_per_token\": %.6g, \"probe_chunks\": %lld, "
      "\"state_bytes_early\": %lld, \"state_bytes_late\": %lld, \"rss_early_kib\": %ld, \"rss_end_kib\": %ld, "
      "\"max_rss_kib\": %ld, \"clusters_early\": %.3g, \"clusters_late\": %.3g, \"mean_loss\": %.9g, "
      "\"seconds\": %.6g, \"threads\": %d}\n",
      static_cast<long long>(batch), static_cast<long long>(o.chunk), static_cast<long long>(n_chunks * o.chunk),
      static_cast<long long>(early_chunks * o.chunk), static_cast<long long>(wall_e.size()), we, wl, wl / we, ce, cl,
      cl / ce, first, last, static_cast<long long>(probe), static_cast<long long>(early_state.bytes()),
      static_cast<long long>(state.bytes()), rss_early, rss_end, usage.ru_maxrss, mean_live_clusters(early_state),
      mean_live_clusters(state), loss_sum / static_cast<double>(n_chunks), total, at::get_num_threads());
  return 0;
}

/// Top-level libtorch operations (forward ops and backward nodes, not the ops they call) per name while counting.
struct OpCounts {
  bool on = false;
  int depth = 0;
  std::map<std::string, int64_t> calls;
};
OpCounts g_ops;

/// Trains `model` (3 warm-up steps, then `steps` counted ones, batch 8, chunk o.chunk) and returns the top-level
/// operations it ran, by name.
template <class Model>
std::map<std::string, int64_t> count_training_ops(Model& model, const ModeOptions& o, int64_t steps) {
  auto optimizer = make_optimizer(model);
  TbpttRunner<typename Model::ContainedType> runner(*model, optimizer, TbpttOptions{});
  auto state = model->init_state(kBatch);
  for (int64_t c = 0; c < 3 + steps; ++c) {
    const auto [x, y] = stream_chunk(kBatch, o.chunk, c);
    g_ops.on = c >= 3;
    runner.feed(state, x, y);
  }
  g_ops.on = false;
  return std::exchange(g_ops.calls, {});
}

/// The operation counts of a moment-closure and a window-only training step (documented defaults unless the far-field
/// flags say otherwise): what the far field adds in libtorch dispatches, each a few µs at these shapes.
int run_count_ops(const ModeOptions& o) {
  at::set_num_threads(g_threads);
  at::addGlobalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction&) -> std::unique_ptr<at::ObserverContext> {
            ++g_ops.depth;
            return nullptr;
          },
          [](const at::RecordFunction& fn, at::ObserverContext*) {
            if (--g_ops.depth == 0 && g_ops.on) ++g_ops.calls[fn.name()];
          })
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  torch::manual_seed(kSeed);
  MomentClosureAttention mca(mca_options(o.birth_threshold, o.merge_threshold));
  const auto mca_ops = count_training_ops(mca, o, o.count_ops_steps);
  torch::manual_seed(kSeed);
  SlidingWindowSpine window(window_options());
  const auto window_ops = count_training_ops(window, o, o.count_ops_steps);
  const auto total = [](const std::map<std::string, int64_t>& m) {
    int64_t n = 0;
    for (const auto& [name, calls] : m) n += calls;
    return n;
  };
  const double steps = static_cast<double>(o.count_ops_steps);
  std::printf("{\"mode\": \"count_ops\", \"chunk\": %lld, \"steps\": %lld, \"mca_ops_per_step\": %.1f, "
              "\"window_ops_per_step\": %.1f, \"per_step\": {",
              static_cast<long long>(o.chunk), static_cast<long long>(o.count_ops_steps),
              static_cast<double>(total(mca_ops)) / steps, static_cast<double>(total(window_ops)) / steps);
  std::map<std::string, std::pair<int64_t, int64_t>> both;
  for (const auto& [name, calls] : mca_ops) both[name].first = calls;
  for (const auto& [name, calls] : window_ops) both[name].second = calls;
  int i = 0;
  for (const auto& [name, calls] : both) {
    std::printf("%s\"%s\": [%.1f, %.1f]", i++ ? ", " : "", name.c_str(), static_cast<double>(calls.first) / steps,
                static_cast<double>(calls.second) / steps);
  }
  std::printf("}}\n");
  return 0;
}

}  // namespace
}  // namespace attnmix::stream

int main(int argc, char** argv) {
  try {
    attnmix::stream::ModeOptions o;
    int64_t threads = 1;
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
      const std::string_view arg(argv[i]);
      using attnmix::bench::flag_value;
      using attnmix::bench::positive_flag;
      if (i > 0) {
        if (positive_flag(arg, "--mca_check_losses", o.check_steps)) continue;
        if (positive_flag(arg, "--mca_count_ops", o.count_ops_steps)) continue;
        if (positive_flag(arg, "--mca_stream_tokens", o.stream_tokens)) continue;
        if (positive_flag(arg, "--mca_stream_probe", o.stream_probe)) continue;
        if (positive_flag(arg, "--mca_stream_early", o.stream_early)) continue;
        if (positive_flag(arg, "--mca_batch", o.batch)) continue;
        if (positive_flag(arg, "--mca_chunk", o.chunk)) continue;
        if (positive_flag(arg, "--mca_threads", threads)) continue;
        if (positive_flag(arg, "--mca_d_model", attnmix::stream::g_d_model)) continue;
        if (auto v = flag_value(arg, "--mca_birth_threshold")) { o.birth_threshold = std::atof(v->c_str()); continue; }
        if (auto v = flag_value(arg, "--mca_merge_threshold")) { o.merge_threshold = std::atof(v->c_str()); continue; }
        if (auto v = flag_value(arg, "--mca_dtype")) {
          if (*v != "float32" && *v != "float64") {
            std::fprintf(stderr, "--mca_dtype must be float32 or float64\n");
            return 2;
          }
          o.float64 = *v == "float64";
          continue;
        }
      }
      args.push_back(argv[i]);
    }
    attnmix::stream::g_threads = static_cast<int>(threads);
    if (o.check_steps > 0) return attnmix::stream::run_check(o);
    if (o.count_ops_steps > 0) return attnmix::stream::run_count_ops(o);
    if (o.stream_tokens > 0) return attnmix::stream::run_stream(o);
    return attnmix::bench::run_benchmarks(args, threads);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnmix_bench_moment_closure: %s\n", e.what());
    return 1;
  }
  return 0;
}
