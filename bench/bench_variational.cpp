// SPDX-License-Identifier: Apache-2.0
// One variational-embedding-attention EM iteration (Monte-Carlo E-step + plug-in score + Adam M-step), the E-step
// kernel, and the closed-form check case of bench/numpy_variational_em.py (STYLE.md §12).
//
// Problem of the issue: n = 20000 rows, N = 16 positions, S = 512 symbols, D = 32, T = 512 targets, mc = 6.
// Model: m = 0.3·N(0, 1), log v = log 0.1, emission rows normalised U(0.05, 1) draws, π normalised U(0.5, 1)
// draws, σ² = 0.5, optimizer state at iteration 5. Data: uniform contexts, queries and targets. The NumPy baseline
// draws the same distributions (other random streams).
//
//   BM_VariationalEmIteration/threads:k   EmStepper::step on all rows, each from the model the previous step
//                                         returned: what one optimize() iteration costs (the noise tables of the
//                                         new model are drawn inside the step)
//   BM_VariationalEmIterationMixed/threads:k  the same with the mixed-precision gate (docs/mixed_precision.md)
//   BM_VariationalEStepKernel/mixed:{0,1} VariationalEmbeddingAttention::accumulate on all rows (one chunk, noise
//                                         tables already cached), float64 and mixed
//   BM_VariationalCheckCase               one em_step on the closed-form case (S = 7, N = 5, D = 3, T = 4, 40 rows,
//                                         mc = 3); counters carry ll, the plug-in score and checksums that
//                                         `numpy_variational_em.py --check-cpp` compares
//
// Run: build-bench/bench/attnmix_bench --benchmark_filter=Variational [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <cmath>
#include <utility>
#include <vector>

#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/reduce.hpp"

