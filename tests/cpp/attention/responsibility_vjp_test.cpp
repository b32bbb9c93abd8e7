// SPDX-License-Identifier: Apache-2.0
// Responsibility attention: the vector–Jacobian products of log_density and predict_proba with respect to the
// queries and the key means, against central finite differences of log_density / predict_proba themselves (an
// independent oracle: the VJPs share no code with those differences beyond the model's constructor).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "testing/all_close.hpp"
#include "testing/random_responsibility.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;
using testing::random_responsibility_params;

/// Raw rows: contexts drawn with replacement (so symbols repeat), row 0 forced to hold symbol 0 twice; queries near
/// the keys of the context (so several positions share the responsibility), targets uniform.
struct Rows {
  IdMatrix contexts;
  Matrix queries;
  IdVector targets;
};

Rows random_rows(const ResponsibilityAttentionParams& p, Index n, Rng& rng) {
  const Index S = p.key_means.rows();
  const Index N = p.position_prior.size();
  const Index D = p.key_means.cols();
  const Index T = p.emission.cols();
  Rows rows{IdMatrix(n, N), Matrix(n, D), IdVector(n)};
  for (Index r = 0; r < n; ++r) {
    for (Index i = 0; i < N; ++i) rows.contexts(r, i) = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(S)));
    const Index z = static_cast<Index>(rng.uniform_int(static_cast<uint64_t>(N)));
    for (Index d = 0; d < D; ++d)
      rows.queries(r, d) = p.key_means(rows.contexts(r, z), d) + 0.8 * std::sqrt(p.sigma2) * rng.normal();
    rows.targets[r] = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(T)));
  }
  rows.contexts(0, 0) = 0;
  rows.contexts(0, N - 1) = 0;
  return rows;
}

ResponsibilityAttentionBatch encode(const Rows& rows) {
  return ResponsibilityAttentionEncoder{}.encode(rows.contexts, rows.queries, rows.targets);
}

/// L(Y, K) = Σ_n G_n log p_n (kind = log density) or Σ_{n,t} G_nt p(t | c_n, y_n) (kind = predict_proba).
enum class Kind { kLogDensity, kPredictProba };

double objective(Kind kind, const ResponsibilityAttentionParams& p, const Rows& rows, const Matrix& G) {
  const ResponsibilityAttention model(p);
  const ResponsibilityAttentionBatch batch = encode(rows);
  double total = 0.0;
  if (kind == Kind::kLogDensity) {
    std::vector<double> log_p(static_cast<size_t>(batch.n_rows()));
    model.log_density(batch, log_p);
    for (Index n = 0; n < batch.n_rows(); ++n)
      if (G(n, 0) != 0.0) total += G(n, 0) * log_p[static_cast<size_t>(n)];
  } else {
    const Matrix proba = model.predict_proba(batch);
    total = (proba.array() * G.array()).sum();
  }
  return total;
}

/// Central differences (step h) of the objective in every query and key-mean coordinate.
ResponsibilityAttentionVjp finite_differences(Kind kind, const ResponsibilityAttentionParams& p, const Rows& rows,
                                              const Matrix& G, double h) {
  ResponsibilityAttentionVjp fd{Matrix::Zero(rows.queries.rows(), rows.queries.cols()),
                                Matrix::Zero(p.key_means.rows(), p.key_means.cols())};
  for (Index k = 0; k < rows.queries.size(); ++k) {
    Rows plus = rows, minus = rows;
    plus.queries.data()[k] += h;
    minus.queries.data()[k] -= h;
    fd.queries.data()[k] = (objective(kind, p, plus, G) - objective(kind, p, minus, G)) / (2 * h);
  }
  for (Index k = 0; k < p.key_means.size(); ++k) {
    ResponsibilityAttentionParams plus = p, minus = p;
    plus.key_means.data()[k] += h;
    minus.key_means.data()[k] -= h;
    fd.key_means.data()[k] = (objective(kind, plus, rows, G) - objective(kind, minus, rows, G)) / (2 * h);
  }
  return fd;
}

