// SPDX-License-Identifier: Apache-2.0
// Variational embedding attention: the unit acceptance rows (VEA-1, VEA-4 … VEA-8) and the formulas of
// docs/mechanisms.md#variational-embedding-attention against independent oracles.
//
// Oracles written here, from docs/mechanisms.md#variational-embedding-attention and not from the library's internals
// (only parameters are read):
//   * oracle_row: the plug-in model of docs/mechanisms.md#variational-embedding-attention with plain loops and
//     log-sum-exp (gate, posterior r, log p);
//   * oracle_noise: the Monte-Carlo noise of docs/mechanisms.md#variational-embedding-attention drawn directly from
//     Rng(derive_seed(seed, kMcNoise, τ));
//   * oracle_statistics: the E-step sums of docs/mechanisms.md#variational-embedding-attention (ll, counts, n) over
//     those tables;
//   * central finite differences of the fixed-noise objective (1/mc) Σ_k Σ_n w_n log p(E_k) — the accumulator's ll —
//     for the data gradient of docs/mechanisms.md#variational-embedding-attention with respect to m and log v
//     (perturbing the model's mean or log_var while its optimizer state keeps the seed and iteration, so the same ε is
//     reused);
//   * scalar Adam, Dirichlet draws in row order (seq_initialize), and the initial embeddings, all of
//     docs/mechanisms.md#variational-embedding-attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/reduce.hpp"
#include "testing/all_close.hpp"
#include "testing/random_variational.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;
using testing::random_variational_rows;
using Params = VariationalEmbeddingAttentionParams;
using Model = VariationalEmbeddingAttention;
using Acc = VariationalEmbeddingAttentionAccumulator;
using Batch = VariationalEmbeddingAttentionBatch;
using Encoder = VariationalEmbeddingAttentionEncoder;
using Estimator = VariationalEmbeddingAttentionEstimator;
using EstimatorOptions = VariationalEmbeddingAttentionEstimatorOptions;
constexpr double kNegInfinity = -std::numeric_limits<double>::infinity();
constexpr const char* kDifferentStates = "cannot combine attention statistics from different optimizer states";

// ----- helpers and oracles -----------------------------------------------------------------------------------------

Matrix random_matrix(Index rows, Index cols, double scale, Rng& rng) {
  Matrix m(rows, cols);
  for (Index k = 0; k < m.size(); ++k) m.data()[k] = scale * rng.normal();
  return m;
}

Vector dirichlet(Index k, Rng& rng) {
  Vector p(k);
  rng.dirichlet_ones({p.data(), static_cast<size_t>(k)});
  return p;
}

bool same_bits(const Matrix& a, const Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * static_cast<size_t>(a.size())) == 0;
}

/// A valid model's parameters: mean mean_scale·N(0, 1), log v = log 0.3 + 0.4·N(0, 1), emission rows and π
/// Dirichlet(1) (all entries > 0), σ² 0.5, and an optimizer state with seed 11, iteration 3 and non-zero moments.
Params random_params(Index S, Index N, Index D, Index T, Rng& rng, double mean_scale = 1.0) {
  Params p;
  p.mean = random_matrix(S, D, mean_scale, rng);
  p.log_var = (random_matrix(S, D, 0.4, rng).array() + std::log(0.3)).matrix();
  p.emission.resize(S, T);
  for (Index s = 0; s < S; ++s) p.emission.row(s) = dirichlet(T, rng).transpose();
  p.position_prior = dirichlet(N, rng);
  p.sigma2 = 0.5;
  AttentionOptimizerState state = AttentionOptimizerState::fresh(Model::kFamily, p.mean, p.log_var, 11);
  state.iteration = 3;
  state.mean_first_moment = random_matrix(S, D, 0.1, rng);
  state.mean_second_moment = random_matrix(S, D, 0.1, rng).cwiseAbs2();
  state.log_var_first_moment = random_matrix(S, D, 0.1, rng);
  state.log_var_second_moment = random_matrix(S, D, 0.1, rng).cwiseAbs2();
  p.optimizer_state = std::move(state);
  return p;
}

/// The model of `base` with other embeddings: the optimizer state is copied with its mean and log_var replaced (seed,
/// iteration and moments kept), so the E-step reuses the same noise ε.
Model with_embeddings(const Params& base, const Matrix& mean, const Matrix& log_var) {
  Params p = base;
  p.mean = mean;
  p.log_var = log_var;
  p.optimizer_state->mean = mean;
  p.optimizer_state->log_var = log_var;
  return Model(std::move(p));
}

Batch rows_from(const std::vector<std::vector<int64_t>>& contexts, const std::vector<int64_t>& queries,
                const std::vector<int64_t>& targets, const Encoder& encoder = {}) {
  const auto n = static_cast<Index>(contexts.size());
  const auto N = static_cast<Index>(contexts.front().size());
  IdMatrix c(n, N);
  IdVector q(n), t(n);
  for (Index r = 0; r < n; ++r) {
    for (Index i = 0; i < N; ++i) c(r, i) = contexts[static_cast<size_t>(r)][static_cast<size_t>(i)];
    q[r] = queries[static_cast<size_t>(r)];
    t[r] = targets[static_cast<size_t>(r)];
  }
  return encoder.encode(c, q, t);
}

std::vector<double> packed(const Acc& acc) {
  std::vector<double> out(static_cast<size_t>(acc.flat_size()));
  acc.pack(out);
  return out;
}

std::vector<double> log_densities(const Model& model, const Batch& batch) {
  std::vector<double> out(static_cast<size_t>(batch.n_rows()));
  model.log_density(batch, out);
  return out;
}

/// Weights uniform on [0.25, 2) with the listed rows set to 0.
std::vector<double> weights_with_zeros(Index n, Rng& rng, const std::vector<Index>& zeros) {
  std::vector<double> w(static_cast<size_t>(n));
  for (double& x : w) x = 0.25 + 1.75 * rng.uniform();
  for (Index z : zeros) w[static_cast<size_t>(z)] = 0.0;
  return w;
}

double reference_lse(const std::vector<double>& x) {
  const double top = *std::max_element(x.begin(), x.end());
  if (top == kNegInfinity) return kNegInfinity;
  double total = 0.0;
  for (double v : x) total += std::exp(v - top);
  return top + std::log(total);
}

/// Oracle (docs/mechanisms.md#variational-embedding-attention) for one row at table E: s_i = log π_i − ‖E[q] −
/// E[c_i]‖²/(2σ²), log a = s − LSE s, log p = LSE_i(log a_i + log B[c_i, t]), r_i = exp(log a_i + log B[c_i, t] − log
/// p) (0 for an impossible row).
struct RowOracle {
  double log_p = 0.0;
  std::vector<double> a, r;
};
RowOracle oracle_row(const Params& p, const Matrix& E, const int64_t* c, int64_t q, int64_t t) {
  const auto N = static_cast<size_t>(p.position_prior.size());
  std::vector<double> s(N), x(N);
  for (size_t i = 0; i < N; ++i) {
    double sq = 0.0;
    for (Index d = 0; d < E.cols(); ++d) {
      const double diff = E(q, d) - E(c[i], d);
      sq += diff * diff;
    }
    s[i] = std::log(p.position_prior[static_cast<Index>(i)]) - sq / (2.0 * p.sigma2);
  }
  const double lse_s = reference_lse(s);
  RowOracle out;
  out.a.resize(N);
  out.r.assign(N, 0.0);
  for (size_t i = 0; i < N; ++i) {
    const double log_a = s[i] - lse_s;
    out.a[i] = std::exp(log_a);
    x[i] = log_a + std::log(p.emission(c[i], t));
  }
  out.log_p = reference_lse(x);
  if (out.log_p != kNegInfinity)
    for (size_t i = 0; i < N; ++i) out.r[i] = std::exp(x[i] - out.log_p);
  return out;
}

