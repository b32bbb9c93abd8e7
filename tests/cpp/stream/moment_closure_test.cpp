// SPDX-License-Identifier: Apache-2.0
// Moment-closure attention (docs/mechanisms.md#moment-closure-far-field and docs/porting.md; acceptance rows
// MCA-1…MCA-11).
// MCA-12 (attention_law's exact linear push) is covered by attention_law_test.cpp; MCA-1 below uses
// attention_law as its oracle.
//
// Oracles written here from docs/mechanisms.md#moment-closure-far-field and not from src/stream/moment_closure.cpp:
//   * hand_logit / hand_out: the MGF logit and the affine cluster output of docs/mechanisms.md#moment-closure-far-field
//   by explicit loops in double;
//   * attention_law with a deterministic query path (W_q = 0, b_q = q) for the single-population
//   identity (docs/mechanisms.md#moment-closure-far-field);
//   * pooled_moments: weighted population moments by explicit sums over the tokens, with the bank's
//   cluster as a
//     pseudo-population of n₀ points (mean μ₀, covariance Σ₀), for the Chan/Welford update
//     (docs/mechanisms.md#moment-closure-far-field) and merges;
//   * central finite differences in float64 for gradients (docs/mechanisms.md#moment-closure-far-field: no custom
//     backward);
//   * hand birth statistics, a hand pair scan for merges and a hand misfit receipt (membership,
//   diagonal
//     regression, outliers, weighting) for docs/mechanisms.md#moment-closure-far-field;
//   * naive_mca_logits: a whole MCA step in double by loops (LayerNorm, RoPE pair rotation, the
//   window mask, the
//     joint softmax over near keys and far clusters with the un-rotated query, the MLP, the tied
//     head) (docs/mechanisms.md#moment-closure-far-field);
//   * batch-size-1 runs of every stream for the batch axis (docs/porting.md).
#include "attnmix/stream/moment_closure.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/moment_propagation.hpp"
#include "testing/all_close.hpp"

namespace attnmix::stream {
namespace {

using Vec = std::vector<double>;

/// testing::ExpectAllClose for vectors, also accepting a braced list as the expected values.
void ExpectAllClose(const Vec& actual, const Vec& expected, double rtol, double atol) {
  testing::ExpectAllClose(std::span<const double>(actual), std::span<const double>(expected), rtol,
                          atol);
}

static_assert(ContextMechanism<MomentClosureAttentionImpl>);
static_assert(std::is_base_of_v<std::runtime_error, StateError>);

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
/// Float64 agreement of two computations of the same quantity that differ only by reassociation.
constexpr double kRtol64 = 1e-10;
constexpr double kAtol64 = 1e-12;

torch::TensorOptions f64_options() { return torch::TensorOptions().dtype(torch::kFloat64); }

Vec to_vector(const torch::Tensor& t) {
  const auto c = t.detach().to(torch::kFloat64).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

torch::Tensor f64(const torch::Tensor& t) { return t.detach().to(torch::kFloat64); }

torch::Tensor from_values(const Vec& values, torch::IntArrayRef shape) {
  auto t = torch::empty(shape, f64_options());
  EXPECT_EQ(static_cast<size_t>(t.numel()), values.size());
  std::copy(values.begin(), values.end(), t.data_ptr<double>());
  return t;
}

torch::Tensor normal_tensor(Rng& rng, torch::IntArrayRef shape, double scale = 1.0,
                            double shift = 0.0) {
  auto t = torch::empty(shape, f64_options());
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = shift + scale * rng.normal();
  return t;
}

/// Random rows on the simplex over the last axis.
torch::Tensor random_simplex(Rng& rng, torch::IntArrayRef shape) {
  return torch::softmax(normal_tensor(rng, shape), -1);
}

/// (b, t) int64 ids drawn uniformly from [lo, hi).
torch::Tensor random_tokens(Rng& rng, int64_t b, int64_t t, int64_t lo, int64_t hi) {
  auto out = torch::empty({b, t}, torch::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    p[i] = lo + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(hi - lo)));
  }
  return out;
}

template <class E, class F>
void expect_throw_containing(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing \"" << needle << "\"";
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

// ----- one cluster's statistics in double
// ---------------------------------------------------------------------------

struct SlotStats {
  double count = 0.0;
  Vec mu_k, mu_v, sigma_kk;
  Vec sigma_vk;  ///< d×d row-major, row = value dim
};

void set_slot(ClusterBank& bank, int64_t b, int64_t h, int64_t c, const SlotStats& s) {
  const int64_t d = bank.mu_k.size(3);
  bank.count.index_put_({b, h, c}, s.count);
  bank.mu_k.select(0, b).select(0, h).select(0, c).copy_(from_values(s.mu_k, {d}));
  bank.mu_v.select(0, b).select(0, h).select(0, c).copy_(from_values(s.mu_v, {d}));
  bank.sigma_kk.select(0, b).select(0, h).select(0, c).copy_(from_values(s.sigma_kk, {d}));
  bank.sigma_vk.select(0, b).select(0, h).select(0, c).copy_(from_values(s.sigma_vk, {d, d}));
}

SlotStats slot_stats(const ClusterBank& bank, int64_t b, int64_t h, int64_t c) {
  SlotStats s;
  s.count = f64(bank.count.select(0, b).select(0, h).select(0, c)).item<double>();
  s.mu_k = to_vector(bank.mu_k.select(0, b).select(0, h).select(0, c));
  s.mu_v = to_vector(bank.mu_v.select(0, b).select(0, h).select(0, c));
  s.sigma_kk = to_vector(bank.sigma_kk.select(0, b).select(0, h).select(0, c));
  s.sigma_vk = to_vector(bank.sigma_vk.select(0, b).select(0, h).select(0, c));
  return s;
}

void expect_slot_close(const SlotStats& actual, const SlotStats& expected, double rtol,
                       double atol) {
  EXPECT_NEAR(actual.count, expected.count, atol + rtol * std::fabs(expected.count));
  ExpectAllClose(actual.mu_k, expected.mu_k, rtol, atol);
  ExpectAllClose(actual.mu_v, expected.mu_v, rtol, atol);
  ExpectAllClose(actual.sigma_kk, expected.sigma_kk, rtol, atol);
  ExpectAllClose(actual.sigma_vk, expected.sigma_vk, rtol, atol);
}

void expect_slot_zero(const ClusterBank& bank, int64_t b, int64_t c) {
  for (int64_t h = 0; h < bank.mu_k.size(1); ++h) {
    const SlotStats s = slot_stats(bank, b, h, c);
    EXPECT_EQ(s.count, 0.0);
    for (const Vec* field : {&s.mu_k, &s.mu_v, &s.sigma_kk, &s.sigma_vk}) {
      for (const double x : *field) EXPECT_EQ(x, 0.0);
    }
  }
}

SlotStats uniform_slot(int64_t d, double count, const Vec& mu_k, const Vec& mu_v, double sigma2,
                       double sigma_vk_diag) {
  SlotStats s;
  s.count = count;
  s.mu_k = mu_k;
  s.mu_v = mu_v;
  s.sigma_kk.assign(static_cast<size_t>(d), sigma2);
  s.sigma_vk.assign(static_cast<size_t>(d * d), 0.0);
  for (int64_t a = 0; a < d; ++a) s.sigma_vk[static_cast<size_t>(a * d + a)] = sigma_vk_diag;
  return s;
}

SlotStats random_slot(Rng& rng, int64_t d, double count) {
  SlotStats s;
  s.count = count;
  for (int64_t a = 0; a < d; ++a) {
    s.mu_k.push_back(rng.normal());
    s.mu_v.push_back(rng.normal());
    s.sigma_kk.push_back(0.2 + 1.3 * rng.uniform());
  }
  for (int64_t a = 0; a < d * d; ++a) s.sigma_vk.push_back(0.3 * rng.normal());
  return s;
}

/// A float64 bank whose first n_clusters[b] slots of stream b hold random statistics (counts in [1,
/// 10)).
ClusterBank random_bank(Rng& rng, int64_t B, int64_t H, int64_t C, int64_t d,
                        const std::vector<int64_t>& n_clusters) {
  auto bank = empty_cluster_bank(B, H, C, d, f64_options());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t c = 0; c < n_clusters[static_cast<size_t>(b)]; ++c) {
        set_slot(bank, b, h, c, random_slot(rng, d, 1.0 + 9.0 * rng.uniform()));
      }
    }
  }
  bank.n_clusters = n_clusters;
  return bank;
}

/// logit_c(q) of docs/mechanisms.md#moment-closure-far-field by loops.
double hand_logit(const Vec& q, const SlotStats& s) {
  const double d = static_cast<double>(q.size());
  double lin = 0.0, quad = 0.0;
  for (size_t a = 0; a < q.size(); ++a) {
    lin += q[a] * s.mu_k[a];
    quad += q[a] * q[a] * s.sigma_kk[a];
  }
  return lin / std::sqrt(d) + quad / (2.0 * d) + std::log(std::max(s.count, 1e-8));
}

/// The misfit receipt's regression residual ||v − (μ_v + Σ_vk ((k − μ_k) / max(σ², 1e-6)))||
/// (docs/mechanisms.md#moment-closure-far-field) by loops.
double hand_residual(const Vec& k, const Vec& v, const SlotStats& s) {
  const size_t d = k.size();
  double norm2 = 0.0;
  for (size_t a = 0; a < d; ++a) {
    double pred = s.mu_v[a];
    for (size_t e = 0; e < d; ++e)
      pred += s.sigma_vk[a * d + e] * (k[e] - s.mu_k[e]) / std::max(s.sigma_kk[e], 1e-6);
    norm2 += (v[a] - pred) * (v[a] - pred);
  }
  return std::sqrt(norm2);
}

/// out_c(q) = μ_v + Σ_vk q / √d by loops.
Vec hand_out(const Vec& q, const SlotStats& s) {
  const size_t d = q.size();
  Vec out(d);
  for (size_t a = 0; a < d; ++a) {
    double acc = 0.0;
    for (size_t e = 0; e < d; ++e) acc += s.sigma_vk[a * d + e] * q[e];
    out[a] = s.mu_v[a] + acc / std::sqrt(static_cast<double>(d));
  }
  return out;
}

/// One token's (head) vector of x (B, t, H, d).
Vec token(const torch::Tensor& x, int64_t b, int64_t i, int64_t h) {
  return to_vector(x.select(0, b).select(0, i).select(0, h));
}

/// The population moments of a pseudo-population of base.count points with mean base.μ and
/// covariance base.Σ, pooled with tokens (k_i, v_i) of weight w_i: n = n₀ + Σw, μ = (n₀μ₀ + Σ w
/// x)/n, σ² = [n₀(σ₀² + (μk₀ − μk)²) + Σ w (k − μk)²]/n, Σ_vk = [n₀(Σ₀ + (μv₀ − μv)(μk₀ − μk)ᵀ) + Σ
/// w (v − μv)(k − μk)ᵀ]/n.
SlotStats pooled_moments(const SlotStats& base, const std::vector<Vec>& ks,
                         const std::vector<Vec>& vs, const Vec& w) {
  const size_t d = base.mu_k.size();
  SlotStats out;
  out.count = base.count;
  out.mu_k.assign(d, 0.0);
  out.mu_v.assign(d, 0.0);
  for (size_t a = 0; a < d; ++a) {
    out.mu_k[a] = base.count * base.mu_k[a];
    out.mu_v[a] = base.count * base.mu_v[a];
  }
  for (size_t i = 0; i < ks.size(); ++i) {
    out.count += w[i];
    for (size_t a = 0; a < d; ++a) {
      out.mu_k[a] += w[i] * ks[i][a];
      out.mu_v[a] += w[i] * vs[i][a];
    }
  }
  for (size_t a = 0; a < d; ++a) {
    out.mu_k[a] /= out.count;
    out.mu_v[a] /= out.count;
  }
  out.sigma_kk.assign(d, 0.0);
  out.sigma_vk.assign(d * d, 0.0);
  for (size_t a = 0; a < d; ++a) {
    const double dk0 = base.mu_k[a] - out.mu_k[a];
    out.sigma_kk[a] = base.count * (base.sigma_kk[a] + dk0 * dk0);
    for (size_t e = 0; e < d; ++e) {
      out.sigma_vk[a * d + e] =
          base.count *
          (base.sigma_vk[a * d + e] + (base.mu_v[a] - out.mu_v[a]) * (base.mu_k[e] - out.mu_k[e]));
    }
  }
  for (size_t i = 0; i < ks.size(); ++i) {
    for (size_t a = 0; a < d; ++a) {
      out.sigma_kk[a] += w[i] * (ks[i][a] - out.mu_k[a]) * (ks[i][a] - out.mu_k[a]);
      for (size_t e = 0; e < d; ++e) {
        out.sigma_vk[a * d + e] += w[i] * (vs[i][a] - out.mu_v[a]) * (ks[i][e] - out.mu_k[e]);
      }
    }
  }
  for (auto& x : out.sigma_kk) x /= out.count;
  for (auto& x : out.sigma_vk) x /= out.count;
  return out;
}

SlotStats empty_slot(size_t d) {
  SlotStats s;
  s.mu_k.assign(d, 0.0);
  s.mu_v.assign(d, 0.0);
  s.sigma_kk.assign(d, 0.0);
  s.sigma_vk.assign(d * d, 0.0);
  return s;
}

/// Pooled combination of two clusters = pooled_moments of a as base with b as one weighted "token"
/// plus b's spread.
SlotStats pooled_pair(const SlotStats& a, const SlotStats& b) {
  // Treat b as a pseudo-population too: pool a with b's mean (weight n_b), then add b's own spread.
  SlotStats out = pooled_moments(a, {b.mu_k}, {b.mu_v}, {b.count});
  for (size_t x = 0; x < out.sigma_kk.size(); ++x)
    out.sigma_kk[x] += b.count * b.sigma_kk[x] / out.count;
  for (size_t x = 0; x < out.sigma_vk.size(); ++x)
    out.sigma_vk[x] += b.count * b.sigma_vk[x] / out.count;
  return out;
}

/// The birth statistics of docs/mechanisms.md#moment-closure-far-field for one stream and head: count t, means, floored
/// population variances and the population cross-covariance.
SlotStats hand_birth(const torch::Tensor& k, const torch::Tensor& v, int64_t b, int64_t h) {
  const int64_t t = k.size(1);
  std::vector<Vec> ks, vs;
  for (int64_t i = 0; i < t; ++i) {
    ks.push_back(token(k, b, i, h));
    vs.push_back(token(v, b, i, h));
  }
  SlotStats s = pooled_moments(empty_slot(static_cast<size_t>(k.size(3))), ks, vs,
                               Vec(static_cast<size_t>(t), 1.0));
  for (auto& x : s.sigma_kk) x = std::max(x, 1e-6);
  return s;
}

