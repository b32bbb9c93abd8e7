// SPDX-License-Identifier: Apache-2.0
// Responsibility attention in mixed precision (docs/mixed_precision.md) against the float64 kernels, whose own
// oracles are in responsibility_test.cpp: log p and the E-step statistics within float rounding of them, the same
// exact zeros and impossible rows, bitwise thread-count invariance, and the precision carried through EM.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/inference/optimize.hpp"
#include "testing/all_close.hpp"
#include "testing/mixed_precision_checks.hpp"
#include "testing/random_responsibility.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;

struct Pair {
  ResponsibilityAttention exact;
  ResponsibilityAttention mixed;
};

Pair random_pair(Index S, Index N, Index D, Index T, Rng& rng, double sigma2) {
  const ResponsibilityAttentionParams p = testing::random_responsibility_params(S, N, D, T, rng, sigma2);
  return {ResponsibilityAttention(p), ResponsibilityAttention(p, Precision::kMixed)};
}

/// log p within 2e−5 absolute of float64 (the ℓ_i of these rows are O(10), float keeps ~7 digits), for N and D on
/// both sides of the 16-lane blocks and the compile-time specialisations.
TEST(ResponsibilityMixedTest, LogDensityIsWithinFloatRoundingOfFloat64) {
  Rng rng(testing::test_seed(301));
  for (const Index N : {1, 3, 15, 16, 17, 40})
    for (const Index D : {1, 7, 16, 24, 32, 48, 64, 65, 100}) {
      const Pair m = random_pair(11, N, D, 5, rng, 0.3 * static_cast<double>(D));
      const auto batch = m.exact.sampler(rng.next_u64()).sample(50);
      std::vector<double> exact(50), mixed(50);
      m.exact.log_density(batch, exact);
      m.mixed.log_density(batch, mixed);
      for (Index n = 0; n < 50; ++n)
        ASSERT_NEAR(mixed[n], exact[n], 2e-5 * (1.0 + std::abs(exact[n]))) << "N " << N << " D " << D << " row " << n;
    }
}

/// The E-step's statistics within float rounding of float64, and its log p bitwise log_density's (one pass 1).
TEST(ResponsibilityMixedTest, StatisticsAreWithinFloatRoundingOfFloat64) {
  Rng rng(testing::test_seed(302));
  for (const Index D : {8, 32, 37}) {
    const Pair m = random_pair(20, 16, D, 9, rng, 0.5 * static_cast<double>(D));
    const auto batch = m.exact.sampler(rng.next_u64()).sample(400);
    std::vector<double> w(400);
    for (double& x : w) x = rng.uniform();
    auto exact = m.exact.make_accumulator();
    auto mixed = m.mixed.make_accumulator();
    std::vector<double> log_p(400), density(400);
    m.exact.accumulate(batch, w, exact);
    m.mixed.accumulate(batch, w, mixed, log_p);
    m.mixed.log_density(batch, density);
    EXPECT_EQ(log_p, density);
    const Index size = exact.flat_size();
    const Matrix e = ConstMatrixMap(exact.flat().data(), 1, size);
    ExpectAllClose(Matrix(ConstMatrixMap(mixed.flat().data(), 1, size)), e, 1e-4, 1e-5 * e.cwiseAbs().maxCoeff());
    EXPECT_NEAR(mixed.total_mass(), exact.total_mass(), 1e-12 * exact.total_mass());  // r sums to 1 in double
  }
}

/// Statistics, log p and the fitted model are bitwise the same for 1, 2 and 3 threads.
TEST(ResponsibilityMixedTest, ThreadCountDoesNotChangeABit) {
  Rng rng(testing::test_seed(303));
  const Pair m = random_pair(32, 16, 32, 32, rng, 8.0);
  const auto batch = m.exact.sampler(5).sample(3000);
  ResponsibilityAttentionEstimatorOptions options;
  options.estimate_sigma2 = true;
  options.precision = Precision::kMixed;
  const ResponsibilityAttentionEstimator est(32, 16, 32, 32, options);
  const auto fits = testing::fits_for_thread_counts(batch, est, 4);
  for (const auto& fit : {fits[1], fits[2]}) {
    EXPECT_EQ(fit.precision(), Precision::kMixed);
    EXPECT_EQ(fit.params().key_means, fits[0].params().key_means);
    EXPECT_EQ(fit.params().emission, fits[0].params().emission);
    EXPECT_EQ(fit.params().position_prior, fits[0].params().position_prior);
    EXPECT_EQ(fit.params().sigma2, fits[0].params().sigma2);
  }
}

