// SPDX-License-Identifier: Apache-2.0
// Variational multi-hop attention: the unit acceptance row VMHA-2 (the mechanics of VEA-1, VEA-4 … VEA-8 for
// the two-hop family) and the formulas of docs/mechanisms.md#variational-multi-hop-attention against independent
// oracles.
//
// Oracles written here, from docs/mechanisms.md#variational-multi-hop-attention and not from the library's internals
// (only parameters are read):
//   * enumerate_paths: the two-hop model summed over all N² paths (i, j) in log space, giving log p, the gates a1 and
//     a2, and the path posterior ρ_ij;
//   * oracle_noise / oracle_statistics: the Monte-Carlo E-step sums (ll, emission counts, n) over noise drawn
//     directly from Rng(derive_seed(seed, kMcNoise, τ));
//   * central finite differences of the fixed-noise objective (the accumulator's ll) for the data gradient;
//   * scalar Adam with the annealed KL weight λ_τ = prior_strength · min(1, τ / max(1, anneal_iters)).
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

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/reduce.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;
using Params = VariationalMultiHopAttentionParams;
using Model = VariationalMultiHopAttention;
using Acc = VariationalMultiHopAttentionAccumulator;
using Batch = ChainedAttentionBatch;
using Encoder = ChainedAttentionEncoder;
using Estimator = VariationalMultiHopAttentionEstimator;
using EstimatorOptions = VariationalMultiHopAttentionEstimatorOptions;
constexpr double kNegInfinity = -std::numeric_limits<double>::infinity();
constexpr const char* kDifferentStates = "cannot combine attention statistics from different optimizer states";

// ----- helpers and oracles -----------------------------------------------------------------------------------------

Matrix random_matrix(Index rows, Index cols, double scale, Rng& rng) {
  Matrix m(rows, cols);
  for (Index k = 0; k < m.size(); ++k) m.data()[k] = scale * rng.normal();
  return m;
}

bool same_bits(const Matrix& a, const Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * static_cast<size_t>(a.size())) == 0;
}

/// A valid model's parameters: mean mean_scale·N(0, 1), log v = log 0.3 + 0.4·N(0, 1), emission rows Dirichlet(1_T)
/// (all entries > 0), σ² 0.3, and an optimizer state with seed 13, iteration 2 and non-zero moments.
Params random_params(Index S, Index D, Index T, Rng& rng, double mean_scale = 1.0) {
  Params p;
  p.mean = random_matrix(S, D, mean_scale, rng);
  p.log_var = (random_matrix(S, D, 0.4, rng).array() + std::log(0.3)).matrix();
  p.emission.resize(S, T);
  for (Index s = 0; s < S; ++s) rng.dirichlet_ones({p.emission.data() + s * T, static_cast<size_t>(T)});
  p.sigma2 = 0.3;
  AttentionOptimizerState state = AttentionOptimizerState::fresh(Model::kFamily, p.mean, p.log_var, 13);
  state.iteration = 2;
  state.mean_first_moment = random_matrix(S, D, 0.1, rng);
  state.mean_second_moment = random_matrix(S, D, 0.1, rng).cwiseAbs2();
  state.log_var_first_moment = random_matrix(S, D, 0.1, rng);
  state.log_var_second_moment = random_matrix(S, D, 0.1, rng).cwiseAbs2();
  p.optimizer_state = std::move(state);
  return p;
}

/// The model of `base` with other embeddings; the optimizer state keeps seed, iteration and moments (same noise ε).
Model with_embeddings(const Params& base, const Matrix& mean, const Matrix& log_var) {
  Params p = base;
  p.mean = mean;
  p.log_var = log_var;
  p.optimizer_state->mean = mean;
  p.optimizer_state->log_var = log_var;
  return Model(std::move(p));
}

/// n rows: keys, values, queries uniform over [S] (repeats allowed), targets uniform over [T].
Batch random_rows(Index n, Index N, Index S, Index T, Rng& rng) {
  IdMatrix keys(n, N), values(n, N);
  IdVector queries(n), targets(n);
  for (Index k = 0; k < keys.size(); ++k) keys.data()[k] = static_cast<int64_t>(rng.uniform_int(S));
  for (Index k = 0; k < values.size(); ++k) values.data()[k] = static_cast<int64_t>(rng.uniform_int(S));
  for (Index k = 0; k < n; ++k) {
    queries[k] = static_cast<int64_t>(rng.uniform_int(S));
    targets[k] = static_cast<int64_t>(rng.uniform_int(T));
  }
  return Encoder{S, T}.encode(keys, values, queries, targets);
}