// ----- docs/mechanisms.md#moment-closure-far-field MGF logits and outputs
// ---------------------------------------------------------------------------------

/// MCA-1: with one live cluster whose moments are those of a Gaussian layer input pushed through
/// qkv, the MGF output equals attention_law's mean (proj = identity, and a query path W_q = 0, b_q
/// = q that makes the query deterministic), atol 1e-8 rtol 1e-6, for three queries and two heads;
/// the logit equals the docs/mechanisms.md#moment-closure-far-field formula by hand.
TEST(MomentClosureTest, OneClusterOutputEqualsAttentionLawMean) {
  const uint64_t seed = testing::test_seed(701);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t D = 8, H = 2, hd = 4, t = 3;
  const auto mu_h = normal_tensor(rng, {D}, 0.5);
  const auto root = normal_tensor(rng, {D, D});
  const auto sigma_h =
      root.mm(root.t()) / static_cast<double>(D) + 0.2 * torch::eye(D, f64_options());
  auto w = normal_tensor(rng, {3 * D, D}, 0.6);
  w.narrow(0, 0, D).zero_();
  const auto bias = normal_tensor(rng, {3 * D}, 0.3);

  // The moments of [q; k; v] by explicit sums over the input law.
  const auto wa = w.accessor<double, 2>();
  const auto ma = mu_h.accessor<double, 1>();
  const auto sa = sigma_h.accessor<double, 2>();
  const auto ba = bias.accessor<double, 1>();
  const auto mean_of = [&](int64_t i) {
    double s = ba[i];
    for (int64_t a = 0; a < D; ++a) s += wa[i][a] * ma[a];
    return s;
  };
  const auto cov_of = [&](int64_t i, int64_t j) {
    double s = 0.0;
    for (int64_t a = 0; a < D; ++a) {
      for (int64_t c = 0; c < D; ++c) s += wa[i][a] * sa[a][c] * wa[j][c];
    }
    return s;
  };
  auto bank = empty_cluster_bank(1, H, 2, hd, f64_options());
  std::vector<SlotStats> slots;
  for (int64_t h = 0; h < H; ++h) {
    SlotStats s;
    s.count = 7.0;
    for (int64_t a = 0; a < hd; ++a) {
      s.mu_k.push_back(mean_of(D + h * hd + a));
      s.mu_v.push_back(mean_of(2 * D + h * hd + a));
      s.sigma_kk.push_back(cov_of(D + h * hd + a, D + h * hd + a));
      for (int64_t e = 0; e < hd; ++e)
        s.sigma_vk.push_back(cov_of(2 * D + h * hd + a, D + h * hd + e));
    }
    set_slot(bank, 0, h, 0, s);
    slots.push_back(s);
  }
  bank.n_clusters = {1};

  const auto q = normal_tensor(rng, {1, t, H, hd});
  const auto result = mgf_cluster_attention(q, bank);
  ASSERT_EQ(result.out.sizes(), torch::IntArrayRef({1, t, 1, H, hd}));
  ASSERT_EQ(result.logits.sizes(), torch::IntArrayRef({1, t, 1, H}));
  for (int64_t i = 0; i < t; ++i) {
    SCOPED_TRACE("query " + std::to_string(i));
    auto b_i = bias.clone();
    b_i.narrow(0, 0, D).copy_(q.select(0, 0).select(0, i).reshape({D}));
    const auto law = attention_law(GaussianLaw{mu_h, sigma_h}, w, b_i, torch::eye(D, f64_options()),
                                   torch::zeros({D}, f64_options()), H);
    const Vec out = to_vector(result.out.select(0, 0).select(0, i).select(0, 0).reshape({D}));
    ExpectAllClose(out, to_vector(law.law.mean), 1e-6, 1e-8);
    for (int64_t h = 0; h < H; ++h) {
      const Vec qh = token(q, 0, i, h);
      EXPECT_NEAR(result.logits[0][i][0][h].item<double>(),
                  hand_logit(qh, slots[static_cast<size_t>(h)]), 1e-12);
      ExpectAllClose(to_vector(result.out[0][i][0][h]), hand_out(qh, slots[static_cast<size_t>(h)]),
                     1e-12, 1e-12);
    }
  }
}

/// docs/mechanisms.md#moment-closure-far-field: per stream, live slots get the hand logit and output; slots beyond a
/// stream's live prefix get logit −∞ and output exactly 0; n = max_b n_clusters (streams 2, 0 and 3 live clusters
/// of C = 4).
TEST(MomentClosureTest, DeadSlotsGetMinusInfinityAndZeroOutput) {
  const uint64_t seed = testing::test_seed(702);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t B = 3, H = 2, C = 4, d = 3, t = 2;
  const auto bank = random_bank(rng, B, H, C, d, {2, 0, 3});
  const auto q = normal_tensor(rng, {B, t, H, d});
  const auto result = mgf_cluster_attention(q, bank);
  ASSERT_EQ(result.out.sizes(), torch::IntArrayRef({B, t, 3, H, d}));
  ASSERT_EQ(result.logits.sizes(), torch::IntArrayRef({B, t, 3, H}));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t c = 0; c < 3; ++c) {
        for (int64_t h = 0; h < H; ++h) {
          SCOPED_TRACE("stream " + std::to_string(b) + " query " + std::to_string(i) + " slot " +
                       std::to_string(c));
          const double logit = result.logits[b][i][c][h].item<double>();
          const Vec out = to_vector(result.out[b][i][c][h]);
          if (c < bank.n_clusters[static_cast<size_t>(b)]) {
            const SlotStats s = slot_stats(bank, b, h, c);
            EXPECT_NEAR(logit, hand_logit(token(q, b, i, h), s), 1e-12);
            ExpectAllClose(out, hand_out(token(q, b, i, h), s), 1e-12, 1e-12);
          } else {
            EXPECT_EQ(logit, -kInf);
            for (const double x : out) EXPECT_EQ(x, 0.0);
          }
        }
      }
    }
  }
}

/// docs/mechanisms.md#moment-closure-far-field: with no live cluster in any stream both tensors are empty, (B, t, 0, H,
/// d) and (B, t, 0, H).
TEST(MomentClosureTest, NoClustersGivesEmptyTensors) {
  const auto bank = empty_cluster_bank(2, 2, 3, 4, f64_options());
  const auto q = torch::ones({2, 5, 2, 4}, f64_options());
  const auto result = mgf_cluster_attention(q, bank);
  EXPECT_EQ(result.out.sizes(), torch::IntArrayRef({2, 5, 0, 2, 4}));
  EXPECT_EQ(result.logits.sizes(), torch::IntArrayRef({2, 5, 0, 2}));
  EXPECT_EQ(cluster_responsibilities(q, bank).sizes(), torch::IntArrayRef({2, 5, 2, 3}));
  EXPECT_EQ(cluster_responsibilities(q, bank).abs().sum().item<double>(), 0.0);
}

/// docs/mechanisms.md#moment-closure-far-field: cluster_responsibilities is (B, t, H, C) = softmax of the hand logits
/// (the token's key as the query) over the stream's live slots; rows sum to 1 over live slots, entries beyond
/// them are exactly 0, and a stream without clusters gets all zeros.
TEST(MomentClosureTest, ResponsibilitiesAreSoftmaxOverLiveSlots) {
  const uint64_t seed = testing::test_seed(703);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t B = 3, H = 2, C = 4, d = 3, t = 4;
  const auto bank = random_bank(rng, B, H, C, d, {2, 0, 3});
  const auto k = normal_tensor(rng, {B, t, H, d});
  const auto r = cluster_responsibilities(k, bank);
  ASSERT_EQ(r.sizes(), torch::IntArrayRef({B, t, H, C}));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = bank.n_clusters[static_cast<size_t>(b)];
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t h = 0; h < H; ++h) {
        SCOPED_TRACE("stream " + std::to_string(b) + " token " + std::to_string(i) + " head " +
                     std::to_string(h));
        const Vec row = to_vector(r[b][i][h]);
        Vec logits;
        for (int64_t c = 0; c < n; ++c)
          logits.push_back(hand_logit(token(k, b, i, h), slot_stats(bank, b, h, c)));
        Vec expected(static_cast<size_t>(C), 0.0);
        if (n > 0) {
          const double top = *std::max_element(logits.begin(), logits.end());
          double z = 0.0;
          for (const double l : logits) z += std::exp(l - top);
          for (int64_t c = 0; c < n; ++c)
            expected[static_cast<size_t>(c)] = std::exp(logits[c] - top) / z;
          EXPECT_NEAR(std::accumulate(row.begin(), row.begin() + n, 0.0), 1.0, 1e-12);
        }
        ExpectAllClose(row, expected, 1e-12, 1e-14);
        for (int64_t c = n; c < C; ++c) EXPECT_EQ(row[static_cast<size_t>(c)], 0.0);
      }
    }
  }
}

// ----- gradients
// ---------------------------------------------------------------------------------------------------

using ScalarFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;

/// Autograd against central differences (eps 1e-6) for every element of every input: |a − n| ≤ 1e-4
/// + 1e-3|n| (gradcheck's criterion with atol 1e-4); every analytic entry finite and non-zero.
void check_gradients(const ScalarFn& f, const std::vector<torch::Tensor>& inputs,
                     const std::vector<std::string>& names) {
  constexpr double kEps = 1e-6;
  std::vector<torch::Tensor> leaves;
  for (const auto& x : inputs) leaves.push_back(x.detach().clone().requires_grad_(true));
  const auto value = f(leaves);
  const auto grads =
      torch::autograd::grad({value}, leaves, {}, false, false, /*allow_unused=*/true);
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < inputs.size(); ++i) {
    SCOPED_TRACE("gradient with respect to " + names[i]);
    ASSERT_TRUE(grads[i].defined());
    const Vec analytic = to_vector(grads[i]);
    std::vector<torch::Tensor> args;
    for (const auto& x : inputs) args.push_back(x.detach().clone());
    double* p = args[i].data_ptr<double>();
    Vec numeric(analytic.size());
    int64_t zeros = 0, non_finite = 0;
    for (size_t e = 0; e < analytic.size(); ++e) {
      const double saved = p[e];
      p[e] = saved + kEps;
      const double plus = f(args).item<double>();
      p[e] = saved - kEps;
      const double minus = f(args).item<double>();
      p[e] = saved;
      numeric[e] = (plus - minus) / (2.0 * kEps);
      zeros += analytic[e] == 0.0 ? 1 : 0;
      non_finite += std::isfinite(analytic[e]) ? 0 : 1;
    }
    EXPECT_EQ(zeros, 0);
    EXPECT_EQ(non_finite, 0);
    ExpectAllClose(analytic, numeric, 1e-3, 1e-4);
  }
}

ClusterBank bank_from(const std::vector<torch::Tensor>& fields,
                      const std::vector<int64_t>& n_clusters, int64_t C) {
  ClusterBank bank;
  bank.count = fields[0];
  bank.mu_k = fields[1];
  bank.mu_v = fields[2];
  bank.sigma_kk = fields[3];
  bank.sigma_vk = fields[4];
  bank.n_clusters = n_clusters;
  bank.max_clusters = C;
  return bank;
}

torch::Tensor weighted_bank_sum(const ClusterBank& bank,
                                const std::vector<torch::Tensor>& weights) {
  return (bank.count * weights[0]).sum() + (bank.mu_k * weights[1]).sum() +
         (bank.mu_v * weights[2]).sum() + (bank.sigma_kk * weights[3]).sum() +
         (bank.sigma_vk * weights[4]).sum();
}

std::vector<torch::Tensor> random_bank_weights(Rng& rng, int64_t B, int64_t H, int64_t C,
                                               int64_t d) {
  return {normal_tensor(rng, {B, H, C}), normal_tensor(rng, {B, H, C, d}),
          normal_tensor(rng, {B, H, C, d}), normal_tensor(rng, {B, H, C, d}),
          normal_tensor(rng, {B, H, C, d, d})};
}

/// MCA-2 (mgf_cluster_attention): float64 gradients of Σ W₁⊙out + Σ W₂⊙logits with respect to q,
/// count, μ_k, μ_v, σ²_kk and Σ_vk equal central differences (every slot live, so every entry
/// matters).
TEST(MomentClosureTest, MgfAttentionGradientsMatchFiniteDifferences) {
  const uint64_t seed = testing::test_seed(704);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t B = 2, t = 3, H = 2, C = 2, d = 3;
  const auto base = random_bank(rng, B, H, C, d, {C, C});
  const auto w_out = normal_tensor(rng, {B, t, C, H, d});
  const auto w_logit = normal_tensor(rng, {B, t, C, H});
  const ScalarFn f = [&](const std::vector<torch::Tensor>& x) {
    const auto bank = bank_from({x[1], x[2], x[3], x[4], x[5]}, {C, C}, C);
    const auto r = mgf_cluster_attention(x[0], bank);
    return (r.out * w_out).sum() + (r.logits * w_logit).sum();
  };
  check_gradients(f,
                  {normal_tensor(rng, {B, t, H, d}), base.count, base.mu_k, base.mu_v,
                   base.sigma_kk, base.sigma_vk},
                  {"q", "count", "mu_k", "mu_v", "sigma_kk", "sigma_vk"});
}

/// MCA-2 (update_cluster_bank): float64 gradients of a random-weighted sum of every updated field
/// with respect to count, μ_k, μ_v, σ²_kk, Σ_vk, k, v and r equal central differences.
TEST(MomentClosureTest, UpdateGradientsMatchFiniteDifferences) {
  const uint64_t seed = testing::test_seed(705);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t B = 2, t = 3, H = 2, C = 3, d = 3;
  const auto base = random_bank(rng, B, H, C, d, {C, C});
  const auto weights = random_bank_weights(rng, B, H, C, d);
  const ScalarFn f = [&](const std::vector<torch::Tensor>& x) {
    const auto bank = bank_from({x[0], x[1], x[2], x[3], x[4]}, {C, C}, C);
    return weighted_bank_sum(update_cluster_bank(bank, x[5], x[6], x[7]), weights);
  };
  check_gradients(f,
                  {base.count, base.mu_k, base.mu_v, base.sigma_kk, base.sigma_vk,
                   normal_tensor(rng, {B, t, H, d}), normal_tensor(rng, {B, t, H, d}),
                   random_simplex(rng, {B, t, H, C})},
                  {"count", "mu_k", "mu_v", "sigma_kk", "sigma_vk", "k", "v", "r"});
}

