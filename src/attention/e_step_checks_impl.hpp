// SPDX-License-Identifier: Apache-2.0
// The argument checks of the responsibility-attention families' E-steps (private header).
#pragma once

#include <span>
#include <string>

#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

/// The arguments of an E-step over n_rows rows: a weight per row, statistics of the model's sizes (S, N, D, T) and
/// one log density per row in log_p_out, or no output. @throws ValueError naming `where`.
template <class Model, class Acc>
void check_e_step(const char* where, const Model& model, Index n_rows, std::span<const double> w, const Acc& acc,
                  std::span<double> log_p_out) {
  check::weights(where, w, n_rows);
  if (acc.n_symbols() != model.n_symbols() || acc.context_length() != model.context_length() ||
      acc.query_dim() != model.query_dim() || acc.n_targets() != model.n_targets())
    throw ValueError(std::string(where) + ": accumulator dimensions do not match the model");
  if (!log_p_out.empty())
    check::dimension(where, "log-density output length", n_rows, static_cast<Index>(log_p_out.size()));
}

}  // namespace attnmix
