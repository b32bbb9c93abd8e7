// SPDX-License-Identifier: Apache-2.0
// Diagonal Gaussian leaf (docs/mechanisms.md#building-blocks): validation, the closed-form log density, the floored
// moment M-step and the sampler. The shared contract rows run in contract_test.cpp.
#include "attnmix/stats/gaussian.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

DiagonalGaussian make_gaussian(Vector mu, Vector sigma2) {
  return DiagonalGaussian({std::move(mu), std::move(sigma2), "x"});
}

/// C-5 (docs/mechanisms.md#building-blocks): μ non-empty and finite; σ² of the same length, each finite and > 0.
TEST(DiagonalGaussianTest, ConstructorValidatesParameters) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NO_THROW(make_gaussian(Vector::Zero(2), Vector::Ones(2)));
  EXPECT_THROW(make_gaussian(Vector(0), Vector(0)), ValueError);
  EXPECT_THROW(make_gaussian(Vector::Zero(2), Vector::Ones(3)), ValueError);
  EXPECT_THROW(make_gaussian((Vector(2) << 0.0, nan).finished(), Vector::Ones(2)), ValueError);
  for (const double bad : {0.0, -1.0, nan, std::numeric_limits<double>::infinity()})
    EXPECT_THROW(make_gaussian(Vector::Zero(2), (Vector(2) << 1.0, bad).finished()), ValueError)
        << bad;
  DiagonalGaussianEstimatorOptions options;
  options.min_sigma2 = 0.0;
  EXPECT_THROW(DiagonalGaussianEstimator(2, options), ValueError);
  EXPECT_THROW(DiagonalGaussianEstimator(0), ValueError);
}

/// C-5: observations must have D columns and be finite; a model rejects a batch of another width.
TEST(DiagonalGaussianTest, EncoderValidatesRows) {
  const DiagonalGaussianEncoder encoder{2};
  EXPECT_EQ(encoder.encode(Matrix::Zero(4, 2)).n_rows(), 4);
  EXPECT_THROW((void)encoder.encode(Matrix::Zero(4, 3)), ValueError);
  Matrix bad = Matrix::Zero(2, 2);
  bad(1, 0) = std::numeric_limits<double>::infinity();
  EXPECT_THROW((void)encoder.encode(bad), ValueError);
  std::vector<double> out(3);
  EXPECT_THROW(make_gaussian(Vector::Zero(2), Vector::Ones(2))
                   .log_density(DiagonalGaussianEncoder{}.encode(Matrix::Zero(3, 4)), out),
               ValueError);
}

/// log p(x) = −½ Σ_d log(2π σ²_d) − ½ Σ_d (x_d − μ_d)² / σ²_d.
TEST(DiagonalGaussianTest, LogDensityMatchesClosedForm) {
  const DiagonalGaussian model =
      make_gaussian((Vector(2) << 1.0, -2.0).finished(), (Vector(2) << 0.5, 4.0).finished());
  const DiagonalGaussianBatch batch =
      model.encoder().encode((Matrix(2, 2) << 1.0, -2.0, 0.3, 1.7).finished());
  std::vector<double> out(2);
  model.log_density(batch, out);
  const double norm =
      -0.5 * std::log(2.0 * std::numbers::pi * 0.5) - 0.5 * std::log(2.0 * std::numbers::pi * 4.0);
  const double quad = (0.3 - 1.0) * (0.3 - 1.0) / 0.5 + (1.7 + 2.0) * (1.7 + 2.0) / 4.0;
  testing::ExpectAllClose(out, std::vector<double>{norm, norm - 0.5 * quad}, 1e-14, 0.0);
  EXPECT_EQ(AnyDistribution(model).family(), "diagonal_gaussian");
}

