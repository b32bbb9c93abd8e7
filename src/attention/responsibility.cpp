// SPDX-License-Identifier: Apache-2.0
// Responsibility attention: validation, log density, the E-step and prediction (SPEC.md §2.1, §2.2, §2.5).
// Hot path: per row, pass 1 computes ℓ_i (N·D squared differences) and r_i; pass 2 scatters w r_i into the
// statistics. Both passes run per batch so impossible rows are detected before anything is added.
#include <Eigen/Core>
#include <cmath>
#include <numbers>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"

namespace attnmix {

namespace {

/// ‖y − k‖² over D entries, written so the compiler vectorises it.
inline double squared_distance(const double* __restrict y, const double* __restrict k, Index D) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (Index d = 0; d < D; ++d) {
    const double diff = y[d] - k[d];
    acc += diff * diff;
  }
  return acc;
}

/// In place x_i ← exp(x_i − shift) over N entries (Eigen's vectorised exp); returns Σ_i x_i.
inline double exponentiate_in_place(double* x, double shift, Index N) {
  Eigen::Map<Eigen::ArrayXd> values(x, N);
  values = (values - shift).exp();
  return values.sum();
}

/// Per-thread scratch reused across calls (avoids an allocation per chunk).
std::vector<double>& scratch(size_t size) {
  thread_local std::vector<double> buffer;
  if (buffer.size() < size) buffer.resize(size);
  return buffer;
}

}  // namespace

ResponsibilityAttention::ResponsibilityAttention(ResponsibilityAttentionParams params) : params_(std::move(params)) {
  const Matrix& K = params_.key_means;
  if (K.rows() == 0 || K.cols() == 0)
    throw ValueError(std::string(kWhere) + ": key_means must be a non-empty 2-D array (got " +
                     std::to_string(K.rows()) + "x" + std::to_string(K.cols()) + ")");
  check::finite_nonempty(kWhere, "key_means", {K.data(), static_cast<size_t>(K.size())});
  check::row_simplex(kWhere, "emission", params_.emission, K.rows());
  if (params_.position_prior.size() == 0)
    throw ValueError("position_prior (length = context length N) is required.");
  check::simplex(kWhere, "position_prior",
                 {params_.position_prior.data(), static_cast<size_t>(params_.position_prior.size())});
  check::positive_real(kWhere, "sigma2", params_.sigma2);

  log_prior_ = params_.position_prior.array().log();
  log_emission_ = params_.emission.array().log();
  inv_two_sigma2_ = 1.0 / (2.0 * params_.sigma2);
  gate_const_ = -0.5 * static_cast<double>(query_dim()) * std::log(2.0 * std::numbers::pi * params_.sigma2);
}

void ResponsibilityAttention::check_batch(const ResponsibilityAttentionBatch& batch) const {
  if (batch.n_rows() == 0) return;
  check::dimension(kWhere, "batch context length N", context_length(), batch.context_length());
  check::dimension(kWhere, "batch query dimension D", query_dim(), batch.query_dim());
  if (batch.max_symbol() >= n_symbols())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in context (" + std::to_string(batch.max_symbol()) +
                     " >= S = " + std::to_string(n_symbols()) + ")");
  if (batch.max_target() >= n_targets())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in target (" + std::to_string(batch.max_target()) +
                     " >= T = " + std::to_string(n_targets()) + ")");
}

double ResponsibilityAttention::row_log_joint(const ResponsibilityAttentionBatch& batch, Index row,
                                              double* out) const {
  const Index N = context_length();
  const Index D = query_dim();
  const Index T = n_targets();
  const int64_t* ctx = batch.context(row);
  const double* y = batch.query(row);
  const int64_t t = batch.target(row);
  const double* K = params_.key_means.data();
  const double* log_B = log_emission_.data();
  double max_l = kNegInf;
  for (Index i = 0; i < N; ++i) {
    const int64_t s = ctx[i];
    const double l = log_prior_[i] - squared_distance(y, K + s * D, D) * inv_two_sigma2_ + log_B[s * T + t];
    out[i] = l;
    max_l = l > max_l ? l : max_l;
  }
  if (std::isnan(max_l) || max_l == kInf)
    throw ValueError(std::string(kWhere) + ": log weight of row " + std::to_string(row) + " is NaN or +inf");
  return max_l;
}

void ResponsibilityAttention::log_density(const ResponsibilityAttentionBatch& batch, std::span<double> out) const {
  check_batch(batch);
  check::dimension(kWhere, "log_density output length", batch.n_rows(), static_cast<Index>(out.size()));
  std::vector<double>& buf = scratch(static_cast<size_t>(context_length()));
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const double max_l = row_log_joint(batch, n, buf.data());
    out[n] = max_l == kNegInf ? kNegInf
                              : max_l + std::log(exponentiate_in_place(buf.data(), max_l, context_length())) +
                                    gate_const_;
  }
}

