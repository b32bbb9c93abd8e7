// SPDX-License-Identifier: Apache-2.0
// Matrix products of the streaming spine on Eigen, as autograd functions (private to attnmix::torch).
//
// Debian's libtorch sends its float GEMMs to the reference BLAS (≈ 1–2 GFLOP/s here, 69 % of a d_model 32 training
// step and 92 % at 256; docs/PERFORMANCE.md), and its CPU bmm makes one BLAS call per (batch, head). These do the
// same products with Eigen's blocked GEMM in the calling thread (EIGEN_DONT_PARALLELIZE: results do not depend on
// the thread count):
//   linear(x, W, b) = x Wᵀ + b           x (…, in), W (out, in), b (out) or undefined
//     ∂x = g W,  ∂W = gᵀ x,  ∂b = Σ g
//   bmm(a, b)       = a b   or a bᵀ       a (…, m, k), b (…, k, n) or (…, n, k), batched over the leading axes
//     (broadcast), read in place whatever their strides (a copy only when neither matrix axis is contiguous)
//     ∂a = g bᵀ (g b),  ∂b = aᵀ g (gᵀ a)
// Other dtypes and devices fall back to torch::linear / torch::matmul.
#pragma once

#include <torch/torch.h>

namespace attnmix::detail {

torch::Tensor fast_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
torch::Tensor fast_bmm(const torch::Tensor& a, const torch::Tensor& b, bool transpose_b);

}  // namespace attnmix::detail