/// EM in mixed precision fits the same model as float64 to float rounding, and carries its precision: estimate()
/// returns mixed models, model.estimator() keeps mixed.
TEST(ResponsibilityMixedTest, EmFitsTheFloat64ModelAndKeepsItsPrecision) {
  Rng rng(testing::test_seed(304));
  const Pair m = random_pair(16, 8, 16, 16, rng, 2.0);
  const auto batch = m.exact.sampler(9).sample(2000);
  ResponsibilityAttentionEstimatorOptions options;
  options.sigma2 = 2.0;
  const ResponsibilityAttentionEstimator exact_est(16, 8, 16, 16, options);
  options.precision = Precision::kMixed;
  const ResponsibilityAttentionEstimator mixed_est(16, 8, 16, 16, options);
  const auto [exact, mixed] = testing::em_in_both_precisions(batch, exact_est, mixed_est, 20);
  ExpectAllClose(mixed.model.params().key_means, exact.model.params().key_means, 1e-4, 1e-4);
  ExpectAllClose(mixed.model.params().emission, exact.model.params().emission, 1e-4, 1e-6);
}

/// A zero prior entry stays exactly zero, impossible rows are reported like float64's and leave the statistics
/// untouched.
TEST(ResponsibilityMixedTest, ExactZerosAndImpossibleRows) {
  Rng rng(testing::test_seed(305));
  ResponsibilityAttentionParams p = testing::random_responsibility_params(8, 16, 4, 3, rng, 1.0);
  p.position_prior[9] = 0.0;
  p.position_prior /= p.position_prior.sum();
  p.emission.row(2).setZero();
  p.emission(2, 0) = 1.0;  // symbol 2 never emits targets 1, 2
  const ResponsibilityAttention model(p, Precision::kMixed);
  IdMatrix ctx = IdMatrix::Constant(2, 16, 2);
  ctx(0, 0) = 1;
  Matrix y = Matrix::Zero(2, 4);
  IdVector t(2);
  t << 1, 2;
  const auto batch = model.encoder().encode(ctx, y, t);  // row 1: every position is symbol 2, target 2 impossible
  std::vector<double> log_p(2);
  model.log_density(batch, log_p);
  EXPECT_TRUE(std::isfinite(log_p[0]));
  EXPECT_EQ(log_p[1], -std::numeric_limits<double>::infinity());
  auto acc = model.make_accumulator();
  testing::expect_impossible_rows(model, batch, {1.0, 1.0}, acc, {1});
  EXPECT_EQ(acc.total_mass(), 0.0);
  model.accumulate(batch, std::vector<double>{1.0, 0.0}, acc);
  EXPECT_EQ(acc.position_count()[9], 0.0);  // π_9 = 0
  for (Index i = 1; i < 16; ++i) EXPECT_EQ(acc.position_count()[i], 0.0) << i;  // B[2, 1] = 0 there
  EXPECT_DOUBLE_EQ(acc.position_count()[0], 1.0);
}

/// A query whose squared distances overflow float is an error naming the fix, not a silent −∞.
TEST(ResponsibilityMixedTest, FloatOverflowIsAClearError) {
  Rng rng(testing::test_seed(306));
  const Pair m = random_pair(4, 3, 2, 2, rng, 1.0);
  IdMatrix ctx(1, 3);
  ctx << 0, 1, 2;
  Matrix y(1, 2);
  y << 1e30, 0.0;
  IdVector t(1);
  t << 0;
  const auto batch = m.exact.encoder().encode(ctx, y, t);
  std::vector<double> log_p(1);
  m.exact.log_density(batch, log_p);  // float64: finite distances
  try {
    m.mixed.log_density(batch, log_p);
    FAIL() << "no ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("overflows float"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float64"), std::string::npos) << e.what();
  }
}

TEST(ResponsibilityMixedTest, PrecisionNamesRoundTrip) {
  EXPECT_EQ(parse_precision("mixed", "w"), Precision::kMixed);
  EXPECT_EQ(parse_precision("float64", "w"), Precision::kFloat64);
  EXPECT_EQ(precision_name(Precision::kMixed), "mixed");
  EXPECT_THROW((void)parse_precision("float32", "w"), ValueError);
}

}  // namespace
}  // namespace attnmix
