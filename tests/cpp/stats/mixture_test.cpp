// SPDX-License-Identifier: Apache-2.0
// The finite mixture (docs/mechanisms.md#building-blocks) against direct formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/stats/gaussian.hpp"
#include "attnmix/stats/log_math.hpp"
#include "attnmix/stats/mixture.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

ResponsibilityAttention component(double shift, double sigma2) {
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Constant(3, 2, shift);
  p.key_means(1, 0) = -shift;
  p.emission.resize(3, 2);
  p.emission << 0.3, 0.7, 0.6, 0.4, 1.0, 0.0;
  p.position_prior = Vector::Constant(2, 0.5);
  p.sigma2 = sigma2;
  return ResponsibilityAttention(p);
}

TEST(MixtureTest, LogDensityAndStatisticsFollowResponsibilities) {
  const ResponsibilityAttention a = component(1.0, 0.5), b = component(-0.5, 2.0);
  Vector w(2);
  w << 0.3, 0.7;
  const Mixture mix({AnyDistribution(a), AnyDistribution(b)}, w);
  const auto batch = a.sampler(3).sample(40);
  std::vector<double> la(40), lb(40), lm(40);
  a.log_density(batch, la);
  b.log_density(batch, lb);
  mix.log_density(AnyBatch(batch), lm);
  std::vector<double> weights(40);
  for (Index n = 0; n < 40; ++n) {
    const double direct = std::log(0.3 * std::exp(la[n]) + 0.7 * std::exp(lb[n]));
    EXPECT_NEAR(lm[n], direct, 1e-12 * std::fabs(direct));
    weights[n] = 0.5 + 0.01 * static_cast<double>(n);
  }
  auto acc = mix.make_accumulator();
  mix.accumulate(AnyBatch(batch), weights, acc);
  // Component 0 must equal RA statistics with weights w_n ρ_n0.
  auto expected = a.make_accumulator();
  std::vector<double> w0(40);
  double count0 = 0.0;
  for (Index n = 0; n < 40; ++n) {
    w0[n] = weights[n] * 0.3 * std::exp(la[n] - lm[n]);
    count0 += w0[n];
  }
  a.accumulate(batch, w0, expected);
  const auto& got = acc.components()[0].get<ResponsibilityAttentionAccumulator>("test");
  testing::ExpectAllClose(got.flat(), expected.flat(), 1e-12, 1e-14);
  EXPECT_NEAR(acc.comp_count()[0], count0, 1e-12);
  EXPECT_NEAR(acc.comp_count().sum(), std::accumulate(weights.begin(), weights.end(), 0.0), 1e-12);
}

TEST(MixtureTest, RowImpossibleUnderEveryComponentRaisesAtomically) {
  const ResponsibilityAttention a = component(1.0, 0.5);
  const Mixture mix({AnyDistribution(a), AnyDistribution(a)}, Vector::Constant(2, 0.5));
  IdMatrix ctx(2, 2);
  ctx << 2, 2, 0, 1;
  IdVector t(2);
  t << 1, 1;  // symbol 2 never emits target 1
  const auto batch = a.encoder().encode(ctx, Matrix::Zero(2, 2), t);
  auto acc = mix.make_accumulator();
  const auto before = acc.value();
  try {
    mix.accumulate(AnyBatch(batch), std::vector<double>{1.0, 1.0}, acc);
    FAIL();
  } catch (const ImpossibleEvidenceError& e) {
    EXPECT_EQ(e.rows(), std::vector<int64_t>{0});
  }
  EXPECT_TRUE(acc == before);
}

TEST(MixtureTest, EstimateNormalisesCountsAndChecksNobs) {
  const ResponsibilityAttention a = component(1.0, 0.5);
  const Mixture mix({AnyDistribution(a), AnyDistribution(a)}, Vector::Constant(2, 0.5));
  auto acc = mix.make_accumulator();
  mix.accumulate(AnyBatch(a.sampler(1).sample(30)), std::vector<double>(30, 1.0), acc);
  const MixtureEstimator est = mix.estimator();
  const Mixture fit = est.estimate(std::nullopt, acc);
  EXPECT_NEAR(fit.weights()[0], acc.comp_count()[0] / 30.0, 1e-12);
  EXPECT_THROW((void)est.estimate(31.0, acc), ValueError);
  EXPECT_NO_THROW((void)est.estimate(30.0, acc));
  const Mixture empty = est.estimate(std::nullopt, mix.make_accumulator());
  EXPECT_EQ(empty.weights(), Vector::Constant(2, 0.5));
  EXPECT_THROW(Mixture({AnyDistribution(a)}, Vector::Constant(2, 0.5)), ValueError);
}

