// SPDX-License-Identifier: Apache-2.0
// attnmix::Rng: determinism, support and goodness of fit of the in-house distributions (docs/mechanisms.md#training).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <utility>
#include <vector>

#include "attnmix/core/rng.hpp"

namespace attnmix {
namespace {

constexpr int kDraws = 200000;

TEST(RngTest, SameSeedSameStreamAndDerivedSeedsDiffer) {
  Rng a(42), b(42);
  for (int k = 0; k < 100; ++k) EXPECT_EQ(a.normal(), b.normal());
  EXPECT_NE(derive_seed(1, SeedPurpose::kInit, 0), derive_seed(1, SeedPurpose::kMcNoise, 0));
  EXPECT_NE(derive_seed(1, SeedPurpose::kInit, 0), derive_seed(1, SeedPurpose::kInit, 1));
  EXPECT_EQ(derive_seed(9, SeedPurpose::kSampler, 3), derive_seed(9, SeedPurpose::kSampler, 3));
}

TEST(RngTest, UniformAndNormalMoments) {
  Rng rng(1);
  double u_mean = 0, n_mean = 0, n_var = 0, n_kurt = 0;
  for (int k = 0; k < kDraws; ++k) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    u_mean += u / kDraws;
    const double z = rng.normal();
    n_mean += z / kDraws;
    n_var += z * z / kDraws;
    n_kurt += z * z * z * z / kDraws;
  }
  const double se = 1.0 / std::sqrt(kDraws);
  EXPECT_NEAR(u_mean, 0.5, 5 * se * std::sqrt(1.0 / 12));
  EXPECT_NEAR(n_mean, 0.0, 5 * se);
  EXPECT_NEAR(n_var, 1.0, 5 * se * std::sqrt(2.0));
  EXPECT_NEAR(n_kurt, 3.0, 5 * se * std::sqrt(96.0));
}

TEST(RngTest, ExponentialGumbelAndBernoulliMeans) {
  Rng rng(2);
  double e = 0, g = 0, b = 0;
  for (int k = 0; k < kDraws; ++k) {
    e += rng.exponential() / kDraws;
    g += rng.gumbel() / kDraws;
    b += (rng.bernoulli(0.3) ? 1.0 : 0.0) / kDraws;
  }
  const double se = 1.0 / std::sqrt(kDraws);
  EXPECT_NEAR(e, 1.0, 5 * se);
  EXPECT_NEAR(g, 0.5772156649015329, 5 * se * M_PI / std::sqrt(6.0));
  EXPECT_NEAR(b, 0.3, 5 * se * std::sqrt(0.21));
}

TEST(RngTest, CategoricalChiSquare) {
  Rng rng(3);
  const std::vector<double> p{0.1, 0.0, 0.4, 0.2, 0.3};
  std::vector<double> counts(p.size(), 0.0);
  for (int k = 0; k < kDraws; ++k) counts[static_cast<size_t>(rng.categorical(p))] += 1;
  EXPECT_EQ(counts[1], 0.0);  // zero-probability category never drawn
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] > 0) chi2 += std::pow(counts[i] - kDraws * p[i], 2) / (kDraws * p[i]);
  EXPECT_LT(chi2, 18.47);  // χ²(3) 0.9995 quantile
}

TEST(RngTest, UniformIntIsUnbiasedAndDirichletOnSimplex) {
  Rng rng(4);
  std::vector<double> counts(7, 0.0);
  for (int k = 0; k < kDraws; ++k) counts[rng.uniform_int(7)] += 1;
  double chi2 = 0;
  for (double c : counts) chi2 += std::pow(c - kDraws / 7.0, 2) / (kDraws / 7.0);
  EXPECT_LT(chi2, 24.1);  // χ²(6) 0.9995 quantile
  std::vector<double> d(5);
  double first = 0;
  for (int k = 0; k < 20000; ++k) {
    rng.dirichlet_ones(d);
    double sum = 0;
    for (double v : d) {
      ASSERT_GT(v, 0.0);
      sum += v;
    }
    EXPECT_NEAR(sum, 1.0, 1e-14);
    first += d[0] / 20000;
  }
  EXPECT_NEAR(first, 0.2, 5 * std::sqrt(0.2 * 0.8 / 6 / 20000));  // Beta(1, 4) variance 4/150
}

TEST(RngTest, DiscardDirichletOnesAdvancesLikeTheDraws) {
  for (const auto& [count, dim] : {std::pair<int64_t, int64_t>{0, 4}, {1, 1}, {3, 5}, {1000, 16}, {7, 0}}) {
    Rng drawn(11);
    Rng discarded(11);
    std::vector<double> d(static_cast<size_t>(dim));
    for (int64_t k = 0; k < count; ++k) drawn.dirichlet_ones(d);
    discarded.discard_dirichlet_ones(count, dim);
    EXPECT_EQ(discarded.next_u64(), drawn.next_u64()) << count << " x " << dim;
  }
}

TEST(RngTest, SampleWithoutReplacementIsDistinctAndUniform) {
  Rng rng(5);
  std::vector<double> first(10, 0.0);
  for (int k = 0; k < 50000; ++k) {
    const auto s = rng.sample_without_replacement(10, 4);
    ASSERT_EQ(std::set<int64_t>(s.begin(), s.end()).size(), 4u);
    first[static_cast<size_t>(s[0])] += 1;
  }
  double chi2 = 0;
  for (double c : first) chi2 += std::pow(c - 5000.0, 2) / 5000.0;
  EXPECT_LT(chi2, 29.67);  // χ²(9) 0.9995 quantile
}

}  // namespace
}  // namespace attnmix
