// SPDX-License-Identifier: Apache-2.0
// FusedAdamW (stream/fused_adamw.hpp) against libtorch's torch::optim::AdamW, the oracle it must equal bit for bit:
// parameters of every length around the vector widths, float32 and float64, a learning rate changed between steps,
// two parameter groups, a parameter without a gradient, one and two threads; the fallback paths (amsgrad, a strided
// parameter, gradients made by a closure) and a FusedAdamW continuing from AdamW's state.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnmix/stream/fused_adamw.hpp"

namespace attnmix::stream {
namespace {

using torch::optim::AdamW;
using torch::optim::AdamWOptions;

/// Fresh leaf copies of `values`, requiring gradients.
std::vector<torch::Tensor> leaves(const std::vector<torch::Tensor>& values) {
  std::vector<torch::Tensor> out;
  for (const auto& v : values) out.push_back(v.clone().requires_grad_());
  return out;
}

/// Gives both parameter lists the same gradients (none for the entries listed in `without`) and steps both.
void step_both(torch::optim::Optimizer& fused, std::vector<torch::Tensor>& a, torch::optim::Optimizer& reference,
               std::vector<torch::Tensor>& b, const std::vector<size_t>& without = {}) {
  for (size_t i = 0; i < a.size(); ++i) {
    const bool skip = std::find(without.begin(), without.end(), i) != without.end();
    const auto g = torch::randn_like(a[i]);
    a[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
    b[i].mutable_grad() = skip ? torch::Tensor() : g.clone();
  }
  fused.step();
  reference.step();
}

void expect_same_bits(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                      const std::string& what) {
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].detach(), b[i].detach())) << what << ", parameter " << i;
  }
}

void expect_same_state(const torch::optim::Optimizer& fused, const torch::optim::Optimizer& reference,
                       const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& fa = fused.state().at(c10::guts::to_string(a[i].unsafeGetTensorImpl()));
    const auto& rb = reference.state().at(c10::guts::to_string(b[i].unsafeGetTensorImpl()));
    const auto& x = static_cast<const torch::optim::AdamWParamState&>(*fa);
    const auto& y = static_cast<const torch::optim::AdamWParamState&>(*rb);
    EXPECT_EQ(x.step(), y.step()) << i;
    EXPECT_TRUE(torch::equal(x.exp_avg(), y.exp_avg())) << i;
    EXPECT_TRUE(torch::equal(x.exp_avg_sq(), y.exp_avg_sq())) << i;
  }
}

TEST(FusedAdamWTest, EqualsLibtorchAdamWBitForBit) {
  for (const auto dtype : {torch::kFloat, torch::kDouble}) {
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(std::string(dtype == torch::kFloat ? "float32" : "float64") + ", threads " +
                   std::to_string(threads));
      at::set_num_threads(threads);
      torch::manual_seed(31);
      std::vector<torch::Tensor> values;
      for (const int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 33, 100, 4099, 70001}) {
        values.push_back(torch::randn({n}, dtype));
      }
      values.push_back(torch::randn({37, 29}, dtype));
      auto a = leaves(values), b = leaves(values);
      const auto options = AdamWOptions(3e-3).weight_decay(0.01);
      FusedAdamW fused(a, options);
      AdamW reference(b, options);
      for (int step = 0; step < 20; ++step) {
        if (step == 10) {  // a schedule's change of the learning rate
          static_cast<AdamWOptions&>(fused.param_groups()[0].options()).lr(1e-2);
          static_cast<AdamWOptions&>(reference.param_groups()[0].options()).lr(1e-2);
        }
        step_both(fused, a, reference, b, step % 3 == 1 ? std::vector<size_t>{2} : std::vector<size_t>{});
      }
      expect_same_bits(a, b, "after 20 steps");
      expect_same_state(fused, reference, a, b);
    }
  }
  at::set_num_threads(1);
}

