// SPDX-License-Identifier: Apache-2.0
// The mixed-precision gate of variational embedding attention (private header; docs/mixed_precision.md).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

/// An embedding table [S, D] rounded to float, rows padded with zeros to padded_D = 16·⌈D/16⌉. Empty (usable()
/// false) when some coordinate is so large that a squared distance could overflow float: padded_D·(2·max|x|)² must
/// stay below half the float range (|x| ≤ 1.15e18 at D = 32). O(S·D) to build.
class FloatEmbeddingTable {
 public:
  explicit FloatEmbeddingTable(const Matrix& table);
  [[nodiscard]] bool usable() const noexcept { return !values_.empty(); }
  [[nodiscard]] Index padded_dim() const noexcept { return padded_D_; }
  [[nodiscard]] const float* row(int64_t symbol) const noexcept { return values_.data() + symbol * padded_D_; }

 private:
  Index padded_D_;
  std::vector<float> values_;
};

/// What the mixed-precision gate reads besides a table: log π rounded to float and padded with −∞ to 16·⌈N/16⌉, and
/// 1/(2σ²) in float; the float copy of the mean (plug-in scoring), and the float copies of the Monte-Carlo tables,
/// built once per sample count on first use and shared by every chunk and thread (thread-safe).
class VariationalFloatTables {
 public:
  VariationalFloatTables(const Matrix& mean, const Vector& log_prior, double inv_two_sigma2);

  Index N;
  std::vector<float> log_pi;
  float inv_two_sigma2;
  /// false when 1/(2σ²) exceeds 1e30 (σ² below 5e−31): every row is then computed in float64.
  bool usable;
  FloatEmbeddingTable mean;

  /// The float copies of tables.embeddings, the Monte-Carlo tables of mc samples.
  [[nodiscard]] std::shared_ptr<const std::vector<FloatEmbeddingTable>> noise(const MonteCarloTables& tables,
                                                                              int64_t mc) const;

 private:
  mutable std::mutex mutex_;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<FloatEmbeddingTable>>> by_mc_;
};

/// The gate of one row at table E in mixed precision: for i < 16·⌈N/16⌉, s[i] ← ℓ_i = log π_i − ‖E[q] − E[c_i]‖²/(2σ²)
/// and a[i] ← exp(ℓ_i − max_j ℓ_j), computed in 16-lane float vectors (one fixed summation tree per distance) and
/// stored as doubles; padding lanes get s = −∞, a = 0. Weights below exp(−87) of the largest become exactly 0.
/// Returns false, leaving s and a unspecified, when the float arithmetic cannot represent the row (a table or σ² that
/// is not usable, or every ℓ_i −∞ in float): the caller then computes the row in float64. O(N·D).
[[nodiscard]] bool mixed_gate(const VariationalFloatTables& g, const FloatEmbeddingTable& E, const int64_t* c,
                              int64_t q, double* s, double* a);

}  // namespace attnmix
