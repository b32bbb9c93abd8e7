// SPDX-License-Identifier: Apache-2.0
/// @file check.hpp
/// Boundary checkers. Each takes (where, name, value...) and throws ValueError with a
/// message saying where the problem is, what must hold and what was seen. Used once, at the boundary.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "attnmix/core/types.hpp"

namespace attnmix::check {

/// The largest magnitude of a real coordinate: queries, key means, key tables, embedding means, Gaussian data
/// and means.
inline constexpr double kMaxMagnitude = 1e50;
/// The smallest variance: σ², min_sigma2, the Gaussian's variances. With coordinates within kMaxMagnitude, the
/// model's constants (1/(2σ²), log σ²) and every ‖y − μ‖²/(2σ²) stay finite, so a finite input never gives NaN or
/// an overflowed log density.
inline constexpr double kMinVariance = 1e-100;

/// lr and other step sizes: finite and > 0.
void positive_real(std::string_view where, std::string_view name, double value);
/// σ², min_sigma2, a variance entry: finite and in [kMinVariance, ∞).
void variance(std::string_view where, std::string_view name, double value);
/// Reals that enter squared distances: every entry finite with |x| ≤ kMaxMagnitude; the array non-empty.
void bounded_reals(std::string_view where, std::string_view name, std::span<const double> values);
/// The rows of a data matrix (queries, observations), as bounded_reals: "<where>: <row_name> row 3 must be finite
/// with magnitude at most 1e+50 (column 1 is 1e+300)".
void bounded_rows(std::string_view where, std::string_view row_name, const Matrix& values);
/// Log variances of embeddings: every entry finite with |x| ≤ 2 ln kMaxMagnitude, so that exp(½ x) stays within
/// kMaxMagnitude and above 1/kMaxMagnitude.
void log_variances(std::string_view where, std::string_view name, std::span<const double> values);
/// prior_strength, emission_smoothing: finite and ≥ 0.
void nonnegative_real(std::string_view where, std::string_view name, double value);
/// S, N, D, T, L: > 0.
void positive_int(std::string_view where, std::string_view name, int64_t value);
/// Every entry finite; the array non-empty.
void finite_nonempty(std::string_view where, std::string_view name, std::span<const double> values);
/// Non-empty, finite, ≥ 0, |Σ − 1| ≤ 1e-12 (accurate sum).
void simplex(std::string_view where, std::string_view name, std::span<const double> p);
/// 2-D, non-empty, each row on the simplex; rows must equal expected_rows when given.
void row_simplex(std::string_view where, std::string_view name, const Matrix& p,
                 std::optional<Index> expected_rows = std::nullopt);
/// A declared dimension must match what was seen.
void dimension(std::string_view where, std::string_view name, Index expected, Index seen);
/// Integer ids in [0, bound): "out-of-range ID" (ValueError) otherwise. bound = nullopt checks only ≥ 0.
void ids(std::string_view where, std::string_view name, std::span<const int64_t> ids,
         std::optional<int64_t> bound);
/// A real number that must be an exact integer id in [0, bound): non-finite or fractional → ValueError.
[[nodiscard]] int64_t exact_id(std::string_view where, std::string_view name, double value,
                               std::optional<int64_t> bound);
/// Observation weights: finite and ≥ 0; the count must match the rows.
void weights(std::string_view where, std::span<const double> w, Index n_rows);

}  // namespace attnmix::check
