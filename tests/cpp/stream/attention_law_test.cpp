// SPDX-License-Identifier: Apache-2.0
// attention_law (docs/mechanisms.md#moment-closure-far-field; acceptance row MCA-12).
//
// Oracles written here, from docs/mechanisms.md#moment-closure-far-field and not from
// src/stream/moment_propagation.cpp:
//   * hand_law: every needed moment by explicit sums over the layer input — μ_i = Σ_a W_ia μ_a + b_i and
//     Cov(i, j) = Σ_ab W_ia Σ_ab W_jb, never the 3d×3d product — then A_h = Cov(V_h, K_h)/√d_head per head, the law
//     N(μ_V + A μ_Q, A Σ_QQ Aᵀ) and its push through proj, and P A W_q, with Eigen products for the small d×d steps;
//   * a Monte Carlo population: N draws of h from the law, keys and values from them, and the softmax-weighted
//     average of the values for one fixed query — the attention output over a large population that
//     docs/mechanisms.md#moment-closure-far-field says is exactly μ_V + Σ_VK q/√d.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"
#include "attnmix/stream/moment_propagation.hpp"
#include "testing/all_close.hpp"
#include "testing/torch_values.hpp"

namespace attnmix::stream {
namespace {

using testing::ExpectAllClose;
using testing::to_vector;

torch::Tensor to_tensor(const Matrix& m) {
  auto t = torch::empty({m.rows(), m.cols()}, torch::kFloat64);
  std::copy(m.data(), m.data() + m.size(), t.data_ptr<double>());
  return t;
}
torch::Tensor to_tensor(const Vector& v) {
  auto t = torch::empty({v.size()}, torch::kFloat64);
  std::copy(v.data(), v.data() + v.size(), t.data_ptr<double>());
  return t;
}
std::vector<double> to_vector(const Matrix& m) { return {m.data(), m.data() + m.size()}; }

Matrix normal_matrix(Rng& rng, Index rows, Index cols, double scale) {
  Matrix m(rows, cols);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = scale * rng.normal();
  return m;
}

/// One attention layer's parameters and an input law, all float64.
struct Layer {
  Matrix w;       ///< qkv weight (3d × d)
  Vector b;       ///< qkv bias (3d)
  Matrix p;       ///< proj weight (d × d)
  Vector pb;      ///< proj bias (d)
  Vector mu;      ///< law mean (d)
  Matrix sigma;   ///< law covariance (d × d), positive definite
};

Layer random_layer(Rng& rng, Index d, double weight_scale) {
  Layer l;
  l.w = normal_matrix(rng, 3 * d, d, weight_scale);
  l.b = normal_matrix(rng, 3 * d, 1, 0.3);
  l.p = normal_matrix(rng, d, d, 0.5);
  l.pb = normal_matrix(rng, d, 1, 0.3);
  l.mu = normal_matrix(rng, d, 1, 0.5);
  const Matrix root = normal_matrix(rng, d, d, 1.0);
  l.sigma = root * root.transpose() / static_cast<double>(d) + 0.2 * Matrix::Identity(d, d);
  return l;
}

AttentionLawResult run_attention_law(const Layer& l, int64_t n_head) {
  return attention_law(GaussianLaw{to_tensor(l.mu), to_tensor(l.sigma)}, to_tensor(l.w), to_tensor(l.b),
                       to_tensor(l.p), to_tensor(l.pb), n_head);
}

struct HandLaw {
  Vector mean;
  Matrix cov;
  Matrix jacobian;
  Matrix a;  ///< block-diagonal A (before proj)
};

HandLaw hand_law(const Layer& l, Index n_head) {
  const Index d = l.mu.size(), hd = d / n_head;
  const auto mean_of = [&](Index i) {
    double s = l.b[i];
    for (Index a = 0; a < d; ++a) s += l.w(i, a) * l.mu[a];
    return s;
  };
  const auto cov_of = [&](Index i, Index j) {
    double s = 0.0;
    for (Index a = 0; a < d; ++a) {
      for (Index c = 0; c < d; ++c) s += l.w(i, a) * l.sigma(a, c) * l.w(j, c);
    }
    return s;
  };
  HandLaw out;
  out.a = Matrix::Zero(d, d);
  for (Index h = 0; h < n_head; ++h) {
    for (Index r = 0; r < hd; ++r) {
      for (Index c = 0; c < hd; ++c) {
        out.a(h * hd + r, h * hd + c) = cov_of(2 * d + h * hd + r, d + h * hd + c) / std::sqrt(static_cast<double>(hd));
      }
    }
  }
  Vector mu_q(d), mu_v(d);
  Matrix sigma_qq(d, d);
  for (Index i = 0; i < d; ++i) {
    mu_q[i] = mean_of(i);
    mu_v[i] = mean_of(2 * d + i);
    for (Index j = 0; j < d; ++j) sigma_qq(i, j) = cov_of(i, j);
  }
  const Vector mean_before = mu_v + out.a * mu_q;
  const Matrix cov_before = out.a * sigma_qq * out.a.transpose();
  out.mean = l.p * mean_before + l.pb;
  out.cov = l.p * cov_before * l.p.transpose();
  out.jacobian = l.p * out.a * l.w.topRows(d);
  return out;
}

/// MCA-12: the exact linear push of docs/mechanisms.md#moment-closure-far-field — out mean, out covariance and jacobian
/// equal the hand computation (float64, rtol 1e-12, atol 1e-12) for (d, n_head) = (6, 2), (8, 4), (4, 1) and (4, 4)
/// (head_dim 1); the output covariance is symmetric.
TEST(AttentionLawTest, ExactLinearPushMatchesHandComputation) {
  const uint64_t seed = testing::test_seed(401);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const auto& [d, n_head] : std::vector<std::pair<Index, int64_t>>{{6, 2}, {8, 4}, {4, 1}, {4, 4}}) {
    SCOPED_TRACE("d " + std::to_string(d) + ", n_head " + std::to_string(n_head));
    const Layer layer = random_layer(rng, d, 0.7);
    const auto result = run_attention_law(layer, n_head);
    const HandLaw expected = hand_law(layer, n_head);
    ASSERT_EQ(result.law.mean.sizes(), torch::IntArrayRef({d}));
    ASSERT_EQ(result.law.cov.sizes(), torch::IntArrayRef({d, d}));
    ASSERT_EQ(result.jacobian.sizes(), torch::IntArrayRef({d, d}));
    ExpectAllClose(to_vector(result.law.mean), std::vector<double>(expected.mean.data(), expected.mean.data() + d),
                   1e-12, 1e-12);
    ExpectAllClose(to_vector(result.law.cov), to_vector(expected.cov), 1e-12, 1e-12);
    ExpectAllClose(to_vector(result.jacobian), to_vector(expected.jacobian), 1e-12, 1e-12);
    EXPECT_TRUE(torch::allclose(result.law.cov, result.law.cov.t(), 0.0, 1e-12));
  }
}

/// docs/mechanisms.md#moment-closure-far-field by Monte Carlo: d 4, 2 heads (head_dim 2). For N = 200000 draws h_n of
/// the law, k_n and v_n from qkv, and one fixed query q, each head's softmax-weighted value average Σ_n e^{u_h·k_nh}
/// v_nh / Σ_n e^{u_h·k_nh} (u = q/√2) equals the affine identity μ_V + Σ_VK u, computed here from the hand moments,
/// within 5 estimated standard errors per coordinate (seeded). Each head's query is a random direction scaled to
/// u_hᵀΣ_KK,h u_h = 0.5, so the weights e^{u·k} are log-normal with variance 0.5 and the standard-error estimate is
/// reliable for every seed.
/// The query moves the output more than 10 standard errors away from μ_V (the check has power). With proj = identity,
/// attention_law's mean + jacobian·(h₀ − μ_h) for the input h₀ = W_q⁻¹(q − b_q) that produces q is the same affine
/// value (1e-9 relative: the inverse may be ill-conditioned).
TEST(AttentionLawTest, MonteCarloPopulationAttentionIsAffineInTheQuery) {
  const uint64_t seed = testing::test_seed(402);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Index d = 4, hd = 2;
  const int64_t n_head = 2;
  Layer layer = random_layer(rng, d, 0.5);
  layer.p = Matrix::Identity(d, d);
  layer.pb = Vector::Zero(d);
  const Matrix wq = layer.w.topRows(d), wk = layer.w.middleRows(d, d), wv = layer.w.bottomRows(d);
  const Matrix sigma_kk = wk * layer.sigma * wk.transpose();
  const Matrix sigma_vk = wv * layer.sigma * wk.transpose();
  const Vector mu_v = wv * layer.mu + layer.b.tail(d);
  Vector q(d), exact(d);
  for (Index head = 0; head < 2; ++head) {
    const auto block = Eigen::seqN(head * hd, hd);
    Vector u(hd);
    for (Index i = 0; i < hd; ++i) u[i] = rng.normal();
    u *= std::sqrt(0.5 / u.dot(sigma_kk(block, block) * u));
    q(block) = std::sqrt(static_cast<double>(hd)) * u;
    exact(block) = mu_v(block) + sigma_vk(block, block) * u;
  }

  const auto result = run_attention_law(layer, n_head);
  const Vector h0 = wq.fullPivLu().solve(q - layer.b.head(d));
  const Vector law_mean = Eigen::Map<const Vector>(to_vector(result.law.mean).data(), d);
  Matrix jacobian(d, d);
  const auto jv = to_vector(result.jacobian);
  std::copy(jv.begin(), jv.end(), jacobian.data());
  const Vector from_law = law_mean + jacobian * (h0 - layer.mu);
  ExpectAllClose(std::vector<double>(from_law.data(), from_law.data() + d),
                 std::vector<double>(exact.data(), exact.data() + d), 1e-9, 1e-9);

  const Eigen::LLT<Eigen::MatrixXd> llt(Eigen::MatrixXd(layer.sigma));
  ASSERT_EQ(llt.info(), Eigen::Success);
  const Eigen::MatrixXd root = llt.matrixL();
  const int64_t n = 200000;
  Matrix values(n, d), weights(n, 2);  // per draw: v_n, and e^{u_h·k_nh} per head
  for (int64_t s = 0; s < n; ++s) {
    Vector z(d);
    for (Index i = 0; i < d; ++i) z[i] = rng.normal();
    const Vector h = layer.mu + root * z;
    const Vector k = wk * h + layer.b.segment(d, d);
    values.row(s) = (wv * h + layer.b.tail(d)).transpose();
    for (Index head = 0; head < 2; ++head) {
      weights(s, head) = std::exp(q.segment(head * hd, hd).dot(k.segment(head * hd, hd)) / std::sqrt(2.0));
    }
  }
  Vector estimate(d), se(d);
  for (Index i = 0; i < d; ++i) {
    const auto w = weights.col(i / hd);
    const double weight_sum = w.sum();
    estimate[i] = w.dot(values.col(i)) / weight_sum;
    // Standard error of a self-normalised weighted mean: sqrt(Σ w_n² (v_n − est)²) / Σ w_n.
    se[i] = std::sqrt((w.array() * (values.col(i).array() - estimate[i])).square().sum()) / weight_sum;
  }
  double largest_shift_in_se = 0.0;
  for (Index i = 0; i < d; ++i) {
    SCOPED_TRACE("coordinate " + std::to_string(i));
    EXPECT_NEAR(estimate[i], exact[i], 5.0 * se[i]);
    largest_shift_in_se = std::max(largest_shift_in_se, std::fabs(exact[i] - mu_v[i]) / se[i]);
  }
  EXPECT_GT(largest_shift_in_se, 10.0);
  std::printf("Monte Carlo attention: estimate [%.4f %.4f %.4f %.4f], affine [%.4f %.4f %.4f %.4f], mu_V shift %.1f SE\n",
              estimate[0], estimate[1], estimate[2], estimate[3], exact[0], exact[1], exact[2], exact[3],
              largest_shift_in_se);
}

/// docs/mechanisms.md#moment-closure-far-field: d_model % n_head ≠ 0 (and n_head ≤ 0), a wrong shape of any input, or a
/// non-finite entry → ValueError.
TEST(AttentionLawTest, InvalidInputsThrow) {
  const uint64_t seed = testing::test_seed(403);
  Rng rng(seed);
  const Index d = 6;
  const Layer l = random_layer(rng, d, 0.5);
  const auto mu = to_tensor(l.mu), sigma = to_tensor(l.sigma), w = to_tensor(l.w), b = to_tensor(l.b),
             p = to_tensor(l.p), pb = to_tensor(l.pb);
  const auto call = [&](const torch::Tensor& m, const torch::Tensor& s, const torch::Tensor& ww,
                        const torch::Tensor& bb, const torch::Tensor& pp, const torch::Tensor& ppb, int64_t heads) {
    return attention_law(GaussianLaw{m, s}, ww, bb, pp, ppb, heads);
  };
  EXPECT_NO_THROW(call(mu, sigma, w, b, p, pb, 3));
  for (const int64_t heads : {4, 5, 0, -2}) {
    EXPECT_THROW(call(mu, sigma, w, b, p, pb, heads), ValueError) << "n_head " << heads;
  }
  const auto nan = std::numeric_limits<double>::quiet_NaN();
  const auto inf = std::numeric_limits<double>::infinity();
  const auto with = [](const torch::Tensor& t, double value) {
    auto c = t.clone();
    c.view(-1)[1] = value;
    return c;
  };
  EXPECT_THROW(call(mu.view({1, d}), sigma, w, b, p, pb, 2), ValueError) << "2-D mean";
  EXPECT_THROW(call(mu, sigma.narrow(1, 0, d - 1), w, b, p, pb, 2), ValueError) << "cov d×(d−1)";
  EXPECT_THROW(call(mu, sigma, w.narrow(0, 0, 3 * d - 1), b, p, pb, 2), ValueError) << "qkv_weight (3d−1)×d";
  EXPECT_THROW(call(mu, sigma, w.t().contiguous(), b, p, pb, 2), ValueError) << "qkv_weight d×3d";
  EXPECT_THROW(call(mu, sigma, w, b.narrow(0, 0, 2 * d), p, pb, 2), ValueError) << "qkv_bias 2d";
  EXPECT_THROW(call(mu, sigma, w, b, p.narrow(0, 0, d - 2), pb, 2), ValueError) << "proj_weight";
  EXPECT_THROW(call(mu, sigma, w, b, p, torch::zeros({d + 1}, torch::kFloat64), 2), ValueError) << "proj_bias";
  EXPECT_THROW(call(with(mu, nan), sigma, w, b, p, pb, 2), ValueError) << "NaN mean";
  EXPECT_THROW(call(mu, with(sigma, inf), w, b, p, pb, 2), ValueError) << "inf cov";
  EXPECT_THROW(call(mu, sigma, with(w, -inf), b, p, pb, 2), ValueError) << "-inf qkv_weight";
  EXPECT_THROW(call(mu, sigma, w, with(b, nan), p, pb, 2), ValueError) << "NaN qkv_bias";
  EXPECT_THROW(call(mu, sigma, w, b, with(p, nan), pb, 2), ValueError) << "NaN proj_weight";
  EXPECT_THROW(call(mu, sigma, w, b, p, with(pb, inf), 2), ValueError) << "inf proj_bias";
}

}  // namespace
}  // namespace attnmix::stream
