// SPDX-License-Identifier: Apache-2.0
/// @file mixture.hpp
/// The finite mixture over components of any family on the same data (`docs/mechanisms.md#building-blocks`).
///
/// Notation: K components; k ∈ [K]; weights w ∈ Δ_K.
///   log p(x) = LSE_k(log w_k + log p_k(x)),   ρ_nk = softmax_k(log w_k + log p_k(x_n))
///   E-step: comp_count[k] += w_n ρ_nk; component k accumulates with weights w ⊙ ρ_{·k}
///   init:   ρ_n ~ Dirichlet(1_K) for every row in row order; components initialise with w ⊙ ρ_{·k}
///   M-step: w = comp_count / Σ comp_count (uniform if 0); component k estimated with nobs_k = comp_count[k]
///           when nobs is given.
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

class MixtureAccumulator {
 public:
  using batch_type = AnyBatch;
  static constexpr const char* kWhere = "MixtureAccumulator";

  MixtureAccumulator(std::vector<AnyAccumulator> components, std::optional<std::string> keys = std::nullopt);

  [[nodiscard]] const Vector& comp_count() const noexcept { return comp_count_; }
  [[nodiscard]] Vector& comp_count() noexcept { return comp_count_; }
  [[nodiscard]] const std::vector<AnyAccumulator>& components() const noexcept { return components_; }
  [[nodiscard]] std::span<AnyAccumulator> children() noexcept { return components_; }
  [[nodiscard]] const std::optional<std::string>& keys() const noexcept { return keys_; }

  [[nodiscard]] Index flat_size() const;
  void pack(std::span<double> out) const;
  /// Validates, then overwrites; nothing changes on failure. @throws ValueError.
  void unpack(std::span<const double> in);
  void combine(const MixtureAccumulator& other);
  void from_value(const MixtureAccumulator& other);
  [[nodiscard]] MixtureAccumulator value() const { return *this; }
  void scale(double c);
  void set_zero();
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
  [[nodiscard]] bool operator==(const MixtureAccumulator& other) const;

 private:
  void check_compatible(const MixtureAccumulator& other) const;
  Vector comp_count_;
  std::vector<AnyAccumulator> components_;
  std::optional<std::string> keys_;
};

class Mixture {
 public:
  using batch_type = AnyBatch;
  using accumulator_type = MixtureAccumulator;
  using estimator_type = MixtureEstimator;
  static constexpr const char* kFamily = "mixture";
  static constexpr const char* kWhere = "MixtureDistribution";

  /// @throws ValueError unless w is a simplex with one entry per component.
  Mixture(std::vector<AnyDistribution> components, Vector w, std::string name = {});

  [[nodiscard]] const std::vector<AnyDistribution>& components() const noexcept { return components_; }
  [[nodiscard]] const Vector& weights() const noexcept { return w_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  void log_density(const AnyBatch& batch, std::span<double> out) const;
  /// Atomic E-step. @throws ImpossibleEvidenceError for rows impossible under every component.
  void accumulate(const AnyBatch& batch, std::span<const double> w, MixtureAccumulator& acc,
                  std::span<double> log_p_out = {}) const;
  /// Posterior component responsibilities ρ [n, K].
  [[nodiscard]] Matrix responsibilities(const AnyBatch& batch) const;
  [[nodiscard]] MixtureAccumulator make_accumulator() const;
  [[nodiscard]] MixtureEstimator estimator() const;

 private:
  /// Per-component log w_k + log p_k(x_n) into [n, K].
  [[nodiscard]] Matrix component_log_joint(const AnyBatch& batch) const;
  std::vector<AnyDistribution> components_;
  Vector w_;
  Vector log_w_;
  std::string name_;
};

class MixtureEstimator {
 public:
  using distribution_type = Mixture;
  using accumulator_type = MixtureAccumulator;
  static constexpr const char* kWhere = "MixtureEstimator";

  explicit MixtureEstimator(std::vector<AnyEstimator> estimators, std::optional<std::string> keys = std::nullopt,
                            std::string name = {});
  [[nodiscard]] MixtureAccumulator make_accumulator() const;
  /// @throws ValueError on invalid statistics or when nobs ≠ Σ comp_count.
  [[nodiscard]] Mixture estimate(std::optional<double> nobs, const MixtureAccumulator& acc) const;

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
