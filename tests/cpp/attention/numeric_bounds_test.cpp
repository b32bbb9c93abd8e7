// SPDX-License-Identifier: Apache-2.0
// Sizes and numeric edges at the boundary of every family: dimensions whose statistics cannot exist, variances that
// would make the model's constants infinite (subnormal σ²), coordinates beyond the magnitude bound, and — the other
// side of the promise — finite, exact log densities right at the bounds (checked against a long-double formula).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/gaussian.hpp"

namespace attnmix {
namespace {

constexpr int64_t kHuge = (int64_t{1} << 62) + 1;
constexpr double kSubnormal = 1e-320;

TEST(NumericBoundsTest, EstimatorsRefuseDimensionsWhoseStatisticsCannotExist) {
  EXPECT_THROW(ChainedAttentionEstimator(2, kHuge, 6), ValueError);
  EXPECT_THROW(ChainedAttentionEstimator(2, int64_t{1} << 25, 6), ValueError);  // 2·2^50 key entries
  EXPECT_THROW(ResponsibilityAttentionEstimator(4, 3, 4, kHuge), ValueError);
  EXPECT_THROW(ResponsibilityAttentionEstimator(int64_t{1} << 30, 3, int64_t{1} << 30, 4), ValueError);
  EXPECT_THROW(VariationalEmbeddingAttentionEstimator(kHuge, 3, 2, 4), ValueError);
  VariationalEmbeddingAttentionEstimatorOptions many_samples;
  many_samples.mc = int64_t{1} << 40;
  EXPECT_THROW(VariationalEmbeddingAttentionEstimator(1000, 3, 1000, 4, many_samples), ValueError);
  EXPECT_THROW(VariationalMultiHopAttentionEstimator(4, kHuge, 4), ValueError);
  // Ordinary sizes still construct.
  EXPECT_NO_THROW(ChainedAttentionEstimator(2, 1000, 6));
  EXPECT_NO_THROW(ResponsibilityAttentionEstimator(100, 8, 16, 100));
}

ResponsibilityAttentionParams ra_params(double sigma2, double scale) {
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Zero(2, 3);
  p.key_means(0, 0) = scale;
  p.key_means(1, 1) = -scale;
  p.emission = Matrix::Constant(2, 2, 0.5);
  p.position_prior = Vector::Constant(2, 0.5);
  p.sigma2 = sigma2;
  return p;
}

TEST(NumericBoundsTest, VariancesMustKeepTheConstantsFinite) {
  EXPECT_THROW(ResponsibilityAttention(ra_params(kSubnormal, 1.0)), ValueError);
  EXPECT_THROW(ResponsibilityAttention(ra_params(1e-101, 1.0)), ValueError);
  EXPECT_NO_THROW(ResponsibilityAttention(ra_params(check::kMinVariance, 1.0)));
  ChainedAttentionEstimatorOptions ca;
  ca.sigma2 = kSubnormal;
  EXPECT_THROW(ChainedAttentionEstimator(2, 4, 4, ca), ValueError);
  ResponsibilityAttentionEstimatorOptions ra;
  ra.min_sigma2 = kSubnormal;
  EXPECT_THROW(ResponsibilityAttentionEstimator(4, 3, 4, 4, ra), ValueError);
  DiagonalGaussianParams g{Vector::Zero(2), Vector::Constant(2, kSubnormal), ""};
  EXPECT_THROW(DiagonalGaussian{g}, ValueError);

  VariationalEmbeddingAttentionParams vea;
  vea.mean = Matrix::Zero(3, 2);
  vea.log_var = Matrix::Zero(3, 2);
  vea.emission = Matrix::Constant(3, 2, 0.5);
  vea.position_prior = Vector::Constant(2, 0.5);
  vea.sigma2 = kSubnormal;
  EXPECT_THROW(VariationalEmbeddingAttention{vea}, ValueError);
  vea.sigma2 = 0.5;
  vea.log_var(1, 1) = 700.0;  // exp(350) would make the sampled embeddings overflow the distances
  EXPECT_THROW(VariationalEmbeddingAttention{vea}, ValueError);
  vea.log_var(1, 1) = 0.0;
  vea.mean(2, 0) = 1e60;
  EXPECT_THROW(VariationalEmbeddingAttention{vea}, ValueError);
  vea.mean(2, 0) = 0.0;
  EXPECT_NO_THROW(VariationalEmbeddingAttention{vea});

  VariationalMultiHopAttentionParams vmha;
  vmha.mean = Matrix::Zero(3, 2);
  vmha.log_var = Matrix::Zero(3, 2);
  vmha.emission = Matrix::Constant(3, 2, 0.5);
  vmha.sigma2 = kSubnormal;
  EXPECT_THROW(VariationalMultiHopAttention{vmha}, ValueError);

  ChainedAttentionParams cap;
  cap.key_tables = {Matrix::Identity(3, 3)};
  cap.emission = Matrix::Constant(3, 2, 0.5);
  cap.sigma2 = kSubnormal;
  EXPECT_THROW(ChainedAttention{cap}, ValueError);
  cap.sigma2 = 0.1;
  cap.key_tables[0](0, 1) = 1e51;
  EXPECT_THROW(ChainedAttention{cap}, ValueError);
}

TEST(NumericBoundsTest, CoordinatesBeyondTheBoundAreRefusedByTheEncoders) {
  const ResponsibilityAttentionEncoder encoder{2, 2, 3, 2};
  IdMatrix contexts(1, 2);
  contexts << 0, 1;
  Matrix queries = Matrix::Zero(1, 3);
  queries(0, 2) = 1e300;
  IdVector targets(1);
  targets << 1;
  try {
    static_cast<void>(encoder.encode(contexts, queries, targets));
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("query row 0 must be finite with magnitude at most 1e+50 (column 2"),
              std::string::npos)
        << e.what();
  }
  Matrix values = Matrix::Zero(2, 2);
  values(1, 0) = -1e51;
  EXPECT_THROW(static_cast<void>(DiagonalGaussianEncoder{}.encode(values)), ValueError);
}

/// log Σ_i π_i N(y | μ_{x_i}, σ² I) B[x_i, t] in long double, straight from the formula.
long double ra_log_density_oracle(const ResponsibilityAttentionParams& p, const std::vector<int64_t>& context,
                                  const std::vector<double>& y, int64_t target) {
  const auto D = static_cast<long double>(y.size());
  std::vector<long double> terms;
  for (size_t i = 0; i < context.size(); ++i) {
    long double d2 = 0;
    for (size_t d = 0; d < y.size(); ++d) {
      const long double diff = static_cast<long double>(y[d]) - p.key_means(context[i], static_cast<Index>(d));
      d2 += diff * diff;
    }
    const long double s2 = p.sigma2;
    terms.push_back(std::log(static_cast<long double>(p.position_prior[static_cast<Index>(i)])) -
                    d2 / (2 * s2) - D / 2 * std::log(2 * std::numbers::pi_v<long double> * s2) +
                    std::log(static_cast<long double>(p.emission(context[i], target))));
  }
  long double top = terms[0];
  for (long double t : terms) top = std::max(top, t);
  long double sum = 0;
  for (long double t : terms) sum += std::exp(t - top);
  return top + std::log(sum);
}

TEST(NumericBoundsTest, LogDensitiesAtTheBoundsAreFiniteAndExact) {
  // The smallest variance and the largest coordinates together: ‖y − μ‖²/(2σ²) is about 6e200, still a double.
  const double m = check::kMaxMagnitude;
  const ResponsibilityAttentionParams p = ra_params(check::kMinVariance, m);
  const ResponsibilityAttention model(p);
  const std::vector<int64_t> context{0, 1};
  for (const std::vector<double>& y : {std::vector<double>{-m, m, m}, std::vector<double>{m, -m, 0.0},
                                       std::vector<double>{1.0, 2.0, 3.0}}) {
    IdMatrix contexts(1, 2);
    contexts << context[0], context[1];
    Matrix queries(1, 3);
    queries << y[0], y[1], y[2];
    IdVector targets(1);
    targets << 1;
    const ResponsibilityAttentionBatch batch = model.encoder().encode(contexts, queries, targets);
    double out = 0.0;
    model.log_density(batch, {&out, 1});
    ASSERT_TRUE(std::isfinite(out)) << out;
    const long double expected = ra_log_density_oracle(p, context, y, 1);
    EXPECT_NEAR(out / static_cast<double>(expected), 1.0, 1e-12) << out << " vs " << static_cast<double>(expected);
  }
}

}  // namespace
}  // namespace attnmix