namespace attnmix {
namespace {

constexpr Index kRows = 20000;
constexpr Index kN = 16;
constexpr Index kS = 512;
constexpr Index kD = 32;
constexpr Index kT = 512;
constexpr int64_t kMc = 6;
constexpr uint64_t kSeed = 20240611;

struct Problem {
  VariationalEmbeddingAttention model;
  VariationalEmbeddingAttentionEstimator estimator;
  VariationalEmbeddingAttentionBatch batch;
  VariationalEmbeddingAttention mixed_model;  // the same model and estimator in mixed precision
  VariationalEmbeddingAttentionEstimator mixed_estimator;
};

const Problem& problem() {
  static const Problem p = [] {
    Rng rng(kSeed);
    VariationalEmbeddingAttentionParams params;
    params.mean.resize(kS, kD);
    for (Index k = 0; k < params.mean.size(); ++k) params.mean.data()[k] = 0.3 * rng.normal();
    params.log_var = Matrix::Constant(kS, kD, std::log(0.1));
    params.emission.resize(kS, kT);
    for (Index s = 0; s < kS; ++s) {
      for (Index t = 0; t < kT; ++t) params.emission(s, t) = 0.05 + 0.95 * rng.uniform();
      params.emission.row(s) /= params.emission.row(s).sum();
    }
    params.position_prior.resize(kN);
    for (Index i = 0; i < kN; ++i) params.position_prior[i] = 0.5 + 0.5 * rng.uniform();
    params.position_prior /= params.position_prior.sum();
    params.sigma2 = 0.5;
    AttentionOptimizerState state =
        AttentionOptimizerState::fresh(VariationalEmbeddingAttention::kFamily, params.mean, params.log_var, 7);
    state.iteration = 5;
    params.optimizer_state = std::move(state);
    VariationalEmbeddingAttention model(std::move(params));

    IdMatrix contexts(kRows, kN);
    IdVector queries(kRows), targets(kRows);
    for (Index k = 0; k < contexts.size(); ++k) contexts.data()[k] = static_cast<int64_t>(rng.uniform_int(kS));
    for (Index r = 0; r < kRows; ++r) {
      queries[r] = static_cast<int64_t>(rng.uniform_int(kS));
      targets[r] = static_cast<int64_t>(rng.uniform_int(kT));
    }
    VariationalEmbeddingAttentionBatch batch =
        model.encoder().encode(std::move(contexts), std::move(queries), std::move(targets));
    VariationalEmbeddingAttentionEstimatorOptions options;
    options.sigma2 = 0.5;
    options.mc = kMc;
    VariationalEmbeddingAttentionEstimator estimator(kS, kN, kD, kT, options);
    options.precision = Precision::kMixed;
    VariationalEmbeddingAttentionEstimator mixed_estimator(kS, kN, kD, kT, options);
    VariationalEmbeddingAttention mixed_model(model.params(), Precision::kMixed);
    return Problem{std::move(model), std::move(estimator), std::move(batch), std::move(mixed_model),
                   std::move(mixed_estimator)};
  }();
  return p;
}

void run_em_iteration(benchmark::State& state, const VariationalEmbeddingAttention& start,
                      const VariationalEmbeddingAttentionEstimator& estimator) {
  const ParallelOptions parallel{static_cast<int>(state.range(0)), 1024};
  std::vector<double> log_p(static_cast<size_t>(kRows));
  EmStepper stepper(estimator, kRows);
  // Each step starts from the model the previous one returned, as optimize() does: a new model, its noise cache empty.
  VariationalEmbeddingAttention model(start.params(), start.precision());
  for (auto _ : state) {
    model = stepper.step(model, problem().batch, log_p, parallel);
    benchmark::DoNotOptimize(model.mean().data());
    benchmark::DoNotOptimize(log_p.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}

void BM_VariationalEmIteration(benchmark::State& state) { run_em_iteration(state, problem().model, problem().estimator); }
BENCHMARK(BM_VariationalEmIteration)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)
    ->UseRealTime()->MinTime(1.0);

void BM_VariationalEmIterationMixed(benchmark::State& state) {
  run_em_iteration(state, problem().mixed_model, problem().mixed_estimator);
}
BENCHMARK(BM_VariationalEmIterationMixed)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)
    ->UseRealTime()->MinTime(1.0);

void BM_VariationalEStepKernel(benchmark::State& state) {
  const Problem& p = problem();
  const VariationalEmbeddingAttention& model = state.range(0) != 0 ? p.mixed_model : p.model;
  const std::vector<double> w(static_cast<size_t>(kRows), 1.0);
  auto acc = p.estimator.make_accumulator();
  for (auto _ : state) {
    acc.set_zero();
    model.accumulate(p.batch, w, acc);
    benchmark::DoNotOptimize(acc.flat().data());
  }
  state.SetItemsProcessed(state.iterations() * kRows);
}
BENCHMARK(BM_VariationalEStepKernel)->ArgName("mixed")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// ------------------------------------------------------------------------------------------------------------
// The closed-form check case of numpy_variational_em.py (check_case()); any change here must be made there too.

constexpr Index kCheckS = 7, kCheckN = 5, kCheckD = 3, kCheckT = 4, kCheckRows = 40;
constexpr int64_t kCheckMc = 3;

std::pair<VariationalEmbeddingAttention, VariationalEmbeddingAttentionBatch> check_case() {
  VariationalEmbeddingAttentionParams p;
  p.mean.resize(kCheckS, kCheckD);
  p.log_var.resize(kCheckS, kCheckD);
  Matrix moments[4];
  for (auto& m : moments) m.resize(kCheckS, kCheckD);
  for (Index k = 0; k < kCheckS * kCheckD; ++k) {
    const auto x = static_cast<double>(k);
    p.mean.data()[k] = std::sin(1.0 + x);
    p.log_var.data()[k] = -1.0 + 0.5 * std::cos(2.0 + x);
    for (int j = 0; j < 4; ++j) {
      const double c = std::cos(x + j);
      moments[j].data()[k] = 0.01 * (j + 1) * c * c;
    }
  }
  p.emission.resize(kCheckS, kCheckT);
  for (Index s = 0; s < kCheckS; ++s) {
    for (Index t = 0; t < kCheckT; ++t) p.emission(s, t) = 1.5 + std::sin(3.0 + static_cast<double>(s * kCheckT + t));
    p.emission.row(s) /= p.emission.row(s).sum();
  }
  p.position_prior.resize(kCheckN);
  for (Index i = 0; i < kCheckN; ++i) p.position_prior[i] = 1.0 + 0.5 * std::cos(static_cast<double>(i));
  p.position_prior /= p.position_prior.sum();
  p.sigma2 = 0.7;
  AttentionOptimizerState state =
      AttentionOptimizerState::fresh(VariationalEmbeddingAttention::kFamily, p.mean, p.log_var, 11);
  state.iteration = 3;
  state.mean_first_moment = moments[0];
  state.mean_second_moment = moments[1];
  state.log_var_first_moment = moments[2];
  state.log_var_second_moment = moments[3];
  p.optimizer_state = std::move(state);
  VariationalEmbeddingAttention model(std::move(p));
  IdMatrix contexts(kCheckRows, kCheckN);
  IdVector queries(kCheckRows), targets(kCheckRows);
  for (Index r = 0; r < kCheckRows; ++r) {
    for (Index i = 0; i < kCheckN; ++i) contexts(r, i) = (5 * r + 3 * i + (r * i) % 4) % kCheckS;
    queries[r] = (2 * r + 1) % kCheckS;
    targets[r] = (7 * r + 2) % kCheckT;
  }
  VariationalEmbeddingAttentionBatch batch =
      model.encoder().encode(std::move(contexts), std::move(queries), std::move(targets));
  return {std::move(model), std::move(batch)};
}

/// Σ_k x[k] cos(k) over the row-major flattening (numpy_variational_em.checksum).
template <class X>
double checksum(const X& x) {
  double total = 0.0;
  for (Index k = 0; k < x.size(); ++k) total += x.data()[k] * std::cos(static_cast<double>(k));
  return total;
}

void BM_VariationalCheckCase(benchmark::State& state) {
  const auto [model, batch] = check_case();
  VariationalEmbeddingAttentionEstimatorOptions options;
  options.sigma2 = 0.7;
  options.mc = kCheckMc;
  const VariationalEmbeddingAttentionEstimator estimator(kCheckS, kCheckN, kCheckD, kCheckT, options);
  const std::vector<double> w(static_cast<size_t>(kCheckRows), 1.0);
  std::vector<double> log_p(static_cast<size_t>(kCheckRows));
  auto acc = estimator.make_accumulator();
  std::optional<VariationalEmbeddingAttention> next;
  for (auto _ : state) {
    acc.set_zero();
    parallel_accumulate(model, batch, w, acc, log_p, ParallelOptions{1, 16});
    next.emplace(estimator.estimate(std::nullopt, acc));
  }
  double score = 0.0;
  for (double x : log_p) score += x;
  state.counters["ll"] = acc.ll();
  state.counters["score"] = score;
  state.counters["grad_m"] = checksum(acc.grad_mean());
  state.counters["grad_logv"] = checksum(acc.grad_log_var());
  state.counters["emission_count"] = checksum(acc.emission_count());
  state.counters["position_count"] = checksum(acc.position_count());
  state.counters["mean"] = checksum(next->mean());
  state.counters["log_var"] = checksum(next->log_var());
  state.counters["emission"] = checksum(next->emission());
  state.counters["prior"] = checksum(next->position_prior());
}
BENCHMARK(BM_VariationalCheckCase)->Iterations(1);

}  // namespace
}  // namespace attnmix
