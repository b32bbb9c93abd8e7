// SPDX-License-Identifier: Apache-2.0
/// @file gaussian.hpp
/// The diagonal Gaussian over real vectors (`docs/mechanisms.md#building-blocks`): a classical leaf for composites and
/// mixtures.
///
/// Notation: D dimensions; d ∈ [D]; mean μ [D]; variances σ² [D], each > 0.
///   log p(x) = −½ Σ_d log(2π σ²_d) − ½ Σ_d (x_d − μ_d)² / σ²_d    (finite: never impossible)
///   E-step:  sum += w x;  sum_sq += w x⊙x;  count += w
///   M-step:  μ = sum / count;  σ²_d = max(sum_sq_d / count − μ_d², min_sigma2), min_sigma2 = 1e-6
///            by default; count = 0 gives μ = 0, σ² = 1. nobs, when given, must equal count.
///   init:    seq_initialize ≡ the E-step with the given weights (no latent variable: the rng is
///            not used).
/// Statistics: value() = (sum (D,), sum_sq (D,), count ()).
/// Cost: O(D) per row for log_density and the E-step; O(D) for the M-step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/shared_rows.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

struct FamilySpec;

class DiagonalGaussianEncoder;
class DiagonalGaussianEstimator;
class DiagonalGaussianSampler;

/// The arrays of a diagonal-Gaussian batch: the observations [n, D].
struct DiagonalGaussianArrays {
  Matrix values;  ///< [n, D] observations, row-major
};

/// An immutable, validated batch of real vectors [n, D] (row-major). Slices share storage (O(1)).
class DiagonalGaussianBatch : public SharedRows<DiagonalGaussianBatch, DiagonalGaussianArrays> {
 public:
  /// An empty batch (no rows, width 0).
  DiagonalGaussianBatch() = default;
  /// The width D of the rows.
  [[nodiscard]] Index dim() const noexcept { return arrays().values.cols(); }
  /// The D values of row n, contiguous (0 ≤ n < n_rows(); not checked).
  [[nodiscard]] const double* row(Index n) const noexcept { return row_of(arrays().values, n); }
  /// A copy of the rows [n, D].
  [[nodiscard]] Matrix values() const { return copy_of(arrays().values); }

 private:
  friend class DiagonalGaussianEncoder;
  DiagonalGaussianBatch(DiagonalGaussianArrays arrays, Index rows) : SharedRows(std::move(arrays), rows) {}
};

/// Validates real observations: D columns (when declared, else taken from the data),
/// all finite.
class DiagonalGaussianEncoder {
 public:
  /// The dimension D when declared (it must then be > 0, and every row have D columns); nullopt takes D from the data.
  std::optional<int64_t> dim;

  /// @throws ValueError on a wrong width, or a value that is not finite or exceeds 1e50 in magnitude
  /// (check::kMaxMagnitude).
  [[nodiscard]] DiagonalGaussianBatch encode(Matrix values) const;
  /// Encoders are equal when they declare the same D.
  [[nodiscard]] bool operator==(const DiagonalGaussianEncoder&) const = default;
};

/// The parameters of a DiagonalGaussian (what its model files store).
struct DiagonalGaussianParams {
  /// The means μ [D]: non-empty, each finite with magnitude at most 1e50 (check::kMaxMagnitude).
  Vector mu;      // [D] finite
  /// The variances σ² [D]: each finite and at least 1e-100 (check::kMinVariance).
  Vector sigma2;  // [D] each finite and > 0
  /// The model's name ("" for none), kept by estimator() and saved in model files.
  std::string name;
};

/// Statistics, in value() order: sum [D] (real), sum_sq [D] (count), count (scalar count).
class DiagonalGaussianAccumulator : public FlatAccumulator<DiagonalGaussianAccumulator> {
 public:
  /// The prefix of this accumulator's error messages.
  static constexpr const char* kWhere = "DiagonalGaussianAccumulator";
  /// The batch type initialize() reads.
  using batch_type = DiagonalGaussianBatch;
  /// Zero statistics for dimension D = dim, carrying the tying key `keys` (`docs/mechanisms.md#building-blocks`;
  /// nullopt: untied). @throws ValueError when dim ≤ 0.
  explicit DiagonalGaussianAccumulator(int64_t dim, std::optional<std::string> keys = std::nullopt);