Matrix random_gradient(Index rows, Index cols, Rng& rng) {
  Matrix G(rows, cols);
  for (Index k = 0; k < G.size(); ++k) G.data()[k] = rng.normal();
  return G;
}

constexpr double kStep = 1e-5;
constexpr double kRtol = 1e-6;
constexpr double kAtol = 1e-7;

struct Dims {
  Index S, N, D, T;
};

class ResponsibilityVjpTest : public ::testing::TestWithParam<Dims> {};

// D = 3 runs the run-time-D kernel, D = 8 the specialised one; S < N forces repeated symbols in every context.
INSTANTIATE_TEST_SUITE_P(Dims, ResponsibilityVjpTest,
                         ::testing::Values(Dims{5, 4, 3, 4}, Dims{3, 6, 8, 5}, Dims{7, 9, 2, 3}));

TEST_P(ResponsibilityVjpTest, LogDensityVjpMatchesFiniteDifferences) {
  const Dims dims = GetParam();
  Rng rng(testing::test_seed(191));
  const ResponsibilityAttentionParams p = random_responsibility_params(dims.S, dims.N, dims.D, dims.T, rng, 0.6);
  const Rows rows = random_rows(p, 6, rng);
  const Matrix G = random_gradient(6, 1, rng);
  const ResponsibilityAttentionVjp vjp =
      ResponsibilityAttention(p).log_density_vjp(encode(rows), {G.data(), static_cast<size_t>(G.size())});
  const ResponsibilityAttentionVjp fd = finite_differences(Kind::kLogDensity, p, rows, G, kStep);
  ExpectAllClose(vjp.queries, fd.queries, kRtol, kAtol);
  ExpectAllClose(vjp.key_means, fd.key_means, kRtol, kAtol);
}

TEST_P(ResponsibilityVjpTest, PredictProbaVjpMatchesFiniteDifferences) {
  const Dims dims = GetParam();
  Rng rng(testing::test_seed(192));
  const ResponsibilityAttentionParams p = random_responsibility_params(dims.S, dims.N, dims.D, dims.T, rng, 0.6);
  const Rows rows = random_rows(p, 6, rng);
  const Matrix G = random_gradient(6, dims.T, rng);
  const ResponsibilityAttention model(p);
  const ResponsibilityAttentionVjp vjp = model.predict_proba_vjp(encode(rows), G);
  const ResponsibilityAttentionVjp fd = finite_differences(Kind::kPredictProba, p, rows, G, kStep);
  ExpectAllClose(vjp.queries, fd.queries, kRtol, kAtol);
  ExpectAllClose(vjp.key_means, fd.key_means, kRtol, kAtol);
  // The raw-array overload validates and gives the same bits.
  const ResponsibilityAttentionVjp raw = model.predict_proba_vjp(rows.contexts, rows.queries, G);
  EXPECT_EQ(raw.queries, vjp.queries);
  EXPECT_EQ(raw.key_means, vjp.key_means);
}

