// SPDX-License-Identifier: Apache-2.0
// Int8 keys and values and the outlier store (stream/kv_quantization.hpp): the affine round trip against a scalar
// oracle and its half-step bound, the store's bounded per-cluster selection by residual (merges, evictions, no
// cross-stream leakage), store attention against brute force, and "moment closure + outliers" in the full model:
// bounded state, overlap accounting, streams independent of each other, gradients by finite differences.
#include "attnmix/stream/kv_quantization.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "attnmix/stream/self_attention.hpp"

namespace attnmix::stream {
namespace {

// ---- quantize_kv_cache / dequantize_kv_cache -----------------------------------------------------------------

/// The codes and reconstruction from the formula, one scalar at a time (independent of the tensor code).
TEST(KvQuantization, MatchesAScalarOracleWithinHalfAStep) {
  torch::manual_seed(5);
  const auto x = torch::randn({3, 7, 2, 8}) * 3.0 + 1.0;
  const auto q = quantize_kv_cache(x);
  ASSERT_EQ(q.codes.scalar_type(), torch::kChar);
  ASSERT_EQ(q.codes.sizes(), x.sizes());
  ASSERT_EQ(q.low.sizes(), (c10::IntArrayRef{3, 7, 2}));
  const auto x_hat = dequantize_kv_cache(q);
  const auto rows = x.reshape({-1, 8});
  const auto codes = q.codes.reshape({-1, 8});
  const auto rebuilt = x_hat.reshape({-1, 8});
  for (int64_t r = 0; r < rows.size(0); ++r) {
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (int64_t j = 0; j < 8; ++j) {
      lo = std::min(lo, rows[r][j].item<double>());
      hi = std::max(hi, rows[r][j].item<double>());
    }
    const double scale = static_cast<float>((hi - lo) / 255.0);
    for (int64_t j = 0; j < 8; ++j) {
      const double value = rows[r][j].item<double>();
      const auto code = codes[r][j].item<int64_t>();
      EXPECT_EQ(code, static_cast<int64_t>(std::lround((value - lo) / scale)) - 128) << r << "," << j;
      EXPECT_LE(std::abs(rebuilt[r][j].item<double>() - value), scale / 2 + 1e-5) << r << "," << j;
    }
  }
  // Each row's minimum comes back exactly; its maximum to float32 rounding.
  EXPECT_TRUE(torch::equal(std::get<0>(x_hat.min(-1)), std::get<0>(x.min(-1))));
  EXPECT_TRUE(torch::allclose(std::get<0>(x_hat.max(-1)), std::get<0>(x.max(-1)), 1e-5, 1e-5));
  EXPECT_EQ(q.bytes(), 3 * 7 * 2 * 8 + 2 * 3 * 7 * 2 * 4);
}

TEST(KvQuantization, ConstantRowsAreExactAndBadInputIsRejected) {
  const auto x = torch::full({2, 4}, -2.5, torch::kDouble);
  const auto q = quantize_kv_cache(x);
  EXPECT_TRUE(torch::equal(q.scale, torch::zeros({2})));
  EXPECT_TRUE(torch::equal(dequantize_kv_cache(q, torch::kDouble), x));
  EXPECT_THROW(quantize_kv_cache(torch::ones({2, 3}, torch::kLong)), ValueError);
  EXPECT_THROW(quantize_kv_cache(torch::tensor(1.0)), ValueError);
  EXPECT_THROW(quantize_kv_cache(torch::tensor({1.0, std::nan("")})), ValueError);
  EXPECT_THROW(quantize_kv_cache(torch::Tensor()), ValueError);
  auto broken = q;
  broken.low = torch::zeros({3});
  EXPECT_THROW(dequantize_kv_cache(broken), ValueError);
}

// ---- the outlier store ---------------------------------------------------------------------------------------

constexpr int64_t kHeads = 2, kDim = 4;

/// Outliers of one cluster: n tokens whose k and v rows are all `base + i`, with the given residuals.
OutlierTokens outliers(const std::vector<double>& residuals, double base) {
  const auto n = static_cast<int64_t>(residuals.size());
  OutlierTokens o;
  o.k = (torch::arange(n, torch::kFloat).view({n, 1, 1}) + base).expand({n, kHeads, kDim}).contiguous();
  o.k = o.k + torch::linspace(0.0, 1.0, kDim).view({1, 1, kDim});  // rows that are not constant
  o.v = -o.k;
  o.residuals = residuals;
  for (int64_t i = 0; i < n; ++i) o.indices.push_back(i);
  return o;
}

/// The residuals a stream's store holds for cluster c, largest first.
std::vector<double> held_residuals(const OutlierStore& s, int64_t b, int64_t c) {
  std::vector<double> out;
  for (int64_t slot = 0; slot < s.slots(); ++slot) {
    if (s.owner[static_cast<size_t>(b * s.slots() + slot)] == c) out.push_back(s.residual[static_cast<size_t>(b * s.slots() + slot)]);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

TEST(OutlierStore, KeepsTheLargestResidualsPerClusterAndStream) {
  auto store = empty_outlier_store(2, kHeads, 3, kDim, 2);
  EXPECT_EQ(store.slots(), 6);
  EXPECT_EQ(store.held(0), 0);
  std::vector<StreamReceipt> receipts(2);
  receipts[0].per_cluster_outlier_tokens[0] = outliers({5.0, 3.0, 1.0}, 0.0);
  receipts[0].per_cluster_outlier_tokens[1] = outliers({2.0}, 10.0);
  auto update = quantize_cluster_outliers(store, receipts, {2, 0});
  EXPECT_EQ(update.receipt.offered, 4);
  EXPECT_EQ(update.receipt.stored, 3);  // cluster 0 keeps two of its three
  EXPECT_EQ(update.receipt.evicted, 0);
  EXPECT_EQ(update.receipt.held, 3);
  EXPECT_EQ(update.store.held(1), 0);  // stream 1 reported nothing and holds nothing
  EXPECT_EQ(held_residuals(update.store, 0, 0), (std::vector<double>{5.0, 3.0}));
  EXPECT_EQ(held_residuals(update.store, 0, 1), (std::vector<double>{2.0}));
  EXPECT_GT(update.receipt.max_reconstruction_error, 0.0);
  EXPECT_LE(update.receipt.max_reconstruction_error, 1.0 / 255.0 / 2 + 1e-6);  // rows span 1: step 1/255
  EXPECT_EQ(store.held(0), 0);  // the input store is unchanged

  // A larger residual evicts the smallest; a smaller one is refused; stream 1 fills without touching stream 0.
  std::vector<StreamReceipt> next(2);
  next[0].per_cluster_outlier_tokens[0] = outliers({4.0, 0.5}, 20.0);
  next[1].per_cluster_outlier_tokens[0] = outliers({9.0}, 30.0);
  const auto before = update.store;
  auto second = quantize_cluster_outliers(update.store, next, {2, 1});
  EXPECT_EQ(second.receipt.offered, 3);
  EXPECT_EQ(second.receipt.stored, 2);
  EXPECT_EQ(second.receipt.evicted, 1);
  EXPECT_EQ(held_residuals(second.store, 0, 0), (std::vector<double>{5.0, 4.0}));
  EXPECT_EQ(held_residuals(second.store, 1, 0), (std::vector<double>{9.0}));
  // A token that stays keeps its slot and its codes.
  for (int64_t slot = 0; slot < before.slots(); ++slot) {
    if (before.owner[static_cast<size_t>(slot)] < 0 || before.residual[static_cast<size_t>(slot)] == 3.0) continue;
    EXPECT_EQ(second.store.owner[static_cast<size_t>(slot)], before.owner[static_cast<size_t>(slot)]);
    EXPECT_TRUE(torch::equal(second.store.k.codes[0][slot], before.k.codes[0][slot]));
    EXPECT_TRUE(torch::equal(second.store.v.scale[0][slot], before.v.scale[0][slot]));
  }
  // The stored rows decode to the reported tokens: cluster 1 of stream 0 holds base 10.
  for (int64_t slot = 0; slot < second.store.slots(); ++slot) {
    if (second.store.owner[static_cast<size_t>(slot)] != 1) continue;
    const auto k_hat = dequantize_kv_cache(second.store.k);
    EXPECT_TRUE(torch::allclose(k_hat[0][slot], outliers({2.0}, 10.0).k[0], 0.0, 1e-2));
  }
}

TEST(OutlierStore, FollowsMergesAndDropsVanishedClusters) {
  auto store = empty_outlier_store(1, kHeads, 3, kDim, 2);
  std::vector<StreamReceipt> fill(1);
  fill[0].per_cluster_outlier_tokens[0] = outliers({1.0, 2.0}, 0.0);
  fill[0].per_cluster_outlier_tokens[1] = outliers({3.0, 4.0}, 5.0);
  fill[0].per_cluster_outlier_tokens[2] = outliers({6.0}, 9.0);
  store = quantize_cluster_outliers(store, fill, {3}).store;
  // Cluster 1 merges into 0 and the last cluster (2) moves into slot 1: cluster 0 keeps its two largest.
  std::vector<StreamReceipt> merge(1);
  merge[0].merged = {{0, 1}};
  const auto merged = quantize_cluster_outliers(store, merge, {2});
  EXPECT_EQ(held_residuals(merged.store, 0, 0), (std::vector<double>{4.0, 3.0}));
  EXPECT_EQ(held_residuals(merged.store, 0, 1), (std::vector<double>{6.0}));
  EXPECT_EQ(merged.receipt.evicted, 2);
  EXPECT_EQ(merged.receipt.held, 3);
  EXPECT_THROW(quantize_cluster_outliers(store, std::vector<StreamReceipt>(2), {3, 3}), ValueError);
  std::vector<StreamReceipt> wrong(1);
  wrong[0].per_cluster_outlier_tokens[0] = outliers({7.0}, 0.0);
  wrong[0].per_cluster_outlier_tokens[0].k = torch::zeros({1, kHeads, kDim + 1});
  EXPECT_THROW(quantize_cluster_outliers(store, wrong, {3}), ValueError);
}

/// With differentiable sources the reconstructions equal the decoded codes and pass the gradient straight through
/// the rounding to the source rows the store kept (and to no other row); without gradients nothing is built.
TEST(OutlierStore, StoredTokensPassTheGradientStraightThrough) {
  torch::manual_seed(9);
  const auto k_source = torch::randn({2, 5, kHeads, kDim}, torch::kDouble).requires_grad_();
  const auto v_source = torch::randn({2, 5, kHeads, kDim}, torch::kDouble).requires_grad_();
  std::vector<StreamReceipt> receipts(2);
  const auto reported = [&](int64_t b, std::vector<int64_t> tokens, std::vector<double> residuals) {
    OutlierTokens o;
    const auto index = torch::tensor(tokens, torch::kLong);
    o.k = k_source[b].detach().index_select(0, index);
    o.v = v_source[b].detach().index_select(0, index);
    o.indices = std::move(tokens);
    o.residuals = std::move(residuals);
    return o;
  };
  receipts[0].per_cluster_outlier_tokens[0] = reported(0, {3, 1, 4}, {3.0, 2.0, 1.0});
  receipts[1].per_cluster_outlier_tokens[0] = reported(1, {2}, {5.0});
  const auto store = empty_outlier_store(2, kHeads, 1, kDim, 2);
  const auto update = quantize_cluster_outliers(store, receipts, {1, 1}, k_source, v_source);
  ASSERT_TRUE(update.store.k_hat.defined());
  EXPECT_TRUE(torch::equal(update.store.k_hat.detach(), dequantize_kv_cache(update.store.k, torch::kDouble)));
  EXPECT_TRUE(torch::equal(update.store.v_hat.detach(), dequantize_kv_cache(update.store.v, torch::kDouble)));
  const auto weights = torch::randn(update.store.k_hat.sizes(), torch::kDouble);
  const auto grads = torch::autograd::grad({(update.store.k_hat * weights).sum() + update.store.v_hat.sum()},
                                           {k_source, v_source});
  auto expected_k = torch::zeros_like(k_source);
  auto expected_v = torch::zeros_like(v_source);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t slot = 0; slot < update.store.slots(); ++slot) {
      if (update.store.owner[static_cast<size_t>(b * update.store.slots() + slot)] < 0) continue;
      const double r = update.store.residual[static_cast<size_t>(b * update.store.slots() + slot)];
      const int64_t token = b == 1 ? 2 : (r == 3.0 ? 3 : 1);
      expected_k[b][token] += weights[b][slot];
      expected_v[b][token] += 1.0;
    }
  }
  EXPECT_TRUE(torch::equal(grads[0], expected_k));
  EXPECT_TRUE(torch::equal(grads[1], expected_v));
  EXPECT_DOUBLE_EQ(expected_v.sum().item<double>(), 3 * kHeads * kDim);  // three tokens kept: 3, 1 and stream 1's 2
  EXPECT_FALSE(update.store.detach().k_hat.defined());
  torch::NoGradGuard no_grad;
  // Without gradients no reconstruction is built, and a store's earlier ones are dropped (the codes change).
  EXPECT_FALSE(quantize_cluster_outliers(update.store, receipts, {1, 1}, k_source, v_source).store.k_hat.defined());
}

TEST(OutlierStore, AttentionMatchesBruteForce) {
  auto store = empty_outlier_store(2, kHeads, 2, kDim, 2);
  std::vector<StreamReceipt> fill(2);
  fill[0].per_cluster_outlier_tokens[1] = outliers({1.0, 2.0}, 0.5);
  fill[1].per_cluster_outlier_tokens[0] = outliers({3.0}, -1.0);
  store = quantize_cluster_outliers(store, fill, {2, 1}).store;
  torch::manual_seed(2);
  const auto q = torch::randn({2, 3, kHeads, kDim});
  const auto terms = outlier_attention(q, store);
  ASSERT_EQ(terms.logits.sizes(), (c10::IntArrayRef{2, 3, store.slots(), kHeads}));
  const auto k_hat = dequantize_kv_cache(store.k);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t s = 0; s < store.slots(); ++s) {
      const bool used = store.owner[static_cast<size_t>(b * store.slots() + s)] >= 0;
      for (int64_t i = 0; i < 3; ++i) {
        for (int64_t h = 0; h < kHeads; ++h) {
          const double logit = terms.logits[b][i][s][h].item<double>();
          if (!used) {
            EXPECT_EQ(logit, -std::numeric_limits<double>::infinity());
            continue;
          }
          double dot = 0.0;
          for (int64_t j = 0; j < kDim; ++j) dot += q[b][i][h][j].item<double>() * k_hat[b][s][h][j].item<double>();
          EXPECT_NEAR(logit, dot / 2.0, 1e-5);  // √d = 2
        }
      }
    }
  }
  EXPECT_TRUE(torch::allclose(terms.values, dequantize_kv_cache(store.v)));
}

