// SPDX-License-Identifier: Apache-2.0
// One Frequent Directions shrink; see include/attnmix/stream/frequent_directions.hpp.
#include "attnmix/core/errors.hpp"
#include "attnmix/stream/frequent_directions.hpp"

#include <algorithm>
#include <string>

namespace attnmix::stream {

FrequentDirectionsShrink frequent_directions_shrink(const torch::Tensor& sketch) {
  if (!sketch.defined() || !sketch.is_floating_point() || sketch.dim() < 2) {
    throw ValueError("frequent_directions_shrink: the sketch must be a floating-point tensor (..., rows, columns)");
  }
  const int64_t rows = sketch.size(-2), columns = sketch.size(-1);
  if (rows < 4 || rows % 2 != 0) {
    throw ValueError("frequent_directions_shrink: the sketch's rows must be even and >= 4 (got " +
                     std::to_string(rows) + ")");
  }
  torch::NoGradGuard no_grad;
  const int64_t half = rows / 2, rank = std::min(rows, columns);
  const auto [u, sigma, vh] = torch::linalg_svd(sketch, /*full_matrices=*/false);
  const auto energy = sigma.square();  // (..., rank)
  FrequentDirectionsShrink out;
  out.delta = half <= rank ? energy.select(-1, half - 1).clone() : torch::zeros_like(energy.select(-1, 0));
  out.filled = half <= rank ? half - 1 : rank;
  const auto kept = (energy - out.delta.unsqueeze(-1)).clamp_min(0.0).sqrt();
  auto shrunk = torch::zeros_like(sketch);
  shrunk.narrow(-2, 0, rank).copy_(kept.unsqueeze(-1) * vh);
  shrunk.narrow(-2, out.filled, rows - out.filled).zero_();  // exact zeros: σ_j² − δ ≤ 0 there
  out.sketch = shrunk;
  return out;
}

}  // namespace attnmix::stream