/// The key gradient of a symbol held at two positions is the sum of the two positions' terms: checked against a
/// model in which the second occurrence is a distinct symbol with the same key and emission.
TEST(ResponsibilityVjpCases, RepeatedSymbolContributesOncePerPosition) {
  Rng rng(testing::test_seed(193));
  ResponsibilityAttentionParams p = random_responsibility_params(3, 3, 2, 2, rng, 0.5);
  ResponsibilityAttentionParams split = p;  // symbol 3 is a copy of symbol 0
  split.key_means.conservativeResize(4, Eigen::NoChange);
  split.key_means.row(3) = p.key_means.row(0);
  split.emission.conservativeResize(4, Eigen::NoChange);
  split.emission.row(3) = p.emission.row(0);
  Rows rows{IdMatrix(1, 3), Matrix(1, 2), IdVector(1)};
  rows.contexts << 0, 1, 0;
  rows.queries << 0.3, -0.2;
  rows.targets << 1;
  Rows split_rows = rows;
  split_rows.contexts << 0, 1, 3;
  const std::vector<double> G{1.7};
  const ResponsibilityAttentionVjp joint = ResponsibilityAttention(p).log_density_vjp(encode(rows), G);
  const ResponsibilityAttentionVjp apart = ResponsibilityAttention(split).log_density_vjp(encode(split_rows), G);
  ExpectAllClose(joint.queries, apart.queries, 1e-14, 1e-15);
  const Matrix merged = apart.key_means.row(0) + apart.key_means.row(3);
  ExpectAllClose(Matrix(joint.key_means.row(0)), merged, 1e-14, 1e-15);
  EXPECT_NE(apart.key_means(3, 0), 0.0);
  const Matrix Gp = Matrix::Constant(1, 2, 0.4) + random_gradient(1, 2, rng);
  const ResponsibilityAttentionVjp joint_p = ResponsibilityAttention(p).predict_proba_vjp(encode(rows), Gp);
  const ResponsibilityAttentionVjp apart_p = ResponsibilityAttention(split).predict_proba_vjp(encode(split_rows), Gp);
  ExpectAllClose(joint_p.queries, apart_p.queries, 1e-14, 1e-15);
  ExpectAllClose(Matrix(joint_p.key_means.row(0)), Matrix(apart_p.key_means.row(0) + apart_p.key_means.row(3)),
                 1e-14, 1e-15);
}

/// Impossible rows (log p = −∞) contribute zero; possible rows of the same batch still match finite differences.
/// A zero-prior position gets zero attention in both VJPs.
TEST(ResponsibilityVjpCases, ImpossibleRowsContributeZero) {
  ResponsibilityAttentionParams p;
  p.key_means.resize(3, 2);
  p.key_means << 0.0, 0.5, 1.0, -0.3, -0.7, 0.2;
  p.emission.resize(3, 2);
  p.emission << 0.0, 1.0, 0.6, 0.4, 1.0, 0.0;  // target 0 is impossible from symbol 0, target 1 from symbol 2
  p.position_prior.resize(3);
  p.position_prior << 0.0, 0.5, 0.5;  // position 0 can never be attended
  p.sigma2 = 0.8;
  Rows rows{IdMatrix(3, 3), Matrix(3, 2), IdVector(3)};
  rows.contexts << 1, 0, 2,   // possible
      1, 0, 0,                // target 0: positions 1 and 2 hold symbol 0 (B = 0), position 0 has π = 0
      2, 2, 1;                // possible
  rows.queries << 0.1, 0.2, -0.4, 0.3, 0.5, -0.1;
  rows.targets << 0, 0, 1;
  const ResponsibilityAttention model(p);
  const ResponsibilityAttentionBatch batch = encode(rows);
  std::vector<double> log_p(3);
  model.log_density(batch, log_p);
  ASSERT_EQ(log_p[1], -std::numeric_limits<double>::infinity());
  ASSERT_TRUE(std::isfinite(log_p[0]) && std::isfinite(log_p[2]));

  const Matrix G = (Matrix(3, 1) << 0.7, -1.3, 2.0).finished();
  const ResponsibilityAttentionVjp vjp = model.log_density_vjp(batch, {G.data(), 3});
  EXPECT_TRUE(vjp.queries.allFinite());
  EXPECT_TRUE(vjp.key_means.allFinite());
  EXPECT_EQ(vjp.queries.row(1), Matrix::Zero(1, 2));
  // The possible rows alone give the same gradients (row 1 adds nothing anywhere).
  Matrix G_possible = G;
  G_possible(1, 0) = 0.0;
  const ResponsibilityAttentionVjp possible = model.log_density_vjp(batch, {G_possible.data(), 3});
  EXPECT_EQ(vjp.queries, possible.queries);
  EXPECT_EQ(vjp.key_means, possible.key_means);
  const ResponsibilityAttentionVjp fd = finite_differences(Kind::kLogDensity, p, rows, G_possible, kStep);
  ExpectAllClose(vjp.queries, fd.queries, kRtol, kAtol);
  ExpectAllClose(vjp.key_means, fd.key_means, kRtol, kAtol);

  const Matrix Gp = (Matrix(3, 2) << 0.3, -1.1, 0.9, 0.2, -0.5, 1.4).finished();
  const ResponsibilityAttentionVjp vjp_p = model.predict_proba_vjp(batch, Gp);
  const ResponsibilityAttentionVjp fd_p = finite_differences(Kind::kPredictProba, p, rows, Gp, kStep);
  ExpectAllClose(vjp_p.queries, fd_p.queries, kRtol, kAtol);
  ExpectAllClose(vjp_p.key_means, fd_p.key_means, kRtol, kAtol);
}

