// SPDX-License-Identifier: Apache-2.0
/// @file fused_adamw.hpp
/// AdamW in one pass over each parameter, with the results of libtorch's torch::optim::AdamW to the last bit.
///
/// Per element, with t the parameter's step count after the increment, lr and λ the group's learning rate and
/// weight decay, and every constant rounded to the parameter's dtype (as libtorch's scalar operands are):
///   p ← p·(1 − lr·λ)
///   m ← fma(g, 1 − β₁, m·β₁)
///   v ← fma((1 − β₂)·g, g, v·β₂)
///   p ← p + (−lr / (1 − β₁ᵗ))·m / (√v / √(1 − β₂ᵗ) + ε)
/// This is the sequence of roundings libtorch 1.13's AdamW::step performs in ten tensor passes and two temporaries with
/// its vectorised CPU kernels (which fuse the two multiply-adds; checked bit for bit against it,
/// `fused_adamw_test.cpp`), so a model trained with FusedAdamW equals one trained
/// with torch::optim::AdamW — or from Python with torch.optim.AdamW — exactly. The options, the parameter state
/// (AdamWParamState) and save/load are AdamW's. Cost: one pass reading p, g, m, v and writing p, m, v per element;
/// element-wise, so the result does not depend on the thread count.
///
/// Only contiguous float32 or float64 CPU parameters with dense gradients and moments of their dtype take the fused
/// pass; with anything else in the optimizer (another device or dtype, a strided tensor, amsgrad) step() is
/// torch::optim::AdamW::step.
#pragma once

#include <torch/optim/adamw.h>

namespace attnmix::stream {

/// torch::optim::AdamW with a one-pass update per parameter and bit-identical results (see the file comment). It is
/// constructed, configured, saved and loaded exactly as torch::optim::AdamW; `attnmix lm train` uses it (docs/lm.md).
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  /// Takes one AdamW step over every parameter with a gradient. The closure, if any, is called first (with
  /// gradients enabled) and its loss returned; an undefined tensor is returned without one. When every parameter
  /// qualifies (contiguous float32/float64 CPU tensors with dense gradients and moments of their dtype, no amsgrad)
  /// each takes the fused pass, parallel over its elements; otherwise the whole step is torch::optim::AdamW::step.
  /// The step counts and moments are kept in the AdamWParamState that AdamW itself would keep.
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace attnmix::stream
