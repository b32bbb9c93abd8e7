// SPDX-License-Identifier: Apache-2.0
/// @file categorical.hpp
/// The categorical distribution over ids [0, K) (`docs/mechanisms.md#building-blocks`): a classical leaf for composites
/// and mixtures.
///
/// Notation: K categories; k ∈ [K]; p ∈ Δ_K; ε = smoothing ≥ 0 (default 0).
///   log p(x) = log p[x]                  exact: −∞ for a zero-probability id, never floored
///   E-step:  counts[x_n] += w_n
///   M-step:  p = (counts + ε) / Σ (counts + ε); a zero total gives the uniform p.
///            nobs, when given, must equal Σ counts (the mass law).
///   init:    seq_initialize ≡ the E-step with the given weights. A categorical has no latent
///            variable, so the rng is not used. With ε = 0, ids unseen at initialisation get
///            p = 0 and are impossible evidence later: use ε > 0 or init_p = 1 for such data.
/// Statistics: value() = (counts (K,)).
/// Cost: O(1) per row for log_density and the E-step; O(K) for the M-step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

struct FamilySpec;

class CategoricalEncoder;
class CategoricalEstimator;
class CategoricalSampler;

/// An immutable, validated batch of ids [n]. Slices share storage (O(1)).
class CategoricalBatch {
 public:
  CategoricalBatch();
  [[nodiscard]] Index n_rows() const noexcept { return count_; }
  [[nodiscard]] int64_t id(Index row) const noexcept { return storage_->ids[begin_ + row]; }
  /// Largest id in the underlying storage (−1 when empty): O(1) range checks.
  [[nodiscard]] int64_t max_id() const noexcept { return storage_->max_id; }
  [[nodiscard]] CategoricalBatch slice(Index begin, Index count) const;
  /// A copy of the rows.
  [[nodiscard]] IdVector ids() const;

 private:
  friend class CategoricalEncoder;
  struct Storage {
    IdVector ids;
    int64_t max_id = -1;
  };
  std::shared_ptr<const Storage> storage_;
  Index begin_ = 0;
  Index count_ = 0;
};

/// Validates ids: ≥ 0 and < K when K is declared ("out-of-range ID", ValueError).
class CategoricalEncoder {
 public:
  std::optional<int64_t> n_categories;

  /// @throws ValueError on out-of-range ids.
  [[nodiscard]] CategoricalBatch encode(IdVector ids) const;
  /// Real-valued ids must be exact integers (2.0 is accepted, 1.5 and NaN are not). @throws
  /// ValueError.
  [[nodiscard]] CategoricalBatch encode(std::span<const double> ids) const;
  [[nodiscard]] bool operator==(const CategoricalEncoder&) const = default;
};

struct CategoricalParams {
  Vector p;  // [K] simplex
  std::string name;
};

/// Statistics, in value() order: counts [K] (Σ w per id).
class CategoricalAccumulator : public FlatAccumulator<CategoricalAccumulator> {
 public:
  static constexpr const char* kWhere = "CategoricalAccumulator";
  using batch_type = CategoricalBatch;
  explicit CategoricalAccumulator(int64_t n_categories,
                                  std::optional<std::string> keys = std::nullopt);

  [[nodiscard]] int64_t n_categories() const noexcept { return K_; }
  [[nodiscard]] VectorMap counts() { return {field(0), K_}; }
  [[nodiscard]] ConstVectorMap counts() const { return {field(0), K_}; }
  /// Σ counts (accurate sum).
  [[nodiscard]] double total_mass() const;
  /// Finite entries, counts ≥ 0. @throws ValueError.
  void validate(std::string_view where) const;
  /// seq_initialize: counts[x_n] += w_n (no randomness; rng is untouched). @throws ValueError.
  void initialize(const CategoricalBatch& batch, std::span<const double> w, Rng& rng);
  /// A distributed fit's initialisation (AnyAccumulator::initialize_shard): other rows draw nothing.
  void initialize_shard(const CategoricalBatch& batch, std::span<const double> w, Rng& rng, Index /*rows_before*/,
                        Index /*rows_after*/) {
    initialize(batch, w, rng);
  }
  [[nodiscard]] CategoricalEncoder encoder() const { return {K_}; }

 private:
  int64_t K_;
};

