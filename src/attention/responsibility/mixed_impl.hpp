// SPDX-License-Identifier: Apache-2.0
// The mixed-precision pass 1 of responsibility attention (private header; docs/mixed_precision.md).
#pragma once

#include <vector>

#include "attnmix/attention/responsibility.hpp"

namespace attnmix {

/// The float copies of the model's tables that the mixed-precision pass 1 reads. O(S·(D + T) + N) to build.
struct ResponsibilityFloatTables {
  Index N, D, T;
  Index padded_D;              // 16·⌈D/16⌉
  std::vector<float> keys;     // [S, padded_D]: K rounded to float, rows padded with zeros
  std::vector<float> log_B;    // [S, T]: log B rounded to float
  std::vector<float> log_pi;   // [16·⌈N/16⌉]: log π rounded to float, padded with −∞
  float inv_two_sigma2;
  double gate_const;

  ResponsibilityFloatTables(const ResponsibilityAttentionParams& params, const Vector& log_prior,
                            const Matrix& log_emission, double inv_two_sigma2, double gate_const);
};

/// Pass 1 in mixed precision, with the float64 pass's contract: r[n, N] ← responsibilities (zeros for impossible
/// rows), log_p[n] ← log p (−∞ for impossible rows); returns the number of impossible rows. Per row, the N squared
/// distances, the log weights ℓ_i, their maximum and exp(ℓ_i − max) are float (16 positions at a time); Σ_i exp,
/// r_i and log p are double. Weights below exp(−87) of the row's largest become exactly 0.
/// @throws ValueError when some ℓ_i is NaN or +∞, or a squared distance overflows float (use float64).
Index mixed_responsibilities(const ResponsibilityFloatTables& m, const ResponsibilityAttentionBatch& batch,
                             double* __restrict r, double* __restrict log_p, const char* where);

}  // namespace attnmix
