// SPDX-License-Identifier: Apache-2.0
// attention_law (docs/mechanisms.md#moment-closure-far-field); see include/attnmix/stream/moment_propagation.hpp.
#include "attnmix/stream/moment_propagation.hpp"

#include "attnmix/core/errors.hpp"

#include <cmath>
#include <string>
#include <vector>

namespace attnmix::stream {
namespace {

constexpr const char* kWhere = "attention_law";

void require_shape(const torch::Tensor& t, std::vector<int64_t> shape, const char* name) {
  if (!t.defined() || t.sizes() != torch::IntArrayRef(shape)) {
    std::string want;
    for (size_t i = 0; i < shape.size(); ++i) {
      want += (i ? "x" : "") + std::to_string(shape[i]);
    }
    throw ValueError(std::string(kWhere) + ": " + name + " must have shape " + want);
  }
  if (!torch::isfinite(t).all().item<bool>()) {
    throw ValueError(std::string(kWhere) + ": " + name + " must be finite");
  }
}

}  // namespace

AttentionLawResult attention_law(const GaussianLaw& law, const torch::Tensor& qkv_weight,
                                 const torch::Tensor& qkv_bias, const torch::Tensor& proj_weight,
                                 const torch::Tensor& proj_bias, int64_t n_head) {
  if (!law.mean.defined() || law.mean.dim() != 1) {
    throw ValueError(std::string(kWhere) + ": law.mean must be a vector");
  }
  const int64_t d = law.mean.size(0);
  if (n_head <= 0 || d % n_head != 0) {
    throw ValueError(std::string(kWhere) + ": d_model (" + std::to_string(d) + ") must be divisible by n_head (" +
                     std::to_string(n_head) + ")");
  }
  require_shape(law.mean, {d}, "law.mean");
  require_shape(law.cov, {d, d}, "law.cov");
  require_shape(qkv_weight, {3 * d, d}, "qkv_weight");
  require_shape(qkv_bias, {3 * d}, "qkv_bias");
  require_shape(proj_weight, {d, d}, "proj_weight");
  require_shape(proj_bias, {d}, "proj_bias");

  const int64_t hd = d / n_head;
  const auto mu = torch::matmul(qkv_weight, law.mean) + qkv_bias;                    // (3d)
  const auto sigma = torch::matmul(torch::matmul(qkv_weight, law.cov), qkv_weight.t());  // (3d, 3d)
  const auto mu_q = mu.narrow(0, 0, d);
  const auto mu_v = mu.narrow(0, 2 * d, d);
  const auto sigma_qq = sigma.narrow(0, 0, d).narrow(1, 0, d);

  auto a = torch::zeros({d, d}, law.mean.options());
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t h = 0; h < n_head; ++h) {
    const auto sigma_vk = sigma.narrow(0, 2 * d + h * hd, hd).narrow(1, d + h * hd, hd);  // Cov(V_h, K_h)
    a.narrow(0, h * hd, hd).narrow(1, h * hd, hd).copy_(sigma_vk * scale);
  }
  const auto mean_before = mu_v + torch::matmul(a, mu_q);
  const auto cov_before = torch::matmul(torch::matmul(a, sigma_qq), a.t());
  AttentionLawResult result;
  result.law.mean = torch::matmul(proj_weight, mean_before) + proj_bias;
  result.law.cov = torch::matmul(torch::matmul(proj_weight, cov_before), proj_weight.t());
  result.jacobian = torch::matmul(torch::matmul(proj_weight, a), qkv_weight.narrow(0, 0, d));
  return result;
}

}  // namespace attnmix::stream
