// SPDX-License-Identifier: Apache-2.0
// Sparse responsibility attention: validation, log density, the E-step and prediction (sparse_responsibility.hpp).
// A row's positions look their cells up in the patterns (binary search per position); pass 1 computes every row's
// responsibilities and the statistics' cells before pass 2 adds anything, so a failing row changes nothing.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "attnmix/attention/sparse_responsibility.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"
#include "../e_step_checks_impl.hpp"
#include "../target_log_proba_impl.hpp"

namespace attnmix {

namespace {
constexpr const char* kWhere = SparseResponsibilityAttention::kWhere;

void check_length(const char* name, Index expected, Index got) {
  if (expected != got)
    throw ValueError(std::string(kWhere) + ": " + name + " must have " + std::to_string(expected) +
                     " entries, one per cell of its pattern (got " + std::to_string(got) + ")");
}
}  // namespace

SparseResponsibilityAttention::SparseResponsibilityAttention(SparseResponsibilityAttentionParams params)
    : params_(std::move(params)) {
  const SparsePatterns& pat = params_.patterns;
  pat.check(kWhere);
  const Index S = n_symbols();
  const Index T = n_targets();
  check_length("key_values", pat.keys->size(), params_.key_values.size());
  check_length("emission_values", pat.emission->size(), params_.emission_values.size());
  check_length("emission_default", S, params_.emission_default.size());
  if (params_.key_values.size() > 0)  // a key table without listed pairs is K = 0
    check::bounded_reals(kWhere, "key_values",
                         {params_.key_values.data(), static_cast<size_t>(params_.key_values.size())});
  const auto probability = [](const char* name, double x, Index k) {
    if (!(x >= 0.0 && x <= 1.0))
      throw ValueError(std::string(kWhere) + ": " + name + " entry " + std::to_string(k) +
                       " must be a probability in [0, 1] (got " + std::to_string(x) + ")");
  };
  std::vector<double> row;
  for (Index s = 0; s < S; ++s) {
    const double beta = params_.emission_default[s];
    probability("emission_default", beta, s);
    row.clear();
    for (Index k = pat.emission->begin(s); k < pat.emission->end(s); ++k) {
      probability("emission_values", params_.emission_values[k], k);
      row.push_back(params_.emission_values[k]);
    }
    row.push_back(static_cast<double>(T - static_cast<Index>(row.size())) * beta);
    const double total = accurate_sum(row);
    if (!(std::fabs(total - 1.0) <= 1e-12))
      throw ValueError(std::string(kWhere) + ": emission row " + std::to_string(s) +
                       " (its listed cells plus emission_default for the others) must sum to 1 within 1e-12 (sum " +
                       std::to_string(total) + ")");
  }
  if (params_.position_prior.size() == 0) throw ValueError("position_prior (length = context length N) is required.");
  check::simplex(kWhere, "position_prior",
                 {params_.position_prior.data(), static_cast<size_t>(params_.position_prior.size())});
  check::variance(kWhere, "sigma2", params_.sigma2);

  key_sq_norm_ = Vector::Zero(S);
  for (Index s = 0; s < S; ++s)
    for (Index k = pat.keys->begin(s); k < pat.keys->end(s); ++k)
      key_sq_norm_[s] += params_.key_values[k] * params_.key_values[k];
  log_prior_ = params_.position_prior.array().log();
  log_emission_ = params_.emission_values.array().log();
  log_default_ = params_.emission_default.array().log();
  inv_two_sigma2_ = 1.0 / (2.0 * params_.sigma2);
  gate_const_ = -0.5 * static_cast<double>(query_dim()) * std::log(2.0 * std::numbers::pi * params_.sigma2);
}

double SparseResponsibilityAttention::key_mean(int64_t s, int64_t q) const noexcept {
  const Index k = params_.patterns.keys->find(s, q);
  return k < 0 ? 0.0 : params_.key_values[k];
}

double SparseResponsibilityAttention::emission(int64_t s, int64_t t) const noexcept {
  const Index k = params_.patterns.emission->find(s, t);
  return k < 0 ? params_.emission_default[s] : params_.emission_values[k];
}

void SparseResponsibilityAttention::check_batch(const ResponsibilityAttentionBatch& batch) const {
  if (batch.n_rows() == 0) return;
  if (!batch.has_symbol_queries())
    throw ValueError(std::string(kWhere) + ": sparse tables take symbol queries (one id per row), not query vectors");
  check::dimension(kWhere, "batch context length N", context_length(), batch.context_length());
  batch.check_query_dim(kWhere, query_dim());
  if (batch.max_symbol() >= n_symbols())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in context (" + std::to_string(batch.max_symbol()) +
                     " >= S = " + std::to_string(n_symbols()) + ")");
  if (batch.max_target() >= n_targets())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in target (" + std::to_string(batch.max_target()) +
                     " >= T = " + std::to_string(n_targets()) + ")");
}

double SparseResponsibilityAttention::posterior(const ResponsibilityAttentionBatch& batch, Index n, double* r,
                                                Index* key_cell, Index* emission_cell) const {
  const SparsePatterns& cells = params_.patterns;
  const int64_t* ctx = batch.context(n);
  const int64_t q = batch.query_symbol(n);
  const int64_t t = batch.target(n);
  const Index N = context_length();
  double max_l = -std::numeric_limits<double>::infinity();
  for (Index i = 0; i < N; ++i) {  // ℓ_i without gate_const
    const int64_t s = ctx[i];
    const Index key = cells.keys->find(s, q);
    const Index cell = cells.emission->find(s, t);
    if (key_cell != nullptr) {
      key_cell[i] = key;
      emission_cell[i] = cell;
    }
    const double distance = 1.0 - 2.0 * (key < 0 ? 0.0 : params_.key_values[key]) + key_sq_norm_[s];
    r[i] = log_prior_[i] - distance * inv_two_sigma2_ + (cell < 0 ? log_default_[s] : log_emission_[cell]);
    if (std::isnan(r[i]) || r[i] == std::numeric_limits<double>::infinity())
      throw ValueError(std::string(kWhere) + ": log weight of row " + std::to_string(n) + " is NaN or +inf");
    max_l = std::max(max_l, r[i]);
  }
  if (max_l == -std::numeric_limits<double>::infinity()) {
    std::fill(r, r + N, 0.0);
    return max_l;
  }
  double total = 0.0;
  for (Index i = 0; i < N; ++i) total += (r[i] = std::exp(r[i] - max_l));
  for (Index i = 0; i < N; ++i) r[i] /= total;
  return max_l + std::log(total) + gate_const_;
}

void SparseResponsibilityAttention::log_density(const ResponsibilityAttentionBatch& batch,
                                                std::span<double> out) const {
  check_batch(batch);
  check::dimension(kWhere, "log_density output length", batch.n_rows(), static_cast<Index>(out.size()));
  std::vector<double> r(static_cast<size_t>(context_length()));
  for (Index n = 0; n < batch.n_rows(); ++n) out[static_cast<size_t>(n)] = posterior(batch, n, r.data());
}

Matrix SparseResponsibilityAttention::responsibilities(const ResponsibilityAttentionBatch& batch) const {
  check_batch(batch);
  Matrix r(batch.n_rows(), context_length());
  for (Index n = 0; n < batch.n_rows(); ++n) posterior(batch, n, r.data() + n * context_length());
  return r;
}

void SparseResponsibilityAttention::accumulate(const ResponsibilityAttentionBatch& batch, std::span<const double> w,
                                               SparseResponsibilityAttentionAccumulator& acc,
                                               std::span<double> log_p_out) const {
  check_batch(batch);
  check_e_step(kWhere, *this, batch.n_rows(), w, acc, log_p_out);
  const Index n_rows = batch.n_rows();
  const Index N = context_length();
  const SparsePatterns& cells = acc.patterns();
  // The statistics count this model's cells (a fit's models and statistics share the estimator's patterns): the cells
  // the gate looked up are theirs.
  const bool same_cells = cells.keys == params_.patterns.keys && cells.emission == params_.patterns.emission;
  // Pass 1: responsibilities, log p and the statistics' cells of every row; nothing is added yet.
  Matrix r(n_rows, N);
  std::vector<Index> key_cell(static_cast<size_t>(n_rows * N));
  std::vector<Index> emission_cell(key_cell.size());
  std::vector<int64_t> impossible;
  for (Index n = 0; n < n_rows; ++n) {
    const auto first = static_cast<size_t>(n * N);
    const double log_p = same_cells ? posterior(batch, n, r.data() + n * N, key_cell.data() + first,
                                                emission_cell.data() + first)
                                    : posterior(batch, n, r.data() + n * N);
    if (!log_p_out.empty()) log_p_out[static_cast<size_t>(n)] = log_p;
    const double wn = w[static_cast<size_t>(n)];
    if (wn == 0.0) continue;
    if (log_p == -std::numeric_limits<double>::infinity()) impossible.push_back(n);
    const int64_t* ctx = batch.context(n);
    for (Index i = 0; i < N; ++i) {
      const size_t k = first + static_cast<size_t>(i);
      if (!same_cells) {
        key_cell[k] = cells.keys->find(ctx[i], batch.query_symbol(n));
        emission_cell[k] = cells.emission->find(ctx[i], batch.target(n));
      }
      if (key_cell[k] < 0 || emission_cell[k] < 0)
        throw ValueError(std::string(kWhere) + ": row " + std::to_string(n) + " pairs context symbol " +
                         std::to_string(ctx[i]) + " with " +
                         (key_cell[k] < 0 ? "query symbol " + std::to_string(batch.query_symbol(n))
                                          : "target " + std::to_string(batch.target(n))) +
                         ", a cell the statistics' patterns do not list (build them from data that hold these rows)");
    }
  }
  if (!impossible.empty()) throw ImpossibleEvidenceError(kWhere, std::move(impossible));
  // Pass 2: the statistics of every row with w_n > 0, in row order.
  const std::span<double> key_sum = acc.key_sum();
  const std::span<double> key_mass = acc.key_mass();
  const std::span<double> emission_count = acc.emission_count();
  const std::span<double> position = acc.position_count();
  double query_sq = 0.0;
  for (Index n = 0; n < n_rows; ++n) {
    const double wn = w[static_cast<size_t>(n)];
    if (wn == 0.0) continue;
    const int64_t* ctx = batch.context(n);
    double r_total = 0.0;
    for (Index i = 0; i < N; ++i) {
      const auto k = static_cast<size_t>(n * N + i);
      const double wr = wn * r(n, i);
      key_sum[static_cast<size_t>(key_cell[k])] += wr;
      key_mass[static_cast<size_t>(ctx[i])] += wr;
      emission_count[static_cast<size_t>(emission_cell[k])] += wr;
      position[static_cast<size_t>(i)] += wr;
      r_total += r(n, i);
    }
    query_sq += wn * r_total;
  }
  acc.query_sq() += query_sq;
}

void SparseResponsibilityAttention::gate(const ResponsibilityAttentionBatch& batch, Index n, double* a) const {
  const Index N = context_length();
  const int64_t* ctx = batch.context(n);
  const int64_t q = batch.query_symbol(n);
  double max_a = -std::numeric_limits<double>::infinity();
  for (Index i = 0; i < N; ++i) {
    a[i] = log_prior_[i] - (1.0 - 2.0 * key_mean(ctx[i], q) + key_sq_norm_[ctx[i]]) * inv_two_sigma2_;
    max_a = std::max(max_a, a[i]);
  }
  double total = 0.0;
  for (Index i = 0; i < N; ++i) total += (a[i] = std::exp(a[i] - max_a));
  for (Index i = 0; i < N; ++i) a[i] /= total;
}

Matrix SparseResponsibilityAttention::predict_proba(const ResponsibilityAttentionBatch& batch) const {
  check_batch(batch);
  const Index N = context_length();
  const Index T = n_targets();
  const SparsePattern& cells = *params_.patterns.emission;
  Matrix out = Matrix::Zero(batch.n_rows(), T);
  std::vector<double> a(static_cast<size_t>(N));
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const int64_t* ctx = batch.context(n);
    gate(batch, n, a.data());
    double* row = out.data() + n * T;
    for (Index i = 0; i < N; ++i) {
      const int64_t s = ctx[i];
      const double beta = params_.emission_default[s];
      for (Index t = 0; t < T; ++t) row[t] += a[i] * beta;
      for (Index k = cells.begin(s); k < cells.end(s); ++k)
        row[cells.column(k)] += a[i] * (params_.emission_values[k] - beta);
    }
  }
  return out;
}

