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
#include "attnmix/core/types.hpp"

namespace attnmix {

struct FamilySpec;

class DiagonalGaussianEncoder;
class DiagonalGaussianEstimator;
class DiagonalGaussianSampler;

/// An immutable, validated batch of real vectors [n, D] (row-major). Slices share storage (O(1)).
class DiagonalGaussianBatch {
 public:
  DiagonalGaussianBatch();
  [[nodiscard]] Index n_rows() const noexcept { return count_; }
  [[nodiscard]] Index dim() const noexcept { return storage_->values.cols(); }
  [[nodiscard]] const double* row(Index n) const noexcept {
    return storage_->values.data() + (begin_ + n) * storage_->values.cols();
  }
  [[nodiscard]] DiagonalGaussianBatch slice(Index begin, Index count) const;
  /// A copy of the rows [n, D].
  [[nodiscard]] Matrix values() const;

 private:
  friend class DiagonalGaussianEncoder;
  struct Storage {
    Matrix values;
  };
  std::shared_ptr<const Storage> storage_;
  Index begin_ = 0;
  Index count_ = 0;
};

/// Validates real observations: D columns (when declared, else taken from the data),
/// all finite.
class DiagonalGaussianEncoder {
 public:
  std::optional<int64_t> dim;

  /// @throws ValueError on a wrong width or a non-finite value.
  [[nodiscard]] DiagonalGaussianBatch encode(Matrix values) const;
  [[nodiscard]] bool operator==(const DiagonalGaussianEncoder&) const = default;
};

struct DiagonalGaussianParams {
  Vector mu;      // [D] finite
  Vector sigma2;  // [D] each finite and > 0
  std::string name;
};

/// Statistics, in value() order: sum [D] (real), sum_sq [D] (count), count (scalar count).
class DiagonalGaussianAccumulator : public FlatAccumulator<DiagonalGaussianAccumulator> {
 public:
  static constexpr const char* kWhere = "DiagonalGaussianAccumulator";
  using batch_type = DiagonalGaussianBatch;
  explicit DiagonalGaussianAccumulator(int64_t dim, std::optional<std::string> keys = std::nullopt);

  [[nodiscard]] int64_t dim() const noexcept { return D_; }
  [[nodiscard]] VectorMap sum() { return {field(0), D_}; }
  [[nodiscard]] VectorMap sum_sq() { return {field(1), D_}; }
  [[nodiscard]] double& count() { return *field(2); }
  [[nodiscard]] ConstVectorMap sum() const { return {field(0), D_}; }
  [[nodiscard]] ConstVectorMap sum_sq() const { return {field(1), D_}; }
  [[nodiscard]] double count() const { return *field(2); }
  /// Finite entries, counts ≥ 0. @throws ValueError.
  void validate(std::string_view where) const;
  /// seq_initialize: the E-step sums with weights w (no randomness; rng is untouched). @throws
  /// ValueError.
  void initialize(const DiagonalGaussianBatch& batch, std::span<const double> w, Rng& rng);
  /// A distributed fit's initialisation (AnyAccumulator::initialize_shard): other rows draw nothing.
  void initialize_shard(const DiagonalGaussianBatch& batch, std::span<const double> w, Rng& rng,
                        Index /*rows_before*/, Index /*rows_after*/) {
    initialize(batch, w, rng);
  }
  [[nodiscard]] DiagonalGaussianEncoder encoder() const { return {D_}; }

 private:
  /// Adds the weighted rows (zero-weight rows skipped) after the caller validated everything.
  void add_rows(const DiagonalGaussianBatch& batch, std::span<const double> w);
  friend class DiagonalGaussian;
  int64_t D_;
};

class DiagonalGaussian {
 public:
  using params_type = DiagonalGaussianParams;
  using batch_type = DiagonalGaussianBatch;
  using accumulator_type = DiagonalGaussianAccumulator;
  using estimator_type = DiagonalGaussianEstimator;
  using encoder_type = DiagonalGaussianEncoder;
  static constexpr const char* kFamily = "diagonal_gaussian";
  static constexpr const char* kWhere = "DiagonalGaussianDistribution";

  /// @throws ValueError on an empty or non-finite μ, a σ² of another length, or a σ²_d that is not
  /// > 0.
  explicit DiagonalGaussian(DiagonalGaussianParams params);

  [[nodiscard]] const DiagonalGaussianParams& params() const noexcept { return params_; }
  [[nodiscard]] int64_t dim() const noexcept { return params_.mu.size(); }

  /// out[n] = log p(x_n). @throws ValueError on a batch of another width or a wrong output length.
  void log_density(const DiagonalGaussianBatch& batch, std::span<double> out) const;
  /// The E-step (never impossible). @throws ValueError on bad weights, widths or accumulator size.
  void accumulate(const DiagonalGaussianBatch& batch, std::span<const double> w,
                  DiagonalGaussianAccumulator& acc, std::span<double> log_p_out = {}) const;
  [[nodiscard]] DiagonalGaussianAccumulator make_accumulator() const {
    return DiagonalGaussianAccumulator(dim());
  }
  /// Estimator with this model's D, the default min_sigma2 and its name.
  [[nodiscard]] DiagonalGaussianEstimator estimator() const;
  [[nodiscard]] DiagonalGaussianEncoder encoder() const { return {dim()}; }
  [[nodiscard]] DiagonalGaussianSampler sampler(uint64_t seed) const;

 private:
  void check_batch(const DiagonalGaussianBatch& batch) const;
  DiagonalGaussianParams params_;
  Vector inv_sigma2_;      // [D] 1 / σ²_d
  double log_norm_ = 0.0;  // −½ Σ_d log(2π σ²_d)
};

/// Options of the M-step; the single source of the defaults.
struct DiagonalGaussianEstimatorOptions {
  double min_sigma2 = 1e-6;  // floor of every σ²_d
  std::string name;
  std::optional<std::string> keys;
};

class DiagonalGaussianEstimator {
 public:
  using distribution_type = DiagonalGaussian;
  using accumulator_type = DiagonalGaussianAccumulator;
  static constexpr const char* kWhere = "DiagonalGaussianEstimator";

  /// @throws ValueError on D ≤ 0 or a min_sigma2 that is not a positive finite real.
  explicit DiagonalGaussianEstimator(int64_t dim, DiagonalGaussianEstimatorOptions options = {});

  [[nodiscard]] int64_t dim() const noexcept { return D_; }
  [[nodiscard]] const DiagonalGaussianEstimatorOptions& options() const noexcept {
    return options_;
  }
  [[nodiscard]] DiagonalGaussianAccumulator make_accumulator() const {
    return DiagonalGaussianAccumulator(D_, options_.keys);
  }
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
  DiagonalGaussianSampler(DiagonalGaussian model, uint64_t seed)
      : model_(std::move(model)), rng_(seed) {}
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