// ---- moment closure + outliers -------------------------------------------------------------------------------

MomentClosureOptions outlier_model_options(int64_t capacity) {
  MomentClosureOptions o;
  o.vocab = 13;
  o.d_model = 8;
  o.n_layer = 2;
  o.n_head = 2;
  o.window = 4;
  o.max_clusters = 3;
  o.outlier_capacity = capacity;
  return o;
}

MomentClosureAttention outlier_model(int64_t capacity) {
  torch::manual_seed(11);
  return MomentClosureAttention(outlier_model_options(capacity));
}

torch::Tensor tokens(int64_t b, int64_t t, uint64_t seed) {
  torch::manual_seed(static_cast<int64_t>(seed));
  return torch::randint(0, 13, {b, t}, torch::kLong);
}

struct Streamed {
  torch::Tensor logits;
  MomentClosureState state;
};

Streamed stream(MomentClosureAttention& model, const torch::Tensor& x, int64_t chunk) {
  auto state = model->init_state(x.size(0));
  std::vector<torch::Tensor> logits;
  for (int64_t start = 0; start < x.size(1); start += chunk) {
    auto out = model->advance(state, x.narrow(1, start, std::min(chunk, x.size(1) - start)));
    state = std::move(out.state);
    logits.push_back(out.logits);
  }
  return {torch::cat(logits, 1), std::move(state)};
}