/// Oracle (docs/mechanisms.md#variational-embedding-attention): the mc noise tables ε_k of (seed, iteration), N(0, 1)
/// row-major, k in order.
std::vector<Matrix> oracle_noise(const AttentionOptimizerState& state, int64_t mc) {
  Rng rng(derive_seed(state.seed, SeedPurpose::kMcNoise, static_cast<uint64_t>(state.iteration)));
  std::vector<Matrix> out;
  for (int64_t k = 0; k < mc; ++k) {
    Matrix eps(state.mean.rows(), state.mean.cols());
    for (Index e = 0; e < eps.size(); ++e) eps.data()[e] = rng.normal();
    out.push_back(std::move(eps));
  }
  return out;
}

/// Oracle (docs/mechanisms.md#variational-embedding-attention): ll = (1/mc) Σ_k Σ_n w_n log p(E_k), counts (1/mc) Σ_k
/// Σ_n w_n r_ni, n = Σ w, with E_k = m + exp(½ log v) ⊙ ε_k.
struct OracleStats {
  Matrix emission_count;
  Vector position_count;
  double ll = 0.0;
  double n = 0.0;
};
OracleStats oracle_statistics(const Params& p, const Batch& batch, const std::vector<double>& w, int64_t mc) {
  const Index S = p.mean.rows(), T = p.emission.cols(), N = p.position_prior.size();
  OracleStats out{Matrix::Zero(S, T), Vector::Zero(N), 0.0, 0.0};
  const Matrix s_std = (0.5 * p.log_var.array()).exp().matrix();
  for (const Matrix& eps : oracle_noise(*p.optimizer_state, mc)) {
    const Matrix E = p.mean + s_std.cwiseProduct(eps);
    for (Index row = 0; row < batch.n_rows(); ++row) {
      const double wn = w[static_cast<size_t>(row)];
      if (wn == 0.0) continue;
      const RowOracle o = oracle_row(p, E, batch.context(row), batch.query(row), batch.target(row));
      out.ll += wn * o.log_p / static_cast<double>(mc);
      for (Index i = 0; i < N; ++i) {
        out.emission_count(batch.context(row)[i], batch.target(row)) +=
            wn * o.r[static_cast<size_t>(i)] / static_cast<double>(mc);
        out.position_count[i] += wn * o.r[static_cast<size_t>(i)] / static_cast<double>(mc);
      }
    }
  }
  for (double x : w) out.n += x;
  return out;
}

/// "rel x" of the acceptance tasks: |a − b| ≤ x·max(1, max|b|) over a whole array.
void ExpectRel(const Matrix& actual, const Matrix& expected, double rel, const std::string& what) {
  ASSERT_EQ(actual.rows(), expected.rows()) << what;
  ASSERT_EQ(actual.cols(), expected.cols()) << what;
  const double scale = std::max(1.0, expected.cwiseAbs().maxCoeff());
  const double worst = (actual - expected).cwiseAbs().maxCoeff();
  EXPECT_LE(worst, rel * scale) << what << ": worst difference " << worst << " (scale " << scale << ")";
}
void ExpectRel(double actual, double expected, double rel, const std::string& what) {
  EXPECT_LE(std::fabs(actual - expected), rel * std::max(1.0, std::fabs(expected)))
      << what << ": " << actual << " vs " << expected;
}

/// Every field of two accumulators agrees to rel ("rel x" of the acceptance tasks, per field), and n exactly.
void ExpectFieldsClose(const Acc& actual, const Acc& expected, double rel) {
  ExpectRel(Matrix(actual.grad_mean()), Matrix(expected.grad_mean()), rel, "grad_mean");
  ExpectRel(Matrix(actual.grad_log_var()), Matrix(expected.grad_log_var()), rel, "grad_log_var");
  ExpectRel(Matrix(actual.emission_count()), Matrix(expected.emission_count()), rel, "emission_count");
  ExpectRel(Matrix(actual.position_count()), Matrix(expected.position_count()), rel, "position_count");
  ExpectRel(actual.ll(), expected.ll(), rel, "ll");
  ExpectRel(actual.n(), expected.n(), rel, "n");
}

/// Every parameter and the optimizer state of two models are bit-identical.
void ExpectSameModel(const Model& actual, const Model& expected) {
  EXPECT_TRUE(same_bits(actual.mean(), expected.mean()));
  EXPECT_TRUE(same_bits(actual.log_var(), expected.log_var()));
  EXPECT_TRUE(same_bits(actual.emission(), expected.emission()));
  EXPECT_TRUE(same_bits(Matrix(actual.position_prior()), Matrix(expected.position_prior())));
  EXPECT_EQ(actual.sigma2(), expected.sigma2());
  EXPECT_EQ(actual.params().name, expected.params().name);
  EXPECT_TRUE(actual.optimizer_state() == expected.optimizer_state());
}

/// Expects f to throw E whose message contains every fragment.
template <class E = ValueError, class F>
void ExpectThrowWith(F&& f, const std::vector<std::string>& fragments, const std::string& context) {
  try {
    f();
    ADD_FAILURE() << context << ": no exception";
  } catch (const E& e) {
    for (const std::string& fragment : fragments)
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
          << context << ": message '" << e.what() << "' lacks '" << fragment << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << context << ": wrong exception type: " << e.what();
  }
}

/// Oracle: one scalar Adam ascent step (docs/mechanisms.md#variational-embedding-attention).
double adam_theta(double theta, double g, double m1, double m2, double lr, int64_t tau, double* m1_out,
                  double* m2_out) {
  m1 = 0.9 * m1 + 0.1 * g;
  m2 = 0.999 * m2 + 0.001 * g * g;
  *m1_out = m1;
  *m2_out = m2;
  const double m_hat = m1 / (1.0 - std::pow(0.9, static_cast<double>(tau)));
  const double v_hat = m2 / (1.0 - std::pow(0.999, static_cast<double>(tau)));
  return theta + lr * m_hat / (std::sqrt(v_hat) + 1e-8);
}

/// The model reloaded from its model file (docs/model-format.md) through text: model_to_json → dump → parse →
/// model_from_json.
Model reload(const Model& model) {
  const nlohmann::json doc = model_to_json(AnyDistribution(model));
  const AnyDistribution loaded = model_from_json(nlohmann::json::parse(doc.dump()), "restart.json");
  const Model* concrete = loaded.get_if<Model>();
  if (concrete == nullptr) throw std::runtime_error("the reloaded model is not a VariationalEmbeddingAttention");
  return *concrete;
}

constexpr Index kS = 5, kN = 4, kD = 3, kT = 4;

// ----- plug-in density and prediction (VEA-1) -------------------------------------------------------------------

/// docs/mechanisms.md#variational-embedding-attention (VEA-1): log_density at E = m equals the brute-force oracle (rel
/// 1e-12) on rows with repeated symbols and queries inside their own context, including a model with a zero-prior
/// position; log_density_at an arbitrary table equals the oracle at that table; every row is finite.
TEST(VariationalEmbeddingAttentionTest, PlugInLogDensityMatchesBruteForce) {
  Rng rng(testing::test_seed(41));
  for (const bool zero_prior : {false, true}) {
    Params p = random_params(kS, kN, kD, kT, rng, 1.5);
    if (zero_prior) {
      p.position_prior[1] = 0.0;
      p.position_prior /= p.position_prior.sum();
    }
    const Model model(p);
    const Batch batch = random_variational_rows(40, kN, kS, kT, rng);
    const std::vector<double> log_p = log_densities(model, batch);
    const Matrix table = random_matrix(kS, kD, 2.0, rng);
    for (Index row = 0; row < batch.n_rows(); ++row) {
      const RowOracle o = oracle_row(p, p.mean, batch.context(row), batch.query(row), batch.target(row));
      ExpectRel(log_p[static_cast<size_t>(row)], o.log_p, 1e-12, "row " + std::to_string(row));
      EXPECT_TRUE(std::isfinite(log_p[static_cast<size_t>(row)]));
      const RowOracle at = oracle_row(p, table, batch.context(row), batch.query(row), batch.target(row));
      ExpectRel(model.log_density_at(table, batch, row), at.log_p, 1e-12, "table row " + std::to_string(row));
    }
  }
}

