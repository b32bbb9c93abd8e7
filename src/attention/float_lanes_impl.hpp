// SPDX-License-Identifier: Apache-2.0
// Sixteen-lane float vectors for the mixed-precision E-step kernels (private header; docs/mixed_precision.md).
//
// Like lanes_impl.hpp: GCC/Clang vector extension (one AVX-512 register), every reduction over lanes written out
// with one fixed summation tree, so a result never depends on how a compiler would reassociate it.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <utility>

#include "attnmix/core/types.hpp"
#include "lanes_impl.hpp"

namespace attnmix::float_lanes {

constexpr Index kLanes = 16;
using Lanes = float __attribute__((vector_size(kLanes * sizeof(float))));
using LaneBits = uint32_t __attribute__((vector_size(kLanes * sizeof(uint32_t))));
using LaneMask = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline Lanes load(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Lanes v) { std::memcpy(p, &v, sizeof v); }
inline Lanes broadcast(float x) { return Lanes{} + x; }

/// The 16 doubles at p rounded to float (round to nearest).
inline Lanes load_rounded(const double* p) {
  const auto low = __builtin_convertvector(lanes::load(p), float __attribute__((vector_size(8 * sizeof(float)))));
  const auto high =
      __builtin_convertvector(lanes::load(p + 8), float __attribute__((vector_size(8 * sizeof(float)))));
  return __builtin_shufflevector(low, high, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

/// Lanes 8·half … 8·half + 7 of v as doubles (exact).
inline lanes::Lanes widen(Lanes v, int half) {
  using Half = float __attribute__((vector_size(8 * sizeof(float))));
  const Half h = half == 0 ? __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
                           : __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return __builtin_convertvector(h, lanes::Lanes);
}

namespace detail {
constexpr int kWidth = static_cast<int>(kLanes);
/// One level of the transpose-add tree. Before it, each input vector holds kGroup / 2 positions' partial sums,
/// lane (kGroup / 2)·q + o being partial q of position o; the level adds neighbouring partials of two inputs a, b
/// (a's positions first), so that lane kGroup·q + o of the output is partial q of position o. These are the
/// indices of the two addends (16 + k: lane k of b).
constexpr int first_addend(int group, int lane) {
  const int half = group / 2, q = lane / group, o = lane % group;
  return o < half ? group * q + o : kWidth + group * q + o - half;
}
constexpr int second_addend(int group, int lane) {
  const int half = group / 2, q = lane / group, o = lane % group;
  return o < half ? group * q + half + o : kWidth + group * q + o;
}
template <int kGroup, int... kLane>
inline Lanes combine(Lanes a, Lanes b, std::integer_sequence<int, kLane...>) {
  return __builtin_shufflevector(a, b, first_addend(kGroup, kLane)...) +
         __builtin_shufflevector(a, b, second_addend(kGroup, kLane)...);
}
template <int kGroup, int kCount>
inline void combine_level(Lanes (&v)[kLanes]) {
  for (int p = 0; p < kCount; ++p)
    v[p] = combine<kGroup>(v[2 * p], v[2 * p + 1], std::make_integer_sequence<int, kLanes>{});
}
}  // namespace detail

/// out[j] = the sum of the 16 lanes of v[j], for 16 vectors at once, by the tree
/// (((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))) + (… v8 … v15): four levels of 8, 4, 2, 1 shuffle-adds.
/// v is overwritten.
inline Lanes horizontal_sums(Lanes (&v)[kLanes]) {
  detail::combine_level<2, 8>(v);
  detail::combine_level<4, 4>(v);
  detail::combine_level<8, 2>(v);
  detail::combine_level<16, 1>(v);
  return v[0];
}

/// max_j a[j] by a tree of shuffles (the maximum of non-NaN lanes is the same in any order).
inline float horizontal_max(Lanes a) {
  const auto larger = [](Lanes x, Lanes y) { return x > y ? x : y; };
  a = larger(a, __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  a = larger(a, __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  a = larger(a, __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  a = larger(a, __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  return a[0];
}

/// Whether some lane of the mask is set.
inline bool any(LaneMask mask) {
  uint64_t words[kLanes / 2];
  std::memcpy(words, &mask, sizeof words);
  uint64_t all = 0;
  for (const uint64_t w : words) all |= w;
  return all != 0;
}

/// Below this argument exp_lanes returns exactly 0: exp(−87) ≈ 1.6e−38 is near the smallest normal float, and the
/// mixed-precision kernels drop positions whose weight relative to the row's largest is below it.
constexpr float kExpLanesMin = -87.0F;

/// exp(x) lane-wise for x ≤ 0, within about 1 ulp of float (docs/mixed_precision.md): x = k·ln 2 + r with
/// k = round(x / ln 2) and |r| ≤ ln 2 / 2 (Cody–Waite, k·ln2_hi exact for |k| < 2^9), exp(r) by its Taylor polynomial
/// of degree 7 (truncation below 6e−9 relative), times 2^k built in the exponent bits; exactly 0 below
/// kExpLanesMin (−∞ included).
inline Lanes exp_lanes(Lanes x) {
  constexpr float kLog2e = 1.44269504F;
  constexpr float kLn2Hi = 0.693145752F;  // 16 significant bits
  constexpr float kLn2Lo = 1.42860677e-6F;
  constexpr float kShifter = 0x1.8p23F;  // adding it rounds to an integer in the low bits
  const LaneMask below = x < kExpLanesMin;
  Lanes clamped = x < kExpLanesMin ? broadcast(kExpLanesMin) : x;
  clamped = clamped > 0.0F ? broadcast(0.0F) : clamped;
  const Lanes shifted = clamped * kLog2e + kShifter;
  const Lanes k = shifted - kShifter;  // round(x / ln 2) ∈ [−126, 0]
  const Lanes r = (clamped - k * kLn2Hi) - k * kLn2Lo;
  // Σ_{j≤7} r^j / j!: the terms j ≥ 2 by Estrin's scheme, the last two by Horner.
  const Lanes r2 = r * r;
  const Lanes q23 = r * (1.0F / 6.0F) + 0.5F;
  const Lanes q45 = r * (1.0F / 120.0F) + 1.0F / 24.0F;
  const Lanes q67 = r * (1.0F / 5040.0F) + 1.0F / 720.0F;
  const Lanes q47 = q67 * r2 + q45;
  const Lanes q27 = q47 * r2 + q23;
  Lanes p = q27 * r + 1.0F;
  p = p * r + 1.0F;
  // 2^k: the low bits of `shifted` hold k, so adding the bias and shifting into the exponent field gives 2^k (a
  // normal float for k ≥ −126).
  const LaneBits two_k = (std::bit_cast<LaneBits>(shifted) + 127) << 23;
  const Lanes e = p * std::bit_cast<Lanes>(two_k);
  return below ? broadcast(0.0F) : e;
}

/// n rounded up to whole 16-lane vectors.
inline Index padded(Index n) { return (n + kLanes - 1) / kLanes * kLanes; }

/// y[D] rounded to float into out[padded_D], zero-padded.
inline void round_padded(const double* y, Index D, Index padded_D, float* __restrict out) {
  Index d = 0;
  for (; d + kLanes <= D; d += kLanes) store(out + d, load_rounded(y + d));
  for (; d < D; ++d) out[d] = static_cast<float>(y[d]);
  for (; d < padded_D; ++d) out[d] = 0.0F;
}

/// A query row of floats padded with zeros to padded_D, as 16-lane blocks: kBlocks = padded_D / 16
/// known at compile time (held in registers), or kBlocks = 0 for a run-time count.
template <Index kBlocks>
struct FloatQuery {
  const float* y;
  Lanes blocks[kBlocks > 0 ? kBlocks : 1];
  explicit FloatQuery(const float* padded_row) : y(padded_row) {
    if constexpr (kBlocks > 0)
      for (Index b = 0; b < kBlocks; ++b) blocks[b] = load(padded_row + b * kLanes);
  }
  [[nodiscard]] Lanes block(Index b) const {
    if constexpr (kBlocks > 0) return blocks[b];
    else return load(y + b * kLanes);
  }
};

/// Lane-wise partial sums of (y − k)² over the padded_D / 16 blocks (the padding adds exact zeros).
template <Index kBlocks>
inline Lanes squared_distance_lanes(const FloatQuery<kBlocks>& y, const float* __restrict k, Index blocks) {
  Lanes acc{};
  for (Index b = 0; b < (kBlocks > 0 ? kBlocks : blocks); ++b) {
    const Lanes diff = y.block(b) - load(k + b * kLanes);
    acc += diff * diff;
  }
  return acc;
}

}  // namespace attnmix::float_lanes
