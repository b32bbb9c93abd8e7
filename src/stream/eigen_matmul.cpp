// SPDX-License-Identifier: Apache-2.0
// Eigen matrix products with analytic backward; see eigen_matmul_impl.hpp.
#define EIGEN_DONT_PARALLELIZE
#include "eigen_matmul_impl.hpp"

#include <Eigen/Core>

#include <utility>
#include <vector>

namespace attnmix::detail {
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
      Eigen::Map<RowMajor<scalar_t>> C(po + i * m * n, m, n);
      with_map(operand<scalar_t>(a, offset_a, ta), scratch_a, [&](const auto& A) {
        with_map(operand<scalar_t>(b, offset_b, tb), scratch_b, [&](const auto& B) { C.noalias() = A * B; });
      });
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

}  // namespace attnmix::detail
