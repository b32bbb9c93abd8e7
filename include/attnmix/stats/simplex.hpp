// SPDX-License-Identifier: Apache-2.0
/// @file simplex.hpp
/// Smoothed row normalisation of counts, the emission M-step shared by the attention families:
///   B[s, t] = (count[s, t] + ε) / Σ_t′ (count[s, t′] + ε)      (accurate sum per row)
/// A row whose total is 0 (possible only with ε = 0) becomes uniform, 1/T. Cost O(S·T).
#pragma once

#include "attnmix/core/types.hpp"

namespace attnmix {

/// Rows [begin, end) of B [S, T], from counts [S, T] and ε = eps as above, into the same rows of out (S×T; the other
/// rows untouched): the whole table, or one rank's share of a sharded M-step (inference/sharded_mstep.hpp's
/// smoothed_emission); a row's bits depend only on its counts. eps is not checked here: the attention estimators
/// validate it (finite, ≥ 0) at construction.
void smoothed_row_normalise_rows(const ConstMatrixMap& counts, double eps, Index begin, Index end, Matrix& out);

}  // namespace attnmix
