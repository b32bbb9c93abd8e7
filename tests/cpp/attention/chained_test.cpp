// SPDX-License-Identifier: Apache-2.0
// Chained attention: the unit acceptance rows and the formulas of docs/mechanisms.md#chained-attention against
// independent oracles.
//
// Oracles written here, from docs/mechanisms.md#chained-attention and not from the library's internals (only parameters
// are read):
//   * enumerate_paths: the generative story of docs/mechanisms.md#chained-attention summed over all N^L hop paths, with
//     every gate computed as
//     softmax_j(−‖e_u − K[k_j]‖² / (2σ²)) from the full squared distance (not the expanded logit);
//   * log_space_reference: the log-sum-exp recursions of docs/mechanisms.md#chained-attention, used where N^L is too
//     large to enumerate;
//   * scatter_statistics: the statistics formulas of docs/mechanisms.md#chained-attention applied to given marginals.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <new>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/transitive_task.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/reduce.hpp"
#include "attnmix/stats/mixture.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;
constexpr double kNegInfinity = -std::numeric_limits<double>::infinity();

// ----- helpers and oracles -----------------------------------------------------------------------------------------

/// A random valid model: K⁽ℓ⁾ entries key_scale·N(0, 1), emission rows Dirichlet(1_T) (all entries > 0).
ChainedAttention random_model(Index L, Index S, Index T, double sigma2, Rng& rng, double key_scale = 1.0) {
  ChainedAttentionParams p;
  for (Index hop = 0; hop < L; ++hop) {
    Matrix K(S, S);
    for (Index k = 0; k < K.size(); ++k) K.data()[k] = key_scale * rng.normal();
    p.key_tables.push_back(std::move(K));
  }
  p.emission.resize(S, T);
  for (Index s = 0; s < S; ++s) rng.dirichlet_ones({p.emission.data() + s * T, static_cast<size_t>(T)});
  p.sigma2 = sigma2;
  return ChainedAttention(std::move(p));
}

/// n rows with keys, values and queries uniform over [S] (repeats included) and targets uniform over [T].
ChainedAttentionBatch random_rows(Index n, Index N, Index S, Index T, Rng& rng) {
  IdMatrix keys(n, N), values(n, N);
  IdVector queries(n), targets(n);
  for (Index k = 0; k < keys.size(); ++k) keys.data()[k] = static_cast<int64_t>(rng.uniform_int(S));
  for (Index k = 0; k < values.size(); ++k) values.data()[k] = static_cast<int64_t>(rng.uniform_int(S));
  for (Index k = 0; k < n; ++k) {
    queries[k] = static_cast<int64_t>(rng.uniform_int(S));
    targets[k] = static_cast<int64_t>(rng.uniform_int(T));
  }
  return ChainedAttentionEncoder{S, T}.encode(keys, values, queries, targets);
}

/// One row from literal ids (undeclared bounds unless an encoder is given).
ChainedAttentionBatch one_row(const std::vector<int64_t>& keys, const std::vector<int64_t>& values, int64_t query,
                              int64_t target, const ChainedAttentionEncoder& encoder = {}) {
  const auto N = static_cast<Index>(keys.size());
  IdMatrix k(1, N), v(1, static_cast<Index>(values.size()));
  for (Index j = 0; j < N; ++j) k(0, j) = keys[static_cast<size_t>(j)];
  for (Index j = 0; j < v.cols(); ++j) v(0, j) = values[static_cast<size_t>(j)];
  return encoder.encode(k, v, IdVector::Constant(1, query), IdVector::Constant(1, target));
}

/// The row of batch encoded on its own.
ChainedAttentionBatch row_alone(const ChainedAttentionBatch& batch, Index row) {
  const ChainedAttentionBatch one = batch.slice(row, 1);
  return ChainedAttentionEncoder{}.encode(one.keys(), one.values(), one.queries(), one.targets());
}

std::vector<double> packed(const ChainedAttentionAccumulator& acc) {
  std::vector<double> out(static_cast<size_t>(acc.flat_size()));
  acc.pack(out);
  return out;
}

std::vector<double> log_densities(const ChainedAttention& model, const ChainedAttentionBatch& batch) {
  std::vector<double> out(static_cast<size_t>(batch.n_rows()));
  model.log_density(batch, out);
  return out;
}

/// −‖e_u − K[s]‖² / (2σ²): the gate logit of query symbol u against key symbol s, from the full squared distance.
double direct_gate_logit(const ChainedAttentionParams& p, Index hop, int64_t u, int64_t s) {
  const Matrix& K = p.key_tables[static_cast<size_t>(hop)];
  double sq = 0.0;
  for (Index c = 0; c < K.cols(); ++c) {
    const double diff = (c == u ? 1.0 : 0.0) - K(s, c);
    sq += diff * diff;
  }
  return -sq / (2.0 * p.sigma2);
}

/// g(u, K⁽ℓ⁾)_j = softmax_j(direct_gate_logit(k_j)) over the N positions (probability space).
std::vector<double> direct_gate(const ChainedAttentionParams& p, Index hop, int64_t u, const int64_t* keys, Index N) {
  std::vector<double> g(static_cast<size_t>(N));
  double top = kNegInfinity;
  for (Index j = 0; j < N; ++j) top = std::max(top, g[static_cast<size_t>(j)] = direct_gate_logit(p, hop, u, keys[j]));
  double total = 0.0;
  for (double& x : g) total += (x = std::exp(x - top));
  for (double& x : g) x /= total;
  return g;
}

/// Posterior marginals computed by an oracle: log p, γ [L, N], ξ[ℓ] [N, N].
struct Marginals {
  double log_p = 0.0;
  Matrix gamma;
  std::vector<Matrix> xi;
};

/// Oracle (docs/mechanisms.md#chained-attention): p(t | k, v, q) = Σ over all N^L paths z of
///   g(q, K⁽⁰⁾)_{z_0} · Π_{ℓ≥1} g(v_{z_{ℓ−1}}, K⁽ℓ⁾)_{z_ℓ} · B[v_{z_{L−1}}, t],
/// and γ, ξ as the path-posterior masses of z_ℓ = i and (z_ℓ, z_{ℓ+1}) = (i, j).
Marginals enumerate_paths(const ChainedAttention& model, const ChainedAttentionBatch& batch, Index row) {
  const ChainedAttentionParams& p = model.params();
  const Index L = static_cast<Index>(p.key_tables.size());
  const Index N = batch.context_length();
  const int64_t* k = batch.keys(row);
  const int64_t* v = batch.values(row);
  const int64_t q = batch.query(row), t = batch.target(row);
  Marginals m;
  m.gamma = Matrix::Zero(L, N);
  m.xi.assign(static_cast<size_t>(L - 1), Matrix::Zero(N, N));
  Index n_paths = 1;
  for (Index hop = 0; hop < L; ++hop) n_paths *= N;
  std::vector<Index> z(static_cast<size_t>(L));
  double total = 0.0;
  for (Index path = 0; path < n_paths; ++path) {
    Index rest = path;
    for (Index hop = 0; hop < L; ++hop) {
      z[static_cast<size_t>(hop)] = rest % N;
      rest /= N;
    }
    double prob = direct_gate(p, 0, q, k, N)[static_cast<size_t>(z[0])];
    for (Index hop = 1; hop < L; ++hop)
      prob *= direct_gate(p, hop, v[z[static_cast<size_t>(hop - 1)]], k, N)[static_cast<size_t>(z[static_cast<size_t>(hop)])];
    prob *= p.emission(v[z[static_cast<size_t>(L - 1)]], t);
    total += prob;
    for (Index hop = 0; hop < L; ++hop) m.gamma(hop, z[static_cast<size_t>(hop)]) += prob;
    for (Index hop = 0; hop + 1 < L; ++hop)
      m.xi[static_cast<size_t>(hop)](z[static_cast<size_t>(hop)], z[static_cast<size_t>(hop + 1)]) += prob;
  }
  m.log_p = std::log(total);
  m.gamma /= total;
  for (Matrix& x : m.xi) x /= total;
  return m;
}

/// LSE with max subtraction; −∞ for an all −∞ input.
double reference_lse(const std::vector<double>& x) {
  const double top = *std::max_element(x.begin(), x.end());
  if (top == kNegInfinity) return kNegInfinity;
  double total = 0.0;
  for (double v : x) total += std::exp(v - top);
  return top + std::log(total);
}

