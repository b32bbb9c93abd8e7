// SPDX-License-Identifier: Apache-2.0
// One responsibility-attention EM iteration (E-step + M-step) and the E-step alone (STYLE.md §12).
//
// Problem of the issue: n = 200000 rows, N = 16 positions, D = 32, S = 256 symbols, T = 256 targets.
// Data: uniform contexts; query = key of a uniformly chosen position + N(0, σ²) noise; uniform targets.
// Model: K ~ N(0, 1), B rows = normalised U(0.05, 1) draws, π = normalised U(0.5, 1) draws, σ² = 1.
// The NumPy baseline bench/numpy_ra_em.py draws the same distributions (other random streams).
//
//   BM_EmIteration/threads:{1,2}   EmStepper::step on all 200000 rows (what one optimize() iteration costs)
//   BM_EmIterationMixed/threads:{1,2}  the same with the mixed-precision E-step (docs/mixed_precision.md)
//   BM_Pass1/mixed:{0,1}           log_density on all rows, one thread: pass 1 alone, float64 and mixed
//   BM_EmStepFresh                 threads:1 through em_step, which allocates its weights and accumulator per call
//   BM_EmIterationChunkRows/<c>/<t> the same with chunk_rows = c (0, the default: 4096 here) on t threads
//   BM_EStep/<rows>                parallel_accumulate on the first <rows> rows, one thread (size sweep)
//   BM_EStepKernel/<rows>          ResponsibilityAttention::accumulate alone (no chunking, no merge)
//   BM_MergePartial                one flat add of a partial accumulator (the per-chunk merge cost)
//   BM_MStep                       estimator.estimate on full statistics
//
// Run: build-bench/bench/attnmix_bench [--benchmark_format=json] [--benchmark_filter=EmIteration]
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/reduce.hpp"
#include "ra_workload.hpp"