TEST(MixtureTest, PackConcatenatesChildrenAndUnpackValidatesFirst) {
  const ResponsibilityAttention a = component(1.0, 0.5);
  const Mixture mix({AnyDistribution(a), AnyDistribution(a)}, Vector::Constant(2, 0.5));
  auto acc = mix.make_accumulator();
  mix.accumulate(AnyBatch(a.sampler(1).sample(30)), std::vector<double>(30, 1.0), acc);
  std::vector<double> buf(static_cast<size_t>(acc.flat_size()));
  acc.pack(buf);
  EXPECT_EQ(acc.flat_size(), 2 + 2 * a.make_accumulator().flat_size());
  auto copy = mix.make_accumulator();
  copy.unpack(buf);
  EXPECT_TRUE(copy == acc);
  buf.back() = -1.0;  // a negative count in the last child
  const auto before = copy.value();
  EXPECT_THROW(copy.unpack(buf), ValueError);
  EXPECT_TRUE(copy == before);
}

}  // namespace
}  // namespace attnmix

namespace attnmix {
namespace {

/// A row impossible under only one component gives that component exactly zero weight
/// (docs/mechanisms.md#building-blocks): the E-step succeeds and the impossible component receives no mass from the
/// row.
TEST(MixtureTest, RowImpossibleUnderOneComponentGivesItZeroWeight) {
  const ResponsibilityAttention a = component(1.0, 0.5);  // symbol 2 never emits target 1
  ResponsibilityAttentionParams q = a.params();
  q.emission.row(2) << 0.5, 0.5;
  const ResponsibilityAttention b(q);
  // Eight components (a full SIMD packet): seven impossible for the row, the last possible.
  std::vector<AnyDistribution> components(7, AnyDistribution(a));
  components.emplace_back(b);
  const Mixture mix(components, Vector::Constant(8, 0.125));
  IdMatrix ctx(1, 2);
  ctx << 2, 2;
  IdVector t(1);
  t << 1;
  const AnyBatch batch(a.encoder().encode(ctx, Matrix::Zero(1, 2), t));
  const Matrix rho = mix.responsibilities(batch);
  for (Index k = 0; k < 7; ++k) EXPECT_EQ(rho(0, k), 0.0) << "component " << k;
  EXPECT_EQ(rho(0, 7), 1.0);
  auto acc = mix.make_accumulator();
  mix.accumulate(batch, std::vector<double>{1.0}, acc);
  for (Index k = 0; k < 7; ++k) EXPECT_EQ(acc.comp_count()[k], 0.0) << "component " << k;
  EXPECT_EQ(acc.comp_count()[7], 1.0);
}

}  // namespace
}  // namespace attnmix

namespace attnmix {
namespace {

/// Keyed components can be fitted from scratch: initialisation passes no per-component nobs to a tied component
/// (its statistics are the pool's), and the tied components end with identical parameters.
TEST(MixtureTest, KeyedComponentsFitFromScratch) {
  const ResponsibilityAttention a = component(1.0, 0.5);
  ResponsibilityAttentionEstimatorOptions options;
  options.keys = "shared";
  const AnyEstimator tied(ResponsibilityAttentionEstimator(3, 2, 2, 2, options));
  OptimizeOptions opt;
  opt.max_its = 3;
  const auto fit = optimize(AnyBatch(a.sampler(2).sample(200)), MixtureEstimator({tied, tied}), opt);
  const auto* first = fit.model.components()[0].get_if<ResponsibilityAttention>();
  const auto* second = fit.model.components()[1].get_if<ResponsibilityAttention>();
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->params().key_means, second->params().key_means);
  EXPECT_EQ(first->params().emission, second->params().emission);
}

}  // namespace
}  // namespace attnmix

