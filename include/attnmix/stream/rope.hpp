// SPDX-License-Identifier: Apache-2.0
/// @file rope.hpp
/// Rotary position embedding, half-split ("rotate-half") convention (`docs/mechanisms.md#streaming-language-model`).
///
///   inv_freq_k = 10000^(−2k/h),  k = 0 … h/2 − 1           (h = head_dim, even)
///   angle(p)   = [p·inv_freq, p·inv_freq]                  (length h)
///   rotate_half(x) = [−x₂, x₁]   with x₁ = x[:h/2], x₂ = x[h/2:]
///   RoPE(x, p) = x ⊙ cos(angle(p)) + rotate_half(x) ⊙ sin(angle(p))
///
/// The rotated pairs are (x_k, x_{k+h/2}); values are never rotated. Angles are computed in the dtype of the
/// tensors they rotate. Cost: O(t·h) for the tables, O(b·t·H·h) per rotation.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace attnmix::stream {

/// cos and sin of the angles of positions (t) for one head size: each (t, head_dim), in dtype.
struct RopeTables {
  torch::Tensor cos;  ///< cos(angle(p)) per position and coordinate, (t, head_dim)
  torch::Tensor sin;  ///< sin(angle(p)) per position and coordinate, (t, head_dim)
};

/// Tables for integer positions (a 1-D int64 tensor).
/// @throws ValueError when head_dim is not a positive even number or positions is not a 1-D integer tensor.
RopeTables rope_tables(const torch::Tensor& positions, int64_t head_dim, torch::ScalarType dtype);

/// [−x₂, x₁] over the last dimension (of even size).
torch::Tensor rotate_half(const torch::Tensor& x);

/// Rotates x (…, t, H, head_dim) by the tables (t, head_dim), broadcasting over the batch and head axes.
torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& tables);

}  // namespace attnmix::stream
