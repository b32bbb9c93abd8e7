// SPDX-License-Identifier: Apache-2.0
// Categorical leaf (docs/mechanisms.md#building-blocks): encoder and constructor validation, exact log density, the
// smoothed-count M-step and the sampler. The shared contract rows run in contract_test.cpp.
#include "attnmix/stats/categorical.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

Categorical make_categorical(std::vector<double> p) {
  return Categorical({Eigen::Map<const Vector>(p.data(), static_cast<Index>(p.size())), "label"});
}

template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

/// C-5 (docs/mechanisms.md#building-blocks): ids must be exact, ≥ 0 and < K ("out-of-range ID"); integral reals are
/// accepted.
TEST(CategoricalTest, EncoderValidatesExactIds) {
  const CategoricalEncoder encoder{3};
  EXPECT_EQ(encoder.encode((IdVector(3) << 0, 2, 1).finished()).n_rows(), 3);
  EXPECT_NE(error_message([&] {
              (void)encoder.encode((IdVector(2) << 0, 3).finished());
            }).find("out-of-range ID"),
            std::string::npos);
  EXPECT_THROW((void)encoder.encode((IdVector(1) << -1).finished()), ValueError);
  const std::vector<double> integral{2.0, 0.0};
  EXPECT_EQ(encoder.encode(std::span<const double>(integral)).id(0), 2);
  for (const double bad : {1.5, std::numeric_limits<double>::quiet_NaN(), 3.0, -1.0}) {
    const std::vector<double> ids{bad};
    EXPECT_THROW((void)encoder.encode(std::span<const double>(ids)), ValueError) << bad;
  }
  EXPECT_THROW((void)CategoricalEncoder{0}.encode(IdVector(0)), ValueError);
  // Without a declared K any non-negative id is accepted; the model then rejects ids ≥ K.
  const CategoricalBatch wide = CategoricalEncoder{}.encode((IdVector(2) << 0, 7).finished());
  std::vector<double> out(2);
  EXPECT_THROW(make_categorical({0.5, 0.5}).log_density(wide, out), ValueError);
}

/// C-5: the constructor applies the simplex check (non-empty, finite, ≥ 0, |Σ − 1| ≤ 1e-12).
TEST(CategoricalTest, ConstructorRequiresSimplex) {
  EXPECT_NO_THROW(make_categorical({0.25, 0.75}));
  EXPECT_NO_THROW(make_categorical({1.0, 0.0}));
  EXPECT_THROW(make_categorical({}), ValueError);
  EXPECT_THROW(make_categorical({0.5, 0.6}), ValueError);
  EXPECT_THROW(make_categorical({1.5, -0.5}), ValueError);
  EXPECT_THROW(make_categorical({std::numeric_limits<double>::quiet_NaN(), 1.0}), ValueError);
  EXPECT_THROW(make_categorical({0.5, 0.5 + 1e-11}), ValueError);
}

/// log p(x) = log p[x] exactly, −∞ for a zero-probability id.
TEST(CategoricalTest, LogDensityIsExactLog) {
  const Categorical model = make_categorical({0.2, 0.0, 0.8});
  const CategoricalBatch batch = model.encoder().encode((IdVector(3) << 0, 1, 2).finished());
  std::vector<double> out(3);
  model.log_density(batch, out);
  EXPECT_EQ(out[0], std::log(0.2));
  EXPECT_EQ(out[1], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(out[2], std::log(0.8));
  EXPECT_EQ(AnyDistribution(model).family(), "categorical");
}

/// M-step: p = (counts + ε) / Σ (counts + ε); a zero total gives the uniform distribution; nobs = Σ
/// counts.
TEST(CategoricalTest, EstimateNormalisesSmoothedCounts) {
  CategoricalAccumulator acc(3);
  acc.counts() << 3.0, 0.0, 1.0;
  EXPECT_EQ(CategoricalEstimator(3).estimate(std::nullopt, acc).params().p,
            (Vector(3) << 0.75, 0.0, 0.25).finished());
  CategoricalEstimatorOptions smooth;
  smooth.smoothing = 0.5;
  smooth.name = "smoothed";
  const Categorical smoothed = CategoricalEstimator(3, smooth).estimate(4.0, acc);
  testing::ExpectAllClose(Matrix(smoothed.params().p),
                          Matrix((Vector(3) << 3.5, 0.5, 1.5).finished() / 5.5), 1e-15, 0.0);
  EXPECT_EQ(smoothed.params().name, "smoothed");
  EXPECT_EQ(CategoricalEstimator(4).estimate(0.0, CategoricalAccumulator(4)).params().p,
            Vector::Constant(4, 0.25));
  EXPECT_THROW((void)CategoricalEstimator(3).estimate(std::nullopt, CategoricalAccumulator(4)),
               ValueError);
  EXPECT_NE(
      error_message([&] { (void)CategoricalEstimator(3).estimate(5.0, acc); }).find("must equal"),
      std::string::npos);
  smooth.smoothing = -1.0;
  EXPECT_THROW(CategoricalEstimator(3, smooth), ValueError);
  smooth.smoothing = std::numeric_limits<double>::infinity();
  EXPECT_THROW(CategoricalEstimator(3, smooth), ValueError);
  EXPECT_THROW(CategoricalEstimator(0), ValueError);
}

/// seq_initialize ≡ the E-step with the given weights, and it draws nothing from the rng.
TEST(CategoricalTest, InitializeIsWeightedCountsWithoutRandomness) {
  const Categorical model = make_categorical({0.5, 0.25, 0.25});
  const CategoricalBatch batch = model.encoder().encode((IdVector(4) << 0, 2, 2, 1).finished());
  const std::vector<double> w{1.0, 0.5, 2.0, 0.0};
  Rng rng(testing::test_seed(11));
  Rng untouched = rng;
  CategoricalAccumulator init = model.make_accumulator();
  init.initialize(batch, w, rng);
  EXPECT_EQ(rng.next_u64(), untouched.next_u64());
  CategoricalAccumulator estep = model.make_accumulator();
  model.accumulate(batch, w, estep);
  EXPECT_TRUE(init == estep);
  EXPECT_EQ(init.counts(), (Vector(3) << 1.0, 0.0, 2.5).finished());
}

/// Sampler goodness of fit: 20000 draws, every frequency within 5 standard errors of p.
TEST(CategoricalTest, SamplerMatchesProbabilities) {
  const uint64_t seed = testing::test_seed(12);
  const Categorical model = make_categorical({0.1, 0.0, 0.6, 0.3});
  const Index m = 20000;
  const CategoricalBatch batch = model.sampler(seed).sample(m);
  std::vector<double> freq(4, 0.0);
  for (Index n = 0; n < m; ++n)
    freq[static_cast<size_t>(batch.id(n))] += 1.0 / static_cast<double>(m);
  for (size_t k = 0; k < 4; ++k) {
    const double p = model.params().p[static_cast<Index>(k)];
    EXPECT_NEAR(freq[k], p, 5.0 * std::sqrt(p * (1.0 - p) / static_cast<double>(m)) + 1e-12)
        << "id " << k << " seed " << seed;
  }
  CategoricalSampler one_by_one(model, seed);
  for (Index n = 0; n < 50; ++n) EXPECT_EQ(one_by_one.sample(), batch.id(n));
}

}  // namespace
}  // namespace attnmix
