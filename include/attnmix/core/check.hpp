// SPDX-License-Identifier: Apache-2.0
/// @file check.hpp
/// Boundary checkers (SPEC.md §1.2). Each takes (where, name, value...) and throws TypeError or ValueError with a
/// message saying where the problem is, what must hold and what was seen. Used once, at the boundary.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "attnmix/core/types.hpp"

namespace attnmix::check {

/// σ², lr, min_sigma2: finite and > 0.
void positive_real(std::string_view where, std::string_view name, double value);
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