TEST(FusedAdamWTest, GroupsWithTheirOwnOptions) {
  torch::manual_seed(32);
  const std::vector<torch::Tensor> first{torch::randn({50})}, second{torch::randn({3, 11})};
  auto a1 = leaves(first), a2 = leaves(second), b1 = leaves(first), b2 = leaves(second);
  const auto group = [](std::vector<torch::Tensor> p, double lr, double wd, double beta1, double eps) {
    return torch::optim::OptimizerParamGroup(
        std::move(p), std::make_unique<AdamWOptions>(AdamWOptions(lr).weight_decay(wd).betas({beta1, 0.99}).eps(eps)));
  };
  FusedAdamW fused({group(a1, 1e-3, 0.0, 0.8, 1e-6), group(a2, 5e-3, 0.1, 0.95, 1e-8)}, AdamWOptions(1e-3));
  AdamW reference({group(b1, 1e-3, 0.0, 0.8, 1e-6), group(b2, 5e-3, 0.1, 0.95, 1e-8)}, AdamWOptions(1e-3));
  std::vector<torch::Tensor> a{a1[0], a2[0]}, b{b1[0], b2[0]};
  for (int step = 0; step < 8; ++step) step_both(fused, a, reference, b);
  expect_same_bits(a, b, "two groups");
}

TEST(FusedAdamWTest, FallsBackWhereItCannotFuseAndContinuesAdamWState) {
  torch::manual_seed(33);
  {  // amsgrad
    const std::vector<torch::Tensor> values{torch::randn({40})};
    auto a = leaves(values), b = leaves(values);
    FusedAdamW fused(a, AdamWOptions(1e-2).amsgrad(true));
    AdamW reference(b, AdamWOptions(1e-2).amsgrad(true));
    for (int step = 0; step < 5; ++step) step_both(fused, a, reference, b);
    expect_same_bits(a, b, "amsgrad");
  }
  {  // a strided (transposed) parameter
    const auto base = torch::randn({6, 9});
    auto a = std::vector<torch::Tensor>{base.t().contiguous().t().requires_grad_()};  // column-major storage
    auto b = std::vector<torch::Tensor>{base.clone().requires_grad_()};
    ASSERT_FALSE(a[0].is_contiguous());
    FusedAdamW fused(a, AdamWOptions(1e-2).weight_decay(0.01));
    AdamW reference(b, AdamWOptions(1e-2).weight_decay(0.01));
    for (int step = 0; step < 5; ++step) step_both(fused, a, reference, b);
    expect_same_bits(a, b, "strided");
  }
  {  // gradients made by the closure: an expanded (stride-0) one cannot fuse, a dense one can
    const std::vector<torch::Tensor> values{torch::randn({5, 3}), torch::randn({12})};
    auto a = leaves(values), b = leaves(values);
    FusedAdamW fused(a, AdamWOptions(1e-2));
    AdamW reference(b, AdamWOptions(1e-2));
    for (const bool expanded : {true, false}) {
      const auto row = torch::randn({3});
      const auto dense = torch::randn({12});
      const auto closure_for = [&](std::vector<torch::Tensor>& p) {
        return [&p, &row, &dense, expanded] {
          p[0].mutable_grad() = expanded ? row.expand({5, 3}) : row.expand({5, 3}).contiguous();
          p[1].mutable_grad() = dense.clone();
          return torch::ones({});
        };
      };
      EXPECT_EQ(fused.step(closure_for(a)).item<float>(), 1.0F);
      reference.step(closure_for(b));
      expect_same_bits(a, b, expanded ? "expanded gradient" : "dense gradient");
    }
  }
  {  // AdamW's moments (as a checkpoint restores them) continued by FusedAdamW
    const std::vector<torch::Tensor> values{torch::randn({65}), torch::randn({4, 4})};
    auto a = leaves(values), b = leaves(values);
    AdamW first(a, AdamWOptions(2e-3).weight_decay(0.05));
    AdamW reference(b, AdamWOptions(2e-3).weight_decay(0.05));
    for (int step = 0; step < 4; ++step) step_both(first, a, reference, b);
    FusedAdamW fused(a, AdamWOptions(2e-3).weight_decay(0.05));
    for (size_t i = 0; i < a.size(); ++i) {
      const auto key = c10::guts::to_string(a[i].unsafeGetTensorImpl());
      fused.state()[key] = first.state().at(key)->clone();
    }
    for (int step = 0; step < 4; ++step) step_both(fused, a, reference, b);
    expect_same_bits(a, b, "continued");
    expect_same_state(fused, reference, a, b);
  }
}

}  // namespace
}  // namespace attnmix::stream