TEST(MomentClosureOutliers, StoreIsBoundedAccountedAndUsed) {
  auto with = outlier_model(2);
  auto without = outlier_model(0);
  torch::NoGradGuard no_grad;
  const auto x = tokens(2, 48, 3);
  const auto a = stream(with, x, 8);
  const auto b = stream(without, x, 8);
  ASSERT_EQ(a.state.stores.size(), 2U);
  EXPECT_TRUE(b.state.stores.empty());
  EXPECT_TRUE(torch::isfinite(a.logits).all().item<bool>());
  int64_t held = 0;
  for (const auto& store : a.state.stores) {
    for (int64_t s = 0; s < 2; ++s) {
      EXPECT_GT(store.held(s), 0);
      EXPECT_LE(store.held(s), 3 * 2);
      held += store.held(s);
    }
  }
  EXPECT_EQ(a.state.bytes(), b.state.bytes() + a.state.stores[0].bytes() + a.state.stores[1].bytes());
  // The same parameters: the first chunk (nothing evicted yet) agrees; later ones see the store.
  EXPECT_TRUE(torch::equal(a.logits.narrow(1, 0, 8), b.logits.narrow(1, 0, 8)));
  EXPECT_FALSE(torch::allclose(a.logits.narrow(1, 40, 8), b.logits.narrow(1, 40, 8)));
  // Every stream's accounting still counts each evicted token once in the bank, and the stored copies as overlap.
  const auto& receipts = with->last_receipts();
  ASSERT_EQ(receipts.size(), 2U);
  for (size_t l = 0; l < receipts.size(); ++l) {
    ASSERT_TRUE(receipts[l].outliers.has_value());
    EXPECT_EQ(receipts[l].outliers->bytes, a.state.stores[l].bytes());
    for (int64_t s = 0; s < 2; ++s) {
      const auto& accounting = receipts[l].streams[static_cast<size_t>(s)].accounting;
      ASSERT_TRUE(accounting.has_value());
      EXPECT_TRUE(accounting->conserved);
      EXPECT_EQ(accounting->overlap_tokens, a.state.stores[l].held(s));
    }
  }
  EXPECT_GT(held, 0);
}

