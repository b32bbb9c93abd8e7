// SPDX-License-Identifier: Apache-2.0
/// @file progress.hpp
/// The per-iteration report of optimize() and its single formatter (`docs/mechanisms.md#training`):
///   "Iteration %d: ln[p_mat(Data|Model)]=%e, ln[p_mat(Data|Model)]-ln[p_mat(Data|PrevModel)]=%e"
///   [", ln[p_mat(Valid Data|Model)]=%e"] "\n"
#pragma once

#include <optional>
#include <string>

namespace attnmix {

/// One report of optimize() (`docs/mechanisms.md#training`): what OptimizeOptions::on_iteration receives and
/// format_progress_line() prints.
struct IterationReport {
  /// The iteration number, from 1.
  int iteration = 0;                          // 1-based
  /// The training score Σ_n log p(x_n) (unit weights, all ranks' rows) of the model this line reports: the model
  /// that entered the iteration in the fused loop, the new model in the classic loop.
  double log_likelihood = 0.0;                // score of the model this line reports
  /// log_likelihood minus the last finite score before it (of the previous iteration, reported or not): +∞ on the
  /// fused loop's first line; the classic loop's first line compares with the starting model's score.
  double delta_log_likelihood = 0.0;          // +inf on the fused loop's first line
  /// The validation score Σ log p of the reported model, present when optimize() was given validation data.
  std::optional<double> valid_log_likelihood; // present when validation data was given
  /// The wall time of this iteration in seconds, from its start to this report (before the validation score is
  /// computed); not part of the line.
  double seconds = 0.0;                       // wall time of this iteration (not part of the line)
};

/// The exact progress line, ending in '\n'.
[[nodiscard]] std::string format_progress_line(const IterationReport& report);

}  // namespace attnmix