/// docs/mechanisms.md#variational-embedding-attention: a row whose likelihood is far below 1e-250 but positive (the
/// attended symbol emits the target with probability 1e-300 and every other position is ~e^-2000 away) gets the exact
/// log p of the log-space oracle (rel 1e-12), not −∞ or a floored value; its E-step statistics are finite and keep the
/// mass laws.
TEST(VariationalEmbeddingAttentionTest, UnderflowingRowsMatchLogSpaceOracle) {
  Params p;
  p.mean = Matrix::Zero(3, 1);
  p.mean(1, 0) = 30.0;
  p.mean(2, 0) = -30.0;
  p.log_var = Matrix::Constant(3, 1, -8.0);
  p.emission.resize(3, 2);
  p.emission << 1.0, 1e-300, 0.5, 0.5, 0.5, 0.5;
  p.position_prior = Vector::Constant(3, 1.0 / 3.0);
  p.sigma2 = 0.25;
  const Model model(p);
  // Query 0, context [0, 1, 2], target 1: a ≈ (1, e^-1800, e^-1800), p ≈ 1e-300 + ….
  const Batch batch = rows_from({{0, 1, 2}, {1, 0, 0}}, {0, 0}, {1, 1});
  const std::vector<double> log_p = log_densities(model, batch);
  for (Index row = 0; row < 2; ++row) {
    const RowOracle o = oracle_row(p, p.mean, batch.context(row), batch.query(row), batch.target(row));
    ASSERT_TRUE(std::isfinite(o.log_p));
    ExpectRel(log_p[static_cast<size_t>(row)], o.log_p, 1e-12, "row " + std::to_string(row));
  }
  EXPECT_LT(log_p[0], -600.0);
  auto acc = model.make_accumulator();
  const std::vector<double> w{1.0, 2.0};
  ASSERT_NO_THROW(model.accumulate(batch, w, acc));
  for (double v : packed(acc)) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(acc.position_count().sum(), 3.0, 1e-12);
  EXPECT_NEAR(acc.emission_count().sum(), 3.0, 1e-12);
}

/// docs/mechanisms.md#variational-embedding-attention (VEA-1): embeddings() is the mean [S, D]; predict_proba has shape
/// (n, T), rows sum to 1 (1e-12), equal Σ_i a_i B[c_i, ·] of the oracle gate (1e-12), both overloads agree, and
/// predict_proba[t] equals exp(log_density of the row with target t).
TEST(VariationalEmbeddingAttentionTest, PredictProbaSumsToOneAndMatchesBruteForce) {
  Rng rng(testing::test_seed(42));
  const Params p = random_params(kS, kN, kD, kT, rng, 1.2);
  const Model model(p);
  EXPECT_TRUE(same_bits(model.embeddings(), p.mean));
  EXPECT_EQ(model.embeddings().rows(), kS);
  EXPECT_EQ(model.embeddings().cols(), kD);
  const Batch batch = random_variational_rows(8, kN, kS, kT, rng);
  const Matrix proba = model.predict_proba(batch);
  ASSERT_EQ(proba.rows(), 8);
  ASSERT_EQ(proba.cols(), kT);
  EXPECT_EQ(model.predict_proba(batch.contexts(), batch.queries()), proba);
  for (Index row = 0; row < 8; ++row) {
    EXPECT_NEAR(proba.row(row).sum(), 1.0, 1e-12);
    const RowOracle o = oracle_row(p, p.mean, batch.context(row), batch.query(row), 0);
    for (Index t = 0; t < kT; ++t) {
      double expected = 0.0;
      for (Index i = 0; i < kN; ++i) expected += o.a[static_cast<size_t>(i)] * p.emission(batch.context(row)[i], t);
      EXPECT_NEAR(proba(row, t), expected, 1e-12) << "row " << row << " target " << t;
      IdMatrix c = batch.slice(row, 1).contexts();
      const Batch with_t = Encoder{}.encode(c, batch.slice(row, 1).queries(), IdVector::Constant(1, t));
      EXPECT_NEAR(proba(row, t), std::exp(log_densities(model, with_t)[0]), 1e-12);
    }
  }
}

// ----- E-step (docs/mechanisms.md#variational-embedding-attention) -------------------------------------------------

/// docs/mechanisms.md#variational-embedding-attention: the E-step's ll, emission_count, position_count and n equal the
/// oracle sums over the noise tables drawn from Rng(derive_seed(seed, kMcNoise, τ)) (rel 1e-12), with non-uniform
/// weights including zeros; the statistics carry the model's optimizer state; log_p_out receives the plug-in log
/// densities.
TEST(VariationalEmbeddingAttentionTest, EStepStatisticsMatchMonteCarloOracle) {
  Rng rng(testing::test_seed(43));
  const Params p = random_params(kS, kN, kD, kT, rng);
  const Model model(p);
  const Batch batch = random_variational_rows(30, kN, kS, kT, rng);
  const std::vector<double> w = weights_with_zeros(30, rng, {0, 7, 29});
  for (const int64_t mc : {1, 4}) {
    Acc acc(kS, kN, kD, kT, mc);
    std::vector<double> log_p_out(30);
    model.accumulate(batch, w, acc, log_p_out);
    const OracleStats o = oracle_statistics(p, batch, w, mc);
    SCOPED_TRACE("mc " + std::to_string(mc));
    ExpectRel(acc.ll(), o.ll, 1e-12, "ll");
    ExpectRel(Matrix(acc.emission_count()), o.emission_count, 1e-12, "emission_count");
    ExpectRel(Matrix(acc.position_count()), Matrix(o.position_count), 1e-12, "position_count");
    EXPECT_EQ(acc.n(), o.n);
    ASSERT_NE(acc.optimizer_state(), nullptr);
    EXPECT_TRUE(*acc.optimizer_state() == *p.optimizer_state);
    for (Index row = 0; row < 30; ++row)
      ExpectRel(log_p_out[static_cast<size_t>(row)],
                oracle_row(p, p.mean, batch.context(row), batch.query(row), batch.target(row)).log_p, 1e-12,
                "log_p_out row " + std::to_string(row));
  }
}

/// docs/mechanisms.md#variational-embedding-attention: grad_mean and grad_log_var equal central finite differences (h =
/// 1e-5) of the fixed-noise Monte-Carlo objective ll = (1/mc) Σ_k Σ_n w_n log p(t_n | E_k), E_k = m + exp(½ log v) ⊙
/// ε_k, with respect to every entry of m and of log v, to 1e-6 relative (|fd − g| ≤ 1e-6·max(1, max|g|)); weights are
/// non-uniform with zero weights; the same ε is reused because the perturbed models keep the optimizer state's seed and
/// iteration.
/// The model has repeated symbols and queries inside their own context, so one symbol receives both the query and
/// the key contribution.
TEST(VariationalEmbeddingAttentionTest, DataGradientMatchesFiniteDifferencesOfMcObjective) {
  Rng rng(testing::test_seed(44));
  const Params p = random_params(kS, kN, kD, kT, rng);
  const Model model(p);
  const Batch batch = random_variational_rows(12, kN, kS, kT, rng);
  const std::vector<double> w = weights_with_zeros(12, rng, {3});
  const int64_t mc = 3;
  Acc acc(kS, kN, kD, kT, mc);
  model.accumulate(batch, w, acc);
  const Matrix grad_mean = acc.grad_mean();
  const Matrix grad_log_var = acc.grad_log_var();
  ASSERT_GT(grad_mean.cwiseAbs().maxCoeff(), 1e-3);  // the check is not vacuous
  ASSERT_GT(grad_log_var.cwiseAbs().maxCoeff(), 1e-3);

  const auto objective = [&](const Matrix& mean, const Matrix& log_var) {
    Acc a(kS, kN, kD, kT, mc);
    with_embeddings(p, mean, log_var).accumulate(batch, w, a);
    return a.ll();
  };
  const double h = 1e-5;
  Matrix fd_mean(kS, kD), fd_log_var(kS, kD);
  for (Index k = 0; k < kS * kD; ++k) {
    Matrix plus = p.mean, minus = p.mean;
    plus.data()[k] += h;
    minus.data()[k] -= h;
    fd_mean.data()[k] = (objective(plus, p.log_var) - objective(minus, p.log_var)) / (2.0 * h);
    Matrix lv_plus = p.log_var, lv_minus = p.log_var;
    lv_plus.data()[k] += h;
    lv_minus.data()[k] -= h;
    fd_log_var.data()[k] = (objective(p.mean, lv_plus) - objective(p.mean, lv_minus)) / (2.0 * h);
  }
  ExpectRel(grad_mean, fd_mean, 1e-6, "grad_mean vs finite differences");
  ExpectRel(grad_log_var, fd_log_var, 1e-6, "grad_log_var vs finite differences");
}