void ResponsibilityAttention::accumulate(const ResponsibilityAttentionBatch& batch, std::span<const double> w,
                                         ResponsibilityAttentionAccumulator& acc,
                                         std::span<double> log_p_out) const {
  check_batch(batch);
  check::weights(kWhere, w, batch.n_rows());
  if (acc.n_symbols() != n_symbols() || acc.context_length() != context_length() ||
      acc.query_dim() != query_dim() || acc.n_targets() != n_targets())
    throw ValueError(std::string(kWhere) + ": accumulator dimensions do not match the model");
  if (!log_p_out.empty())
    check::dimension(kWhere, "log-density output length", batch.n_rows(), static_cast<Index>(log_p_out.size()));
  const Index n_rows = batch.n_rows();
  const Index N = context_length();
  const Index D = query_dim();
  const Index T = n_targets();

  // Pass 1: responsibilities of every row into r [n, N]; impossible rows collected before any statistic changes.
  std::vector<double>& r = scratch(static_cast<size_t>(n_rows * N));
  std::vector<int64_t> impossible;
  for (Index n = 0; n < n_rows; ++n) {
    double* r_row = r.data() + n * N;
    const double max_l = row_log_joint(batch, n, r_row);
    if (max_l == kNegInf) {
      if (!log_p_out.empty()) log_p_out[n] = kNegInf;
      if (w[n] > 0.0) impossible.push_back(n);
      std::fill(r_row, r_row + N, 0.0);
      continue;
    }
    const double total = exponentiate_in_place(r_row, max_l, N);
    if (!log_p_out.empty()) log_p_out[n] = max_l + std::log(total) + gate_const_;
    const double inv_total = 1.0 / total;
    for (Index i = 0; i < N; ++i) r_row[i] *= inv_total;
  }
  if (!impossible.empty()) throw ImpossibleEvidenceError(kWhere, std::move(impossible));

  // Pass 2: scatter-add (a symbol repeated in a context contributes once per position).
  double* key_sum = acc.key_sum().data();
  double* key_mass = acc.key_mass().data();
  double* emission = acc.emission_count().data();
  double* position = acc.position_count().data();
  double query_sq = 0.0;
  for (Index n = 0; n < n_rows; ++n) {
    const double wn = w[n];
    if (wn == 0.0) continue;
    const int64_t* ctx = batch.context(n);
    const double* __restrict y = batch.query(n);
    const int64_t t = batch.target(n);
    const double* r_row = r.data() + n * N;
    double r_total = 0.0;
    double y_sq = 0.0;
    for (Index d = 0; d < D; ++d) y_sq += y[d] * y[d];
    for (Index i = 0; i < N; ++i) {
      const double wr = wn * r_row[i];
      const int64_t s = ctx[i];
      double* __restrict ks = key_sum + s * D;
#pragma omp simd
      for (Index d = 0; d < D; ++d) ks[d] += wr * y[d];
      key_mass[s] += wr;
      emission[s * T + t] += wr;
      position[i] += wr;
      r_total += r_row[i];
    }
    query_sq += wn * r_total * y_sq;
  }
  acc.query_sq() += query_sq;
}

Matrix ResponsibilityAttention::predict_proba(const ResponsibilityAttentionBatch& batch) const {
  check_batch(batch);
  const Index N = context_length();
  const Index D = query_dim();
  const Index T = n_targets();
  const double* K = params_.key_means.data();
  Matrix out = Matrix::Zero(batch.n_rows(), T);
  std::vector<double> a(static_cast<size_t>(N));
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const int64_t* ctx = batch.context(n);
    const double* y = batch.query(n);
    double max_l = kNegInf;
    for (Index i = 0; i < N; ++i) {
      a[i] = log_prior_[i] - squared_distance(y, K + ctx[i] * D, D) * inv_two_sigma2_;
      max_l = a[i] > max_l ? a[i] : max_l;
    }
    double total = 0.0;
    for (Index i = 0; i < N; ++i) total += (a[i] = std::exp(a[i] - max_l));
    for (Index i = 0; i < N; ++i) out.row(n) += (a[i] / total) * params_.emission.row(ctx[i]);
  }
  return out;
}

Matrix ResponsibilityAttention::predict_proba(const IdMatrix& contexts, const Matrix& queries) const {
  return predict_proba(
      encoder().encode(contexts, queries, IdVector::Zero(contexts.rows())));
}

ResponsibilityAttentionAccumulator ResponsibilityAttention::make_accumulator() const {
  return {n_symbols(), context_length(), query_dim(), n_targets()};
}

ResponsibilityAttentionEstimator ResponsibilityAttention::estimator() const {
  ResponsibilityAttentionEstimatorOptions options;
  options.sigma2 = params_.sigma2;
  options.name = params_.name;
  return {n_symbols(), context_length(), query_dim(), n_targets(), options};
}

ResponsibilityAttentionEncoder ResponsibilityAttention::encoder() const {
  return {n_symbols(), context_length(), query_dim(), n_targets()};
}

ResponsibilityAttentionSampler ResponsibilityAttention::sampler(uint64_t seed) const { return {*this, seed}; }

}  // namespace attnmix