/// Oracle (docs/mechanisms.md#chained-attention in log space): log α, log β by LSE recursions over gates computed from
/// the full squared distance; γ, ξ by exponentiating. Never underflows (every log gate is finite).
Marginals log_space_reference(const ChainedAttention& model, const ChainedAttentionBatch& batch, Index row,
                              bool with_xi = true) {
  const ChainedAttentionParams& p = model.params();
  const Index L = static_cast<Index>(p.key_tables.size());
  const Index S = p.emission.rows();
  const Index N = batch.context_length();
  const int64_t* k = batch.keys(row);
  const int64_t* v = batch.values(row);
  // log g(u, K⁽ℓ⁾)_j for every hop and query symbol u, computed once per symbol: [hop][u][j].
  std::vector<std::vector<std::vector<double>>> log_gate(static_cast<size_t>(L));
  const auto log_gate_of = [&](Index hop, int64_t u) -> const std::vector<double>& {
    auto& table = log_gate[static_cast<size_t>(hop)];
    if (table.empty()) table.resize(static_cast<size_t>(S));
    auto& g = table[static_cast<size_t>(u)];
    if (g.empty()) {
      g.resize(static_cast<size_t>(N));
      for (Index j = 0; j < N; ++j) g[static_cast<size_t>(j)] = direct_gate_logit(p, hop, u, k[j]);
      const double norm = reference_lse(g);
      for (double& x : g) x -= norm;
    }
    return g;
  };
  Matrix log_alpha(L, N), log_beta(L, N);
  std::vector<double> tmp(static_cast<size_t>(N));
  const std::vector<double>& g0 = log_gate_of(0, batch.query(row));
  for (Index j = 0; j < N; ++j) log_alpha(0, j) = g0[static_cast<size_t>(j)];
  for (Index hop = 0; hop + 1 < L; ++hop)
    for (Index j = 0; j < N; ++j) {
      for (Index i = 0; i < N; ++i) tmp[static_cast<size_t>(i)] = log_alpha(hop, i) + log_gate_of(hop + 1, v[i])[static_cast<size_t>(j)];
      log_alpha(hop + 1, j) = reference_lse(tmp);
    }
  std::vector<double> log_f(static_cast<size_t>(N));
  for (Index j = 0; j < N; ++j) log_f[static_cast<size_t>(j)] = std::log(p.emission(v[j], batch.target(row)));
  for (Index j = 0; j < N; ++j) tmp[static_cast<size_t>(j)] = log_alpha(L - 1, j) + log_f[static_cast<size_t>(j)];
  Marginals m;
  m.log_p = reference_lse(tmp);
  m.gamma = Matrix::Zero(L, N);
  m.xi.assign(static_cast<size_t>(L - 1), Matrix::Zero(N, N));
  if (m.log_p == kNegInfinity) return m;
  for (Index j = 0; j < N; ++j) log_beta(L - 1, j) = log_f[static_cast<size_t>(j)];
  for (Index hop = L - 2; hop >= 0; --hop)
    for (Index i = 0; i < N; ++i) {
      const std::vector<double>& g = log_gate_of(hop + 1, v[i]);
      for (Index j = 0; j < N; ++j) tmp[static_cast<size_t>(j)] = g[static_cast<size_t>(j)] + log_beta(hop + 1, j);
      log_beta(hop, i) = reference_lse(tmp);
    }
  for (Index hop = 0; hop < L; ++hop)
    for (Index i = 0; i < N; ++i) m.gamma(hop, i) = std::exp(log_alpha(hop, i) + log_beta(hop, i) - m.log_p);
  if (with_xi)
    for (Index hop = 0; hop + 1 < L; ++hop)
      for (Index i = 0; i < N; ++i) {
        const std::vector<double>& g = log_gate_of(hop + 1, v[i]);
        for (Index j = 0; j < N; ++j)
          m.xi[static_cast<size_t>(hop)](i, j) =
              std::exp(log_alpha(hop, i) + g[static_cast<size_t>(j)] + log_beta(hop + 1, j) - m.log_p);
      }
  return m;
}

/// Expected statistics of docs/mechanisms.md#chained-attention from per-row marginals: hop 0 scatters γ_0 at (k_i, q);
/// hop ℓ ≥ 1 scatters ξ_{ℓ−1}(i, j) at (k_j, v_i); emission_count[v_j, t] += w γ_{L−1}(j); ll += w log p; n += w.
struct ExpectedStats {
  std::vector<Matrix> key_num;  // L × [S, S]
  Matrix key_mass;              // [L, S]
  Matrix emission_count;        // [S, T]
  double ll = 0.0;
  double n = 0.0;
  ExpectedStats(Index L, Index S, Index T)
      : key_num(static_cast<size_t>(L), Matrix::Zero(S, S)), key_mass(Matrix::Zero(L, S)),
        emission_count(Matrix::Zero(S, T)) {}
  void add(const ChainedAttentionBatch& batch, Index row, double w, const Matrix& gamma, const std::vector<Matrix>& xi,
           double log_p, bool with_ll = true) {
    const Index L = gamma.rows(), N = gamma.cols();
    const int64_t* k = batch.keys(row);
    const int64_t* v = batch.values(row);
    for (Index i = 0; i < N; ++i) {
      key_num[0](k[i], batch.query(row)) += w * gamma(0, i);
      key_mass(0, k[i]) += w * gamma(0, i);
    }
    for (Index hop = 1; hop < L; ++hop)
      for (Index i = 0; i < N; ++i)
        for (Index j = 0; j < N; ++j) {
          const double x = w * xi[static_cast<size_t>(hop - 1)](i, j);
          key_num[static_cast<size_t>(hop)](k[j], v[i]) += x;
          key_mass(hop, k[j]) += x;
        }
    for (Index j = 0; j < N; ++j) emission_count(v[j], batch.target(row)) += w * gamma(L - 1, j);
    if (with_ll) ll += w * log_p;
    n += w;
  }
  void expect_close_to(const ChainedAttentionAccumulator& acc, double rtol, double atol) const {
    for (size_t hop = 0; hop < key_num.size(); ++hop)
      ExpectAllClose(Matrix(acc.key_num(static_cast<Index>(hop))), key_num[hop], rtol, atol);
    ExpectAllClose(Matrix(acc.key_mass()), key_mass, rtol, atol);
    ExpectAllClose(Matrix(acc.emission_count()), emission_count, rtol, atol);
    EXPECT_NEAR(acc.ll(), ll, rtol * std::fabs(ll) + atol);
    EXPECT_NEAR(acc.n(), n, rtol * n + atol);
  }
};

/// Σ_j of each row of a matrix, as a row-vector-shaped Matrix [1, rows].
Matrix row_sums(const Matrix& m) { return m.rowwise().sum().transpose(); }

/// A hand-built accumulator with consistent masses: L = 2, S = 3, T = 2, n = 2.
ChainedAttentionAccumulator hand_accumulator() {
  ChainedAttentionAccumulator acc(2, 3, 2);
  acc.key_num(0) << 1.0, 0.5, 0.0,  //
      0.0, 0.0, 0.0,                 // symbol 1 never attended at hop 0: zero key
      0.25, 0.0, 0.25;
  acc.key_mass().row(0) << 1.5, 0.0, 0.5;
  acc.key_num(1) << 0.0, 0.5, 0.0,  //
      0.75, 0.0, 0.75 - 1e-12,       //
      1e-12, 0.0, 0.0;               // a tiny mass below the 1e-9 floor
  acc.key_mass().row(1) << 0.5, 1.5 - 1e-12, 1e-12;
  acc.emission_count() << 1.0, 0.0,  //
      0.5, 0.5,                       //
      0.0, 0.0;                       // symbol 2 never emitted: zero-total row
  acc.ll() = -3.25;
  acc.n() = 2.0;
  return acc;
}

// ----- CA-1 ------------------------------------------------------------------------------------------------------

/// CA-1: the batch log_density equals each row's log_density encoded alone, the E-step's log_p_out and the
/// AnyDistribution handle (1e-9; in fact exact).
TEST(ChainedAttentionTest, BatchLogDensityEqualsPerRowLogDensity) {
  Rng rng(testing::test_seed(31));
  const ChainedAttention model = random_model(2, 6, 5, 0.3, rng);
  const ChainedAttentionBatch batch = model.sampler(7, 5).sample(20);
  const std::vector<double> log_p = log_densities(model, batch);
  for (Index n = 0; n < batch.n_rows(); ++n) {
    EXPECT_TRUE(std::isfinite(log_p[static_cast<size_t>(n)])) << "row " << n;
    EXPECT_NEAR(log_densities(model, row_alone(batch, n))[0], log_p[static_cast<size_t>(n)], 1e-9) << "row " << n;
  }
  auto acc = model.make_accumulator();
  std::vector<double> from_estep(log_p.size());
  model.accumulate(batch, std::vector<double>(log_p.size(), 1.0), acc, from_estep);
  ExpectAllClose(from_estep, log_p, 1e-12, 0.0);
  std::vector<double> via_any(log_p.size());
  AnyDistribution(model).log_density(AnyBatch(batch), via_any);
  EXPECT_EQ(via_any, log_p);
}

/// CA-1: encoder shapes (8, N), (8, N), (8,), (8,); the sampler's observations have int64 ids of the right shape.
TEST(ChainedAttentionTest, EncoderAndSamplerShapes) {
  Rng rng(testing::test_seed(32));
  const Index S = 9, T = 4, N = 5;
  const ChainedAttention model = random_model(2, S, T, 0.1, rng);
  const ChainedAttentionBatch batch = random_rows(8, N, S, T, rng);
  EXPECT_EQ(batch.n_rows(), 8);
  EXPECT_EQ(batch.context_length(), N);
  EXPECT_EQ(batch.keys().rows(), 8);
  EXPECT_EQ(batch.keys().cols(), N);
  EXPECT_EQ(batch.values().rows(), 8);
  EXPECT_EQ(batch.values().cols(), N);
  EXPECT_EQ(batch.queries().size(), 8);
  EXPECT_EQ(batch.targets().size(), 8);
  EXPECT_EQ(model.encoder(), (ChainedAttentionEncoder{S, T}));

  static_assert(std::is_same_v<decltype(ChainedAttentionObservation::keys), std::vector<int64_t>>);
  static_assert(std::is_same_v<decltype(ChainedAttentionObservation::values), std::vector<int64_t>>);
  static_assert(std::is_same_v<decltype(ChainedAttentionObservation::query), int64_t>);
  static_assert(std::is_same_v<decltype(ChainedAttentionObservation::target), int64_t>);
  auto sampler = model.sampler(3);
  for (int k = 0; k < 5; ++k) {
    const ChainedAttentionObservation obs = sampler.sample();
    ASSERT_EQ(obs.keys.size(), 6u);  // default context_length
    ASSERT_EQ(obs.values.size(), 6u);
    for (size_t j = 0; j < 6; ++j) {
      EXPECT_GE(obs.keys[j], 0);
      EXPECT_LT(obs.keys[j], S);
      EXPECT_GE(obs.values[j], 0);
      EXPECT_LT(obs.values[j], S);
    }
    EXPECT_GE(obs.query, 0);
    EXPECT_LT(obs.query, S);
    EXPECT_GE(obs.target, 0);
    EXPECT_LT(obs.target, T);
  }
  const ChainedAttentionBatch sampled = model.sampler(3).sample(5);
  EXPECT_EQ(sampled.n_rows(), 5);
  EXPECT_EQ(sampled.context_length(), 6);
}

/// CA-1: predict_proba has shape (8, T), rows sum to 1 (1e-9), both overloads agree, and
/// predict_proba[t] = exp(log_density of the row with target t) (the forward pass alone vs the full likelihood).
TEST(ChainedAttentionTest, PredictProbaRowsSumToOneAndMatchLikelihood) {
  Rng rng(testing::test_seed(33));
  const Index S = 7, T = 5, N = 4;
  const ChainedAttention model = random_model(3, S, T, 0.3, rng);
  const ChainedAttentionBatch batch = random_rows(8, N, S, T, rng);
  const Matrix proba = model.predict_proba(batch.keys(), batch.values(), batch.queries());
  ASSERT_EQ(proba.rows(), 8);
  ASSERT_EQ(proba.cols(), T);
  EXPECT_EQ(model.predict_proba(batch), proba);
  for (Index n = 0; n < 8; ++n) {
    EXPECT_NEAR(proba.row(n).sum(), 1.0, 1e-9) << "row " << n;
    const ChainedAttentionBatch one = batch.slice(n, 1);
    for (int64_t t = 0; t < T; ++t) {
      const auto with_target = ChainedAttentionEncoder{S, T}.encode(one.keys(), one.values(), one.queries(),
                                                                    IdVector::Constant(1, t));
      EXPECT_NEAR(proba(n, t), std::exp(log_densities(model, with_target)[0]), 1e-12) << "row " << n << " t " << t;
    }
  }
  // AnyDistribution's target_log_proba, from predict_proba in blocks (this family has no own): the log-likelihood of
  // each row's own target.
  const Vector target_log_p = AnyDistribution(model).target_log_proba(AnyBatch(batch));
  const std::vector<double> log_p = log_densities(model, batch);
  ASSERT_EQ(target_log_p.size(), 8);
  for (Index n = 0; n < 8; ++n) EXPECT_NEAR(target_log_p[n], log_p[static_cast<size_t>(n)], 1e-12) << "row " << n;
}

/// CA-1: combine(value()) doubles the emission counts (and every other field) exactly.
TEST(ChainedAttentionTest, CombineValueDoublesEmissionCounts) {
  Rng rng(testing::test_seed(34));
  const ChainedAttention model = random_model(2, 6, 4, 0.3, rng);
  const ChainedAttentionBatch batch = model.sampler(2).sample(8);
  auto acc = model.make_accumulator();
  model.accumulate(batch, std::vector<double>(8, 1.0), acc);
  const Matrix emission_before = acc.emission_count();
  const std::vector<double> before = packed(acc);
  ASSERT_GT(emission_before.sum(), 0.0);
  acc.combine(acc.value());
  EXPECT_EQ(Matrix(acc.emission_count()), Matrix(2.0 * emission_before));
  const std::vector<double> after = packed(acc);
  for (size_t k = 0; k < before.size(); ++k) EXPECT_EQ(after[k], 2.0 * before[k]) << "entry " << k;
}

// ----- CA-2 ------------------------------------------------------------------------------------------------------

struct EnumerationCase {
  Index L, N, S, T;
};

/// CA-2: forward–backward log p equals brute-force enumeration of all N^L paths (σ² 0.3, 30 rows per case,
/// rtol 1e-9), for L = 1, 2, 3 with repeated symbols in the contexts.
TEST(ChainedAttentionTest, ForwardBackwardMatchesEnumeration) {
  Rng rng(testing::test_seed(35));
  for (const EnumerationCase c : {EnumerationCase{1, 5, 4, 3}, EnumerationCase{2, 4, 4, 3}, EnumerationCase{2, 6, 5, 4},
                                  EnumerationCase{3, 4, 5, 3}}) {
    SCOPED_TRACE("L = " + std::to_string(c.L) + ", N = " + std::to_string(c.N));
    const ChainedAttention model = random_model(c.L, c.S, c.T, 0.3, rng);
    const ChainedAttentionBatch batch = random_rows(30, c.N, c.S, c.T, rng);
    const std::vector<double> log_p = log_densities(model, batch);
    for (Index n = 0; n < 30; ++n) {
      const double expected = enumerate_paths(model, batch, n).log_p;
      EXPECT_NEAR(log_p[static_cast<size_t>(n)], expected, 1e-9 * std::max(1.0, std::fabs(expected))) << "row " << n;
    }
  }
}

/// CA-2: the posterior marginals γ_ℓ(i) and ξ_ℓ(i, j) of ChainedAttention::posterior equal the enumerated path
/// posteriors (atol 1e-12 on probabilities).
TEST(ChainedAttentionTest, PosteriorMarginalsMatchEnumeration) {
  Rng rng(testing::test_seed(36));
  for (const EnumerationCase c : {EnumerationCase{1, 5, 4, 3}, EnumerationCase{2, 4, 4, 3}, EnumerationCase{3, 4, 5, 3}}) {
    SCOPED_TRACE("L = " + std::to_string(c.L));
    const ChainedAttention model = random_model(c.L, c.S, c.T, 0.3, rng);
    const ChainedAttentionBatch batch = random_rows(30, c.N, c.S, c.T, rng);
    for (Index n = 0; n < 30; ++n) {
      SCOPED_TRACE("row " + std::to_string(n));
      const Marginals expected = enumerate_paths(model, batch, n);
      const ChainedAttentionPosterior got = model.posterior(batch, n);
      EXPECT_NEAR(got.log_p, expected.log_p, 1e-9 * std::max(1.0, std::fabs(expected.log_p)));
      ExpectAllClose(got.gamma, expected.gamma, 1e-9, 1e-12);
      ASSERT_EQ(got.xi.size(), static_cast<size_t>(c.L - 1));
      for (size_t hop = 0; hop < got.xi.size(); ++hop) ExpectAllClose(got.xi[hop], expected.xi[hop], 1e-9, 1e-12);
    }
  }
}

/// docs/mechanisms.md#chained-attention: the weighted E-step statistics equal the formulas applied to the enumerated
/// posteriors (repeated key and value symbols exercise the scatter-add), rel 1e-10.
TEST(ChainedAttentionTest, StatisticsMatchEnumeratedPosteriors) {
  Rng rng(testing::test_seed(37));
  const Index L = 3, N = 4, S = 4, T = 3;
  const ChainedAttention model = random_model(L, S, T, 0.3, rng);
  const ChainedAttentionBatch batch = random_rows(12, N, S, T, rng);
  std::vector<double> w(12);
  for (double& x : w) x = 0.25 + 2.0 * rng.uniform();
  w[4] = 0.0;  // contributes nothing
  auto acc = model.make_accumulator();
  model.accumulate(batch, w, acc);
  ExpectedStats expected(L, S, T);
  for (Index n = 0; n < 12; ++n) {
    if (w[static_cast<size_t>(n)] == 0.0) continue;
    const Marginals m = enumerate_paths(model, batch, n);
    expected.add(batch, n, w[static_cast<size_t>(n)], m.gamma, m.xi, m.log_p);
  }
  expected.expect_close_to(acc, 1e-10, 1e-13);
}

// ----- CA-3: long chains and the log-space rescue -----------------------------------------------------------------

/// CA-3: L = 64, N = 8, σ² = 1e-3: log p is finite and equals the log-space reference (rtol 1e-9); per hop γ sums to
/// 1 and ξ sums to 1 (1e-9); Σ_i ξ_{ℓ−1}(i, j) = γ_ℓ(j) and Σ_j ξ_ℓ(i, j) = γ_ℓ(i) (1e-9); γ equals the reference.
TEST(ChainedAttentionTest, LongChainMarginalsAreConsistent) {
  Rng rng(testing::test_seed(38));
  const Index L = 64, N = 8, S = 10, T = 6;
  const ChainedAttention model = random_model(L, S, T, 1e-3, rng);
  const ChainedAttentionBatch batch = random_rows(6, N, S, T, rng);
  for (Index n = 0; n < batch.n_rows(); ++n) {
    SCOPED_TRACE("row " + std::to_string(n));
    const ChainedAttentionPosterior post = model.posterior(batch, n);
    ASSERT_TRUE(std::isfinite(post.log_p));
    const Marginals reference = log_space_reference(model, batch, n, /*with_xi=*/false);
    EXPECT_NEAR(post.log_p, reference.log_p, 1e-9 * std::max(1.0, std::fabs(reference.log_p)));
    EXPECT_EQ(log_densities(model, batch.slice(n, 1))[0], post.log_p);
    ASSERT_EQ(post.gamma.rows(), L);
    ASSERT_EQ(post.xi.size(), static_cast<size_t>(L - 1));
    ExpectAllClose(row_sums(post.gamma), Matrix::Ones(1, L), 0.0, 1e-9);
    ExpectAllClose(post.gamma, reference.gamma, 0.0, 1e-9);
    for (Index hop = 0; hop + 1 < L; ++hop) {
      const Matrix& xi = post.xi[static_cast<size_t>(hop)];
      EXPECT_NEAR(xi.sum(), 1.0, 1e-9) << "hop " << hop;
      ExpectAllClose(Matrix(xi.colwise().sum()), Matrix(post.gamma.row(hop + 1)), 0.0, 1e-9);
      ExpectAllClose(row_sums(xi), Matrix(post.gamma.row(hop)), 0.0, 1e-9);
    }
  }
}

/// CA-3: L = 8, N = 256: log p is finite and equals the independent log-space reference (rtol 1e-9), and so do γ.
TEST(ChainedAttentionTest, WideContextMatchesLogSpaceReference) {
  Rng rng(testing::test_seed(39));
  const Index L = 8, N = 256, S = 40, T = 5;
  const ChainedAttention model = random_model(L, S, T, 0.05, rng);
  const ChainedAttentionBatch batch = random_rows(2, N, S, T, rng);
  const std::vector<double> log_p = log_densities(model, batch);
  for (Index n = 0; n < 2; ++n) {
    SCOPED_TRACE("row " + std::to_string(n));
    ASSERT_TRUE(std::isfinite(log_p[static_cast<size_t>(n)]));
    const Marginals reference = log_space_reference(model, batch, n, /*with_xi=*/false);
    EXPECT_NEAR(log_p[static_cast<size_t>(n)], reference.log_p, 1e-9 * std::max(1.0, std::fabs(reference.log_p)));
    ExpectAllClose(model.posterior(batch, n).gamma, reference.gamma, 0.0, 1e-9);
  }
}

/// A 3-hop chain built to underflow: K⁽ℓ⁾ = c·I with c = gap·σ², so ‖e_u − c·e_s‖² − ‖e_u − c·e_u‖² = 2c for s ≠ u:
/// a query attends the position whose key equals it, and every other position costs a logit gap of c/σ² = gap.
/// keys = [0, 1, 2], values = [1, 2, 0], q = 0: the likely path 0 → 1 → 2 ends on value 0, and the emission puts
/// zero mass on (value 0, target 0), so every path that can emit pays at least one gap: p ≈ 2·e^{−gap}·B.
ChainedAttention underflow_model(double gap) {
  const double sigma2 = 1e-3;
  ChainedAttentionParams p;
  for (int hop = 0; hop < 3; ++hop) p.key_tables.push_back(gap * sigma2 * Matrix::Identity(3, 3));
  p.emission.resize(3, 2);
  p.emission << 0.0, 1.0,  // value 0 never emits target 0
      0.5, 0.5,            //
      0.25, 0.75;
  p.sigma2 = sigma2;
  return ChainedAttention(std::move(p));
}

/// CA-3 (log-space rescue): as the likelihood drops from e^-300 (probability space) through e^-600 (below the 1e-250
/// rescue threshold, still representable) to e^-1000 and e^-5000 (underflows to 0 in probability space), log p, γ
/// and ξ equal the log-space reference (rtol 1e-9 on log p, atol 1e-9 on marginals), and the E-step statistics are
/// finite with the right masses.
TEST(ChainedAttentionTest, UnderflowingRowsAreRescuedInLogSpace) {
  const ChainedAttentionBatch row = one_row({0, 1, 2}, {1, 2, 0}, 0, 0);
  for (const double gap : {300.0, 600.0, 1000.0, 5000.0}) {
    SCOPED_TRACE("gap " + std::to_string(gap));
    const ChainedAttention model = underflow_model(gap);
    const Marginals reference = log_space_reference(model, row, 0);
    ASSERT_TRUE(std::isfinite(reference.log_p));
    ASSERT_LT(reference.log_p, -gap + 1.0);  // the construction really is that unlikely
    const double log_p = log_densities(model, row)[0];
    EXPECT_NEAR(log_p, reference.log_p, 1e-9 * std::fabs(reference.log_p));
    const ChainedAttentionPosterior post = model.posterior(row, 0);
    EXPECT_NEAR(post.log_p, reference.log_p, 1e-9 * std::fabs(reference.log_p));
    ExpectAllClose(post.gamma, reference.gamma, 0.0, 1e-9);
    ExpectAllClose(row_sums(post.gamma), Matrix::Ones(1, 3), 0.0, 1e-9);
    for (size_t hop = 0; hop < 2; ++hop) ExpectAllClose(post.xi[hop], reference.xi[hop], 0.0, 1e-9);

    auto acc = model.make_accumulator();
    model.accumulate(row, std::vector<double>{2.0}, acc);
    for (double x : packed(acc)) EXPECT_TRUE(std::isfinite(x));
    ExpectedStats expected(3, 3, 2);
    expected.add(row, 0, 2.0, reference.gamma, reference.xi, reference.log_p);
    expected.expect_close_to(acc, 1e-9, 1e-9);
  }
}

/// docs/mechanisms.md#chained-attention: log p = −∞ iff B[v_j, t] = 0 for every position j; the posterior of such a row
/// is all zeros (never NaN); a row with one emitting position stays finite however unlikely that position is.
TEST(ChainedAttentionTest, AllZeroEmissionGivesMinusInfinity) {
  ChainedAttentionParams p;
  p.key_tables = {Matrix::Identity(3, 3), Matrix::Identity(3, 3)};
  p.emission.resize(3, 3);
  p.emission << 0.5, 0.5, 0.0,  //
      0.0, 1.0, 0.0,            //
      0.2, 0.3, 0.5;            // only symbol 2 emits target 2
  p.sigma2 = 1e-3;
  const ChainedAttention model(p);
  const ChainedAttentionBatch impossible = one_row({2, 2, 1, 0}, {0, 1, 1, 0}, 2, 2);
  EXPECT_EQ(log_densities(model, impossible)[0], kNegInfinity);
  const ChainedAttentionPosterior post = model.posterior(impossible, 0);
  EXPECT_EQ(post.log_p, kNegInfinity);
  EXPECT_EQ(post.gamma, Matrix::Zero(2, 4));
  EXPECT_EQ(post.xi[0], Matrix::Zero(4, 4));
  // The same context with one position whose value (2) emits target 2 is possible.
  const ChainedAttentionBatch barely = one_row({2, 2, 1, 0}, {0, 1, 2, 0}, 2, 2);
  EXPECT_TRUE(std::isfinite(log_densities(model, barely)[0]));
}

// ----- CA-5: strict validation ------------------------------------------------------------------------------------

/// CA-5: the constructor rejects a non-simplex emission, non-square, ragged or mismatched key tables, no tables,
/// non-finite keys and a non-positive σ² (ValueError).
TEST(ChainedAttentionTest, ConstructorRejectsInvalidParameters) {
  ChainedAttentionParams good;
  good.key_tables = {Matrix::Zero(2, 2), Matrix::Identity(2, 2)};
  good.emission.resize(2, 2);
  good.emission << 0.5, 0.5, 0.5, 0.5;
  good.sigma2 = 0.1;
  EXPECT_NO_THROW(ChainedAttention{good});

  ChainedAttentionParams p = good;
  p.emission << 1.1, -0.1, 0.5, 0.5;  // docs/mechanisms.md#chained-attention example
  EXPECT_THROW(ChainedAttention{p}, ValueError);
  p.emission << 0.5, 0.5, 0.5, 0.5 + 1e-9;  // off by more than 1e-12
  EXPECT_THROW(ChainedAttention{p}, ValueError);
  p = good;
  p.emission = Matrix::Constant(3, 2, 0.5);  // S = 3 emission rows, tables are 2 × 2
  EXPECT_THROW(ChainedAttention{p}, ValueError);

  p = good;
  p.key_tables = {Matrix::Zero(2, 3), Matrix::Zero(2, 3)};  // non-square
  EXPECT_THROW(ChainedAttention{p}, ValueError);
  p.key_tables = {Matrix::Zero(2, 2), Matrix::Zero(3, 3)};  // ragged across hops
  EXPECT_THROW(ChainedAttention{p}, ValueError);
  p.key_tables = {Matrix::Zero(2, 2), Matrix::Zero(2, 1)};
  EXPECT_THROW(ChainedAttention{p}, ValueError);
  p.key_tables = {};  // L = 0
  EXPECT_THROW(ChainedAttention{p}, ValueError);
  p.key_tables = {Matrix::Zero(0, 0)};
  EXPECT_THROW(ChainedAttention{p}, ValueError);
  p = good;
  p.key_tables[1](0, 1) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(ChainedAttention{p}, ValueError);
  p = good;
  for (const double bad : {0.0, -0.1, std::numeric_limits<double>::infinity()}) {
    p.sigma2 = bad;
    EXPECT_THROW(ChainedAttention{p}, ValueError) << "sigma2 " << bad;
  }

  try {
    p = good;
    p.emission << 1.1, -0.1, 0.5, 0.5;
    ChainedAttention m(p);
    FAIL() << "non-simplex emission accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("emission"), std::string::npos) << e.what();
  }

  EXPECT_THROW(ChainedAttentionEstimator(0, 2, 2), ValueError);
  EXPECT_THROW(ChainedAttentionEstimator(1, 0, 2), ValueError);
  EXPECT_THROW(ChainedAttentionEstimator(1, 2, 0), ValueError);
  ChainedAttentionEstimatorOptions bad;
  bad.sigma2 = 0.0;
  EXPECT_THROW(ChainedAttentionEstimator(1, 2, 2, bad), ValueError);
  bad = {};
  bad.emission_smoothing = -1e-3;
  EXPECT_THROW(ChainedAttentionEstimator(1, 2, 2, bad), ValueError);
  EXPECT_THROW(ChainedAttentionAccumulator(0, 2, 2), ValueError);
}

/// Expects f to throw ValueError whose message contains "out-of-range ID".
template <class F>
void ExpectOutOfRangeId(F&& f, const std::string& context) {
  try {
    f();
    ADD_FAILURE() << context << ": accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("out-of-range ID"), std::string::npos) << context << ": " << e.what();
  }
}

/// CA-5: the encoder rejects negative and out-of-range ids (declared bounds) and inconsistent shapes; a batch from an
/// undeclared encoder with ids beyond a smaller model's S or T is rejected by log_density, accumulate, posterior and
/// predict_proba.
TEST(ChainedAttentionTest, InvalidIdsAndShapesAreRejected) {
  Rng rng(testing::test_seed(40));
  const ChainedAttention model = random_model(2, 4, 3, 0.1, rng);  // S = 4, T = 3
  const ChainedAttentionEncoder enc = model.encoder();
  ExpectOutOfRangeId([&] { (void)one_row({0, 4}, {1, 2}, 0, 0, enc); }, "key = S");
  ExpectOutOfRangeId([&] { (void)one_row({0, 1}, {1, 7}, 0, 0, enc); }, "value > S");
  ExpectOutOfRangeId([&] { (void)one_row({0, 1}, {1, 2}, 4, 0, enc); }, "query = S");
  ExpectOutOfRangeId([&] { (void)one_row({0, 1}, {1, 2}, 0, 3, enc); }, "target = T");
  ExpectOutOfRangeId([&] { (void)one_row({0, -1}, {1, 2}, 0, 0, enc); }, "negative key");
  ExpectOutOfRangeId([&] { (void)one_row({0, 1}, {1, 2}, 0, -2, enc); }, "negative target");
  // Negative ids are rejected even without declared bounds.
  ExpectOutOfRangeId([&] { (void)one_row({0, 1}, {-1, 2}, 0, 0); }, "undeclared negative value");
  ExpectOutOfRangeId([&] { (void)one_row({0, 1}, {1, 2}, -1, 0); }, "undeclared negative query");
  EXPECT_THROW((void)one_row({0, 1, 2}, {1, 2}, 0, 0, enc), ValueError);  // keys and values differ in width
  EXPECT_THROW((void)enc.encode(IdMatrix::Zero(2, 3), IdMatrix::Zero(2, 3), IdVector::Zero(1), IdVector::Zero(2)),
               ValueError);
  EXPECT_THROW((void)enc.encode(IdMatrix::Zero(2, 3), IdMatrix::Zero(2, 3), IdVector::Zero(2), IdVector::Zero(3)),
               ValueError);
  EXPECT_THROW((void)enc.encode(IdMatrix::Zero(2, 3), IdMatrix::Zero(1, 3), IdVector::Zero(2), IdVector::Zero(2)),
               ValueError);
  EXPECT_THROW((void)enc.encode(IdMatrix::Zero(2, 0), IdMatrix::Zero(2, 0), IdVector::Zero(2), IdVector::Zero(2)),
               ValueError);  // width N = 0

  std::vector<double> out(1);
  const std::vector<double> w{1.0};
  for (const auto& [batch, what] : {std::pair{one_row({0, 5}, {1, 2}, 0, 0), "key >= S"},
                                    std::pair{one_row({0, 1}, {1, 4}, 0, 0), "value >= S"},
                                    std::pair{one_row({0, 1}, {1, 2}, 9, 0), "query >= S"},
                                    std::pair{one_row({0, 1}, {1, 2}, 0, 3), "target >= T"}}) {
    ExpectOutOfRangeId([&] { model.log_density(batch, out); }, std::string("log_density ") + what);
    auto acc = model.make_accumulator();
    ExpectOutOfRangeId([&] { model.accumulate(batch, w, acc); }, std::string("accumulate ") + what);
    EXPECT_EQ(packed(acc), packed(model.make_accumulator()));
    EXPECT_THROW((void)model.posterior(batch, 0), ValueError) << what;
    Rng init(1);
    EXPECT_THROW(acc.initialize(batch, w, init), ValueError) << what;
  }
  ExpectOutOfRangeId([&] { (void)model.predict_proba(one_row({0, 5}, {1, 2}, 0, 0)); }, "predict_proba(batch)");
  ExpectOutOfRangeId(
      [&] { (void)model.predict_proba(IdMatrix::Constant(1, 2, 4), IdMatrix::Zero(1, 2), IdVector::Zero(1)); },
      "predict_proba(ids)");
  // An accumulator of another layout is rejected by the E-step.
  ChainedAttentionAccumulator wrong(2, 5, 3);
  EXPECT_THROW(model.accumulate(one_row({0, 1}, {1, 2}, 0, 0), w, wrong), ValueError);
  EXPECT_THROW((void)model.sampler(1, 0), ValueError);  // context_length must be ≥ 1
}

/// The reference impossible case of docs/mechanisms.md#chained-attention (B = [[1,0],[1,0]], keys [0,1], values [0,1],
/// q 0, t 1).
ChainedAttention reference_impossible_model(Rng& rng) {
  ChainedAttentionParams p;
  for (int hop = 0; hop < 2; ++hop) {
    Matrix K(2, 2);
    for (Index k = 0; k < 4; ++k) K.data()[k] = rng.normal();
    p.key_tables.push_back(K);
  }
  p.emission.resize(2, 2);
  p.emission << 1.0, 0.0, 1.0, 0.0;
  return ChainedAttention(std::move(p));
}

