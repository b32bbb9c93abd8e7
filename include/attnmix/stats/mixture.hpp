// SPDX-License-Identifier: Apache-2.0
/// @file mixture.hpp
/// The finite mixture over components of any family on the same data (`docs/mechanisms.md#building-blocks`).
///
/// Notation: K components; k ∈ [K]; weights w ∈ Δ_K.
///   log p(x) = LSE_k(log w_k + log p_k(x)),   ρ_nk = softmax_k(log w_k + log p_k(x_n))
///   E-step: comp_count[k] += w_n ρ_nk; component k accumulates with weights w ⊙ ρ_{·k}
///   init:   ρ_n ~ Dirichlet(1_K) for every row in row order; components initialise with w ⊙ ρ_{·k}
///   M-step: w = comp_count / Σ comp_count (uniform if 0); component k estimated with nobs_k = comp_count[k]
///           when nobs is given and component k is untied (a keyed component gets no nobs).
/// Statistics: value() = (comp_count (K,), (child values …)); flat packing = comp_count then each child's buffer.
/// Cost: the components' costs plus O(n K).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

struct FamilySpec;

class MixtureEstimator;

/// Statistics, in value() order: comp_count [K] (Σ w ρ per component), then each component's statistics.
class MixtureAccumulator {
 public:
  /// The batch type initialize() reads: the components' batches, type-erased.
  using batch_type = AnyBatch;
  /// The prefix of this accumulator's error messages.
  static constexpr const char* kWhere = "MixtureAccumulator";

  /// comp_count = 0 and the components' statistics `components` (one per mixture component, in order), carrying the
  /// tying key `keys` (`docs/mechanisms.md#building-blocks`; nullopt: untied). @throws ValueError on no components.
  MixtureAccumulator(std::vector<AnyAccumulator> components, std::optional<std::string> keys = std::nullopt);

  /// comp_count [K]: Σ_n w_n ρ_nk, the mass assigned to each component.
  [[nodiscard]] const Vector& comp_count() const noexcept { return comp_count_; }
  /// comp_count [K], writable in place (no validation).
  [[nodiscard]] Vector& comp_count() noexcept { return comp_count_; }
  /// The components' statistics, in component order.
  [[nodiscard]] const std::vector<AnyAccumulator>& components() const noexcept { return components_; }
  /// The components' statistics, for keyed tying (`docs/mechanisms.md#building-blocks`) and for the E-step.
  [[nodiscard]] std::span<AnyAccumulator> children() noexcept { return components_; }
  /// The tying key of this site (`docs/mechanisms.md#building-blocks`); nullopt: untied.
  [[nodiscard]] const std::optional<std::string>& keys() const noexcept { return keys_; }

  /// The number of doubles pack() writes: K plus the components' flat sizes.
  [[nodiscard]] Index flat_size() const;
  /// Writes comp_count, then each component's flat buffer in component order. @throws ValueError unless out has
  /// flat_size() entries.
  void pack(std::span<double> out) const;
  /// Validates, then overwrites; nothing changes on failure. @throws ValueError when a check fails.
  void unpack(std::span<const double> in);
  /// Validates other (comp_count finite and ≥ 0, each component's statistics), then adds it; nothing changes on
  /// failure. @throws ValueError on statistics of other components or invalid values; TypeError when a component's
  /// statistics belong to another family.
  void combine(const MixtureAccumulator& other);
  /// Validates other as combine() does, then overwrites comp_count and every component's statistics (keys stay);
  /// nothing changes on failure. @throws ValueError (or TypeError) when a check fails.
  void from_value(const MixtureAccumulator& other);
  /// A snapshot (deep copy).
  [[nodiscard]] MixtureAccumulator value() const { return *this; }
  /// Multiplies comp_count and every component's statistics by c. @throws ValueError unless c is finite and ≥ 0.
  void scale(double c);
  /// Zeroes comp_count and every component's statistics (keys stay).
  void set_zero();
  /// Adds a partial of this library's own E-step (layouts checked, values trusted). @throws ValueError on
  /// statistics of other components.
  void merge_trusted(const MixtureAccumulator& other);
  /// seq_initialize: ρ_n ~ Dirichlet(1_K) for every row, then component k initialises with weights w_n ρ_nk, in
  /// component order. Atomic.
  void initialize(const AnyBatch& batch, std::span<const double> w, Rng& rng);
  /// The same draws over [rows_before other rows; batch; rows_after other rows], with only batch's rows accumulated
  /// (the other rows' ρ are drawn and dropped, and each component replays its own draws likewise).
  void initialize_shard(const AnyBatch& batch, std::span<const double> w, Rng& rng, Index rows_before,
                        Index rows_after);
  /// comp_count finite and ≥ 0 (children validate their own laws when combined or unpacked).
  void validate(std::string_view where) const;
  /// True when comp_count and every component's statistics are equal (AnyAccumulator::operator==); the tying keys
  /// are not compared.
  [[nodiscard]] bool operator==(const MixtureAccumulator& other) const;