/// docs/mechanisms.md#moment-closure-far-field "gradients flow through the soft-update path (responsibilities and raw
/// k/v)": the bank after ingest_cluster_batch (two live clusters per stream, no birth, no merge) has float64
/// gradients with respect to k and v that equal central differences.
TEST(MomentClosureTest, IngestSoftPathGradientsMatchFiniteDifferences) {
  const uint64_t seed = testing::test_seed(706);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t B = 2, t = 3, H = 2, C = 3, d = 2;
  const auto bank = random_bank(rng, B, H, C, d, {2, 2});
  const auto weights = random_bank_weights(rng, B, H, C, d);
  BirthMergeOptions o;
  o.birth_threshold = -1e6;
  o.merge_threshold = 0.0;
  const ScalarFn f = [&](const std::vector<torch::Tensor>& x) {
    const auto result = ingest_cluster_batch(bank, x[0], x[1], o);
    EXPECT_TRUE(result.receipts[0].soft_update_applied && result.receipts[1].soft_update_applied);
    return weighted_bank_sum(result.bank, weights);
  };
  check_gradients(f, {normal_tensor(rng, {B, t, H, d}), normal_tensor(rng, {B, t, H, d})},
                  {"k", "v"});
}

/// docs/mechanisms.md#moment-closure-far-field "birth decisions and birth statistics are detached": ingesting into a
/// bank where stream 0 is empty (it births) and stream 1 has one cluster (soft update), the gradient of stream
/// 0's statistics with respect to k is exactly zero and that of stream 1's statistics with respect
/// to its own tokens is not.
TEST(MomentClosureTest, BirthStatisticsCarryNoGradient) {
  const uint64_t seed = testing::test_seed(707);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t B = 2, t = 3, H = 2, C = 3, d = 2;
  const auto bank = random_bank(rng, B, H, C, d, {0, 1});
  BirthMergeOptions o;
  o.birth_threshold = -1e6;  // the empty stream births (best = −∞), the other never does
  const auto k = normal_tensor(rng, {B, t, H, d}).requires_grad_(true);
  const auto v = normal_tensor(rng, {B, t, H, d}).requires_grad_(true);
  const auto result = ingest_cluster_batch(bank, k, v, o);
  ASSERT_TRUE(result.receipts[0].birthed);
  ASSERT_FALSE(result.receipts[0].soft_update_applied);
  ASSERT_FALSE(result.receipts[1].birthed);
  ASSERT_TRUE(result.receipts[1].soft_update_applied);
  const auto weights = random_bank_weights(rng, B, H, C, d);
  const auto stream_sum = [&](int64_t b) {
    return (result.bank.count[b] * weights[0][b]).sum() +
           (result.bank.mu_k[b] * weights[1][b]).sum() +
           (result.bank.mu_v[b] * weights[2][b]).sum() +
           (result.bank.sigma_kk[b] * weights[3][b]).sum() +
           (result.bank.sigma_vk[b] * weights[4][b]).sum();
  };
  const auto g0 = torch::autograd::grad({stream_sum(0)}, {k, v}, {}, true, false, true);
  for (const auto& g : g0) {
    if (g.defined()) {
      EXPECT_EQ(g.abs().max().item<double>(), 0.0);
    }
  }
  const auto g1 = torch::autograd::grad({stream_sum(1)}, {k, v}, {}, false, false, true);
  ASSERT_TRUE(g1[0].defined() && g1[1].defined());
  EXPECT_GT(g1[0][1].abs().max().item<double>(), 0.0);
  EXPECT_GT(g1[1][1].abs().max().item<double>(), 0.0);
  EXPECT_EQ(g1[0][0].abs().max().item<double>(),
            0.0);  // stream 1's bank does not see stream 0's tokens
  EXPECT_EQ(g1[1][0].abs().max().item<double>(), 0.0);
}

// ----- docs/mechanisms.md#moment-closure-far-field the Chan/Welford update
// ------------------------------------------------------------------------------

void expect_banks_close(const ClusterBank& actual, const ClusterBank& expected, double count_atol,
                        double rtol, double atol) {
  EXPECT_EQ(actual.n_clusters, expected.n_clusters);
  EXPECT_EQ(actual.max_clusters, expected.max_clusters);
  ExpectAllClose(to_vector(actual.count), to_vector(expected.count), 0.0, count_atol);
  ExpectAllClose(to_vector(actual.mu_k), to_vector(expected.mu_k), rtol, atol);
  ExpectAllClose(to_vector(actual.mu_v), to_vector(expected.mu_v), rtol, atol);
  ExpectAllClose(to_vector(actual.sigma_kk), to_vector(expected.sigma_kk), rtol, atol);
  ExpectAllClose(to_vector(actual.sigma_vk), to_vector(expected.sigma_vk), rtol, atol);
}

/// The bank that pooled_moments predicts for tokens k, v with weights r on top of `start`.
void expect_bank_is_pooled_population(const ClusterBank& actual, const ClusterBank& start,
                                      const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& r, double rtol, double atol) {
  const int64_t B = k.size(0), t = k.size(1), H = k.size(2), C = start.max_clusters;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t c = 0; c < C; ++c) {
        SCOPED_TRACE("stream " + std::to_string(b) + " head " + std::to_string(h) + " cluster " +
                     std::to_string(c));
        std::vector<Vec> ks, vs;
        Vec w;
        for (int64_t i = 0; i < t; ++i) {
          ks.push_back(token(k, b, i, h));
          vs.push_back(token(v, b, i, h));
          w.push_back(r[b][i][h][c].item<double>());
        }
        expect_slot_close(slot_stats(actual, b, h, c),
                          pooled_moments(slot_stats(start, b, h, c), ks, vs, w), rtol, atol);
      }
    }
  }
}

/// MCA-3: two sequential update_cluster_bank calls (B 2, H 2, C 3, d 4, t 5 then 7, random softmax
/// r, float64) equal one call on the 12 tokens (count atol 1e-8; moments atol 1e-6 rtol 1e-5), from
/// an empty bank and from a random one; both equal the brute-force weighted population moments
/// pooled with the starting cluster by hand.
TEST(MomentClosureTest, SequentialUpdatesEqualOneBatch) {
  const uint64_t seed = testing::test_seed(708);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t B = 2, H = 2, C = 3, d = 4;
  const auto k1 = normal_tensor(rng, {B, 5, H, d}), v1 = normal_tensor(rng, {B, 5, H, d});
  const auto k2 = normal_tensor(rng, {B, 7, H, d}), v2 = normal_tensor(rng, {B, 7, H, d});
  const auto r1 = random_simplex(rng, {B, 5, H, C}), r2 = random_simplex(rng, {B, 7, H, C});
  const auto k = torch::cat({k1, k2}, 1), v = torch::cat({v1, v2}, 1), r = torch::cat({r1, r2}, 1);
  for (const bool empty : {true, false}) {
    SCOPED_TRACE(empty ? "from an empty bank" : "from a random bank");
    auto start = empty ? empty_cluster_bank(B, H, C, d, f64_options())
                       : random_bank(rng, B, H, C, d, {C, C});
    if (empty) start.n_clusters = {C, C};  // live but empty slots: n₀ = 0 yields the batch moments
    const auto sequential = update_cluster_bank(update_cluster_bank(start, k1, v1, r1), k2, v2, r2);
    const auto batch = update_cluster_bank(start, k, v, r);
    expect_banks_close(sequential, batch, 1e-8, 1e-5, 1e-6);
    expect_bank_is_pooled_population(sequential, start, k, v, r, 1e-10, 1e-12);
    expect_bank_is_pooled_population(batch, start, k, v, r, 1e-10, 1e-12);
  }
}

/// docs/mechanisms.md#moment-closure-far-field: a slot that receives no responsibility (n₁ = 0) is left unchanged,
/// including a dead all-zero slot.
TEST(MomentClosureTest, UpdateWithZeroResponsibilityLeavesSlotUnchanged) {
  const uint64_t seed = testing::test_seed(709);
  Rng rng(seed);
  const int64_t B = 1, H = 2, C = 3, d = 3, t = 4;
  const auto bank = random_bank(rng, B, H, C, d, {2});
  auto r = random_simplex(rng, {B, t, H, C});
  r.narrow(3, 1, 2).zero_();
  r.narrow(3, 0, 1).fill_(1.0);
  const auto out = update_cluster_bank(bank, normal_tensor(rng, {B, t, H, d}),
                                       normal_tensor(rng, {B, t, H, d}), r);
  for (int64_t h = 0; h < H; ++h) {
    expect_slot_close(slot_stats(out, 0, h, 1), slot_stats(bank, 0, h, 1), 1e-14, 1e-15);
  }
  expect_slot_zero(out, 0, 2);
  EXPECT_NEAR(out.count[0][0][0].item<double>(), bank.count[0][0][0].item<double>() + t, 1e-12);
}

// ----- docs/mechanisms.md#moment-closure-far-field birth
// -----------------------------------------------------------------------------------------------

/// MCA-4: an empty bank plus 8 tokens around +5 (σ 0.1, d 3, two heads, threshold −2) births
/// cluster 0 with the hand birth statistics; then 8 tokens around −5 birth cluster 1 (cluster 0
/// unchanged); then a third chunk around +5 does not birth and goes through the soft update (every
/// head's total grows by 8).
TEST(MomentClosureTest, BirthsForFarChunksOnly) {
  const uint64_t seed = testing::test_seed(710);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t H = 2, C = 4, d = 3, t = 8;
  BirthMergeOptions o;
  o.birth_threshold = -2.0;
  const auto k1 = normal_tensor(rng, {1, t, H, d}, 0.1, 5.0), v1 = normal_tensor(rng, {1, t, H, d});
  const auto k2 = normal_tensor(rng, {1, t, H, d}, 0.1, -5.0),
             v2 = normal_tensor(rng, {1, t, H, d});
  const auto k3 = normal_tensor(rng, {1, t, H, d}, 0.1, 5.0), v3 = normal_tensor(rng, {1, t, H, d});

  const auto first = ingest_cluster_batch(empty_cluster_bank(1, H, C, d, f64_options()), k1, v1, o);
  EXPECT_EQ(first.bank.n_clusters, std::vector<int64_t>{1});
  EXPECT_TRUE(first.receipts[0].birthed);
  EXPECT_TRUE(first.receipts[0].birth_incorporated_batch);
  EXPECT_FALSE(first.receipts[0].soft_update_applied);
  EXPECT_TRUE(first.receipts[0].merged.empty());
  for (int64_t h = 0; h < H; ++h)
    expect_slot_close(slot_stats(first.bank, 0, h, 0), hand_birth(k1, v1, 0, h), 1e-12, 1e-12);

  const auto second = ingest_cluster_batch(first.bank, k2, v2, o);
  EXPECT_EQ(second.bank.n_clusters, std::vector<int64_t>{2});
  EXPECT_TRUE(second.receipts[0].birthed);
  EXPECT_TRUE(second.receipts[0].birth_incorporated_batch);
  EXPECT_FALSE(second.receipts[0].soft_update_applied);
  EXPECT_TRUE(second.receipts[0].merged.empty());
  for (int64_t h = 0; h < H; ++h) {
    expect_slot_close(slot_stats(second.bank, 0, h, 0), hand_birth(k1, v1, 0, h), 1e-12, 1e-12);
    expect_slot_close(slot_stats(second.bank, 0, h, 1), hand_birth(k2, v2, 0, h), 1e-12, 1e-12);
    EXPECT_EQ(slot_stats(second.bank, 0, h, 1).count, 8.0);
  }
  expect_slot_zero(second.bank, 0, 2);
  expect_slot_zero(second.bank, 0, 3);
  // birth_and_merge alone makes the same birth.
  const auto alone = birth_and_merge(first.bank, k2, v2, o);
  EXPECT_TRUE(alone.receipts[0].birthed);
  expect_banks_close(alone.bank, second.bank, 0.0, 0.0, 0.0);

  const auto third = ingest_cluster_batch(second.bank, k3, v3, o);
  EXPECT_EQ(third.bank.n_clusters, std::vector<int64_t>{2});
  EXPECT_FALSE(third.receipts[0].birthed);
  EXPECT_FALSE(third.receipts[0].birth_incorporated_batch);
  EXPECT_TRUE(third.receipts[0].soft_update_applied);
  EXPECT_TRUE(third.receipts[0].count_conserved);
  ExpectAllClose(third.receipts[0].ingested_tokens_per_head, {8.0, 8.0}, 0.0, 1e-10);
  ExpectAllClose(to_vector(third.bank.total_per_head()), {24.0, 24.0}, 0.0, 1e-10);
}

/// The budget rule: every chunk births its own cluster while a slot is free, even a chunk the threshold rule would
/// absorb (its mean key fits the first cluster) and clusters the threshold rule would merge; when the bank is full,
/// the closest pair merges first to make room. Oracle: the merged cluster's moments are the birth moments of the two
/// chunks' tokens taken together (pooled population moments are the moments of the union).
TEST(MomentClosureTest, BudgetRuleBirthsEveryChunkAndMakesRoomByTheClosestPair) {
  const uint64_t seed = testing::test_seed(715);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t H = 2, C = 3, d = 3, t = 8;
  const auto k1 = normal_tensor(rng, {1, t, H, d}, 1.0, 5.0), v1 = normal_tensor(rng, {1, t, H, d});
  const auto k2 = normal_tensor(rng, {1, t, H, d}, 1.0, 5.5), v2 = normal_tensor(rng, {1, t, H, d});
  const auto k3 = normal_tensor(rng, {1, t, H, d}, 1.0, -5.0), v3 = normal_tensor(rng, {1, t, H, d});
  const auto k4 = normal_tensor(rng, {1, t, H, d}, 1.0, 0.0), v4 = normal_tensor(rng, {1, t, H, d});
  BirthMergeOptions threshold;
  BirthMergeOptions budget;
  budget.cluster_rule = ClusterRule::kBudget;
  const auto empty = empty_cluster_bank(1, H, C, d, f64_options());

  // The threshold rule absorbs the second chunk into the first cluster (no birth).
  const auto one = ingest_cluster_batch(empty, k1, v1, threshold);
  EXPECT_FALSE(ingest_cluster_batch(one.bank, k2, v2, threshold).receipts[0].birthed);

  auto bank = empty;
  for (const auto& [k, v] : {std::pair{k1, v1}, std::pair{k2, v2}, std::pair{k3, v3}}) {
    const auto step = ingest_cluster_batch(bank, k, v, budget);
    EXPECT_TRUE(step.receipts[0].birthed);
    EXPECT_TRUE(step.receipts[0].merged.empty());
    EXPECT_FALSE(step.receipts[0].soft_update_applied);
    bank = step.bank;
  }
  ASSERT_EQ(bank.n_clusters, std::vector<int64_t>{3});
  // Under the threshold rule, the first two clusters are close enough to merge.
  EXPECT_FALSE(birth_and_merge(bank, k4, v4, threshold).receipts[0].merged.empty());

  const auto full = ingest_cluster_batch(bank, k4, v4, budget);
  const auto& r = full.receipts[0];
  EXPECT_TRUE(r.birthed);
  EXPECT_EQ(r.merged, (std::vector<std::pair<int64_t, int64_t>>{{0, 1}}));
  EXPECT_TRUE(r.count_conserved);
  EXPECT_EQ(full.bank.n_clusters, std::vector<int64_t>{3});
  const auto k12 = torch::cat({k1, k2}, 1), v12 = torch::cat({v1, v2}, 1);
  for (int64_t h = 0; h < H; ++h) {
    SCOPED_TRACE("head " + std::to_string(h));
    expect_slot_close(slot_stats(full.bank, 0, h, 0), hand_birth(k12, v12, 0, h), 1e-12, 1e-12);
    expect_slot_close(slot_stats(full.bank, 0, h, 1), hand_birth(k3, v3, 0, h), 1e-12, 1e-12);
    expect_slot_close(slot_stats(full.bank, 0, h, 2), hand_birth(k4, v4, 0, h), 1e-12, 1e-12);
  }
  ExpectAllClose(to_vector(full.bank.total_per_head()), {32.0, 32.0}, 0.0, 1e-10);

  // With one slot there is no pair to merge: a full bank takes the soft update.
  const auto single = ingest_cluster_batch(empty_cluster_bank(1, H, 1, d, f64_options()), k1, v1, budget);
  const auto soft = ingest_cluster_batch(single.bank, k3, v3, budget);
  EXPECT_FALSE(soft.receipts[0].birthed);
  EXPECT_TRUE(soft.receipts[0].merged.empty());
  EXPECT_TRUE(soft.receipts[0].soft_update_applied);
  EXPECT_EQ(parse_cluster_rule("budget", "t"), ClusterRule::kBudget);
  EXPECT_STREQ(cluster_rule_name(ClusterRule::kThreshold), "threshold");
  EXPECT_THROW(static_cast<void>(parse_cluster_rule("Budget", "t")), ValueError);
}