/// M-step: weighted moments, σ² floored at min_sigma2; count = 0 gives μ = 0, σ² = 1; nobs = count.
TEST(DiagonalGaussianTest, EstimateIsFlooredWeightedMoments) {
  const DiagonalGaussian model = make_gaussian(Vector::Zero(2), Vector::Ones(2));
  const DiagonalGaussianBatch batch =
      model.encoder().encode((Matrix(3, 2) << 1.0, 5.0, 3.0, 5.0, 2.0, 5.0).finished());
  const std::vector<double> w{1.0, 1.0, 2.0};
  DiagonalGaussianAccumulator acc = model.make_accumulator();
  model.accumulate(batch, w, acc);
  EXPECT_EQ(acc.count(), 4.0);
  const DiagonalGaussian fitted = DiagonalGaussianEstimator(2).estimate(4.0, acc);
  testing::ExpectAllClose(Matrix(fitted.params().mu), Matrix((Vector(2) << 2.0, 5.0).finished()),
                          1e-15, 0.0);
  // Dimension 0: E[x²] − μ² = (1 + 9 + 8)/4 − 4 = 0.5; dimension 1 is constant, so the floor
  // applies.
  testing::ExpectAllClose(Matrix(fitted.params().sigma2),
                          Matrix((Vector(2) << 0.5, 1e-6).finished()), 1e-14, 0.0);
  DiagonalGaussianEstimatorOptions options;
  options.min_sigma2 = 0.75;
  EXPECT_EQ(DiagonalGaussianEstimator(2, options).estimate(std::nullopt, acc).params().sigma2,
            Vector::Constant(2, 0.75));
  const DiagonalGaussian empty =
      DiagonalGaussianEstimator(2).estimate(0.0, DiagonalGaussianAccumulator(2));
  EXPECT_EQ(empty.params().mu, Vector::Zero(2));
  EXPECT_EQ(empty.params().sigma2, Vector::Ones(2));
  EXPECT_THROW((void)DiagonalGaussianEstimator(2).estimate(3.0, acc), ValueError);
  EXPECT_THROW((void)DiagonalGaussianEstimator(3).estimate(std::nullopt, acc), ValueError);
}

/// seq_initialize ≡ the E-step with the given weights, and it draws nothing from the rng.
TEST(DiagonalGaussianTest, InitializeIsWeightedSumsWithoutRandomness) {
  const DiagonalGaussian model = make_gaussian(Vector::Zero(1), Vector::Ones(1));
  const DiagonalGaussianBatch batch =
      model.encoder().encode((Matrix(3, 1) << 1.0, -2.0, 4.0).finished());
  const std::vector<double> w{0.5, 0.0, 1.5};
  Rng rng(testing::test_seed(21));
  Rng untouched = rng;
  DiagonalGaussianAccumulator init = model.make_accumulator();
  init.initialize(batch, w, rng);
  EXPECT_EQ(rng.next_u64(), untouched.next_u64());
  DiagonalGaussianAccumulator estep = model.make_accumulator();
  model.accumulate(batch, w, estep);
  EXPECT_TRUE(init == estep);
}

/// Sampler: 20000 draws have per-dimension mean and variance within 5 standard errors.
TEST(DiagonalGaussianTest, SamplerMatchesMoments) {
  const uint64_t seed = testing::test_seed(22);
  const DiagonalGaussian model =
      make_gaussian((Vector(2) << 1.5, -3.0).finished(), (Vector(2) << 0.25, 4.0).finished());
  const Index m = 20000;
  const Matrix x = model.sampler(seed).sample(m).values();
  for (Index d = 0; d < 2; ++d) {
    const double mean = x.col(d).mean();
    const double var = (x.col(d).array() - mean).square().sum() / static_cast<double>(m - 1);
    const double s2 = model.params().sigma2[d];
    EXPECT_NEAR(mean, model.params().mu[d], 5.0 * std::sqrt(s2 / static_cast<double>(m)))
        << "seed " << seed;
    EXPECT_NEAR(var, s2, 5.0 * s2 * std::sqrt(2.0 / static_cast<double>(m))) << "seed " << seed;
  }
  DiagonalGaussianSampler one_by_one(model, seed);
  for (Index n = 0; n < 10; ++n) {
    const std::vector<double> row = one_by_one.sample();
    EXPECT_EQ(row[0], x(n, 0));
    EXPECT_EQ(row[1], x(n, 1));
  }
}

}  // namespace
}  // namespace attnmix
