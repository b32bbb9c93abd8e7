// SPDX-License-Identifier: Apache-2.0
// Assignment-tree attention (docs/mechanisms.md#assignment-tree-attention): the LAP solver, frequency_estimate and the
// whole seed-004 experiment (STYLE.md §12). bench/scipy_lap.py times scipy.optimize.linear_sum_assignment on the same
// matrices and `bench/compare.py assign` runs both, plus the seed script, back to back and prints the ratios.
//
// Matrices: uniform [0, 1) costs from a formula both sides evaluate (bench/scipy_lap.py, uniform_cost):
// entry e (row-major) of the nq × nk matrix is SplitMix64(seed + (e + 1)·γ) >> 11 times 2⁻⁵³, with
// seed = nq·4096 + nk and γ = 0x9E3779B97F4A7C15.
//
//   BM_AssignLap/nq:a/nk:b                   linear_sum_assignment (public API: checks, transpose, result vectors);
//                                            counter cost = the optimal cost (scipy_lap.py prints the same)
//   BM_AssignFrequencyEstimate/threads:1     frequency_estimate(cost 16 × 15, τ = 1.7, K = 128) on one thread
//   BM_AssignTreeExperiment/threads:k        run_assignment_tree_experiment(1234, k), end to end
//
// Run: build-bench/bench/attnmix_bench --benchmark_filter=Assign [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <cstdint>

#include "attnmix/assign/assignment_tree.hpp"
#include "attnmix/assign/experiment.hpp"
#include "attnmix/assign/lap.hpp"
#include "attnmix/core/rng.hpp"

namespace attnmix {
namespace {

/// The shared benchmark matrix (see the file comment; bench/scipy_lap.py mirrors it).
Matrix uniform_cost(Index nq, Index nk) {
  constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ULL;
  const auto seed = static_cast<uint64_t>(nq * 4096 + nk);
  Matrix c(nq, nk);
  for (Index e = 0; e < c.size(); ++e) {
    uint64_t z = seed + static_cast<uint64_t>(e + 1) * kGamma;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    c.data()[e] = static_cast<double>(z >> 11) * 0x1.0p-53;
  }
  return c;
}

void BM_AssignLap(benchmark::State& state) {
  const Matrix cost = uniform_cost(state.range(0), state.range(1));
  double total = 0.0;
  for (auto _ : state) {
    const assign::Assignment a = assign::linear_sum_assignment(cost);
    benchmark::DoNotOptimize(a.cols.data());
    total = 0.0;
    for (size_t n = 0; n < a.rows.size(); ++n) total += cost(a.rows[n], a.cols[n]);
  }
  state.counters["cost"] = total;
}
BENCHMARK(BM_AssignLap)
    ->ArgNames({"nq", "nk"})
    ->Args({16, 15})
    ->Args({16, 16})
    ->Args({64, 64})
    ->Args({256, 256})
    ->Args({1024, 1024})
    ->Unit(benchmark::kMicrosecond);

void BM_AssignFrequencyEstimate(benchmark::State& state) {
  const Matrix cost = uniform_cost(16, 15);
  uint64_t seed = 1;
  for (auto _ : state) {
    Rng rng(seed++);
    const Matrix f = assign::frequency_estimate(cost, 1.7, 128, rng, 1);
    benchmark::DoNotOptimize(f.data());
  }
  state.counters["samples_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()) * 128.0,
                                                       benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AssignFrequencyEstimate)->Name("BM_AssignFrequencyEstimate/threads:1")->Unit(benchmark::kMicrosecond);

void BM_AssignTreeExperiment(benchmark::State& state) {
  const auto threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    const assign::AssignmentTreeExperimentResult r = assign::run_assignment_tree_experiment(1234, threads);
    benchmark::DoNotOptimize(r.rmse_slope_observed);
  }
}
BENCHMARK(BM_AssignTreeExperiment)
    ->ArgName("threads")
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();

}  // namespace
}  // namespace attnmix