/// docs/mechanisms.md#moment-closure-far-field: a birth needs *every* head's best logit below the threshold and a free
/// slot. A chunk that is far from the cluster in one head but close to it in the other (either way round) does
/// not birth; the same chunk births once both heads are far; a full bank (C = 1) never births.
/// Identical tokens birth with σ²_kk = 1e-6 (the floor) and Σ_vk = 0.
TEST(MomentClosureTest, BirthNeedsEveryHeadAndAFreeSlot) {
  const uint64_t seed = testing::test_seed(711);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t H = 2, d = 2, t = 4;
  BirthMergeOptions o;
  o.birth_threshold = -2.0;
  auto bank = empty_cluster_bank(1, H, 3, d, f64_options());
  set_slot(bank, 0, 0, 0, uniform_slot(d, 5.0, {5.0, 5.0}, {0.0, 0.0}, 0.1, 0.0));
  set_slot(bank, 0, 1, 0, uniform_slot(d, 5.0, {-5.0, -5.0}, {0.0, 0.0}, 0.1, 0.0));
  bank.n_clusters = {1};
  const auto k = normal_tensor(rng, {1, t, H, d}, 0.1, -5.0), v = normal_tensor(rng, {1, t, H, d});
  // Head 0: q·μ/√2 ≈ −35 (far); head 1: ≈ +35 (close). Then the other way round.
  const auto mixed = ingest_cluster_batch(bank, k, v, o);
  EXPECT_FALSE(mixed.receipts[0].birthed);
  EXPECT_TRUE(mixed.receipts[0].soft_update_applied);
  EXPECT_EQ(mixed.bank.n_clusters, std::vector<int64_t>{1});
  const auto mixed_flipped = ingest_cluster_batch(bank, -k, v, o);
  EXPECT_FALSE(mixed_flipped.receipts[0].birthed);
  EXPECT_EQ(mixed_flipped.bank.n_clusters, std::vector<int64_t>{1});

  set_slot(bank, 0, 1, 0, uniform_slot(d, 5.0, {5.0, 5.0}, {0.0, 0.0}, 0.1, 0.0));
  const auto both = ingest_cluster_batch(bank, k, v, o);
  EXPECT_TRUE(both.receipts[0].birthed);
  EXPECT_EQ(both.bank.n_clusters, std::vector<int64_t>{2});

  auto full = empty_cluster_bank(1, H, 1, d, f64_options());
  for (int64_t h = 0; h < H; ++h)
    set_slot(full, 0, h, 0, uniform_slot(d, 5.0, {5.0, 5.0}, {0.0, 0.0}, 0.1, 0.0));
  full.n_clusters = {1};
  const auto no_slot = ingest_cluster_batch(full, k, v, o);
  EXPECT_FALSE(no_slot.receipts[0].birthed);
  EXPECT_TRUE(no_slot.receipts[0].soft_update_applied);
  ExpectAllClose(to_vector(no_slot.bank.total_per_head()), {9.0, 9.0}, 0.0, 1e-10);

  const auto same = torch::full({1, t, H, d}, 0.7, f64_options());
  const auto flat = ingest_cluster_batch(empty_cluster_bank(1, H, 2, d, f64_options()), same, v, o);
  ASSERT_TRUE(flat.receipts[0].birthed);
  ExpectAllClose(to_vector(flat.bank.sigma_kk.select(2, 0)), Vec(static_cast<size_t>(H * d), 1e-6),
                 0.0, 1e-18);
  ExpectAllClose(to_vector(flat.bank.sigma_vk.select(2, 0)),
                 Vec(static_cast<size_t>(H * d * d), 0.0), 0.0, 1e-15);
}

/// MCA-7: a (1, 3, 2, 4) batch ingested into an empty bank: per-head total 3,
/// birth_incorporated_batch, no soft update, count conserved, ingested [3, 3] of expected 3.
TEST(MomentClosureTest, BirthIngestionCountsTheBatchOnce) {
  const uint64_t seed = testing::test_seed(712);
  Rng rng(seed);
  const auto k = normal_tensor(rng, {1, 3, 2, 4}), v = normal_tensor(rng, {1, 3, 2, 4});
  const auto result = ingest_cluster_batch(empty_cluster_bank(1, 2, 4, 4, f64_options()), k, v, {});
  ExpectAllClose(to_vector(result.bank.total_per_head()), {3.0, 3.0}, 0.0, 0.0);
  const auto& r = result.receipts[0];
  EXPECT_TRUE(r.birthed);
  EXPECT_TRUE(r.birth_incorporated_batch);
  EXPECT_FALSE(r.soft_update_applied);
  EXPECT_TRUE(r.count_conserved);
  ExpectAllClose(r.ingested_tokens_per_head, {3.0, 3.0}, 0.0, 0.0);
  EXPECT_EQ(r.expected_ingested_tokens_per_head, 3);
}

/// docs/mechanisms.md#moment-closure-far-field per stream: in one batch, stream 0 (empty) births and stream 1 (one
/// cluster, count 5) takes the soft update with r ≡ 1 — its cluster becomes the pooled population of the cluster and
/// the 3 tokens — and neither stream's batch is counted twice.
TEST(MomentClosureTest, IngestionIsPerStream) {
  const uint64_t seed = testing::test_seed(713);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t H = 2, C = 3, d = 2, t = 3;
  auto bank = empty_cluster_bank(2, H, C, d, f64_options());
  for (int64_t h = 0; h < H; ++h) set_slot(bank, 1, h, 0, random_slot(rng, d, 5.0));
  bank.n_clusters = {0, 1};
  BirthMergeOptions o;
  o.birth_threshold = -1e6;
  const auto k = normal_tensor(rng, {2, t, H, d}), v = normal_tensor(rng, {2, t, H, d});
  const auto result = ingest_cluster_batch(bank, k, v, o);
  EXPECT_EQ(result.bank.n_clusters, (std::vector<int64_t>{1, 1}));
  EXPECT_TRUE(result.receipts[0].birthed);
  EXPECT_FALSE(result.receipts[0].soft_update_applied);
  EXPECT_FALSE(result.receipts[1].birthed);
  EXPECT_TRUE(result.receipts[1].soft_update_applied);
  ExpectAllClose(to_vector(result.bank.total_per_head()), {3.0, 3.0, 8.0, 8.0}, 0.0, 1e-12);
  for (int64_t h = 0; h < H; ++h) {
    expect_slot_close(slot_stats(result.bank, 0, h, 0), hand_birth(k, v, 0, h), 1e-12, 1e-12);
    std::vector<Vec> ks, vs;
    for (int64_t i = 0; i < t; ++i) {
      ks.push_back(token(k, 1, i, h));
      vs.push_back(token(v, 1, i, h));
    }
    expect_slot_close(slot_stats(result.bank, 1, h, 0),
                      pooled_moments(slot_stats(bank, 1, h, 0), ks, vs, {1, 1, 1}), 1e-10, 1e-12);
  }
}

/// docs/mechanisms.md#moment-closure-far-field: a head whose total does not grow by t raises StateError "cluster
/// ingestion did not count every observation exactly once". Provoked through the public API with a cluster of count
/// 1e17 in float64: 1e17 + 3 rounds back to 1e17 (ulp 16), so the soft update cannot register the 3
/// tokens.
/// validate_cluster_bank (the bank invariants of docs/mechanisms.md#moment-closure-far-field): a consistent bank
/// passes; each broken invariant is named.
TEST(MomentClosureTest, ValidateClusterBankNamesTheBrokenInvariant) {
  const auto good = [] {
    auto bank = empty_cluster_bank(2, 2, 3, 2, f64_options());
    set_slot(bank, 0, 0, 0, uniform_slot(2, 5.0, {1.0, 2.0}, {0.5, 0.5}, 1.0, 0.1));
    set_slot(bank, 0, 1, 0, uniform_slot(2, 5.0, {1.0, 2.0}, {0.5, 0.5}, 1.0, 0.1));
    bank.n_clusters = {1, 0};
    return bank;
  };
  EXPECT_NO_THROW(validate_cluster_bank(good(), "bank"));
  const std::vector<std::pair<std::function<void(ClusterBank&)>, std::string>> cases = {
      {[](ClusterBank& b) { b.mu_v = b.mu_v.narrow(3, 0, 1); }, "mu_v must have shape (2, 2, 3, 2)"},
      {[](ClusterBank& b) { b.sigma_vk = b.sigma_vk.sum(-1); }, "sigma_vk must have shape"},
      {[](ClusterBank& b) { b.count = b.count.unsqueeze(0); }, "count must be (batch, heads, max_clusters)"},
      {[](ClusterBank& b) { b.mu_k = b.mu_k.to(torch::kFloat32); }, "every tensor must have count's dtype and device"},
      {[](ClusterBank& b) { b.max_clusters = 4; }, "max_clusters is 4"},
      {[](ClusterBank& b) { b.n_clusters = {1}; }, "n_clusters must hold one entry per stream (2, got 1)"},
      {[](ClusterBank& b) { b.n_clusters = {4, 0}; }, "n_clusters must lie in [0, max_clusters 3]"},
      {[](ClusterBank& b) { b.count[0][0][0] = -1.0; }, "count must be >= 0"},
      {[](ClusterBank& b) { b.sigma_kk[0][1][0][1] = -0.5; }, "sigma_kk must be >= 0"},
      {[](ClusterBank& b) { b.mu_k[0][0][0][0] = std::nan(""); }, "mu_k must be finite"},
      {[](ClusterBank& b) { b.sigma_vk[1][1][2][1][0] = 0.25; }, "the inactive slot 2 of stream 1 (head 1)"},
  };
  for (const auto& [breakit, needle] : cases) {
    SCOPED_TRACE(needle);
    auto bank = good();
    breakit(bank);
    expect_throw_containing<ValueError>([&] { validate_cluster_bank(bank, "bank"); }, "bank: " + needle);
  }
}

TEST(MomentClosureTest, NonConservingIngestionThrowsStateError) {
  // A cluster mean of 1e308 makes the logits of the keys infinite, the responsibilities NaN and the growth of
  // the count NaN: ingestion must refuse it.
  auto bank = empty_cluster_bank(1, 1, 2, 2, f64_options());
  set_slot(bank, 0, 0, 0, uniform_slot(2, 5.0, {1e308, 1e308}, {0.0, 0.0}, 1.0, 0.0));
  bank.n_clusters = {1};
  const auto k = torch::full({1, 3, 1, 2}, 4.0, f64_options());
  expect_throw_containing<StateError>([&] { (void)ingest_cluster_batch(bank, k, k, {}); },
                                      "did not count every observation exactly once");
}

/// Decision 0006: a total the dtype cannot represent to 1e-4 (1e17 + 3 rounds to 1e17 in float64) is rounding,
/// not a lost token, so ingestion accepts it; a float32 bank keeps streaming past 2·10⁴ fractional tokens.
TEST(MomentClosureTest, ConservationAllowsForTheRoundingOfLargeCounts) {
  auto bank = empty_cluster_bank(1, 1, 2, 2, f64_options());
  set_slot(bank, 0, 0, 0, uniform_slot(2, 1e17, {0.0, 0.0}, {0.0, 0.0}, 1.0, 0.0));
  bank.n_clusters = {1};
  const auto k = torch::full({1, 3, 1, 2}, 0.5, f64_options());
  EXPECT_NO_THROW((void)ingest_cluster_batch(bank, k, k, {}));
}

// ----- docs/mechanisms.md#moment-closure-far-field merge
// ----------------------------------------------------------------------------------------------

