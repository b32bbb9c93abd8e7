// SPDX-License-Identifier: Apache-2.0
// Variational multi-hop attention: validation, plug-in log density, the Monte-Carlo E-step and prediction
// (docs/mechanisms.md#variational-multi-hop-attention). Every row is computed in log space (exact, −∞ allowed): N + N²
// squared distances, the two gates, then ρ and the gradient scattered into a per-thread table G folded into grad_mean
// and grad_log_var once per (chunk, k).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"
#include "../variational/common_impl.hpp"

namespace attnmix {

namespace {

using lanes::scratch;
using variational::squared_distance;

/// log-softmax of x[0..n) in place; an all −∞ row stays −∞.
void log_softmax_in_place(double* x, Index n) {
  const double lse = log_sum_exp({x, static_cast<size_t>(n)});
  for (Index i = 0; i < n; ++i) x[i] -= lse;
}

/// The log-space quantities of one row at table E. Scratch layout: la1 [N], la2 [N, N], lb [N], lh [N].
struct RowLogs {
  double* la1;
  double* la2;
  double* lb;
  double* lh;
};

/// Fills the row's log gates, log emissions and log h; returns log p.
double row_logs(const double* E, Index D, double inv_two_sigma2, const double* log_emission, Index T,
                const int64_t* keys, const int64_t* values, int64_t q, int64_t t, Index N, const RowLogs& r) {
  const double* eq = E + q * D;
  for (Index i = 0; i < N; ++i) r.la1[i] = -squared_distance(eq, E + keys[i] * D, D) * inv_two_sigma2;
  log_softmax_in_place(r.la1, N);
  for (Index i = 0; i < N; ++i) {
    const double* ev = E + values[i] * D;
    double* row = r.la2 + i * N;
    for (Index j = 0; j < N; ++j) row[j] = -squared_distance(ev, E + keys[j] * D, D) * inv_two_sigma2;
    log_softmax_in_place(row, N);
  }
  for (Index j = 0; j < N; ++j) r.lb[j] = log_emission[values[j] * T + t];
  for (Index i = 0; i < N; ++i) {
    double top = kNegInf;
    const double* row = r.la2 + i * N;
    for (Index j = 0; j < N; ++j) top = std::max(top, row[j] + r.lb[j]);
    double acc = 0.0;
    if (top != kNegInf)
      for (Index j = 0; j < N; ++j) {
        const double x = row[j] + r.lb[j];
        if (x != kNegInf) acc += std::exp(x - top);
      }
    r.lh[i] = top == kNegInf ? kNegInf : top + std::log(acc);
  }
  double top = kNegInf;
  for (Index i = 0; i < N; ++i) top = std::max(top, r.la1[i] + r.lh[i]);
  if (top == kNegInf) return kNegInf;
  double acc = 0.0;
  for (Index i = 0; i < N; ++i) {
    const double x = r.la1[i] + r.lh[i];
    if (x != kNegInf) acc += std::exp(x - top);
  }
  return top + std::log(acc);
}

inline double exp_or_zero(double x) { return x == kNegInf ? 0.0 : std::exp(x); }

}  // namespace

VariationalMultiHopAttention::VariationalMultiHopAttention(VariationalMultiHopAttentionParams params)
    : params_(std::move(params)) {
  params_.optimizer_state = resolve_optimizer_state(kWhere, kFamily, params_.mean, params_.log_var,
                                                    std::move(params_.optimizer_state));
  check::row_simplex(kWhere, "emission", params_.emission, params_.mean.rows());
  check::variance(kWhere, "sigma2", params_.sigma2);
  state_ = std::make_shared<const AttentionOptimizerState>(*params_.optimizer_state);
  log_emission_ = params_.emission.array().log().matrix();
  noise_ = std::make_shared<MonteCarloCache>();
}

void VariationalMultiHopAttention::check_batch(const ChainedAttentionBatch& batch) const {
  if (batch.n_rows() == 0) return;
  if (batch.max_symbol() >= n_symbols())
    throw ValueError(std::string(kWhere) + ": out-of-range ID: key, value or query symbol " +
                     std::to_string(batch.max_symbol()) + " (the model has S = " + std::to_string(n_symbols()) +
                     " symbols)");
  if (batch.max_target() >= n_targets())
    throw ValueError(std::string(kWhere) + ": out-of-range ID: target " + std::to_string(batch.max_target()) +
                     " (the model has T = " + std::to_string(n_targets()) + " targets)");
}

void VariationalMultiHopAttention::log_density(const ChainedAttentionBatch& batch, std::span<double> out) const {
  check_batch(batch);
  if (static_cast<Index>(out.size()) != batch.n_rows())
    throw ValueError(std::string(kWhere) + ": log_density output must have one entry per row");
  const Index N = batch.n_rows() > 0 ? batch.context_length() : 0;
  double* buf = scratch<0>(static_cast<size_t>(N * N + 3 * N));
  const RowLogs r{buf, buf + N, buf + N + N * N, buf + 2 * N + N * N};
  for (Index row = 0; row < batch.n_rows(); ++row)
    out[static_cast<size_t>(row)] =
        row_logs(params_.mean.data(), embed_dim(), 0.5 / params_.sigma2, log_emission_.data(), n_targets(),
                 batch.keys(row), batch.values(row), batch.query(row), batch.target(row), N, r);
}

VariationalMultiHopPosterior VariationalMultiHopAttention::posterior_at(const Matrix& table,
                                                                       const ChainedAttentionBatch& batch,
                                                                       Index row) const {
  check_batch(batch);
  if (table.rows() != n_symbols() || table.cols() != embed_dim())
    throw ValueError(std::string(kWhere) + ": the embedding table must have shape (S, D)");
  if (row < 0 || row >= batch.n_rows()) throw ValueError(std::string(kWhere) + ": row out of range");
  const Index N = batch.context_length();
  std::vector<double> buf(static_cast<size_t>(N * N + 3 * N));
  const RowLogs r{buf.data(), buf.data() + N, buf.data() + N + N * N, buf.data() + 2 * N + N * N};
  VariationalMultiHopPosterior out;
  out.log_p = row_logs(table.data(), embed_dim(), 0.5 / params_.sigma2, log_emission_.data(), n_targets(),
                       batch.keys(row), batch.values(row), batch.query(row), batch.target(row), N, r);
  out.hop1.resize(N);
  out.hop2.resize(N, N);
  out.joint = Matrix::Zero(N, N);
  for (Index i = 0; i < N; ++i) {
    out.hop1[i] = exp_or_zero(r.la1[i]);
    for (Index j = 0; j < N; ++j) {
      out.hop2(i, j) = exp_or_zero(r.la2[i * N + j]);
      if (out.log_p != kNegInf) out.joint(i, j) = exp_or_zero(r.la1[i] + r.la2[i * N + j] + r.lb[j] - out.log_p);
    }
  }
  return out;
}

void VariationalMultiHopAttention::accumulate(const ChainedAttentionBatch& batch, std::span<const double> w,
                                              VariationalMultiHopAttentionAccumulator& acc,
                                              std::span<double> log_p_out) const {
  check_batch(batch);
  const Index n = batch.n_rows();
  check::weights(kWhere, w, n);
  if (acc.n_symbols() != n_symbols() || acc.embed_dim() != embed_dim() || acc.n_targets() != n_targets())
    throw ValueError(std::string(kWhere) + ": the accumulator's dimensions (S, D, T) differ from the model's");
  if (acc.optimizer_state() && acc.optimizer_state() != state_ && !(*acc.optimizer_state() == *state_))
    throw ValueError(std::string(VariationalMultiHopAttentionAccumulator::kWhere) +
                     ": cannot combine attention statistics from different optimizer states");
  if (!log_p_out.empty() && static_cast<Index>(log_p_out.size()) != n)
    throw ValueError(std::string(kWhere) + ": log-density output must have one entry per row");
  const Index N = n > 0 ? batch.context_length() : 0;
  const Index D = embed_dim();
  const Index S = n_symbols();
  const Index T = n_targets();

  // Impossible evidence first: a row with w > 0 needs a value j with B[v_j, t] > 0.
  std::vector<int64_t> impossible;
  for (Index row = 0; row < n; ++row) {
    if (!(w[static_cast<size_t>(row)] > 0.0)) continue;
    const int64_t* v = batch.values(row);
    const int64_t t = batch.target(row);
    bool possible = false;
    for (Index j = 0; j < N && !possible; ++j) possible = params_.emission(v[j], t) > 0.0;
    if (!possible) impossible.push_back(row);
  }
  if (!impossible.empty()) throw ImpossibleEvidenceError(kWhere, std::move(impossible));

  const double inv_two_sigma2 = 0.5 / params_.sigma2;
  double* buf = scratch<0>(static_cast<size_t>(N * N + 3 * N + N * N + N + D));
  const RowLogs r{buf, buf + N, buf + N + N * N, buf + 2 * N + N * N};
  double* rho = buf + 3 * N + N * N;  // [N, N] posterior ρ_ij
  double* rho1 = rho + N * N;         // [N]
  double* g = rho1 + N;               // [D] one scatter vector
  if (!log_p_out.empty())
    for (Index row = 0; row < n; ++row)
      log_p_out[static_cast<size_t>(row)] =
          row_logs(params_.mean.data(), D, inv_two_sigma2, log_emission_.data(), T, batch.keys(row),
                   batch.values(row), batch.query(row), batch.target(row), N, r);

  const int64_t mc = acc.mc();
  const std::shared_ptr<const MonteCarloTables> tables = noise_->get(*state_, mc);
  double* G = scratch<1>(static_cast<size_t>(S * D));
  const double inv_mc = 1.0 / static_cast<double>(mc);
  const double inv_sigma2 = 1.0 / params_.sigma2;
  MatrixMap emission_count = acc.emission_count();
  double ll = 0.0;
  for (int64_t k = 0; k < mc; ++k) {
    const double* E = tables->embeddings[static_cast<size_t>(k)].data();
    std::fill(G, G + S * D, 0.0);
    for (Index row = 0; row < n; ++row) {
      const double wn = w[static_cast<size_t>(row)];
      if (!(wn > 0.0)) continue;
      const int64_t* keys = batch.keys(row);
      const int64_t* values = batch.values(row);
      const int64_t q = batch.query(row);
      const int64_t t = batch.target(row);
      const double log_p = row_logs(E, D, inv_two_sigma2, log_emission_.data(), T, keys, values, q, t, N, r);
      ll += wn * log_p * inv_mc;
      for (Index i = 0; i < N; ++i) {
        rho1[i] = exp_or_zero(r.la1[i] + r.lh[i] - log_p);
        for (Index j = 0; j < N; ++j) rho[i * N + j] = exp_or_zero(r.la1[i] + r.la2[i * N + j] + r.lb[j] - log_p);
      }
      for (Index j = 0; j < N; ++j) {
        double rj = 0.0;
        for (Index i = 0; i < N; ++i) rj += rho[i * N + j];
        emission_count(values[j], t) += wn * rj * inv_mc;
      }
      // Hop 1: gs1_i = ρ1_i − a1_i on d1_i = E[q] − E[k_i].
      const double* eq = E + q * D;
      std::fill(g, g + D, 0.0);
      for (Index i = 0; i < N; ++i) {
        const double coef = wn * (rho1[i] - exp_or_zero(r.la1[i])) * inv_sigma2;
        if (coef == 0.0) continue;
        const double* ek = E + keys[i] * D;
        double* gk = G + keys[i] * D;
        for (Index d = 0; d < D; ++d) {
          const double x = coef * (eq[d] - ek[d]);
          gk[d] += x;
          g[d] -= x;
        }
      }
      double* gq = G + q * D;
      for (Index d = 0; d < D; ++d) gq[d] += g[d];
      // Hop 2: gs2_ij = ρ_ij − ρ1_i a2_ij on d2_ij = E[v_i] − E[k_j].
      for (Index i = 0; i < N; ++i) {
        const double* ev = E + values[i] * D;
        std::fill(g, g + D, 0.0);
        for (Index j = 0; j < N; ++j) {
          const double coef = wn * (rho[i * N + j] - rho1[i] * exp_or_zero(r.la2[i * N + j])) * inv_sigma2;
          if (coef == 0.0) continue;
          const double* ek = E + keys[j] * D;
          double* gk = G + keys[j] * D;
          for (Index d = 0; d < D; ++d) {
            const double x = coef * (ev[d] - ek[d]);
            gk[d] += x;
            g[d] -= x;
          }
        }
        double* gv = G + values[i] * D;
        for (Index d = 0; d < D; ++d) gv[d] += g[d];
      }
    }
    const double* factor = tables->log_var_factor[static_cast<size_t>(k)].data();
    double* grad_mean = acc.grad_mean().data();
    double* grad_log_var = acc.grad_log_var().data();
    for (Index e = 0; e < S * D; ++e) {
      grad_mean[e] += G[e] * inv_mc;
      grad_log_var[e] += G[e] * factor[e] * inv_mc;
    }
  }
  acc.ll() += ll;
  double total = 0.0;
  for (double wn : w) total += wn;
  acc.n() += total;
  acc.set_optimizer_state(state_);
}

Matrix VariationalMultiHopAttention::predict_proba(const ChainedAttentionBatch& batch) const {
  check_batch(batch);
  const Index N = batch.n_rows() > 0 ? batch.context_length() : 0;
  const Index D = embed_dim();
  const double inv_two_sigma2 = 0.5 / params_.sigma2;
  const double* E = params_.mean.data();
  Matrix out = Matrix::Zero(batch.n_rows(), n_targets());
  std::vector<double> a1(static_cast<size_t>(N)), a2(static_cast<size_t>(N));
  for (Index row = 0; row < batch.n_rows(); ++row) {
    const int64_t* keys = batch.keys(row);
    const int64_t* values = batch.values(row);
    const double* eq = E + batch.query(row) * D;
    for (Index i = 0; i < N; ++i) a1[static_cast<size_t>(i)] = -squared_distance(eq, E + keys[i] * D, D) * inv_two_sigma2;
    log_softmax_in_place(a1.data(), N);
    for (Index i = 0; i < N; ++i) {
      const double* ev = E + values[i] * D;
      for (Index j = 0; j < N; ++j)
        a2[static_cast<size_t>(j)] = -squared_distance(ev, E + keys[j] * D, D) * inv_two_sigma2;
      log_softmax_in_place(a2.data(), N);
      const double w1 = std::exp(a1[static_cast<size_t>(i)]);
      for (Index j = 0; j < N; ++j)
        out.row(row) += (w1 * std::exp(a2[static_cast<size_t>(j)])) * params_.emission.row(values[j]);
    }
  }
  return out;
}

Matrix VariationalMultiHopAttention::predict_proba(const IdMatrix& keys, const IdMatrix& values,
                                                   const IdVector& queries) const {
  const IdVector targets = IdVector::Zero(queries.size());
  return predict_proba(
      ChainedAttentionEncoder{n_symbols(), std::nullopt}.encode(keys, values, queries, targets, kWhere));
}

}  // namespace attnmix
