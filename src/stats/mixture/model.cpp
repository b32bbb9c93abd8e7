// SPDX-License-Identifier: Apache-2.0
// The finite mixture over type-erased components (docs/mechanisms.md#building-blocks).
#include "attnmix/stats/mixture.hpp"

#include <cmath>

#include "attnmix/core/check.hpp"
#include "attnmix/stats/log_math.hpp"
#include "attnmix/stats/mass_law.hpp"

namespace attnmix {

// ----- accumulator -------------------------------------------------------------------------------------------

MixtureAccumulator::MixtureAccumulator(std::vector<AnyAccumulator> components, std::optional<std::string> keys)
    : comp_count_(Vector::Zero(static_cast<Index>(components.size()))),
      components_(std::move(components)),
      keys_(std::move(keys)) {
  if (components_.empty()) throw ValueError(std::string(kWhere) + ": a mixture needs at least one component");
}

Index MixtureAccumulator::flat_size() const {
  Index size = comp_count_.size();
  for (const AnyAccumulator& c : components_) size += c.flat_size();
  return size;
}

void MixtureAccumulator::pack(std::span<double> out) const {
  if (static_cast<Index>(out.size()) != flat_size()) throw ValueError(std::string(kWhere) + ": pack buffer has the wrong size");
  std::copy(comp_count_.begin(), comp_count_.end(), out.begin());
  size_t offset = static_cast<size_t>(comp_count_.size());
  for (const AnyAccumulator& c : components_) {
    const size_t size = static_cast<size_t>(c.flat_size());
    c.pack(out.subspan(offset, size));
    offset += size;
  }
}

void MixtureAccumulator::unpack(std::span<const double> in) {
  if (static_cast<Index>(in.size()) != flat_size())
    throw ValueError(std::string(kWhere) + ": packed statistics must have " + std::to_string(flat_size()) +
                     " entries (got " + std::to_string(in.size()) + ")");
  MixtureAccumulator candidate = *this;  // validate everything before committing
  const size_t K = static_cast<size_t>(comp_count_.size());
  std::copy(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(K), candidate.comp_count_.begin());
  candidate.validate(kWhere);
  size_t offset = K;
  for (AnyAccumulator& c : candidate.components_) {
    const size_t size = static_cast<size_t>(c.flat_size());
    c.unpack(in.subspan(offset, size));
    offset += size;
  }
  *this = std::move(candidate);
}

void MixtureAccumulator::check_compatible(const MixtureAccumulator& other) const {
  if (other.components_.size() != components_.size() || other.flat_size() != flat_size())
    throw ValueError(std::string(kWhere) + ": statistics must come from a mixture with the same components");
}

void MixtureAccumulator::combine(const MixtureAccumulator& other) {
  check_compatible(other);
  other.validate(kWhere);
  MixtureAccumulator candidate = *this;
  for (size_t k = 0; k < components_.size(); ++k) candidate.components_[k].combine(other.components_[k]);
  candidate.comp_count_ += other.comp_count_;
  *this = std::move(candidate);
}

void MixtureAccumulator::from_value(const MixtureAccumulator& other) {
  check_compatible(other);
  other.validate(kWhere);
  MixtureAccumulator candidate = *this;
  for (size_t k = 0; k < components_.size(); ++k) candidate.components_[k].from_value(other.components_[k]);
  candidate.comp_count_ = other.comp_count_;
  *this = std::move(candidate);
}

void MixtureAccumulator::scale(double c) {
  if (!(std::isfinite(c) && c >= 0.0)) throw ValueError(std::string(kWhere) + ": scale must be finite and >= 0");
  comp_count_ *= c;
  for (AnyAccumulator& a : components_) a.scale(c);
}

void MixtureAccumulator::set_zero() {
  comp_count_.setZero();
  for (AnyAccumulator& a : components_) a.set_zero();
}

void MixtureAccumulator::merge_trusted(const MixtureAccumulator& other) {
  check_compatible(other);
  comp_count_ += other.comp_count_;
  for (size_t k = 0; k < components_.size(); ++k) components_[k].merge_trusted(other.components_[k]);
}

void MixtureAccumulator::initialize(const AnyBatch& batch, std::span<const double> w, Rng& rng) {
  initialize_shard(batch, w, rng, 0, 0);
}

void MixtureAccumulator::initialize_shard(const AnyBatch& batch, std::span<const double> w, Rng& rng,
                                          Index rows_before, Index rows_after) {
  check::weights(kWhere, w, batch.n_rows());
  const Index n = batch.n_rows();
  const Index K = comp_count_.size();
  Matrix rho(n, K);  // [n, K]
  rng.discard_dirichlet_ones(rows_before, K);
  for (Index row = 0; row < n; ++row) rng.dirichlet_ones({rho.data() + row * K, static_cast<size_t>(K)});
  rng.discard_dirichlet_ones(rows_after, K);
  MixtureAccumulator candidate = *this;
  std::vector<double> wk(static_cast<size_t>(n));
  for (Index k = 0; k < K; ++k) {
    for (Index row = 0; row < n; ++row) wk[row] = w[row] * rho(row, k);
    candidate.components_[k].initialize_shard(batch, wk, rng, rows_before, rows_after);
    candidate.comp_count_[k] += accurate_sum(wk);
  }
  *this = std::move(candidate);
}

void MixtureAccumulator::validate(std::string_view where) const {
  for (Index k = 0; k < comp_count_.size(); ++k)
    if (!std::isfinite(comp_count_[k]) || comp_count_[k] < 0.0)
      throw ValueError(std::string(where) + ": count statistic comp_count entry " + std::to_string(k) +
                       " must be finite and >= 0");
}

bool MixtureAccumulator::operator==(const MixtureAccumulator& other) const {
  if (components_.size() != other.components_.size() || comp_count_ != other.comp_count_) return false;
  for (size_t k = 0; k < components_.size(); ++k)
    if (!(components_[k] == other.components_[k])) return false;
  return true;
}

// ----- distribution ------------------------------------------------------------------------------------------

Mixture::Mixture(std::vector<AnyDistribution> components, Vector w, std::string name)
    : components_(std::move(components)), w_(std::move(w)), name_(std::move(name)) {
  if (components_.empty()) throw ValueError(std::string(kWhere) + ": a mixture needs at least one component");
  check::dimension(kWhere, "number of weights", static_cast<Index>(components_.size()), w_.size());
  check::simplex(kWhere, "w", {w_.data(), static_cast<size_t>(w_.size())});
  for (const AnyDistribution& c : components_)
    if (!c.has_value()) throw ValueError(std::string(kWhere) + ": empty component");
  log_w_ = w_.array().log();
}

Matrix Mixture::component_log_joint(const AnyBatch& batch) const {
  const Index n = batch.n_rows();
  const Index K = static_cast<Index>(components_.size());
  Matrix joint(n, K);
  std::vector<double> column(static_cast<size_t>(n));
  for (Index k = 0; k < K; ++k) {
    components_[k].log_density(batch, column);
    for (Index row = 0; row < n; ++row) joint(row, k) = log_w_[k] + column[row];
  }
  return joint;
}

void Mixture::log_density(const AnyBatch& batch, std::span<double> out) const {
  check::dimension(kWhere, "log_density output length", batch.n_rows(), static_cast<Index>(out.size()));
  const Matrix joint = component_log_joint(batch);
  for (Index row = 0; row < joint.rows(); ++row)
    out[row] = log_sum_exp({joint.data() + row * joint.cols(), static_cast<size_t>(joint.cols())});
}

Matrix Mixture::responsibilities(const AnyBatch& batch) const {
  Matrix rho = component_log_joint(batch);
  for (Index row = 0; row < rho.rows(); ++row) {
    const double lse = log_sum_exp({rho.data() + row * rho.cols(), static_cast<size_t>(rho.cols())});
    if (lse == kNegInf)
      rho.row(row).setZero();
    else
      exp_shift_in_place({rho.data() + row * rho.cols(), static_cast<size_t>(rho.cols())}, lse);
  }
  return rho;
}

void Mixture::accumulate(const AnyBatch& batch, std::span<const double> w, MixtureAccumulator& acc,
                         std::span<double> log_p_out) const {
  check::weights(kWhere, w, batch.n_rows());
  const Index n = batch.n_rows();
  const Index K = static_cast<Index>(components_.size());
  if (acc.components().size() != components_.size())
    throw ValueError(std::string(kWhere) + ": accumulator has a different number of components");
  if (!log_p_out.empty())
    check::dimension(kWhere, "log-density output length", n, static_cast<Index>(log_p_out.size()));
  Matrix rho = component_log_joint(batch);
  std::vector<int64_t> impossible;
  for (Index row = 0; row < n; ++row) {
    const double lse = log_sum_exp({rho.data() + row * K, static_cast<size_t>(K)});
    if (!log_p_out.empty()) log_p_out[row] = lse;
    if (std::isnan(lse) || lse == kInf)
      throw ValueError(std::string(kWhere) + ": log weight of row " + std::to_string(row) + " is NaN or +inf");
    if (lse == kNegInf) {
      if (w[row] > 0.0) impossible.push_back(row);
      rho.row(row).setZero();
    } else {
      exp_shift_in_place({rho.data() + row * K, static_cast<size_t>(K)}, lse);
    }
  }
  if (!impossible.empty()) throw ImpossibleEvidenceError(kWhere, std::move(impossible));
  // Components accumulate into fresh partials so a failure in any component leaves acc untouched.
  MixtureAccumulator partial = make_accumulator();
  std::vector<double> wk(static_cast<size_t>(n));
  for (Index k = 0; k < K; ++k) {
    for (Index row = 0; row < n; ++row) wk[row] = w[row] * rho(row, k);
    components_[k].accumulate(batch, wk, partial.children()[k]);
    double total = 0.0;
    for (double v : wk) total += v;
    partial.comp_count()[k] = total;
  }
  acc.merge_trusted(partial);
}

MixtureAccumulator Mixture::make_accumulator() const {
  std::vector<AnyAccumulator> children;
  for (const AnyDistribution& c : components_) children.push_back(c.make_accumulator());
  return MixtureAccumulator(std::move(children));
}

MixtureEstimator Mixture::estimator() const {
  std::vector<AnyEstimator> estimators;
  for (const AnyDistribution& c : components_) estimators.push_back(c.estimator());
  return MixtureEstimator(std::move(estimators), std::nullopt, name_);
}

// ----- estimator ---------------------------------------------------------------------------------------------

MixtureEstimator::MixtureEstimator(std::vector<AnyEstimator> estimators, std::optional<std::string> keys,
                                   std::string name)
    : estimators_(std::move(estimators)), keys_(std::move(keys)), name_(std::move(name)) {
  if (estimators_.empty()) throw ValueError(std::string(kWhere) + ": a mixture needs at least one component");
}

MixtureAccumulator MixtureEstimator::make_accumulator() const {
  std::vector<AnyAccumulator> children;
  for (const AnyEstimator& e : estimators_) children.push_back(e.make_accumulator());
  return MixtureAccumulator(std::move(children), keys_);
}

Mixture MixtureEstimator::estimate(std::optional<double> nobs, const MixtureAccumulator& acc) const {
  if (acc.components().size() != estimators_.size())
    throw ValueError(std::string(kWhere) + ": statistics have " + std::to_string(acc.components().size()) +
                     " components, the estimator " + std::to_string(estimators_.size()));
  acc.validate(kWhere);
  const Vector& counts = acc.comp_count();
  const double total = accurate_sum({counts.data(), static_cast<size_t>(counts.size())});
  if (nobs) check_mass_law(kWhere, "nobs", *nobs, "sum(comp_count)", total);
  const Index K = counts.size();
  Vector w = total > 0.0 ? Vector(counts / total) : Vector::Constant(K, 1.0 / static_cast<double>(K));
  if (total > 0.0) w /= accurate_sum({w.data(), static_cast<size_t>(K)});  // exact simplex after rounding
  std::vector<AnyDistribution> components;
  // Component k's mass is comp_count[k] unless it is keyed: tying replaced its statistics with the pooled ones of
  // every site sharing the key, whose mass is not comp_count[k], so no per-component nobs applies to it.
  for (Index k = 0; k < K; ++k) {
    const AnyAccumulator& child = acc.components()[k];
    const bool pooled = child.keys().has_value();
    components.push_back(estimators_[k].estimate(nobs && !pooled ? std::optional<double>(counts[k]) : std::nullopt,
                                                 child));
  }
  return Mixture(std::move(components), std::move(w), name_);
}

}  // namespace attnmix