/// MCA-5: two clusters of count 20 at μ_k [1,2,3] and [1.01,2.01,3.01] (σ² 1, Σ_vk 0.1·I, two
/// heads), a chunk at the shared location, birth threshold −1e6, default merge threshold: no birth,
/// merged == [(0, 1)] at distance 0.01, one cluster left holding the hand-pooled statistics, slot 1
/// zeroed.
TEST(MomentClosureTest, CloseClustersMerge) {
  const uint64_t seed = testing::test_seed(714);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t H = 2, C = 3, d = 3;
  auto bank = empty_cluster_bank(1, H, C, d, f64_options());
  std::vector<SlotStats> a, b;
  for (int64_t h = 0; h < H; ++h) {
    const double x = static_cast<double>(h);
    a.push_back(uniform_slot(d, 20.0, {1.0, 2.0, 3.0}, {0.1 * x, -0.2, 0.3}, 1.0, 0.1));
    b.push_back(uniform_slot(d, 20.0, {1.01, 2.01, 3.01}, {0.5, 0.4 * x, -0.6}, 1.0, 0.1));
    set_slot(bank, 0, h, 0, a.back());
    set_slot(bank, 0, h, 1, b.back());
  }
  bank.n_clusters = {2};
  BirthMergeOptions o;
  o.birth_threshold = -1e6;
  const auto k = normal_tensor(rng, {1, 6, H, d}, 0.05, 2.005),
             v = normal_tensor(rng, {1, 6, H, d});
  const auto result = birth_and_merge(bank, k, v, o);
  const auto& r = result.receipts[0];
  EXPECT_FALSE(r.birthed);
  EXPECT_FALSE(r.birth_incorporated_batch);
  EXPECT_EQ(r.merged, (std::vector<std::pair<int64_t, int64_t>>{{0, 1}}));
  ASSERT_EQ(r.merge_distances.size(), 1u);
  EXPECT_NEAR(r.merge_distances[0], 0.01, 1e-12);
  EXPECT_EQ(result.bank.n_clusters, std::vector<int64_t>{1});
  for (int64_t h = 0; h < H; ++h) {
    SCOPED_TRACE("head " + std::to_string(h));
    const SlotStats pooled = pooled_pair(a[static_cast<size_t>(h)], b[static_cast<size_t>(h)]);
    EXPECT_EQ(pooled.count, 40.0);
    EXPECT_NEAR(pooled.sigma_kk[0], 1.0 + 1e-4 / 4.0, 1e-14);  // (20 + 20 + 0.01²·20·20/40)/40
    expect_slot_close(slot_stats(result.bank, 0, h, 0), pooled, 1e-12, 1e-14);
  }
  expect_slot_zero(result.bank, 0, 1);
  // The misfit receipt covers the one live cluster (all 6 tokens are its members).
  ASSERT_EQ(r.misfit.size(), 1u);
  ASSERT_EQ(r.per_cluster_outlier_tokens.count(0), 1u);
  EXPECT_EQ(r.per_cluster_outlier_tokens.at(0).member_indices,
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
}

/// MCA-6: μ_k [0,1] vs [1,0] with σ² 0.01 and count 100 are 10 pooled standard deviations apart:
/// merge threshold 3 (and 9.999) keeps both; 10.001 merges them at distance 10.
TEST(MomentClosureTest, DistantClustersDoNotMerge) {
  const uint64_t seed = testing::test_seed(715);
  Rng rng(seed);
  const int64_t H = 1, C = 2, d = 2;
  auto bank = empty_cluster_bank(1, H, C, d, f64_options());
  set_slot(bank, 0, 0, 0, uniform_slot(d, 100.0, {0.0, 1.0}, {0.0, 0.0}, 0.01, 0.0));
  set_slot(bank, 0, 0, 1, uniform_slot(d, 100.0, {1.0, 0.0}, {0.0, 0.0}, 0.01, 0.0));
  bank.n_clusters = {2};
  const auto k = normal_tensor(rng, {1, 4, H, d}, 0.05, 0.5), v = normal_tensor(rng, {1, 4, H, d});
  for (const double threshold : {3.0, 9.999}) {
    BirthMergeOptions o;
    o.birth_threshold = -1e6;
    o.merge_threshold = threshold;
    const auto result = birth_and_merge(bank, k, v, o);
    EXPECT_TRUE(result.receipts[0].merged.empty()) << "threshold " << threshold;
    EXPECT_TRUE(result.receipts[0].merge_distances.empty());
    EXPECT_EQ(result.bank.n_clusters, std::vector<int64_t>{2});
    EXPECT_FALSE(result.receipts[0].birthed);
  }
  BirthMergeOptions o;
  o.birth_threshold = -1e6;
  o.merge_threshold = 10.001;
  const auto merged = birth_and_merge(bank, k, v, o);
  EXPECT_EQ(merged.bank.n_clusters, std::vector<int64_t>{1});
  ASSERT_EQ(merged.receipts[0].merge_distances.size(), 1u);
  EXPECT_NEAR(merged.receipts[0].merge_distances[0], 10.0, 1e-10);
}

/// docs/mechanisms.md#moment-closure-far-field default merge threshold 2.65 + 6/√max(n_small, 1), n_small = the
/// smallest count over both clusters and all heads. Two clusters 4 pooled standard deviations apart (RMS over two heads
/// and two dims): counts 100 → threshold 3.25, no merge; one head's count 4 → 5.65, merge. 10 apart
/// with counts 0.25 → max(·, 1) = 1 gives 8.65, no merge (without the floor the threshold would
/// be 14.65).
TEST(MomentClosureTest, DefaultMergeThresholdUsesSmallestCount) {
  const int64_t H = 2, C = 2, d = 2;
  const auto k = torch::full({1, 2, H, d}, 0.0, f64_options());
  BirthMergeOptions o;
  o.birth_threshold = -1e6;
  const auto run = [&](double separation, double count_a, double count_b_head1) {
    auto bank = empty_cluster_bank(1, H, C, d, f64_options());
    for (int64_t h = 0; h < H; ++h) {
      set_slot(bank, 0, h, 0, uniform_slot(d, count_a, {0.0, 0.0}, {0.0, 0.0}, 1.0, 0.0));
      set_slot(bank, 0, h, 1,
               uniform_slot(d, h == 1 ? count_b_head1 : count_a, {separation, separation},
                            {0.0, 0.0}, 1.0, 0.0));
    }
    bank.n_clusters = {2};
    return birth_and_merge(bank, k, k, o).receipts[0];
  };
  EXPECT_TRUE(run(4.0, 100.0, 100.0).merged.empty());
  const auto merged = run(4.0, 100.0, 4.0);
  ASSERT_EQ(merged.merged.size(), 1u);
  EXPECT_NEAR(merged.merge_distances[0], 4.0, 1e-12);
  EXPECT_TRUE(run(10.0, 0.25, 0.25).merged.empty());
  EXPECT_EQ(run(8.0, 0.25, 0.25).merged.size(), 1u);
}

/// docs/mechanisms.md#moment-closure-far-field: after a merge the scan restarts from the same i. Three clusters at 0, 1
/// and 2 (σ² 1, count 10, merge threshold 1.6): d(0,1) = 1 merges; the pooled cluster (mean 0.5, σ² 1.25) is
/// then √2 from the old cluster 2 (moved into slot 1), which merges too, although d(0,2) = 2 did
/// not qualify before. merged == [(0,1), (0,1)] with distances [1, 1.5/√1.125], and the survivor
/// holds the population of all three.
TEST(MomentClosureTest, MergeRescansFromSameIndex) {
  const int64_t H = 1, C = 3, d = 2;
  auto bank = empty_cluster_bank(1, H, C, d, f64_options());
  std::vector<SlotStats> s;
  for (int64_t c = 0; c < 3; ++c) {
    const double x = static_cast<double>(c);
    s.push_back(uniform_slot(d, 10.0, {x, x}, {x, -x}, 1.0, 0.2 * x));
    set_slot(bank, 0, 0, c, s.back());
  }
  bank.n_clusters = {3};
  BirthMergeOptions o;
  o.birth_threshold = -1e6;
  o.merge_threshold = 1.6;
  const auto k = torch::full({1, 2, H, d}, 1.0, f64_options());
  const auto result = birth_and_merge(bank, k, k, o);
  const auto& r = result.receipts[0];
  EXPECT_EQ(r.merged, (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {0, 1}}));
  ExpectAllClose(r.merge_distances, {1.0, 1.5 / std::sqrt(1.125)}, 1e-12, 0.0);
  EXPECT_EQ(result.bank.n_clusters, std::vector<int64_t>{1});
  expect_slot_close(slot_stats(result.bank, 0, 0, 0), pooled_pair(pooled_pair(s[0], s[1]), s[2]),
                    1e-12, 1e-14);
  expect_slot_zero(result.bank, 0, 1);
  expect_slot_zero(result.bank, 0, 2);
}

/// docs/mechanisms.md#moment-closure-far-field compaction: of four clusters, only 0 and 2 are close; merging 2 into 0
/// moves the last live slot (3) into slot 2 and zeroes slot 3: merged == [(0, 2)], slots [pooled(0, 2), 1, 3,
/// zero].
TEST(MomentClosureTest, MergeMovesLastSlotIntoTheGap) {
  const int64_t H = 1, C = 4, d = 2;
  auto bank = empty_cluster_bank(1, H, C, d, f64_options());
  const std::vector<double> where = {0.0, 20.0, 0.5, -20.0};
  std::vector<SlotStats> s;
  for (int64_t c = 0; c < 4; ++c) {
    const double x = where[static_cast<size_t>(c)];
    s.push_back(uniform_slot(d, 3.0 + static_cast<double>(c), {x, -x}, {x, 1.0}, 1.0, 0.1));
    set_slot(bank, 0, 0, c, s.back());
  }
  bank.n_clusters = {4};
  BirthMergeOptions o;
  o.birth_threshold = -1e6;
  o.merge_threshold = 1.0;
  const auto k = torch::full({1, 2, H, d}, 0.0, f64_options());
  const auto result = birth_and_merge(bank, k, k, o);
  EXPECT_EQ(result.receipts[0].merged, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}}));
  EXPECT_EQ(result.bank.n_clusters, std::vector<int64_t>{3});
  expect_slot_close(slot_stats(result.bank, 0, 0, 0), pooled_pair(s[0], s[2]), 1e-12, 1e-14);
  expect_slot_close(slot_stats(result.bank, 0, 0, 1), s[1], 0.0, 0.0);
  expect_slot_close(slot_stats(result.bank, 0, 0, 2), s[3], 0.0, 0.0);
  expect_slot_zero(result.bank, 0, 3);
}

/// docs/mechanisms.md#moment-closure-far-field: a non-finite cluster distance raises StateError.
TEST(MomentClosureTest, NonFiniteMergeDistanceThrowsStateError) {
  const int64_t H = 1, C = 2, d = 2;
  auto bank = empty_cluster_bank(1, H, C, d, f64_options());
  set_slot(bank, 0, 0, 0, uniform_slot(d, 5.0, {1e200, 1e200}, {0.0, 0.0}, 1.0, 0.0));
  set_slot(bank, 0, 0, 1, uniform_slot(d, 5.0, {-1e200, -1e200}, {0.0, 0.0}, 1.0, 0.0));
  bank.n_clusters = {2};
  BirthMergeOptions o;
  o.birth_threshold = -1e6;
  const auto k = torch::full({1, 2, H, d}, 1.0, f64_options());
  EXPECT_THROW((void)birth_and_merge(bank, k, k, o), StateError);
}

// ----- docs/mechanisms.md#moment-closure-far-field misfit receipt
// ---------------------------------------------------------------------------------------

