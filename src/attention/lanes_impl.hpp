// SPDX-License-Identifier: Apache-2.0
// Eight-lane double vectors for the attention kernels (private header), and log on whole Eigen packets.
//
// GCC/Clang vector extension: lane-wise IEEE arithmetic, one AVX-512 register (two AVX2 or four SSE2 registers
// without AVX-512). Every reduction over lanes is written out with one fixed summation tree,
//   ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)),
// so results never depend on how a compiler would reassociate a horizontal sum.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attnmix/core/types.hpp"

#if defined(__GNUC__) && !defined(__clang__)
// Without AVX-512, GCC notes that passing 64-byte vectors by value has an ABI; these helpers have internal linkage.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace attnmix::lanes {

constexpr Index kLanes = 8;
using Lanes = double __attribute__((vector_size(kLanes * sizeof(double))));
using LaneBits = uint64_t __attribute__((vector_size(kLanes * sizeof(uint64_t))));

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

/// Below this argument exp goes through std::exp (exp(−708) is still a normal double): exp_lanes is written for
/// arguments in [−708, 0], and the responsibilities of −∞ log weights must be exactly 0
/// (docs/mechanisms.md#responsibility-attention: a zero-probability position can never be revived; Eigen's packet exp
/// returns 5.6e−309 for −∞, which would).
constexpr double kExpLanesMin = -708.0;

/// exp(x) lane-wise for x ∈ [−708, 0], within about 1 ulp of the correctly rounded value (docs/PERFORMANCE.md):
/// x = k·ln 2 + r with k = round(x / ln 2) and |r| ≤ ln 2 / 2 (Cody–Waite: k·ln2_hi is exact), exp(r) by its Taylor
/// polynomial of degree 13 (truncation below 4e−18 relative), times 2^k built in the exponent bits. No division and
/// no table, about 25 operations per 8 lanes. Arguments outside the range are clamped to it.
inline Lanes exp_lanes(Lanes x) {
  constexpr double kLog2e = 1.4426950408889634074;
  constexpr double kLn2Hi = 6.93147180369123816490e-01;  // 32 significant bits (fdlibm)
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kShifter = 0x1.8p52;                   // adding it rounds to an integer in the low bits
  x = x < kExpLanesMin ? broadcast(kExpLanesMin) : x;
  x = x > 0.0 ? broadcast(0.0) : x;
  const Lanes shifted = x * kLog2e + kShifter;
  const Lanes k = shifted - kShifter;  // round(x / ln 2) ∈ [−1022, 0]
  const Lanes r = (x - k * kLn2Hi) - k * kLn2Lo;
  // Σ_{j≤13} r^j / j!: the terms j ≥ 4 by Estrin's scheme (pairs, then in r², r⁴, r⁸), the last four by Horner as
  // before (they carry the rounding). Eight dependent operations instead of thirteen: the E-step kernels are bound by
  // this latency.
  const Lanes r2 = r * r;
  const Lanes r4 = r2 * r2;
  const Lanes r8 = r4 * r4;
  const Lanes q45 = r * (1.0 / 120.0) + 1.0 / 24.0;
  const Lanes q67 = r * (1.0 / 5040.0) + 1.0 / 720.0;
  const Lanes q89 = r * (1.0 / 362880.0) + 1.0 / 40320.0;
  const Lanes q1011 = r * (1.0 / 39916800.0) + 1.0 / 3628800.0;
  const Lanes q1213 = r * (1.0 / 6227020800.0) + 1.0 / 479001600.0;
  const Lanes q47 = q67 * r2 + q45;
  const Lanes q811 = q1011 * r2 + q89;
  const Lanes q411 = q811 * r4 + q47;
  Lanes p = q1213 * r8 + q411;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // 2^k: the low bits of `shifted` hold k (two's complement offset by the shifter's mantissa), so adding the bias
  // and shifting into the exponent field gives the bits of 2^k (a normal double for k ≥ −1022).
  const LaneBits two_k = (std::bit_cast<LaneBits>(shifted) + 1023) << 52;
  return p * std::bit_cast<Lanes>(two_k);
}

/// e[k] = exp(x[k] − shift) for k < n (e must not alias x; every x[k] − shift ≤ 0). lowest = min_k x[k] selects
/// the rare fix-up of arguments below kExpLanesMin (then std::exp, which gives 0 for −∞).
inline void exp_shifted(const double* __restrict x, double shift, double lowest, double* __restrict e, Index n) {
  Index k = 0;
  for (; k + kLanes <= n; k += kLanes) store(e + k, exp_lanes(load(x + k) - shift));
  if (k < n) {
    double pad[kLanes] = {};
    for (Index j = 0; j < n - k; ++j) pad[j] = x[k + j] - shift;
    store(pad, exp_lanes(load(pad)));
    for (Index j = 0; j < n - k; ++j) e[k + j] = pad[j];
  }
  if (lowest - shift < kExpLanesMin)
    for (Index j = 0; j < n; ++j)
      if (x[j] - shift < kExpLanesMin) e[j] = std::exp(x[j] - shift);
}

/// 64-byte-aligned per-thread scratch of at least `size` doubles, reused across calls (no allocation per chunk;
/// 8-lane read-modify-writes that straddle two cache lines cost about twice as much). kTag separates buffers that
/// are live at the same time; the contents are unspecified on return.
template <int kTag>
double* scratch(size_t size) {
  thread_local std::vector<double> buffer;
  if (buffer.size() < size + kLanes) buffer.resize(size + kLanes);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + ((64 - address % 64) % 64) / sizeof(double);
}

/// x[k] ← log(x[k]) for k < n, on whole Eigen packets (the tail is padded with ones). Never Eigen's array loops,
/// which switch between scalar and packet code by alignment: every entry gets the packet log, whatever its address.
inline void log_in_place(double* x, Index n) {
  using Packet = Eigen::internal::packet_traits<double>::type;
  constexpr Index kPacket = Eigen::internal::packet_traits<double>::size;
  Index k = 0;
  for (; k + kPacket <= n; k += kPacket)
    Eigen::internal::pstoreu(x + k, Eigen::internal::plog(Eigen::internal::ploadu<Packet>(x + k)));
  if (k < n) {
    alignas(64) double pad[kPacket];
    std::fill(pad, pad + kPacket, 1.0);
    for (Index j = 0; j < n - k; ++j) pad[j] = x[k + j];
    Eigen::internal::pstore(pad, Eigen::internal::plog(Eigen::internal::pload<Packet>(pad)));
    for (Index j = 0; j < n - k; ++j) x[k + j] = pad[j];
  }
}

/// The end of an E-step pass 1: on entry log_p[n] holds Σ_i exp(ℓ_i − max_of_row[n]) of row n (any placeholder for a
/// row whose max is −∞); on return log p = max + log Σ + gate_const, −∞ for those impossible rows. Logs on packets.
inline void log_p_from_sums(double* log_p, const double* max_of_row, Index n_rows, double gate_const) {
  log_in_place(log_p, n_rows);
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  for (Index n = 0; n < n_rows; ++n)
    log_p[n] = max_of_row[n] == kNegInf ? kNegInf : max_of_row[n] + log_p[n] + gate_const;
}

}  // namespace attnmix::lanes
