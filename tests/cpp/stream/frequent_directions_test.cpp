// SPDX-License-Identifier: Apache-2.0
// FrequentDirectionsSpine and its sketch (stream/frequent_directions.hpp): the shrink keeps Liberty's deterministic
// guarantee against a brute-force AᵀA, the spine equals linear attention when the sketch discards nothing,
// streaming in chunks follows one pass, streams do not leak into each other, gradients agree with finite
// differences where the sketch is exact, the straight-through term changes no value, the receipts conserve every
// token, the state does not grow, and bad options and states are rejected.
#include "attnmix/stream/frequent_directions.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "testing/mechanism_checks.hpp"
#include "attnmix/stream/linear_attention.hpp"

namespace attnmix::stream {
namespace {

FrequentDirectionsOptions small_options(int64_t sketch_rows, int64_t window = 3) {
  FrequentDirectionsOptions o;
  o.vocab = 11;
  o.d_model = 8;  // 2 heads of 4: rows [φ(k); v] have 8 columns
  o.n_layer = 2;
  o.n_head = 2;
  o.window = window;
  o.sketch_rows = sketch_rows;
  return o;
}

/// A model whose token shifts are not zero (so the shift path is exercised).
FrequentDirectionsSpine make_model(uint64_t seed, int64_t sketch_rows, int64_t window = 3) {
  torch::manual_seed(static_cast<int64_t>(seed));
  FrequentDirectionsSpine model(small_options(sketch_rows, window));
  torch::NoGradGuard no_grad;
  for (const auto& shift : model->shifts()) shift->weight.normal_(0.0, 0.3);
  return model;
}

torch::Tensor tokens(int64_t b, int64_t t, uint64_t seed) { return testing::random_tokens(b, t, seed, 11); }

template <class Model>
auto stream(Model& model, const torch::Tensor& x, const std::vector<int64_t>& chunks) {
  return testing::stream_chunks(model, x, chunks);
}

/// Algorithm 1 driven row by row with frequent_directions_shrink, checked against AᵀA computed directly:
/// 0 ≼ AᵀA − BᵀB ≼ (Σδ) I, Σδ ≤ 2‖A‖_F²/ℓ, and the rows beyond the filled ones are exactly zero.
TEST(FrequentDirections, ShrinkKeepsTheDeterministicGuarantee) {
  torch::manual_seed(3);
  for (const int64_t rows : {4, 6, 10}) {
    const int64_t n = 60, m = 7;
    const auto a = torch::randn({n, m}, torch::kDouble) * torch::linspace(0.2, 2.0, m, torch::kDouble);
    auto sketch = torch::zeros({rows, m}, torch::kDouble);
    int64_t filled = 0, shrinks = 0;
    double delta_total = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      sketch[filled] = a[i];
      if (++filled < rows) continue;
      const auto shrink = frequent_directions_shrink(sketch);
      sketch = shrink.sketch;
      filled = shrink.filled;
      delta_total += shrink.delta.item<double>();
      ++shrinks;
      EXPECT_EQ(filled, rows / 2 - 1);
      EXPECT_TRUE(sketch.narrow(0, filled, rows - filled).eq(0).all().item<bool>());
    }
    EXPECT_GT(shrinks, 0);
    const auto gap = a.t().matmul(a) - sketch.t().matmul(sketch);
    const auto eigen = torch::linalg_eigvalsh(gap, "L");
    const double mass = a.square().sum().item<double>();
    EXPECT_GE(eigen.min().item<double>(), -1e-9 * mass) << "rows " << rows;
    EXPECT_LE(eigen.max().item<double>(), delta_total + 1e-9 * mass) << "rows " << rows;
    EXPECT_LE(delta_total, (mass - sketch.square().sum().item<double>()) / static_cast<double>(rows / 2) + 1e-9 * mass);
    EXPECT_LE(delta_total, 2.0 * mass / static_cast<double>(rows));
  }
}

/// With ℓ/2 above the number of columns a shrink discards nothing: BᵀB stays AᵀA.
TEST(FrequentDirections, ShrinkIsExactWhenHalfTheRowsExceedTheColumns) {
  torch::manual_seed(4);
  const auto a = torch::randn({12, 3}, torch::kDouble);
  const auto shrink = frequent_directions_shrink(a);
  EXPECT_EQ(shrink.filled, 3);
  EXPECT_EQ(shrink.delta.item<double>(), 0.0);
  EXPECT_TRUE(torch::allclose(shrink.sketch.t().matmul(shrink.sketch), a.t().matmul(a), 1e-12, 1e-12));
  EXPECT_THROW(frequent_directions_shrink(torch::zeros({5, 3}, torch::kDouble)), ValueError);
  EXPECT_THROW(frequent_directions_shrink(torch::zeros({2, 3}, torch::kDouble)), ValueError);
}

/// ℓ = 18 > 4·h_d: the sketch keeps every evicted row's contribution, so the spine is linear attention over the
/// whole stream, computed by LinearAttentionSpine with the same weights (window and sketch are one split of it).
TEST(FrequentDirectionsSpine, EqualsLinearAttentionWhenTheSketchDiscardsNothing) {
  auto model = make_model(1, 18);
  LinearAttentionOptions lo;
  lo.vocab = 11;
  lo.d_model = 8;
  lo.n_layer = 2;
  lo.n_head = 2;
  LinearAttentionSpine linear(lo);
  {
    torch::NoGradGuard no_grad;
    const auto from = model->named_parameters();
    for (auto& p : linear->named_parameters()) p.value().copy_(from[p.key()]);
  }
  torch::NoGradGuard no_grad;
  const auto x = tokens(2, 70, 2);
  const auto [logits, state] = stream(model, x, {9, 30, 31});
  const auto expected = linear->advance(linear->init_state(2), x).logits;
  EXPECT_TRUE(torch::allclose(logits, expected, 1e-4, 1e-5)) << (logits - expected).abs().max().item<double>();
  EXPECT_GT(state.layers[0].shrinks, 0);  // 67 evictions into 18 rows: shrinks happened, with δ = 0
}

/// Streaming in chunks follows one pass's insertions and shrinks: logits, BᵀB, Z and the mass agree, with ℓ = 4 (a
/// shrink every two evictions) and chunk boundaries before, at and after shrinks.
TEST(FrequentDirectionsSpine, StreamingInChunksFollowsOnePass) {
  auto model = make_model(5, 4);
  torch::NoGradGuard no_grad;
  const auto x = tokens(2, 41, 6);
  const auto [whole, one] = stream(model, x, {41});
  for (const auto& chunks : std::vector<std::vector<int64_t>>{{1, 1, 1, 38}, {2, 5, 7, 27}, {20, 21}}) {
    const auto [parts, many] = stream(model, x, chunks);
    EXPECT_TRUE(torch::allclose(parts, whole, 1e-4, 1e-5)) << (parts - whole).abs().max().item<double>();
    for (size_t l = 0; l < one.layers.size(); ++l) {
      const auto& a = one.layers[l];
      const auto& b = many.layers[l];
      EXPECT_EQ(a.filled, b.filled);
      EXPECT_EQ(a.shrinks, b.shrinks);
      const auto gram = [](const torch::Tensor& s) { return s.transpose(-1, -2).matmul(s); };
      // The sketch is float64, but its rows come from float32 products whose last bits depend on the chunk's
      // shape: entries agree to float32 rounding of the Gram matrix's scale.
      const double scale = gram(a.sketch).abs().max().item<double>();
      EXPECT_TRUE(torch::allclose(gram(a.sketch), gram(b.sketch), 1e-6, 1e-6 * scale))
          << (gram(a.sketch) - gram(b.sketch)).abs().max().item<double>() << " of " << scale;
      EXPECT_TRUE(torch::allclose(a.sum_k, b.sum_k, 1e-6, 1e-8));
      EXPECT_TRUE(torch::allclose(a.mass, b.mass, 1e-6, 1e-8));
      EXPECT_TRUE(torch::equal(a.window_k, b.window_k) || torch::allclose(a.window_k, b.window_k, 1e-5, 1e-6));
    }
  }
}

TEST(FrequentDirectionsSpine, StreamsDoNotLeakIntoEachOther) {
  auto model = make_model(7, 4);
  torch::NoGradGuard no_grad;
  auto x = tokens(2, 30, 8);
  const auto first = stream(model, x, {13, 17}).first;
  x[1] = tokens(1, 30, 9)[0];
  const auto second = stream(model, x, {13, 17}).first;
  EXPECT_TRUE(torch::allclose(first[0], second[0], 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(first[1], second[1], 1e-3, 1e-3));
}

/// The receipts: window + evicted = pos in every layer, the sketch's schedule, and Σδ within the bound.
TEST(FrequentDirectionsSpine, ReceiptsConserveTokensAndBoundTheSketchError) {
  auto model = make_model(9, 6);
  torch::NoGradGuard no_grad;
  const auto state = stream(model, tokens(3, 50, 10), {17, 33}).second;
  for (const auto& r : model->receipts(state)) {
    EXPECT_EQ(r.window, 3);
    EXPECT_EQ(r.window + r.evicted, state.pos);
    EXPECT_EQ(r.evicted, 47);
    // 47 rows into 6: the first shrink at 6 leaves 2, then one every 4 rows: 11 shrinks, 2 + 41 % 4 = 3 rows
    EXPECT_EQ(r.shrinks, 11);
    EXPECT_EQ(r.filled, 3);
    EXPECT_TRUE(r.bound_holds);
    EXPECT_TRUE(r.shrink_total.gt(0).all().item<bool>());
    EXPECT_TRUE(r.kept.le(r.mass * (1 + 1e-12)).all().item<bool>());
  }
}

/// Where the sketch is exact (ℓ large) the straight-through term makes the gradient the exact one: central
/// differences over one chunk that evicts tokens, in float64.
TEST(FrequentDirectionsSpine, GradientsMatchFiniteDifferencesWhereTheSketchIsExact) {
  auto model = make_model(11, 18);
  model->to(torch::kDouble);
  const auto x = tokens(2, 12, 12);
  const auto y = tokens(2, 12, 13);
  const auto loss = [&] { return model->step(model->init_state(2), x, y).loss; };
  testing::expect_gradients_match_finite_differences(*model, loss, testing::kLinearSpineProbes);
}

/// The straight-through correction adds exactly zero: the loss with gradients on equals the loss without, with a
/// sketch that shrinks; and the keys of evicted tokens still receive a gradient.
TEST(FrequentDirectionsSpine, StraightThroughChangesNoValue) {
  auto model = make_model(13, 4);
  const auto x = tokens(2, 20, 14);
  const auto y = tokens(2, 20, 15);
  const auto with_grad = model->step(model->init_state(2), x, y).loss;
  torch::Tensor without;
  {
    torch::NoGradGuard no_grad;
    without = model->step(model->init_state(2), x, y).loss;
  }
  EXPECT_EQ(with_grad.item<double>(), without.item<double>());
  with_grad.backward();
  EXPECT_GT(model->shifts()[0]->weight.grad().abs().sum().item<double>(), 0.0);
}

TEST(FrequentDirectionsSpine, StateSizeDoesNotGrowWithTheStream) {
  auto model = make_model(15, 4);
  torch::NoGradGuard no_grad;
  const auto short_state = stream(model, tokens(1, 5, 16), {5}).second;
  const auto long_state = stream(model, tokens(1, 300, 16), {100, 100, 100}).second;
  EXPECT_EQ(short_state.bytes(), long_state.bytes());
  // per layer and head: window 3 x (4 + 4) float32, sketch 4 x 8, Z 4, mass, Σδ float64; the shift row 8 float32
  EXPECT_EQ(long_state.bytes(), 2 * (2 * (3 * 8 * 4 + (4 * 8 + 4 + 2) * 8) + 8 * 4));
}

TEST(FrequentDirectionsSpine, RejectsBadOptionsAndStates) {
  EXPECT_THROW(FrequentDirectionsSpine(small_options(5)), ValueError);
  EXPECT_THROW(FrequentDirectionsSpine(small_options(2)), ValueError);
  EXPECT_THROW(FrequentDirectionsSpine(small_options(4, 0)), ValueError);
  auto model = make_model(17, 4);
  torch::NoGradGuard no_grad;
  const auto x = tokens(1, 9, 18);
  auto state = stream(model, x, {9}).second;
  auto wrong_schedule = state;
  wrong_schedule.layers[1].filled += 1;
  EXPECT_THROW(model->advance(wrong_schedule, x), ValueError);
  auto wrong_window = state;
  wrong_window.layers[0].window_k = wrong_window.layers[0].window_k.narrow(2, 0, 2);
  EXPECT_THROW(model->advance(wrong_window, x), ValueError);
  auto wrong_sketch = state;
  wrong_sketch.layers[0].sketch = wrong_sketch.layers[0].sketch.to(torch::kFloat);
  EXPECT_THROW(model->advance(wrong_sketch, x), ValueError);
  EXPECT_THROW(model->advance(model->init_state(2), x), ValueError);
  EXPECT_THROW(model->receipts(wrong_schedule), ValueError);
}

}  // namespace
}  // namespace attnmix::stream
