// SPDX-License-Identifier: Apache-2.0
/// @file log_math.hpp
/// Log-space helpers and accurate sums.
///   LSE_i x_i = m + log Σ_i exp(x_i − m), m = max_i x_i;  LSE of all −∞ is −∞.
///   accurate_sum: Neumaier-compensated Σ, error O(ε) independent of length; used by simplex checks and M-step
///   normalisations so that estimator output passes the constructor's 1e-12 simplex check.
/// Cost: O(n) each.
#pragma once

#include <cmath>
#include <limits>
#include <span>

namespace attnmix {

/// −∞: log 0, the log density of an impossible row.
inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();
/// +∞ (e.g. the first score improvement reported by optimize()).
inline constexpr double kInf = std::numeric_limits<double>::infinity();

/// log Σ exp(x_i) with max subtraction; −∞ for an empty or all −∞ input. +∞/NaN propagate.
[[nodiscard]] inline double log_sum_exp(std::span<const double> x) {
  double m = kNegInf;
  for (double v : x) m = v > m ? v : m;
  if (m == kNegInf || !std::isfinite(m)) return m;
  double s = 0.0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

/// x_i ← exp(x_i − lse) in place with std::exp, so exp(−∞) is exactly 0 (Eigen's vectorised exp is not: it clamps
/// −∞ to about −709.8 and returns ~1e−308, which would give impossible components a positive weight).
inline void exp_shift_in_place(std::span<double> x, double lse) {
  for (double& v : x) v = std::exp(v - lse);
}

/// Compensated (Neumaier) sum of x.
[[nodiscard]] inline double accurate_sum(std::span<const double> x) {
  double sum = 0.0;
  double c = 0.0;
  for (double v : x) {
    const double t = sum + v;
    c += std::fabs(sum) >= std::fabs(v) ? (sum - t) + v : (v - t) + sum;
    sum = t;
  }
  return sum + c;
}

/// Σ x_i in a fixed pairwise order (blocks of 64 summed left to right): deterministic, error O(ε log n).
[[nodiscard]] inline double pairwise_sum(std::span<const double> x) {
  if (x.size() <= 64) {
    double s = 0.0;
    for (double v : x) s += v;
    return s;
  }
  const size_t half = x.size() / 2;
  return pairwise_sum(x.first(half)) + pairwise_sum(x.subspan(half));
}

}  // namespace attnmix
