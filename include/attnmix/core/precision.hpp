// SPDX-License-Identifier: Apache-2.0
/// @file precision.hpp
/// The arithmetic of an E-step (docs/mixed_precision.md).
///   float64  every operation in double (the default).
///   mixed    the per-position work of the E-step and of log_density — distances, gate logits, their maximum and
///            their exponentials — in 16-lane float vectors; every sum over positions, every statistic, log p and
///            the M-step in double. Results stay bitwise independent of the thread and rank counts.
#pragma once

#include <string>
#include <string_view>

namespace attnmix {

/// The arithmetic of an E-step, as the file comment describes (`docs/mixed_precision.md`).
enum class Precision { kFloat64, kMixed };

/// "float64" or "mixed".
[[nodiscard]] std::string_view precision_name(Precision precision) noexcept;
/// The precision named text. @throws ValueError naming `where` and the accepted names otherwise.
[[nodiscard]] Precision parse_precision(std::string_view text, std::string_view where);

}  // namespace attnmix