/// docs/mechanisms.md#moment-closure-far-field misfit receipt against a hand computation: three live clusters (two
/// heads, d 2, counts differing per head, a full Σ_vk, one key variance below the 1e-6 regression floor), seven tokens
/// near clusters 0 and 1 and none near cluster 2, outlier_top_k 2. Hard membership = argmax of the
/// head-mean responsibility; residual = head-mean
/// ||v − (μ_v + Σ_vk ((k − μ_k) / max(σ², 1e-6)))||; misfit[c] = mean over members (0 for cluster
/// 2, which has no outlier entry); outliers = the 2 largest residuals, largest first, with their k
/// and v; member_indices ascending; misfit_scalar = Σ misfit_c c̄_c / Σ c̄_c with c̄ the head-mean
/// count. outlier_top_k 0 keeps the members but lists no outliers; outlier_top_k 10 lists every
/// member.
TEST(MomentClosureTest, MisfitReceiptMatchesHandComputation) {
  const uint64_t seed = testing::test_seed(716);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t H = 2, C = 4, d = 2, n = 3, t = 7;
  auto bank = empty_cluster_bank(1, H, C, d, f64_options());
  const std::vector<Vec> centres = {{2.0, 0.0}, {-2.0, 0.0}, {0.0, -6.0}};
  const std::vector<std::vector<double>> counts = {{6.0, 4.0}, {10.0, 12.0}, {3.0, 2.0}};
  for (int64_t c = 0; c < n; ++c) {
    for (int64_t h = 0; h < H; ++h) {
      SlotStats s = random_slot(rng, d, counts[static_cast<size_t>(c)][static_cast<size_t>(h)]);
      const double shift = 0.1 * static_cast<double>(h);
      s.mu_k = {centres[c][0] + shift, centres[c][1] - shift};
      if (c == 1) s.sigma_kk[1] = 1e-9;
      set_slot(bank, 0, h, c, s);
    }
  }
  bank.n_clusters = {n};
  auto k = normal_tensor(rng, {1, t, H, d}, 0.3);
  for (int64_t i = 0; i < t; ++i) {
    k.select(1, i).add_(
        from_values(i % 2 == 0 ? Vec{2.0, 0.0} : Vec{-2.0, 0.0}, {1, 1, d}).squeeze(0));
  }
  const auto v = normal_tensor(rng, {1, t, H, d});

  // The hand receipt.
  std::vector<int64_t> member(static_cast<size_t>(t));
  std::vector<Vec> resid(static_cast<size_t>(t), Vec(static_cast<size_t>(n), 0.0));
  for (int64_t i = 0; i < t; ++i) {
    Vec mean_r(static_cast<size_t>(n), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      const Vec kt = token(k, 0, i, h), vt = token(v, 0, i, h);
      Vec logits;
      for (int64_t c = 0; c < n; ++c) logits.push_back(hand_logit(kt, slot_stats(bank, 0, h, c)));
      const double top = *std::max_element(logits.begin(), logits.end());
      double z = 0.0;
      for (const double l : logits) z += std::exp(l - top);
      for (int64_t c = 0; c < n; ++c) {
        mean_r[static_cast<size_t>(c)] += std::exp(logits[c] - top) / z / static_cast<double>(H);
        resid[static_cast<size_t>(i)][static_cast<size_t>(c)] +=
            hand_residual(kt, vt, slot_stats(bank, 0, h, c)) / static_cast<double>(H);
      }
    }
    member[static_cast<size_t>(i)] =
        std::max_element(mean_r.begin(), mean_r.end()) - mean_r.begin();
  }
  std::vector<std::vector<int64_t>> members(static_cast<size_t>(n));
  for (int64_t i = 0; i < t; ++i)
    members[static_cast<size_t>(member[static_cast<size_t>(i)])].push_back(i);
  ASSERT_EQ(members[0], (std::vector<int64_t>{0, 2, 4, 6}))
      << "the design puts even tokens in cluster 0";
  ASSERT_EQ(members[1], (std::vector<int64_t>{1, 3, 5}));
  ASSERT_TRUE(members[2].empty());
  Vec misfit(static_cast<size_t>(n), 0.0);
  double weighted = 0.0, total = 0.0;
  for (int64_t c = 0; c < n; ++c) {
    for (const int64_t i : members[static_cast<size_t>(c)])
      misfit[c] += resid[i][c] / static_cast<double>(members[c].size());
    const double mean_count = std::max(0.5 * (counts[c][0] + counts[c][1]), 1e-8);
    weighted += misfit[c] * mean_count;
    total += mean_count;
  }

  for (const int64_t top_k : {int64_t{2}, int64_t{0}, int64_t{10}}) {
    SCOPED_TRACE("outlier_top_k " + std::to_string(top_k));
    BirthMergeOptions o;
    o.birth_threshold = -1e6;
    o.merge_threshold = 0.0;
    o.outlier_top_k = top_k;
    const auto result = birth_and_merge(bank, k, v, o);
    const auto& r = result.receipts[0];
    ASSERT_FALSE(r.birthed);
    ASSERT_TRUE(r.merged.empty());
    ASSERT_EQ(r.misfit.size(), static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c)
      EXPECT_NEAR(r.misfit.at(c), misfit[c], 1e-10 * std::max(1.0, misfit[c]));
    EXPECT_EQ(r.misfit.at(2), 0.0);
    EXPECT_NEAR(r.misfit_scalar, weighted / total, 1e-10 * std::max(1.0, weighted / total));
    EXPECT_EQ(r.per_cluster_outlier_tokens.count(2), 0u);
    for (int64_t c = 0; c < 2; ++c) {
      SCOPED_TRACE("cluster " + std::to_string(c));
      ASSERT_EQ(r.per_cluster_outlier_tokens.count(c), 1u);
      const auto& out = r.per_cluster_outlier_tokens.at(c);
      EXPECT_EQ(out.member_indices, members[static_cast<size_t>(c)]);
      auto order = members[static_cast<size_t>(c)];
      std::sort(order.begin(), order.end(),
                [&](int64_t a, int64_t b) { return resid[a][c] > resid[b][c]; });
      order.resize(std::min<size_t>(static_cast<size_t>(top_k), order.size()));
      EXPECT_EQ(out.indices, order);
      ASSERT_EQ(out.k.sizes(), torch::IntArrayRef({static_cast<int64_t>(order.size()), H, d}));
      ASSERT_EQ(out.v.sizes(), out.k.sizes());
      for (size_t j = 0; j < order.size(); ++j) {
        ExpectAllClose(to_vector(out.k[static_cast<int64_t>(j)]), to_vector(k[0][order[j]]), 0.0,
                       0.0);
        ExpectAllClose(to_vector(out.v[static_cast<int64_t>(j)]), to_vector(v[0][order[j]]), 0.0,
                       0.0);
      }
    }
  }
  // A birth into an empty bank: the receipt covers the new cluster, and every token is one of its
  // members.
  const auto born = birth_and_merge(empty_cluster_bank(1, H, C, d, f64_options()), k, v, {});
  ASSERT_TRUE(born.receipts[0].birthed);
  ASSERT_EQ(born.receipts[0].misfit.size(), 1u);
  EXPECT_EQ(born.receipts[0].per_cluster_outlier_tokens.at(0).member_indices,
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
}

/// The birth statistics and the receipt's residuals run blocked, vectorised loops (rows of Σ_vk
/// and tokens in blocks of 8, head dimensions padded to 8 lanes): at head dimensions and chunk
/// lengths on both sides of every block edge, a birth into an empty bank has the hand birth
/// statistics, and the receipt lists every token (outlier_top_k = t) with the hand residual
/// mean_h ||v − (μ_v + Σ_vk ((k − μ_k) / max(σ², 1e-6)))|| against the born cluster.
TEST(MomentClosureTest, BirthAndResidualsMatchHandFormulasAtEveryBlockEdge) {
  const uint64_t seed = testing::test_seed(719);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t H = 2, C = 2;
  for (const int64_t d : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{17}, int64_t{40}}) {
    for (const int64_t t : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{13}}) {
      SCOPED_TRACE("d " + std::to_string(d) + ", t " + std::to_string(t));
      const auto k = normal_tensor(rng, {1, t, H, d});
      const auto v = normal_tensor(rng, {1, t, H, d}) + 0.5 * k;
      BirthMergeOptions o;
      o.outlier_top_k = t;
      const auto born = birth_and_merge(empty_cluster_bank(1, H, C, d, f64_options()), k, v, o);
      ASSERT_TRUE(born.receipts[0].birthed);
      std::vector<SlotStats> stats;
      for (int64_t h = 0; h < H; ++h) {
        stats.push_back(slot_stats(born.bank, 0, h, 0));
        expect_slot_close(stats.back(), hand_birth(k, v, 0, h), 1e-12, 1e-12);
      }
      const auto& out = born.receipts[0].per_cluster_outlier_tokens.at(0);
      ASSERT_EQ(out.indices.size(), static_cast<size_t>(t));
      for (size_t j = 0; j < out.indices.size(); ++j) {
        const int64_t i = out.indices[j];
        double resid = 0.0;
        for (int64_t h = 0; h < H; ++h) {
          resid += hand_residual(token(k, 0, i, h), token(v, 0, i, h), stats[static_cast<size_t>(h)]) /
                   static_cast<double>(H);
        }
        EXPECT_NEAR(out.residuals[j], resid, 1e-10 * std::max(1.0, resid)) << "token " << i;
      }
    }
  }
}

// ----- validation
// -----------------------------------------------------------------------------------------------

/// docs/mechanisms.md#moment-closure-far-field validation (birth_and_merge and ingest_cluster_batch): a negative
/// outlier_top_k, k/v that are not 4-D, differ in shape, have t = 0, the wrong batch size, head count or head_dim,
/// another dtype, or a non-finite entry → ValueError. The tensor functions reject inputs that do
/// not fit the bank (ValueError).
TEST(MomentClosureTest, InvalidTokensThrowValueError) {
  const uint64_t seed = testing::test_seed(717);
  Rng rng(seed);
  const int64_t B = 2, H = 2, C = 3, d = 4, t = 3;
  const auto bank = random_bank(rng, B, H, C, d, {1, 2});
  const auto k = normal_tensor(rng, {B, t, H, d}), v = normal_tensor(rng, {B, t, H, d});
  const auto with = [](const torch::Tensor& x, double value) {
    auto c = x.clone();
    c.view(-1)[5] = value;
    return c;
  };
  using Call = std::function<IngestResult(const torch::Tensor&, const torch::Tensor&,
                                          const BirthMergeOptions&)>;
  const std::vector<std::pair<std::string, Call>> calls = {
      {"birth_and_merge",
       [&](const auto& a, const auto& b, const auto& o) { return birth_and_merge(bank, a, b, o); }},
      {"ingest_cluster_batch", [&](const auto& a, const auto& b, const auto& o) {
         return ingest_cluster_batch(bank, a, b, o);
       }}};
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(call(k, v, {}));
    BirthMergeOptions negative;
    negative.outlier_top_k = -1;
    EXPECT_THROW(call(k, v, negative), ValueError) << "outlier_top_k −1";
    EXPECT_THROW(call(k.select(0, 0), v.select(0, 0), {}), ValueError) << "3-D";
    EXPECT_THROW(call(k, v.narrow(1, 0, 2), {}), ValueError) << "k and v differ";
    EXPECT_THROW(call(k.narrow(1, 0, 0), v.narrow(1, 0, 0), {}), ValueError) << "t = 0";
    EXPECT_THROW(call(k.narrow(0, 0, 1), v.narrow(0, 0, 1), {}), ValueError)
        << "batch 1 for a bank of 2";
    EXPECT_THROW(call(torch::cat({k, k}, 0), torch::cat({v, v}, 0), {}), ValueError) << "batch 4";
    EXPECT_THROW(call(k.narrow(2, 0, 1), v.narrow(2, 0, 1), {}), ValueError) << "one head";
    EXPECT_THROW(call(k.narrow(3, 0, 2), v.narrow(3, 0, 2), {}), ValueError) << "head_dim 2";
    EXPECT_THROW(call(k.to(torch::kFloat32), v.to(torch::kFloat32), {}), ValueError) << "float32";
    EXPECT_THROW(call(k, v.to(torch::kFloat32), {}), ValueError) << "v float32";
    EXPECT_THROW(call(with(k, kNaN), v, {}), ValueError) << "NaN k";
    EXPECT_THROW(call(k, with(v, kInf), {}), ValueError) << "inf v";
    EXPECT_THROW(call(k, with(v, -kInf), {}), ValueError) << "−inf v";
    EXPECT_THROW(call(torch::Tensor(), v, {}), ValueError) << "undefined k";
  }
  EXPECT_THROW((void)mgf_cluster_attention(k.narrow(3, 0, 2), bank), ValueError);
  EXPECT_THROW((void)mgf_cluster_attention(k.narrow(0, 0, 1), bank), ValueError);
  EXPECT_THROW((void)cluster_responsibilities(k.narrow(2, 0, 1), bank), ValueError);
  const auto r = random_simplex(rng, {B, t, H, C});
  EXPECT_NO_THROW((void)update_cluster_bank(bank, k, v, r));
  EXPECT_THROW((void)update_cluster_bank(bank, k, v, r.narrow(3, 0, 2)), ValueError);
  EXPECT_THROW((void)update_cluster_bank(bank, k, v.narrow(3, 0, 2), r), ValueError);
  for (const auto& sizes : std::vector<std::vector<int64_t>>{
           {0, 1, 1, 1}, {1, 0, 1, 1}, {1, 1, 0, 1}, {1, 1, 1, 0}, {-1, 1, 1, 1}}) {
    EXPECT_THROW((void)empty_cluster_bank(sizes[0], sizes[1], sizes[2], sizes[3]), ValueError);
  }
}

// ----- MomentClosureAttention
// ---------------------------------------------------------------------------------------

MomentClosureOptions model_options(int64_t window, int64_t n_layer = 2) {
  MomentClosureOptions o;
  o.vocab = 8;
  o.d_model = 8;
  o.n_layer = n_layer;
  o.n_head = 2;
  o.window = window;
  o.max_clusters = 3;
  return o;
}

torch::Tensor ids(std::vector<int64_t> values) {
  return torch::tensor(values, torch::kLong).view({1, static_cast<int64_t>(values.size())});
}

/// docs/mechanisms.md#moment-closure-far-field constructor and init_state errors: a non-positive size, d_model % n_head
/// ≠ 0, an odd head_dim ("must be even"), a non-finite birth_threshold or merge_threshold → ValueError;
/// init_state(0) → ValueError.
TEST(MomentClosureAttentionTest, InvalidOptionsThrowValueError) {
  const auto make = [](const std::function<void(MomentClosureOptions&)>& edit) {
    auto o = model_options(4);
    edit(o);
    return MomentClosureAttention(o);
  };
  EXPECT_NO_THROW(make([](auto&) {}));
  EXPECT_NO_THROW(make([](auto& o) { o.merge_threshold = 2.0; }));
  for (const int64_t bad : {0, -1}) {
    EXPECT_THROW(make([&](auto& o) { o.vocab = bad; }), ValueError);
    EXPECT_THROW(make([&](auto& o) { o.d_model = bad; }), ValueError);
    EXPECT_THROW(make([&](auto& o) { o.n_layer = bad; }), ValueError);
    EXPECT_THROW(make([&](auto& o) { o.n_head = bad; }), ValueError);
    EXPECT_THROW(make([&](auto& o) { o.window = bad; }), ValueError);
    EXPECT_THROW(make([&](auto& o) { o.max_clusters = bad; }), ValueError);
  }
  EXPECT_THROW(make([](auto& o) { o.d_model = 10, o.n_head = 4; }), ValueError);
  expect_throw_containing<ValueError>([&] { make([](auto& o) { o.d_model = 6, o.n_head = 2; }); },
                                      "even");
  for (const double bad : {kNaN, kInf, -kInf}) {
    EXPECT_THROW(make([&](auto& o) { o.birth_threshold = bad; }), ValueError);
    EXPECT_THROW(make([&](auto& o) { o.merge_threshold = bad; }), ValueError);
  }
  const auto model = make([](auto&) {});
  EXPECT_THROW((void)model->init_state(0), ValueError);
  EXPECT_THROW((void)model->init_state(-3), ValueError);
  const auto state = model->init_state(3);
  EXPECT_EQ(state.batch_size, 3);
  ASSERT_EQ(state.banks.size(), 2u);
  for (const auto& bank : state.banks) {
    EXPECT_EQ(bank.n_clusters, (std::vector<int64_t>{0, 0, 0}));
    EXPECT_EQ(bank.count.sizes(), torch::IntArrayRef({3, 2, 3}));
    EXPECT_EQ(bank.sigma_vk.sizes(), torch::IntArrayRef({3, 2, 3, 4, 4}));
    EXPECT_EQ(bank.mu_k.scalar_type(), torch::kFloat32);
  }
}

/// MCA-8: accounting with window 2 (two layers): the chunk [1,2,3] leaves a cache of 2 and a bank
/// total of 1 per head (near 2, evicted 1, expected far 1, overlap 0, conserved); the next chunk
/// [4,5] gives total 3 and positions_seen 5. With window 4, three tokens evict nothing: no
/// clusters, null receipts (expected ingested 0).
TEST(MomentClosureAttentionTest, AccountingCountsEveryTokenOnce) {
  torch::manual_seed(static_cast<uint64_t>(testing::test_seed(720)));
  MomentClosureAttention model(model_options(2));
  auto state = model->init_state(1);
  state = model->step(state, ids({1, 2, 3}), ids({2, 3, 4})).state;
  ASSERT_EQ(model->last_receipts().size(), 2u);
  for (int64_t l = 0; l < 2; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    EXPECT_EQ(state.near.cache_k[l].size(1), 2);
    EXPECT_EQ(state.near.cache_v[l].size(1), 2);
    ExpectAllClose(to_vector(state.banks[l].total_per_head()), {1.0, 1.0}, 0.0, 1e-6);
    const auto& layer = model->last_receipts()[l];
    EXPECT_EQ(layer.batch_size, 1);
    ASSERT_EQ(layer.streams.size(), 1u);
    const auto& r = layer.streams[0];
    EXPECT_TRUE(r.birthed);
    EXPECT_EQ(r.expected_ingested_tokens_per_head, 1);
    ASSERT_TRUE(r.accounting.has_value());
    EXPECT_EQ(r.accounting->positions_seen, 3);
    EXPECT_EQ(r.accounting->near_tokens, 2);
    EXPECT_EQ(r.accounting->evicted_tokens, 1);
    EXPECT_EQ(r.accounting->expected_far_tokens_per_head, 1);
    ExpectAllClose(r.accounting->far_tokens_per_head, {1.0, 1.0}, 0.0, 1e-6);
    EXPECT_EQ(r.accounting->overlap_tokens, 0);
    EXPECT_TRUE(r.accounting->conserved);
  }
  state = model->step(state, ids({4, 5}), ids({5, 6})).state;
  EXPECT_EQ(state.near.pos, 5);
  for (int64_t l = 0; l < 2; ++l) {
    ExpectAllClose(to_vector(state.banks[l].total_per_head()), {3.0, 3.0}, 0.0, 1e-5);
    const auto& r = model->last_receipts()[l].streams[0];
    EXPECT_EQ(r.accounting->positions_seen, 5);
    EXPECT_EQ(r.accounting->evicted_tokens, 2);
    EXPECT_EQ(r.accounting->expected_far_tokens_per_head, 3);
    EXPECT_EQ(r.expected_ingested_tokens_per_head, 2);
    EXPECT_TRUE(r.accounting->conserved);
  }

  MomentClosureAttention wide(model_options(4));
  auto fresh = wide->step(wide->init_state(1), ids({1, 2, 3}), ids({2, 3, 4})).state;
  for (int64_t l = 0; l < 2; ++l) {
    SCOPED_TRACE("window 4, layer " + std::to_string(l));
    EXPECT_EQ(fresh.banks[l].n_clusters, std::vector<int64_t>{0});
    EXPECT_EQ(fresh.near.cache_k[l].size(1), 3);
    const auto& r = wide->last_receipts()[l].streams[0];
    EXPECT_FALSE(r.birthed);
    EXPECT_FALSE(r.birth_incorporated_batch);
    EXPECT_FALSE(r.soft_update_applied);
    EXPECT_TRUE(r.merged.empty());
    EXPECT_TRUE(r.misfit.empty());
    EXPECT_TRUE(r.per_cluster_outlier_tokens.empty());
    EXPECT_EQ(r.ingested_tokens_per_head, (Vec{0.0, 0.0}));
    EXPECT_EQ(r.expected_ingested_tokens_per_head, 0);
    EXPECT_TRUE(r.count_conserved);
    EXPECT_EQ(r.accounting->near_tokens, 3);
    EXPECT_EQ(r.accounting->evicted_tokens, 0);
    EXPECT_EQ(r.accounting->expected_far_tokens_per_head, 0);
    EXPECT_TRUE(r.accounting->conserved);
  }
  EXPECT_EQ(wide->last_misfit(), 0.0);
}