namespace attnmix {
namespace {

/// EmStepper reuses its weights and statistics across steps: three steps through one stepper equal three fresh
/// em_step calls bit for bit, for a keyed (tied) mixture whose statistics key_replace overwrites every step.
TEST(MixtureTest, ReusedEmStepperEqualsFreshEmSteps) {
  const ResponsibilityAttention a = component(1.0, 0.5);
  ResponsibilityAttentionEstimatorOptions options;
  options.keys = "shared";
  const AnyEstimator tied(ResponsibilityAttentionEstimator(3, 2, 2, 2, options));
  const AnyEstimator free_component(ResponsibilityAttentionEstimator(3, 2, 2, 2));
  const MixtureEstimator estimator({tied, tied, free_component});
  const AnyBatch batch(a.sampler(3).sample(300));
  OptimizeOptions opt;
  Mixture fresh = initialize_model(batch, estimator, opt);
  Mixture reused = fresh;
  EmStepper stepper(estimator, batch.n_rows());
  std::vector<double> log_p_fresh(300), log_p_reused(300);
  for (int step = 0; step < 3; ++step) {
    fresh = em_step(fresh, batch, estimator, log_p_fresh, ParallelOptions{2, 64});
    reused = stepper.step(reused, batch, log_p_reused, ParallelOptions{2, 64});
    EXPECT_EQ(log_p_fresh, log_p_reused) << "step " << step;
    EXPECT_EQ(fresh.weights(), reused.weights()) << "step " << step;
    for (size_t k = 0; k < 3; ++k) {
      const auto* f = fresh.components()[k].get_if<ResponsibilityAttention>();
      const auto* r = reused.components()[k].get_if<ResponsibilityAttention>();
      ASSERT_TRUE(f && r);
      EXPECT_EQ(f->params().key_means, r->params().key_means) << "step " << step << ", component " << k;
      EXPECT_EQ(f->params().emission, r->params().emission) << "step " << step << ", component " << k;
    }
  }
}

// Two narrow Gaussians far apart: which component drew a row is read off its sign, so the share of each component is
// a binomial proportion to compare with its weight.
DiagonalGaussian point(double mu) {
  return DiagonalGaussian({Vector::Constant(1, mu), Vector::Constant(1, 0.01), ""});
}

TEST(MixtureTest, SamplerDrawsComponentsInProportionToTheirWeights) {
  Vector w(2);
  w << 0.3, 0.7;
  const AnyDistribution mix(Mixture({AnyDistribution(point(-5)), AnyDistribution(point(5))}, w));
  const FamilySpec& family = mixture_family();
  ASSERT_NE(family.sample, nullptr);
  const Index m = 4000;
  const Matrix x = family.sample(mix, m, 11, std::nullopt).get<DiagonalGaussianBatch>("test").values();
  ASSERT_EQ(x.rows(), m);
  Index negative = 0;
  for (Index i = 0; i < m; ++i) {
    EXPECT_LT(std::fabs(std::fabs(x(i, 0)) - 5.0), 1.0) << "row " << i << " is no component's draw";
    negative += x(i, 0) < 0;
  }
  const double share = static_cast<double>(negative) / static_cast<double>(m);
  EXPECT_NEAR(share, 0.3, 4 * std::sqrt(0.3 * 0.7 / static_cast<double>(m)));
  // The same seed gives the same rows; another seed other rows; no rows is a valid request.
  EXPECT_EQ(family.sample(mix, m, 11, std::nullopt).get<DiagonalGaussianBatch>("test").values(), x);
  EXPECT_NE(family.sample(mix, m, 12, std::nullopt).get<DiagonalGaussianBatch>("test").values(), x);
  EXPECT_EQ(family.sample(mix, 0, 11, std::nullopt).n_rows(), 0);
}

TEST(MixtureTest, SamplerOfAMixtureOfMixturesDrawsLeafRows) {
  Vector half(2);
  half << 0.5, 0.5;
  const AnyDistribution inner(Mixture({AnyDistribution(point(-5)), AnyDistribution(point(5))}, half));
  Vector w(2);
  w << 0.5, 0.5;
  const AnyDistribution outer(Mixture({inner, AnyDistribution(point(20))}, w));
  const Matrix x =
      mixture_family().sample(outer, 2000, 3, std::nullopt).get<DiagonalGaussianBatch>("test").values();
  Index far = 0;
  for (Index i = 0; i < x.rows(); ++i) far += x(i, 0) > 10;
  EXPECT_NEAR(static_cast<double>(far) / 2000.0, 0.5, 4 * std::sqrt(0.25 / 2000.0));
}

}  // namespace
}  // namespace attnmix
