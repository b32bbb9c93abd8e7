// SPDX-License-Identifier: Apache-2.0
// Variational embedding attention in mixed precision (docs/mixed_precision.md) against the float64 kernels, whose own
// oracles (brute force, Monte-Carlo statistics, finite differences) are in variational_embedding_test.cpp: log p and
// the E-step statistics within float rounding of them, rows the float gate cannot represent computed exactly in
// float64, the same exact zeros and impossible rows, bitwise thread-count invariance, and the precision carried
// through EM.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/inference/optimize.hpp"
#include "testing/all_close.hpp"
#include "testing/mixed_precision_checks.hpp"
#include "testing/random_variational.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;
using testing::random_variational_rows;
using Params = VariationalEmbeddingAttentionParams;
using Model = VariationalEmbeddingAttention;
using Batch = VariationalEmbeddingAttentionBatch;

/// A valid model: mean mean_scale·N(0, 1), log v = log 0.2, emission rows and π Dirichlet(1), σ² sigma2.
Params random_params(Index S, Index N, Index D, Index T, Rng& rng, double mean_scale, double sigma2) {
  Params p;
  p.mean.resize(S, D);
  for (Index k = 0; k < p.mean.size(); ++k) p.mean.data()[k] = mean_scale * rng.normal();
  p.log_var = Matrix::Constant(S, D, std::log(0.2));
  p.emission.resize(S, T);
  for (Index s = 0; s < S; ++s) rng.dirichlet_ones({p.emission.row(s).data(), static_cast<size_t>(T)});
  p.position_prior.resize(N);
  rng.dirichlet_ones({p.position_prior.data(), static_cast<size_t>(N)});
  p.sigma2 = sigma2;
  return p;
}

struct Pair {
  Model exact;
  Model mixed;
};

Pair pair_of(const Params& p) { return {Model(p), Model(p, Precision::kMixed)}; }

std::vector<double> log_densities(const Model& model, const Batch& batch) {
  std::vector<double> out(static_cast<size_t>(batch.n_rows()));
  model.log_density(batch, out);
  return out;
}

std::vector<double> flat(const VariationalEmbeddingAttentionAccumulator& acc) {
  std::vector<double> out(static_cast<size_t>(acc.flat_size()));
  acc.pack(out);
  return out;
}

/// log p within 2e−5 of float64 (logits are O(10), float keeps ~7 digits), for N and D on both sides of the 16-lane
/// blocks and of the compile-time specialisations of both gates; and not float64's bits (the gate is float).
TEST(VariationalMixedTest, LogDensityIsWithinFloatRoundingOfFloat64) {
  Rng rng(testing::test_seed(401));
  Index rows = 0, differing = 0;
  for (const Index N : {1, 3, 15, 16, 17, 40})
    for (const Index D : {1, 7, 8, 16, 24, 32, 48, 64, 65, 100}) {
      const Pair m = pair_of(random_params(13, N, D, 5, rng, 1.0, 0.1 * static_cast<double>(D)));
      EXPECT_EQ(m.mixed.precision(), Precision::kMixed);
      const Batch batch = random_variational_rows(60, N, 13, 5, rng);
      const std::vector<double> exact = log_densities(m.exact, batch);
      const std::vector<double> mixed = log_densities(m.mixed, batch);
      for (size_t n = 0; n < exact.size(); ++n)
        ASSERT_NEAR(mixed[n], exact[n], 2e-5 * (1.0 + std::abs(exact[n]))) << "N " << N << " D " << D << " row " << n;
      for (size_t n = 0; n < exact.size(); ++n) differing += mixed[n] != exact[n] ? 1 : 0;
      rows += static_cast<Index>(exact.size());
    }
  EXPECT_GT(differing, rows / 2);
}