/// VEA-4: weights [0, 1] equal the second row alone with weight 1, every field (rel 1e-12); more generally, zero
/// weights anywhere equal dropping those rows.
TEST(VariationalEmbeddingAttentionTest, ZeroWeightEqualsDroppingTheRow) {
  Rng rng(testing::test_seed(45));
  const Model model(random_params(kS, kN, kD, kT, rng));
  const Batch two = random_variational_rows(2, kN, kS, kT, rng);
  auto with_zero = model.make_accumulator();
  model.accumulate(two, std::vector<double>{0.0, 1.0}, with_zero);
  auto alone = model.make_accumulator();
  model.accumulate(two.slice(1, 1), std::vector<double>{1.0}, alone);
  ExpectFieldsClose(with_zero, alone, 1e-12);
  EXPECT_NE(with_zero.ll(), 0.0);

  const Batch many = random_variational_rows(9, kN, kS, kT, rng);
  std::vector<double> w = weights_with_zeros(9, rng, {0, 4, 8});
  auto sparse = model.make_accumulator();
  model.accumulate(many, w, sparse);
  auto kept = model.make_accumulator();
  for (const Index r : {1, 2, 3, 5, 6, 7})
    model.accumulate(many.slice(r, 1), std::vector<double>{w[static_cast<size_t>(r)]}, kept);
  ExpectFieldsClose(sparse, kept, 1e-12);
}

// ----- impossible evidence (VEA-5) ----------------------------------------------------------------------------------

/// VEA-5 / docs/mechanisms.md#building-blocks: with B = I (S = T = 4) and π = (½, ½, 0), a row is impossible when no
/// position with π_i > 0 holds its target. log_density is −∞ exactly there; accumulate (direct and chunk-parallel)
/// raises ImpossibleEvidenceError listing exactly those rows, ascending, with "impossible evidence" in the message,
/// before any statistic or the attached state changes; the same rows with zero weight are accepted and equal dropping
/// them.
TEST(VariationalEmbeddingAttentionTest, ImpossibleTargetsRaiseBeforeAnyStatisticChanges) {
  Rng rng(testing::test_seed(46));
  Params p;
  p.mean = random_matrix(4, 2, 1.0, rng);
  p.log_var = Matrix::Constant(4, 2, std::log(0.3));
  p.emission = Matrix::Identity(4, 4);
  p.position_prior = Vector(3);
  p.position_prior << 0.5, 0.5, 0.0;
  p.sigma2 = 0.5;
  const Model model(p);
  // Rows 1 and 4: the target is not in the context; row 3: only the zero-prior position holds it.
  const Batch batch = rows_from({{0, 1, 2}, {0, 1, 2}, {3, 2, 1}, {0, 1, 3}, {1, 1, 1}, {2, 0, 0}},
                                {0, 1, 2, 3, 0, 1}, {1, 3, 2, 3, 2, 0});
  const std::vector<int64_t> impossible{1, 3, 4};
  const std::vector<double> log_p = log_densities(model, batch);
  for (size_t row = 0; row < log_p.size(); ++row) {
    const bool bad = std::find(impossible.begin(), impossible.end(), static_cast<int64_t>(row)) != impossible.end();
    EXPECT_EQ(log_p[row] == kNegInfinity, bad) << "row " << row;
  }

  // Statistics that already hold an E-step of a possible row (and so the model's state).
  auto acc = model.make_accumulator();
  model.accumulate(batch.slice(0, 1), std::vector<double>{1.5}, acc);
  const std::vector<double> before = packed(acc);
  const auto state_before = acc.optimizer_state();
  const std::vector<double> ones(6, 1.0);
  const auto expect_rows = [&](auto&& e_step, const std::string& path) {
    try {
      e_step();
      ADD_FAILURE() << path << ": no ImpossibleEvidenceError";
    } catch (const ImpossibleEvidenceError& e) {
      EXPECT_EQ(e.rows(), impossible) << path;
      EXPECT_NE(std::string(e.what()).find("impossible evidence"), std::string::npos) << path << ": " << e.what();
    }
    EXPECT_EQ(packed(acc), before) << path;
    EXPECT_EQ(acc.optimizer_state(), state_before) << path;
  };
  expect_rows([&] { model.accumulate(batch, ones, acc); }, "accumulate");
  expect_rows([&] { parallel_accumulate(model, batch, ones, acc, {}, ParallelOptions{2, 2}); }, "parallel");
  auto fresh = model.make_accumulator();
  try {
    model.accumulate(batch, ones, fresh);
    ADD_FAILURE() << "no ImpossibleEvidenceError on fresh statistics";
  } catch (const ImpossibleEvidenceError&) {
    EXPECT_EQ(fresh.optimizer_state(), nullptr);  // no state attached by a failed E-step
    EXPECT_EQ(packed(fresh), packed(model.make_accumulator()));
  }

  std::vector<double> w = ones;
  for (int64_t r : impossible) w[static_cast<size_t>(r)] = 0.0;
  auto with_zero = model.make_accumulator();
  ASSERT_NO_THROW(model.accumulate(batch, w, with_zero));
  for (double v : packed(with_zero)) EXPECT_TRUE(std::isfinite(v));
  auto kept = model.make_accumulator();
  for (const Index r : {0, 2, 5}) model.accumulate(batch.slice(r, 1), std::vector<double>{1.0}, kept);
  ExpectFieldsClose(with_zero, kept, 1e-12);
}

// ----- samplers (VEA-6) ---------------------------------------------------------------------------------------------

/// VEA-6: the plug-in sampler uses m only: two models that differ only in log_var give identical draws from the
/// same seed; the posterior-predictive sampler does depend on log_var. A posterior-predictive batch of m rows equals
/// m sequential sample() draws (and so does a plug-in batch).
TEST(VariationalEmbeddingAttentionTest, PlugInSamplerIgnoresLogVarAndBatchesEqualSequentialDraws) {
  Rng rng(testing::test_seed(47));
  const Params p = random_params(6, kN, kD, kT, rng, 1.0);
  const Model model(p);
  const Model wide = with_embeddings(p, p.mean, Matrix::Constant(6, kD, 1.5));
  const uint64_t seed = 2024;
  const Batch a = model.sampler(seed).sample(Index{60});
  const Batch b = wide.sampler(seed).sample(Index{60});
  EXPECT_EQ(a.contexts(), b.contexts());
  EXPECT_EQ(a.queries(), b.queries());
  EXPECT_EQ(a.targets(), b.targets());
  const Batch pa = model.posterior_predictive_sampler(seed).sample(Index{60});
  const Batch pb = wide.posterior_predictive_sampler(seed).sample(Index{60});
  EXPECT_FALSE(pa.contexts() == pb.contexts() && pa.queries() == pb.queries() && pa.targets() == pb.targets());

  for (const bool predictive : {false, true}) {
    auto batch_sampler = predictive ? model.posterior_predictive_sampler(seed) : model.sampler(seed);
    auto one_sampler = predictive ? model.posterior_predictive_sampler(seed) : model.sampler(seed);
    const Batch batch = batch_sampler.sample(Index{25});
    ASSERT_EQ(batch.n_rows(), 25);
    for (Index row = 0; row < 25; ++row) {
      const VariationalEmbeddingAttentionObservation obs = one_sampler.sample();
      ASSERT_EQ(obs.context.size(), static_cast<size_t>(kN));
      for (Index i = 0; i < kN; ++i) EXPECT_EQ(batch.context(row)[i], obs.context[static_cast<size_t>(i)]);
      EXPECT_EQ(batch.query(row), obs.query);
      EXPECT_EQ(batch.target(row), obs.target);
    }
    // The next draw continues the same stream.
    const VariationalEmbeddingAttentionObservation next_one = one_sampler.sample();
    const Batch next_batch = batch_sampler.sample(Index{1});
    EXPECT_EQ(next_batch.query(0), next_one.query);
    EXPECT_EQ(next_batch.target(0), next_one.target);
  }
}

