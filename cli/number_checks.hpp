// SPDX-License-Identifier: Apache-2.0
/// @file number_checks.hpp
/// The checks of numeric flags, in place of CLI11's PositiveNumber and NonNegativeNumber: those are ranges up to the
/// largest double, and their message prints that bound's 309 digits. Same names in the help ("INT:POSITIVE").
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

namespace attnmix::cli {

/// A check that the flag's value reads as a number and satisfies `ok`; the message says what it must be.
template <class Ok>
CLI::Validator number_check(Ok ok, const std::string& name, const std::string& must) {
  return CLI::Validator(
      [ok, must](std::string& text) -> std::string {
        double x = 0;
        if (!CLI::detail::lexical_cast(text, x)) return "Value " + text + " is not a number";
        return ok(x) ? std::string() : "Value " + text + " must be " + must;
      },
      name);
}

inline const CLI::Validator kPositive = number_check([](double x) { return x > 0; }, "POSITIVE", "positive (> 0)");
inline const CLI::Validator kNonNegative =
    number_check([](double x) { return x >= 0; }, "NONNEGATIVE", "non-negative (>= 0)");
/// Finite (no infinity, no NaN); unnamed in the help, where a number is taken to be finite.
inline const CLI::Validator kFinite = number_check([](double x) { return std::isfinite(x); }, "", "a finite number");

}  // namespace attnmix::cli
