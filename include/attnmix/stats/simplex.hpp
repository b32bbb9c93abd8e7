// SPDX-License-Identifier: Apache-2.0
/// @file simplex.hpp
/// Smoothed row normalisation of counts, the emission M-step shared by the attention families:
///   B[s, t] = (count[s, t] + ε) / Σ_t′ (count[s, t′] + ε)      (accurate sum per row)
/// A row whose total is 0 (possible only with ε = 0) becomes uniform, 1/T. Cost O(S·T).
#pragma once

#include "attnmix/core/types.hpp"

namespace attnmix {

/// B [S, T] from counts [S, T] and ε = eps as above. eps is not checked here: the attention estimators validate it
/// (finite, ≥ 0) at construction.
[[nodiscard]] Matrix smoothed_row_normalise(const ConstMatrixMap& counts, double eps);
/// Rows [begin, end) of B into the same rows of out (S×T; the other rows untouched): one rank's share of a sharded
/// M-step, with the bits smoothed_row_normalise gives those rows.
void smoothed_row_normalise_rows(const ConstMatrixMap& counts, double eps, Index begin, Index end, Matrix& out);

}  // namespace attnmix