/// docs/mechanisms.md#building-blocks (as every family's sampler): sample(0) is an empty batch and a negative size
/// raises ValueError, for the plug-in and the posterior-predictive sampler.
TEST(VariationalEmbeddingAttentionTest, SamplerRejectsNegativeSize) {
  Rng rng(testing::test_seed(59));
  const Model model(random_params(kS, kN, kD, kT, rng));
  EXPECT_EQ(model.sampler(1).sample(Index{0}).n_rows(), 0);
  EXPECT_EQ(model.posterior_predictive_sampler(1).sample(Index{0}).n_rows(), 0);
  EXPECT_THROW((void)model.sampler(1).sample(Index{-1}), ValueError);
  EXPECT_THROW((void)model.posterior_predictive_sampler(1).sample(Index{-3}), ValueError);
}

/// docs/mechanisms.md#variational-embedding-attention: sampled contexts hold N distinct symbols when N ≤ S and are
/// drawn with replacement when N > S; the target frequencies equal the mean over the sampled rows of predict_proba
/// (within 5 standard errors), so targets follow the plug-in gate and emission.
TEST(VariationalEmbeddingAttentionTest, SamplerFollowsThePlugInModel) {
  Rng rng(testing::test_seed(48));
  const Params p = random_params(kS, kN, kD, kT, rng, 1.0);
  const Model model(p);
  const Index n = 20000;
  const Batch batch = model.sampler(7).sample(n);
  for (Index row = 0; row < 200; ++row) {
    std::vector<int64_t> c(batch.context(row), batch.context(row) + kN);
    std::sort(c.begin(), c.end());
    EXPECT_TRUE(std::adjacent_find(c.begin(), c.end()) == c.end()) << "row " << row;
  }
  const Vector mean_proba = model.predict_proba(batch).colwise().mean().transpose();
  for (Index t = 0; t < kT; ++t) {
    double freq = 0.0;
    for (Index row = 0; row < n; ++row) freq += batch.target(row) == t ? 1.0 : 0.0;
    freq /= static_cast<double>(n);
    const double se = std::sqrt(mean_proba[t] * (1.0 - mean_proba[t]) / static_cast<double>(n));
    EXPECT_LT(std::fabs(freq - mean_proba[t]), 5.0 * se) << "target " << t;
  }
  // N > S: with replacement (S = 3, N = 7).
  Params small = random_params(3, 7, 2, 2, rng);
  const Batch wide = Model(small).sampler(3).sample(Index{10});
  EXPECT_EQ(wide.context_length(), 7);
  for (double lp : log_densities(Model(small), wide)) EXPECT_TRUE(std::isfinite(lp));
}

// ----- estimator (VEA-7) --------------------------------------------------------------------------------------------

/// VEA-7 / docs/mechanisms.md#variational-embedding-attention: estimate is stateless: two calls on the same statistics
/// give bit-identical models; each call advances the iteration by exactly 1 (3 → 4); the state's seed is kept even when
/// the estimator's seed differs (a fresh estimator never re-randomises a trained model); the new m and log v are one
/// Adam step of the carried state (scalar oracle with λ = prior_strength, rel 1e-13), B = (emission_count + ε)
/// row-normalised and π = position_count / Σ (rel 1e-14), σ² and name from the estimator.
TEST(VariationalEmbeddingAttentionTest, EstimateIsStatelessAndTakesOneAdamStep) {
  Rng rng(testing::test_seed(49));
  const Params p = random_params(kS, kN, kD, kT, rng);
  const Model model(p);
  const Batch batch = random_variational_rows(50, kN, kS, kT, rng);
  auto acc = model.make_accumulator();
  model.accumulate(batch, weights_with_zeros(50, rng, {}), acc);
  EstimatorOptions options;
  options.lr = 0.07;
  options.prior_strength = 0.6;
  options.emission_smoothing = 0.01;
  options.sigma2 = 0.8;
  options.seed = 999;  // not the state's seed (11)
  options.name = "vea";
  const Estimator estimator(kS, kN, kD, kT, options);
  const Model first = estimator.estimate(std::nullopt, acc);
  const Model second = estimator.estimate(std::nullopt, acc);
  ExpectSameModel(first, second);
  EXPECT_EQ(first.optimizer_state().iteration, 4);
  EXPECT_EQ(first.optimizer_state().seed, 11u);
  EXPECT_EQ(first.optimizer_state().family, Model::kFamily);
  EXPECT_EQ(first.sigma2(), 0.8);
  EXPECT_EQ(first.params().name, "vea");
  EXPECT_TRUE(same_bits(first.mean(), first.optimizer_state().mean));
  EXPECT_TRUE(same_bits(first.log_var(), first.optimizer_state().log_var));

  const AttentionOptimizerState& s = *p.optimizer_state;
  Matrix exp_mean(kS, kD), exp_log_var(kS, kD), m1(kS, kD), m2(kS, kD), v1(kS, kD), v2(kS, kD);
  for (Index k = 0; k < kS * kD; ++k) {
    const double g_m = acc.grad_mean().data()[k] - 0.6 * s.mean.data()[k];
    const double g_lv = acc.grad_log_var().data()[k] - 0.6 * 0.5 * (std::exp(s.log_var.data()[k]) - 1.0);
    exp_mean.data()[k] = adam_theta(s.mean.data()[k], g_m, s.mean_first_moment.data()[k],
                                    s.mean_second_moment.data()[k], 0.07, 4, &m1.data()[k], &m2.data()[k]);
    exp_log_var.data()[k] =
        std::clamp(adam_theta(s.log_var.data()[k], g_lv, s.log_var_first_moment.data()[k],
                              s.log_var_second_moment.data()[k], 0.07, 4, &v1.data()[k], &v2.data()[k]),
                   -8.0, 2.0);
  }
  ExpectAllClose(first.mean(), exp_mean, 1e-13, 1e-15);
  ExpectAllClose(first.log_var(), exp_log_var, 1e-13, 1e-15);
  ExpectAllClose(first.optimizer_state().mean_first_moment, m1, 1e-13, 1e-15);
  ExpectAllClose(first.optimizer_state().log_var_second_moment, v2, 1e-13, 1e-15);

  Matrix exp_emission = (Matrix(acc.emission_count()).array() + 0.01).matrix();
  for (Index s_row = 0; s_row < kS; ++s_row) exp_emission.row(s_row) /= exp_emission.row(s_row).sum();
  ExpectAllClose(first.emission(), exp_emission, 1e-14, 1e-15);
  const Vector exp_prior = Vector(acc.position_count()) / acc.position_count().sum();
  ExpectAllClose(Matrix(first.position_prior()), Matrix(exp_prior), 1e-14, 1e-15);

  // model.estimator() carries the state's seed and σ² and continues the same trajectory.
  const Estimator own = model.estimator();
  EXPECT_EQ(own.options().seed, 11u);
  EXPECT_EQ(own.options().sigma2, 0.5);
  EXPECT_EQ(own.estimate(std::nullopt, acc).optimizer_state().iteration, 4);
}

