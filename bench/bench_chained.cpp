// SPDX-License-Identifier: Apache-2.0
// One chained-attention EM iteration (E-step + M-step), the E-step kernel, and its N-scaling (STYLE.md §12).
//
// Problem of the issue: the transitive-lookup task (docs/mechanisms.md#chained-attention, make_transitive_task) with n
// = 20000 rows, N = 10 positions (M = 5 pairs), S = T = 30 symbols, L = 2 or 3 hops, σ² = 0.1.
// Model: K⁽ℓ⁾ entries U(0, 1), emission rows normalised U(0.05, 1) draws. The NumPy baselines
// bench/numpy_chained_em.py draw the same distributions (other random streams).
//
//   BM_ChainedEmIteration/hops:L/threads:k   EmStepper::step on all 20000 rows (one optimize() iteration)
//   BM_ChainedEStepKernel/hops:L             ChainedAttention::accumulate on all rows (no chunking, no merge)
//   BM_ChainedScaling/N:n/S:s                the E-step kernel, L = 2, on 2^22 / N² rows of uniform symbols
//                                            (fixed N²·rows work); counter ns_per_pair = time / (rows · N²)
//                                            should not depend on N or S: the cost is O(L·N²) per row, not N²·S
//   BM_ChainedCheckCase/hops:L               one em_step on the closed-form case of numpy_chained_em.py
//                                            (S = 7, T = 5, N = 6, 64 rows, σ² = 0.3); counters carry the
//                                            log-likelihood and checksums that `numpy_chained_em.py --check-cpp`
//                                            compares with both NumPy baselines
//
// Run: build-bench/bench/attnmix_bench --benchmark_filter=Chained [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/transitive_task.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/reduce.hpp"

