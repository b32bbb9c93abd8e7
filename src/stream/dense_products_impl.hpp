// SPDX-License-Identifier: Apache-2.0
// Matrix products of the streaming spine and moment-closure attention, as autograd functions (private to
// attnmix::torch).
//
// libtorch's CPU bmm makes one BLAS call per (batch, head) and copies strided operands; these read the operands in
// place and run each product on one of two kernels, chosen once per process (docs/PERFORMANCE.md, "Dense products"):
//   OpenBLAS (cblas_sgemm/dgemm) when the process's libblas.so.3 is OpenBLAS: 1.2–1.5× Eigen at every product shape
//     of the spine, from 64×16×128 to 1536×512×512;
//   Eigen's blocked GEMM in the calling thread otherwise (Debian's reference BLAS is 10–40× slower than Eigen).
// Either kernel computes each output entry in a fixed order, whatever libtorch's thread count (Eigen runs with
// EIGEN_DONT_PARALLELIZE; OpenBLAS splits a GEMM's output, never its inner dimension, across its threads).
//   linear(x, W, b) = x Wᵀ + b           x (…, in), W (out, in), b (out) or undefined
//     ∂x = g W,  ∂W = gᵀ x,  ∂b = Σ g
//   bmm(a, b)       = a b   or a bᵀ       a (…, m, k), b (…, k, n) or (…, n, k), batched over the leading axes
//     (broadcast), read in place whatever their strides (a copy only when neither matrix axis is contiguous)
//     ∂a = g bᵀ (g b),  ∂b = aᵀ g (gᵀ a)
// Other dtypes and devices fall back to torch::linear / torch::matmul.
#pragma once

#include <torch/torch.h>

namespace attnmix::detail {

enum class GemmKernel { kEigen, kBlas };
/// The kernel of this process's products (detected on first use).
[[nodiscard]] GemmKernel gemm_kernel();
/// Sets the kernel (tests and benchmarks compare the two); returns the previous one.
GemmKernel set_gemm_kernel(GemmKernel kernel);

torch::Tensor fast_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
torch::Tensor fast_bmm(const torch::Tensor& a, const torch::Tensor& b, bool transpose_b);

}  // namespace attnmix::detail
