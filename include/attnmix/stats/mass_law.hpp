// SPDX-License-Identifier: Apache-2.0
/// @file mass_law.hpp
/// Mass laws of sufficient statistics (`docs/mechanisms.md#building-blocks`): assigned mass b against declared mass a.
///   tol_mass(a, b) = 64 · 2⁻²³ · max(1, |a|, |b|)
///   b > a + tol  → ValueError("… cannot exceed …");   a − b > tol → ValueError("… must equal …").
#pragma once

#include <string_view>

namespace attnmix {

/// The tolerance of a mass law between masses a and b: 64 · 2⁻²³ · max(1, |a|, |b|), about 7.6e-6 relative.
[[nodiscard]] double tol_mass(double a, double b);

/// Throws ValueError unless assigned equals declared within tol_mass (also when either is not finite: "must be
/// finite").
void check_mass_law(std::string_view where, std::string_view declared_name, double declared,
                    std::string_view assigned_name, double assigned);

}  // namespace attnmix
