// SPDX-License-Identifier: Apache-2.0
// Eight-lane double vectors for the attention kernels (private header).
//
// GCC/Clang vector extension: lane-wise IEEE arithmetic, one AVX-512 register (two AVX2 or four SSE2 registers
// without AVX-512). Every reduction over lanes is written out with one fixed summation tree,
//   ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)),
// so results never depend on how a compiler would reassociate a horizontal sum.
#pragma once

#include <cstring>

#include "attnmix/core/types.hpp"

#if defined(__GNUC__) && !defined(__clang__)
// Without AVX-512, GCC notes that passing 64-byte vectors by value has an ABI; these helpers have internal linkage.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace attnmix::lanes {

constexpr Index kLanes = 8;
using Lanes = double __attribute__((vector_size(kLanes * sizeof(double))));

inline Lanes load(const double* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(double* p, Lanes v) { std::memcpy(p, &v, sizeof v); }
inline Lanes broadcast(double x) { return Lanes{} + x; }

/// The summation tree over the 8 lanes of a.
inline double horizontal_sum(Lanes a) {
  const Lanes b = a + __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6);
  const Lanes c = b + __builtin_shufflevector(b, b, 2, 3, 0, 1, 6, 7, 4, 5);
  return c[0] + c[4];
}

/// out[j] = horizontal_sum(v[j]) for 8 vectors at once (the same tree, 21 operations instead of 48).
inline Lanes horizontal_sums(const Lanes (&v)[kLanes]) {
  Lanes u[4];
  for (int p = 0; p < 4; ++p) {
    const Lanes a = v[2 * p];
    const Lanes b = v[2 * p + 1];
    // [a0+a1, b0+b1, a2+a3, b2+b3, a4+a5, b4+b5, a6+a7, b6+b7]
    u[p] = __builtin_shufflevector(a, b, 0, 8, 2, 10, 4, 12, 6, 14) +
           __builtin_shufflevector(a, b, 1, 9, 3, 11, 5, 13, 7, 15);
  }
  Lanes w[2];
  for (int p = 0; p < 2; ++p) {
    const Lanes a = u[2 * p];
    const Lanes b = u[2 * p + 1];
    // [(0+1)+(2+3) of v0, v1, v2, v3 (pairs p), then (4+5)+(6+7) of the same four]
    w[p] = __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13) +
           __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15);
  }
  return __builtin_shufflevector(w[0], w[1], 0, 1, 2, 3, 8, 9, 10, 11) +
         __builtin_shufflevector(w[0], w[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

/// Lane k = horizontal_sum of the 8 doubles at v + 8k for k < count ≤ 8; the other lanes hold fill.
inline Lanes horizontal_sums(const double* v, Index count, double fill) {
  Lanes a[kLanes] = {};
  for (Index k = 0; k < count; ++k) a[k] = load(v + k * kLanes);
  constexpr Lanes lane = {0, 1, 2, 3, 4, 5, 6, 7};
  return lane < static_cast<double>(count) ? horizontal_sums(a) : broadcast(fill);
}

}  // namespace attnmix::lanes
