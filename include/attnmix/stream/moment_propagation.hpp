// SPDX-License-Identifier: Apache-2.0
/// @file moment_propagation.hpp
/// `attention_law`: the exact Gaussian law of an attention layer's output over one population.
///
/// For jointly Gaussian (K, V) and a fixed query q with u = q/√d:
///   E[e^{uᵀK}] = exp(uᵀμ_K + ½uᵀΣ_KK u),   E[e^{uᵀK} V] = E[e^{uᵀK}] (μ_V + Σ_VK u),
/// so attention over the whole population is exactly affine in q: out(q) = μ_V + Σ_VK q/√d.
/// Given a Gaussian law N(μ_h, Σ_h) over the layer input h (d):
///   1. [q; k; v] = W h + b exactly:  μ = W μ_h + b,  Σ = W Σ_h Wᵀ                 (3d, 3d×3d)
///   2. per head: A_h = Σ_{V_h K_h} / √d_head, b_h = μ_{V_h}; A is block-diagonal
///   3. before proj: N(b + A μ_Q, A Σ_QQ Aᵀ);  4. after proj: N(P m + p, P C Pᵀ)
///   jacobian = P A W_q (d×d).
/// Cost O(d³). Works in the dtype of its inputs (use float64 for checks).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace attnmix::stream {

/// A Gaussian law over a d-vector: mean (d), covariance (d×d).
struct GaussianLaw {
  torch::Tensor mean;  ///< μ, shape (d)
  torch::Tensor cov;   ///< Σ, shape (d, d), symmetric positive semi-definite
};

/// What attention_law returns: the law of the layer's output and its sensitivity to the input through the queries.
struct AttentionLawResult {
  GaussianLaw law;         ///< the law of the layer's attention output after proj
  torch::Tensor jacobian;  ///< d out / d h through the query path: P A W_q (d×d)
};

/// The exact Gaussian law of the attention output (after proj) of one layer with weights qkv_weight (3d, d),
/// qkv_bias (3d), proj_weight (d, d), proj_bias (d) and n_head heads, when its input h ~ `law` (steps 1–4 above),
/// and the Jacobian P A W_q. Everything is computed in the inputs' dtype and on their device. Cost O(d³).
/// @throws ValueError when d_model % n_head ≠ 0, a shape does not match (qkv_weight 3d×d, qkv_bias 3d,
///   proj_weight d×d, proj_bias d, law d and d×d) or an input is not finite.
AttentionLawResult attention_law(const GaussianLaw& law, const torch::Tensor& qkv_weight,
                                 const torch::Tensor& qkv_bias, const torch::Tensor& proj_weight,
                                 const torch::Tensor& proj_bias, int64_t n_head);

}  // namespace attnmix::stream
