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
#include "attnmix/core/shared_rows.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

struct FamilySpec;

class CategoricalEncoder;
class CategoricalEstimator;
class CategoricalSampler;

/// The arrays of a categorical batch: the ids [n] and the largest of them (−1 without rows).
struct CategoricalArrays {
  IdVector ids;         ///< [n] ids
  int64_t max_id = -1;  ///< the largest id (−1 without rows)
};

/// An immutable, validated batch of ids [n]. Slices share storage (O(1)).
class CategoricalBatch : public SharedRows<CategoricalBatch, CategoricalArrays> {
 public:
  /// An empty batch (no rows).
  CategoricalBatch() = default;
  /// The id of row `row`, in [0, K) when the encoder knew K (0 ≤ row < n_rows(); not checked).
  [[nodiscard]] int64_t id(Index row) const noexcept { return entry_of(arrays().ids, row); }
  /// Largest id in the underlying storage (−1 when empty): O(1) range checks.
  [[nodiscard]] int64_t max_id() const noexcept { return arrays().max_id; }
  /// A copy of the rows.
  [[nodiscard]] IdVector ids() const { return copy_of(arrays().ids); }

 private:
  friend class CategoricalEncoder;
  CategoricalBatch(CategoricalArrays arrays, Index rows) : SharedRows(std::move(arrays), rows) {}
};

/// Validates ids: ≥ 0 and < K when K is declared ("out-of-range ID", ValueError).
class CategoricalEncoder {
 public:
  /// The number of categories K when declared (it must then be > 0, and every id < K); nullopt checks only id ≥ 0.
  std::optional<int64_t> n_categories;

  /// @throws ValueError on out-of-range ids.
  [[nodiscard]] CategoricalBatch encode(IdVector ids) const;
  /// Real-valued ids must be exact integers (2.0 is accepted, 1.5 and NaN are not).
  /// @throws ValueError when a check fails.
  [[nodiscard]] CategoricalBatch encode(std::span<const double> ids) const;
  /// Encoders are equal when they declare the same K.
  [[nodiscard]] bool operator==(const CategoricalEncoder&) const = default;
};

/// The parameters of a Categorical (what its model files store).
struct CategoricalParams {
  /// The probabilities p [K]: a simplex (entries finite and ≥ 0, |Σ p − 1| ≤ 1e-12); a zero entry is a structural
  /// zero (`docs/mechanisms.md#building-blocks`).
  Vector p;  // [K] simplex
  /// The model's name ("" for none), kept by estimator() and saved in model files.
  std::string name;
};

/// Statistics, in value() order: counts [K] (Σ w per id).
class CategoricalAccumulator : public FlatAccumulator<CategoricalAccumulator> {
 public:
  /// The prefix of this accumulator's error messages.
  static constexpr const char* kWhere = "CategoricalAccumulator";
  /// The batch type initialize() reads.
  using batch_type = CategoricalBatch;
  /// Zero counts for K = n_categories categories, carrying the tying key `keys` (`docs/mechanisms.md#building-blocks`;
  /// nullopt: untied). @throws ValueError when n_categories ≤ 0.
  explicit CategoricalAccumulator(int64_t n_categories,
                                  std::optional<std::string> keys = std::nullopt);

  /// The number of categories K.
  [[nodiscard]] int64_t n_categories() const noexcept { return K_; }
  /// The counts [K] (Σ w per id), writable in place (no validation).
  [[nodiscard]] VectorMap counts() { return {field(0), K_}; }
  /// The counts [K] (Σ w per id).
  [[nodiscard]] ConstVectorMap counts() const { return {field(0), K_}; }
  /// Σ counts (accurate sum).
  [[nodiscard]] double total_mass() const;
  /// Finite entries, counts ≥ 0. @throws ValueError when a check fails.
  void validate(std::string_view where) const;
  /// seq_initialize: counts[x_n] += w_n (no randomness; rng is untouched). @throws ValueError when a check fails.
  void initialize(const CategoricalBatch& batch, std::span<const double> w, Rng& rng);
  /// A distributed fit's initialisation (AnyAccumulator::initialize_shard): other rows draw nothing.
  void initialize_shard(const CategoricalBatch& batch, std::span<const double> w, Rng& rng, Index /*rows_before*/,
                        Index /*rows_after*/) {
    initialize(batch, w, rng);
  }
  /// An encoder that accepts the ids of this accumulator's K categories.
  [[nodiscard]] CategoricalEncoder encoder() const { return {K_}; }

