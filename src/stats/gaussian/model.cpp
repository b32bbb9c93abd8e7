// SPDX-License-Identifier: Apache-2.0
// The diagonal Gaussian leaf: batches, the validating encoder, the E-step and the floored M-step
// (docs/mechanisms.md#building-blocks).
#include "attnmix/stats/gaussian.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/mass_law.hpp"

namespace attnmix {

namespace {
constexpr const char* kEncoderWhere = "DiagonalGaussianDataEncoder";

std::shared_ptr<const StatLayout> gaussian_layout(std::string_view where, int64_t D) {
  return std::make_shared<const StatLayout>(where, std::vector<FieldSpec>{
      {"sum", {D}, FieldKind::kReal},
      {"sum_sq", {D}, FieldKind::kCount},
      {"count", {}, FieldKind::kCount},
  });
}

void check_width(std::string_view where, const DiagonalGaussianBatch& batch, int64_t D) {
  if (batch.n_rows() > 0) check::dimension(where, "batch dimension D", D, batch.dim());
}
}  // namespace

// ----- batch and encoder
// -------------------------------------------------------------------------------------

DiagonalGaussianBatch DiagonalGaussianEncoder::encode(Matrix values) const {
  if (dim) {
    check::positive_int(kEncoderWhere, "dim", *dim);
    check::dimension(kEncoderWhere, "observation dimension D", *dim, values.cols());
  }
  if (values.rows() > 0 && values.cols() <= 0)
    throw ValueError(std::string(kEncoderWhere) + ": observations must have D >= 1 columns");
  check::bounded_rows(kEncoderWhere, "observation", values);
  const Index n = values.rows();
  return {{std::move(values)}, n};
}

// ----- accumulator
// -------------------------------------------------------------------------------------------

DiagonalGaussianAccumulator::DiagonalGaussianAccumulator(int64_t dim,
                                                         std::optional<std::string> keys)
    : FlatAccumulator(gaussian_layout(kWhere, (check::positive_int(kWhere, "dim", dim), dim))), D_(dim) {
  set_keys(std::move(keys));
}

void DiagonalGaussianAccumulator::validate(std::string_view where) const { check_entries(where); }

void DiagonalGaussianAccumulator::add_rows(const DiagonalGaussianBatch& batch,
                                           std::span<const double> w) {
  double* __restrict s = field(0);
  double* __restrict s2 = field(1);
  double total = 0.0;
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const double wn = w[n];
    if (wn == 0.0) continue;  // adds exactly nothing
    const double* __restrict x = batch.row(n);
    for (Index d = 0; d < D_; ++d) {
      const double wx = wn * x[d];
      s[d] += wx;
      s2[d] += wx * x[d];
    }
    total += wn;
  }
  count() += total;
}

void DiagonalGaussianAccumulator::initialize(const DiagonalGaussianBatch& batch,
                                             std::span<const double> w, Rng& /*rng*/) {
  check::weights(kWhere, w, batch.n_rows());
  check_width(kWhere, batch, D_);
  add_rows(batch, w);
}

// ----- distribution
// ------------------------------------------------------------------------------------------

DiagonalGaussian::DiagonalGaussian(DiagonalGaussianParams params) : params_(std::move(params)) {
  const Index D = params_.mu.size();
  check::bounded_reals(kWhere, "mu", {params_.mu.data(), static_cast<size_t>(D)});
  check::dimension(kWhere, "length of sigma2", D, params_.sigma2.size());
  for (Index d = 0; d < D; ++d)
    check::variance(kWhere, "sigma2 entry " + std::to_string(d), params_.sigma2[d]);
  inv_sigma2_ = params_.sigma2.cwiseInverse();
  log_norm_ = 0.0;
  for (Index d = 0; d < D; ++d)
    log_norm_ -= 0.5 * std::log(2.0 * std::numbers::pi * params_.sigma2[d]);
}

void DiagonalGaussian::check_batch(const DiagonalGaussianBatch& batch) const {
  check_width(kWhere, batch, dim());
}

