// SPDX-License-Identifier: Apache-2.0
// Dense matrix products with analytic backward, on OpenBLAS or Eigen; see dense_products_impl.hpp.
#define EIGEN_DONT_PARALLELIZE
#include "dense_products_impl.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <string>
#include <utility>
#include <vector>

namespace attnmix::stream::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ColMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
using Outer = Eigen::OuterStride<>;

bool eligible(const torch::Tensor& a, const torch::Tensor& b) {
  const auto type = a.scalar_type();
  return a.device().is_cpu() && b.device().is_cpu() && type == b.scalar_type() &&
         (type == torch::kFloat || type == torch::kDouble);
}

// A strided matrix operand: element (i, j) at data[i·rs + j·cs].
template <class T>
struct Operand {
  const T* data;
  int64_t rows, cols, rs, cs;
};

// ---- The BLAS path --------------------------------------------------------------------------------------------------

// OpenBLAS when the libblas.so.3 that provides cblas_sgemm in this process is OpenBLAS (it alone has
// openblas_get_corename; dlsym on the library's handle searches its dependencies, libopenblas.so.0) and the core it
// chose has AVX2 or AVX-512 kernels whose results for the dtype do not depend on OpenBLAS's thread count (the
// header). An OpenBLAS that does not know the processor falls back to generic SSE kernels ("Prescott": OpenBLAS
// 0.3.21 on Sapphire Rapids), 4-5x slower than Eigen at every spine shape (BM_DenseProduct, docs/PERFORMANCE.md), so
// Eigen serves then. The choice depends on the machine alone, never on a timing.
struct BlasCores {
  bool for_float = false;
  bool for_double = false;
};

BlasCores blas_cores(std::string core) {
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (core == "skylakex" || core == "cooperlake") return {true, true};
  if (core == "haswell" || core == "zen") return {false, true};
  return {};
}

BlasCores detect_blas_cores() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cblas_sgemm), &info) == 0 || info.dli_fname == nullptr) return {};
  void* library = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (library == nullptr) return {};
  using CoreName = const char* (*)();
  const auto corename = reinterpret_cast<CoreName>(dlsym(library, "openblas_get_corename"));
  const BlasCores cores = corename != nullptr && corename() != nullptr ? blas_cores(corename()) : BlasCores{};
  dlclose(library);
  return cores;
}

std::atomic<GemmKernel>& kernel_setting() {
  static std::atomic<GemmKernel> kernel{GemmKernel::kAuto};
  return kernel;
}

// A matrix as CBLAS reads it in row-major order: op(X) = X (kNoTrans, rows `ld` apart) or the transpose of a
// row-major matrix (kTrans: X's columns `ld` apart).
template <class T>
struct BlasOperand {
  const T* data;
  int ld;
  CBLAS_TRANSPOSE trans;
};

// x as a BLAS operand: in place when one axis is contiguous and the other's stride covers it, else a row-major copy
// in `scratch`. False when a dimension does not fit BLAS's int.
template <class T>
bool blas_operand(Operand<T> x, std::vector<T>& scratch, BlasOperand<T>& out) {
  if (x.rows > INT_MAX || x.cols > INT_MAX || x.rs > INT_MAX || x.cs > INT_MAX) return false;
  if (x.cols == 1) x.cs = 1;       // a stride along an axis of length 1 is never used
  if (x.rows == 1) x.rs = x.cols;  // … so any leading dimension ≥ the width serves
  if (x.cs == 1 && x.rs >= x.cols) {
    out = {x.data, static_cast<int>(std::max<int64_t>(x.rs, 1)), CblasNoTrans};
  } else if (x.rs == 1 && x.cs >= x.rows) {
    out = {x.data, static_cast<int>(std::max<int64_t>(x.cs, 1)), CblasTrans};
  } else {
    scratch.resize(static_cast<size_t>(x.rows * x.cols));
    for (int64_t i = 0; i < x.rows; ++i) {
      for (int64_t j = 0; j < x.cols; ++j) scratch[static_cast<size_t>(i * x.cols + j)] = x.data[i * x.rs + j * x.cs];
    }
    out = {scratch.data(), static_cast<int>(std::max<int64_t>(x.cols, 1)), CblasNoTrans};
  }
  return true;
}

