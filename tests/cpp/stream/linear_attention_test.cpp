// SPDX-License-Identifier: Apache-2.0
// LinearAttentionSpine (stream/linear_attention.hpp): streaming in chunks equals one pass bit for bit, streams do
// not leak into each other, the sublayer equals the quadratic form of causal linear attention, gradients agree with
// finite differences, the state does not grow with the stream, and bad states are rejected.
#include "attnmix/stream/linear_attention.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "testing/mechanism_checks.hpp"

namespace attnmix::stream {
namespace {

LinearAttentionOptions small_options() {
  LinearAttentionOptions o;
  o.vocab = 11;
  o.d_model = 8;
  o.n_layer = 2;
  o.n_head = 2;
  return o;
}

/// A model whose token shifts are not zero (so the shift path is exercised).
LinearAttentionSpine make_model(uint64_t seed) {
  torch::manual_seed(static_cast<int64_t>(seed));
  LinearAttentionSpine model(small_options());
  torch::NoGradGuard no_grad;
  for (const auto& shift : model->shifts()) shift->weight.normal_(0.0, 0.3);
  return model;
}

torch::Tensor tokens(int64_t b, int64_t t, uint64_t seed) { return testing::random_tokens(b, t, seed, 11); }

template <class Model>
auto stream(Model& model, const torch::Tensor& x, const std::vector<int64_t>& chunks) {
  return testing::stream_chunks(model, x, chunks);
}

/// Streaming in chunks equals one pass up to the float32 rounding of the dense products (whose results for a row
/// depend on how many rows one call multiplies): logits and every carried sum, for chunks of 1 to 40 tokens.
TEST(LinearAttentionSpine, StreamingInChunksEqualsOnePass) {
  auto model = make_model(1);
  torch::NoGradGuard no_grad;
  const auto x = tokens(3, 40, 2);
  const auto [whole, whole_state] = stream(model, x, {40});
  for (const auto& chunks : std::vector<std::vector<int64_t>>{{1, 39}, {7, 7, 7, 7, 7, 5}, {16, 1, 23}}) {
    const auto [parts, state] = stream(model, x, chunks);
    EXPECT_TRUE(torch::allclose(parts, whole, 1e-5, 1e-5)) << (parts - whole).abs().max().item<double>();
    EXPECT_EQ(state.pos, 40);
    for (size_t l = 0; l < state.layers.size(); ++l) {
      EXPECT_TRUE(torch::allclose(state.layers[l].sum_kv, whole_state.layers[l].sum_kv, 1e-5, 1e-5));
      EXPECT_TRUE(torch::allclose(state.layers[l].sum_k, whole_state.layers[l].sum_k, 1e-5, 1e-5));
      EXPECT_TRUE(torch::allclose(state.layers[l].last_x, whole_state.layers[l].last_x, 1e-5, 1e-5));
    }
  }
}

/// The carried sums equal their definition, Σ φ(k_j) v_jᵀ and Σ φ(k_j) over every token, continued from a
/// non-empty state.
TEST(LinearAttentionSpine, CarriedSumsEqualTheirDefinition) {
  torch::manual_seed(8);
  const int64_t b = 2, t = 12, d = 8, H = 2, hd = d / H;
  torch::nn::Linear qkv(d, 3 * d), proj(d, d), shift(torch::nn::LinearOptions(d, d).bias(false));
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({b, t, d});
  const LinearAttentionLayerState start{torch::rand({b, H, hd, hd}, torch::kDouble),
                                        torch::rand({b, H, hd}, torch::kDouble), torch::randn({b, d})};
  const auto after = linear_attention_sublayer(*qkv, *proj, *shift, x, start, H).state;
  const auto parts = torch::nn::functional::linear(x, qkv->weight, qkv->bias).split(d, -1);
  const auto previous = torch::cat({start.last_x.unsqueeze(1), x.narrow(1, 0, t - 1)}, 1);
  const auto k = (parts[1] + torch::nn::functional::linear(previous, shift->weight)).reshape({b, t, H, hd});
  const auto phi_k = (torch::elu(k) + 1.0).to(torch::kDouble);
  const auto expected =
      start.sum_kv + torch::einsum("bthi,bthj->bhij", {phi_k, parts[2].reshape({b, t, H, hd}).to(torch::kDouble)});
  EXPECT_TRUE(torch::allclose(after.sum_kv, expected, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(after.sum_k, start.sum_k + phi_k.sum(1), 1e-5, 1e-6));
  EXPECT_TRUE(torch::equal(after.last_x, x.select(1, t - 1)));
}

TEST(LinearAttentionSpine, StreamsDoNotLeakIntoEachOther) {
  auto model = make_model(3);
  torch::NoGradGuard no_grad;
  auto x = tokens(2, 30, 4);
  const auto before = stream(model, x, {10, 10, 10}).first;
  x.select(0, 1).copy_(tokens(1, 30, 5).squeeze(0));  // change only stream 1
  const auto after = stream(model, x, {10, 10, 10}).first;
  EXPECT_TRUE(torch::equal(before.select(0, 0), after.select(0, 0)));
  EXPECT_FALSE(torch::equal(before.select(0, 1), after.select(0, 1)));
}

/// The sublayer against the quadratic form, in float64: out_i = proj(Σ_{j≤i} (φ(q_i)·φ(k_j)) v_j /
/// (Σ_{j≤i} φ(q_i)·φ(k_j) + ε)), with k_j += U x_{j−1}, computed position by position from the layer's weights.
TEST(LinearAttentionSpine, SublayerEqualsTheQuadraticForm) {
  torch::manual_seed(7);
  const int64_t b = 2, t = 9, d = 8, H = 2, hd = d / H;
  torch::nn::Linear qkv(d, 3 * d), proj(d, d), shift(torch::nn::LinearOptions(d, d).bias(false));
  for (auto* m : {&qkv, &proj, &shift}) (*m)->to(torch::kDouble);
  const auto x = torch::randn({b, t, d}, torch::kDouble);
  LinearAttentionLayerState empty{torch::zeros({b, H, hd, hd}, torch::kDouble), torch::zeros({b, H, hd}, torch::kDouble),
                                  torch::zeros({b, d}, torch::kDouble)};
  const auto got = linear_attention_sublayer(*qkv, *proj, *shift, x, empty, H).out;

  const auto phi = [](const torch::Tensor& z) { return torch::elu(z) + 1.0; };
  const auto W = qkv->weight, c = qkv->bias;
  auto expected = torch::zeros({b, t, d}, torch::kDouble);
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t i = 0; i < t; ++i) {
      auto attended = torch::zeros({d}, torch::kDouble);
      for (int64_t h = 0; h < H; ++h) {
        const auto rows = [&](int64_t part) { return torch::indexing::Slice(part * d + h * hd, part * d + (h + 1) * hd); };
        const auto q = phi(torch::mv(W.index({rows(0)}), x[s][i]) + c.index({rows(0)}));
        auto numerator = torch::zeros({hd}, torch::kDouble);
        double denominator = 1e-6;
        for (int64_t j = 0; j <= i; ++j) {
          const auto previous = j == 0 ? torch::zeros({d}, torch::kDouble) : x[s][j - 1];
          const auto k = phi(torch::mv(W.index({rows(1)}), x[s][j]) + c.index({rows(1)}) +
                             torch::mv(shift->weight.index({torch::indexing::Slice(h * hd, (h + 1) * hd)}), previous));
          const auto v = torch::mv(W.index({rows(2)}), x[s][j]) + c.index({rows(2)});
          const double weight = torch::dot(q, k).item<double>();
          numerator += weight * v;
          denominator += weight;
        }
        attended.index_put_({torch::indexing::Slice(h * hd, (h + 1) * hd)}, numerator / denominator);
      }
      expected[s][i] = torch::mv(proj->weight, attended) + proj->bias;
    }
  }
  EXPECT_TRUE(torch::allclose(got, expected, 1e-10, 1e-12)) << (got - expected).abs().max().item<double>();
}

/// The loss of a float64 model over two chunks (the state carried, and differentiated, across them), against
/// central differences in several parameters, among them a token shift and the first layer's qkv.
TEST(LinearAttentionSpine, GradientsMatchFiniteDifferences) {
  auto model = make_model(11);
  model->to(torch::kDouble);
  const auto x = tokens(2, 12, 12);
  const auto y = tokens(2, 12, 13);
  const auto loss = [&] {
    auto state = model->init_state(2);
    const auto first = model->step(state, x.narrow(1, 0, 5), y.narrow(1, 0, 5));
    const auto second = model->step(first.state, x.narrow(1, 5, 7), y.narrow(1, 5, 7));
    return first.loss + second.loss;
  };
  testing::expect_gradients_match_finite_differences(*model, loss, testing::kLinearSpineProbes);
}

TEST(LinearAttentionSpine, StateSizeDoesNotGrowWithTheStream) {
  auto model = make_model(5);
  torch::NoGradGuard no_grad;
  const auto short_state = stream(model, tokens(1, 8, 6), {8}).second;
  const auto long_state = stream(model, tokens(1, 400, 6), {100, 100, 100, 100}).second;
  EXPECT_EQ(short_state.bytes(), long_state.bytes());
  // per layer: S (2 heads x 4 x 4) and Z (2 x 4) in float64, the shift row (8) in float32
  EXPECT_EQ(long_state.bytes(), 2 * ((2 * 4 * 4 + 2 * 4) * 8 + 8 * 4));
  EXPECT_EQ(long_state.pos, 400);
}

TEST(LinearAttentionSpine, ParametersOfTheBackboneMatchTheWindowSpine) {
  torch::manual_seed(21);
  LinearAttentionSpine linear(small_options());
  SpineOptions s;
  s.vocab = 11;
  s.d_model = 8;
  s.n_layer = 2;
  s.n_head = 2;
  torch::manual_seed(21);
  SlidingWindowSpine window(s);
  const auto theirs = window->named_parameters();
  for (const auto& p : linear->named_parameters()) {
    if (p.key().rfind("shift", 0) == 0) {
      EXPECT_EQ(p.value().abs().max().item<double>(), 0.0) << p.key();
      continue;
    }
    EXPECT_TRUE(torch::equal(p.value(), theirs[p.key()])) << p.key();
  }
}

TEST(LinearAttentionSpine, RejectsStatesThatDoNotFit) {
  auto model = make_model(9);
  torch::NoGradGuard no_grad;
  const auto x = tokens(2, 4, 10);
  const auto expect_value_error = [&](const LinearAttentionState& s, const std::string& fragment) {
    try {
      (void)model->advance(s, x);
      ADD_FAILURE() << "no exception for " << fragment;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_value_error(model->init_state(3), "batch size");
  auto s = model->init_state(2);
  s.layers.pop_back();
  expect_value_error(s, "layers");
  s = model->init_state(2);
  s.layers[1].sum_kv = s.layers[1].sum_kv.to(torch::kFloat);
  expect_value_error(s, "layer 1");
  s = model->init_state(2);
  s.layers[0].sum_k = torch::zeros({2, 2, 3}, torch::kDouble);
  expect_value_error(s, "layer 0");
  EXPECT_THROW((void)model->advance(model->init_state(2), tokens(2, 4, 1).add(20)), ValueError);
  EXPECT_THROW((void)model->init_state(0), ValueError);
  LinearAttentionOptions bad = small_options();
  bad.n_head = 3;
  EXPECT_THROW(LinearAttentionSpine{bad}, ValueError);
}

}  // namespace
}  // namespace attnmix::stream
