// SPDX-License-Identifier: Apache-2.0
// The Eigen products behind the spine and moment-closure attention (src/stream/eigen_matmul.cpp): values and
// gradients on strided operands (permuted, narrowed, expanded, stepped, broadcast) against torch::matmul and
// torch::linear, i.e. libtorch's own kernels and autograd formulas as the independent oracle.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "attnmix/core/rng.hpp"
#include "stream/eigen_matmul_impl.hpp"
#include "testing/all_close.hpp"
#include "testing/torch_values.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;
using testing::to_vector;
using testing::normal_tensor;


struct Case {
  std::string name;
  torch::Tensor a, b;  // leaf tensors (gradients are taken with respect to these)
  std::function<torch::Tensor(const torch::Tensor&)> view_a, view_b;  // the strided operands built from them
  bool transpose_b;
};

// Each case's product and the gradients of Σ w ⊙ product, by fast_bmm and by torch::matmul.
void check(const Case& c, double rtol, double atol) {
  SCOPED_TRACE(c.name);
  std::vector<std::vector<double>> results[2];
  for (int oracle = 0; oracle < 2; ++oracle) {
    const auto a = c.a.detach().clone().requires_grad_(true);
    const auto b = c.b.detach().clone().requires_grad_(true);
    const auto va = c.view_a(a), vb = c.view_b(b);
    const auto product = oracle ? torch::matmul(va, c.transpose_b ? vb.transpose(-2, -1) : vb)
                                : detail::fast_bmm(va, vb, c.transpose_b);
    const auto weights = torch::linspace(-1.0, 2.0, product.numel(), product.options()).view(product.sizes());
    (product * weights).sum().backward();
    results[oracle] = {to_vector(product), to_vector(a.grad()), to_vector(b.grad())};
  }
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i == 0 ? "product" : i == 1 ? "grad a" : "grad b");
    ASSERT_EQ(results[0][i].size(), results[1][i].size());
    ExpectAllClose(results[0][i], results[1][i], rtol, atol);
  }
}

std::vector<Case> strided_cases(Rng& rng, torch::ScalarType dtype) {
  const auto identity = [](const torch::Tensor& x) { return x; };
  std::vector<Case> cases;
  // (B, t, H, d) permuted to (B, H, t, d): the heads' matrices are strided row by row (attention's QKᵀ).
  cases.push_back({"permuted, a bᵀ", normal_tensor(rng, {2, 5, 3, 4}, dtype), normal_tensor(rng, {2, 6, 3, 4}, dtype),
                   [](const torch::Tensor& x) { return x.permute({0, 2, 1, 3}); },
                   [](const torch::Tensor& x) { return x.permute({0, 2, 1, 3}); }, true});
  // A transposed matrix (column-major operand) and a narrowed one (row stride larger than its width).
  cases.push_back({"transposed and narrowed, a b", normal_tensor(rng, {3, 4, 5}, dtype),
                   normal_tensor(rng, {3, 4, 9}, dtype), [](const torch::Tensor& x) { return x.transpose(1, 2); },
                   [](const torch::Tensor& x) { return x.narrow(2, 2, 6); }, false});
  // Neither matrix axis contiguous (steps of 2): the operand is copied.
  cases.push_back({"stepped", normal_tensor(rng, {2, 6, 8}, dtype), normal_tensor(rng, {2, 10, 6}, dtype),
                   [](const torch::Tensor& x) { return x.slice(1, 0, 6, 2).slice(2, 1, 8, 2); },
                   [](const torch::Tensor& x) { return x.slice(1, 0, 8, 2).slice(2, 0, 6, 2); }, false});
  // An expanded (stride 0) row vector, as a single live cluster's weights are.
  cases.push_back({"expanded", normal_tensor(rng, {2, 1, 1}, dtype), normal_tensor(rng, {2, 7, 3}, dtype),
                   [](const torch::Tensor& x) { return x.expand({2, 1, 7}); }, identity, false});
  // Leading axes broadcast against each other, 5-D.
  cases.push_back({"broadcast leading axes", normal_tensor(rng, {2, 1, 3, 1, 4}, dtype),
                   normal_tensor(rng, {1, 4, 3, 5, 4}, dtype), identity, identity, true});
  // Row and column vectors.
  cases.push_back({"vectors", normal_tensor(rng, {3, 1, 6}, dtype), normal_tensor(rng, {3, 6, 1}, dtype), identity,
                   identity, false});
  return cases;
}

TEST(EigenMatmulTest, StridedBatchedProductsMatchTorchInFloat64) {
  const uint64_t seed = testing::test_seed(901);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const auto& c : strided_cases(rng, torch::kFloat64)) check(c, 1e-12, 1e-12);
}

TEST(EigenMatmulTest, StridedBatchedProductsMatchTorchInFloat32) {
  const uint64_t seed = testing::test_seed(902);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const auto& c : strided_cases(rng, torch::kFloat32)) check(c, 1e-5, 1e-5);
}

TEST(EigenMatmulTest, LinearOnStridedOperandsMatchesTorchLinear) {
  const uint64_t seed = testing::test_seed(903);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "bias" : "no bias");
    std::vector<std::vector<double>> results[2];
    const auto x0 = normal_tensor(rng, {4, 3, 5}, torch::kFloat64);
    const auto w0 = normal_tensor(rng, {5, 6}, torch::kFloat64);  // used transposed: a non-contiguous (6, 5) weight
    const auto b0 = normal_tensor(rng, {6}, torch::kFloat64);
    for (int oracle = 0; oracle < 2; ++oracle) {
      const auto x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true),
                 b = b0.clone().requires_grad_(true);
      const auto xs = x.permute({1, 0, 2});  // non-contiguous input
      const auto bias = with_bias ? b : torch::Tensor();
      const auto y = oracle ? torch::nn::functional::linear(xs, w.t(), bias) : detail::fast_linear(xs, w.t(), bias);
      (y * torch::linspace(-2.0, 1.0, y.numel(), y.options()).view(y.sizes())).sum().backward();
      results[oracle] = {to_vector(y), to_vector(x.grad()), to_vector(w.grad())};
      if (with_bias) results[oracle].push_back(to_vector(b.grad()));
    }
    for (size_t i = 0; i < results[0].size(); ++i) ExpectAllClose(results[0][i], results[1][i], 1e-12, 1e-12);
  }
}

}  // namespace
}  // namespace attnmix