Batch rows_from(const std::vector<std::vector<int64_t>>& keys, const std::vector<std::vector<int64_t>>& values,
                const std::vector<int64_t>& queries, const std::vector<int64_t>& targets,
                const Encoder& encoder = {}) {
  const auto n = static_cast<Index>(keys.size());
  const auto N = static_cast<Index>(keys.front().size());
  IdMatrix k(n, N), v(n, static_cast<Index>(values.front().size()));
  IdVector q(n), t(n);
  for (Index r = 0; r < n; ++r) {
    for (Index i = 0; i < N; ++i) k(r, i) = keys[static_cast<size_t>(r)][static_cast<size_t>(i)];
    for (Index i = 0; i < v.cols(); ++i) v(r, i) = values[static_cast<size_t>(r)][static_cast<size_t>(i)];
    q[r] = queries[static_cast<size_t>(r)];
    t[r] = targets[static_cast<size_t>(r)];
  }
  return encoder.encode(k, v, q, t);
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

double squared(const Matrix& E, int64_t a, int64_t b) {
  double sq = 0.0;
  for (Index d = 0; d < E.cols(); ++d) {
    const double diff = E(a, d) - E(b, d);
    sq += diff * diff;
  }
  return sq;
}

/// Oracle (docs/mechanisms.md#variational-multi-hop-attention): every path (i, j) of one row at table E, in log space:
///   log a1_i = −‖E[q] − E[k_i]‖²/(2σ²) − LSE_i′(…),  log a2_ij = −‖E[v_i] − E[k_j]‖²/(2σ²) − LSE_j′(…),
///   log p = LSE_{i,j}(log a1_i + log a2_ij + log B[v_j, t]),  ρ_ij = exp(… − log p),  r_j = Σ_i ρ_ij.
struct PathOracle {
  double log_p = 0.0;
  Vector a1;
  Matrix a2, rho;
};
PathOracle enumerate_paths(const Params& p, const Matrix& E, const Batch& batch, Index row) {
  const Index N = batch.context_length();
  const int64_t* k = batch.keys(row);
  const int64_t* v = batch.values(row);
  const int64_t q = batch.query(row), t = batch.target(row);
  std::vector<double> l1(static_cast<size_t>(N));
  for (Index i = 0; i < N; ++i) l1[static_cast<size_t>(i)] = -squared(E, q, k[i]) / (2.0 * p.sigma2);
  const double z1 = reference_lse(l1);
  PathOracle out;
  out.a1.resize(N);
  out.a2.resize(N, N);
  out.rho = Matrix::Zero(N, N);
  Matrix log_path(N, N);
  std::vector<double> all;
  for (Index i = 0; i < N; ++i) {
    out.a1[i] = std::exp(l1[static_cast<size_t>(i)] - z1);
    std::vector<double> l2(static_cast<size_t>(N));
    for (Index j = 0; j < N; ++j) l2[static_cast<size_t>(j)] = -squared(E, v[i], k[j]) / (2.0 * p.sigma2);
    const double z2 = reference_lse(l2);
    for (Index j = 0; j < N; ++j) {
      out.a2(i, j) = std::exp(l2[static_cast<size_t>(j)] - z2);
      log_path(i, j) = (l1[static_cast<size_t>(i)] - z1) + (l2[static_cast<size_t>(j)] - z2) +
                       std::log(p.emission(v[j], t));
      all.push_back(log_path(i, j));
    }
  }
  out.log_p = reference_lse(all);
  if (out.log_p != kNegInfinity)
    for (Index i = 0; i < N; ++i)
      for (Index j = 0; j < N; ++j) out.rho(i, j) = std::exp(log_path(i, j) - out.log_p);
  return out;
}

/// Oracle (docs/mechanisms.md#variational-embedding-attention): the mc noise tables of (seed, iteration), N(0, 1)
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

/// Oracle (docs/mechanisms.md#variational-multi-hop-attention): ll = (1/mc) Σ_k Σ_n w_n log p(E_k), emission_count[v_j,
/// t] += w r_j / mc, n = Σ w.
struct OracleStats {
  Matrix emission_count;
  double ll = 0.0;
  double n = 0.0;
};
OracleStats oracle_statistics(const Params& p, const Batch& batch, const std::vector<double>& w, int64_t mc) {
  OracleStats out{Matrix::Zero(p.mean.rows(), p.emission.cols()), 0.0, 0.0};
  const Matrix s_std = (0.5 * p.log_var.array()).exp().matrix();
  const double inv_mc = 1.0 / static_cast<double>(mc);
  for (const Matrix& eps : oracle_noise(*p.optimizer_state, mc)) {
    const Matrix E = p.mean + s_std.cwiseProduct(eps);
    for (Index row = 0; row < batch.n_rows(); ++row) {
      const double wn = w[static_cast<size_t>(row)];
      if (wn == 0.0) continue;
      const PathOracle o = enumerate_paths(p, E, batch, row);
      out.ll += wn * o.log_p * inv_mc;
      for (Index j = 0; j < batch.context_length(); ++j)
        out.emission_count(batch.values(row)[j], batch.target(row)) += wn * o.rho.col(j).sum() * inv_mc;
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

void ExpectFieldsClose(const Acc& actual, const Acc& expected, double rel) {
  ExpectRel(Matrix(actual.grad_mean()), Matrix(expected.grad_mean()), rel, "grad_mean");
  ExpectRel(Matrix(actual.grad_log_var()), Matrix(expected.grad_log_var()), rel, "grad_log_var");
  ExpectRel(Matrix(actual.emission_count()), Matrix(expected.emission_count()), rel, "emission_count");
  ExpectRel(actual.ll(), expected.ll(), rel, "ll");
  ExpectRel(actual.n(), expected.n(), rel, "n");
}

void ExpectSameModel(const Model& actual, const Model& expected) {
  EXPECT_TRUE(same_bits(actual.mean(), expected.mean()));
  EXPECT_TRUE(same_bits(actual.log_var(), expected.log_var()));
  EXPECT_TRUE(same_bits(actual.emission(), expected.emission()));
  EXPECT_EQ(actual.sigma2(), expected.sigma2());
  EXPECT_EQ(actual.params().name, expected.params().name);
  EXPECT_TRUE(actual.optimizer_state() == expected.optimizer_state());
}

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

double adam_theta(double theta, double g, double m1, double m2, double lr, int64_t tau) {
  m1 = 0.9 * m1 + 0.1 * g;
  m2 = 0.999 * m2 + 0.001 * g * g;
  const double m_hat = m1 / (1.0 - std::pow(0.9, static_cast<double>(tau)));
  const double v_hat = m2 / (1.0 - std::pow(0.999, static_cast<double>(tau)));
  return theta + lr * m_hat / (std::sqrt(v_hat) + 1e-8);
}

/// The model reloaded from its model file (docs/model-format.md) through text.
Model reload(const Model& model) {
  const nlohmann::json doc = model_to_json(AnyDistribution(model));
  const AnyDistribution loaded = model_from_json(nlohmann::json::parse(doc.dump()), "restart.json");
  const Model* concrete = loaded.get_if<Model>();
  if (concrete == nullptr) throw std::runtime_error("the reloaded model is not a VariationalMultiHopAttention");
  return *concrete;
}

constexpr Index kS = 6, kD = 3, kT = 4, kN = 4;

// ----- plug-in density, posterior and prediction --------------------------------------------------------------------

/// docs/mechanisms.md#variational-multi-hop-attention: log_density at E = m equals the enumeration over all (i, j)
/// paths (rel 1e-12) for context widths N = 1, 2, 4, 7 with repeated symbols (the free width of
/// docs/mechanisms.md#variational-multi-hop-attention: one model scores every width); every row is finite.
TEST(VariationalMultiHopAttentionTest, PlugInLogDensityMatchesPathEnumeration) {
  Rng rng(testing::test_seed(61));
  const Params p = random_params(kS, kD, kT, rng, 1.3);
  const Model model(p);
  for (const Index N : {1, 2, 4, 7}) {
    const Batch batch = random_rows(25, N, kS, kT, rng);
    const std::vector<double> log_p = log_densities(model, batch);
    for (Index row = 0; row < batch.n_rows(); ++row) {
      ExpectRel(log_p[static_cast<size_t>(row)], enumerate_paths(p, p.mean, batch, row).log_p, 1e-12,
                "N " + std::to_string(N) + " row " + std::to_string(row));
      EXPECT_TRUE(std::isfinite(log_p[static_cast<size_t>(row)]));
    }
  }
}

/// docs/mechanisms.md#variational-multi-hop-attention: posterior_at an arbitrary table returns log p (rel 1e-12), the
/// gates a1 [N] and a2 [N, N] and the path posterior ρ [N, N] of the enumeration (atol 1e-12); a1, each row of a2 and ρ
/// sum to 1.
TEST(VariationalMultiHopAttentionTest, PosteriorAtMatchesEnumeration) {
  Rng rng(testing::test_seed(62));
  const Params p = random_params(kS, kD, kT, rng);
  const Model model(p);
  const Batch batch = random_rows(20, 5, kS, kT, rng);
  for (int table_kind = 0; table_kind < 2; ++table_kind) {
    const Matrix table = table_kind == 0 ? p.mean : random_matrix(kS, kD, 2.0, rng);
    for (Index row = 0; row < batch.n_rows(); ++row) {
      const VariationalMultiHopPosterior post = model.posterior_at(table, batch, row);
      const PathOracle o = enumerate_paths(p, table, batch, row);
      SCOPED_TRACE("table " + std::to_string(table_kind) + " row " + std::to_string(row));
      ExpectRel(post.log_p, o.log_p, 1e-12, "log_p");
      ExpectAllClose(Matrix(post.hop1), Matrix(o.a1), 0.0, 1e-12);
      ExpectAllClose(post.hop2, o.a2, 0.0, 1e-12);
      ExpectAllClose(post.joint, o.rho, 0.0, 1e-12);
      EXPECT_NEAR(post.joint.sum(), 1.0, 1e-12);
      EXPECT_NEAR(post.hop1.sum(), 1.0, 1e-12);
    }
  }
}

/// docs/mechanisms.md#variational-multi-hop-attention (exact log space): far-apart embeddings (gate logits ≈ −10⁴) and
/// an emission entry of 1e-300 give a finite log p far below log(1e-250) equal to the log-space enumeration (rel
/// 1e-12), never −∞ or a floor; the E-step statistics stay finite and keep the mass law.
TEST(VariationalMultiHopAttentionTest, ExtremeRowsMatchLogSpaceEnumeration) {
  Params p;
  p.mean = Matrix::Zero(3, 1);
  p.mean(1, 0) = 40.0;
  p.mean(2, 0) = -40.0;
  p.log_var = Matrix::Constant(3, 1, -8.0);
  p.emission.resize(3, 2);
  p.emission << 1.0, 1e-300, 0.5, 0.5, 0.5, 0.5;
  p.sigma2 = 0.1;
  const Model model(p);
  // Query 0 attends key 0 (value 0) which attends key 0 (value 0): every likely path ends on B[0, 1] = 1e-300.
  const Batch batch = rows_from({{0, 1, 2}, {0, 0, 1}}, {{0, 1, 2}, {0, 0, 2}}, {0, 0}, {1, 1});
  const std::vector<double> log_p = log_densities(model, batch);
  for (Index row = 0; row < 2; ++row) {
    const PathOracle o = enumerate_paths(p, p.mean, batch, row);
    ASSERT_TRUE(std::isfinite(o.log_p));
    ExpectRel(log_p[static_cast<size_t>(row)], o.log_p, 1e-12, "row " + std::to_string(row));
    EXPECT_LT(log_p[static_cast<size_t>(row)], -600.0);
  }
  auto acc = model.make_accumulator();
  ASSERT_NO_THROW(model.accumulate(batch, std::vector<double>{1.0, 0.5}, acc));
  for (double v : packed(acc)) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(acc.emission_count().sum(), 1.5, 1e-12);
}

/// docs/mechanisms.md#variational-multi-hop-attention: predict_proba = Σ_{i,j} a1_i a2_ij B[v_j, ·] at E = m: shape (n,
/// T), rows sum to 1 (1e-12), equal the enumeration (1e-12), both overloads agree, and predict_proba[t] =
/// exp(log_density of the row with target t).
TEST(VariationalMultiHopAttentionTest, PredictProbaSumsToOneAndMatchesEnumeration) {
  Rng rng(testing::test_seed(63));
  const Params p = random_params(kS, kD, kT, rng);
  const Model model(p);
  EXPECT_TRUE(same_bits(model.embeddings(), p.mean));
  const Batch batch = random_rows(8, kN, kS, kT, rng);
  const Matrix proba = model.predict_proba(batch);
  ASSERT_EQ(proba.rows(), 8);
  ASSERT_EQ(proba.cols(), kT);
  EXPECT_EQ(model.predict_proba(batch.keys(), batch.values(), batch.queries()), proba);
  for (Index row = 0; row < 8; ++row) {
    EXPECT_NEAR(proba.row(row).sum(), 1.0, 1e-12);
    const PathOracle o = enumerate_paths(p, p.mean, batch, row);
    for (Index t = 0; t < kT; ++t) {
      double expected = 0.0;
      for (Index i = 0; i < kN; ++i)
        for (Index j = 0; j < kN; ++j) expected += o.a1[i] * o.a2(i, j) * p.emission(batch.values(row)[j], t);
      EXPECT_NEAR(proba(row, t), expected, 1e-12) << "row " << row << " target " << t;
      const Batch one = batch.slice(row, 1);
      const Batch with_t = Encoder{}.encode(one.keys(), one.values(), one.queries(), IdVector::Constant(1, t));
      EXPECT_NEAR(proba(row, t), std::exp(log_densities(model, with_t)[0]), 1e-12);
    }
  }
}

// ----- E-step -------------------------------------------------------------------------------------------------------

/// docs/mechanisms.md#variational-multi-hop-attention: the E-step's ll, emission_count (w r_j / mc at (v_j, t)) and n
/// equal the oracle sums over the noise of Rng(derive_seed(seed, kMcNoise, τ)) (rel 1e-12) with non-uniform and zero
/// weights; the statistics carry the model's state; log_p_out receives the plug-in log densities.
TEST(VariationalMultiHopAttentionTest, EStepStatisticsMatchMonteCarloOracle) {
  Rng rng(testing::test_seed(64));
  const Params p = random_params(kS, kD, kT, rng);
  const Model model(p);
  const Batch batch = random_rows(25, kN, kS, kT, rng);
  const std::vector<double> w = weights_with_zeros(25, rng, {1, 24});
  for (const int64_t mc : {1, 3}) {
    Acc acc(kS, kD, kT, mc);
    std::vector<double> log_p_out(25);
    model.accumulate(batch, w, acc, log_p_out);
    const OracleStats o = oracle_statistics(p, batch, w, mc);
    SCOPED_TRACE("mc " + std::to_string(mc));
    ExpectRel(acc.ll(), o.ll, 1e-12, "ll");
    ExpectRel(Matrix(acc.emission_count()), o.emission_count, 1e-12, "emission_count");
    EXPECT_EQ(acc.n(), o.n);
    ASSERT_NE(acc.optimizer_state(), nullptr);
    EXPECT_TRUE(*acc.optimizer_state() == *p.optimizer_state);
    for (Index row = 0; row < 25; ++row)
      ExpectRel(log_p_out[static_cast<size_t>(row)], enumerate_paths(p, p.mean, batch, row).log_p, 1e-12,
                "log_p_out row " + std::to_string(row));
  }
}

/// docs/mechanisms.md#variational-multi-hop-attention: grad_mean and grad_log_var equal central finite differences (h =
/// 1e-5) of the fixed-noise objective ll = (1/mc) Σ_k Σ_n w_n log p(E_k) with respect to every entry of m and log v, to
/// 1e-6 relative (|fd − g| ≤ 1e-6·max(1, max|g|)); non-uniform weights with a zero weight; keys, values and the query
/// share symbols, so one symbol receives query, key and value contributions.
TEST(VariationalMultiHopAttentionTest, DataGradientMatchesFiniteDifferencesOfMcObjective) {
  Rng rng(testing::test_seed(65));
  const Params p = random_params(kS, kD, kT, rng);
  const Model model(p);
  const Batch batch = random_rows(10, kN, kS, kT, rng);
  const std::vector<double> w = weights_with_zeros(10, rng, {6});
  const int64_t mc = 2;
  Acc acc(kS, kD, kT, mc);
  model.accumulate(batch, w, acc);
  const Matrix grad_mean = acc.grad_mean();
  const Matrix grad_log_var = acc.grad_log_var();
  ASSERT_GT(grad_mean.cwiseAbs().maxCoeff(), 1e-3);
  ASSERT_GT(grad_log_var.cwiseAbs().maxCoeff(), 1e-3);
  const auto objective = [&](const Matrix& mean, const Matrix& log_var) {
    Acc a(kS, kD, kT, mc);
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

/// VMHA-2 (VEA-4): weights [0, 1] equal the second row alone, every field (rel 1e-12); zero weights anywhere equal
/// dropping those rows.
TEST(VariationalMultiHopAttentionTest, ZeroWeightEqualsDroppingTheRow) {
  Rng rng(testing::test_seed(66));
  const Model model(random_params(kS, kD, kT, rng));
  const Batch two = random_rows(2, kN, kS, kT, rng);
  auto with_zero = model.make_accumulator();
  model.accumulate(two, std::vector<double>{0.0, 1.0}, with_zero);
  auto alone = model.make_accumulator();
  model.accumulate(two.slice(1, 1), std::vector<double>{1.0}, alone);
  ExpectFieldsClose(with_zero, alone, 1e-12);
  EXPECT_NE(with_zero.ll(), 0.0);

  const Batch many = random_rows(8, kN, kS, kT, rng);
  const std::vector<double> w = weights_with_zeros(8, rng, {0, 3, 7});
  auto sparse = model.make_accumulator();
  model.accumulate(many, w, sparse);
  auto kept = model.make_accumulator();
  for (const Index r : {1, 2, 4, 5, 6})
    model.accumulate(many.slice(r, 1), std::vector<double>{w[static_cast<size_t>(r)]}, kept);
  ExpectFieldsClose(sparse, kept, 1e-12);
}

/// VMHA-2 (VEA-5) / docs/mechanisms.md#variational-multi-hop-attention: with B = I (S = T = 4) a row is impossible when
/// no value emits its target: log_density is −∞ exactly there and their posterior is all zeros (never NaN); accumulate
/// (direct and chunk-parallel) raises ImpossibleEvidenceError listing exactly those rows with "impossible evidence" in
/// the message, before any statistic or the attached state changes; with zero weight they are accepted and equal
/// dropping them.
TEST(VariationalMultiHopAttentionTest, ImpossibleTargetsRaiseBeforeAnyStatisticChanges) {
  Rng rng(testing::test_seed(67));
  Params p;
  p.mean = random_matrix(4, 2, 1.0, rng);
  p.log_var = Matrix::Constant(4, 2, std::log(0.3));
  p.emission = Matrix::Identity(4, 4);
  p.sigma2 = 0.3;
  const Model model(p);
  // Rows 1, 2 and 5: the target is none of the values (row 2: it is a key, which does not emit).
  const Batch batch = rows_from({{0, 1, 2}, {0, 1, 2}, {3, 2, 1}, {0, 1, 3}, {1, 1, 1}, {2, 0, 0}},
                                {{1, 2, 3}, {0, 1, 2}, {0, 1, 2}, {3, 3, 3}, {2, 0, 2}, {1, 1, 2}},
                                {0, 1, 2, 3, 0, 1}, {3, 3, 3, 3, 0, 0});
  const std::vector<int64_t> impossible{1, 2, 5};
  const std::vector<double> log_p = log_densities(model, batch);
  for (size_t row = 0; row < log_p.size(); ++row) {
    const bool bad = std::find(impossible.begin(), impossible.end(), static_cast<int64_t>(row)) != impossible.end();
    EXPECT_EQ(log_p[row] == kNegInfinity, bad) << "row " << row;
    // docs/mechanisms.md#building-blocks: the posterior of an impossible row is all zeros, never NaN; the gates stay
    // distributions.
    const VariationalMultiHopPosterior post = model.posterior_at(p.mean, batch, static_cast<Index>(row));
    EXPECT_EQ(post.log_p, log_p[row]) << "row " << row;
    EXPECT_TRUE(post.joint.allFinite()) << "row " << row;
    if (bad) {
      EXPECT_TRUE(post.joint.isZero(0.0)) << "row " << row;
    }
    EXPECT_NEAR(post.hop1.sum(), 1.0, 1e-12) << "row " << row;
  }
  auto acc = model.make_accumulator();
  model.accumulate(batch.slice(0, 1), std::vector<double>{2.0}, acc);
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

  std::vector<double> w = ones;
  for (int64_t r : impossible) w[static_cast<size_t>(r)] = 0.0;
  auto with_zero = model.make_accumulator();
  ASSERT_NO_THROW(model.accumulate(batch, w, with_zero));
  for (double v : packed(with_zero)) EXPECT_TRUE(std::isfinite(v));
  auto kept = model.make_accumulator();
  for (const Index r : {0, 3, 4}) model.accumulate(batch.slice(r, 1), std::vector<double>{1.0}, kept);
  ExpectFieldsClose(with_zero, kept, 1e-12);
}

// ----- samplers -----------------------------------------------------------------------------------------------------

/// VMHA-2 (VEA-6): the plug-in sampler uses m only (two models differing only in log_var give identical draws); the
/// posterior-predictive sampler depends on log_var; batches equal sequential sample() draws for both; the sampler
/// honours context_length and rejects a non-positive one.
TEST(VariationalMultiHopAttentionTest, PlugInSamplerIgnoresLogVarAndBatchesEqualSequentialDraws) {
  Rng rng(testing::test_seed(68));
  const Params p = random_params(kS, kD, kT, rng);
  const Model model(p);
  const Model wide = with_embeddings(p, p.mean, Matrix::Constant(kS, kD, 1.5));
  const uint64_t seed = 77;
  for (const int64_t N : {1, 3, 6}) {
    const Batch a = model.sampler(seed, N).sample(Index{50});
    const Batch b = wide.sampler(seed, N).sample(Index{50});
    EXPECT_EQ(a.context_length(), N);
    EXPECT_EQ(a.keys(), b.keys());
    EXPECT_EQ(a.values(), b.values());
    EXPECT_EQ(a.queries(), b.queries());
    EXPECT_EQ(a.targets(), b.targets());
  }
  EXPECT_EQ(model.sampler(seed).sample(Index{3}).context_length(), 6);  // the default
  const Batch pa = model.posterior_predictive_sampler(seed, 4).sample(Index{60});
  const Batch pb = wide.posterior_predictive_sampler(seed, 4).sample(Index{60});
  EXPECT_FALSE(pa.targets() == pb.targets() && pa.keys() == pb.keys() && pa.queries() == pb.queries());

  for (const bool predictive : {false, true}) {
    auto batch_sampler = predictive ? model.posterior_predictive_sampler(seed, 4) : model.sampler(seed, 4);
    auto one_sampler = predictive ? model.posterior_predictive_sampler(seed, 4) : model.sampler(seed, 4);
    const Batch batch = batch_sampler.sample(Index{20});
    for (Index row = 0; row < 20; ++row) {
      const ChainedAttentionObservation obs = one_sampler.sample();
      ASSERT_EQ(obs.keys.size(), 4u);
      ASSERT_EQ(obs.values.size(), 4u);
      for (Index i = 0; i < 4; ++i) {
        EXPECT_EQ(batch.keys(row)[i], obs.keys[static_cast<size_t>(i)]);
        EXPECT_EQ(batch.values(row)[i], obs.values[static_cast<size_t>(i)]);
      }
      EXPECT_EQ(batch.query(row), obs.query);
      EXPECT_EQ(batch.target(row), obs.target);
    }
  }
  EXPECT_THROW((void)model.sampler(seed, 0), ValueError);
  EXPECT_THROW((void)model.posterior_predictive_sampler(seed, -1), ValueError);
}

/// docs/mechanisms.md#building-blocks (as every family's sampler): sample(0) is an empty batch and a negative size
/// raises ValueError, for the plug-in and the posterior-predictive sampler.
TEST(VariationalMultiHopAttentionTest, SamplerRejectsNegativeSize) {
  Rng rng(testing::test_seed(79));
  const Model model(random_params(kS, kD, kT, rng));
  EXPECT_EQ(model.sampler(1, kN).sample(Index{0}).n_rows(), 0);
  EXPECT_EQ(model.posterior_predictive_sampler(1, kN).sample(Index{0}).n_rows(), 0);
  EXPECT_THROW((void)model.sampler(1, kN).sample(Index{-1}), ValueError);
  EXPECT_THROW((void)model.posterior_predictive_sampler(1, kN).sample(Index{-3}), ValueError);
}

/// docs/mechanisms.md#variational-multi-hop-attention: the plug-in sampler walks the two hops: target frequencies equal
/// the mean over the sampled rows of predict_proba (within 5 standard errors).
TEST(VariationalMultiHopAttentionTest, SamplerTargetsFollowThePlugInModel) {
  Rng rng(testing::test_seed(69));
  const Model model(random_params(kS, kD, kT, rng, 1.5));
  const Index n = 20000;
  const Batch batch = model.sampler(5, kN).sample(n);
  const Vector mean_proba = model.predict_proba(batch).colwise().mean().transpose();
  for (Index t = 0; t < kT; ++t) {
    double freq = 0.0;
    for (Index row = 0; row < n; ++row) freq += batch.target(row) == t ? 1.0 : 0.0;
    freq /= static_cast<double>(n);
    const double se = std::sqrt(mean_proba[t] * (1.0 - mean_proba[t]) / static_cast<double>(n));
    EXPECT_LT(std::fabs(freq - mean_proba[t]), 5.0 * se) << "target " << t;
  }
}

// ----- estimator ----------------------------------------------------------------------------------------------------

/// docs/mechanisms.md#variational-multi-hop-attention: the KL weight is annealed, λ_τ = prior_strength · min(1, τ /
/// max(1, anneal_iters)) (exact for τ = 1, 40, 79, 80, 81, 1000 with anneal_iters 80, and for anneal_iters 1); the
/// M-step takes one Adam step of the carried state with λ_τ at τ = iteration + 1 (scalar oracle, rel 1e-13, for carried
/// iterations 0, 39, 79 and 150), which differs from the un-annealed step while τ < anneal_iters.
TEST(VariationalMultiHopAttentionTest, MStepUsesAnnealedKlWeight) {
  EstimatorOptions options;
  options.prior_strength = 2.0;
  options.anneal_iters = 80;
  options.lr = 0.07;
  const Estimator estimator(kS, kD, kT, options);
  for (const int64_t tau : {1, 40, 79, 80, 81, 1000})
    EXPECT_EQ(estimator.kl_weight(tau), 2.0 * std::min(1.0, static_cast<double>(tau) / 80.0)) << "tau " << tau;
  EstimatorOptions one = options;
  one.anneal_iters = 1;
  EXPECT_EQ(Estimator(kS, kD, kT, one).kl_weight(1), 2.0);

  Rng rng(testing::test_seed(70));
  const Batch batch = random_rows(30, kN, kS, kT, rng);
  for (const int64_t carried : {0, 39, 79, 150}) {
    Params p = random_params(kS, kD, kT, rng, 2.0);
    p.optimizer_state->iteration = carried;
    const Model model(p);
    auto acc = model.make_accumulator();
    model.accumulate(batch, std::vector<double>(30, 1.0), acc);
    const Model next = estimator.estimate(std::nullopt, acc);
    ExpectSameModel(estimator.estimate(std::nullopt, acc), next);  // stateless
    EXPECT_EQ(next.optimizer_state().iteration, carried + 1);
    EXPECT_EQ(next.optimizer_state().seed, 13u);
    const int64_t tau = carried + 1;
    const double lambda = 2.0 * std::min(1.0, static_cast<double>(tau) / 80.0);
    const AttentionOptimizerState& s = *p.optimizer_state;
    Matrix exp_mean(kS, kD), exp_log_var(kS, kD), full_lambda_mean(kS, kD);
    for (Index k = 0; k < kS * kD; ++k) {
      const double m = s.mean.data()[k], lv = s.log_var.data()[k];
      const double gm = acc.grad_mean().data()[k];
      const double glv = acc.grad_log_var().data()[k];
      exp_mean.data()[k] = adam_theta(m, gm - lambda * m, s.mean_first_moment.data()[k],
                                      s.mean_second_moment.data()[k], 0.07, tau);
      full_lambda_mean.data()[k] = adam_theta(m, gm - 2.0 * m, s.mean_first_moment.data()[k],
                                              s.mean_second_moment.data()[k], 0.07, tau);
      exp_log_var.data()[k] = std::clamp(
          adam_theta(lv, glv - lambda * 0.5 * (std::exp(lv) - 1.0), s.log_var_first_moment.data()[k],
                     s.log_var_second_moment.data()[k], 0.07, tau),
          -8.0, 2.0);
    }
    SCOPED_TRACE("carried iteration " + std::to_string(carried));
    ExpectAllClose(next.mean(), exp_mean, 1e-13, 1e-15);
    ExpectAllClose(next.log_var(), exp_log_var, 1e-13, 1e-15);
    if (tau < 80) {
      EXPECT_GT((next.mean() - full_lambda_mean).cwiseAbs().maxCoeff(), 1e-9);
    }
  }
}

/// docs/mechanisms.md#variational-multi-hop-attention: B = (emission_count + ε) row-normalised (rel 1e-14), σ² and name
/// from the estimator; model.estimator() carries the model's σ² and state seed; statistics without a state initialise
/// with m ~ N(0, 1) (scale 1) from Rng(derive_seed(seed, kInit, 0)), log v = log 0.3, zero moments, iteration 0 and the
/// estimator's seed.
TEST(VariationalMultiHopAttentionTest, EstimateClosedFormsAndInitialisation) {
  Rng rng(testing::test_seed(71));
  const Params p = random_params(kS, kD, kT, rng);
  const Model model(p);
  const Batch batch = random_rows(30, kN, kS, kT, rng);
  auto acc = model.make_accumulator();
  model.accumulate(batch, weights_with_zeros(30, rng, {}), acc);
  EstimatorOptions options;
  options.emission_smoothing = 0.02;
  options.sigma2 = 0.45;
  options.name = "two-hop";
  const Model next = Estimator(kS, kD, kT, options).estimate(std::nullopt, acc);
  Matrix exp_emission = (Matrix(acc.emission_count()).array() + 0.02).matrix();
  for (Index s = 0; s < kS; ++s) exp_emission.row(s) /= exp_emission.row(s).sum();
  ExpectAllClose(next.emission(), exp_emission, 1e-14, 1e-15);
  EXPECT_EQ(next.sigma2(), 0.45);
  EXPECT_EQ(next.params().name, "two-hop");
  const Estimator own = model.estimator();
  EXPECT_EQ(own.options().sigma2, 0.3);
  EXPECT_EQ(own.options().seed, 13u);

  Acc init(kS, kD, kT);
  Rng draws(9);
  init.initialize(batch, std::vector<double>(30, 1.0), draws);
  ASSERT_EQ(init.optimizer_state(), nullptr);
  init.grad_mean().setConstant(-5.0);  // ignored on the initialisation call
  EstimatorOptions seeded;
  seeded.seed = 21;
  const Model start = Estimator(kS, kD, kT, seeded).estimate(30.0, init);
  Rng oracle(derive_seed(21, SeedPurpose::kInit, 0));
  Matrix exp_mean(kS, kD);
  for (Index k = 0; k < exp_mean.size(); ++k) exp_mean.data()[k] = oracle.normal();
  EXPECT_TRUE(same_bits(start.mean(), exp_mean));
  EXPECT_TRUE(same_bits(start.log_var(), Matrix::Constant(kS, kD, std::log(0.3))));
  const AttentionOptimizerState& s = start.optimizer_state();
  EXPECT_EQ(s.iteration, 0);
  EXPECT_EQ(s.seed, 21u);
  EXPECT_EQ(s.family, Model::kFamily);
  EXPECT_TRUE(s.mean_first_moment.isZero(0.0) && s.mean_second_moment.isZero(0.0) &&
              s.log_var_first_moment.isZero(0.0) && s.log_var_second_moment.isZero(0.0));
}

/// docs/mechanisms.md#variational-multi-hop-attention seq_initialize: for every row, in row order, r ~ Dirichlet(1_N)
/// over the final-hop positions (zero-weight rows still draw), scaled by w_n and added to emission_count[v_nj, t_n]; n
/// += Σ w; gradients and ll stay zero; no state (rel 1e-14 against the same draws).
TEST(VariationalMultiHopAttentionTest, InitializeDrawsDirichletOverFinalHopPositions) {
  Rng rng(testing::test_seed(72));
  const Batch batch = random_rows(12, kN, kS, kT, rng);
  const std::vector<double> w = weights_with_zeros(12, rng, {4});
  Acc acc(kS, kD, kT);
  Rng draws(17);
  acc.initialize(batch, w, draws);
  Rng oracle(17);
  Matrix emission = Matrix::Zero(kS, kT);
  double n = 0.0;
  for (Index row = 0; row < 12; ++row) {
    std::vector<double> r(static_cast<size_t>(kN));
    oracle.dirichlet_ones(r);
    for (Index j = 0; j < kN; ++j)
      emission(batch.values(row)[j], batch.target(row)) += w[static_cast<size_t>(row)] * r[static_cast<size_t>(j)];
    n += w[static_cast<size_t>(row)];
  }
  ExpectAllClose(Matrix(acc.emission_count()), emission, 1e-14, 1e-15);
  EXPECT_NEAR(acc.n(), n, 1e-13);
  EXPECT_TRUE(Matrix(acc.grad_mean()).isZero(0.0));
  EXPECT_TRUE(Matrix(acc.grad_log_var()).isZero(0.0));
  EXPECT_EQ(acc.ll(), 0.0);
  EXPECT_EQ(acc.optimizer_state(), nullptr);
  EXPECT_EQ(draws.next_u64(), oracle.next_u64());
}

/// VMHA-2 (VEA-7): estimate rejects statistics carrying a state of the other family (same geometry) or another
/// geometry (ValueError), and nobs ≠ n.
TEST(VariationalMultiHopAttentionTest, EstimateRejectsForeignStates) {
  Rng rng(testing::test_seed(73));
  const Model model(random_params(kS, kD, kT, rng));
  auto acc = model.make_accumulator();
  model.accumulate(random_rows(10, kN, kS, kT, rng), std::vector<double>(10, 1.0), acc);
  const Estimator estimator(kS, kD, kT);
  ASSERT_NO_THROW((void)estimator.estimate(10.0, acc));
  AttentionOptimizerState other = model.optimizer_state();
  other.family = "variational_embedding_attention";
  Acc foreign = acc;
  foreign.set_optimizer_state(std::make_shared<const AttentionOptimizerState>(other));
  ExpectThrowWith([&] { (void)estimator.estimate(std::nullopt, foreign); }, {"variational_embedding_attention"},
                  "other family");
  for (const auto& [rows, cols] : std::vector<std::pair<Index, Index>>{{kS - 1, kD}, {kS, kD + 2}}) {
    Acc wrong = acc;
    wrong.set_optimizer_state(std::make_shared<const AttentionOptimizerState>(AttentionOptimizerState::fresh(
        Model::kFamily, Matrix::Zero(rows, cols), Matrix::Zero(rows, cols), 13)));
    EXPECT_THROW((void)estimator.estimate(std::nullopt, wrong), ValueError) << rows << "x" << cols;
  }
  ExpectThrowWith([&] { (void)estimator.estimate(9.0, acc); }, {"nobs"}, "nobs below n");
  ExpectThrowWith([&] { (void)estimator.estimate(11.0, acc); }, {"nobs"}, "nobs above n");
  EXPECT_THROW((void)estimator.estimate(std::nullopt, Acc(kS, kD, kT + 1)), ValueError);
}

/// VMHA-2 (VEA-7): statistics of different optimizer states never combine (ValueError "cannot combine attention
/// statistics from different optimizer states", nothing changed), nor do E-step and state-free statistics, nor an
/// E-step of another model into carried statistics; equal states held by different objects combine.
TEST(VariationalMultiHopAttentionTest, CombineRejectsDifferentOptimizerStates) {
  Rng rng(testing::test_seed(74));
  const Params p = random_params(kS, kD, kT, rng);
  const Model model(p);
  const Model twin(p);
  Params q = p;
  q.optimizer_state->seed += 1;  // the same arrays, another noise seed
  const Model reseeded(q);
  const Batch batch = random_rows(10, kN, kS, kT, rng);
  const std::vector<double> ones(10, 1.0);
  auto a = model.make_accumulator();
  model.accumulate(batch, ones, a);
  auto b = reseeded.make_accumulator();
  reseeded.accumulate(batch, ones, b);
  auto t = twin.make_accumulator();
  twin.accumulate(batch, ones, t);
  const std::vector<double> before = packed(a);
  ExpectThrowWith([&] { a.combine(b); }, {kDifferentStates}, "combine");
  ExpectThrowWith([&] { reseeded.accumulate(batch, ones, a); }, {kDifferentStates}, "accumulate");
  Acc init(kS, kD, kT);
  Rng init_rng(2);
  init.initialize(batch, ones, init_rng);
  ExpectThrowWith([&] { a.combine(init); }, {kDifferentStates}, "combine with state-free statistics");
  EXPECT_EQ(packed(a), before);
  ASSERT_NO_THROW(a.combine(t));
  const std::vector<double> doubled = packed(a);
  for (size_t k = 0; k < before.size(); ++k) EXPECT_EQ(doubled[k], 2.0 * before[k]);
}

/// VMHA-2 (VEA-7): 60 EM steps equal 30 steps, a save/load round trip of the model file, and 30 more steps, bit for
/// bit (the annealing schedule continues from the carried iteration).
TEST(VariationalMultiHopAttentionTest, RestartFromSavedModelContinuesBitForBit) {
  Rng rng(testing::test_seed(75));
  const Model truth(random_params(kS, kD, kT, rng, 1.5));
  const Batch batch = truth.sampler(rng.next_u64(), kN).sample(Index{120});
  EstimatorOptions options;
  options.mc = 2;
  options.anneal_iters = 40;
  options.seed = 6;
  const Estimator estimator(kS, kD, kT, options);
  OptimizeOptions init;
  init.seed = 2;
  init.init_p = 0.5;
  const ParallelOptions parallel{1, 32};  // several chunks, one thread (thread counts are covered by VEA-8)
  const Model start = initialize_model(batch, estimator, init);
  Model straight = start;
  for (int i = 0; i < 60; ++i) straight = em_step(straight, batch, estimator, {}, parallel);
  EXPECT_EQ(straight.optimizer_state().iteration, 60);
  Model half = start;
  for (int i = 0; i < 30; ++i) half = em_step(half, batch, estimator, {}, parallel);
  const Model loaded = reload(half);
  ExpectSameModel(loaded, half);
  Model resumed = loaded;
  for (int i = 0; i < 30; ++i) resumed = em_step(resumed, batch, estimator, {}, parallel);
  ExpectSameModel(resumed, straight);
}

/// VMHA-2 (VEA-8): 1 chunk vs 7 chunks give equal statistics (rel 1e-12); 1, 2, 3 and 8 threads give bitwise-identical
/// statistics and log densities and the same attached state.
TEST(VariationalMultiHopAttentionTest, ChunkIndependenceAndThreadCountInvariance) {
  Rng rng(testing::test_seed(76));
  const Model model(random_params(kS, kD, kT, rng));
  const Index n = 63;
  const Batch batch = random_rows(n, kN, kS, kT, rng);
  const std::vector<double> w = weights_with_zeros(n, rng, {2, 30});
  auto one_chunk = model.make_accumulator();
  parallel_accumulate(model, batch, w, one_chunk, {}, ParallelOptions{1, n});
  std::vector<std::vector<double>> stats, log_ps;
  for (const int threads : {1, 2, 3, 8}) {
    auto acc = model.make_accumulator();
    std::vector<double> log_p(static_cast<size_t>(n));
    parallel_accumulate(model, batch, w, acc, log_p, ParallelOptions{threads, 9});  // 7 chunks
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
}

// ----- validation (C-5) ---------------------------------------------------------------------------------------------

/// C-5 / docs/mechanisms.md#variational-embedding-attention and #variational-multi-hop-attention: the constructor
/// rejects (ValueError naming the field) empty, non-finite or mismatched mean and log_var, log_var whose exp overflows,
/// a non-simplex or wrongly shaped emission, a bad σ², and a supplied state of another family, another geometry, or
/// with mean/log_var one ulp off; no state means fresh(family, m, log v, 0).
TEST(VariationalMultiHopAttentionTest, ConstructorRejectsInvalidParameters) {
  Rng rng(testing::test_seed(77));
  const Params good = random_params(kS, kD, kT, rng);
  ASSERT_NO_THROW(Model{good});
  Params no_state = good;
  no_state.optimizer_state.reset();
  EXPECT_TRUE(Model(no_state).optimizer_state() ==
              AttentionOptimizerState::fresh(Model::kFamily, good.mean, good.log_var, 0));
  const auto expect_bad = [&](const std::string& field, auto&& mutate) {
    Params p = good;
    mutate(p);
    ExpectThrowWith([&] { Model m(p); }, {field}, "field " + field);
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  expect_bad("mean", [](Params& p) {
    p.mean = Matrix(0, 0);
    p.log_var = Matrix(0, 0);
    p.optimizer_state.reset();
  });
  expect_bad("mean", [&](Params& p) {
    p.mean(0, 0) = inf;
    p.optimizer_state.reset();
  });
  expect_bad("log_var", [&](Params& p) {
    p.log_var(1, 0) = nan;
    p.optimizer_state.reset();
  });
  expect_bad("log_var", [](Params& p) {
    p.log_var = Matrix::Zero(kS - 1, kD);
    p.optimizer_state.reset();
  });
  expect_bad("log_var", [](Params& p) {
    p.log_var(0, 1) = 800.0;
    p.optimizer_state.reset();
  });
  expect_bad("emission", [](Params& p) { p.emission(2, 1) += 1e-9; });
  expect_bad("emission", [](Params& p) { p.emission = Matrix::Constant(kS - 1, kT, 1.0 / static_cast<double>(kT)); });
  for (const double bad : {0.0, -0.3, nan, inf}) expect_bad("sigma2", [&](Params& p) { p.sigma2 = bad; });
  expect_bad("optimizer_state", [](Params& p) { p.optimizer_state->family = "variational_embedding_attention"; });
  expect_bad("optimizer_state", [](Params& p) {
    p.optimizer_state =
        AttentionOptimizerState::fresh(Model::kFamily, Matrix::Zero(kS + 1, kD), Matrix::Zero(kS + 1, kD), 0);
  });
  expect_bad("optimizer_state", [](Params& p) {
    p.optimizer_state->mean(1, 2) = std::nextafter(p.optimizer_state->mean(1, 2), -1e300);
  });
  expect_bad("optimizer_state", [](Params& p) {
    p.optimizer_state->log_var(0, 0) = std::nextafter(p.optimizer_state->log_var(0, 0), 1e300);
  });
}

/// C-5 / docs/mechanisms.md#variational-multi-hop-attention: the estimator rejects non-positive dimensions, mc and
/// anneal_iters, non-positive or non-finite lr and σ², negative or non-finite prior_strength and emission_smoothing
/// (ValueError naming the option); the defaults are σ² 0.3, lr 0.05, mc 5, prior_strength 0.1, anneal_iters 100,
/// smoothing 1e-4, seed 0.
TEST(VariationalMultiHopAttentionTest, EstimatorOptionsAreValidated) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const auto expect_bad = [&](const std::string& field, auto&& mutate) {
    EstimatorOptions o;
    mutate(o);
    ExpectThrowWith([&] { Estimator e(kS, kD, kT, o); }, {field}, "option " + field);
  };
  for (const int64_t bad : {0, -1}) {
    expect_bad("mc", [&](EstimatorOptions& o) { o.mc = bad; });
    expect_bad("anneal_iters", [&](EstimatorOptions& o) { o.anneal_iters = bad; });
  }
  for (const double bad : {0.0, -0.1, nan, inf}) {
    expect_bad("lr", [&](EstimatorOptions& o) { o.lr = bad; });
    expect_bad("sigma2", [&](EstimatorOptions& o) { o.sigma2 = bad; });
  }
  for (const double bad : {-1e-9, nan, inf}) {
    expect_bad("prior_strength", [&](EstimatorOptions& o) { o.prior_strength = bad; });
    expect_bad("emission_smoothing", [&](EstimatorOptions& o) { o.emission_smoothing = bad; });
  }
  EXPECT_THROW(Estimator(0, kD, kT), ValueError);
  EXPECT_THROW(Estimator(kS, 0, kT), ValueError);
  EXPECT_THROW(Estimator(kS, kD, -3), ValueError);
  ExpectThrowWith([] { Acc a(kS, kD, kT, 0); }, {"mc"}, "accumulator mc");
  EXPECT_THROW(Acc(kS, 0, kT), ValueError);
  const EstimatorOptions d;
  EXPECT_EQ(d.sigma2, 0.3);
  EXPECT_EQ(d.lr, 0.05);
  EXPECT_EQ(d.mc, 5);
  EXPECT_EQ(d.prior_strength, 0.1);
  EXPECT_EQ(d.anneal_iters, 100);
  EXPECT_EQ(d.emission_smoothing, 1e-4);
  EXPECT_EQ(d.seed, 0u);
  EXPECT_EQ(Estimator(kS, kD, kT).make_accumulator().mc(), 5);
}

/// C-5 / docs/mechanisms.md#building-blocks: the encoder rejects negative and out-of-range key, value, query and target
/// ids ("out-of-range ID") and keys/values of different shapes; a batch of an undeclared encoder with ids beyond the
/// model's S or T is rejected by log_density, accumulate, predict_proba and posterior_at; bad weights raise ValueError;
/// nothing changes.
TEST(VariationalMultiHopAttentionTest, InvalidIdsShapesAndWeightsAreRejected) {
  const Encoder declared{kS, kT};
  const auto expect_oor = [](auto&& f, const std::string& context) {
    ExpectThrowWith([&] { (void)f(); }, {"out-of-range ID"}, context);
  };
  expect_oor([&] { return rows_from({{0, 6}}, {{0, 1}}, {0}, {0}, declared); }, "key = S");
  expect_oor([&] { return rows_from({{0, 1}}, {{-1, 1}}, {0}, {0}, declared); }, "negative value");
  expect_oor([&] { return rows_from({{0, 1}}, {{0, 1}}, {6}, {0}, declared); }, "query = S");
  expect_oor([&] { return rows_from({{0, 1}}, {{0, 1}}, {0}, {4}, declared); }, "target = T");
  expect_oor([&] { return rows_from({{0, 1}}, {{0, 1}}, {0}, {-1}); }, "negative target, undeclared");
  EXPECT_THROW((void)rows_from({{0, 1}}, {{0, 1, 2}}, {0}, {0}), ValueError);

  Rng rng(testing::test_seed(78));
  const Model model(random_params(kS, kD, kT, rng));
  const Batch big_key = rows_from({{0, 9}}, {{0, 1}}, {0}, {0});
  const Batch big_value = rows_from({{0, 1}}, {{7, 1}}, {0}, {0});
  const Batch big_target = rows_from({{0, 1}}, {{0, 1}}, {0}, {5});
  std::vector<double> out(1);
  const std::vector<double> one{1.0};
  for (const Batch* b : {&big_key, &big_value, &big_target}) {
    auto acc = model.make_accumulator();
    expect_oor([&] { model.log_density(*b, out); return 0; }, "log_density");
    expect_oor([&] { model.accumulate(*b, one, acc); return 0; }, "accumulate");
    expect_oor([&] { return model.predict_proba(*b); }, "predict_proba");
    expect_oor([&] { return model.posterior_at(model.mean(), *b, 0).log_p; }, "posterior_at");
    EXPECT_EQ(packed(acc), packed(model.make_accumulator()));
  }
  const Batch ok = random_rows(3, kN, kS, kT, rng);
  auto acc = model.make_accumulator();
  for (const std::vector<double>& bad : {std::vector<double>{1.0, -1.0, 1.0}, std::vector<double>{1.0, std::nan(""), 1.0},
                                         std::vector<double>{1.0, 1.0}})
    EXPECT_THROW(model.accumulate(ok, bad, acc), ValueError);
  EXPECT_THROW((void)model.posterior_at(Matrix::Zero(kS + 1, kD), ok, 0), ValueError);
  EXPECT_THROW((void)model.posterior_at(model.mean(), ok, 3), ValueError);
  Acc other_layout(kS, kD + 1, kT);
  EXPECT_THROW(model.accumulate(ok, std::vector<double>(3, 1.0), other_layout), ValueError);
  EXPECT_EQ(packed(acc), packed(model.make_accumulator()));
}

}  // namespace
}  // namespace attnmix