  /// The dimension D.
  [[nodiscard]] int64_t dim() const noexcept { return D_; }
  /// sum = Σ w x [D], writable in place (no validation).
  [[nodiscard]] VectorMap sum() { return {field(0), D_}; }
  /// sum_sq = Σ w x⊙x [D], writable in place (no validation).
  [[nodiscard]] VectorMap sum_sq() { return {field(1), D_}; }
  /// count = Σ w, the assigned mass, writable in place (no validation).
  [[nodiscard]] double& count() { return *field(2); }
  /// sum = Σ w x [D].
  [[nodiscard]] ConstVectorMap sum() const { return {field(0), D_}; }
  /// sum_sq = Σ w x⊙x [D].
  [[nodiscard]] ConstVectorMap sum_sq() const { return {field(1), D_}; }
  /// count = Σ w, the assigned mass.
  [[nodiscard]] double count() const { return *field(2); }
  /// Finite entries, counts ≥ 0. @throws ValueError when a check fails.
  void validate(std::string_view where) const;
  /// seq_initialize: the E-step sums with weights w (no randomness; rng is untouched).
  /// @throws ValueError when a check fails.
  void initialize(const DiagonalGaussianBatch& batch, std::span<const double> w, Rng& rng);
  /// A distributed fit's initialisation (AnyAccumulator::initialize_shard): other rows draw nothing.
  void initialize_shard(const DiagonalGaussianBatch& batch, std::span<const double> w, Rng& rng,
                        Index /*rows_before*/, Index /*rows_after*/) {
    initialize(batch, w, rng);
  }
  /// An encoder that accepts rows of this accumulator's dimension D.
  [[nodiscard]] DiagonalGaussianEncoder encoder() const { return {D_}; }

 private:
  /// Adds the weighted rows (zero-weight rows skipped) after the caller validated everything.
  void add_rows(const DiagonalGaussianBatch& batch, std::span<const double> w);
  friend class DiagonalGaussian;
  int64_t D_;
};

/// The diagonal Gaussian (`docs/mechanisms.md#diagonal-gaussian`): immutable; the constructor validates μ and σ² and
/// precomputes 1/σ² and the normalising constant.
class DiagonalGaussian {
 public:
  /** @name Roles */
  /// @{
  /// The types of the roles this distribution works with (`docs/design.md`): its parameters, batch, accumulator,
  /// estimator and encoder.
  using params_type = DiagonalGaussianParams;
  using batch_type = DiagonalGaussianBatch;
  using accumulator_type = DiagonalGaussianAccumulator;
  using estimator_type = DiagonalGaussianEstimator;
  using encoder_type = DiagonalGaussianEncoder;
  /// @}
  /// The family's name: AnyDistribution::family() and the "family" of its model files.
  static constexpr const char* kFamily = "diagonal_gaussian";
  /// The prefix of this distribution's error messages.
  static constexpr const char* kWhere = "DiagonalGaussianDistribution";

  /// @throws ValueError on an empty μ or one with an entry that is not finite or exceeds 1e50 in magnitude, a σ² of
  /// another length, or a σ²_d that is not finite and ≥ 1e-100 (DiagonalGaussianParams).
  explicit DiagonalGaussian(DiagonalGaussianParams params);

  /// The validated parameters.
  [[nodiscard]] const DiagonalGaussianParams& params() const noexcept { return params_; }
  /// The dimension D.
  [[nodiscard]] int64_t dim() const noexcept { return params_.mu.size(); }

  /// out[n] = log p(x_n). @throws ValueError on a batch of another width or a wrong output length.
  void log_density(const DiagonalGaussianBatch& batch, std::span<double> out) const;
  /// The E-step (never impossible). @throws ValueError on bad weights, widths or accumulator size.
  void accumulate(const DiagonalGaussianBatch& batch, std::span<const double> w,
                  DiagonalGaussianAccumulator& acc, std::span<double> log_p_out = {}) const;
  /// Zero statistics for this model's D, untied.
  [[nodiscard]] DiagonalGaussianAccumulator make_accumulator() const {
    return DiagonalGaussianAccumulator(dim());
  }
  /// Estimator with this model's D, the default min_sigma2 and its name.
  [[nodiscard]] DiagonalGaussianEstimator estimator() const;
  /// An encoder that accepts rows of this model's dimension D.
  [[nodiscard]] DiagonalGaussianEncoder encoder() const { return {dim()}; }
  /// A sampler of (a copy of) this model whose draws come from Rng(seed).
  [[nodiscard]] DiagonalGaussianSampler sampler(uint64_t seed) const;