/// MCA-9: a chunk whose batch size differs from the state's → ValueError containing "batch size"; a
/// tampered bank count (or position) → StateError containing "one-token/one-representation". Bad
/// chunks (shape mismatch, id ≥ vocab, t = 0), a cache with K but no V or with K/V of different
/// lengths, a bank whose batch axis does not fit and a missing bank → ValueError.
TEST(MomentClosureAttentionTest, MismatchedOrTamperedStateThrows) {
  torch::manual_seed(static_cast<uint64_t>(testing::test_seed(721)));
  MomentClosureAttention model(model_options(2));
  const auto two = model->init_state(2);
  expect_throw_containing<ValueError>(
      [&] {
        (void)model->step(two, ids({1, 2, 3}), ids({2, 3, 4}));
      },
      "batch size");
  const auto state = model->step(model->init_state(1), ids({1, 2, 3}), ids({2, 3, 4})).state;
  EXPECT_NO_THROW((void)model->step(state, ids({4}), ids({5})));

  auto tampered = state;
  tampered.banks[1].count = state.banks[1].count.detach().clone();
  tampered.banks[1].count.index_put_({0, 0, 0}, tampered.banks[1].count[0][0][0] + 0.5);
  expect_throw_containing<StateError>([&] { (void)model->step(tampered, ids({4}), ids({5})); },
                                      "one-token/one-representation");
  auto moved = state;
  moved.near.pos = 4;
  expect_throw_containing<StateError>([&] { (void)model->step(moved, ids({4}), ids({5})); },
                                      "one-token/one-representation");

  EXPECT_THROW((void)model->step(state, ids({1, 2}), ids({1, 2, 3})), ValueError);
  EXPECT_THROW((void)model->step(state, ids({1, 8}), ids({1, 2})), ValueError);
  EXPECT_THROW((void)model->step(state, torch::zeros({1, 0}, torch::kLong),
                                 torch::zeros({1, 0}, torch::kLong)),
               ValueError);
  auto wrong_bank = state;
  wrong_bank.banks[0] = empty_cluster_bank(2, 2, 3, 4);
  EXPECT_THROW((void)model->step(wrong_bank, ids({4}), ids({5})), ValueError);
  auto half_cache = state;
  half_cache.near.cache_v[0] = torch::Tensor();
  EXPECT_THROW((void)model->step(half_cache, ids({4}), ids({5})), ValueError)
      << "cache_k without cache_v";
  auto short_cache = state;
  short_cache.near.cache_v[1] = state.near.cache_v[1].narrow(1, 0, 1);
  EXPECT_THROW((void)model->step(short_cache, ids({4}), ids({5})), ValueError)
      << "cache_k and cache_v lengths differ";
  auto missing_bank = state;
  missing_bank.banks.pop_back();
  EXPECT_THROW((void)model->step(missing_bank, ids({4}), ids({5})), ValueError);
}

// ----- the naive MCA step
// ------------------------------------------------------------------------------------------

torch::Tensor naive_layer_norm(const torch::Tensor& x, torch::nn::LayerNorm& ln) {
  const auto mean = x.mean(-1, true);
  const auto var = (x - mean).pow(2).mean(-1, true);
  return (x - mean) / (var + 1e-5).sqrt() * f64(ln->weight) + f64(ln->bias);
}

torch::Tensor naive_linear(const torch::Tensor& x, torch::nn::Linear& l) {
  auto out = torch::matmul(x, f64(l->weight).t());
  return l->bias.defined() ? out + f64(l->bias) : out;
}

/// x rotated pair by pair, (x_a, x_{a+h/2}) by the angle p·10000^(−2a/h).
Vec naive_rope(const Vec& x, int64_t p) {
  const size_t h = x.size(), half = h / 2;
  Vec out(h);
  for (size_t a = 0; a < half; ++a) {
    const double angle = static_cast<double>(p) *
                         std::pow(10000.0, -2.0 * static_cast<double>(a) / static_cast<double>(h));
    out[a] = x[a] * std::cos(angle) - x[a + half] * std::sin(angle);
    out[a + half] = x[a + half] * std::cos(angle) + x[a] * std::sin(angle);
  }
  return out;
}

/// The near field, far field and loss of docs/mechanisms.md#moment-closure-far-field in double by loops: per layer the
/// exact window over the state's raw cache plus the chunk (RoPE once at absolute positions), the state's bank with the
/// un-rotated query, one max-shifted softmax over both, proj and MLP residuals; then the tied head. With far =
/// false the clusters are ignored. far_share (when given) receives per layer the clusters' softmax
/// weight, mean over streams, queries and heads.
torch::Tensor naive_mca_logits(MomentClosureAttention& model, const MomentClosureState& state,
                               const torch::Tensor& x, bool far = true,
                               std::vector<double>* far_share = nullptr) {
  auto& bb = *model->backbone();
  const auto& o = model->options();
  const int64_t B = x.size(0), t = x.size(1), D = o.d_model, H = o.n_head, hd = D / H;
  auto h = f64(bb.tok->weight).index_select(0, x.reshape({-1})).reshape({B, t, D});
  for (size_t l = 0; l < bb.layers.size(); ++l) {
    auto& layer = *bb.layers[l];
    const auto qkv = naive_linear(naive_layer_norm(h, layer.ln1), layer.qkv);
    const auto q = qkv.narrow(-1, 0, D).reshape({B, t, H, hd});
    auto k = qkv.narrow(-1, D, D).reshape({B, t, H, hd});
    auto v = qkv.narrow(-1, 2 * D, D).reshape({B, t, H, hd});
    const auto& ck = state.near.cache_k[l];
    const int64_t c = ck.defined() ? ck.size(1) : 0;
    if (c > 0) {
      k = torch::cat({f64(ck), k}, 1);
      v = torch::cat({f64(state.near.cache_v[l]), v}, 1);
    }
    const int64_t pos = state.near.pos;
    const auto& bank = state.banks[l];
    auto out = torch::zeros({B, t, H, hd}, f64_options());
    double cluster_weight = 0.0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t i = 0; i < t; ++i) {
        const int64_t pi = pos + i;
        for (int64_t head = 0; head < H; ++head) {
          const Vec q_raw = token(q, b, i, head);
          const Vec q_rot = naive_rope(q_raw, pi);
          Vec logits;
          std::vector<Vec> values;
          for (int64_t j = 0; j < c + t; ++j) {
            const int64_t pj = pos - c + j;
            if (pi - pj < 0 || pi - pj >= o.window) continue;
            const Vec k_rot = naive_rope(token(k, b, j, head), pj);
            double s = 0.0;
            for (int64_t a = 0; a < hd; ++a) s += q_rot[a] * k_rot[a];
            logits.push_back(s / std::sqrt(static_cast<double>(hd)));
            values.push_back(token(v, b, j, head));
          }
          for (int64_t cl = 0; far && cl < bank.n_clusters[static_cast<size_t>(b)]; ++cl) {
            const SlotStats s = slot_stats(bank, b, head, cl);
            logits.push_back(hand_logit(q_raw, s));
            values.push_back(hand_out(q_raw, s));
          }
          const double top = *std::max_element(logits.begin(), logits.end());
          double z = 0.0;
          for (const double lg : logits) z += std::exp(lg - top);
          Vec acc(static_cast<size_t>(hd), 0.0);
          for (size_t j = 0; j < logits.size(); ++j) {
            for (int64_t a = 0; a < hd; ++a) acc[a] += std::exp(logits[j] - top) / z * values[j][a];
          }
          for (size_t j = logits.size() - static_cast<size_t>(far ? bank.n_clusters[static_cast<size_t>(b)] : 0);
               j < logits.size(); ++j) {
            cluster_weight += std::exp(logits[j] - top) / z;
          }
          out[b][i][head].copy_(from_values(acc, {hd}));
        }
      }
    }
    if (far_share != nullptr) far_share->push_back(cluster_weight / static_cast<double>(B * t * H));
    h = h + naive_linear(out.reshape({B, t, D}), layer.proj);
    const auto u = naive_linear(naive_layer_norm(h, layer.ln2), layer.fc1);
    h = h + naive_linear(0.5 * u * (1.0 + torch::erf(u / std::sqrt(2.0))), layer.fc2);
  }
  return torch::matmul(naive_layer_norm(h, bb.ln_f), f64(bb.tok->weight).t());
}

double relative_gap(const torch::Tensor& a, const torch::Tensor& b) {
  return (f64(a) - f64(b)).abs().max().item<double>() / f64(b).abs().max().item<double>();
}

/// docs/mechanisms.md#moment-closure-far-field (near field, far field with un-rotated queries against the bank at the
/// start of the step, one joint softmax, the loss): after two chunks (two streams, two layers, window 3,
/// float64), the logits of a third chunk equal naive_mca_logits (relative 1e-10); the far field
/// matters (ignoring it moves the logits by > 1e-6). The step's loss is the mean cross-entropy of
/// those logits; each layer's receipt misfit is the mean over the streams and last_misfit the mean
/// over the layers; each layer's far_attention_share is the clusters' mean weight in that softmax.
TEST(MomentClosureAttentionTest, StepMatchesNaiveJointSoftmax) {
  const uint64_t seed = testing::test_seed(722);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  torch::manual_seed(seed);
  auto o = model_options(3);
  o.vocab = 10;
  o.birth_threshold = 0.5;
  MomentClosureAttention model(o);
  model->to(torch::kFloat64);
  auto state = model->init_state(2);
  for (const int64_t t : {5, 4}) {
    const auto x = random_tokens(rng, 2, t, 0, o.vocab);
    ASSERT_NO_THROW(state = model->step(state, x, x).state);
  }
  for (const auto& bank : state.banks) {
    for (const int64_t n : bank.n_clusters) ASSERT_GT(n, 0);
  }
  const auto x = random_tokens(rng, 2, 4, 0, o.vocab);
  const auto logits = model->advance(state, x).logits;
  ASSERT_EQ(logits.scalar_type(), torch::kFloat64);
  // Receipt aggregation (docs/mechanisms.md#moment-closure-far-field, after all layers): per layer the mean over
  // streams, last_misfit the mean over layers.
  const auto& receipts = model->last_receipts();
  ASSERT_EQ(receipts.size(), 2u);
  double layer_mean = 0.0;
  for (const auto& layer : receipts) {
    EXPECT_EQ(layer.batch_size, 2);
    ASSERT_EQ(layer.streams.size(), 2u);
    EXPECT_NEAR(layer.misfit_scalar,
                0.5 * (layer.streams[0].misfit_scalar + layer.streams[1].misfit_scalar), 1e-12);
    EXPECT_GT(layer.streams[0].misfit_scalar, 0.0);
    layer_mean += 0.5 * layer.misfit_scalar;
  }
  EXPECT_NEAR(model->last_misfit(), layer_mean, 1e-12);
  std::vector<double> far_share;
  const auto expected = naive_mca_logits(model, state, x, /*far=*/true, &far_share);
  EXPECT_LE(relative_gap(logits, expected), 1e-10);
  ASSERT_EQ(far_share.size(), receipts.size());
  for (size_t l = 0; l < receipts.size(); ++l) {
    EXPECT_GT(far_share[l], 0.0);
    EXPECT_NEAR(receipts[l].far_attention_share, far_share[l], 1e-12) << "layer " << l;
  }
  EXPECT_GT(relative_gap(naive_mca_logits(model, state, x, /*far=*/false), expected), 1e-6);
  // step's loss is the mean token cross-entropy of those logits.
  const auto y = random_tokens(rng, 2, 4, 0, o.vocab);
  const auto logp = torch::log_softmax(expected, -1);
  double ce = 0.0;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < 4; ++i) ce -= logp[b][i][y[b][i].item<int64_t>()].item<double>() / 8.0;
  }
  EXPECT_NEAR(model->step(state, x, y).loss.item<double>(), ce, 1e-10 * ce);
}

// ----- MCA-10
// ------------------------------------------------------------------------------------------------------

