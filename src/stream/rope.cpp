// SPDX-License-Identifier: Apache-2.0
// Rotary position embedding (docs/mechanisms.md#streaming-language-model); see include/attnmix/stream/rope.hpp.
#include "attnmix/stream/rope.hpp"

#include "attnmix/core/errors.hpp"

#include <string>

namespace attnmix::stream {

RopeTables rope_tables(const torch::Tensor& positions, int64_t head_dim, torch::ScalarType dtype) {
  if (head_dim <= 0 || head_dim % 2 != 0) {
    throw ValueError("rope_tables: head_dim must be a positive even integer (got " + std::to_string(head_dim) + ")");
  }
  if (positions.dim() != 1 || positions.scalar_type() != torch::kLong) {
    throw ValueError("rope_tables: positions must be a 1-D int64 tensor");
  }
  const auto options = torch::TensorOptions().dtype(dtype).device(positions.device());
  const auto exponents = torch::arange(0, head_dim, 2, options) / static_cast<double>(head_dim);
  const auto inv_freq = torch::pow(torch::full({}, 10000.0, options), -exponents);   // (h/2)
  const auto half = positions.to(dtype).unsqueeze(1) * inv_freq.unsqueeze(0);        // (t, h/2)
  const auto angles = torch::cat({half, half}, 1);                                    // (t, h)
  return {angles.cos(), angles.sin()};
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& tables) {
  // (t, h) → (t, 1, h): broadcast over the head axis (and any leading batch axis).
  const auto cos = tables.cos.unsqueeze(-2);
  const auto sin = tables.sin.unsqueeze(-2);
  return x * cos + rotate_half(x) * sin;
}

}  // namespace attnmix::stream
