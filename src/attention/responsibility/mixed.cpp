// SPDX-License-Identifier: Apache-2.0
// Responsibility attention's pass 1 in mixed precision (docs/mixed_precision.md). The float64 kernel's layout
// (model.cpp) with 16-lane float vectors: a row's query is rounded to float once, the 16 squared distances
// of 16 positions are reduced together by one transpose-add tree, and ℓ, its maximum and exp(ℓ − max) stay float;
// the sum of the exponentials, the responsibilities and log p are double. Every row's arithmetic is fixed (no
// dependence on neighbours, addresses or threads), so results are bitwise thread-count invariant.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "attnmix/core/errors.hpp"
#include "../float_lanes_impl.hpp"
#include "../lanes_impl.hpp"
#include "../prefetch_impl.hpp"
#include "mixed_impl.hpp"

namespace attnmix {

namespace {

namespace fl = float_lanes;
constexpr Index kLanes = fl::kLanes;
constexpr float kFloatNegInf = -std::numeric_limits<float>::infinity();
constexpr float kFloatInf = std::numeric_limits<float>::infinity();

/// ℓ of the 16 positions [i, i + 16) into out + i (see log_joint_row); max16 and bad updated. kTail: the last,
/// partial block of count < 16 positions, whose padding lanes read symbol 0 (and get log π = −∞, so ℓ = −∞).
template <bool kTail, Index kBlocks>
[[gnu::always_inline]] inline void log_joint_block(const ResponsibilityFloatTables& m, const int64_t* __restrict ctx,
                                                   const fl::FloatQuery<kBlocks>& y, const float* __restrict log_B_t,
                                                   Index i, Index count, float* __restrict out, fl::Lanes& max16,
                                                   fl::LaneMask& bad) {
  const Index stride = m.padded_D;
  const Index blocks = stride / kLanes;
  const float* __restrict K = m.keys.data();
  int64_t s[kLanes];
  for (Index j = 0; j < kLanes; ++j) s[j] = !kTail || j < count ? ctx[i + j] : 0;
  fl::Lanes partial[kLanes];
  for (Index j = 0; j < kLanes; ++j) partial[j] = fl::squared_distance_lanes(y, K + s[j] * stride, blocks);
  const fl::Lanes dist = fl::horizontal_sums(partial);
  alignas(64) float log_B[kLanes];
  for (Index j = 0; j < kLanes; ++j) log_B[j] = log_B_t[s[j] * m.T];
  const fl::Lanes l = fl::load(m.log_pi.data() + i) - dist * m.inv_two_sigma2 + fl::load(log_B);
  fl::store(out + i, l);
  max16 = l > max16 ? l : max16;
  fl::LaneMask overflow = dist == std::numeric_limits<float>::infinity();
  if constexpr (kTail) {
    constexpr fl::Lanes lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    overflow &= lane < static_cast<float>(count);
  }
  bad |= (l != l) | overflow;
}

/// ℓ_i = log π_i − ‖y − K[c_i]‖²/(2σ²) + log B[c_i, t] (without gate_const) into out[16·⌈N/16⌉], 16 positions at a
/// time (the padding positions get ℓ = −∞). Returns the lane-wise maximum; `bad` collects lanes with a NaN ℓ or a
/// squared distance that overflowed float.
template <Index kBlocks>
inline fl::Lanes log_joint_row(const ResponsibilityFloatTables& m, const int64_t* __restrict ctx,
                               const fl::FloatQuery<kBlocks>& y, int64_t t, float* __restrict out, fl::LaneMask& bad) {
  const float* __restrict log_B_t = m.log_B.data() + t;
  fl::Lanes max16 = fl::broadcast(kFloatNegInf);
  Index i = 0;
  for (; i + kLanes <= m.N; i += kLanes) log_joint_block<false>(m, ctx, y, log_B_t, i, kLanes, out, max16, bad);
  if (i < m.N) log_joint_block<true>(m, ctx, y, log_B_t, i, m.N - i, out, max16, bad);
  return max16;
}

/// Rows of a block: phase A computes every ℓ of the block, phase B their exponentials, so the processor overlaps the
/// rows' dependency chains (as in the float64 pass 1); the block size changes no bits.
constexpr Index kPassOneBlock = 16;

template <Index kBlocks>
Index responsibilities(const ResponsibilityFloatTables& m, const ResponsibilityAttentionBatch& batch,
                       double* __restrict r, double* __restrict log_p, const char* where) {
  const Index N = m.N;
  const Index padded_N = fl::padded(N);
  const Index n_rows = batch.n_rows();
  // y [padded_D], then ℓ of the block's rows [block, padded_N]: multiples of 16 floats, so 64-byte aligned.
  float* __restrict y_row =
      reinterpret_cast<float*>(lanes::scratch<4>(static_cast<size_t>(m.padded_D + padded_N * kPassOneBlock)));
  float* __restrict l_block = y_row + m.padded_D;
  double* __restrict max_of_row = lanes::scratch<5>(static_cast<size_t>(n_rows));
  Index n_impossible = 0;
  for (Index begin = 0; begin < n_rows; begin += kPassOneBlock) {
    const Index end = std::min(begin + kPassOneBlock, n_rows);
    for (Index n = begin; n < end; ++n) {  // phase A: ℓ and its maximum
      prefetch_rows_ahead(batch, n);
      fl::round_padded(batch.query(n), m.D, m.padded_D, y_row);
      const fl::FloatQuery<kBlocks> y(y_row);
      fl::LaneMask bad{};
      const fl::Lanes max16 =
          log_joint_row(m, batch.context(n), y, batch.target(n), l_block + (n - begin) * padded_N, bad);
      const float max_l = fl::horizontal_max(max16);
      if (fl::any(bad) || max_l == kFloatInf)
        throw ValueError(std::string(where) + ": log weight of row " + std::to_string(n) +
                         " is NaN or +inf, or its squared distance overflows float (precision 'mixed'; use "
                         "'float64')");
      max_of_row[n] = max_l;
    }
    for (Index n = begin; n < end; ++n) {  // phase B: r_i = exp(ℓ_i − max) / Σ_j exp(ℓ_j − max)
      double* r_row = r + n * N;
      float* __restrict l_row = l_block + (n - begin) * padded_N;
      const auto max_l = static_cast<float>(max_of_row[n]);
      if (max_l == kFloatNegInf) {
        std::fill(r_row, r_row + N, 0.0);
        log_p[n] = 1.0;  // a placeholder for the logs below
        ++n_impossible;
        continue;
      }
      // exp(ℓ − max) in float, summed in double over whole vectors (padding lanes add exact zeros).
      lanes::Lanes acc{};
      for (Index i = 0; i < padded_N; i += kLanes) {
        const fl::Lanes e = fl::exp_lanes(fl::load(l_row + i) - max_l);
        fl::store(l_row + i, e);
        acc += fl::widen(e, 0);
        acc += fl::widen(e, 1);
      }
      const double total = lanes::horizontal_sum(acc);
      const double inv_total = 1.0 / total;
      Index i = 0;
      for (; i + kLanes <= N; i += kLanes) {
        const fl::Lanes e = fl::load(l_row + i);
        lanes::store(r_row + i, fl::widen(e, 0) * inv_total);
        lanes::store(r_row + i + 8, fl::widen(e, 1) * inv_total);
      }
      for (; i < N; ++i) r_row[i] = static_cast<double>(l_row[i]) * inv_total;
      log_p[n] = total;
    }
  }
  lanes::log_p_from_sums(log_p, max_of_row, n_rows, m.gate_const);
  return n_impossible;
}

}  // namespace

ResponsibilityFloatTables::ResponsibilityFloatTables(const ResponsibilityAttentionParams& params,
                                                     const Vector& log_prior, const Matrix& log_emission,
                                                     double inv_two_sigma2_f64, double gate_const_f64)
    : N(params.position_prior.size()),
      D(params.key_means.cols()),
      T(params.emission.cols()),
      padded_D(fl::padded(params.key_means.cols())),
      keys(static_cast<size_t>(params.key_means.rows() * fl::padded(params.key_means.cols())), 0.0F),
      log_B(log_emission.data(), log_emission.data() + log_emission.size()),
      log_pi(static_cast<size_t>(fl::padded(params.position_prior.size())), kFloatNegInf),
      inv_two_sigma2(static_cast<float>(inv_two_sigma2_f64)),
      gate_const(gate_const_f64) {
  for (Index s = 0; s < params.key_means.rows(); ++s)
    for (Index d = 0; d < D; ++d)
      keys[static_cast<size_t>(s * padded_D + d)] = static_cast<float>(params.key_means(s, d));
  for (Index i = 0; i < N; ++i) log_pi[static_cast<size_t>(i)] = static_cast<float>(log_prior[i]);
}

Index mixed_responsibilities(const ResponsibilityFloatTables& m, const ResponsibilityAttentionBatch& batch,
                             double* __restrict r, double* __restrict log_p, const char* where) {
  switch (m.padded_D / kLanes) {
    case 1: return responsibilities<1>(m, batch, r, log_p, where);
    case 2: return responsibilities<2>(m, batch, r, log_p, where);
    case 3: return responsibilities<3>(m, batch, r, log_p, where);
    case 4: return responsibilities<4>(m, batch, r, log_p, where);
    default: return responsibilities<0>(m, batch, r, log_p, where);
  }
}

}  // namespace attnmix