/// An empty batch gives [0, D] and zero [S, D] gradients.
TEST(ResponsibilityVjpCases, EmptyBatch) {
  Rng rng(testing::test_seed(194));
  const ResponsibilityAttention model(random_responsibility_params(3, 2, 2, 2, rng, 1.0));
  const ResponsibilityAttentionBatch empty =
      ResponsibilityAttentionEncoder{}.encode(IdMatrix(0, 2), Matrix(0, 2), IdVector(0));
  const ResponsibilityAttentionVjp a = model.log_density_vjp(empty, {});
  EXPECT_EQ(a.queries.rows(), 0);
  EXPECT_EQ(a.key_means, Matrix::Zero(3, 2));
  const ResponsibilityAttentionVjp b = model.predict_proba_vjp(empty, Matrix(0, 2));
  EXPECT_EQ(b.queries.rows(), 0);
  EXPECT_EQ(b.key_means, Matrix::Zero(3, 2));
}

TEST(ResponsibilityVjpCases, InvalidArgumentsThrowValueError) {
  Rng rng(testing::test_seed(195));
  const ResponsibilityAttentionParams p = random_responsibility_params(4, 3, 2, 5, rng, 1.0);
  const ResponsibilityAttention model(p);
  const Rows rows = random_rows(p, 4, rng);
  const ResponsibilityAttentionBatch batch = encode(rows);
  // The incoming gradient: wrong length / shape, non-finite entries.
  EXPECT_THROW((void)model.log_density_vjp(batch, std::vector<double>(3, 1.0)), ValueError);
  std::vector<double> g(4, 1.0);
  g[2] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW((void)model.log_density_vjp(batch, g), ValueError);
  g[2] = std::numeric_limits<double>::infinity();
  EXPECT_THROW((void)model.log_density_vjp(batch, g), ValueError);
  EXPECT_THROW((void)model.predict_proba_vjp(batch, Matrix::Ones(4, 4)), ValueError);  // T = 5 columns
  EXPECT_THROW((void)model.predict_proba_vjp(batch, Matrix::Ones(3, 5)), ValueError);
  Matrix bad = Matrix::Ones(4, 5);
  bad(1, 3) = -std::numeric_limits<double>::infinity();
  EXPECT_THROW((void)model.predict_proba_vjp(batch, bad), ValueError);
  // A batch of other dimensions, out-of-range ids, non-finite queries.
  const ResponsibilityAttentionBatch wide =
      ResponsibilityAttentionEncoder{}.encode(IdMatrix::Zero(2, 4), Matrix::Zero(2, 2), IdVector::Zero(2));
  EXPECT_THROW((void)model.log_density_vjp(wide, std::vector<double>(2, 1.0)), ValueError);
  EXPECT_THROW((void)model.predict_proba_vjp(wide, Matrix::Ones(2, 5)), ValueError);
  IdMatrix out_of_range = rows.contexts;
  out_of_range(0, 0) = 4;
  EXPECT_THROW((void)model.predict_proba_vjp(out_of_range, rows.queries, Matrix::Ones(4, 5)), ValueError);
  Matrix nan_query = rows.queries;
  nan_query(1, 1) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW((void)model.predict_proba_vjp(rows.contexts, nan_query, Matrix::Ones(4, 5)), ValueError);
  EXPECT_THROW((void)model.predict_proba_vjp(rows.contexts, Matrix::Zero(4, 3), Matrix::Ones(4, 5)), ValueError);
}

}  // namespace
}  // namespace attnmix
