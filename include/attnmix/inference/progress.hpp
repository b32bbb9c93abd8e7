// SPDX-License-Identifier: Apache-2.0
/// @file progress.hpp
/// The per-iteration report of optimize() and its single formatter (`docs/mechanisms.md#training`):
///   "Iteration %d: ln[p_mat(Data|Model)]=%e, ln[p_mat(Data|Model)]-ln[p_mat(Data|PrevModel)]=%e"
///   [", ln[p_mat(Valid Data|Model)]=%e"] "\n"
#pragma once

#include <optional>
#include <string>

namespace attnmix {

struct IterationReport {
  int iteration = 0;                          // 1-based
  double log_likelihood = 0.0;                // score of the model this line reports
  double delta_log_likelihood = 0.0;          // +inf on the first line
  std::optional<double> valid_log_likelihood; // present when validation data was given
  double seconds = 0.0;                       // wall time of this iteration (not part of the line)
};

/// The exact progress line, ending in '\n'.
[[nodiscard]] std::string format_progress_line(const IterationReport& report);

}  // namespace attnmix