/// docs/mechanisms.md#variational-embedding-attention: statistics without a state (seq_initialize) make estimate
/// initialise: m = 0.1·N(0, 1) row-major from Rng(derive_seed(seed, kInit, 0)), log v = log 0.3 everywhere, zero
/// moments, iteration 0, the estimator's seed; gradients in the statistics are ignored. With zero emission smoothing an
/// all-zero emission row is uniform (docs/porting.md), and zero position counts give a uniform π.
TEST(VariationalEmbeddingAttentionTest, StatisticsWithoutStateInitialise) {
  Rng rng(testing::test_seed(50));
  const Batch batch = random_variational_rows(20, kN, kS, kT, rng);
  Acc acc(kS, kN, kD, kT);
  Rng init_rng(5);
  acc.initialize(batch, std::vector<double>(20, 1.0), init_rng);
  ASSERT_EQ(acc.optimizer_state(), nullptr);
  acc.grad_mean().setConstant(123.0);  // ignored on the initialisation call
  EstimatorOptions options;
  options.seed = 77;
  const Model model = Estimator(kS, kN, kD, kT, options).estimate(20.0, acc);
  Rng oracle(derive_seed(77, SeedPurpose::kInit, 0));
  Matrix exp_mean(kS, kD);
  for (Index k = 0; k < exp_mean.size(); ++k) exp_mean.data()[k] = 0.1 * oracle.normal();
  EXPECT_TRUE(same_bits(model.mean(), exp_mean));
  EXPECT_TRUE(same_bits(model.log_var(), Matrix::Constant(kS, kD, std::log(0.3))));
  const AttentionOptimizerState& s = model.optimizer_state();
  EXPECT_EQ(s.iteration, 0);
  EXPECT_EQ(s.seed, 77u);
  EXPECT_TRUE(s.mean_first_moment.isZero(0.0) && s.mean_second_moment.isZero(0.0) &&
              s.log_var_first_moment.isZero(0.0) && s.log_var_second_moment.isZero(0.0));

  // Zero smoothing: zero-total rows uniform; zero position counts uniform.
  Acc empty(kS, kN, kD, kT);
  EstimatorOptions none;
  none.emission_smoothing = 0.0;
  const Model uniform = Estimator(kS, kN, kD, kT, none).estimate(0.0, empty);
  EXPECT_TRUE(uniform.emission().isApprox(Matrix::Constant(kS, kT, 1.0 / kT), 1e-15));
  EXPECT_TRUE(Matrix(uniform.position_prior()).isApprox(Matrix::Constant(kN, 1, 1.0 / kN), 1e-15));
}

/// docs/mechanisms.md#variational-embedding-attention seq_initialize: for every row, in row order, a_n ~ Dirichlet(1_N)
/// from the caller's rng (zero-weight rows still draw), scaled by w_n and added to emission_count[c_ni, t_n] and
/// position_count[i]; n += Σ w; gradients and ll stay zero and no state is attached (rel 1e-14 against the same draws).
TEST(VariationalEmbeddingAttentionTest, InitializeDrawsDirichletInRowOrder) {
  Rng rng(testing::test_seed(51));
  const Batch batch = random_variational_rows(15, kN, kS, kT, rng);
  const std::vector<double> w = weights_with_zeros(15, rng, {2, 9});
  Acc acc(kS, kN, kD, kT);
  Rng draws(31);
  acc.initialize(batch, w, draws);
  Rng oracle(31);
  Matrix emission = Matrix::Zero(kS, kT);
  Vector position = Vector::Zero(kN);
  double n = 0.0;
  for (Index row = 0; row < 15; ++row) {
    const Vector a = dirichlet(kN, oracle);
    const double wn = w[static_cast<size_t>(row)];
    for (Index i = 0; i < kN; ++i) {
      emission(batch.context(row)[i], batch.target(row)) += wn * a[i];
      position[i] += wn * a[i];
    }
    n += wn;
  }
  ExpectAllClose(Matrix(acc.emission_count()), emission, 1e-14, 1e-15);
  ExpectAllClose(Matrix(acc.position_count()), Matrix(position), 1e-14, 1e-15);
  EXPECT_NEAR(acc.n(), n, 1e-13);
  EXPECT_TRUE(Matrix(acc.grad_mean()).isZero(0.0));
  EXPECT_TRUE(Matrix(acc.grad_log_var()).isZero(0.0));
  EXPECT_EQ(acc.ll(), 0.0);
  EXPECT_EQ(acc.optimizer_state(), nullptr);
  EXPECT_EQ(draws.next_u64(), oracle.next_u64());  // the same number of draws
}

/// VEA-7 / docs/mechanisms.md#variational-embedding-attention: estimate rejects statistics carrying a state of the
/// other family (same geometry) or of another geometry (S or D), with ValueError, and rejects nobs ≠ n ("cannot exceed"
/// / "must equal").
TEST(VariationalEmbeddingAttentionTest, EstimateRejectsForeignStates) {
  Rng rng(testing::test_seed(52));
  const Model model(random_params(kS, kN, kD, kT, rng));
  auto acc = model.make_accumulator();
  model.accumulate(random_variational_rows(10, kN, kS, kT, rng), std::vector<double>(10, 1.0), acc);
  const Estimator estimator(kS, kN, kD, kT);
  ASSERT_NO_THROW((void)estimator.estimate(std::nullopt, acc));
  ASSERT_NO_THROW((void)estimator.estimate(10.0, acc));

  AttentionOptimizerState other = model.optimizer_state();
  other.family = "variational_multihop_attention";
  Acc foreign = acc;
  foreign.set_optimizer_state(std::make_shared<const AttentionOptimizerState>(other));
  ExpectThrowWith([&] { (void)estimator.estimate(std::nullopt, foreign); }, {"variational_multihop_attention"},
                  "other family");
  for (const auto& [rows, cols] : std::vector<std::pair<Index, Index>>{{kS + 1, kD}, {kS, kD + 1}}) {
    Acc wrong = acc;
    wrong.set_optimizer_state(std::make_shared<const AttentionOptimizerState>(AttentionOptimizerState::fresh(
        Model::kFamily, Matrix::Zero(rows, cols), Matrix::Zero(rows, cols), 11)));
    EXPECT_THROW((void)estimator.estimate(std::nullopt, wrong), ValueError) << rows << "x" << cols;
  }
  ExpectThrowWith([&] { (void)estimator.estimate(9.0, acc); }, {"nobs"}, "nobs below n");
  ExpectThrowWith([&] { (void)estimator.estimate(11.0, acc); }, {"nobs"}, "nobs above n");
  // Statistics of another layout.
  EXPECT_THROW((void)estimator.estimate(std::nullopt, Acc(kS, kN + 1, kD, kT)), ValueError);
}

/// VEA-7 / docs/mechanisms.md#variational-embedding-attention: statistics carrying different optimizer states never
/// combine: combine raises ValueError containing "cannot combine attention statistics from different optimizer states"
/// and changes nothing, as does an E-step of another model into them, and combining E-step statistics with state-free
/// (initialisation) statistics.
/// Equal states held by different objects (two models built from the same parameters) combine.
TEST(VariationalEmbeddingAttentionTest, CombineRejectsDifferentOptimizerStates) {
  Rng rng(testing::test_seed(53));
  const Params p = random_params(kS, kN, kD, kT, rng);
  const Model model(p);
  const Model twin(p);
  Params q = p;
  q.optimizer_state->iteration += 1;  // the same arrays, another iteration
  const Model later(q);
  const Batch batch = random_variational_rows(10, kN, kS, kT, rng);
  const std::vector<double> ones(10, 1.0);
  auto a = model.make_accumulator();
  model.accumulate(batch, ones, a);
  auto b = later.make_accumulator();
  later.accumulate(batch, ones, b);
  auto t = twin.make_accumulator();
  twin.accumulate(batch, ones, t);
  const std::vector<double> before = packed(a);

  ExpectThrowWith([&] { a.combine(b); }, {kDifferentStates}, "combine");
  ExpectThrowWith([&] { later.accumulate(batch, ones, a); }, {kDifferentStates}, "accumulate");
  ExpectThrowWith([&] { AnyAccumulator(a).combine(AnyAccumulator(b)); }, {kDifferentStates}, "AnyAccumulator");
  Acc init(kS, kN, kD, kT);
  Rng init_rng(1);
  init.initialize(batch, ones, init_rng);
  ExpectThrowWith([&] { a.combine(init); }, {kDifferentStates}, "combine with state-free statistics");
  EXPECT_EQ(packed(a), before);
  EXPECT_TRUE(*a.optimizer_state() == *p.optimizer_state);

  ASSERT_NO_THROW(a.combine(t));
  for (size_t k = 0; k < before.size(); ++k) EXPECT_EQ(packed(a)[k], 2.0 * before[k]);
  // from_value replaces the state.
  a.from_value(b);
  EXPECT_TRUE(*a.optimizer_state() == *q.optimizer_state);
}