void DiagonalGaussian::log_density(const DiagonalGaussianBatch& batch,
                                   std::span<double> out) const {
  check_batch(batch);
  check::dimension(kWhere, "log_density output length", batch.n_rows(),
                   static_cast<Index>(out.size()));
  const Index D = dim();
  const double* mu = params_.mu.data();
  const double* inv = inv_sigma2_.data();
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const double* x = batch.row(n);
    double quad = 0.0;
    for (Index d = 0; d < D; ++d) {
      const double diff = x[d] - mu[d];
      quad += diff * diff * inv[d];
    }
    out[n] = log_norm_ - 0.5 * quad;
  }
}

void DiagonalGaussian::accumulate(const DiagonalGaussianBatch& batch, std::span<const double> w,
                                  DiagonalGaussianAccumulator& acc,
                                  std::span<double> log_p_out) const {
  check_batch(batch);
  check::weights(kWhere, w, batch.n_rows());
  check::dimension(kWhere, "accumulator dimension D", dim(), acc.dim());
  if (!log_p_out.empty()) log_density(batch, log_p_out);
  acc.add_rows(batch, w);  // every check is done: nothing below can throw, so the E-step is atomic
}

DiagonalGaussianEstimator DiagonalGaussian::estimator() const {
  DiagonalGaussianEstimatorOptions options;
  options.name = params_.name;
  return DiagonalGaussianEstimator(dim(), options);
}

DiagonalGaussianSampler DiagonalGaussian::sampler(uint64_t seed) const { return {*this, seed}; }

// ----- estimator
// ---------------------------------------------------------------------------------------------

DiagonalGaussianEstimator::DiagonalGaussianEstimator(int64_t dim,
                                                     DiagonalGaussianEstimatorOptions options)
    : D_(dim), options_(std::move(options)) {
  check::positive_int(kWhere, "dim", D_);
  check::variance(kWhere, "min_sigma2", options_.min_sigma2);
}

DiagonalGaussian DiagonalGaussianEstimator::estimate(std::optional<double> nobs,
                                                     const DiagonalGaussianAccumulator& acc) const {
  if (acc.dim() != D_)
    throw ValueError(std::string(kWhere) + ": statistics must have the layout [" +
                     make_accumulator().layout().describe() + "] (got [" + acc.layout().describe() +
                     "])");
  acc.validate(kWhere);
  const double count = acc.count();
  if (nobs) check_mass_law(kWhere, "nobs", *nobs, "count", count);
  DiagonalGaussianParams p;
  p.name = options_.name;
  if (count > 0.0) {
    p.mu = acc.sum() / count;
    p.sigma2.resize(D_);
    for (Index d = 0; d < D_; ++d)
      p.sigma2[d] = std::max(acc.sum_sq()[d] / count - p.mu[d] * p.mu[d], options_.min_sigma2);
  } else {
    p.mu = Vector::Zero(D_);
    p.sigma2 = Vector::Ones(D_);
  }
  return DiagonalGaussian(std::move(p));
}

// ----- sampler
// -----------------------------------------------------------------------------------------------

std::vector<double> DiagonalGaussianSampler::sample() {
  const DiagonalGaussianParams& p = model_.params();
  std::vector<double> x(static_cast<size_t>(model_.dim()));
  for (Index d = 0; d < model_.dim(); ++d)
    x[static_cast<size_t>(d)] = p.mu[d] + std::sqrt(p.sigma2[d]) * rng_.normal();
  return x;
}

DiagonalGaussianBatch DiagonalGaussianSampler::sample(Index m) {
  if (m < 0) throw ValueError("DiagonalGaussianSampler: size must be >= 0");
  Matrix values(m, model_.dim());
  for (Index k = 0; k < m; ++k) {
    const std::vector<double> x = sample();
    values.row(k) = Eigen::Map<const Vector>(x.data(), model_.dim()).transpose();
  }
  return model_.encoder().encode(std::move(values));
}

}  // namespace attnmix
