// SPDX-License-Identifier: Apache-2.0
// The categorical leaf: batches, the validating encoder, the E-step and the smoothed-count M-step
// (docs/mechanisms.md#building-blocks).
#include "attnmix/stats/categorical.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"
#include "attnmix/stats/mass_law.hpp"

namespace attnmix {

namespace {
constexpr const char* kEncoderWhere = "CategoricalDataEncoder";

std::shared_ptr<const StatLayout> categorical_layout(std::string_view where, int64_t K) {
  return std::make_shared<const StatLayout>(where, 
      std::vector<FieldSpec>{{"counts", {K}, FieldKind::kCount}});
}

/// Ids of a batch must lie below K (the encoder may not have known K).
void check_ids_below(std::string_view where, const CategoricalBatch& batch, int64_t K) {
  if (batch.max_id() >= K)
    throw ValueError(std::string(where) + ": out-of-range ID in batch (" +
                     std::to_string(batch.max_id()) + " >= K = " + std::to_string(K) + ")");
}
}  // namespace

// ----- batch and encoder
// -------------------------------------------------------------------------------------

CategoricalBatch CategoricalEncoder::encode(IdVector ids) const {
  if (n_categories) check::positive_int(kEncoderWhere, "num_categories", *n_categories);
  check::ids(kEncoderWhere, "ids", {ids.data(), static_cast<size_t>(ids.size())}, n_categories);
  const Index n = ids.size();
  const int64_t max_id = n ? ids.maxCoeff() : -1;
  return {{std::move(ids), max_id}, n};
}

CategoricalBatch CategoricalEncoder::encode(std::span<const double> ids) const {
  IdVector exact(static_cast<Index>(ids.size()));
  for (size_t n = 0; n < ids.size(); ++n)
    exact[static_cast<Index>(n)] = check::exact_id(kEncoderWhere, "ids", ids[n], n_categories);
  return encode(std::move(exact));
}

// ----- accumulator
// -------------------------------------------------------------------------------------------

CategoricalAccumulator::CategoricalAccumulator(int64_t n_categories,
                                               std::optional<std::string> keys)
    : FlatAccumulator(categorical_layout(kWhere, 
          (check::positive_int(kWhere, "num_categories", n_categories), n_categories))),
      K_(n_categories) {
  set_keys(std::move(keys));
}

double CategoricalAccumulator::total_mass() const {
  return accurate_sum({field(0), static_cast<size_t>(K_)});
}

void CategoricalAccumulator::validate(std::string_view where) const { check_entries(where); }

void CategoricalAccumulator::initialize(const CategoricalBatch& batch, std::span<const double> w,
                                        Rng& /*rng*/) {
  check::weights(kWhere, w, batch.n_rows());
  check_ids_below(kWhere, batch, K_);
  double* counts = field(0);
  for (Index n = 0; n < batch.n_rows(); ++n)
    if (w[n] != 0.0) counts[batch.id(n)] += w[n];
}

// ----- distribution
// ------------------------------------------------------------------------------------------

Categorical::Categorical(CategoricalParams params) : params_(std::move(params)) {
  check::simplex(kWhere, "p", {params_.p.data(), static_cast<size_t>(params_.p.size())});
  log_p_ = params_.p.array().log();  // exact: log 0 = −∞
}

void Categorical::check_batch(const CategoricalBatch& batch) const {
  check_ids_below(kWhere, batch, n_categories());
}

void Categorical::log_density(const CategoricalBatch& batch, std::span<double> out) const {
  check_batch(batch);
  check::dimension(kWhere, "log_density output length", batch.n_rows(),
                   static_cast<Index>(out.size()));
  for (Index n = 0; n < batch.n_rows(); ++n) out[n] = log_p_[batch.id(n)];
}

void Categorical::accumulate(const CategoricalBatch& batch, std::span<const double> w,
                             CategoricalAccumulator& acc, std::span<double> log_p_out) const {
  check_batch(batch);
  check::weights(kWhere, w, batch.n_rows());
  check::dimension(kWhere, "accumulator categories K", n_categories(), acc.n_categories());
  if (!log_p_out.empty())
    check::dimension(kWhere, "log-density output length", batch.n_rows(),
                     static_cast<Index>(log_p_out.size()));
  // Pass 1: impossible rows are collected before any statistic changes.
  std::vector<int64_t> impossible;
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const double lp = log_p_[batch.id(n)];
    if (!log_p_out.empty()) log_p_out[n] = lp;
    if (lp == kNegInf && w[n] > 0.0) impossible.push_back(n);
  }
  if (!impossible.empty()) throw ImpossibleEvidenceError(kWhere, std::move(impossible));
  // Pass 2: counts[x_n] += w_n; zero-weight rows are skipped, so they add exactly nothing.
  VectorMap counts = acc.counts();
  for (Index n = 0; n < batch.n_rows(); ++n)
    if (w[n] != 0.0) counts[batch.id(n)] += w[n];
}

CategoricalEstimator Categorical::estimator() const {
  CategoricalEstimatorOptions options;
  options.name = params_.name;
  return CategoricalEstimator(n_categories(), options);
}

CategoricalSampler Categorical::sampler(uint64_t seed) const { return {*this, seed}; }

// ----- estimator
// ---------------------------------------------------------------------------------------------

CategoricalEstimator::CategoricalEstimator(int64_t n_categories,
                                           CategoricalEstimatorOptions options)
    : K_(n_categories), options_(std::move(options)) {
  check::positive_int(kWhere, "num_categories", K_);
  check::nonnegative_real(kWhere, "smoothing", options_.smoothing);
}

Categorical CategoricalEstimator::estimate(std::optional<double> nobs,
                                           const CategoricalAccumulator& acc) const {
  if (acc.n_categories() != K_)
    throw ValueError(std::string(kWhere) + ": statistics must have the layout [" +
                     make_accumulator().layout().describe() + "] (got [" + acc.layout().describe() +
                     "])");
  acc.validate(kWhere);
  if (nobs) check_mass_law(kWhere, "nobs", *nobs, "sum(counts)", acc.total_mass());
  CategoricalParams p;
  p.name = options_.name;
  p.p = acc.counts().array() + options_.smoothing;
  const double total = accurate_sum({p.p.data(), static_cast<size_t>(K_)});
  if (total > 0.0)
    p.p /= total;  // each entry rounded once, so |Σ p − 1| ≤ ε: passes the 1e-12 simplex check for
                   // any K
  else
    p.p.setConstant(1.0 / static_cast<double>(K_));
  return Categorical(std::move(p));
}

// ----- sampler
// -----------------------------------------------------------------------------------------------

int64_t CategoricalSampler::sample() {
  const Vector& p = model_.params().p;
  return rng_.categorical({p.data(), static_cast<size_t>(p.size())});
}

CategoricalBatch CategoricalSampler::sample(Index m) {
  if (m < 0) throw ValueError("CategoricalSampler: size must be >= 0");
  IdVector ids(m);
  for (Index k = 0; k < m; ++k) ids[k] = sample();
  return model_.encoder().encode(std::move(ids));
}

}  // namespace attnmix