 private:
  void check_batch(const DiagonalGaussianBatch& batch) const;
  DiagonalGaussianParams params_;
  Vector inv_sigma2_;      // [D] 1 / σ²_d
  double log_norm_ = 0.0;  // −½ Σ_d log(2π σ²_d)
};

/// Options of the M-step; the single source of the defaults.
struct DiagonalGaussianEstimatorOptions {
  /// The floor of every estimated σ²_d: finite and ≥ 1e-100 (check::kMinVariance; CLI --min-sigma2).
  double min_sigma2 = 1e-6;  // floor of every σ²_d
  /// The name of every model estimate() returns.
  std::string name;
  /// The tying key of the accumulators make_accumulator() returns (`docs/mechanisms.md#building-blocks`); nullopt:
  /// untied.
  std::optional<std::string> keys;
};

/// The diagonal Gaussian M-step (`docs/mechanisms.md#diagonal-gaussian`): const and stateless.
class DiagonalGaussianEstimator {
 public:
  /// The distribution estimate() returns.
  using distribution_type = DiagonalGaussian;
  /// The statistics estimate() reads.
  using accumulator_type = DiagonalGaussianAccumulator;
  /// The prefix of this estimator's error messages.
  static constexpr const char* kWhere = "DiagonalGaussianEstimator";

  /// @throws ValueError on D ≤ 0 or a min_sigma2 that is not finite and ≥ 1e-100.
  explicit DiagonalGaussianEstimator(int64_t dim, DiagonalGaussianEstimatorOptions options = {});

  /// The dimension D.
  [[nodiscard]] int64_t dim() const noexcept { return D_; }
  /// The options given to the constructor.
  [[nodiscard]] const DiagonalGaussianEstimatorOptions& options() const noexcept {
    return options_;
  }
  /// Zero statistics for dimension D, carrying options().keys.
  [[nodiscard]] DiagonalGaussianAccumulator make_accumulator() const {
    return DiagonalGaussianAccumulator(D_, options_.keys);
  }
  /// An encoder that accepts rows of dimension D.
  [[nodiscard]] DiagonalGaussianEncoder encoder() const { return {D_}; }
  /// μ = sum / count, σ² = max(sum_sq / count − μ², min_sigma2); count = 0 gives μ = 0, σ² = 1.
  /// @throws ValueError on invalid statistics or when nobs ≠ count ("cannot exceed" / "must
  /// equal").
  [[nodiscard]] DiagonalGaussian estimate(std::optional<double> nobs,
                                          const DiagonalGaussianAccumulator& acc) const;

 private:
  int64_t D_;
  DiagonalGaussianEstimatorOptions options_;
};

/// Draws x_d = μ_d + σ_d · N(0, 1) in dimension order; sample(m) equals m consecutive sample()
/// calls.
class DiagonalGaussianSampler {
 public:
  /// A sampler of `model` whose draws come from Rng(seed).
  DiagonalGaussianSampler(DiagonalGaussian model, uint64_t seed)
      : model_(std::move(model)), rng_(seed) {}
  /// Draws one vector x [D].
  [[nodiscard]] std::vector<double> sample();
  /// @throws ValueError when m < 0.
  [[nodiscard]] DiagonalGaussianBatch sample(Index m);

 private:
  DiagonalGaussian model_;
  Rng rng_;
};

/// The family's descriptor (family/spec.hpp), registered in src/family/registry.cpp.
[[nodiscard]] const FamilySpec& diagonal_gaussian_family();

}  // namespace attnmix

#include "attnmix/core/concepts.hpp"
static_assert(attnmix::Batch<attnmix::DiagonalGaussianBatch>);
static_assert(attnmix::Accumulator<attnmix::DiagonalGaussianAccumulator>);
static_assert(attnmix::Distribution<attnmix::DiagonalGaussian>);
static_assert(attnmix::Estimator<attnmix::DiagonalGaussianEstimator>);