namespace attnmix {
namespace {

constexpr Index kRows = 200000;
constexpr Index kN = 16;
constexpr Index kD = 32;
constexpr Index kS = 256;
constexpr Index kT = 256;
constexpr Index kSweepMax = Index{1} << 20;
constexpr uint64_t kSeed = 20240611;

// The workload's model and rows (bench/ra_workload.hpp, shared with bench_mpi.cpp).
ResponsibilityAttention make_model(Rng& rng) { return bench::make_ra_model({kN, kD, kS, kT}, rng); }

ResponsibilityAttentionBatch make_batch(const ResponsibilityAttention& model, Index rows, Rng& rng) {
  return bench::make_ra_batch(model, rows, rng);
}

/// Model and the 200000-row batch, built once.
struct Problem {
  Rng rng{kSeed};
  ResponsibilityAttention model = make_model(rng);
  ResponsibilityAttentionBatch batch = make_batch(model, kRows, rng);
  ResponsibilityAttentionEstimator estimator = model.estimator();
  ResponsibilityAttention mixed_model{model.params(), Precision::kMixed};
  ResponsibilityAttentionEstimator mixed_estimator = mixed_model.estimator();
};

const Problem& problem() {
  static const Problem p;
  return p;
}

/// The 2^20-row batch of the size sweep, built on first use only.
const ResponsibilityAttentionBatch& sweep_batch() {
  static const ResponsibilityAttentionBatch batch = [] {
    Rng rng(kSeed + 1);
    return make_batch(problem().model, kSweepMax, rng);
  }();
  return batch;
}

void run_em_iteration(benchmark::State& state, const ResponsibilityAttention& model,
                      const ResponsibilityAttentionEstimator& estimator) {
  const Problem& p = problem();
  const ParallelOptions parallel{static_cast<int>(state.range(0)), 0};
  std::vector<double> log_p(static_cast<size_t>(kRows));
  EmStepper stepper(estimator, kRows);  // as optimize() runs its iterations
  for (auto _ : state) {
    ResponsibilityAttention next = stepper.step(model, p.batch, log_p, parallel);
    benchmark::DoNotOptimize(next.params().key_means.data());
    benchmark::DoNotOptimize(log_p.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows);
  state.counters["threads"] = static_cast<double>(state.range(0));
}

void BM_EmIteration(benchmark::State& state) { run_em_iteration(state, problem().model, problem().estimator); }
BENCHMARK(BM_EmIteration)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()
    ->MinTime(2.0);

void BM_EmIterationMixed(benchmark::State& state) {
  run_em_iteration(state, problem().mixed_model, problem().mixed_estimator);
}
BENCHMARK(BM_EmIterationMixed)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()
    ->MinTime(2.0);

void BM_Pass1(benchmark::State& state) {
  const Problem& p = problem();
  const ResponsibilityAttention& model = state.range(0) != 0 ? p.mixed_model : p.model;
  std::vector<double> log_p(static_cast<size_t>(kRows));
  for (auto _ : state) {
    model.log_density(p.batch, log_p);
    benchmark::DoNotOptimize(log_p.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}
BENCHMARK(BM_Pass1)->ArgName("mixed")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

/// BM_EmIteration/threads:1 through the free em_step, which allocates the unit weights and the accumulator
/// (2.2 MB) on every call: the difference is the cost of faulting that memory in again (docs/PERFORMANCE.md).
void BM_EmStepFresh(benchmark::State& state) {
  const Problem& p = problem();
  const ParallelOptions parallel{1, 0};
  std::vector<double> log_p(static_cast<size_t>(kRows));
  for (auto _ : state) {
    ResponsibilityAttention next = em_step(p.model, p.batch, p.estimator, log_p, parallel);
    benchmark::DoNotOptimize(next.params().key_means.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}
BENCHMARK(BM_EmStepFresh)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

/// The same iteration with other chunk sizes (0: the default, chunk_rows_for, which picks 4096 for these
/// S·D + S + S·T + N + 1 = 74 001 statistics): shows what the per-chunk merge of the statistics costs.
void BM_EmIterationChunkRows(benchmark::State& state) {
  const Problem& p = problem();
  const ParallelOptions parallel{static_cast<int>(state.range(1)), state.range(0)};
  std::vector<double> log_p(static_cast<size_t>(kRows));
  EmStepper stepper(p.estimator, kRows);
  for (auto _ : state) {
    ResponsibilityAttention next = stepper.step(p.model, p.batch, log_p, parallel);
    benchmark::DoNotOptimize(next.params().key_means.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}
BENCHMARK(BM_EmIterationChunkRows)->ArgNames({"chunk_rows", "threads"})
    ->ArgsProduct({{0, 256, 1024, 4096, 16384, 65536}, {1, 2}})->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_EStep(benchmark::State& state) {
  const Index rows = state.range(0);
  const ResponsibilityAttentionBatch batch = sweep_batch().slice(0, rows);
  const std::vector<double> w(static_cast<size_t>(rows), 1.0);
  std::vector<double> log_p(static_cast<size_t>(rows));
  const ParallelOptions parallel{1, 1024};
  auto acc = problem().model.make_accumulator();
  for (auto _ : state) {
    acc.set_zero();
    parallel_accumulate(problem().model, batch, w, acc, log_p, parallel);
    benchmark::DoNotOptimize(acc.flat().data());
  }
  state.SetItemsProcessed(state.iterations() * rows);
}
BENCHMARK(BM_EStep)->RangeMultiplier(4)->Range(64, kSweepMax)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_EStepKernel(benchmark::State& state) {
  const Index rows = state.range(0);
  const ResponsibilityAttentionBatch batch = sweep_batch().slice(0, rows);
  const std::vector<double> w(static_cast<size_t>(rows), 1.0);
  std::vector<double> log_p(static_cast<size_t>(rows));
  auto acc = problem().model.make_accumulator();
  for (auto _ : state) {
    acc.set_zero();
    problem().model.accumulate(batch, w, acc, log_p);
    benchmark::DoNotOptimize(acc.flat().data());
  }
  state.SetItemsProcessed(state.iterations() * rows);
}
BENCHMARK(BM_EStepKernel)->Arg(1024)->Arg(kRows)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_MergePartial(benchmark::State& state) {
  auto total = problem().model.make_accumulator();
  auto partial = problem().model.make_accumulator();
  for (auto _ : state) {
    partial.set_zero();
    total.merge_trusted(partial);
    benchmark::DoNotOptimize(total.flat().data());
  }
  state.SetBytesProcessed(state.iterations() * 3 * partial.flat_size() * static_cast<int64_t>(sizeof(double)));
}
BENCHMARK(BM_MergePartial)->Unit(benchmark::kMicrosecond);

void BM_MStep(benchmark::State& state) {
  const Problem& p = problem();
  auto acc = p.model.make_accumulator();
  const std::vector<double> w(static_cast<size_t>(kRows), 1.0);
  parallel_accumulate(p.model, p.batch, w, acc, {}, ParallelOptions{1, 0});
  for (auto _ : state) {
    ResponsibilityAttention next = p.estimator.estimate(std::nullopt, acc);
    benchmark::DoNotOptimize(next.params().key_means.data());
  }
}
BENCHMARK(BM_MStep)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnmix

BENCHMARK_MAIN();
