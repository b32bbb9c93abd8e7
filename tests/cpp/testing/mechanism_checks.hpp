// SPDX-License-Identifier: Apache-2.0
// Checks shared by the tests of the streaming mechanisms (header-only; the tests link libtorch): a chunk-by-chunk
// stream and the comparison of a loss's gradients with central finite differences.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace attnmix::testing {

/// Uniform token ids in [0, vocab), (b, t), from torch's generator seeded with `seed`.
inline torch::Tensor random_tokens(int64_t b, int64_t t, uint64_t seed, int64_t vocab) {
  torch::manual_seed(static_cast<int64_t>(seed));
  return torch::randint(0, vocab, {b, t}, torch::kLong);
}

/// Streams x through model->advance in chunks of the given lengths (which must sum to x's length); returns the
/// logits of every position and the final state.
template <class Model>
auto stream_chunks(Model& model, const torch::Tensor& x, const std::vector<int64_t>& chunks) {
  auto state = model->init_state(x.size(0));
  std::vector<torch::Tensor> logits;
  int64_t start = 0;
  for (const int64_t t : chunks) {
    auto out = model->advance(state, x.narrow(1, start, t));
    state = std::move(out.state);
    logits.push_back(out.logits);
    start += t;
  }
  EXPECT_EQ(start, x.size(1));
  return std::pair{torch::cat(logits, 1), std::move(state)};
}

/// The parameters the gradient tests of the linear-feature spines (linear attention and the two sketches) probe:
/// both token shifts, a projection of each layer and the tied embedding.
inline const std::vector<std::string> kLinearSpineProbes = {"shift0.weight", "shift1.weight",
                                                            "backbone.layer0.qkv.weight", "backbone.layer1.proj.bias",
                                                            "backbone.tok.weight"};

/// The gradient of loss() (a float64 model's scalar loss) with respect to the named parameters, at the first, a
/// middle and the last entry of each, against central differences with step 1e-6.
inline void expect_gradients_match_finite_differences(torch::nn::Module& model,
                                                      const std::function<torch::Tensor()>& loss,
                                                      const std::vector<std::string>& names) {
  model.zero_grad();
  loss().backward();
  const auto named = model.named_parameters();
  for (const std::string& name : names) {
    auto p = named[name];
    const auto flat = p.view({-1});
    for (const int64_t index : {int64_t{0}, flat.numel() / 3, flat.numel() - 1}) {
      const double h = 1e-6;
      double up = 0.0, down = 0.0;
      {
        torch::NoGradGuard no_grad;
        const double value = flat[index].item<double>();
        flat[index] = value + h;
        up = loss().item<double>();
        flat[index] = value - h;
        down = loss().item<double>();
        flat[index] = value;
      }
      const double numeric = (up - down) / (2 * h);
      const double analytic = p.grad().view({-1})[index].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-5 * std::abs(numeric)) << name << "[" << index << "]";
    }
  }
}

}  // namespace attnmix::testing
