// SPDX-License-Identifier: Apache-2.0
#include "attnmix/core/precision.hpp"

#include "attnmix/core/errors.hpp"

namespace attnmix {

std::string_view precision_name(Precision precision) noexcept {
  return precision == Precision::kMixed ? "mixed" : "float64";
}

Precision parse_precision(std::string_view text, std::string_view where) {
  if (text == "float64") return Precision::kFloat64;
  if (text == "mixed") return Precision::kMixed;
  throw ValueError(std::string(where) + ": precision must be 'float64' or 'mixed' (got '" + std::string(text) + "')");
}

}  // namespace attnmix