void blas_gemm(const BlasOperand<float>& a, const BlasOperand<float>& b, int m, int n, int k, float* c) {
  cblas_sgemm(CblasRowMajor, a.trans, b.trans, m, n, k, 1.0F, a.data, a.ld, b.data, b.ld, 0.0F, c, std::max(n, 1));
}
void blas_gemm(const BlasOperand<double>& a, const BlasOperand<double>& b, int m, int n, int k, double* c) {
  cblas_dgemm(CblasRowMajor, a.trans, b.trans, m, n, k, 1.0, a.data, a.ld, b.data, b.ld, 0.0, c, std::max(n, 1));
}

// C (m × n, row-major, contiguous) = A B on the BLAS; false (nothing written) when a dimension exceeds BLAS's int.
template <class T>
bool blas_product(const Operand<T>& a, const Operand<T>& b, T* c, std::vector<T>& scratch_a,
                  std::vector<T>& scratch_b) {
  if (a.rows > INT_MAX || b.cols > INT_MAX || a.cols > INT_MAX) return false;
  BlasOperand<T> op_a{}, op_b{};
  if (!blas_operand(a, scratch_a, op_a) || !blas_operand(b, scratch_b, op_b)) return false;
  blas_gemm(op_a, op_b, static_cast<int>(a.rows), static_cast<int>(b.cols), static_cast<int>(a.cols), c);
  return true;
}

// ---- The Eigen path -------------------------------------------------------------------------------------------------

// Calls f with an Eigen map of x: row-major when its columns are contiguous, column-major when its rows are, and
// otherwise a row-major copy in `scratch`. Maps with an outer stride go straight into Eigen's GEMM without a copy.
template <class T, class F>
void with_map(Operand<T> x, std::vector<T>& scratch, F&& f) {
  if (x.cols == 1) x.cs = 1;  // a stride along an axis of length 1 is never used
  if (x.rows == 1) x.rs = 1;
  if (x.cs != 1 && x.rs == 1) {
    f(Eigen::Map<const ColMajor<T>, 0, Outer>(x.data, x.rows, x.cols, Outer(x.cs)));
    return;
  }
  if (x.cs != 1) {
    scratch.resize(static_cast<size_t>(x.rows * x.cols));
    for (int64_t i = 0; i < x.rows; ++i) {
      for (int64_t j = 0; j < x.cols; ++j) scratch[static_cast<size_t>(i * x.cols + j)] = x.data[i * x.rs + j * x.cs];
    }
    x = {scratch.data(), x.rows, x.cols, x.cols, 1};
  }
  f(Eigen::Map<const RowMajor<T>, 0, Outer>(x.data, x.rows, x.cols, Outer(x.rs)));
}

// The last two axes of t as a matrix at `offset`, transposed when `transpose` is set.
template <class T>
Operand<T> operand(const torch::Tensor& t, int64_t offset, bool transpose) {
  const int64_t r = t.dim() - 2;
  Operand<T> x{t.data_ptr<T>() + offset, t.size(r), t.size(r + 1), t.stride(r), t.stride(r + 1)};
  if (transpose) {
    std::swap(x.rows, x.cols);
    std::swap(x.rs, x.cs);
  }
  return x;
}