TEST(MomentClosureOutliers, StreamsDoNotLeakIntoEachOther) {
  auto model = outlier_model(2);
  torch::NoGradGuard no_grad;
  const auto x = tokens(2, 40, 4);
  const auto both = stream(model, x, 8);
  for (int64_t s = 0; s < 2; ++s) {
    const auto alone = stream(model, x.narrow(0, s, 1), 8);
    EXPECT_TRUE(torch::allclose(both.logits.narrow(0, s, 1), alone.logits, 1e-5, 1e-5)) << "stream " << s;
    for (size_t l = 0; l < alone.state.stores.size(); ++l) {
      EXPECT_EQ(alone.state.stores[l].held(0), both.state.stores[l].held(s));
    }
  }
}

TEST(MomentClosureOutliers, RejectsAStateWithoutItsStores) {
  auto model = outlier_model(2);
  auto state = model->init_state(1);
  state.stores.clear();
  EXPECT_THROW(model->advance(state, tokens(1, 4, 1)), ValueError);
  auto other = outlier_model(0)->init_state(1);
  EXPECT_THROW(model->advance(other, tokens(1, 4, 1)), ValueError);
  auto bad = outlier_model_options(2);
  bad.outlier_capacity = -1;
  EXPECT_THROW(MomentClosureAttention{bad}, ValueError);
}