Vector SparseResponsibilityAttention::target_log_proba(const ResponsibilityAttentionBatch& batch) const {
  check_batch(batch);
  return target_log_proba_of(
      batch, context_length(), [&](Index n, double* a) { gate(batch, n, a); },
      [&](int64_t s, int64_t t) { return emission(s, t); });
}

SparseResponsibilityAttentionAccumulator SparseResponsibilityAttention::make_accumulator() const {
  return {params_.patterns, context_length()};
}

SparseResponsibilityAttentionEstimator SparseResponsibilityAttention::estimator() const {
  SparseResponsibilityAttentionEstimatorOptions options;
  options.sigma2 = params_.sigma2;
  options.name = params_.name;
  return {params_.patterns, context_length(), options};
}

ResponsibilityAttentionEncoder SparseResponsibilityAttention::encoder() const {
  return {n_symbols(), context_length(), query_dim(), n_targets()};
}

ResponsibilityAttention SparseResponsibilityAttention::dense() const {
  const SparsePattern& keys = *params_.patterns.keys;
  const SparsePattern& emission = *params_.patterns.emission;
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Zero(n_symbols(), query_dim());
  p.emission.resize(n_symbols(), n_targets());
  for (Index s = 0; s < n_symbols(); ++s) {
    for (Index k = keys.begin(s); k < keys.end(s); ++k) p.key_means(s, keys.column(k)) = params_.key_values[k];
    p.emission.row(s).setConstant(params_.emission_default[s]);
    for (Index k = emission.begin(s); k < emission.end(s); ++k)
      p.emission(s, emission.column(k)) = params_.emission_values[k];
  }
  p.position_prior = params_.position_prior;
  p.sigma2 = params_.sigma2;
  p.name = params_.name;
  return ResponsibilityAttention(std::move(p));
}

}  // namespace attnmix