/// VEA-7 / docs/mechanisms.md#variational-embedding-attention: restart equivalence: 60 EM steps (em_step) from an
/// initial model equal 30 steps, a save/load round trip of the model file (model_to_json → text → model_from_json),
/// then 30 more steps — bit for bit, state included. The reloaded model equals the saved one bit for bit and has
/// iteration 30.
TEST(VariationalEmbeddingAttentionTest, RestartFromSavedModelContinuesBitForBit) {
  Rng rng(testing::test_seed(54));
  const Model truth(random_params(kS, kN, kD, kT, rng, 1.5));
  const Batch batch = truth.sampler(rng.next_u64()).sample(Index{150});
  EstimatorOptions options;
  options.lr = 0.05;
  options.mc = 3;
  options.seed = 8;
  const Estimator estimator(kS, kN, kD, kT, options);
  OptimizeOptions init;
  init.seed = 3;
  init.init_p = 0.5;
  const ParallelOptions parallel{1, 64};  // several chunks, one thread (thread counts are covered by VEA-8)
  const Model start = initialize_model(batch, estimator, init);
  Model straight = start;
  for (int i = 0; i < 60; ++i) straight = em_step(straight, batch, estimator, {}, parallel);
  EXPECT_EQ(straight.optimizer_state().iteration, 60);

  Model half = start;
  for (int i = 0; i < 30; ++i) half = em_step(half, batch, estimator, {}, parallel);
  const Model loaded = reload(half);
  ExpectSameModel(loaded, half);
  EXPECT_EQ(loaded.optimizer_state().iteration, 30);
  Model resumed = loaded;
  for (int i = 0; i < 30; ++i) resumed = em_step(resumed, batch, estimator, {}, parallel);
  ExpectSameModel(resumed, straight);
}

/// docs/mechanisms.md#variational-embedding-attention: optimize(prev_estimate = model) continues the Adam trajectory
/// instead of re-initialising: the first reported score is that of the given model, and the returned model is bit for
/// bit one of the iterates model, em_step(model), em_step²(model), … (the one at best_iteration).
TEST(VariationalEmbeddingAttentionTest, OptimizeWithPrevEstimateContinuesTrajectory) {
  Rng rng(testing::test_seed(55));
  const Model truth(random_params(kS, kN, kD, kT, rng, 1.5));
  const Batch batch = truth.sampler(rng.next_u64()).sample(Index{100});
  const Estimator estimator(kS, kN, kD, kT);
  OptimizeOptions options;
  options.max_its = 6;
  options.delta = std::nullopt;
  options.seed = 4;
  Model mid = optimize(batch, estimator, options).model;
  for (int i = 0; i < 5; ++i) mid = em_step(mid, batch, estimator, {}, {});
  std::vector<Model> chain{mid};
  for (int i = 0; i < 6; ++i) chain.push_back(em_step(chain.back(), batch, estimator, {}, {}));
  std::vector<double> reported;
  options.on_iteration = [&](const IterationReport& r) { reported.push_back(r.log_likelihood); };
  const auto resumed = optimize(batch, estimator, options, mid);
  ASSERT_EQ(reported.size(), 6u);
  EXPECT_EQ(reported[0], score(mid, batch, {}));
  EXPECT_EQ(resumed.n_iterations, 6);
  ASSERT_GE(resumed.best_iteration, 1);
  ASSERT_LE(resumed.best_iteration, 7);
  ExpectSameModel(resumed.model, chain[static_cast<size_t>(resumed.best_iteration - 1)]);
  EXPECT_EQ(resumed.model.optimizer_state().iteration,
            mid.optimizer_state().iteration + resumed.best_iteration - 1);
}

// ----- parallel E-step (VEA-8) -------------------------------------------------------------------------------------

/// VEA-8 / docs/mechanisms.md#training: 1 chunk vs 7 chunks of parallel_accumulate give equal statistics (rel 1e-12,
/// every field) because every chunk uses the same noise tables; 1, 2, 3 and 8 threads give bitwise-identical packed
/// statistics, log densities and the same attached state.
TEST(VariationalEmbeddingAttentionTest, ChunkIndependenceAndThreadCountInvariance) {
  Rng rng(testing::test_seed(56));
  const Model model(random_params(kS, kN, kD, kT, rng));
  const Index n = 70;
  const Batch batch = random_variational_rows(n, kN, kS, kT, rng);
  const std::vector<double> w = weights_with_zeros(n, rng, {5, 40});
  auto one_chunk = model.make_accumulator();
  parallel_accumulate(model, batch, w, one_chunk, {}, ParallelOptions{1, n});
  std::vector<std::vector<double>> stats, log_ps;
  for (const int threads : {1, 2, 3, 8}) {
    auto acc = model.make_accumulator();
    std::vector<double> log_p(static_cast<size_t>(n));
    parallel_accumulate(model, batch, w, acc, log_p, ParallelOptions{threads, 10});  // 7 chunks
    if (threads == 1) ExpectFieldsClose(acc, one_chunk, 1e-12);
    ASSERT_NE(acc.optimizer_state(), nullptr);
    EXPECT_TRUE(*acc.optimizer_state() == model.optimizer_state());
    stats.push_back(packed(acc));
    log_ps.push_back(log_p);
  }
  for (size_t k = 1; k < stats.size(); ++k) {
    EXPECT_EQ(stats[k], stats[0]) << "thread setting " << k;
    EXPECT_EQ(log_ps[k], log_ps[0]) << "thread setting " << k;
  }
  auto serial = model.make_accumulator();
  model.accumulate(batch, w, serial);
  ExpectFieldsClose(serial, one_chunk, 1e-12);
}

// ----- validation (C-5) ---------------------------------------------------------------------------------------------

