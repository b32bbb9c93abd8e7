// SPDX-License-Identifier: Apache-2.0
// The attention sublayers as modules (include/attnmix/stream/self_attention.hpp).
//
// The mechanisms run their layers' attention through the same sublayer functions as the modules, so
// a model built by hand around the modules — embedding, ln1 → module → residual + MLP (the
// mechanism's own SpineLayer::finish), tied head — with the mechanism's weights must reproduce the
// mechanism bitwise: logits, caches, banks, receipts and gradients (same operations in the same
// order). The attention math itself is checked against oracles in context_spine_test.cpp,
// moment_closure_test.cpp and tests/python/test_torch_layers.py.
#include "attnmix/stream/self_attention.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "testing/torch_values.hpp"

namespace attnmix::stream {
namespace {

/// Options of a moment-closure layer (the thresholds at their defaults).
MomentClosureSelfAttentionOptions closure_options(int64_t d_model, int64_t n_head, int64_t window,
                                                  int64_t max_clusters) {
  MomentClosureSelfAttentionOptions o;
  o.d_model = d_model;
  o.n_head = n_head;
  o.window = window;
  o.max_clusters = max_clusters;
  return o;
}

torch::Tensor tokens(Rng& rng, int64_t b, int64_t t, int64_t vocab) {
  auto x = torch::empty({b, t}, torch::kLong);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data_ptr<int64_t>()[i] = static_cast<int64_t>(rng.uniform_int(vocab));
  return x;
}

void copy_attention(torch::nn::Module& to, SpineLayerImpl& from) {
  torch::NoGradGuard no_grad;
  const auto params = to.named_parameters();
  params["qkv.weight"].copy_(from.qkv->weight);
  params["qkv.bias"].copy_(from.qkv->bias);
  params["proj.weight"].copy_(from.proj->weight);
  params["proj.bias"].copy_(from.proj->bias);
}

void expect_equal(const torch::Tensor& a, const torch::Tensor& e, const std::string& what) {
  ASSERT_EQ(a.defined(), e.defined()) << what;
  if (e.defined()) {
    EXPECT_TRUE(torch::equal(a, e)) << what;
  }
}

void expect_bank_equal(const ClusterBank& a, const ClusterBank& e, const std::string& what) {
  EXPECT_EQ(a.n_clusters, e.n_clusters) << what;
  EXPECT_EQ(a.max_clusters, e.max_clusters) << what;
  expect_equal(a.count, e.count, what + " count");
  expect_equal(a.mu_k, e.mu_k, what + " mu_k");
  expect_equal(a.mu_v, e.mu_v, what + " mu_v");
  expect_equal(a.sigma_kk, e.sigma_kk, what + " sigma_kk");
  expect_equal(a.sigma_vk, e.sigma_vk, what + " sigma_vk");
}

void expect_receipt_equal(const LayerReceipt& a, const LayerReceipt& e, const std::string& what) {
  EXPECT_EQ(a.batch_size, e.batch_size) << what;
  EXPECT_EQ(a.misfit_scalar, e.misfit_scalar) << what;
  ASSERT_EQ(a.streams.size(), e.streams.size()) << what;
  for (size_t s = 0; s < e.streams.size(); ++s) {
    const auto& x = a.streams[s];
    const auto& y = e.streams[s];
    EXPECT_EQ(x.birthed, y.birthed) << what;
    EXPECT_EQ(x.birth_incorporated_batch, y.birth_incorporated_batch) << what;
    EXPECT_EQ(x.merged, y.merged) << what;
    EXPECT_EQ(x.merge_distances, y.merge_distances) << what;
    EXPECT_EQ(x.misfit, y.misfit) << what;
    EXPECT_EQ(x.misfit_scalar, y.misfit_scalar) << what;
    EXPECT_EQ(x.soft_update_applied, y.soft_update_applied) << what;
    EXPECT_EQ(x.ingested_tokens_per_head, y.ingested_tokens_per_head) << what;
    EXPECT_EQ(x.expected_ingested_tokens_per_head, y.expected_ingested_tokens_per_head) << what;
    EXPECT_EQ(x.count_conserved, y.count_conserved) << what;
    ASSERT_TRUE(x.accounting && y.accounting) << what;
    EXPECT_EQ(x.accounting->positions_seen, y.accounting->positions_seen) << what;
    EXPECT_EQ(x.accounting->near_tokens, y.accounting->near_tokens) << what;
    EXPECT_EQ(x.accounting->evicted_tokens, y.accounting->evicted_tokens) << what;
    EXPECT_EQ(x.accounting->far_tokens_per_head, y.accounting->far_tokens_per_head) << what;
    EXPECT_EQ(x.accounting->conserved, y.accounting->conserved) << what;
  }
}

std::vector<std::string> names(torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.key());
  return out;
}

TEST(SelfAttentionTest, ModulesRegisterQkvThenProj) {
  SlidingWindowSelfAttention window(
      SlidingWindowSelfAttentionOptions{.d_model = 8, .n_head = 2, .window = 4});
  MomentClosureSelfAttention closure(closure_options(8, 2, 4, 3));
  const std::vector<std::string> expected = {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"};
  EXPECT_EQ(names(*window), expected);
  EXPECT_EQ(names(*closure), expected);
  EXPECT_EQ(window->qkv->weight.sizes(), (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(closure->proj->weight.sizes(), (std::vector<int64_t>{8, 8}));
}

TEST(SelfAttentionTest, MechanismParameterNamesAreUnchanged) {
  MomentClosureOptions o;
  o.vocab = 5;
  o.d_model = 4;
  o.n_layer = 2;
  o.n_head = 2;
  MomentClosureAttention mca(o);
  std::vector<std::string> expected = {"backbone.tok.weight"};
  for (const std::string layer : {"backbone.layer0.", "backbone.layer1."}) {
    for (const std::string part : {"ln1", "qkv", "proj", "ln2", "fc1", "fc2"}) {
      expected.push_back(layer + part + ".weight");
      expected.push_back(layer + part + ".bias");
    }
  }
  expected.push_back("backbone.ln_f.weight");
  expected.push_back("backbone.ln_f.bias");
  EXPECT_EQ(names(*mca), expected);
  SpineOptions s;
  s.vocab = 5;
  s.d_model = 4;
  s.n_layer = 2;
  s.n_head = 2;
  SlidingWindowSpine spine(s);
  EXPECT_EQ(names(*spine), expected);
}

// A model written around the module reproduces MomentClosureAttention bitwise (two streams, two
// layers, five chunks, births, soft updates and merges), and so do its gradients.
TEST(SelfAttentionTest, ModulesInAModelReproduceMomentClosureAttention) {
  torch::manual_seed(3);
  MomentClosureOptions o;
  o.vocab = 11;
  o.d_model = 8;
  o.n_layer = 2;
  o.n_head = 2;
  o.window = 4;
  o.max_clusters = 3;
  o.birth_threshold = 0.5;
  MomentClosureAttention mca(o);
  auto& backbone = mca->backbone();
  std::vector<MomentClosureSelfAttention> layers;
  for (auto& layer : backbone->layers) {
    MomentClosureSelfAttentionOptions lo;
    lo.d_model = o.d_model;
    lo.n_head = o.n_head;
    lo.window = o.window;
    lo.max_clusters = o.max_clusters;
    lo.birth_threshold = o.birth_threshold;
    layers.emplace_back(lo);
    copy_attention(*layers.back(), *layer);
  }
  Rng rng(11);
  auto state = mca->init_state(2);
  std::vector<MomentClosureLayerState> layer_states;
  for (auto& l : layers) layer_states.push_back(l->init_state(2));
  bool births = false, soft = false;
  torch::Tensor loss_mca, loss_own;
  for (int chunk = 0; chunk < 5; ++chunk) {
    const auto x = tokens(rng, 2, 3 + chunk % 3, o.vocab);
    auto expected = mca->advance(state, x);
    auto h = backbone->tok(x);
    for (size_t l = 0; l < layers.size(); ++l) {
      auto& layer = *backbone->layers[l];
      auto out = layers[l]->forward(layer.ln1(h), layer_states[l]);
      h = layer.finish(h, out.out);
      layer_states[l] = out.state;
      const std::string what = "chunk " + std::to_string(chunk) + " layer " + std::to_string(l);
      expect_equal(out.state.near.cache_k, expected.state.near.cache_k[l], what + " cache_k");
      expect_equal(out.state.near.cache_v, expected.state.near.cache_v[l], what + " cache_v");
      EXPECT_EQ(out.state.near.pos, expected.state.near.pos) << what;
      expect_bank_equal(out.state.bank, expected.state.banks[l], what);
      expect_receipt_equal(out.receipt, mca->last_receipts()[l], what);
      for (const auto& r : out.receipt.streams) {
        births = births || r.birthed;
        soft = soft || r.soft_update_applied;
      }
    }
    const auto logits = backbone->logits(h);
    EXPECT_TRUE(torch::equal(logits, expected.logits)) << "chunk " << chunk;
    const auto y = tokens(rng, 2, x.size(1), o.vocab);
    loss_mca = chunk == 0 ? mean_cross_entropy(expected.logits, y)
                          : loss_mca + mean_cross_entropy(expected.logits, y);
    loss_own =
        chunk == 0 ? mean_cross_entropy(logits, y) : loss_own + mean_cross_entropy(logits, y);
    state = expected.state;
  }
  EXPECT_TRUE(births);
  EXPECT_TRUE(soft);
  // Gradients: the mechanism's qkv/proj against the modules' (the other parameters are shared by
  // both graphs).
  const auto mca_grads = torch::autograd::grad(
      {loss_mca}, {backbone->layers[0]->qkv->weight, backbone->layers[1]->proj->weight});
  const auto own_grads =
      torch::autograd::grad({loss_own}, {layers[0]->qkv->weight, layers[1]->proj->weight});
  EXPECT_TRUE(torch::allclose(own_grads[0], mca_grads[0], 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(own_grads[1], mca_grads[1], 1e-6, 1e-7));
}

TEST(SelfAttentionTest, ModulesInAModelReproduceSlidingWindowSpine) {
  torch::manual_seed(5);
  SpineOptions o;
  o.vocab = 9;
  o.d_model = 8;
  o.n_layer = 2;
  o.n_head = 2;
  o.window = 5;
  SlidingWindowSpine spine(o);
  auto& backbone = spine->backbone();
  std::vector<SlidingWindowSelfAttention> layers;
  for (auto& layer : backbone->layers) {
    layers.emplace_back(SlidingWindowSelfAttentionOptions{o.d_model, o.n_head, o.window});
    copy_attention(*layers.back(), *layer);
  }
  Rng rng(4);
  auto state = spine->init_state(3);
  std::vector<std::optional<WindowLayerState>> layer_states(layers.size());
  for (int chunk = 0; chunk < 4; ++chunk) {
    const auto x = tokens(rng, 3, 2 + chunk, o.vocab);
    auto expected = spine->advance(state, x);
    auto h = backbone->tok(x);
    for (size_t l = 0; l < layers.size(); ++l) {
      auto& layer = *backbone->layers[l];
      auto out = layers[l]->forward(layer.ln1(h), layer_states[l]);
      h = layer.finish(h, out.out);
      layer_states[l] = out.state;
      expect_equal(out.state.cache_k, expected.state.cache_k[l], "cache_k");
      expect_equal(out.state.cache_v, expected.state.cache_v[l], "cache_v");
    }
    EXPECT_TRUE(torch::equal(backbone->logits(h), expected.logits)) << "chunk " << chunk;
    state = expected.state;
  }
}

TEST(SelfAttentionTest, ModulesCheckTheirInputs) {
  MomentClosureSelfAttention layer(closure_options(8, 2, 4, 2));
  Rng rng(1);
  const auto h = testing::normal_tensor(rng, {2, 3, 8}, torch::kFloat32);
  EXPECT_THROW(layer->forward(h.to(torch::kFloat64)), ValueError);  // dtype
  EXPECT_THROW(layer->forward(h.narrow(2, 0, 4)), ValueError);      // d_model
  EXPECT_THROW(layer->forward(h[0]), ValueError);                   // rank
  const auto state = layer->forward(h).state;
  EXPECT_THROW(layer->forward(h.narrow(0, 0, 1), state), ValueError);  // batch size
  auto short_cache = state;
  short_cache.near.cache_k = state.near.cache_k.narrow(1, 0, 2);
  short_cache.near.cache_v = state.near.cache_v.narrow(1, 0, 2);
  EXPECT_THROW(layer->forward(h, short_cache), ValueError);
  auto wrong_pos = layer->forward(h, state).state;
  wrong_pos.near.pos += 1;  // the bank no longer holds exactly the evicted tokens
  EXPECT_THROW(layer->forward(h, wrong_pos), StateError);
  EXPECT_THROW(layer->init_state(0), ValueError);
  EXPECT_THROW(MomentClosureSelfAttention(closure_options(8, 3, 4, 2)), ValueError);
  EXPECT_THROW(MomentClosureSelfAttention(closure_options(6, 2, 4, 2)), ValueError);
  EXPECT_THROW(MomentClosureSelfAttention(closure_options(8, 2, 4, 0)), ValueError);
  EXPECT_THROW(SlidingWindowSelfAttention(
                   SlidingWindowSelfAttentionOptions{.d_model = 8, .n_head = 2, .window = 0}),
               ValueError);
}

}  // namespace
}  // namespace attnmix::stream