/// The Monte-Carlo E-step's statistics (gradients, counts, ll) within float rounding of float64, and the plug-in
/// log p it returns bitwise mixed log_density's.
TEST(VariationalMixedTest, StatisticsAreWithinFloatRoundingOfFloat64) {
  Rng rng(testing::test_seed(402));
  for (const Index D : {8, 32, 37}) {
    const Pair m = pair_of(random_params(24, 16, D, 9, rng, 0.5, 0.5));
    const Batch batch = random_variational_rows(500, 16, 24, 9, rng);
    std::vector<double> w(500);
    for (double& x : w) x = rng.uniform();
    auto exact = m.exact.make_accumulator();
    auto mixed = m.mixed.make_accumulator();
    std::vector<double> log_p(500);
    m.exact.accumulate(batch, w, exact);
    m.mixed.accumulate(batch, w, mixed, log_p);
    EXPECT_EQ(log_p, log_densities(m.mixed, batch));
    const std::vector<double> e = flat(exact), x = flat(mixed);
    double largest = 0.0;
    for (const double v : e) largest = std::max(largest, std::abs(v));
    ExpectAllClose(Matrix(ConstMatrixMap(x.data(), 1, static_cast<Index>(x.size()))),
                   Matrix(ConstMatrixMap(e.data(), 1, static_cast<Index>(e.size()))), 1e-4, 1e-6 * largest);
    EXPECT_NEAR(mixed.n(), exact.n(), 1e-12 * exact.n());
    EXPECT_NEAR(mixed.position_count().sum(), exact.position_count().sum(), 1e-9 * exact.n());  // r sums to 1 in double
  }
}

/// Rows whose probability underflows (p < 1e−250: every emission entry of the context 1e−290) take the log-space
/// path from the float logits and stay within float rounding of float64.
TEST(VariationalMixedTest, UnderflowingRowsUseTheLogSpacePath) {
  Rng rng(testing::test_seed(403));
  Params p = random_params(6, 5, 8, 3, rng, 1.0, 0.5);
  p.emission.col(0).setConstant(1e-290);
  for (Index s = 0; s < 6; ++s) p.emission.row(s).tail(2) *= (1.0 - 1e-290) / p.emission.row(s).tail(2).sum();
  const Pair m = pair_of(p);
  Batch batch = random_variational_rows(40, 5, 6, 1, rng);  // every target 0
  const std::vector<double> exact = log_densities(m.exact, batch);
  const std::vector<double> mixed = log_densities(m.mixed, batch);
  for (size_t n = 0; n < exact.size(); ++n) {
    ASSERT_LT(exact[n], std::log(1e-250));
    ASSERT_NEAR(mixed[n], exact[n], 2e-5 * std::abs(exact[n])) << "row " << n;
  }
}

/// What the float gate cannot represent is computed in float64, bit for bit: coordinates beyond its range (1e30), a
/// σ² whose 1/(2σ²) is no finite float (1e−40), and a row whose every float logit is −∞ (distances ~1e20 at σ² 1e−20:
/// d²/2σ² ~ 5e39 > float's 3.4e38, with the query absent from its context).
TEST(VariationalMixedTest, RowsTheFloatGateCannotRepresentAreFloat64) {
  Rng rng(testing::test_seed(404));
  const auto expect_float64 = [&](const Params& p, const Batch& batch, const char* what) {
    const Pair m = pair_of(p);
    EXPECT_EQ(log_densities(m.mixed, batch), log_densities(m.exact, batch)) << what;
    std::vector<double> w(static_cast<size_t>(batch.n_rows()), 1.0);
    auto exact = m.exact.make_accumulator();
    auto mixed = m.mixed.make_accumulator();
    m.exact.accumulate(batch, w, exact);
    m.mixed.accumulate(batch, w, mixed);
    EXPECT_EQ(flat(mixed), flat(exact)) << what;
  };
  Params huge = random_params(8, 4, 8, 3, rng, 1.0, 0.5);
  huge.mean(3, 2) = 1e30;
  expect_float64(huge, random_variational_rows(30, 4, 8, 3, rng), "coordinates beyond float's range");
  expect_float64(random_params(8, 4, 8, 3, rng, 1.0, 1e-40), random_variational_rows(30, 4, 8, 3, rng), "sigma2 1e-40");
  Params far = random_params(8, 4, 8, 3, rng, 1e10, 1e-20);
  IdMatrix contexts(2, 4);
  contexts << 0, 1, 2, 3, 4, 5, 6, 7;
  IdVector queries(2), targets(2);
  queries << 7, 0;
  targets << 1, 2;
  expect_float64(far, VariationalEmbeddingAttentionEncoder{8, 4, 3}.encode(contexts, queries, targets),
                 "every float logit -inf");
}