/// C-5 / docs/mechanisms.md#variational-embedding-attention: the constructor rejects (ValueError naming the field)
/// empty, non-finite or mismatched mean and log_var, log_var whose exp overflows, a non-simplex or wrongly shaped
/// emission, a non-simplex position prior, a non-positive or non-finite σ², and a supplied optimizer state of another
/// family, another geometry, or whose mean/log_var differ by one ulp.
TEST(VariationalEmbeddingAttentionTest, ConstructorRejectsInvalidParameters) {
  Rng rng(testing::test_seed(57));
  const Params good = random_params(kS, kN, kD, kT, rng);
  ASSERT_NO_THROW(Model{good});
  Params no_state = good;
  no_state.optimizer_state.reset();
  const Model defaulted(no_state);
  EXPECT_TRUE(defaulted.optimizer_state() ==
              AttentionOptimizerState::fresh(Model::kFamily, good.mean, good.log_var, 0));

  const auto expect_bad = [&](const std::string& field, auto&& mutate) {
    Params p = good;
    mutate(p);
    ExpectThrowWith([&] { Model m(p); }, {field}, "field " + field);
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  expect_bad("mean", [](Params& p) { p.mean = Matrix(0, 0); p.log_var = Matrix(0, 0); p.optimizer_state.reset(); });
  expect_bad("mean", [&](Params& p) { p.mean(1, 1) = nan; p.optimizer_state.reset(); });
  expect_bad("log_var", [&](Params& p) { p.log_var(0, 2) = inf; p.optimizer_state.reset(); });
  expect_bad("log_var", [](Params& p) { p.log_var = Matrix::Zero(kS, kD + 1); p.optimizer_state.reset(); });
  expect_bad("log_var", [](Params& p) { p.log_var(2, 0) = 1000.0; p.optimizer_state.reset(); });
  expect_bad("emission", [](Params& p) { p.emission(0, 0) += 1e-9; });
  expect_bad("emission", [](Params& p) { p.emission = Matrix::Constant(kS + 1, kT, 1.0 / kT); });
  expect_bad("emission", [](Params& p) { p.emission(1, 0) = -p.emission(1, 0); });
  expect_bad("position_prior", [](Params& p) { p.position_prior[0] += 1e-9; });
  expect_bad("position_prior", [](Params& p) { p.position_prior = Vector(0); });
  for (const double bad : {0.0, -1.0, nan, inf}) expect_bad("sigma2", [&](Params& p) { p.sigma2 = bad; });
  expect_bad("optimizer_state", [](Params& p) { p.optimizer_state->family = "variational_multihop_attention"; });
  expect_bad("optimizer_state", [](Params& p) {
    p.optimizer_state = AttentionOptimizerState::fresh(Model::kFamily, Matrix::Zero(kS, kD + 1),
                                                       Matrix::Zero(kS, kD + 1), 0);
  });
  expect_bad("optimizer_state", [](Params& p) {
    p.optimizer_state->mean(0, 0) = std::nextafter(p.optimizer_state->mean(0, 0), 1e300);
  });
  expect_bad("optimizer_state", [](Params& p) {
    p.optimizer_state->log_var(1, 1) = std::nextafter(p.optimizer_state->log_var(1, 1), -1e300);
  });
  expect_bad("iteration", [](Params& p) { p.optimizer_state->iteration = -1; });
}

/// C-5 / docs/mechanisms.md#variational-embedding-attention: the estimator and the accumulator reject non-positive
/// dimensions and mc, non-positive or non-finite lr and σ², and negative or non-finite prior_strength and
/// emission_smoothing (ValueError naming the option); zero prior_strength and zero smoothing are accepted.
TEST(VariationalEmbeddingAttentionTest, EstimatorOptionsAreValidated) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const auto expect_bad = [&](const std::string& field, auto&& mutate) {
    EstimatorOptions o;
    mutate(o);
    ExpectThrowWith([&] { Estimator e(kS, kN, kD, kT, o); }, {field}, "option " + field);
  };
  for (const int64_t bad : {0, -2}) expect_bad("mc", [&](EstimatorOptions& o) { o.mc = bad; });
  for (const double bad : {0.0, -0.1, nan, inf}) {
    expect_bad("lr", [&](EstimatorOptions& o) { o.lr = bad; });
    expect_bad("sigma2", [&](EstimatorOptions& o) { o.sigma2 = bad; });
  }
  for (const double bad : {-1e-9, nan, inf}) {
    expect_bad("prior_strength", [&](EstimatorOptions& o) { o.prior_strength = bad; });
    expect_bad("emission_smoothing", [&](EstimatorOptions& o) { o.emission_smoothing = bad; });
  }
  EstimatorOptions zero;
  zero.prior_strength = 0.0;
  zero.emission_smoothing = 0.0;
  EXPECT_NO_THROW(Estimator(kS, kN, kD, kT, zero));
  EXPECT_THROW(Estimator(0, kN, kD, kT), ValueError);
  EXPECT_THROW(Estimator(kS, 0, kD, kT), ValueError);
  EXPECT_THROW(Estimator(kS, kN, -1, kT), ValueError);
  EXPECT_THROW(Estimator(kS, kN, kD, 0), ValueError);
  ExpectThrowWith([] { Acc a(kS, kN, kD, kT, 0); }, {"mc"}, "accumulator mc");
  EXPECT_THROW(Acc(0, kN, kD, kT), ValueError);
  EXPECT_THROW(Acc(kS, kN, 0, kT), ValueError);
  // Defaults (docs/mechanisms.md#variational-embedding-attention).
  const EstimatorOptions d;
  EXPECT_EQ(d.sigma2, 0.5);
  EXPECT_EQ(d.lr, 0.05);
  EXPECT_EQ(d.mc, 6);
  EXPECT_EQ(d.prior_strength, 1.0);
  EXPECT_EQ(d.emission_smoothing, 1e-4);
  EXPECT_EQ(d.seed, 0u);
  EXPECT_EQ(Estimator(kS, kN, kD, kT).make_accumulator().mc(), 6);
}

/// C-5 / docs/mechanisms.md#building-blocks and #variational-embedding-attention: the encoder rejects negative and
/// out-of-range context, query and target ids ("out-of-range ID"), a context width other than the declared N, a zero
/// width, and rows of unequal counts; a batch of an undeclared encoder with ids beyond the model's S or T, or another
/// width, is rejected by log_density, accumulate, predict_proba and log_density_at; bad weights (negative, NaN, wrong
/// length) raise ValueError.
TEST(VariationalEmbeddingAttentionTest, InvalidIdsShapesAndWeightsAreRejected) {
  const Encoder declared{kS, kN, kT};
  const auto expect_oor = [](auto&& f, const std::string& context) {
    ExpectThrowWith([&] { (void)f(); }, {"out-of-range ID"}, context);
  };
  expect_oor([&] { return rows_from({{0, 1, 2, 5}}, {0}, {0}, declared); }, "context = S");
  expect_oor([&] { return rows_from({{0, 1, -1, 2}}, {0}, {0}, declared); }, "negative context");
  expect_oor([&] { return rows_from({{0, 1, 2, 3}}, {5}, {0}, declared); }, "query = S");
  expect_oor([&] { return rows_from({{0, 1, 2, 3}}, {-1}, {0}, declared); }, "negative query");
  expect_oor([&] { return rows_from({{0, 1, 2, 3}}, {0}, {4}, declared); }, "target = T");
  expect_oor([&] { return rows_from({{0, 1, 2, 3}}, {0}, {-2}, declared); }, "negative target");
  expect_oor([&] { return rows_from({{0, 1, 2, 3}}, {0}, {-2}); }, "negative target, undeclared");
  ExpectThrowWith([&] { (void)rows_from({{0, 1, 2}}, {0}, {0}, declared); }, {"N"}, "declared width");
  EXPECT_THROW((void)Encoder{}.encode(IdMatrix(2, 0), IdVector::Zero(2), IdVector::Zero(2)), ValueError);
  EXPECT_THROW((void)Encoder{}.encode(IdMatrix::Zero(2, 3), IdVector::Zero(3), IdVector::Zero(2)), ValueError);
  EXPECT_THROW((void)Encoder{}.encode(IdMatrix::Zero(2, 3), IdVector::Zero(2), IdVector::Zero(1)), ValueError);

  Rng rng(testing::test_seed(58));
  const Model model(random_params(kS, kN, kD, kT, rng));
  const Batch big_symbol = rows_from({{0, 1, 2, 7}}, {0}, {0});
  const Batch big_query = rows_from({{0, 1, 2, 3}}, {9}, {0});
  const Batch big_target = rows_from({{0, 1, 2, 3}}, {0}, {4});
  const Batch narrow = rows_from({{0, 1, 2}}, {0}, {0});
  std::vector<double> out(1);
  const std::vector<double> one{1.0};
  for (const Batch* b : {&big_symbol, &big_query, &big_target}) {
    auto acc = model.make_accumulator();
    expect_oor([&] { model.log_density(*b, out); return 0; }, "log_density");
    expect_oor([&] { model.accumulate(*b, one, acc); return 0; }, "accumulate");
    expect_oor([&] { return model.predict_proba(*b); }, "predict_proba");
    expect_oor([&] { return model.log_density_at(model.mean(), *b, 0); }, "log_density_at");
    EXPECT_EQ(packed(acc), packed(model.make_accumulator()));
  }
  auto acc = model.make_accumulator();
  EXPECT_THROW(model.log_density(narrow, out), ValueError);
  EXPECT_THROW(model.accumulate(narrow, one, acc), ValueError);
  EXPECT_THROW((void)model.predict_proba(narrow), ValueError);
  const Batch ok = random_variational_rows(3, kN, kS, kT, rng);
  for (const std::vector<double>& bad : {std::vector<double>{1.0, -1.0, 1.0}, std::vector<double>{1.0, std::nan(""), 1.0},
                                         std::vector<double>{1.0, 1.0}}) {
    EXPECT_THROW(model.accumulate(ok, bad, acc), ValueError);
  }
  EXPECT_THROW((void)model.log_density_at(Matrix::Zero(kS, kD + 1), ok, 0), ValueError);
  Acc other_layout(kS + 1, kN, kD, kT);
  EXPECT_THROW(model.accumulate(ok, std::vector<double>(3, 1.0), other_layout), ValueError);
  EXPECT_EQ(packed(acc), packed(model.make_accumulator()));
}

}  // namespace
}  // namespace attnmix