// op(a) op(b) batched over the leading axes, which a and b share (any strides; the result is contiguous).
torch::Tensor batched(const torch::Tensor& a, bool ta, const torch::Tensor& b, bool tb) {
  const int64_t lead = a.dim() - 2;
  const int64_t m = ta ? a.size(lead + 1) : a.size(lead);
  const int64_t n = tb ? b.size(lead) : b.size(lead + 1);
  auto sizes = a.sizes().vec();
  sizes[static_cast<size_t>(lead)] = m;
  sizes[static_cast<size_t>(lead + 1)] = n;
  auto out = torch::empty(sizes, a.options());
  int64_t count = 1;
  for (int64_t i = 0; i < lead; ++i) count *= a.size(i);
  const bool on_blas = gemm_kernel_for(a.scalar_type()) == GemmKernel::kBlas;
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "attnmix_fast_bmm", [&] {
    auto* po = out.data_ptr<scalar_t>();
    std::vector<scalar_t> scratch_a, scratch_b;
    std::vector<int64_t> index(static_cast<size_t>(lead), 0);
    for (int64_t i = 0; i < count; ++i) {
      int64_t offset_a = 0, offset_b = 0;
      for (int64_t axis = 0; axis < lead; ++axis) {
        offset_a += index[static_cast<size_t>(axis)] * a.stride(axis);
        offset_b += index[static_cast<size_t>(axis)] * b.stride(axis);
      }
      const auto op_a = operand<scalar_t>(a, offset_a, ta);
      const auto op_b = operand<scalar_t>(b, offset_b, tb);
      if (!on_blas || !blas_product(op_a, op_b, po + i * m * n, scratch_a, scratch_b)) {
        Eigen::Map<RowMajor<scalar_t>> C(po + i * m * n, m, n);
        with_map(op_a, scratch_a, [&](const auto& A) {
          with_map(op_b, scratch_b, [&](const auto& B) { C.noalias() = A * B; });
        });
      }
      for (int64_t axis = lead - 1; axis >= 0; --axis) {  // next multi-index, last axis fastest
        if (++index[static_cast<size_t>(axis)] < a.size(axis)) break;
        index[static_cast<size_t>(axis)] = 0;
      }
    }
  });
  return out;
}

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  // x (N, in), w (out, in), any strides; bias (out) or empty (no bias; autograd inputs must be defined).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& bias) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["has_bias"] = bias.numel() > 0;
    auto y = batched(x, false, w, true);
    if (bias.numel() > 0) y += bias;
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w = saved[1];
    const auto& g = grads[0];
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = batched(g, false, w, false);
    if (ctx->needs_input_grad(1)) dw = batched(g, true, x, false);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) db = g.sum(0);
    return {dx, dw, db};
  }
};

struct BmmFunction : torch::autograd::Function<BmmFunction> {
  // a (…, m, k), b (…, k, n) or (…, n, k) when transpose_b, with the same leading axes and any strides.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a, const torch::Tensor& b,
                               bool transpose_b) {
    ctx->save_for_backward({a, b});
    ctx->saved_data["transpose_b"] = transpose_b;
    return batched(a, false, b, transpose_b);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& a = saved[0];
    const auto& b = saved[1];
    const bool tb = ctx->saved_data["transpose_b"].toBool();
    const auto& g = grads[0];
    torch::Tensor da, db;
    if (ctx->needs_input_grad(0)) da = batched(g, false, b, !tb);  // g bᵀ, or g b when b came transposed
    if (ctx->needs_input_grad(1)) db = tb ? batched(g, true, a, false) : batched(a, true, g, false);
    return {da, db, torch::Tensor()};
  }
};

}  // namespace

GemmKernel gemm_kernel() { return kernel_setting().load(std::memory_order_relaxed); }

GemmKernel gemm_kernel_for(torch::ScalarType dtype) {
  const GemmKernel setting = gemm_kernel();
  if (setting != GemmKernel::kAuto) return setting;
  static const BlasCores cores = detect_blas_cores();
  return (dtype == torch::kDouble ? cores.for_double : cores.for_float) ? GemmKernel::kBlas : GemmKernel::kEigen;
}

GemmKernel set_gemm_kernel(GemmKernel kernel) { return kernel_setting().exchange(kernel); }

torch::Tensor fast_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  if (!eligible(x, weight)) {
    return torch::nn::functional::linear(x, weight, bias);
  }
  auto sizes = x.sizes().vec();
  const auto flat = x.reshape({-1, x.size(-1)});
  auto y = LinearFunction::apply(flat, weight, bias.defined() ? bias : torch::empty({0}, weight.options()));
  sizes.back() = weight.size(0);
  return y.view(sizes);
}

torch::Tensor fast_bmm(const torch::Tensor& a, const torch::Tensor& b, bool transpose_b) {
  if (!eligible(a, b) || a.dim() < 2 || a.dim() != b.dim()) {
    return torch::matmul(a, transpose_b ? b.transpose(-2, -1) : b);
  }
  const int64_t lead = a.dim() - 2;
  if (a.sizes().slice(0, lead) == b.sizes().slice(0, lead)) {
    return BmmFunction::apply(a, b, transpose_b);
  }
  // Broadcast the leading axes (views; the expansion's backward sums the gradient back).
  auto shape = at::infer_size(a.sizes().slice(0, lead), b.sizes().slice(0, lead));
  auto a_shape = shape, b_shape = shape;
  a_shape.insert(a_shape.end(), a.sizes().end() - 2, a.sizes().end());
  b_shape.insert(b_shape.end(), b.sizes().end() - 2, b.sizes().end());
  return BmmFunction::apply(a.expand(a_shape), b.expand(b_shape), transpose_b);
}

}  // namespace attnmix::stream::detail
