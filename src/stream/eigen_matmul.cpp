// SPDX-License-Identifier: Apache-2.0
// Eigen matrix products with analytic backward; see eigen_matmul_impl.hpp.
#define EIGEN_DONT_PARALLELIZE
#include "eigen_matmul_impl.hpp"

#include <Eigen/Core>

namespace attnmix::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

bool eligible(const torch::Tensor& a, const torch::Tensor& b) {
  const auto type = a.scalar_type();
  return a.device().is_cpu() && b.device().is_cpu() && type == b.scalar_type() &&
         (type == torch::kFloat || type == torch::kDouble);
}

// out (m, n) = op(a) op(b), each operand a contiguous row-major matrix; op = transpose when the flag is set.
template <class T>
void gemm(const T* a, int64_t a_rows, int64_t a_cols, bool ta, const T* b, int64_t b_rows, int64_t b_cols, bool tb,
          T* out) {
  const Eigen::Map<const RowMajor<T>> A(a, a_rows, a_cols);
  const Eigen::Map<const RowMajor<T>> B(b, b_rows, b_cols);
  const int64_t m = ta ? a_cols : a_rows;
  const int64_t n = tb ? b_rows : b_cols;
  Eigen::Map<RowMajor<T>> C(out, m, n);
  if (!ta && !tb) C.noalias() = A * B;
  if (!ta && tb) C.noalias() = A * B.transpose();
  if (ta && !tb) C.noalias() = A.transpose() * B;
  if (ta && tb) C.noalias() = A.transpose() * B.transpose();
}

// Batched op(a) op(b) over the leading axis of contiguous 3-D tensors.
torch::Tensor batched(const torch::Tensor& a, bool ta, const torch::Tensor& b, bool tb) {
  const int64_t batch = a.size(0);
  const int64_t m = ta ? a.size(2) : a.size(1);
  const int64_t n = tb ? b.size(1) : b.size(2);
  auto out = torch::empty({batch, m, n}, a.options());
  AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "attnmix_fast_bmm", [&] {
    const auto* pa = a.data_ptr<scalar_t>();
    const auto* pb = b.data_ptr<scalar_t>();
    auto* po = out.data_ptr<scalar_t>();
    for (int64_t i = 0; i < batch; ++i) {
      gemm(pa + i * a.size(1) * a.size(2), a.size(1), a.size(2), ta, pb + i * b.size(1) * b.size(2), b.size(1),
           b.size(2), tb, po + i * m * n);
    }
  });
  return out;
}

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  // x (N, in) contiguous, w (out, in) contiguous, bias (out) or empty (no bias; autograd inputs must be defined).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& bias) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["has_bias"] = bias.numel() > 0;
    auto y = batched(x.unsqueeze(0), false, w.unsqueeze(0), true).squeeze(0);
    if (bias.numel() > 0) y += bias;
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w = saved[1];
    const auto g = grads[0].contiguous();
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = batched(g.unsqueeze(0), false, w.unsqueeze(0), false).squeeze(0);
    if (ctx->needs_input_grad(1)) dw = batched(g.unsqueeze(0), true, x.unsqueeze(0), false).squeeze(0);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) db = g.sum(0);
    return {dx, dw, db};
  }
};

struct BmmFunction : torch::autograd::Function<BmmFunction> {
  // a (B, m, k), b (B, k, n) or (B, n, k) when transpose_b; both contiguous.
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
    const auto g = grads[0].contiguous();
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
  const auto flat = x.reshape({-1, x.size(-1)}).contiguous();
  auto y = LinearFunction::apply(flat, weight.contiguous(), bias.defined() ? bias : torch::empty({0}, weight.options()));
  sizes.back() = weight.size(0);
  return y.view(sizes);
}

torch::Tensor fast_bmm(const torch::Tensor& a, const torch::Tensor& b, bool transpose_b) {
  if (!eligible(a, b)) {
    return torch::matmul(a, transpose_b ? b.transpose(-2, -1) : b);
  }
  auto lead = a.sizes().vec();
  const int64_t m = a.size(-2);
  const int64_t n = transpose_b ? b.size(-2) : b.size(-1);
  const auto a3 = a.reshape({-1, a.size(-2), a.size(-1)}).contiguous();
  const auto b3 = b.reshape({-1, b.size(-2), b.size(-1)}).contiguous();
  auto c = BmmFunction::apply(a3, b3, transpose_b);
  lead[lead.size() - 2] = m;
  lead.back() = n;
  return c.view(lead);
}

}  // namespace attnmix::detail
