// SPDX-License-Identifier: Apache-2.0
// The window split of the sketch spines; see src/stream/window_split.hpp.
#include "window_split.hpp"

#include "attnmix/stream/linear_attention.hpp"

#include <algorithm>

namespace attnmix::stream::detail {

WindowSplit split_window(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& shift, const torch::Tensor& x,
                         const torch::Tensor& window_k, const torch::Tensor& window_v, const torch::Tensor& last_x,
                         int64_t n_head, int64_t window) {
  const int64_t b = x.size(0), t = x.size(1), hd = x.size(2) / n_head;
  const auto features = linear_features(qkv, shift, x, last_x, n_head);
  const auto head_major = [](const torch::Tensor& z) { return z.permute({0, 2, 1, 3}); };  // (b, H, t, h_d)
  WindowSplit s;
  s.phi_q = head_major(features.phi_q);
  const int64_t held = window_k.size(2);
  s.keys = torch::cat({window_k.to(torch::kDouble), head_major(features.phi_k)}, 2);
  s.values = torch::cat({window_v.to(torch::kDouble), head_major(features.v)}, 2);
  const auto row = torch::arange(held, held + t, torch::kLong).unsqueeze(1);
  const auto column = torch::arange(held + t, torch::kLong).unsqueeze(0);
  s.in_window = torch::logical_and(column <= row, column > row - window).to(torch::kDouble);
  s.first_eviction = std::clamp<int64_t>(window - held, 0, t);
  s.evictions = t - s.first_eviction;
  const auto evicted = [&](const torch::Tensor& rows) {
    const auto none = torch::zeros({b, n_head, s.first_eviction, hd}, rows.options());
    return s.evictions == 0 ? none
                            : torch::cat({none, rows.narrow(2, held + s.first_eviction - window, s.evictions)}, 2);
  };
  s.evicted_k = evicted(s.keys);
  s.evicted_v = evicted(s.values);
  const int64_t keep = std::min(held + t, window);
  s.next_window_k = s.keys.narrow(2, held + t - keep, keep).to(x.scalar_type());  // exact: φ(k) had this dtype
  s.next_window_v = s.values.narrow(2, held + t - keep, keep).to(x.scalar_type());
  return s;
}

torch::Tensor merge_heads(const torch::Tensor& attended, const torch::Tensor& x) {
  return attended.permute({0, 2, 1, 3}).reshape(x.sizes()).to(x.scalar_type());
}

}  // namespace attnmix::stream::detail