namespace attnmix {
namespace {

constexpr Index kRows = 20000;
constexpr int64_t kSymbols = 30;
constexpr int64_t kPairs = 5;
constexpr uint64_t kSeed = 20240611;
constexpr Index kScalingWork = Index{1} << 22;  // rows · N² of every BM_ChainedScaling case

/// K⁽ℓ⁾ entries U(0, 1); emission rows normalised U(0.05, 1) draws; σ² = 0.1.
ChainedAttention make_model(Index hops, Index symbols, Index targets, Rng& rng) {
  ChainedAttentionParams p;
  for (Index hop = 0; hop < hops; ++hop) {
    Matrix K(symbols, symbols);
    for (Index k = 0; k < K.size(); ++k) K.data()[k] = rng.uniform();
    p.key_tables.push_back(std::move(K));
  }
  p.emission.resize(symbols, targets);
  for (Index s = 0; s < symbols; ++s) {
    for (Index t = 0; t < targets; ++t) p.emission(s, t) = 0.05 + 0.95 * rng.uniform();
    p.emission.row(s) /= p.emission.row(s).sum();
  }
  p.sigma2 = 0.1;
  return ChainedAttention(std::move(p));
}

/// Model, estimator and the 20000-row transitive batch for L hops, built once per L.
struct Problem {
  ChainedAttention model;
  ChainedAttentionEstimator estimator;
  ChainedAttentionBatch batch;
};

const Problem& problem(Index hops) {
  static std::map<Index, Problem> problems;
  auto it = problems.find(hops);
  if (it == problems.end()) {
    Rng rng(kSeed + static_cast<uint64_t>(hops));
    ChainedAttention model = make_model(hops, kSymbols, kSymbols, rng);
    ChainedAttentionEstimator estimator = model.estimator();
    ChainedAttentionBatch batch = make_transitive_task(kRows, kSeed, {kSymbols, kPairs});
    it = problems.emplace(hops, Problem{std::move(model), std::move(estimator), std::move(batch)}).first;
  }
  return it->second;
}

void BM_ChainedEmIteration(benchmark::State& state) {
  const Problem& p = problem(state.range(0));
  const ParallelOptions parallel{static_cast<int>(state.range(1)), 1024};
  std::vector<double> log_p(static_cast<size_t>(kRows));
  EmStepper stepper(p.estimator, kRows);  // as optimize() runs its iterations
  for (auto _ : state) {
    ChainedAttention next = stepper.step(p.model, p.batch, log_p, parallel);
    benchmark::DoNotOptimize(next.params().emission.data());
    benchmark::DoNotOptimize(log_p.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}
BENCHMARK(BM_ChainedEmIteration)->ArgNames({"hops", "threads"})->Args({2, 1})->Args({2, 2})->Args({3, 1})
    ->Args({3, 2})->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);

void BM_ChainedEStepKernel(benchmark::State& state) {
  const Problem& p = problem(state.range(0));
  const std::vector<double> w(static_cast<size_t>(kRows), 1.0);
  std::vector<double> log_p(static_cast<size_t>(kRows));
  auto acc = p.model.make_accumulator();
  for (auto _ : state) {
    acc.set_zero();
    p.model.accumulate(p.batch, w, acc, log_p);
    benchmark::DoNotOptimize(acc.flat().data());
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}
BENCHMARK(BM_ChainedEStepKernel)->ArgName("hops")->Arg(2)->Arg(3)->Unit(benchmark::kMillisecond)->UseRealTime();

/// Uniform keys, values, queries and targets over [S] (the sampler's context distribution).
ChainedAttentionBatch uniform_batch(const ChainedAttention& model, Index rows, Index positions, Rng& rng) {
  const auto S = static_cast<uint64_t>(model.n_symbols());
  IdMatrix keys(rows, positions);
  IdMatrix values(rows, positions);
  IdVector queries(rows);
  IdVector targets(rows);
  for (Index k = 0; k < keys.size(); ++k) keys.data()[k] = static_cast<int64_t>(rng.uniform_int(S));
  for (Index k = 0; k < values.size(); ++k) values.data()[k] = static_cast<int64_t>(rng.uniform_int(S));
  for (Index n = 0; n < rows; ++n) {
    queries[n] = static_cast<int64_t>(rng.uniform_int(S));
    targets[n] = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(model.n_targets())));
  }
  return model.encoder().encode(std::move(keys), std::move(values), std::move(queries), std::move(targets));
}

void BM_ChainedScaling(benchmark::State& state) {
  const Index N = state.range(0);
  const Index S = state.range(1);
  const Index rows = std::max<Index>(1, kScalingWork / (N * N));
  Rng rng(kSeed + 7);
  const ChainedAttention model = make_model(2, S, 30, rng);
  const ChainedAttentionBatch batch = uniform_batch(model, rows, N, rng);
  const std::vector<double> w(static_cast<size_t>(rows), 1.0);
  auto acc = model.make_accumulator();
  for (auto _ : state) {
    acc.set_zero();
    model.accumulate(batch, w, acc);
    benchmark::DoNotOptimize(acc.flat().data());
  }
  const double pairs = static_cast<double>(rows * N * N);
  state.SetItemsProcessed(state.iterations() * rows * N * N);
  state.counters["rows"] = static_cast<double>(rows);
  state.counters["ns_per_pair"] =
      benchmark::Counter(pairs * 1e-9, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_ChainedScaling)->ArgNames({"N", "S"})->ArgsProduct({{16, 32, 64, 128, 256}, {30, 1024}})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

// ------------------------------------------------------------------------------------------------------------
// The closed-form check case of numpy_chained_em.py (check_case()); any change here must be made there too.

constexpr Index kCheckS = 7, kCheckT = 5, kCheckN = 6, kCheckRows = 64;

std::pair<ChainedAttention, ChainedAttentionBatch> check_case(Index hops) {
  ChainedAttentionParams p;
  for (Index hop = 0; hop < hops; ++hop) {
    Matrix K(kCheckS, kCheckS);
    for (Index s = 0; s < kCheckS; ++s)
      for (Index u = 0; u < kCheckS; ++u)
        K(s, u) = std::sin(1.0 + static_cast<double>((hop * kCheckS + s) * kCheckS + u));
    p.key_tables.push_back(std::move(K));
  }
  p.emission.resize(kCheckS, kCheckT);
  for (Index s = 0; s < kCheckS; ++s) {
    for (Index t = 0; t < kCheckT; ++t) p.emission(s, t) = 1.5 + std::sin(3.0 + static_cast<double>(s * kCheckT + t));
    p.emission.row(s) /= p.emission.row(s).sum();
  }
  p.sigma2 = 0.3;
  ChainedAttention model(std::move(p));
  IdMatrix keys(kCheckRows, kCheckN);
  IdMatrix values(kCheckRows, kCheckN);
  IdVector queries(kCheckRows);
  IdVector targets(kCheckRows);
  for (Index r = 0; r < kCheckRows; ++r) {
    for (Index i = 0; i < kCheckN; ++i) {
      keys(r, i) = (5 * r + 3 * i + (r * i) % 4) % kCheckS;
      values(r, i) = (3 * r + i * i + 1) % kCheckS;
    }
    queries[r] = (2 * r + 1) % kCheckS;
    targets[r] = (7 * r + 2) % kCheckT;
  }
  ChainedAttentionBatch batch =
      model.encoder().encode(std::move(keys), std::move(values), std::move(queries), std::move(targets));
  return {std::move(model), std::move(batch)};
}

/// Σ_k x[k] cos(k) over the row-major flattening (numpy_chained_em.checksum).
template <class X>
double checksum(const X& x, Index offset = 0) {
  double total = 0.0;
  for (Index r = 0; r < x.rows(); ++r)
    for (Index c = 0; c < x.cols(); ++c)
      total += x(r, c) * std::cos(static_cast<double>(offset + r * x.cols() + c));
  return total;
}

void BM_ChainedCheckCase(benchmark::State& state) {
  const Index hops = state.range(0);
  const auto [model, batch] = check_case(hops);
  const ChainedAttentionEstimator estimator = model.estimator();
  const std::vector<double> w(static_cast<size_t>(kCheckRows), 1.0);
  const ParallelOptions parallel{1, 17};  // chunks of unequal size, as the NumPy side uses
  auto acc = model.make_accumulator();
  for (auto _ : state) {
    acc.set_zero();
    parallel_accumulate(model, batch, w, acc, {}, parallel);
    benchmark::DoNotOptimize(acc.flat().data());
  }
  const ChainedAttention next = estimator.estimate(std::nullopt, acc);
  double key_num = 0.0;
  double keys = 0.0;
  for (Index hop = 0; hop < hops; ++hop) {
    key_num += checksum(acc.key_num(hop), hop * kCheckS * kCheckS);
    keys += checksum(next.params().key_tables[static_cast<size_t>(hop)], hop * kCheckS * kCheckS);
  }
  state.counters["hops"] = static_cast<double>(hops);
  state.counters["ll"] = acc.ll();
  state.counters["n"] = acc.n();
  state.counters["chk_key_num"] = key_num;
  state.counters["chk_key_mass"] = checksum(acc.key_mass());
  state.counters["chk_emission_count"] = checksum(acc.emission_count());
  state.counters["chk_keys"] = keys;
  state.counters["chk_emission"] = checksum(next.params().emission);
}
BENCHMARK(BM_ChainedCheckCase)->ArgName("hops")->Arg(2)->Arg(3)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnmix
