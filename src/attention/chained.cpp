// SPDX-License-Identifier: Apache-2.0
// Chained attention: the model, exact forward–backward and the E-step (SPEC.md §3.1–§3.3).
//
// Per row, with A_ℓ(i, j) = softmax_j(G⁽ℓ⁺¹⁾[v_i][k_j]) and f(j) = B[v_j, t]:
//   α_0 = softmax_j(G⁽⁰⁾[q][k_j]);  α_{ℓ+1} = α_ℓ A_ℓ;  p = Σ_j α_{L−1}(j) f(j)
//   β_{L−1} = f;  β_ℓ = A_ℓ β_{ℓ+1};  γ_ℓ = α_ℓ β_ℓ / p;  ξ_ℓ(i, j) = α_ℓ(i) A_ℓ(i, j) β_{ℓ+1}(j) / p
// Every α_ℓ is a probability vector (A_ℓ is row-stochastic), so the forward pass needs no rescaling. Entries that
// underflow below 1e-308 carry at most L·N·1e-308 of absolute error into p, so for p ≥ 1e-250 the probability-space
// result meets any relative tolerance above 1e-50; rows with p < 1e-250 (including p = 0) are recomputed in log
// space, where log p = −∞ exactly when f(j) = 0 for every j.
// Cost per row: (L−1)·N² exponentials and O(L·N²) multiply-adds; scratch O(L·N²).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"

namespace attnmix {

namespace {

constexpr double kRescueBelow = 1e-250;  // rows with p below this are recomputed in log space

/// One observation's ids.
struct Row {
  const int64_t* keys;
  const int64_t* values;
  int64_t query;
  int64_t target;
};

Row row_of(const ChainedAttentionBatch& batch, Index n) {
  return {batch.keys(n), batch.values(n), batch.query(n), batch.target(n)};
}

/// Scratch of one row's forward–backward, reused across rows. trans holds A_ℓ (or log A_ℓ) for ℓ = 0..L−2.
struct Workspace {
  Index L, N;
  std::vector<double> trans, alpha, beta, f, gamma, xi, tmp;
  Workspace(Index hops, Index positions)
      : L(hops),
        N(positions),
        trans(static_cast<size_t>((hops - 1) * positions * positions)),
        alpha(static_cast<size_t>(hops * positions)),
        beta(static_cast<size_t>(hops * positions)),
        f(static_cast<size_t>(positions)),
        gamma(static_cast<size_t>(hops * positions)),
        xi(trans.size()),
        tmp(static_cast<size_t>(positions)) {}
  double* A(Index hop) { return trans.data() + hop * N * N; }
  double* a(Index hop) { return alpha.data() + hop * N; }
  double* b(Index hop) { return beta.data() + hop * N; }
  double* g(Index hop) { return gamma.data() + hop * N; }
  double* x(Index hop) { return xi.data() + hop * N * N; }
};

/// out[j] = softmax_j(logits[keys[j]]) for j ∈ [N].
void softmax_gather(const double* logits, const int64_t* keys, Index N, double* out) {
  double top = kNegInf;
  for (Index j = 0; j < N; ++j) {
    out[j] = logits[keys[j]];
    top = std::max(top, out[j]);
  }
  double total = 0.0;
  for (Index j = 0; j < N; ++j) total += (out[j] = std::exp(out[j] - top));
  const double inv = 1.0 / total;
  for (Index j = 0; j < N; ++j) out[j] *= inv;
}

/// out[j] = log-softmax_j(logits[keys[j]]).
void log_softmax_gather(const double* logits, const int64_t* keys, Index N, double* out) {
  double top = kNegInf;
  for (Index j = 0; j < N; ++j) {
    out[j] = logits[keys[j]];
    top = std::max(top, out[j]);
  }
  double total = 0.0;
  for (Index j = 0; j < N; ++j) total += std::exp(out[j] - top);
  const double shift = top + std::log(total);
  for (Index j = 0; j < N; ++j) out[j] -= shift;
}

/// LSE over x[0..n) (−∞ when every entry is −∞).
double lse(const double* x, Index n) {
  double top = kNegInf;
  for (Index k = 0; k < n; ++k) top = std::max(top, x[k]);
  if (top == kNegInf) return kNegInf;
  double total = 0.0;
  for (Index k = 0; k < n; ++k) total += std::exp(x[k] - top);
  return top + std::log(total);
}

/// Forward pass in probability space: α_ℓ for every hop and A_ℓ for ℓ = 0..L−2.
void forward(const ChainedAttention& m, const Row& x, Workspace& ws) {
  const Index N = ws.N;
  softmax_gather(m.gate_logits(0, x.query), x.keys, N, ws.a(0));
  for (Index hop = 0; hop + 1 < ws.L; ++hop) {
    double* A = ws.A(hop);
    for (Index i = 0; i < N; ++i) softmax_gather(m.gate_logits(hop + 1, x.values[i]), x.keys, N, A + i * N);
    const double* from = ws.a(hop);
    double* to = ws.a(hop + 1);
    std::fill(to, to + N, 0.0);
    for (Index i = 0; i < N; ++i) {
      const double ai = from[i];
      const double* Ai = A + i * N;
      for (Index j = 0; j < N; ++j) to[j] += ai * Ai[j];
    }
  }
}

/// Probability-space backward pass and marginals, given forward() and p = Σ α_{L−1} f > 0.
void backward(Workspace& ws, double p) {
  const Index N = ws.N;
  std::copy(ws.f.begin(), ws.f.end(), ws.b(ws.L - 1));
  for (Index hop = ws.L - 2; hop >= 0; --hop) {
    const double* A = ws.A(hop);
    const double* next = ws.b(hop + 1);
    double* beta = ws.b(hop);
    for (Index i = 0; i < N; ++i) {
      double total = 0.0;
      for (Index j = 0; j < N; ++j) total += A[i * N + j] * next[j];
      beta[i] = total;
    }
  }
  const double inv_p = 1.0 / p;
  for (Index hop = 0; hop < ws.L; ++hop)
    for (Index i = 0; i < N; ++i) ws.g(hop)[i] = ws.a(hop)[i] * ws.b(hop)[i] * inv_p;
  for (Index hop = 0; hop + 1 < ws.L; ++hop) {
    const double* A = ws.A(hop);
    const double* next = ws.b(hop + 1);
    double* xi = ws.x(hop);
    for (Index i = 0; i < N; ++i) {
      const double scale = ws.a(hop)[i] * inv_p;
      for (Index j = 0; j < N; ++j) xi[i * N + j] = scale * A[i * N + j] * next[j];
    }
  }
}

/// Log-space forward–backward (the rescue path): returns log p; fills γ and ξ when want_posterior and log p > −∞.
double forward_backward_log(const ChainedAttention& m, const Row& x, Workspace& ws, bool want_posterior) {
  const Index N = ws.N;
  const Index L = ws.L;
  const ConstMatrixMap B(m.emission().data(), m.n_symbols(), m.n_targets());
  for (Index j = 0; j < N; ++j) ws.f[static_cast<size_t>(j)] = std::log(B(x.values[j], x.target));
  log_softmax_gather(m.gate_logits(0, x.query), x.keys, N, ws.a(0));
  for (Index hop = 0; hop + 1 < L; ++hop) {
    double* log_A = ws.A(hop);
    for (Index i = 0; i < N; ++i) log_softmax_gather(m.gate_logits(hop + 1, x.values[i]), x.keys, N, log_A + i * N);
    for (Index j = 0; j < N; ++j) {
      for (Index i = 0; i < N; ++i) ws.tmp[static_cast<size_t>(i)] = ws.a(hop)[i] + log_A[i * N + j];
      ws.a(hop + 1)[j] = lse(ws.tmp.data(), N);
    }
  }
  for (Index j = 0; j < N; ++j) ws.tmp[static_cast<size_t>(j)] = ws.a(L - 1)[j] + ws.f[static_cast<size_t>(j)];
  const double log_p = lse(ws.tmp.data(), N);
  if (!want_posterior || log_p == kNegInf) return log_p;

  std::copy(ws.f.begin(), ws.f.end(), ws.b(L - 1));
  for (Index hop = L - 2; hop >= 0; --hop) {
    const double* log_A = ws.A(hop);
    for (Index i = 0; i < N; ++i) {
      for (Index j = 0; j < N; ++j) ws.tmp[static_cast<size_t>(j)] = log_A[i * N + j] + ws.b(hop + 1)[j];
      ws.b(hop)[i] = lse(ws.tmp.data(), N);
    }
  }
  for (Index hop = 0; hop < L; ++hop)
    for (Index i = 0; i < N; ++i) ws.g(hop)[i] = std::exp(ws.a(hop)[i] + ws.b(hop)[i] - log_p);
  for (Index hop = 0; hop + 1 < L; ++hop) {
    const double* log_A = ws.A(hop);
    for (Index i = 0; i < N; ++i)
      for (Index j = 0; j < N; ++j)
        ws.x(hop)[i * N + j] = std::exp(ws.a(hop)[i] + log_A[i * N + j] + ws.b(hop + 1)[j] - log_p);
  }
  return log_p;
}

/// log p of one row; with want_posterior, also γ (L×N) and ξ ((L−1)×N×N) in ws when log p > −∞.
double forward_backward(const ChainedAttention& m, const Row& x, Workspace& ws, bool want_posterior) {
  const Index N = ws.N;
  const ConstMatrixMap B(m.emission().data(), m.n_symbols(), m.n_targets());
  forward(m, x, ws);
  double p = 0.0;
  const double* last = ws.a(ws.L - 1);
  for (Index j = 0; j < N; ++j) {
    ws.f[static_cast<size_t>(j)] = B(x.values[j], x.target);
    p += last[j] * ws.f[static_cast<size_t>(j)];
  }
  if (!(p >= kRescueBelow)) return forward_backward_log(m, x, ws, want_posterior);
  if (want_posterior) backward(ws, p);
  return std::log(p);
}

/// True when B[v_j, t] = 0 for every position: log p = −∞ whatever the gates (SPEC.md §3.2).
bool impossible(const ChainedAttention& m, const Row& x, Index N) {
  const ConstMatrixMap B(m.emission().data(), m.n_symbols(), m.n_targets());
  for (Index j = 0; j < N; ++j)
    if (B(x.values[j], x.target) > 0.0) return false;
  return true;
}

/// Adds one row's weighted statistics (SPEC.md §3.3) from γ [L, N] and ξ [L−1, N, N].
void scatter(const Row& x, double w, Index N, const double* gamma, const double* xi,
             ChainedAttentionAccumulator& acc) {
  const Index L = acc.n_hops();
  MatrixMap key_mass = acc.key_mass();
  MatrixMap key_num0 = acc.key_num(0);
  for (Index i = 0; i < N; ++i) {
    const double wg = w * gamma[i];
    key_num0(x.keys[i], x.query) += wg;
    key_mass(0, x.keys[i]) += wg;
  }
  for (Index hop = 1; hop < L; ++hop) {
    MatrixMap key_num = acc.key_num(hop);
    const double* xi_hop = xi + (hop - 1) * N * N;
    for (Index i = 0; i < N; ++i) {
      const int64_t u = x.values[i];
      for (Index j = 0; j < N; ++j) {
        const double wx = w * xi_hop[i * N + j];
        key_num(x.keys[j], u) += wx;
        key_mass(hop, x.keys[j]) += wx;
      }
    }
  }
  MatrixMap emission = acc.emission_count();
  const double* last = gamma + (L - 1) * N;
  for (Index j = 0; j < N; ++j) emission(x.values[j], x.target) += w * last[j];
}

}  // namespace

void ChainedAttentionAccumulator::initialize(const ChainedAttentionBatch& batch, std::span<const double> w, Rng& rng) {
  check::weights(kWhere, w, batch.n_rows());
  const Index n_rows = batch.n_rows();
  if (n_rows == 0) return;
  if (batch.max_symbol() >= S_ || batch.max_target() >= T_)
    throw ValueError(std::string(kWhere) + ": out-of-range ID in batch for S = " + std::to_string(S_) +
                     ", T = " + std::to_string(T_));
  const Index N = batch.context_length();
  // Every draw is made for every row whatever its weight, hop-major: γ_0 of all rows, γ_1 of all rows, ..., then ξ.
  std::vector<double> gamma(static_cast<size_t>(n_rows * L_ * N));  // [row, hop, N]
  std::vector<double> xi(static_cast<size_t>(n_rows * (L_ - 1) * N * N));  // [row, hop, N, N]
  for (Index hop = 0; hop < L_; ++hop)
    for (Index n = 0; n < n_rows; ++n)
      rng.dirichlet_ones({gamma.data() + (n * L_ + hop) * N, static_cast<size_t>(N)});
  for (Index hop = 0; hop + 1 < L_; ++hop)
    for (Index n = 0; n < n_rows; ++n)
      rng.dirichlet_ones({xi.data() + (n * (L_ - 1) + hop) * N * N, static_cast<size_t>(N * N)});
  for (Index n = 0; n < n_rows; ++n) {
    const double wn = w[static_cast<size_t>(n)];
    if (wn == 0.0) continue;
    scatter(row_of(batch, n), wn, N, gamma.data() + n * L_ * N, xi.data() + n * (L_ - 1) * N * N, *this);
    this->n() += wn;
  }
}

ChainedAttention::ChainedAttention(ChainedAttentionParams params) : params_(std::move(params)) {
  const auto& tables = params_.key_tables;
  if (tables.empty())
    throw ValueError(std::string(kWhere) + ": keys must be a non-empty (L, S, S) array (got L = 0)");
  const Index S = tables.front().rows();
  for (size_t hop = 0; hop < tables.size(); ++hop) {
    const Matrix& K = tables[hop];
    if (K.rows() != S || K.cols() != S || S == 0)
      throw ValueError(std::string(kWhere) + ": keys must be an (L, S, S) array with S >= 1 (table " +
                       std::to_string(hop) + " is " + std::to_string(K.rows()) + "x" + std::to_string(K.cols()) +
                       ", expected " + std::to_string(S) + "x" + std::to_string(S) + ")");
    check::finite_nonempty(kWhere, "keys", {K.data(), static_cast<size_t>(K.size())});
  }
  check::row_simplex(kWhere, "emission", params_.emission, S);
  check::positive_real(kWhere, "sigma2", params_.sigma2);

  const Index L = n_hops();
  const double inv_two_sigma2 = 1.0 / (2.0 * params_.sigma2);
  gate_logits_.resize(L * S, S);
  for (Index hop = 0; hop < L; ++hop) {
    const Matrix& K = tables[static_cast<size_t>(hop)];
    const Vector rho = K.rowwise().squaredNorm();
    for (Index u = 0; u < S; ++u)
      for (Index s = 0; s < S; ++s) gate_logits_(hop * S + u, s) = (2.0 * K(s, u) - rho[s]) * inv_two_sigma2;
  }
}

void ChainedAttention::check_batch(const ChainedAttentionBatch& batch) const {
  if (batch.n_rows() == 0) return;
  if (batch.max_symbol() >= n_symbols())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in keys, values or query (" +
                     std::to_string(batch.max_symbol()) + " >= S = " + std::to_string(n_symbols()) + ")");
  if (batch.max_target() >= n_targets())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in target (" + std::to_string(batch.max_target()) +
                     " >= T = " + std::to_string(n_targets()) + ")");
}

void ChainedAttention::log_density(const ChainedAttentionBatch& batch, std::span<double> out) const {
  check_batch(batch);
  check::dimension(kWhere, "log-density output length", batch.n_rows(), static_cast<Index>(out.size()));
  if (batch.n_rows() == 0) return;
  Workspace ws(n_hops(), batch.context_length());
  for (Index n = 0; n < batch.n_rows(); ++n)
    out[static_cast<size_t>(n)] = forward_backward(*this, row_of(batch, n), ws, /*want_posterior=*/false);
}

void ChainedAttention::accumulate(const ChainedAttentionBatch& batch, std::span<const double> w,
                                  ChainedAttentionAccumulator& acc, std::span<double> log_p_out) const {
  check_batch(batch);
  check::weights(kWhere, w, batch.n_rows());
  if (acc.n_hops() != n_hops() || acc.n_symbols() != n_symbols() || acc.n_targets() != n_targets())
    throw ValueError(std::string(kWhere) + ": accumulator dimensions do not match the model");
  if (!log_p_out.empty())
    check::dimension(kWhere, "log-density output length", batch.n_rows(), static_cast<Index>(log_p_out.size()));
  const Index n_rows = batch.n_rows();
  if (n_rows == 0) return;
  const Index N = batch.context_length();

  // Pass 1: impossible rows (an O(N) test each) are reported before any statistic changes.
  std::vector<int64_t> rejected;
  for (Index n = 0; n < n_rows; ++n)
    if (w[static_cast<size_t>(n)] > 0.0 && impossible(*this, row_of(batch, n), N)) rejected.push_back(n);
  if (!rejected.empty()) throw ImpossibleEvidenceError(kWhere, std::move(rejected));

  // Pass 2: forward–backward and scatter; nothing here can fail.
  Workspace ws(n_hops(), N);
  for (Index n = 0; n < n_rows; ++n) {
    const double wn = w[static_cast<size_t>(n)];
    if (wn == 0.0 && log_p_out.empty()) continue;
    const Row x = row_of(batch, n);
    const double log_p = forward_backward(*this, x, ws, /*want_posterior=*/wn > 0.0);
    if (!log_p_out.empty()) log_p_out[static_cast<size_t>(n)] = log_p;
    if (wn == 0.0) continue;
    scatter(x, wn, N, ws.gamma.data(), ws.xi.data(), acc);
    acc.ll() += wn * log_p;
    acc.n() += wn;
  }
}

ChainedAttentionPosterior ChainedAttention::posterior(const ChainedAttentionBatch& batch, Index row) const {
  if (row < 0 || row >= batch.n_rows())
    throw ValueError(std::string(kWhere) + ": posterior row " + std::to_string(row) + " is out of range");
  check_batch(batch);
  const Index L = n_hops();
  const Index N = batch.context_length();
  Workspace ws(L, N);
  ChainedAttentionPosterior out;
  out.log_p = forward_backward(*this, row_of(batch, row), ws, /*want_posterior=*/true);
  out.gamma = Matrix::Zero(L, N);
  out.xi.assign(static_cast<size_t>(L - 1), Matrix::Zero(N, N));
  if (out.log_p == kNegInf) return out;
  out.gamma = ConstMatrixMap(ws.gamma.data(), L, N);
  for (Index hop = 0; hop + 1 < L; ++hop) out.xi[static_cast<size_t>(hop)] = ConstMatrixMap(ws.x(hop), N, N);
  return out;
}

Matrix ChainedAttention::predict_proba(const IdMatrix& keys, const IdMatrix& values, const IdVector& queries) const {
  return predict_proba(encoder().encode(keys, values, queries, IdVector::Zero(keys.rows())));
}

Matrix ChainedAttention::predict_proba(const ChainedAttentionBatch& batch) const {
  check_batch(batch);
  Matrix out = Matrix::Zero(batch.n_rows(), n_targets());
  if (batch.n_rows() == 0) return out;
  const Index N = batch.context_length();
  Workspace ws(n_hops(), N);
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const Row x = row_of(batch, n);
    forward(*this, x, ws);
    const double* last = ws.a(n_hops() - 1);
    for (Index j = 0; j < N; ++j) out.row(n) += last[j] * params_.emission.row(x.values[j]);
  }
  return out;
}

ChainedAttentionAccumulator ChainedAttention::make_accumulator() const {
  return {n_hops(), n_symbols(), n_targets()};
}

ChainedAttentionEncoder ChainedAttention::encoder() const { return {n_symbols(), n_targets()}; }

}  // namespace attnmix
