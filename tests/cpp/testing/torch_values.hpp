// SPDX-License-Identifier: Apache-2.0
/// @file torch_values.hpp
/// Helpers of the libtorch tests: a tensor's values as doubles, and seeded normal tensors from attnmix's Rng.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "attnmix/core/rng.hpp"

namespace attnmix::testing {

/// The values of t (any dtype, any strides) in row-major order, as doubles.
inline std::vector<double> to_vector(const torch::Tensor& t) {
  const auto c = t.detach().to(torch::kFloat64).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

/// A tensor of standard normal draws from rng (drawn in double, then cast to dtype).
inline torch::Tensor normal_tensor(Rng& rng, std::vector<int64_t> shape, torch::ScalarType dtype = torch::kFloat64) {
  auto out = torch::empty(shape, torch::kFloat64);
  double* p = out.data_ptr<double>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = rng.normal();
  return out.to(dtype);
}

}  // namespace attnmix::testing