class Categorical {
 public:
  using params_type = CategoricalParams;
  using batch_type = CategoricalBatch;
  using accumulator_type = CategoricalAccumulator;
  using estimator_type = CategoricalEstimator;
  using encoder_type = CategoricalEncoder;
  static constexpr const char* kFamily = "categorical";
  static constexpr const char* kWhere = "CategoricalDistribution";

  /// @throws ValueError unless p is a simplex.
  explicit Categorical(CategoricalParams params);

  [[nodiscard]] const CategoricalParams& params() const noexcept { return params_; }
  [[nodiscard]] int64_t n_categories() const noexcept { return params_.p.size(); }
  [[nodiscard]] const Vector& log_p() const noexcept { return log_p_; }

  /// out[n] = log p[x_n]. @throws ValueError on an id ≥ K or a wrong output length.
  void log_density(const CategoricalBatch& batch, std::span<double> out) const;
  /// The E-step, atomic. @throws ImpossibleEvidenceError (nothing changed) for rows with w_n > 0
  /// and p[x_n] = 0; ValueError on bad weights, ids or accumulator size.
  void accumulate(const CategoricalBatch& batch, std::span<const double> w,
                  CategoricalAccumulator& acc, std::span<double> log_p_out = {}) const;
  [[nodiscard]] CategoricalAccumulator make_accumulator() const {
    return CategoricalAccumulator(n_categories());
  }
  /// Estimator with this model's K, smoothing 0 and its name.
  [[nodiscard]] CategoricalEstimator estimator() const;
  [[nodiscard]] CategoricalEncoder encoder() const { return {n_categories()}; }
  [[nodiscard]] CategoricalSampler sampler(uint64_t seed) const;

 private:
  void check_batch(const CategoricalBatch& batch) const;
  CategoricalParams params_;
  Vector log_p_;  // [K]
};

/// Options of the M-step; the single source of the defaults.
struct CategoricalEstimatorOptions {
  double smoothing = 0.0;  // ε added to every count before normalising
  std::string name;
  std::optional<std::string> keys;
};

class CategoricalEstimator {
 public:
  using distribution_type = Categorical;
  using accumulator_type = CategoricalAccumulator;
  static constexpr const char* kWhere = "CategoricalEstimator";

  /// @throws ValueError on K ≤ 0 or a negative / non-finite smoothing.
  explicit CategoricalEstimator(int64_t n_categories, CategoricalEstimatorOptions options = {});

  [[nodiscard]] int64_t n_categories() const noexcept { return K_; }
  [[nodiscard]] const CategoricalEstimatorOptions& options() const noexcept { return options_; }
  [[nodiscard]] CategoricalAccumulator make_accumulator() const {
    return CategoricalAccumulator(K_, options_.keys);
  }
  [[nodiscard]] CategoricalEncoder encoder() const { return {K_}; }
  /// p = (counts + ε) / Σ (counts + ε), uniform on a zero total. @throws ValueError on invalid
  /// statistics or when nobs ≠ Σ counts ("cannot exceed" / "must equal").
  [[nodiscard]] Categorical estimate(std::optional<double> nobs,
                                     const CategoricalAccumulator& acc) const;

 private:
  int64_t K_;
  CategoricalEstimatorOptions options_;
};

/// Draws ids by inverse CDF (Rng::categorical); sample(m) equals m consecutive sample() calls.
class CategoricalSampler {
 public:
  CategoricalSampler(Categorical model, uint64_t seed) : model_(std::move(model)), rng_(seed) {}
  [[nodiscard]] int64_t sample();
  /// @throws ValueError when m < 0.
  [[nodiscard]] CategoricalBatch sample(Index m);

 private:
  Categorical model_;
  Rng rng_;
};

/// The family's descriptor (family/spec.hpp), registered in src/family/registry.cpp.
[[nodiscard]] const FamilySpec& categorical_family();

}  // namespace attnmix

#include "attnmix/core/concepts.hpp"
static_assert(attnmix::Batch<attnmix::CategoricalBatch>);
static_assert(attnmix::Accumulator<attnmix::CategoricalAccumulator>);
static_assert(attnmix::Distribution<attnmix::Categorical>);
static_assert(attnmix::Estimator<attnmix::CategoricalEstimator>);