 private:
  void check_compatible(const MixtureAccumulator& other) const;
  Vector comp_count_;
  std::vector<AnyAccumulator> components_;
  std::optional<std::string> keys_;
};

/// The finite mixture (`docs/mechanisms.md#mixture`): immutable; the constructor validates w and precomputes log w.
class Mixture {
 public:
  /** @name Roles */
  /// @{
  /// The types of the roles this distribution works with (`docs/design.md`): its batch (the components' batches,
  /// type-erased), accumulator and estimator.
  using batch_type = AnyBatch;
  using accumulator_type = MixtureAccumulator;
  using estimator_type = MixtureEstimator;
  /// @}
  /// The family's name: AnyDistribution::family() and the "family" of its model files.
  static constexpr const char* kFamily = "mixture";
  /// The prefix of this distribution's error messages.
  static constexpr const char* kWhere = "MixtureDistribution";

  /// K components of any family on the same data, weights w [K] and the model's name.
  /// @throws ValueError on no components or an empty one, and unless w is a simplex with one entry per component.
  Mixture(std::vector<AnyDistribution> components, Vector w, std::string name = {});

  /// The components, in component order.
  [[nodiscard]] const std::vector<AnyDistribution>& components() const noexcept { return components_; }
  /// The weights w [K], a simplex.
  [[nodiscard]] const Vector& weights() const noexcept { return w_; }
  /// The model's name ("" for none), kept by estimator() and saved in model files.
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// out[n] = LSE_k(log w_k + log p_k(x_n)): −∞ for a row impossible under every component. Cost: the components'
  /// log densities plus O(n K). @throws ValueError on a wrong output length; the components' errors (TypeError for
  /// a batch of another family).
  void log_density(const AnyBatch& batch, std::span<double> out) const;
  /// Atomic E-step. @throws ImpossibleEvidenceError for rows impossible under every component.
  void accumulate(const AnyBatch& batch, std::span<const double> w, MixtureAccumulator& acc,
                  std::span<double> log_p_out = {}) const;
  /// Posterior component responsibilities ρ [n, K].
  [[nodiscard]] Matrix responsibilities(const AnyBatch& batch) const;
  /// Zero statistics: comp_count = 0 and each component's make_accumulator(), untied.
  [[nodiscard]] MixtureAccumulator make_accumulator() const;
  /// Estimator of the components' own estimators (AnyDistribution::estimator()), untied, with this model's name.
  [[nodiscard]] MixtureEstimator estimator() const;

 private:
  /// Per-component log w_k + log p_k(x_n) into [n, K].
  [[nodiscard]] Matrix component_log_joint(const AnyBatch& batch) const;
  std::vector<AnyDistribution> components_;
  Vector w_;
  Vector log_w_;
  std::string name_;
};

/// The mixture M-step (`docs/mechanisms.md#mixture`): const and stateless.
class MixtureEstimator {
 public:
  /// The distribution estimate() returns.
  using distribution_type = Mixture;
  /// The statistics estimate() reads.
  using accumulator_type = MixtureAccumulator;
  /// The prefix of this estimator's error messages.
  static constexpr const char* kWhere = "MixtureEstimator";

  /// One estimator per component, in component order; `keys` is the tying key of the accumulators make_accumulator()
  /// returns (nullopt: untied) and `name` the name of every model estimate() returns.
  /// @throws ValueError on no estimators.
  explicit MixtureEstimator(std::vector<AnyEstimator> estimators, std::optional<std::string> keys = std::nullopt,
                            std::string name = {});
  /// Zero statistics: each estimator's make_accumulator() (its keys included), carrying this estimator's keys.
  [[nodiscard]] MixtureAccumulator make_accumulator() const;
  /// w = comp_count / Σ comp_count (uniform on a zero total); component k is estimated from its own statistics, with
  /// nobs_k = comp_count[k] when nobs is given and component k is untied (tying replaced a keyed component's
  /// statistics with the pooled ones, whose mass is not comp_count[k], so it gets no nobs).
  /// @throws ValueError on invalid statistics or when nobs ≠ Σ comp_count.
  [[nodiscard]] Mixture estimate(std::optional<double> nobs, const MixtureAccumulator& acc) const;

  /// The components' estimators, in component order.
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

/// The family's descriptor (family/spec.hpp), registered in src/family/registry.cpp.
[[nodiscard]] const FamilySpec& mixture_family();

}  // namespace attnmix

#include "attnmix/core/concepts.hpp"
static_assert(attnmix::Distribution<attnmix::Mixture>);
static_assert(attnmix::Estimator<attnmix::MixtureEstimator>);