/// A zero prior entry stays exactly zero in the counts; impossible rows raise before any statistic changes, as in
/// float64.
TEST(VariationalMixedTest, ExactZerosAndImpossibleRows) {
  Rng rng(testing::test_seed(405));
  Params p = random_params(8, 16, 16, 3, rng, 1.0, 0.5);
  p.position_prior[9] = 0.0;
  p.position_prior /= p.position_prior.sum();
  p.emission.row(2).setZero();
  p.emission(2, 0) = 1.0;  // symbol 2 never emits targets 1, 2
  const Model model(p, Precision::kMixed);
  IdMatrix contexts = IdMatrix::Constant(2, 16, 2);
  contexts(0, 0) = 1;
  IdVector queries(2), targets(2);
  queries << 5, 6;
  targets << 1, 2;
  const Batch batch = VariationalEmbeddingAttentionEncoder{8, 16, 3}.encode(contexts, queries, targets);
  const std::vector<double> log_p = log_densities(model, batch);
  EXPECT_TRUE(std::isfinite(log_p[0]));
  EXPECT_EQ(log_p[1], -INFINITY);
  auto acc = model.make_accumulator();
  const std::vector<double> before = flat(acc);
  testing::expect_impossible_rows(model, batch, {1.0, 1.0}, acc, {1});
  EXPECT_EQ(flat(acc), before);
  model.accumulate(batch, std::vector<double>{1.0, 0.0}, acc);
  EXPECT_EQ(acc.position_count()[9], 0.0);                                        // π_9 = 0
  for (Index i = 1; i < 16; ++i) EXPECT_EQ(acc.position_count()[i], 0.0) << i;  // B[2, 1] = 0 there
  EXPECT_DOUBLE_EQ(acc.position_count()[0], 1.0);
}

/// The fitted model (embeddings, their Adam state, emission, prior) is bitwise the same for 1, 2 and 3 threads.
TEST(VariationalMixedTest, ThreadCountDoesNotChangeABit) {
  Rng rng(testing::test_seed(406));
  const Batch batch = random_variational_rows(3000, 16, 40, 40, rng);
  VariationalEmbeddingAttentionEstimatorOptions options;
  options.precision = Precision::kMixed;
  options.seed = 5;
  const VariationalEmbeddingAttentionEstimator est(40, 16, 32, 40, options);
  const auto fits = testing::fits_for_thread_counts(batch, est, 4);
  for (const Model& fit : {fits[1], fits[2]}) {
    EXPECT_EQ(fit.precision(), Precision::kMixed);
    EXPECT_EQ(fit.mean(), fits[0].mean());
    EXPECT_EQ(fit.log_var(), fits[0].log_var());
    EXPECT_EQ(fit.optimizer_state(), fits[0].optimizer_state());
    EXPECT_EQ(fit.emission(), fits[0].emission());
    EXPECT_EQ(fit.position_prior(), fits[0].position_prior());
  }
}

/// EM in mixed precision follows float64's trajectory to float rounding and carries its precision: estimate() returns
/// mixed models and model.estimator() keeps mixed.
TEST(VariationalMixedTest, EmFollowsFloat64AndKeepsItsPrecision) {
  Rng rng(testing::test_seed(407));
  const Batch batch = random_variational_rows(2000, 8, 30, 30, rng);
  VariationalEmbeddingAttentionEstimatorOptions options;
  options.seed = 3;
  const VariationalEmbeddingAttentionEstimator exact_est(30, 8, 16, 30, options);
  options.precision = Precision::kMixed;
  const VariationalEmbeddingAttentionEstimator mixed_est(30, 8, 16, 30, options);
  const auto [exact, mixed] = testing::em_in_both_precisions(batch, exact_est, mixed_est, 15);
  ExpectAllClose(mixed.model.mean(), exact.model.mean(), 1e-4, 1e-5);
  ExpectAllClose(mixed.model.emission(), exact.model.emission(), 1e-4, 1e-7);
}

}  // namespace
}  // namespace attnmix
