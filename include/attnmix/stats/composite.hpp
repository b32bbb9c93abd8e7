// SPDX-License-Identifier: Apache-2.0
/// @file composite.hpp
/// The composite (product) distribution over the fields of a tuple observation (`docs/mechanisms.md#building-blocks`):
/// field f of every row is modelled by its own component, independently of the other fields.
///
/// Notation: F fields; f ∈ [F]; components p_f of any family (type-erased).
///   log p(x) = Σ_f log p_f(x_f)
///   E-step:  component f accumulates field f with the same weights w. A row whose total log p
///            is −∞ and whose weight is positive raises ImpossibleEvidenceError before any
///            statistic changes; the children accumulate into fresh partials that are merged
///            only when every child succeeded.
///   init:    component f initialises on field f with weights w, in field order, from one rng.
///   M-step:  component f is estimated from its own statistics, with the same nobs.
/// Statistics: value() = (child values …) side by side; the flat packing is the children's
/// buffers in field order.
/// Cost: the components' costs; the E-step evaluates each component's log density once more than
/// the components' own E-steps do (the atomic impossible-row check needs the total first).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

struct FamilySpec;

class CompositeEstimator;
class CompositeSampler;

/// One batch per field, all with the same number of rows. Immutable; slices slice every field.
class CompositeBatch {
 public:
  /// An empty batch: no fields and no rows.
  CompositeBatch() = default;
  /// @throws ValueError on no fields, an empty field batch or fields with different row counts.
  explicit CompositeBatch(std::vector<AnyBatch> fields);

  /// The number of rows n (the same in every field).
  [[nodiscard]] Index n_rows() const noexcept { return n_rows_; }
  /// The number of fields F.
  [[nodiscard]] Index n_fields() const noexcept { return static_cast<Index>(fields_.size()); }
  /// The batch of field f (0 ≤ f < n_fields(); not checked).
  [[nodiscard]] const AnyBatch& field(Index f) const { return fields_[static_cast<size_t>(f)]; }
  /// The batches of all fields, in field order.
  [[nodiscard]] const std::vector<AnyBatch>& fields() const noexcept { return fields_; }
  /// Rows [begin, begin + count) of every field, each sharing its field's storage (O(F)). The range must lie inside
  /// the batch (a broken precondition aborts).
  [[nodiscard]] CompositeBatch slice(Index begin, Index count) const;

 private:
  std::vector<AnyBatch> fields_;
  Index n_rows_ = 0;
};

/// The children's statistics side by side (one AnyAccumulator per field).
class CompositeAccumulator {
 public:
  /// The batch type initialize() reads.
  using batch_type = CompositeBatch;
  /// The prefix of this accumulator's error messages.
  static constexpr const char* kWhere = "CompositeAccumulator";

  /// The children's statistics, one per field in field order, carrying the tying key `keys`
  /// (`docs/mechanisms.md#building-blocks`; nullopt: untied).
  /// @throws ValueError on no children.
  explicit CompositeAccumulator(std::vector<AnyAccumulator> children,
                                std::optional<std::string> keys = std::nullopt);

  /// The children's statistics, one per field, in field order.
  [[nodiscard]] const std::vector<AnyAccumulator>& components() const noexcept { return children_; }
  /// The children, for keyed tying (`docs/mechanisms.md#building-blocks`) and for the E-step.
  [[nodiscard]] std::span<AnyAccumulator> children() noexcept { return children_; }
  /// The tying key of this site (`docs/mechanisms.md#building-blocks`); nullopt: untied.
  [[nodiscard]] const std::optional<std::string>& keys() const noexcept { return keys_; }

  /// The number of doubles pack() writes: the sum of the children's flat sizes.
  [[nodiscard]] Index flat_size() const;
  /// Writes the children's flat buffers back to back, in field order. @throws ValueError unless out has
  /// flat_size() entries.
  void pack(std::span<double> out) const;
  /// Validates every child's slice of `in`, then overwrites; nothing changes on failure.
  /// @throws ValueError when a check fails.
  void unpack(std::span<const double> in);
  /// Validates every child of v, then adds; nothing changes on failure.
  /// @throws ValueError (or TypeError) when a check fails.
  void combine(const CompositeAccumulator& v);
  /// Validates every child of v, then overwrites (keys stay); nothing changes on failure.
  /// @throws ValueError when a check fails.
  void from_value(const CompositeAccumulator& v);
  /// A snapshot (deep copy).
  [[nodiscard]] CompositeAccumulator value() const { return *this; }
  /// @throws ValueError unless c is finite and ≥ 0.
  void scale(double c);
  /// Zeroes every child's statistics (keys stay).
  void set_zero();
  /// Adds a partial of this library's own E-step (layouts checked, values trusted).
  void merge_trusted(const CompositeAccumulator& other);
  /// seq_initialize: child f initialises on field f, in field order, with weights w. Atomic.
  void initialize(const CompositeBatch& batch, std::span<const double> w, Rng& rng);
  /// The same over [rows_before other rows; batch; rows_after other rows]: each child's initialize_shard, in field
  /// order. Atomic.
  void initialize_shard(const CompositeBatch& batch, std::span<const double> w, Rng& rng, Index rows_before,
                        Index rows_after);
  /// True when both have as many children and each child equals its counterpart (AnyAccumulator::operator==); the
  /// tying keys are not compared.
  [[nodiscard]] bool operator==(const CompositeAccumulator& other) const;

 private:
  void check_compatible(const CompositeAccumulator& other) const;
  std::vector<AnyAccumulator> children_;
  std::optional<std::string> keys_;
};