/// CA-5 / docs/mechanisms.md#chained-attention: log_density = −∞; accumulate throws ImpossibleEvidenceError listing row
/// 0 and leaves the packed statistics bit-identical; with zero weight the row is accepted and contributes nothing.
TEST(ChainedAttentionTest, ReferenceImpossibleCaseLeavesStatisticsUnchanged) {
  Rng rng(testing::test_seed(41));
  const ChainedAttention model = reference_impossible_model(rng);
  const ChainedAttentionBatch impossible = one_row({0, 1}, {0, 1}, 0, 1);
  EXPECT_EQ(log_densities(model, impossible)[0], kNegInfinity);

  auto acc = model.make_accumulator();
  model.accumulate(one_row({1, 0}, {1, 1}, 1, 0), std::vector<double>{1.5}, acc);  // something to protect
  const std::vector<double> before = packed(acc);
  try {
    model.accumulate(impossible, std::vector<double>{1.0}, acc);
    FAIL() << "impossible evidence accepted";
  } catch (const ImpossibleEvidenceError& e) {
    EXPECT_EQ(e.rows(), std::vector<int64_t>{0});
    EXPECT_NE(std::string(e.what()).find("impossible evidence at rows [0]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(packed(acc), before);
  model.accumulate(impossible, std::vector<double>{0.0}, acc);
  EXPECT_EQ(packed(acc), before);
}

/// CA-5: an impossible row in the middle of a batch of valid rows: the E-step (direct and chunk-parallel) names
/// exactly that row, changes nothing, and with that row's weight 0 equals the E-step of the other rows.
TEST(ChainedAttentionTest, ImpossibleRowInsideBatchIsAtomic) {
  Rng rng(testing::test_seed(42));
  const ChainedAttention model = reference_impossible_model(rng);
  IdMatrix keys(5, 2), values(5, 2);
  keys << 0, 1, 1, 0, 0, 1, 1, 1, 0, 0;
  values << 1, 0, 0, 1, 0, 1, 1, 1, 0, 0;
  const IdVector queries = (IdVector(5) << 0, 1, 0, 1, 1).finished();
  const IdVector targets = (IdVector(5) << 0, 0, 1, 0, 0).finished();  // row 2 is the reference impossible case
  const ChainedAttentionBatch batch = model.encoder().encode(keys, values, queries, targets);
  const std::vector<double> log_p = log_densities(model, batch);
  for (Index n = 0; n < 5; ++n) {
    if (n == 2)
      EXPECT_EQ(log_p[2], kNegInfinity);
    else
      EXPECT_NEAR(log_p[static_cast<size_t>(n)], 0.0, 1e-12) << "row " << n;  // B[·, 0] = 1: p = 1
  }

  auto acc = model.make_accumulator();
  model.accumulate(batch.slice(0, 2), std::vector<double>{0.5, 2.0}, acc);
  const std::vector<double> before = packed(acc);
  const std::vector<double> ones(5, 1.0);
  try {
    model.accumulate(batch, ones, acc);
    FAIL() << "impossible evidence accepted";
  } catch (const ImpossibleEvidenceError& e) {
    EXPECT_EQ(e.rows(), std::vector<int64_t>{2});
  }
  EXPECT_EQ(packed(acc), before);
  try {
    parallel_accumulate(model, batch, ones, acc, {}, ParallelOptions{2, 1});
    FAIL() << "impossible evidence accepted (parallel)";
  } catch (const ImpossibleEvidenceError& e) {
    EXPECT_EQ(e.rows(), std::vector<int64_t>{2});
  }
  EXPECT_EQ(packed(acc), before);

  std::vector<double> w = ones;
  w[2] = 0.0;
  auto with_zero = model.make_accumulator();
  model.accumulate(batch, w, with_zero);
  auto others = model.make_accumulator();
  model.accumulate(batch.slice(0, 2), std::vector<double>{1.0, 1.0}, others);
  model.accumulate(batch.slice(3, 2), std::vector<double>{1.0, 1.0}, others);
  EXPECT_EQ(packed(with_zero), packed(others));
}

// ----- CA-6: sampler ----------------------------------------------------------------------------------------------

/// CA-6: the sampler honours context_length (batches and single observations), and sample(m) equals m consecutive
/// sample() draws.
TEST(ChainedAttentionTest, SamplerHonoursContextLength) {
  Rng rng(testing::test_seed(43));
  const ChainedAttention model = random_model(2, 8, 3, 0.2, rng);
  for (const int64_t N : {1, 3, 11}) {
    const ChainedAttentionBatch batch = model.sampler(5, N).sample(7);
    EXPECT_EQ(batch.n_rows(), 7);
    EXPECT_EQ(batch.context_length(), N);
    EXPECT_EQ(batch.keys().cols(), N);
    EXPECT_EQ(batch.values().cols(), N);
    auto sampler = ChainedAttentionSampler(model, 5, N);
    for (Index k = 0; k < 7; ++k) {
      const ChainedAttentionObservation obs = sampler.sample();
      ASSERT_EQ(obs.keys.size(), static_cast<size_t>(N));
      ASSERT_EQ(obs.values.size(), static_cast<size_t>(N));
      for (Index j = 0; j < N; ++j) {
        EXPECT_EQ(batch.keys(k)[j], obs.keys[static_cast<size_t>(j)]);
        EXPECT_EQ(batch.values(k)[j], obs.values[static_cast<size_t>(j)]);
      }
      EXPECT_EQ(batch.query(k), obs.query);
      EXPECT_EQ(batch.target(k), obs.target);
    }
  }
  EXPECT_EQ(model.sampler(5, 4).sample(Index{0}).n_rows(), 0);
}

/// The sampler walks the chain of docs/mechanisms.md#chained-attention: for every target t, the frequency of t equals
/// the mean over the sampled contexts of p(t | k, v, q) = predict_proba (within 5 standard errors), and identical seeds
/// give identical draws.
TEST(ChainedAttentionTest, SamplerTargetsFollowModel) {
  Rng rng(testing::test_seed(44));
  const Index S = 5, T = 3, n = 20000;
  const ChainedAttention model = random_model(2, S, T, 0.2, rng);
  const ChainedAttentionBatch batch = model.sampler(11, 4).sample(n);
  const Matrix proba = model.predict_proba(batch);
  for (Index t = 0; t < T; ++t) {
    double freq = 0.0;
    for (Index k = 0; k < n; ++k) freq += batch.target(k) == t ? 1.0 : 0.0;
    freq /= static_cast<double>(n);
    const double expected = proba.col(t).mean();
    EXPECT_NEAR(freq, expected, 5.0 * std::sqrt(expected * (1.0 - expected) / static_cast<double>(n))) << "t " << t;
  }
  // Keys, values and queries are uniform over [S].
  double key_mean = 0.0;
  for (Index k = 0; k < n; ++k) key_mean += static_cast<double>(batch.keys(k)[0]) / static_cast<double>(n);
  EXPECT_NEAR(key_mean, (S - 1) / 2.0, 5.0 * std::sqrt(2.0 / static_cast<double>(n)));
  const ChainedAttentionBatch again = model.sampler(11, 4).sample(n);
  EXPECT_EQ(again.targets(), batch.targets());
  EXPECT_EQ(again.keys(), batch.keys());
}

// ----- CA-7: memory -----------------------------------------------------------------------------------------------

/// Bytes of address space currently mapped by this process (/proc/self/statm, field 1).
std::optional<size_t> mapped_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return std::nullopt;
  unsigned long pages = 0;
  const int read = std::fscanf(f, "%lu", &pages);
  std::fclose(f);
  if (read != 1) return std::nullopt;
  return static_cast<size_t>(pages) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

/// CA-7: a one-row E-step with N = 256, S = 1024, L = 2 runs with at most 64 MiB of address space beyond what the
/// model and the accumulator already hold. Measured as a hard cap: in a child process (a death test), RLIMIT_AS is
/// set to the current mapping + 64 MiB and the E-step must complete; the child then checks that the same cap does
/// reject an (N, N, S) tensor of doubles (512 MiB), so the test would catch one. Child exit codes: 0 pass,
/// 2 the E-step ran out of memory, 3 the 512 MiB tensor fit under the cap (the cap does not bite), 4 no /proc.
TEST(ChainedAttentionTest, EStepNeverAllocatesAnNNSTensor) {
  if (kAddressSanitizer) GTEST_SKIP() << "RLIMIT_AS cannot be used under AddressSanitizer";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Rng rng(testing::test_seed(45));
  const Index L = 2, S = 1024, N = 256, T = 4;
  const ChainedAttention model = random_model(L, S, T, 0.1, rng, 0.05);
  const ChainedAttentionBatch row = random_rows(1, N, S, T, rng);
  auto acc = model.make_accumulator();
  const std::vector<double> w{1.0};
  constexpr size_t kBudget = size_t{64} << 20;
  // The child: cap the address space, run the E-step, then check that the cap rejects an (N, N, S) tensor.
  const auto capped_estep = [&] {
    const std::optional<size_t> now = mapped_bytes();
    if (!now) std::_Exit(4);
    const rlimit cap{*now + kBudget, *now + kBudget};
    setrlimit(RLIMIT_AS, &cap);
    try {
      model.accumulate(row, w, acc);
    } catch (const std::bad_alloc&) {
      std::_Exit(2);
    }
    if (!(acc.n() == 1.0)) std::_Exit(5);
    try {
      std::vector<double> tensor(static_cast<size_t>(N * N * S), 1.0);
      std::_Exit(tensor[12345] == 1.0 ? 3 : 6);
    } catch (const std::bad_alloc&) {
    }
    std::_Exit(0);
  };
  EXPECT_EXIT(capped_estep(), ::testing::ExitedWithCode(0), "");
}

// ----- seq_initialize ---------------------------------------------------------------------------------------------

/// docs/mechanisms.md#chained-attention seq_initialize: the statistics equal the formulas applied to independent draws,
/// in the documented order, from the same seed (γ_ℓ ~ Dirichlet(1_N) for every hop, all rows, hop-major; then ξ_ℓ ~
/// Dirichlet(1_{N²}) for ℓ = 0..L−2); the mass laws hold (Σ key_mass[ℓ] = n = Σ w, Σ emission_count = n); ll is
/// untouched; zero-weight rows still consume their draws; the same seed gives the same bits.
TEST(ChainedAttentionTest, InitializeDrawsDocumentedOrderAndKeepsMassLaws) {
  const uint64_t seed = testing::test_seed(46);
  Rng data_rng(seed);
  const Index L = 3, N = 4, S = 5, T = 3, n = 9;
  const ChainedAttentionBatch batch = random_rows(n, N, S, T, data_rng);
  std::vector<double> w(static_cast<size_t>(n));
  for (double& x : w) x = 0.5 + data_rng.uniform();
  w[3] = 0.0;
  const double total_w = std::accumulate(w.begin(), w.end(), 0.0);

  ChainedAttentionAccumulator acc(L, S, T);
  acc.ll() = -7.5;  // ll must be left as it is
  Rng rng(seed + 1);
  acc.initialize(batch, w, rng);

  // Oracle: the documented draws from a copy of the stream.
  Rng oracle(seed + 1);
  std::vector<Matrix> gamma(static_cast<size_t>(n), Matrix(L, N));
  std::vector<std::vector<Matrix>> xi(static_cast<size_t>(n), std::vector<Matrix>(static_cast<size_t>(L - 1), Matrix(N, N)));
  for (Index hop = 0; hop < L; ++hop)
    for (Index r = 0; r < n; ++r) {
      std::vector<double> g(static_cast<size_t>(N));
      oracle.dirichlet_ones(g);
      for (Index i = 0; i < N; ++i) gamma[static_cast<size_t>(r)](hop, i) = g[static_cast<size_t>(i)];
    }
  for (Index hop = 0; hop + 1 < L; ++hop)
    for (Index r = 0; r < n; ++r) oracle.dirichlet_ones({xi[static_cast<size_t>(r)][static_cast<size_t>(hop)].data(), static_cast<size_t>(N * N)});
  ExpectedStats expected(L, S, T);
  for (Index r = 0; r < n; ++r)
    if (w[static_cast<size_t>(r)] > 0.0)
      expected.add(batch, r, w[static_cast<size_t>(r)], gamma[static_cast<size_t>(r)], xi[static_cast<size_t>(r)], 0.0,
                   /*with_ll=*/false);
  expected.ll = -7.5;
  expected.expect_close_to(acc, 1e-12, 1e-15);
  EXPECT_EQ(acc.ll(), -7.5);
  EXPECT_EQ(rng.next_u64(), oracle.next_u64());  // the same number of draws (zero-weight row 3 included)

  for (Index hop = 0; hop < L; ++hop) EXPECT_NEAR(acc.key_mass().row(hop).sum(), total_w, 1e-12 * total_w);
  EXPECT_NEAR(Matrix(acc.emission_count()).sum(), total_w, 1e-12 * total_w);
  EXPECT_NEAR(acc.n(), total_w, 1e-12 * total_w);
  EXPECT_NO_THROW(acc.validate("test"));

  ChainedAttentionAccumulator again(L, S, T);
  again.ll() = -7.5;
  Rng same(seed + 1);
  again.initialize(batch, w, same);
  EXPECT_EQ(packed(again), packed(acc));
  ChainedAttentionAccumulator other(L, S, T);
  other.ll() = -7.5;
  Rng different(seed + 2);
  other.initialize(batch, w, different);
  EXPECT_NE(packed(other), packed(acc));
}

// ----- M-step -----------------------------------------------------------------------------------------------------

/// docs/mechanisms.md#chained-attention M-step on a hand-built accumulator: K⁽ℓ⁾[s] = key_num[ℓ][s] /
/// max(key_mass[ℓ][s], 1e-9), B = (emission_count + ε) row-normalised (a zero-total row uniform when ε = 0), σ² the
/// estimator's exactly, name kept.
TEST(ChainedAttentionTest, EstimateMatchesHandComputedValues) {
  const ChainedAttentionAccumulator acc = hand_accumulator();
  ChainedAttentionEstimatorOptions options;
  options.sigma2 = 0.37;
  options.emission_smoothing = 0.5;
  options.name = "head";
  const ChainedAttention fit = ChainedAttentionEstimator(2, 3, 2, options).estimate(2.0, acc);
  const ChainedAttentionParams& p = fit.params();
  ASSERT_EQ(p.key_tables.size(), 2u);
  Matrix K0(3, 3), K1(3, 3), B(3, 2);
  K0 << 2.0 / 3.0, 1.0 / 3.0, 0.0,  //
      0.0, 0.0, 0.0,                 //
      0.5, 0.0, 0.5;
  K1 << 0.0, 1.0, 0.0,  //
      0.5, 0.0, 0.5,     // (0.75, 0, 0.75 − 1e-12) / (1.5 − 1e-12)
      1e-3, 0.0, 0.0;    // 1e-12 / max(1e-12, 1e-9)
  B << 0.75, 0.25,  // (1.5, 0.5) / 2
      0.5, 0.5,     // (1, 1) / 2
      0.5, 0.5;     // (0.5, 0.5) / 1
  ExpectAllClose(p.key_tables[0], K0, 1e-15, 0.0);
  ExpectAllClose(p.key_tables[1], K1, 1e-11, 0.0);
  ExpectAllClose(p.emission, B, 1e-15, 0.0);
  EXPECT_EQ(p.sigma2, 0.37);
  EXPECT_EQ(p.name, "head");

  // Default smoothing 1e-4.
  const ChainedAttentionParams q = ChainedAttentionEstimator(2, 3, 2).estimate(std::nullopt, acc).params();
  EXPECT_EQ(q.sigma2, 0.1);
  Matrix B_default(3, 2);
  B_default << 1.0001 / 1.0002, 0.0001 / 1.0002, 0.5, 0.5, 0.5, 0.5;
  ExpectAllClose(q.emission, B_default, 1e-14, 0.0);

  // No smoothing: the zero-total row becomes uniform, a zero count stays exactly zero.
  options.emission_smoothing = 0.0;
  const ChainedAttentionParams r = ChainedAttentionEstimator(2, 3, 2, options).estimate(std::nullopt, acc).params();
  EXPECT_EQ(r.emission(0, 0), 1.0);
  EXPECT_EQ(r.emission(0, 1), 0.0);
  EXPECT_EQ(r.emission(2, 0), 0.5);
  EXPECT_EQ(r.emission(2, 1), 0.5);
}

/// Expects f to throw ValueError naming a mass law ("cannot exceed" / "must equal").
template <class F>
void ExpectMassLawError(F&& f, const std::string& context) {
  try {
    f();
    ADD_FAILURE() << context << ": accepted";
  } catch (const ValueError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("cannot exceed") != std::string::npos || what.find("must equal") != std::string::npos)
        << context << ": " << what;
  }
}

/// docs/mechanisms.md#building-blocks / docs/mechanisms.md#chained-attention: estimate rejects nobs ≠ n and statistics
/// of another layout; combine, from_value, unpack and estimate reject statistics that break Σ key_mass[ℓ] = n or Σ
/// emission_count = n, and change nothing.
TEST(ChainedAttentionTest, MassLawViolationsAreRejected) {
  const ChainedAttentionAccumulator acc = hand_accumulator();
  const ChainedAttentionEstimator est(2, 3, 2);
  EXPECT_NO_THROW((void)est.estimate(2.0, acc));
  EXPECT_NO_THROW((void)est.estimate(2.0 * (1.0 + 1e-7), acc));  // within tol_mass
  ExpectMassLawError([&] { (void)est.estimate(1.0, acc); }, "nobs below n");
  ExpectMassLawError([&] { (void)est.estimate(3.0, acc); }, "nobs above n");
  EXPECT_THROW((void)ChainedAttentionEstimator(2, 3, 3).estimate(std::nullopt, ChainedAttentionAccumulator(2, 3, 2)),
               ValueError);

  ChainedAttentionAccumulator key_mass_broken = acc;
  key_mass_broken.key_mass()(1, 0) += 0.5;  // Σ key_mass[1] = 2.5 > n
  ChainedAttentionAccumulator emission_broken = acc;
  emission_broken.emission_count()(1, 1) -= 0.5;  // Σ emission_count = 1.5 < n
  ChainedAttentionAccumulator negative = acc;
  negative.key_num(0)(0, 0) = -1.0;  // a negative count
  for (const auto& [bad, what] : {std::pair{&key_mass_broken, "key_mass"}, std::pair{&emission_broken, "emission"}}) {
    ChainedAttentionAccumulator target = hand_accumulator();
    const std::vector<double> before = packed(target);
    ExpectMassLawError([&] { target.combine(*bad); }, std::string("combine ") + what);
    ExpectMassLawError([&] { target.from_value(*bad); }, std::string("from_value ") + what);
    ExpectMassLawError([&] { target.unpack(packed(*bad)); }, std::string("unpack ") + what);
    ExpectMassLawError([&] { (void)est.estimate(std::nullopt, *bad); }, std::string("estimate ") + what);
    EXPECT_EQ(packed(target), before) << what;
  }
  ChainedAttentionAccumulator target = hand_accumulator();
  const std::vector<double> before = packed(target);
  EXPECT_THROW(target.combine(negative), ValueError);
  EXPECT_THROW(target.unpack(packed(negative)), ValueError);
  EXPECT_EQ(packed(target), before);
}

// ----- determinism, fitting, composition --------------------------------------------------------------------------

/// docs/mechanisms.md#training: the packed statistics and per-row log densities of parallel_accumulate are bitwise
/// identical for 1 and 2 threads at chunk sizes 1, 7 and 64, and agree with the serial E-step at rounding level.
TEST(ChainedAttentionTest, ParallelStatisticsAreThreadCountInvariant) {
  Rng rng(testing::test_seed(47));
  const ChainedAttention model = random_model(3, 6, 4, 0.3, rng);
  const Index n = 150;
  const ChainedAttentionBatch batch = model.sampler(8, 5).sample(n);
  std::vector<double> w(static_cast<size_t>(n));
  for (double& x : w) x = 0.25 + 1.75 * rng.uniform();
  auto serial = model.make_accumulator();
  model.accumulate(batch, w, serial);
  for (const Index chunk : {Index{1}, Index{7}, Index{64}}) {
    SCOPED_TRACE("chunk_rows " + std::to_string(chunk));
    std::vector<std::vector<double>> stats, log_ps;
    for (const int threads : {1, 2}) {
      auto acc = model.make_accumulator();
      std::vector<double> log_p(static_cast<size_t>(n));
      parallel_accumulate(model, batch, w, acc, log_p, ParallelOptions{threads, chunk});
      stats.push_back(packed(acc));
      log_ps.push_back(log_p);
    }
    EXPECT_EQ(stats[1], stats[0]);
    EXPECT_EQ(log_ps[1], log_ps[0]);
    ExpectAllClose(stats[0], packed(serial), 1e-12, 1e-12);
  }
}

/// docs/mechanisms.md#training / F-6: optimize() gives bitwise-identical models and scores for 1 and 2 threads.
TEST(ChainedAttentionTest, OptimizeIsThreadCountInvariant) {
  const ChainedAttentionBatch data = make_transitive_task(300, testing::test_seed(48));
  std::vector<OptimizeResult<ChainedAttention>> fits;
  for (const int threads : {1, 2}) {
    OptimizeOptions options;
    options.max_its = 4;
    options.delta = std::nullopt;
    options.seed = 5;
    options.n_threads = threads;
    options.chunk_rows = 32;
    fits.push_back(optimize(data, ChainedAttentionEstimator(2, 30, 30), options));
  }
  EXPECT_EQ(fits[1].scores, fits[0].scores);
  EXPECT_EQ(fits[1].best_iteration, fits[0].best_iteration);
  const ChainedAttentionParams& a = fits[0].model.params();
  const ChainedAttentionParams& b = fits[1].model.params();
  ASSERT_EQ(a.key_tables.size(), b.key_tables.size());
  for (size_t hop = 0; hop < a.key_tables.size(); ++hop) EXPECT_EQ(a.key_tables[hop], b.key_tables[hop]);
  EXPECT_EQ(a.emission, b.emission);
}

/// Fraction of rows whose argmax_t predict_proba equals the target.
double accuracy_of(const ChainedAttention& model, const ChainedAttentionBatch& batch) {
  const Matrix proba = model.predict_proba(batch);
  double hits = 0.0;
  for (Index n = 0; n < batch.n_rows(); ++n) {
    Index best = 0;
    proba.row(n).maxCoeff(&best);
    hits += best == batch.target(n) ? 1.0 : 0.0;
  }
  return hits / static_cast<double>(batch.n_rows());
}

/// optimize() fits a 2-hop model on a small transitive task: every reported score is finite, the returned model's
/// score is the best reported one, it beats the initial model's, and held-out accuracy is far above chance (1/30).
TEST(ChainedAttentionTest, OptimizeFitsTransitiveTask) {
  const uint64_t seed = testing::test_seed(49);
  const ChainedAttentionBatch train = make_transitive_task(500, seed);
  const ChainedAttentionBatch test = make_transitive_task(500, seed + 1000);
  OptimizeOptions options;
  options.max_its = 10;
  options.delta = std::nullopt;
  options.seed = seed;
  std::vector<double> lls;
  options.on_iteration = [&](const IterationReport& r) { lls.push_back(r.log_likelihood); };
  const auto fit = optimize(train, ChainedAttentionEstimator(2, 30, 30), options);
  ASSERT_EQ(lls.size(), 10u);
  for (double ll : lls) EXPECT_TRUE(std::isfinite(ll));
  const double final_score = score(fit.model, train, {});
  EXPECT_GE(final_score, *std::max_element(lls.begin(), lls.end()));
  EXPECT_GT(final_score, lls.front());
  const double acc = accuracy_of(fit.model, test);
  RecordProperty("two_hop_accuracy", std::to_string(acc));
  EXPECT_GT(acc, 0.5) << "seed " << seed;
}

/// Composition (docs/mechanisms.md#building-blocks): a 2-component mixture of chained-attention heads fits through
/// optimize() (10 iterations): finite scores, weights summing to 1, chained components; the mixture density equals
/// log(Σ_k w_k p_k) computed from the components.
TEST(ChainedAttentionTest, FitsInsideTwoComponentMixture) {
  const ChainedAttentionBatch data = make_transitive_task(300, testing::test_seed(50));
  const AnyEstimator component(ChainedAttentionEstimator(2, 30, 30));
  const MixtureEstimator est({component, component});
  OptimizeOptions options;
  options.max_its = 10;
  options.seed = 3;
  std::vector<double> lls;
  options.on_iteration = [&](const IterationReport& r) { lls.push_back(r.log_likelihood); };
  const auto fit = optimize(AnyBatch(data), est, options);
  ASSERT_FALSE(lls.empty());
  for (double ll : lls) EXPECT_TRUE(std::isfinite(ll));
  const Mixture& mix = fit.model;
  ASSERT_EQ(mix.components().size(), 2u);
  EXPECT_NEAR(mix.weights().sum(), 1.0, 1e-12);
  const ChainedAttention* c0 = mix.components()[0].get_if<ChainedAttention>();
  const ChainedAttention* c1 = mix.components()[1].get_if<ChainedAttention>();
  ASSERT_NE(c0, nullptr);
  ASSERT_NE(c1, nullptr);
  std::vector<double> lm(static_cast<size_t>(data.n_rows()));
  mix.log_density(AnyBatch(data), lm);
  const std::vector<double> l0 = log_densities(*c0, data), l1 = log_densities(*c1, data);
  for (size_t n = 0; n < lm.size(); ++n) {
    const double direct = std::log(mix.weights()[0] * std::exp(l0[n]) + mix.weights()[1] * std::exp(l1[n]));
    EXPECT_NEAR(lm[n], direct, 1e-12 * std::max(1.0, std::fabs(direct))) << "row " << n;
  }
}

// ----- model files ------------------------------------------------------------------------------------------------

/// F-7 / docs/model-format.md: save → load of a chained model (through the file and through the JSON document) is
/// bit-identical, keeps the name, and is stored under the family "chained_attention" with params keys/emission/sigma2.
TEST(ChainedAttentionTest, ModelFileRoundTripIsBitIdentical) {
  Rng rng(testing::test_seed(51));
  ChainedAttentionParams p = random_model(3, 5, 4, 0.1, rng).params();
  p.key_tables[1](2, 3) = 1.0 / 3.0;  // needs all 17 digits
  p.sigma2 = 0.1 + 1e-17;
  p.name = "chain";
  const AnyDistribution model{ChainedAttention(p)};
  const nlohmann::json doc = model_to_json(model);
  EXPECT_EQ(doc.at("family"), "chained_attention");
  EXPECT_TRUE(doc.at("params").contains("keys"));
  EXPECT_TRUE(doc.at("params").contains("emission"));
  EXPECT_TRUE(doc.at("params").contains("sigma2"));

  const auto check_same = [&](const AnyDistribution& loaded) {
    const ChainedAttention* m = loaded.get_if<ChainedAttention>();
    ASSERT_NE(m, nullptr);
    const ChainedAttentionParams& q = m->params();
    ASSERT_EQ(q.key_tables.size(), p.key_tables.size());
    for (size_t hop = 0; hop < p.key_tables.size(); ++hop) EXPECT_EQ(q.key_tables[hop], p.key_tables[hop]);
    EXPECT_EQ(q.emission, p.emission);
    EXPECT_EQ(q.sigma2, p.sigma2);
    EXPECT_EQ(q.name, p.name);
  };
  check_same(model_from_json(doc, "doc"));
  check_same(model_from_json(nlohmann::json::parse(doc.dump()), "text"));
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("attnmix_chained_" + std::to_string(::getpid()) + ".json");
  save_model(model, path.string());
  const AnyDistribution loaded = load_model(path.string());
  std::filesystem::remove(path);
  check_same(loaded);
}

/// Expects model_from_json to throw ValueError whose message contains `field`.
void ExpectFieldError(const nlohmann::json& doc, const std::string& field, const std::string& context) {
  try {
    (void)model_from_json(doc, "m.json");
    ADD_FAILURE() << context << ": accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << context << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("m.json"), std::string::npos) << context << ": " << e.what();
  }
}

/// docs/model-format.md: a malformed params.keys (2-D, ragged tables, ragged rows, non-square, not an array) or
/// emission is rejected with a ValueError naming the file and the field.
TEST(ChainedAttentionTest, MalformedModelFileNamesTheField) {
  const nlohmann::json good = nlohmann::json::parse(R"({"format": "attnmix-model", "schema_version": 1,
      "family": "chained_attention",
      "params": {"keys": [[[1, 0], [0, 1]]], "emission": [[0.5, 0.5], [1, 0]], "sigma2": 0.1}})");
  EXPECT_NO_THROW((void)model_from_json(good, "m.json"));
  const auto with_keys = [&](const char* keys) {
    nlohmann::json doc = good;
    doc["params"]["keys"] = nlohmann::json::parse(keys);
    return doc;
  };
  ExpectFieldError(with_keys("[[1, 0], [0, 1]]"), "params.keys", "2-D keys");
  ExpectFieldError(with_keys("[[[1, 0], [0, 1]], [[1, 0, 0], [0, 1, 0], [0, 0, 1]]]"), "params.keys", "ragged tables");
  ExpectFieldError(with_keys("[[[1, 0], [0]]]"), "params.keys", "ragged rows");
  ExpectFieldError(with_keys("[[[1, 0, 0], [0, 1, 0]]]"), "params.keys", "non-square");
  ExpectFieldError(with_keys("[]"), "params.keys", "no tables");
  ExpectFieldError(with_keys("3"), "params.keys", "not an array");
  ExpectFieldError(with_keys("[[[1, \"a\"], [0, 1]]]"), "params.keys", "non-numeric entry");
  nlohmann::json doc = good;
  doc["params"]["emission"] = nlohmann::json::parse("[[1.1, -0.1], [0.5, 0.5]]");
  ExpectFieldError(doc, "params.emission", "non-simplex emission");
  doc = good;
  doc["params"]["sigma2"] = 0.0;
  ExpectFieldError(doc, "params.sigma2", "sigma2 = 0");
  doc = good;
  doc["params"].erase("keys");
  ExpectFieldError(doc, "keys", "missing keys");
}

}  // namespace
}  // namespace attnmix
