// SPDX-License-Identifier: Apache-2.0
// FusedAdamW (fused_adamw.hpp). Compiled with -ffp-contract=off (src/CMakeLists.txt): the two fused multiply-adds
// of the update are written out, and no other product may be fused with a sum, or the bits would leave libtorch's;
// and with -fno-math-errno, without which GCC keeps std::sqrt scalar and the loop does not vectorise.
#include "attnmix/stream/fused_adamw.hpp"

#include <ATen/Parallel.h>
#include <c10/util/string_utils.h>

#include <cmath>
#include <memory>
#include <string>

namespace attnmix::stream {
namespace {

// The constants of one parameter's update, in its dtype T.
template <class T>
struct Coefficients {
  T decay, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_correction2, eps, neg_step_size;
};

template <class T>
Coefficients<T> coefficients(const torch::optim::AdamWOptions& o, int64_t step) {
  const auto [beta1, beta2] = o.betas();
  const double correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  return {static_cast<T>(1.0 - o.lr() * o.weight_decay()), static_cast<T>(beta1), static_cast<T>(1.0 - beta1),
          static_cast<T>(beta2), static_cast<T>(1.0 - beta2), static_cast<T>(std::sqrt(correction2)),
          static_cast<T>(o.eps()), static_cast<T>(-(o.lr() / correction1))};
}

template <class T>
void update(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t begin, int64_t end,
            const Coefficients<T>& c) {
  for (int64_t i = begin; i < end; ++i) {
    const T decayed = p[i] * c.decay;
    const T mi = std::fma(g[i], c.one_minus_beta1, m[i] * c.beta1);
    const T vi = std::fma(c.one_minus_beta2 * g[i], g[i], v[i] * c.beta2);
    const T denominator = std::sqrt(vi) / c.sqrt_correction2 + c.eps;
    p[i] = decayed + (c.neg_step_size * mi) / denominator;
    m[i] = mi;
    v[i] = vi;
  }
}

bool dense_like(const torch::Tensor& t, const torch::Tensor& p) {
  return t.defined() && t.layout() == torch::kStrided && t.device() == p.device() &&
         t.scalar_type() == p.scalar_type() && t.sizes() == p.sizes() && t.is_contiguous();
}

// Whether every parameter with a gradient can take the fused pass.
bool fusable(const std::vector<torch::optim::OptimizerParamGroup>& groups,
             const ska::flat_hash_map<std::string, std::unique_ptr<torch::optim::OptimizerParamState>>& state) {
  for (const auto& group : groups) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!p.device().is_cpu() || (p.scalar_type() != torch::kFloat && p.scalar_type() != torch::kDouble) ||
          !p.is_contiguous() || !dense_like(p.grad(), p)) {
        return false;
      }
      const auto found = state.find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (found != state.end()) {
        const auto& s = static_cast<const torch::optim::AdamWParamState&>(*found->second);
        if (!dense_like(s.exp_avg(), p) || !dense_like(s.exp_avg_sq(), p)) return false;
      }
    }
  }
  return true;
}

}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure != nullptr) {  // first: the closure may make the gradients the checks below look at
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  if (!fusable(param_groups_, state_)) {
    torch::optim::AdamW::step();
    return loss;
  }
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state_[c10::guts::to_string(p.unsafeGetTensorImpl())];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Contiguous));
        slot = std::move(fresh);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      s.step(s.step() + 1);
      const torch::Tensor grad = p.grad();
      AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "FusedAdamW", [&] {
        const auto c = coefficients<scalar_t>(options, s.step());
        scalar_t* pp = p.data_ptr<scalar_t>();
        const scalar_t* gp = grad.data_ptr<scalar_t>();
        scalar_t* mp = s.exp_avg().data_ptr<scalar_t>();
        scalar_t* vp = s.exp_avg_sq().data_ptr<scalar_t>();
        at::parallel_for(0, p.numel(), 1 << 15,
                         [&](int64_t begin, int64_t end) { update(pp, gp, mp, vp, begin, end, c); });
      });
    }
  }
  return loss;
}

}  // namespace attnmix::stream
