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
  CompositeBatch() = default;
  /// @throws ValueError on no fields, an empty field batch or fields with different row counts.
  explicit CompositeBatch(std::vector<AnyBatch> fields);

  [[nodiscard]] Index n_rows() const noexcept { return n_rows_; }
  [[nodiscard]] Index n_fields() const noexcept { return static_cast<Index>(fields_.size()); }
  [[nodiscard]] const AnyBatch& field(Index f) const { return fields_[static_cast<size_t>(f)]; }
  [[nodiscard]] const std::vector<AnyBatch>& fields() const noexcept { return fields_; }
  [[nodiscard]] CompositeBatch slice(Index begin, Index count) const;

 private:
  std::vector<AnyBatch> fields_;
  Index n_rows_ = 0;
};

/// The children's statistics side by side (one AnyAccumulator per field).
class CompositeAccumulator {
 public:
  using batch_type = CompositeBatch;
  static constexpr const char* kWhere = "CompositeAccumulator";

  /// @throws ValueError on no children.
  explicit CompositeAccumulator(std::vector<AnyAccumulator> children,
                                std::optional<std::string> keys = std::nullopt);

  [[nodiscard]] const std::vector<AnyAccumulator>& components() const noexcept { return children_; }
  /// The children, for keyed tying (`docs/mechanisms.md#building-blocks`) and for the E-step.
  [[nodiscard]] std::span<AnyAccumulator> children() noexcept { return children_; }
  [[nodiscard]] const std::optional<std::string>& keys() const noexcept { return keys_; }

  [[nodiscard]] Index flat_size() const;
  void pack(std::span<double> out) const;
  /// Validates every child's slice of `in`, then overwrites; nothing changes on failure. @throws
  /// ValueError.
  void unpack(std::span<const double> in);
  /// Validates every child of v, then adds; nothing changes on failure. @throws ValueError /
  /// TypeError.
  void combine(const CompositeAccumulator& v);
  /// Validates every child of v, then overwrites (keys stay); nothing changes on failure. @throws
  /// ValueError.
  void from_value(const CompositeAccumulator& v);
  /// A snapshot (deep copy).
  [[nodiscard]] CompositeAccumulator value() const { return *this; }
  /// @throws ValueError unless c is finite and ≥ 0.
  void scale(double c);
  void set_zero();
  /// Adds a partial of this library's own E-step (layouts checked, values trusted).
  void merge_trusted(const CompositeAccumulator& other);
  /// seq_initialize: child f initialises on field f, in field order, with weights w. Atomic.
  void initialize(const CompositeBatch& batch, std::span<const double> w, Rng& rng);
  /// The same over [rows_before other rows; batch; rows_after other rows]: each child's initialize_shard, in field
  /// order. Atomic.
  void initialize_shard(const CompositeBatch& batch, std::span<const double> w, Rng& rng, Index rows_before,
                        Index rows_after);
  [[nodiscard]] bool operator==(const CompositeAccumulator& other) const;

 private:
  void check_compatible(const CompositeAccumulator& other) const;
  std::vector<AnyAccumulator> children_;
  std::optional<std::string> keys_;
};

class Composite {
 public:
  using batch_type = CompositeBatch;
  using accumulator_type = CompositeAccumulator;
  using estimator_type = CompositeEstimator;
  static constexpr const char* kFamily = "composite";
  static constexpr const char* kWhere = "CompositeDistribution";

  /// @throws ValueError on no components or an empty component.
  explicit Composite(std::vector<AnyDistribution> components, std::string name = {});

  [[nodiscard]] const std::vector<AnyDistribution>& components() const noexcept {
    return components_;
  }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// out[n] = Σ_f log p_f(x_nf). @throws ValueError on a batch with another number of fields;
  /// TypeError when a field belongs to another family.
  void log_density(const CompositeBatch& batch, std::span<double> out) const;
  /// The atomic E-step. @throws ImpossibleEvidenceError (nothing changed) for rows with total log p
  /// = −∞ and w_n > 0; ValueError / TypeError on invalid inputs.
  void accumulate(const CompositeBatch& batch, std::span<const double> w, CompositeAccumulator& acc,
                  std::span<double> log_p_out = {}) const;
  [[nodiscard]] CompositeAccumulator make_accumulator() const;
  [[nodiscard]] CompositeEstimator estimator() const;
  [[nodiscard]] CompositeSampler sampler(uint64_t seed) const;

 private:
  void check_fields(const CompositeBatch& batch) const;
  std::vector<AnyDistribution> components_;
  std::string name_;
};

class CompositeEstimator {
 public:
  using distribution_type = Composite;
  using accumulator_type = CompositeAccumulator;
  static constexpr const char* kWhere = "CompositeEstimator";

  /// @throws ValueError on no estimators.
  explicit CompositeEstimator(std::vector<AnyEstimator> estimators,
                              std::optional<std::string> keys = std::nullopt,
                              std::string name = {});
  [[nodiscard]] CompositeAccumulator make_accumulator() const;
  /// Each component estimated from its own statistics with the same nobs. @throws ValueError on
  /// invalid statistics (including a child's mass law against nobs).
  [[nodiscard]] Composite estimate(std::optional<double> nobs,
                                   const CompositeAccumulator& acc) const;

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
  CompositeSampler(Composite model, uint64_t seed) : model_(std::move(model)), rng_(seed) {}
  /// @throws ValueError when m < 0 or a component has no sampler.
  [[nodiscard]] CompositeBatch sample(Index m);

 private:
  Composite model_;
  Rng rng_;
};

/// The family's descriptor (family/spec.hpp), registered in src/family/registry.cpp.
[[nodiscard]] const FamilySpec& composite_family();

}  // namespace attnmix

#include "attnmix/core/concepts.hpp"
static_assert(attnmix::Batch<attnmix::CompositeBatch>);
static_assert(attnmix::Accumulator<attnmix::CompositeAccumulator>);
static_assert(attnmix::Distribution<attnmix::Composite>);
static_assert(attnmix::Estimator<attnmix::CompositeEstimator>);