/// The composite distribution (`docs/mechanisms.md#composite`): immutable; component f models field f.
class Composite {
 public:
  /** @name Roles */
  /// @{
  /// The types of the roles this distribution works with (`docs/design.md`): its batch, accumulator and estimator.
  using batch_type = CompositeBatch;
  using accumulator_type = CompositeAccumulator;
  using estimator_type = CompositeEstimator;
  /// @}
  /// The family's name: AnyDistribution::family() and the "family" of its model files.
  static constexpr const char* kFamily = "composite";
  /// The prefix of this distribution's error messages.
  static constexpr const char* kWhere = "CompositeDistribution";

  /// @throws ValueError on no components or an empty component.
  explicit Composite(std::vector<AnyDistribution> components, std::string name = {});

  /// The components, one per field, in field order.
  [[nodiscard]] const std::vector<AnyDistribution>& components() const noexcept {
    return components_;
  }
  /// The model's name ("" for none), kept by estimator() and saved in model files.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// out[n] = Σ_f log p_f(x_nf). @throws ValueError on a batch with another number of fields;
  /// TypeError when a field belongs to another family.
  void log_density(const CompositeBatch& batch, std::span<double> out) const;
  /// The atomic E-step. @throws ImpossibleEvidenceError (nothing changed) for rows with total log p
  /// = −∞ and w_n > 0; ValueError / TypeError on invalid inputs.
  void accumulate(const CompositeBatch& batch, std::span<const double> w, CompositeAccumulator& acc,
                  std::span<double> log_p_out = {}) const;
  /// Zero statistics: each component's make_accumulator(), in field order, untied.
  [[nodiscard]] CompositeAccumulator make_accumulator() const;
  /// Estimator of the components' own estimators (AnyDistribution::estimator()), untied, with this model's name.
  [[nodiscard]] CompositeEstimator estimator() const;
  /// A sampler of (a copy of) this model seeded with `seed` (CompositeSampler).
  [[nodiscard]] CompositeSampler sampler(uint64_t seed) const;

 private:
  void check_fields(const CompositeBatch& batch) const;
  std::vector<AnyDistribution> components_;
  std::string name_;
};

/// The composite M-step (`docs/mechanisms.md#composite`): const and stateless.
class CompositeEstimator {
 public:
  /// The distribution estimate() returns.
  using distribution_type = Composite;
  /// The statistics estimate() reads.
  using accumulator_type = CompositeAccumulator;
  /// The prefix of this estimator's error messages.
  static constexpr const char* kWhere = "CompositeEstimator";

  /// One estimator per field, in field order; `keys` is the tying key of the accumulators make_accumulator() returns
  /// (nullopt: untied) and `name` the name of every model estimate() returns.
  /// @throws ValueError on no estimators.
  explicit CompositeEstimator(std::vector<AnyEstimator> estimators,
                              std::optional<std::string> keys = std::nullopt,
                              std::string name = {});
  /// Zero statistics: each estimator's make_accumulator() (its keys included), in field order, carrying this
  /// estimator's keys.
  [[nodiscard]] CompositeAccumulator make_accumulator() const;
  /// Each component estimated from its own statistics with the same nobs. @throws ValueError on
  /// invalid statistics (including a child's mass law against nobs).
  [[nodiscard]] Composite estimate(std::optional<double> nobs,
                                   const CompositeAccumulator& acc) const;

  /// The fields' estimators, in field order.
  [[nodiscard]] const std::vector<AnyEstimator>& estimators() const noexcept { return estimators_; }
  /// The tying key of the accumulators make_accumulator() returns (nullopt: untied).
  [[nodiscard]] const std::optional<std::string>& keys() const noexcept { return keys_; }
  /// The name of the models estimate() returns (empty: none).
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

 private:
  std::vector<AnyEstimator> estimators_;
  std::optional<std::string> keys_;
  std::string name_;
};

/// Each sample(m) call draws field f of all m rows from component f's sampler, seeded with the f-th
/// of F seeds drawn from this sampler's own Rng. Deterministic given the seed and the sequence of
/// calls; unlike the leaf samplers, sample(m) is not the same draws as m calls of sample(1),
/// because the children's samplers are reached through AnyDistribution::sample(m, seed), which
/// starts a fresh sampler per call.
class CompositeSampler {
 public:
  /// A sampler of `model` whose per-call field seeds come from Rng(seed).
  CompositeSampler(Composite model, uint64_t seed) : model_(std::move(model)), rng_(seed) {}
  /// @throws ValueError when m < 0 or a component has no sampler.
  [[nodiscard]] CompositeBatch sample(Index m);

 private:
  Composite model_;
  Rng rng_;
};

/// The field seeds of one CompositeSampler::sample call: `n_fields` consecutive draws of `rng`, all taken before any
/// field is sampled, so that field f's draws do not depend on field f − 1. Every composite sampler (the program's and
/// Python's too) seeds its fields this way.
[[nodiscard]] std::vector<uint64_t> composite_field_seeds(Rng& rng, size_t n_fields);

/// The family's descriptor (family/spec.hpp), registered in src/family/registry.cpp.
[[nodiscard]] const FamilySpec& composite_family();

}  // namespace attnmix

#include "attnmix/core/concepts.hpp"
static_assert(attnmix::Batch<attnmix::CompositeBatch>);
static_assert(attnmix::Accumulator<attnmix::CompositeAccumulator>);
static_assert(attnmix::Distribution<attnmix::Composite>);
static_assert(attnmix::Estimator<attnmix::CompositeEstimator>);
