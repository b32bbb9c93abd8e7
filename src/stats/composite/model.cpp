// SPDX-License-Identifier: Apache-2.0
// The composite (product) distribution over type-erased components (docs/mechanisms.md#building-blocks).
#include "attnmix/stats/composite.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"

namespace attnmix {

// ----- batch
// -------------------------------------------------------------------------------------------------

CompositeBatch::CompositeBatch(std::vector<AnyBatch> fields) : fields_(std::move(fields)) {
  constexpr const char* kWhere = "CompositeDataEncoder";
  if (fields_.empty())
    throw ValueError(std::string(kWhere) + ": a composite observation needs at least one field");
  for (size_t f = 0; f < fields_.size(); ++f)
    if (!fields_[f].has_value())
      throw ValueError(std::string(kWhere) + ": field " + std::to_string(f) + " is empty");
  n_rows_ = fields_[0].n_rows();
  for (size_t f = 1; f < fields_.size(); ++f)
    if (fields_[f].n_rows() != n_rows_)
      throw ValueError(std::string(kWhere) +
                       ": every field must have the same number of rows (field 0 has " +
                       std::to_string(n_rows_) + ", field " + std::to_string(f) + " has " +
                       std::to_string(fields_[f].n_rows()) + ")");
}

CompositeBatch CompositeBatch::slice(Index begin, Index count) const {
  ATTNMIX_ASSERT(begin >= 0 && count >= 0 && begin + count <= n_rows_, "batch slice out of range");
  CompositeBatch out;
  out.fields_.reserve(fields_.size());
  for (const AnyBatch& field : fields_) out.fields_.push_back(field.slice(begin, count));
  out.n_rows_ = count;
  return out;
}

// ----- accumulator
// -------------------------------------------------------------------------------------------

CompositeAccumulator::CompositeAccumulator(std::vector<AnyAccumulator> children,
                                           std::optional<std::string> keys)
    : children_(std::move(children)), keys_(std::move(keys)) {
  if (children_.empty())
    throw ValueError(std::string(kWhere) + ": a composite needs at least one component");
}

Index CompositeAccumulator::flat_size() const {
  Index size = 0;
  for (const AnyAccumulator& c : children_) size += c.flat_size();
  return size;
}

void CompositeAccumulator::pack(std::span<double> out) const {
  if (static_cast<Index>(out.size()) != flat_size())
    throw ValueError(std::string(kWhere) + ": pack buffer has the wrong size");
  size_t offset = 0;
  for (const AnyAccumulator& c : children_) {
    const size_t size = static_cast<size_t>(c.flat_size());
    c.pack(out.subspan(offset, size));
    offset += size;
  }
}

void CompositeAccumulator::unpack(std::span<const double> in) {
  if (static_cast<Index>(in.size()) != flat_size())
    throw ValueError(std::string(kWhere) + ": packed statistics must have " +
                     std::to_string(flat_size()) + " entries (got " + std::to_string(in.size()) +
                     ")");
  CompositeAccumulator candidate =
      *this;  // every child validates its slice before anything is committed
  size_t offset = 0;
  for (AnyAccumulator& c : candidate.children_) {
    const size_t size = static_cast<size_t>(c.flat_size());
    c.unpack(in.subspan(offset, size));
    offset += size;
  }
  *this = std::move(candidate);
}

void CompositeAccumulator::check_compatible(const CompositeAccumulator& other) const {
  if (other.children_.size() != children_.size())
    throw ValueError(std::string(kWhere) + ": statistics must come from a composite with " +
                     std::to_string(children_.size()) + " components (got " +
                     std::to_string(other.children_.size()) + ")");
}

void CompositeAccumulator::combine(const CompositeAccumulator& v) {
  check_compatible(v);
  CompositeAccumulator candidate = *this;
  for (size_t f = 0; f < children_.size(); ++f) candidate.children_[f].combine(v.children_[f]);
  *this = std::move(candidate);
}

void CompositeAccumulator::from_value(const CompositeAccumulator& v) {
  check_compatible(v);
  CompositeAccumulator candidate = *this;
  for (size_t f = 0; f < children_.size(); ++f) candidate.children_[f].from_value(v.children_[f]);
  *this = std::move(candidate);
}

void CompositeAccumulator::scale(double c) {
  if (!(std::isfinite(c) && c >= 0.0))
    throw ValueError(std::string(kWhere) + ": scale must be finite and >= 0");
  for (AnyAccumulator& a : children_) a.scale(c);
}

void CompositeAccumulator::set_zero() {
  for (AnyAccumulator& a : children_) a.set_zero();
}

void CompositeAccumulator::merge_trusted(const CompositeAccumulator& other) {
  check_compatible(other);
  for (size_t f = 0; f < children_.size(); ++f) children_[f].merge_trusted(other.children_[f]);
}

void CompositeAccumulator::initialize(const CompositeBatch& batch, std::span<const double> w, Rng& rng) {
  initialize_shard(batch, w, rng, 0, 0);
}

void CompositeAccumulator::initialize_shard(const CompositeBatch& batch, std::span<const double> w, Rng& rng,
                                            Index rows_before, Index rows_after) {
  check::dimension(kWhere, "number of fields", static_cast<Index>(children_.size()), batch.n_fields());
  check::weights(kWhere, w, batch.n_rows());
  CompositeAccumulator candidate = *this;
  for (size_t f = 0; f < children_.size(); ++f)
    candidate.children_[f].initialize_shard(batch.field(static_cast<Index>(f)), w, rng, rows_before, rows_after);
  *this = std::move(candidate);
}

bool CompositeAccumulator::operator==(const CompositeAccumulator& other) const {
  if (children_.size() != other.children_.size()) return false;
  for (size_t f = 0; f < children_.size(); ++f)
    if (!(children_[f] == other.children_[f])) return false;
  return true;
}

// ----- distribution
// ------------------------------------------------------------------------------------------

Composite::Composite(std::vector<AnyDistribution> components, std::string name)
    : components_(std::move(components)), name_(std::move(name)) {
  if (components_.empty())
    throw ValueError(std::string(kWhere) + ": a composite needs at least one component");
  for (size_t f = 0; f < components_.size(); ++f)
    if (!components_[f].has_value())
      throw ValueError(std::string(kWhere) + ": component " + std::to_string(f) + " is empty");
}

void Composite::check_fields(const CompositeBatch& batch) const {
  check::dimension(kWhere, "number of fields", static_cast<Index>(components_.size()),
                   batch.n_fields());
}

void Composite::log_density(const CompositeBatch& batch, std::span<double> out) const {
  check_fields(batch);
  check::dimension(kWhere, "log_density output length", batch.n_rows(),
                   static_cast<Index>(out.size()));
  std::fill(out.begin(), out.end(), 0.0);
  std::vector<double> column(static_cast<size_t>(batch.n_rows()));
  for (size_t f = 0; f < components_.size(); ++f) {
    components_[f].log_density(batch.field(static_cast<Index>(f)), column);
    for (size_t n = 0; n < column.size(); ++n) out[n] += column[n];
  }
}

void Composite::accumulate(const CompositeBatch& batch, std::span<const double> w,
                           CompositeAccumulator& acc, std::span<double> log_p_out) const {
  check_fields(batch);
  check::weights(kWhere, w, batch.n_rows());
  if (acc.components().size() != components_.size())
    throw ValueError(std::string(kWhere) + ": accumulator has " +
                     std::to_string(acc.components().size()) + " components, the model " +
                     std::to_string(components_.size()));
  if (!log_p_out.empty())
    check::dimension(kWhere, "log-density output length", batch.n_rows(),
                     static_cast<Index>(log_p_out.size()));

  // Pass 1: the total log density of every row; impossible rows are found before any statistic
  // changes.
  const Index n = batch.n_rows();
  std::vector<double> log_p(static_cast<size_t>(n));
  log_density(batch, log_p);
  std::vector<int64_t> impossible;
  for (Index row = 0; row < n; ++row) {
    const double lp = log_p[static_cast<size_t>(row)];
    if (std::isnan(lp) || lp == kInf)
      throw ValueError(std::string(kWhere) + ": log weight of row " + std::to_string(row) +
                       " is NaN or +inf");
    if (lp == kNegInf && w[row] > 0.0) impossible.push_back(row);
  }
  if (!impossible.empty()) throw ImpossibleEvidenceError(kWhere, std::move(impossible));

  // Pass 2: children accumulate into a fresh partial, merged only when every child succeeded.
  CompositeAccumulator partial = make_accumulator();
  for (size_t f = 0; f < components_.size(); ++f)
    components_[f].accumulate(batch.field(static_cast<Index>(f)), w, partial.children()[f]);
  acc.merge_trusted(partial);
  if (!log_p_out.empty()) std::copy(log_p.begin(), log_p.end(), log_p_out.begin());
}

CompositeAccumulator Composite::make_accumulator() const {
  std::vector<AnyAccumulator> children;
  children.reserve(components_.size());
  for (const AnyDistribution& c : components_) children.push_back(c.make_accumulator());
  return CompositeAccumulator(std::move(children));
}

CompositeEstimator Composite::estimator() const {
  std::vector<AnyEstimator> estimators;
  estimators.reserve(components_.size());
  for (const AnyDistribution& c : components_) estimators.push_back(c.estimator());
  return CompositeEstimator(std::move(estimators), std::nullopt, name_);
}

CompositeSampler Composite::sampler(uint64_t seed) const { return {*this, seed}; }

// ----- estimator
// ---------------------------------------------------------------------------------------------

CompositeEstimator::CompositeEstimator(std::vector<AnyEstimator> estimators,
                                       std::optional<std::string> keys, std::string name)
    : estimators_(std::move(estimators)), keys_(std::move(keys)), name_(std::move(name)) {
  if (estimators_.empty())
    throw ValueError(std::string(kWhere) + ": a composite needs at least one component");
}

CompositeAccumulator CompositeEstimator::make_accumulator() const {
  std::vector<AnyAccumulator> children;
  children.reserve(estimators_.size());
  for (const AnyEstimator& e : estimators_) children.push_back(e.make_accumulator());
  return CompositeAccumulator(std::move(children), keys_);
}

Composite CompositeEstimator::estimate(std::optional<double> nobs,
                                       const CompositeAccumulator& acc) const {
  if (acc.components().size() != estimators_.size())
    throw ValueError(std::string(kWhere) + ": statistics have " +
                     std::to_string(acc.components().size()) + " components, the estimator " +
                     std::to_string(estimators_.size()));
  std::vector<AnyDistribution> components;
  components.reserve(estimators_.size());
  for (size_t f = 0; f < estimators_.size(); ++f)
    components.push_back(estimators_[f].estimate(nobs, acc.components()[f]));
  return Composite(std::move(components), name_);
}

// ----- sampler
// -----------------------------------------------------------------------------------------------

std::vector<uint64_t> composite_field_seeds(Rng& rng, size_t n_fields) {
  std::vector<uint64_t> seeds(n_fields);
  for (uint64_t& s : seeds) s = rng.next_u64();
  return seeds;
}

CompositeBatch CompositeSampler::sample(Index m) {
  if (m < 0) throw ValueError("CompositeSampler: size must be >= 0");
  const std::vector<uint64_t> seeds = composite_field_seeds(rng_, model_.components().size());
  std::vector<AnyBatch> fields;
  fields.reserve(seeds.size());
  for (size_t f = 0; f < seeds.size(); ++f)
    fields.push_back(model_.components()[f].sample(m, seeds[f]));
  return CompositeBatch(std::move(fields));
}

}  // namespace attnmix