void expect_receipts_equal(const StreamReceipt& a, const StreamReceipt& e) {
  EXPECT_EQ(a.birthed, e.birthed);
  EXPECT_EQ(a.birth_incorporated_batch, e.birth_incorporated_batch);
  EXPECT_EQ(a.merged, e.merged);
  ExpectAllClose(a.merge_distances, e.merge_distances, kRtol64, kAtol64);
  ASSERT_EQ(a.misfit.size(), e.misfit.size());
  for (const auto& [c, m] : e.misfit) {
    ASSERT_EQ(a.misfit.count(c), 1u);
    EXPECT_NEAR(a.misfit.at(c), m, kAtol64 + kRtol64 * std::fabs(m));
  }
  EXPECT_NEAR(a.misfit_scalar, e.misfit_scalar, kAtol64 + kRtol64 * std::fabs(e.misfit_scalar));
  ASSERT_EQ(a.per_cluster_outlier_tokens.size(), e.per_cluster_outlier_tokens.size());
  for (const auto& [c, out] : e.per_cluster_outlier_tokens) {
    ASSERT_EQ(a.per_cluster_outlier_tokens.count(c), 1u);
    const auto& got = a.per_cluster_outlier_tokens.at(c);
    EXPECT_EQ(got.indices, out.indices);
    EXPECT_EQ(got.member_indices, out.member_indices);
    ExpectAllClose(to_vector(got.k), to_vector(out.k), kRtol64, kAtol64);
    ExpectAllClose(to_vector(got.v), to_vector(out.v), kRtol64, kAtol64);
  }
  EXPECT_EQ(a.soft_update_applied, e.soft_update_applied);
  ExpectAllClose(a.ingested_tokens_per_head, e.ingested_tokens_per_head, kRtol64, 1e-9);
  EXPECT_EQ(a.expected_ingested_tokens_per_head, e.expected_ingested_tokens_per_head);
  EXPECT_EQ(a.count_conserved, e.count_conserved);
  ASSERT_EQ(a.accounting.has_value(), e.accounting.has_value());
  if (e.accounting) {
    EXPECT_EQ(a.accounting->positions_seen, e.accounting->positions_seen);
    EXPECT_EQ(a.accounting->near_tokens, e.accounting->near_tokens);
    EXPECT_EQ(a.accounting->evicted_tokens, e.accounting->evicted_tokens);
    ExpectAllClose(a.accounting->far_tokens_per_head, e.accounting->far_tokens_per_head, kRtol64,
                   1e-9);
    EXPECT_EQ(a.accounting->expected_far_tokens_per_head,
              e.accounting->expected_far_tokens_per_head);
    EXPECT_EQ(a.accounting->overlap_tokens, e.accounting->overlap_tokens);
    EXPECT_EQ(a.accounting->conserved, e.accounting->conserved);
  }
}

/// Stream b of a batched bank against a batch-size-1 bank.
void expect_stream_bank_equal(const ClusterBank& batched, int64_t b, const ClusterBank& alone) {
  EXPECT_EQ(batched.n_clusters[static_cast<size_t>(b)], alone.n_clusters[0]);
  ExpectAllClose(to_vector(batched.count[b]), to_vector(alone.count[0]), kRtol64, 1e-9);
  ExpectAllClose(to_vector(batched.mu_k[b]), to_vector(alone.mu_k[0]), kRtol64, kAtol64);
  ExpectAllClose(to_vector(batched.mu_v[b]), to_vector(alone.mu_v[0]), kRtol64, kAtol64);
  ExpectAllClose(to_vector(batched.sigma_kk[b]), to_vector(alone.sigma_kk[0]), kRtol64, kAtol64);
  ExpectAllClose(to_vector(batched.sigma_vk[b]), to_vector(alone.sigma_vk[0]), kRtol64, kAtol64);
}

std::string structure(const std::vector<LayerReceipt>& receipts, int64_t b,
                      const MomentClosureState& s) {
  std::string out;
  for (size_t l = 0; l < receipts.size(); ++l) {
    const auto& r = receipts[l].streams[static_cast<size_t>(b)];
    out += "[n" + std::to_string(s.banks[l].n_clusters[static_cast<size_t>(b)]) +
           (r.birthed ? " birth" : "") +
           (r.merged.empty() ? "" : " merge" + std::to_string(r.merged.size())) + "]";
  }
  return out;
}

/// MCA-10 (the batch axis of docs/porting.md): with two streams in one batch (float64, two layers, window 3,
/// max_clusters 3, five chunks of 4), every step's per-stream logits, caches, banks (every tensor
/// and n_clusters) and receipts equal those of running each stream alone with batch size 1
/// (relative 1e-10). Four (birth, merge) threshold settings are run; in at least one of them the
/// two streams' births/merges differ (so the check sees structurally different banks side by side).
TEST(MomentClosureAttentionTest, StreamsDoNotLeak) {
  const uint64_t seed = testing::test_seed(723);
  SCOPED_TRACE("seed " + std::to_string(seed));
  bool any_structural_difference = false;
  const std::vector<std::pair<double, std::optional<double>>> settings = {
      {1.0, std::nullopt}, {2.0, std::nullopt}, {3.0, 1.0}, {2.0, 0.5}};
  for (const auto& [birth, merge] : settings) {
    SCOPED_TRACE("birth " + std::to_string(birth) + ", merge " +
                 (merge ? std::to_string(*merge) : "default"));
    Rng rng(seed);
    torch::manual_seed(seed);
    MomentClosureOptions o = model_options(3);
    o.vocab = 16;
    o.birth_threshold = birth;
    o.merge_threshold = merge;
    MomentClosureAttention model(o);
    model->to(torch::kFloat64);
    auto batched = model->init_state(2);
    std::vector<MomentClosureState> alone = {model->init_state(1), model->init_state(1)};
    std::string trace[2];
    for (int64_t step = 0; step < 5; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      // Stream 0 reads tokens 0..5, stream 1 tokens 6..15: different keys, different mixtures.
      const auto x =
          torch::cat({random_tokens(rng, 1, 4, 0, 6), random_tokens(rng, 1, 4, 6, 16)}, 0);
      const auto out = model->advance(batched, x);
      const auto batched_receipts = model->last_receipts();
      for (int64_t b = 0; b < 2; ++b) {
        SCOPED_TRACE("stream " + std::to_string(b));
        const auto single = model->advance(alone[static_cast<size_t>(b)], x.narrow(0, b, 1));
        const auto& single_receipts = model->last_receipts();
        EXPECT_LE(relative_gap(out.logits[b], single.logits[0]), kRtol64);
        for (size_t l = 0; l < single_receipts.size(); ++l) {
          SCOPED_TRACE("layer " + std::to_string(l));
          expect_receipts_equal(batched_receipts[l].streams[static_cast<size_t>(b)],
                                single_receipts[l].streams[0]);
          expect_stream_bank_equal(out.state.banks[l], b, single.state.banks[l]);
          ExpectAllClose(to_vector(out.state.near.cache_k[l][b]),
                         to_vector(single.state.near.cache_k[l][0]), kRtol64, kAtol64);
          ExpectAllClose(to_vector(out.state.near.cache_v[l][b]),
                         to_vector(single.state.near.cache_v[l][0]), kRtol64, kAtol64);
        }
        trace[b] += structure(batched_receipts, b, out.state);
        alone[static_cast<size_t>(b)] = single.state;
      }
      batched = out.state;
    }
    std::printf("MCA-10 birth %.1f merge %s: stream 0 %s | stream 1 %s\n", birth,
                merge ? std::to_string(*merge).c_str() : "default", trace[0].c_str(),
                trace[1].c_str());
    any_structural_difference = any_structural_difference || trace[0] != trace[1];
  }
  EXPECT_TRUE(any_structural_difference) << "no setting made the two streams' births/merges differ";
}

/// MCA-10 (second half): changing stream 1's tokens leaves stream 0's logits and its cross-entropy
/// contribution unchanged over five chunks (float64, relative 1e-10), while stream 1's logits do
/// change.
TEST(MomentClosureAttentionTest, OtherStreamTokensDoNotChangeALoss) {
  const uint64_t seed = testing::test_seed(724);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  torch::manual_seed(seed);
  auto o = model_options(3);
  o.vocab = 16;
  o.birth_threshold = 2.0;
  MomentClosureAttention model(o);
  model->to(torch::kFloat64);
  auto first = model->init_state(2), second = model->init_state(2);
  for (int64_t step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const auto x0 = random_tokens(rng, 1, 4, 0, 16), y0 = random_tokens(rng, 1, 4, 0, 16);
    const auto x = torch::cat({x0, random_tokens(rng, 1, 4, 0, 16)}, 0);
    const auto x_other = torch::cat({x0, random_tokens(rng, 1, 4, 0, 16)}, 0);
    const auto a = model->advance(first, x), b = model->advance(second, x_other);
    EXPECT_LE(relative_gap(a.logits[0], b.logits[0]), kRtol64);
    const auto ce = [&](const torch::Tensor& logits) {
      return torch::nn::functional::cross_entropy(logits[0], y0[0]).item<double>();
    };
    EXPECT_NEAR(ce(a.logits), ce(b.logits), 1e-10 * ce(a.logits));
    if (!torch::equal(x[1], x_other[1])) {
      EXPECT_GT(relative_gap(a.logits[1], b.logits[1]), 1e-6);
    }
    first = a.state;
    second = b.state;
  }
}

// ----- MCA-11
// ------------------------------------------------------------------------------------------------------

void expect_no_graph(const MomentClosureState& s) {
  for (size_t l = 0; l < s.near.cache_k.size(); ++l) {
    ASSERT_TRUE(s.near.cache_k[l].defined());
    EXPECT_FALSE(s.near.cache_k[l].requires_grad());
    EXPECT_FALSE(s.near.cache_v[l].requires_grad());
  }
  for (const auto& bank : s.banks) {
    for (const auto* t : {&bank.count, &bank.mu_k, &bank.mu_v, &bank.sigma_kk, &bank.sigma_vk}) {
      EXPECT_FALSE(t->requires_grad());
    }
  }
}

bool bank_has_graph(const ClusterBank& bank) {
  return bank.count.requires_grad() && bank.mu_k.requires_grad() && bank.mu_v.requires_grad() &&
         bank.sigma_kk.requires_grad() && bank.sigma_vk.requires_grad();
}

MomentClosureOptions tbptt_options() {
  MomentClosureOptions o;
  o.vocab = 12;
  o.d_model = 16;
  o.n_layer = 1;
  o.n_head = 2;
  o.window = 4;
  return o;
}

/// MCA-11: train_tbptt over 4 chunks of 6 (batch 2; vocab 12, d 16, one layer, two heads, window 4)
/// gives 4 finite losses and a final state whose caches and bank tensors carry no graph (20 tokens
/// per head in the bank); a further step's backward succeeds and reaches the parameters; detach()
/// of that step's state cuts its graph again without changing a value.
TEST(MomentClosureAttentionTest, TbpttTrainsAndDetachCutsTheGraph) {
  const uint64_t seed = testing::test_seed(725);
  Rng rng(seed);
  torch::manual_seed(seed);
  MomentClosureAttention model(tbptt_options());
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
  std::vector<std::pair<torch::Tensor, torch::Tensor>> chunks;
  for (int c = 0; c < 4; ++c)
    chunks.emplace_back(random_tokens(rng, 2, 6, 0, 12), random_tokens(rng, 2, 6, 0, 12));
  auto result = train_tbptt(*model, model->init_state(2), chunks, opt);
  ASSERT_EQ(result.losses.size(), 4u);
  for (const double loss : result.losses) {
    EXPECT_TRUE(std::isfinite(loss));
    EXPECT_GT(loss, 0.0);
  }
  EXPECT_EQ(result.state.near.pos, 24);
  expect_no_graph(result.state);
  ExpectAllClose(to_vector(result.state.banks[0].total_per_head()), {20.0, 20.0, 20.0, 20.0}, 0.0,
                 1e-3);

  const auto x = random_tokens(rng, 2, 6, 0, 12), y = random_tokens(rng, 2, 6, 0, 12);
  auto next = model->step(result.state, x, y);
  opt.zero_grad();
  ASSERT_NO_THROW(next.loss.backward());
  const auto& grad = model->backbone()->layers[0]->qkv->weight.grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_TRUE(torch::isfinite(grad).all().item<bool>());
  EXPECT_GT(grad.abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(next.state.near.cache_k[0].requires_grad());
  const auto cut = model->detach(next.state);
  expect_no_graph(cut);
  EXPECT_EQ(cut.near.pos, next.state.near.pos);
  EXPECT_TRUE(torch::equal(cut.near.cache_k[0], next.state.near.cache_k[0]));
  EXPECT_TRUE(torch::equal(cut.banks[0].sigma_vk, next.state.banks[0].sigma_vk));
  EXPECT_EQ(cut.banks[0].n_clusters, next.state.banks[0].n_clusters);
  // A second TBPTT pass from the detached state (horizon 3: one update of 3 chunks, then a flushed
  // remainder).
  TbpttOptions horizon;
  horizon.detach_horizon = 3;
  const auto again = train_tbptt(*model, cut, chunks, opt, horizon);
  for (const double loss : again.losses) EXPECT_TRUE(std::isfinite(loss));
  expect_no_graph(again.state);
}

/// MCA-11 / docs/mechanisms.md#moment-closure-far-field: detach() always cuts the caches; it cuts the banks iff
/// detach_horizon_clusters. After a birth and a soft update (birth threshold −1e6, so the second
/// eviction cannot birth) the banks carry a graph; with the flag false they keep it after detach(),
/// with the flag true they lose it. step() carries the flag forward.
TEST(MomentClosureAttentionTest, DetachKeepsBankGraphWhenAsked) {
  const uint64_t seed = testing::test_seed(726);
  Rng rng(seed);
  torch::manual_seed(seed);
  auto o = tbptt_options();
  o.birth_threshold = -1e6;
  MomentClosureAttention model(o);
  for (const bool detach_banks : {false, true}) {
    SCOPED_TRACE(detach_banks ? "detach_horizon_clusters true" : "detach_horizon_clusters false");
    auto state = model->init_state(2);
    state.detach_horizon_clusters = detach_banks;
    for (int c = 0; c < 2; ++c) {
      const auto x = random_tokens(rng, 2, 6, 0, 12);
      state = model->step(state, x, x).state;
    }
    EXPECT_EQ(state.detach_horizon_clusters, detach_banks);
    EXPECT_TRUE(model->last_receipts()[0].streams[0].soft_update_applied);
    ASSERT_TRUE(bank_has_graph(state.banks[0]));
    const auto cut = model->detach(state);
    EXPECT_FALSE(cut.near.cache_k[0].requires_grad());
    EXPECT_FALSE(cut.near.cache_v[0].requires_grad());
    EXPECT_EQ(bank_has_graph(cut.banks[0]), !detach_banks);
    if (!detach_banks) {
      EXPECT_TRUE(cut.banks[0].mu_k.is_same(state.banks[0].mu_k));
      // The kept graph reaches the parameters: the bank's statistics depend on the qkv weights.
      const auto g = torch::autograd::grad({cut.banks[0].mu_k.sum()},
                                           {model->backbone()->layers[0]->qkv->weight});
      EXPECT_GT(g[0].abs().sum().item<double>(), 0.0);
    } else {
      EXPECT_FALSE(cut.banks[0].mu_k.requires_grad());
    }
  }
}

}  // namespace
}  // namespace attnmix::stream
