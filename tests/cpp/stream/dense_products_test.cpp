// SPDX-License-Identifier: Apache-2.0
// The dense products behind the spine and moment-closure attention (src/stream/dense_products.cpp), on each of their
// kernels (OpenBLAS and Eigen): values and gradients on strided operands (permuted, narrowed, expanded, stepped,
// broadcast) against torch::matmul and torch::linear, i.e. libtorch's own kernels and autograd formulas as the
// independent oracle; the kernel detection; OpenBLAS's results independent of its thread count.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "attnmix/core/rng.hpp"
#include "stream/dense_products_impl.hpp"
#include "testing/all_close.hpp"
#include "testing/torch_values.hpp"

namespace attnmix::stream {
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

/// Runs each test on one kernel, restoring the detected one afterwards.
class DenseProductsTest : public ::testing::TestWithParam<detail::GemmKernel> {
 protected:
  void SetUp() override { previous_ = detail::set_gemm_kernel(GetParam()); }
  void TearDown() override { detail::set_gemm_kernel(previous_); }

 private:
  detail::GemmKernel previous_ = detail::GemmKernel::kEigen;
};

TEST_P(DenseProductsTest, StridedBatchedProductsMatchTorchInFloat64) {
  const uint64_t seed = testing::test_seed(901);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const auto& c : strided_cases(rng, torch::kFloat64)) check(c, 1e-12, 1e-12);
}

TEST_P(DenseProductsTest, StridedBatchedProductsMatchTorchInFloat32) {
  const uint64_t seed = testing::test_seed(902);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const auto& c : strided_cases(rng, torch::kFloat32)) check(c, 1e-5, 1e-5);
}

TEST_P(DenseProductsTest, LinearOnStridedOperandsMatchesTorchLinear) {
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

INSTANTIATE_TEST_SUITE_P(Kernels, DenseProductsTest,
                         ::testing::Values(detail::GemmKernel::kEigen, detail::GemmKernel::kBlas),
                         [](const ::testing::TestParamInfo<detail::GemmKernel>& param) {
                           return std::string(param.param == detail::GemmKernel::kBlas ? "blas" : "eigen");
                         });

/// The process's BLAS, when it is OpenBLAS (libopenblas.so.0 loaded), null otherwise.
void* loaded_openblas() { return dlopen("libopenblas.so.0", RTLD_LAZY | RTLD_NOLOAD); }

/// The name of the core the process's OpenBLAS chose, or "(none)" when its BLAS is not OpenBLAS.
std::string openblas_core() {
  void* openblas = loaded_openblas();
  if (openblas == nullptr) return "(none)";
  using CoreName = const char* (*)();
  std::string core = reinterpret_cast<CoreName>(dlsym(openblas, "openblas_get_corename"))();
  dlclose(openblas);
  return core;
}

/// Without a setting, a dtype's products run on OpenBLAS exactly when the process loaded it (scripts/install-deps.sh
/// installs it) and it picked AVX2 or AVX-512 kernels whose results for that dtype do not depend on its thread count:
/// SkylakeX and Cooperlake for both dtypes, Haswell and Zen for double only; its generic SSE fallback (Prescott) and
/// other BLAS libraries leave them on Eigen. A setting overrides the choice for both dtypes.
TEST(DenseProductsKernelTest, UsesOpenBlasOnlyWhereItsResultsDoNotDependOnItsThreads) {
  ASSERT_EQ(detail::gemm_kernel(), detail::GemmKernel::kAuto);
  const std::string core = openblas_core();
  const auto listed = [&](std::initializer_list<const char*> cores) {
    return std::find(cores.begin(), cores.end(), core) != cores.end();
  };
  const bool both = listed({"SkylakeX", "Cooperlake"});
  const bool double_only = listed({"Haswell", "Zen"});
  const auto on_blas = [](torch::ScalarType dtype) { return detail::gemm_kernel_for(dtype) == detail::GemmKernel::kBlas; };
  EXPECT_EQ(on_blas(torch::kFloat), both) << "OpenBLAS core " << core;
  EXPECT_EQ(on_blas(torch::kDouble), both || double_only) << "OpenBLAS core " << core;
  for (const auto forced : {detail::GemmKernel::kEigen, detail::GemmKernel::kBlas}) {
    const detail::GemmKernel previous = detail::set_gemm_kernel(forced);
    EXPECT_EQ(detail::gemm_kernel_for(torch::kFloat), forced);
    EXPECT_EQ(detail::gemm_kernel_for(torch::kDouble), forced);
    detail::set_gemm_kernel(previous);
  }
}

/// The products give the same bits with one and with two OpenBLAS threads on the kernel chosen for each dtype, at the
/// spine's product shapes and at square ones, so a training step does not depend on OPENBLAS_NUM_THREADS (nor on the
/// number of cores, OpenBLAS's default thread count).
TEST(DenseProductsKernelTest, ResultsDoNotDependOnOpenBlasThreads) {
  void* openblas = loaded_openblas();
  if (openblas == nullptr) GTEST_SKIP() << "this process's BLAS is not OpenBLAS";
  using SetThreads = void (*)(int);
  using GetThreads = int (*)();
  const auto set_threads = reinterpret_cast<SetThreads>(dlsym(openblas, "openblas_set_num_threads"));
  const auto get_threads = reinterpret_cast<GetThreads>(dlsym(openblas, "openblas_get_num_threads"));
  ASSERT_TRUE(set_threads != nullptr && get_threads != nullptr);
  const int threads_before = get_threads();
  Rng rng(testing::test_seed(904));
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (const auto& [m, k, n] :
         std::vector<std::array<int64_t, 3>>{{512, 128, 384}, {512, 512, 2048}, {96, 32, 512}, {128, 128, 128}}) {
      const auto a = normal_tensor(rng, {m, k}, dtype), b = normal_tensor(rng, {n, k}, dtype);
      torch::Tensor products[2];
      for (const int threads : {1, 2}) {
        set_threads(threads);
        products[threads - 1] = detail::fast_linear(a, b, torch::Tensor());
      }
      EXPECT_TRUE(torch::equal(products[0], products[1]))
          << dtype << " " << m << "x" << k << "x" << n << " on OpenBLAS core " << openblas_core() << " ("
          << (detail::gemm_kernel_for(dtype) == detail::GemmKernel::kBlas ? "OpenBLAS" : "Eigen") << ")";
    }
  }
  set_threads(threads_before);
  dlclose(openblas);
}

}  // namespace
}  // namespace attnmix::stream