 private:
  int64_t K_;
};

/// The categorical distribution (`docs/mechanisms.md#categorical`): immutable; the constructor validates p and
/// precomputes log p.
class Categorical {
 public:
  /** @name Roles */
  /// @{
  /// The types of the roles this distribution works with (`docs/design.md`): its parameters, batch, accumulator,
  /// estimator and encoder.
  using params_type = CategoricalParams;
  using batch_type = CategoricalBatch;
  using accumulator_type = CategoricalAccumulator;
  using estimator_type = CategoricalEstimator;
  using encoder_type = CategoricalEncoder;
  /// @}
  /// The family's name: AnyDistribution::family() and the "family" of its model files.
  static constexpr const char* kFamily = "categorical";
  /// The prefix of this distribution's error messages.
  static constexpr const char* kWhere = "CategoricalDistribution";

  /// @throws ValueError unless p is a simplex.
  explicit Categorical(CategoricalParams params);

  /// The validated parameters.
  [[nodiscard]] const CategoricalParams& params() const noexcept { return params_; }
  /// The number of categories K.
  [[nodiscard]] int64_t n_categories() const noexcept { return params_.p.size(); }
  /// log p [K], precomputed exactly: −∞ where p is 0, never floored.
  [[nodiscard]] const Vector& log_p() const noexcept { return log_p_; }

  /// out[n] = log p[x_n]. @throws ValueError on an id ≥ K or a wrong output length.
  void log_density(const CategoricalBatch& batch, std::span<double> out) const;
  /// The E-step, atomic. @throws ImpossibleEvidenceError (nothing changed) for rows with w_n > 0
  /// and p[x_n] = 0; ValueError on bad weights, ids or accumulator size.
  void accumulate(const CategoricalBatch& batch, std::span<const double> w,
                  CategoricalAccumulator& acc, std::span<double> log_p_out = {}) const;
  /// Zero counts for this model's K, untied.
  [[nodiscard]] CategoricalAccumulator make_accumulator() const {
    return CategoricalAccumulator(n_categories());
  }
  /// Estimator with this model's K, smoothing 0 and its name.
  [[nodiscard]] CategoricalEstimator estimator() const;
  /// An encoder that accepts the ids of this model's K categories.
  [[nodiscard]] CategoricalEncoder encoder() const { return {n_categories()}; }
  /// A sampler of (a copy of) this model whose draws come from Rng(seed).
  [[nodiscard]] CategoricalSampler sampler(uint64_t seed) const;

 private:
  void check_batch(const CategoricalBatch& batch) const;
  CategoricalParams params_;
  Vector log_p_;  // [K]
};

/// Options of the M-step; the single source of the defaults.
struct CategoricalEstimatorOptions {
  /// The smoothing ε added to every count before normalising: finite and ≥ 0 (CLI --smoothing).
  double smoothing = 0.0;  // ε added to every count before normalising
  /// The name of every model estimate() returns.
  std::string name;
  /// The tying key of the accumulators make_accumulator() returns (`docs/mechanisms.md#building-blocks`); nullopt:
  /// untied.
  std::optional<std::string> keys;
};

/// The categorical M-step (`docs/mechanisms.md#categorical`): const and stateless.
class CategoricalEstimator {
 public:
  /// The distribution estimate() returns.
  using distribution_type = Categorical;
  /// The statistics estimate() reads.
  using accumulator_type = CategoricalAccumulator;
  /// The prefix of this estimator's error messages.
  static constexpr const char* kWhere = "CategoricalEstimator";

  /// @throws ValueError on K ≤ 0 or a negative / non-finite smoothing.
  explicit CategoricalEstimator(int64_t n_categories, CategoricalEstimatorOptions options = {});

  /// The number of categories K.
  [[nodiscard]] int64_t n_categories() const noexcept { return K_; }
  /// The options given to the constructor.
  [[nodiscard]] const CategoricalEstimatorOptions& options() const noexcept { return options_; }
  /// Zero counts for K categories, carrying options().keys.
  [[nodiscard]] CategoricalAccumulator make_accumulator() const {
    return CategoricalAccumulator(K_, options_.keys);
  }
  /// An encoder that accepts the ids of K categories.
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
  /// A sampler of `model` whose draws come from Rng(seed).
  CategoricalSampler(Categorical model, uint64_t seed) : model_(std::move(model)), rng_(seed) {}
  /// Draws one id in [0, K).
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
