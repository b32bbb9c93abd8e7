// SPDX-License-Identifier: Apache-2.0
// Matrix products of the streaming spine and moment-closure attention, as autograd functions (private to
// attnmix::torch).
//
// libtorch's CPU bmm makes one BLAS call per (batch, head) and copies strided operands; these read the operands in
// place and run each product on one of two kernels, chosen once per process and dtype (docs/PERFORMANCE.md, "Dense
// products"):
//   OpenBLAS (cblas_sgemm/dgemm) when the process's libblas.so.3 is OpenBLAS and its kernels for this processor and
//     dtype give the same bits for any OpenBLAS thread count: 1.2–1.5× Eigen at every product shape of the spine,
//     from 64×16×128 to 1536×512×512;
//   Eigen's blocked GEMM in the calling thread otherwise (Debian's reference BLAS is 10–40× slower than Eigen).
// Either kernel computes each output entry in a fixed order, whatever libtorch's and OpenBLAS's thread counts (Eigen
// runs with EIGEN_DONT_PARALLELIZE). OpenBLAS 0.3.21's SkylakeX and Cooperlake kernels split a GEMM's output across
// threads without changing any entry's sums; its Haswell and Zen single-precision kernels do not (measured: 5–18 %
// of the entries of a float product differ between one and two threads), so float products run on Eigen there.
//   linear(x, W, b) = x Wᵀ + b           x (…, in), W (out, in), b (out) or undefined
//     ∂x = g W,  ∂W = gᵀ x,  ∂b = Σ g
//   bmm(a, b)       = a b   or a bᵀ       a (…, m, k), b (…, k, n) or (…, n, k), batched over the leading axes
//     (broadcast), read in place whatever their strides (a copy only when neither matrix axis is contiguous)
//     ∂a = g bᵀ (g b),  ∂b = aᵀ g (gᵀ a)
// Other dtypes and devices fall back to torch::linear / torch::matmul.
#pragma once

#include <torch/torch.h>

namespace attnmix::stream::detail {

/// kAuto: per dtype, OpenBLAS where its results do not depend on its thread count, Eigen elsewhere (above).
enum class GemmKernel { kAuto, kEigen, kBlas };
/// The kernel setting of this process's products (kAuto unless set).
[[nodiscard]] GemmKernel gemm_kernel();
/// The kernel the products of `dtype` (float or double) run on: kEigen or kBlas.
[[nodiscard]] GemmKernel gemm_kernel_for(torch::ScalarType dtype);
/// Forces a kernel for every dtype, or kAuto (tests and benchmarks compare them); returns the previous setting.
GemmKernel set_gemm_kernel(GemmKernel kernel);

torch::Tensor fast_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);
torch::Tensor fast_bmm(const torch::Tensor& a, const torch::Tensor& b, bool transpose_b);

}  // namespace attnmix::stream::detail
