// SPDX-License-Identifier: Apache-2.0
// Variational embedding attention: validation, plug-in log density, the Monte-Carlo E-step and prediction
// (SPEC.md §4.1–§4.3, §4.7).
// Hot path (docs/PERFORMANCE.md): the noise tables E_k of the model's iteration are built once per model and sample
// count (MonteCarloCache) and shared by every chunk. For each k the rows of a chunk are processed in order: the N
// squared distances in 8-lane blocks, the gate by exp_shifted, the posterior in probability space (log space for
// rows with p < 1e-250), then the gradient scattered into a per-thread table G that is folded into grad_mean and
// grad_log_var once per (chunk, k). A row's arithmetic never depends on its neighbours or on the thread.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"
#include "lanes_impl.hpp"
#include "variational_common_impl.hpp"

namespace attnmix {

namespace {

using variational::scratch;
using variational::squared_distance;

/// Below this p a row is recomputed in log space (its probability-space quantities may have underflowed).
constexpr double kRescueBelow = 1e-250;

/// What the row kernel reads from the model.
struct Model {
  const double* emission;      // [S, T]
  const double* log_emission;  // [S, T]
  const double* log_prior;     // [N]
  Index N, D, T;
  double inv_two_sigma2;
};

/// The gate a (target-blind) and posterior r of one row at table E, and log p; s is scratch [N].
/// Returns log p (−∞ when no position explains t). a, r, s: [N].
double row_posterior(const Model& m, const double* E, const int64_t* c, int64_t q, int64_t t, double* s, double* a,
                     double* r) {
  const Index N = m.N;
  const double* eq = E + q * m.D;
  double top = kNegInf;
  double lowest = kInf;
  for (Index i = 0; i < N; ++i) {
    const double lp = m.log_prior[i];
    s[i] = lp == kNegInf ? kNegInf : lp - squared_distance(eq, E + c[i] * m.D, m.D) * m.inv_two_sigma2;
    top = std::max(top, s[i]);
    lowest = std::min(lowest, s[i]);
  }
  lanes::exp_shifted(s, top, lowest, a, N);
  double z = 0.0;
  double num = 0.0;
  for (Index i = 0; i < N; ++i) {
    r[i] = a[i] * m.emission[c[i] * m.T + t];
    z += a[i];
    num += r[i];
  }
  const double inv_z = 1.0 / z;
  if (num * inv_z >= kRescueBelow) {
    const double inv_num = 1.0 / num;
    for (Index i = 0; i < N; ++i) {
      a[i] *= inv_z;
      r[i] *= inv_num;
    }
    return std::log(num) - std::log(z);
  }
  // Log space: log a_i = s_i − LSE s, log p = LSE_i(log a_i + log b_i).
  const double lse = log_sum_exp({s, static_cast<size_t>(N)});
  double lp_top = kNegInf;
  for (Index i = 0; i < N; ++i) {
    s[i] -= lse;  // log a_i
    lp_top = std::max(lp_top, s[i] + m.log_emission[c[i] * m.T + t]);
  }
  double acc = 0.0;
  for (Index i = 0; i < N; ++i) {
    const double x = s[i] + m.log_emission[c[i] * m.T + t];
    r[i] = x == kNegInf ? 0.0 : std::exp(x - lp_top);
    acc += r[i];
  }
  for (Index i = 0; i < N; ++i) a[i] = s[i] == kNegInf ? 0.0 : std::exp(s[i]);
  if (lp_top == kNegInf) {
    std::fill(r, r + N, 0.0);
    return kNegInf;
  }
  for (Index i = 0; i < N; ++i) r[i] /= acc;
  return lp_top + std::log(acc);
}

}  // namespace

VariationalEmbeddingAttention::VariationalEmbeddingAttention(VariationalEmbeddingAttentionParams params)
    : params_(std::move(params)) {
  params_.optimizer_state = resolve_optimizer_state(kWhere, kFamily, params_.mean, params_.log_var,
                                                    std::move(params_.optimizer_state));
  check::row_simplex(kWhere, "emission", params_.emission, params_.mean.rows());
  check::simplex(kWhere, "position_prior",
                 {params_.position_prior.data(), static_cast<size_t>(params_.position_prior.size())});
  check::positive_real(kWhere, "sigma2", params_.sigma2);
  state_ = std::make_shared<const AttentionOptimizerState>(*params_.optimizer_state);
  log_emission_ = params_.emission.array().log().matrix();
  log_prior_ = params_.position_prior.array().log().matrix();
  noise_ = std::make_shared<MonteCarloCache>();
}

void VariationalEmbeddingAttention::check_batch(const VariationalEmbeddingAttentionBatch& batch) const {
  if (batch.n_rows() == 0) return;
  check::dimension(kWhere, "context length N", context_length(), batch.context_length());
  if (batch.max_symbol() >= n_symbols())
    throw ValueError(std::string(kWhere) + ": out-of-range ID: context or query symbol " +
                     std::to_string(batch.max_symbol()) + " (the model has S = " + std::to_string(n_symbols()) +
                     " symbols)");
  if (batch.max_target() >= n_targets())
    throw ValueError(std::string(kWhere) + ": out-of-range ID: target " + std::to_string(batch.max_target()) +
                     " (the model has T = " + std::to_string(n_targets()) + " targets)");
}

void VariationalEmbeddingAttention::log_density(const VariationalEmbeddingAttentionBatch& batch,
                                                std::span<double> out) const {
  check_batch(batch);
  if (static_cast<Index>(out.size()) != batch.n_rows())
    throw ValueError(std::string(kWhere) + ": log_density output must have one entry per row");
  const Model m{params_.emission.data(), log_emission_.data(), log_prior_.data(), context_length(), embed_dim(),
                n_targets(), 0.5 / params_.sigma2};
  const Index N = m.N;
  double* s = scratch<0>(static_cast<size_t>(3 * N));
  for (Index row = 0; row < batch.n_rows(); ++row)
    out[static_cast<size_t>(row)] = row_posterior(m, params_.mean.data(), batch.context(row), batch.query(row),
                                                  batch.target(row), s, s + N, s + 2 * N);
}

double VariationalEmbeddingAttention::log_density_at(const Matrix& table,
                                                     const VariationalEmbeddingAttentionBatch& batch,
                                                     Index row) const {
  check_batch(batch);
  if (table.rows() != n_symbols() || table.cols() != embed_dim())
    throw ValueError(std::string(kWhere) + ": the embedding table must have shape (S, D)");
  if (row < 0 || row >= batch.n_rows()) throw ValueError(std::string(kWhere) + ": row out of range");
  const Model m{params_.emission.data(), log_emission_.data(), log_prior_.data(), context_length(), embed_dim(),
                n_targets(), 0.5 / params_.sigma2};
  std::vector<double> s(static_cast<size_t>(3 * m.N));
  return row_posterior(m, table.data(), batch.context(row), batch.query(row), batch.target(row), s.data(),
                       s.data() + m.N, s.data() + 2 * m.N);
}

void VariationalEmbeddingAttention::accumulate(const VariationalEmbeddingAttentionBatch& batch,
                                               std::span<const double> w,
                                               VariationalEmbeddingAttentionAccumulator& acc,
                                               std::span<double> log_p_out) const {
  check_batch(batch);
  const Index n = batch.n_rows();
  check::weights(kWhere, w, n);
  if (acc.n_symbols() != n_symbols() || acc.context_length() != context_length() || acc.embed_dim() != embed_dim() ||
      acc.n_targets() != n_targets())
    throw ValueError(std::string(kWhere) + ": the accumulator's dimensions (S, N, D, T) differ from the model's");
  if (acc.optimizer_state() && acc.optimizer_state() != state_ && !(*acc.optimizer_state() == *state_))
    throw ValueError(std::string(VariationalEmbeddingAttentionAccumulator::kWhere) +
                     ": cannot combine attention statistics from different optimizer states");
  if (!log_p_out.empty() && static_cast<Index>(log_p_out.size()) != n)
    throw ValueError(std::string(kWhere) + ": log-density output must have one entry per row");

  const Index N = context_length();
  const Index D = embed_dim();
  const Index S = n_symbols();
  const Index T = n_targets();
  // Impossible evidence first: a row with w > 0 needs a position with π_i > 0 and B[c_i, t] > 0.
  std::vector<int64_t> impossible;
  for (Index row = 0; row < n; ++row) {
    if (!(w[static_cast<size_t>(row)] > 0.0)) continue;
    const int64_t* c = batch.context(row);
    const int64_t t = batch.target(row);
    bool possible = false;
    for (Index i = 0; i < N && !possible; ++i)
      possible = params_.position_prior[i] > 0.0 && params_.emission(c[i], t) > 0.0;
    if (!possible) impossible.push_back(row);
  }
  if (!impossible.empty()) throw ImpossibleEvidenceError(kWhere, std::move(impossible));

  const Model m{params_.emission.data(), log_emission_.data(), log_prior_.data(), N, D, T, 0.5 / params_.sigma2};
  double* s = scratch<0>(static_cast<size_t>(3 * N + D));
  double* a = s + N;
  double* r = a + N;
  double* gq = r + N;  // [D]: this row's gradient for its query symbol
  if (!log_p_out.empty())
    for (Index row = 0; row < n; ++row)
      log_p_out[static_cast<size_t>(row)] =
          row_posterior(m, params_.mean.data(), batch.context(row), batch.query(row), batch.target(row), s, a, r);

  const int64_t mc = acc.mc();
  const std::shared_ptr<const MonteCarloTables> tables = noise_->get(*state_, mc);
  double* G = scratch<1>(static_cast<size_t>(S * D));
  const double inv_mc = 1.0 / static_cast<double>(mc);
  const double inv_sigma2 = 1.0 / params_.sigma2;
  MatrixMap emission_count = acc.emission_count();
  VectorMap position_count = acc.position_count();
  double ll = 0.0;
  for (int64_t k = 0; k < mc; ++k) {
    const double* E = tables->embeddings[static_cast<size_t>(k)].data();
    std::fill(G, G + S * D, 0.0);
    for (Index row = 0; row < n; ++row) {
      const double wn = w[static_cast<size_t>(row)];
      if (!(wn > 0.0)) continue;
      const int64_t* c = batch.context(row);
      const int64_t q = batch.query(row);
      const int64_t t = batch.target(row);
      const double log_p = row_posterior(m, E, c, q, t, s, a, r);
      ll += wn * log_p * inv_mc;
      const double* eq = E + q * D;
      std::fill(gq, gq + D, 0.0);
      for (Index i = 0; i < N; ++i) {
        const double rw = wn * r[i] * inv_mc;
        emission_count(c[i], t) += rw;
        position_count[i] += rw;
        const double coef = wn * (r[i] - a[i]) * inv_sigma2;
        if (coef == 0.0) continue;
        const double* ec = E + c[i] * D;
        double* gc = G + c[i] * D;
        for (Index d = 0; d < D; ++d) {
          const double g = coef * (eq[d] - ec[d]);
          gc[d] += g;
          gq[d] -= g;
        }
      }
      double* gqrow = G + q * D;
      for (Index d = 0; d < D; ++d) gqrow[d] += gq[d];
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

Matrix VariationalEmbeddingAttention::predict_proba(const VariationalEmbeddingAttentionBatch& batch) const {
  check_batch(batch);
  const Index N = context_length();
  const Index T = n_targets();
  const Model m{params_.emission.data(), log_emission_.data(), log_prior_.data(), N, embed_dim(), T,
                0.5 / params_.sigma2};
  Matrix out = Matrix::Zero(batch.n_rows(), T);
  std::vector<double> s(static_cast<size_t>(N)), a(static_cast<size_t>(N));
  const double* E = params_.mean.data();
  for (Index row = 0; row < batch.n_rows(); ++row) {
    const int64_t* c = batch.context(row);
    const double* eq = E + batch.query(row) * m.D;
    double top = kNegInf;
    for (Index i = 0; i < N; ++i) {
      const double lp = m.log_prior[i];
      s[static_cast<size_t>(i)] =
          lp == kNegInf ? kNegInf : lp - squared_distance(eq, E + c[i] * m.D, m.D) * m.inv_two_sigma2;
      top = std::max(top, s[static_cast<size_t>(i)]);
    }
    double z = 0.0;
    for (Index i = 0; i < N; ++i) z += (a[static_cast<size_t>(i)] = std::exp(s[static_cast<size_t>(i)] - top));
    for (Index i = 0; i < N; ++i) out.row(row) += (a[static_cast<size_t>(i)] / z) * params_.emission.row(c[i]);
  }
  return out;
}

Matrix VariationalEmbeddingAttention::predict_proba(const IdMatrix& contexts, const IdVector& queries) const {
  IdVector targets = IdVector::Zero(queries.size());
  const VariationalEmbeddingAttentionBatch batch =
      VariationalEmbeddingAttentionEncoder{n_symbols(), context_length(), std::nullopt}.encode(contexts, queries,
                                                                                                targets);
  return predict_proba(batch);
}

}  // namespace attnmix
