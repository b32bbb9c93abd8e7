// SPDX-License-Identifier: Apache-2.0
// The window split of the sketch spines (private to attnmix::torch): one layer's linear-attention features of a
// chunk (linear_features: φ(q), φ(k) with the token shift, v) joined to the exact window the state carries, with the
// window mask, each token's evicted row and the window after the chunk. Shared by FrequentDirectionsSpine and
// TensorSketchSpine, which differ only in what they keep of the evicted rows.
//
// With n = the window's length before the chunk (min(pos, w)) and keys = [window ++ chunk] (index n + i is token i):
//   token i reads indices (n + i − w, n + i]                                  in_window (t, n + t)
//   token i evicts index n + i − w, from token first_eviction = clamp(w − n, 0, t) on
//   evicted_k/v (b, H, t, h_d): row i = the evicted token's φ(k)/v, zero before first_eviction
// Cost: O(b·t·d²) for the projections; the tensors are views and copies of O(b·H·(n + t)·h_d).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace attnmix::stream::detail {

struct WindowSplit {
  torch::Tensor phi_q;      ///< (b, H, t, h_d) float64
  torch::Tensor keys;       ///< φ(k) of the window and the chunk, (b, H, n + t, h_d) float64
  torch::Tensor values;     ///< (b, H, n + t, h_d) float64
  torch::Tensor in_window;  ///< (t, n + t) float64, 1 where token i reads the index
  torch::Tensor evicted_k;  ///< (b, H, t, h_d) float64
  torch::Tensor evicted_v;  ///< (b, H, t, h_d) float64
  int64_t first_eviction = 0;
  int64_t evictions = 0;      ///< t − first_eviction
  torch::Tensor next_window_k;  ///< the last min(n + t, w) rows of keys, in x's dtype
  torch::Tensor next_window_v;
};

/// window_k, window_v (b, H, n, h_d) in x's dtype; last_x (b, d); x (b, t, d) the layer's normalised input.
WindowSplit split_window(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& shift, const torch::Tensor& x,
                         const torch::Tensor& window_k, const torch::Tensor& window_v, const torch::Tensor& last_x,
                         int64_t n_head, int64_t window);

/// Per-head attention output (b, H, t, h_d) back to the layer's (b, t, d) in x's dtype.
torch::Tensor merge_heads(const torch::Tensor& attended, const torch::Tensor& x);

}  // namespace attnmix::stream::detail
