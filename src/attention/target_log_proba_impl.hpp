// SPDX-License-Identifier: Apache-2.0
// log p(t | c, y) of the rows of a batch for both responsibility-attention families (private header).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

/// out[n] = log Σ_i a_i B[c_i, t_n] for every row n of batch, where gate(n, a) writes row n's target-blind gate
/// a [N] and emission(s, t) reads B[s, t]; −∞ where the target has probability 0. O(N) per row plus the gate's cost.
template <class Gate, class Emission>
Vector target_log_proba_of(const ResponsibilityAttentionBatch& batch, Index N, Gate gate, Emission emission) {
  Vector out(batch.n_rows());
  std::vector<double> a(static_cast<size_t>(N));
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const int64_t* ctx = batch.context(n);
    gate(n, a.data());
    double p = 0.0;
    for (Index i = 0; i < N; ++i) p += a[static_cast<size_t>(i)] * emission(ctx[i], batch.target(n));
    out[n] = std::log(p);
  }
  return out;
}

}  // namespace attnmix