/// The sublayer's output with a filled store, differentiated by finite differences in float64 (the store is a
/// constant; the gradient reaches x through q, k, v of the window, the clusters' logits and the stored keys' logits).
TEST(MomentClosureOutliers, SublayerGradientMatchesFiniteDifferences) {
  torch::manual_seed(7);
  const int64_t d = 8, H = 2, hd = 4;
  torch::nn::Linear qkv(d, 3 * d), proj(d, d);
  qkv->to(torch::kDouble);
  proj->to(torch::kDouble);
  // A bank and a store from an earlier chunk of random tokens.
  const auto k0 = torch::randn({1, 12, H, hd}, torch::kDouble);
  const auto v0 = torch::randn({1, 12, H, hd}, torch::kDouble);
  auto ingested = ingest_cluster_batch(empty_cluster_bank(1, H, 3, hd, torch::kDouble), k0, v0);
  auto store = quantize_cluster_outliers(empty_outlier_store(1, H, 3, hd, 2), ingested.receipts,
                                         ingested.bank.n_clusters)
                   .store;
  ASSERT_GT(store.held(0), 0);
  const auto cache_k = torch::randn({1, 4, H, hd}, torch::kDouble);
  const auto cache_v = torch::randn({1, 4, H, hd}, torch::kDouble);
  const auto g = near_field_geometry(16, 3, 4, hd, 4, torch::kDouble, torch::kCPU);
  const auto loss = [&](const torch::Tensor& x) {
    return moment_closure_sublayer(*qkv, *proj, x, cache_k, cache_v, ingested.bank, g, H, {}, "layer", &store)
        .out.pow(2)
        .sum();
  };
  const auto x = torch::randn({1, 3, d}, torch::kDouble).requires_grad_();
  const auto grad = torch::autograd::grad({loss(x)}, {x})[0];
  torch::NoGradGuard no_grad;
  const double eps = 1e-6;
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < d; j += 3) {
      auto plus = x.detach().clone();
      auto minus = x.detach().clone();
      plus[0][i][j] += eps;
      minus[0][i][j] -= eps;
      const double numeric = (loss(plus).item<double>() - loss(minus).item<double>()) / (2 * eps);
      EXPECT_NEAR(grad[0][i][j].item<double>(), numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace attnmix::stream
