// SPDX-License-Identifier: Apache-2.0
// TensorSketchSpine and its sketch (stream/tensor_sketch.hpp): the FFT sketch equals its definition by enumeration,
// its inner products estimate the polynomial kernel without bias, the spine is linear attention where the sketch is
// a signed permutation, streaming in chunks equals one pass, streams do not leak into each other, gradients agree
// with finite differences, the misfit receipt measures the sketch's error, and bad options and states are rejected.
#include "attnmix/stream/tensor_sketch.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "testing/mechanism_checks.hpp"
#include "attnmix/stream/linear_attention.hpp"

namespace attnmix::stream {
namespace {

TensorSketchOptions small_options(int64_t sketch_dim, int64_t degree, int64_t window = 3) {
  TensorSketchOptions o;
  o.vocab = 11;
  o.d_model = 8;  // 2 heads of 4
  o.n_layer = 2;
  o.n_head = 2;
  o.window = window;
  o.sketch_dim = sketch_dim;
  o.degree = degree;
  return o;
}

TensorSketchSpine make_model(uint64_t seed, const TensorSketchOptions& o) {
  torch::manual_seed(static_cast<int64_t>(seed));
  TensorSketchSpine model(o);
  torch::NoGradGuard no_grad;
  for (const auto& shift : model->shifts()) shift->weight.normal_(0.0, 0.3);
  return model;
}

torch::Tensor tokens(int64_t b, int64_t t, uint64_t seed) { return testing::random_tokens(b, t, seed, 11); }

template <class Model>
auto stream(Model& model, const torch::Tensor& x, const std::vector<int64_t>& chunks) {
  return testing::stream_chunks(model, x, chunks);
}

/// TS(x)[k] = Σ over index tuples (j_1 … j_p) with Σ h_i(j_i) ≡ k (mod D) of Π s_i(j_i) x_{j_i}: the circular
/// convolution of the Count Sketches, enumerated.
TEST(TensorSketch, FftSketchEqualsItsDefinition) {
  for (const int64_t degree : {1, 2, 3}) {
    const int64_t n = 3, width = 5;
    const auto hashes = tensor_sketch_hashes(n, width, degree, 7 + static_cast<uint64_t>(degree));
    torch::manual_seed(degree);
    const auto x = torch::randn({n}, torch::kDouble);
    std::vector<double> expected(width, 0.0);
    std::vector<int64_t> index(static_cast<size_t>(degree), 0);
    for (int64_t code = 0; code < static_cast<int64_t>(std::pow(n, degree)); ++code) {
      int64_t rest = code, bucket = 0;
      double term = 1.0;
      for (int64_t i = 0; i < degree; ++i, rest /= n) {
        const int64_t j = rest % n;
        const auto row = hashes[i][j];
        const int64_t h = row.abs().argmax().item<int64_t>();
        bucket += h;
        term *= row[h].item<double>() * x[j].item<double>();
      }
      expected[static_cast<size_t>(bucket % width)] += term;
    }
    const auto got = tensor_sketch(x, hashes);
    for (int64_t k = 0; k < width; ++k) EXPECT_NEAR(got[k].item<double>(), expected[k], 1e-12) << degree << "," << k;
  }
  EXPECT_THROW(tensor_sketch_hashes(4, 0, 2, 0), ValueError);
}

/// Over 4000 hash draws the mean of TS(x)·TS(y) is (x·y)^p within 4 standard errors.
TEST(TensorSketch, InnerProductsEstimateThePolynomialKernel) {
  torch::manual_seed(2);
  const auto x = torch::rand({4}, torch::kDouble) + 0.5;
  const auto y = torch::rand({4}, torch::kDouble) + 0.5;
  for (const int64_t degree : {1, 2}) {
    std::vector<double> draws;
    for (uint64_t seed = 0; seed < 4000; ++seed) {
      const auto hashes = tensor_sketch_hashes(4, 16, degree, seed);
      draws.push_back(tensor_sketch(x, hashes).dot(tensor_sketch(y, hashes)).item<double>());
    }
    double mean = 0.0, square = 0.0;
    for (const double d : draws) mean += d / static_cast<double>(draws.size());
    for (const double d : draws) square += (d - mean) * (d - mean) / static_cast<double>(draws.size() - 1);
    const double exact = std::pow(x.dot(y).item<double>(), static_cast<double>(degree));
    EXPECT_NEAR(mean, exact, 4.0 * std::sqrt(square / static_cast<double>(draws.size()))) << degree;
    EXPECT_GT(square, 0.0);  // an estimate, not the kernel itself
  }
}

/// p = 1 with hashes that put the 4 coordinates in distinct buckets: TS is a signed permutation, so the spine is
/// LinearAttentionSpine with the same weights, and the misfit receipt is zero.
TEST(TensorSketchSpine, EqualsLinearAttentionWhereTheSketchIsAPermutation) {
  auto o = small_options(4096, 1);
  auto model = make_model(1, o);
  std::set<int64_t> buckets;
  for (int64_t j = 0; j < 4; ++j) buckets.insert(model->hashes()[0][j].abs().argmax().item<int64_t>());
  ASSERT_EQ(buckets.size(), 4U) << "hash_seed 0 collides; the test needs a collision-free draw";
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
  const auto x = tokens(2, 40, 2);
  const auto [logits, state] = stream(model, x, {9, 31});
  const auto expected = linear->advance(linear->init_state(2), x).logits;
  EXPECT_TRUE(torch::allclose(logits, expected, 1e-4, 1e-5)) << (logits - expected).abs().max().item<double>();
  for (const auto& layer : state.layers) EXPECT_LT(layer.misfit.max().item<double>(), 1e-12);
}

TEST(TensorSketchSpine, StreamingInChunksEqualsOnePass) {
  auto model = make_model(5, small_options(16, 2));
  torch::NoGradGuard no_grad;
  const auto x = tokens(2, 41, 6);
  const auto [whole, one] = stream(model, x, {41});
  for (const auto& chunks : std::vector<std::vector<int64_t>>{{1, 1, 1, 38}, {2, 5, 7, 27}, {20, 21}}) {
    const auto [parts, many] = stream(model, x, chunks);
    EXPECT_TRUE(torch::allclose(parts, whole, 1e-4, 1e-5)) << (parts - whole).abs().max().item<double>();
    for (size_t l = 0; l < one.layers.size(); ++l) {
      // float64 sums of float32 sketches whose last bits depend on the chunk's shape: equal to float32 rounding of
      // the sums' scale.
      const double scale = one.layers[l].sum_kv.abs().max().item<double>();
      EXPECT_TRUE(torch::allclose(one.layers[l].sum_kv, many.layers[l].sum_kv, 1e-6, 1e-6 * scale))
          << (one.layers[l].sum_kv - many.layers[l].sum_kv).abs().max().item<double>() << " of " << scale;
      EXPECT_TRUE(torch::allclose(one.layers[l].sum_k, many.layers[l].sum_k, 1e-6, 1e-8));
      EXPECT_TRUE(torch::allclose(one.layers[l].window_k, many.layers[l].window_k, 1e-5, 1e-6));
    }
  }
}

TEST(TensorSketchSpine, StreamsDoNotLeakIntoEachOther) {
  auto model = make_model(7, small_options(16, 2));
  torch::NoGradGuard no_grad;
  auto x = tokens(2, 30, 8);
  const auto first = stream(model, x, {13, 17}).first;
  x[1] = tokens(1, 30, 9)[0];
  const auto second = stream(model, x, {13, 17}).first;
  EXPECT_TRUE(torch::allclose(first[0], second[0], 1e-6, 1e-7));
  EXPECT_FALSE(torch::allclose(first[1], second[1], 1e-3, 1e-3));
}

/// The whole spine is differentiable: central differences in float64 over two chunks that evict tokens.
TEST(TensorSketchSpine, GradientsMatchFiniteDifferences) {
  auto model = make_model(11, small_options(16, 2));
  model->to(torch::kDouble);
  const auto x = tokens(2, 12, 12);
  const auto y = tokens(2, 12, 13);
  const auto loss = [&] {
    const auto first = model->step(model->init_state(2), x.narrow(1, 0, 5), y.narrow(1, 0, 5));
    return first.loss + model->step(first.state, x.narrow(1, 5, 7), y.narrow(1, 5, 7)).loss;
  };
  testing::expect_gradients_match_finite_differences(*model, loss, testing::kLinearSpineProbes);
}

/// A narrow sketch misfits more than a wide one on the same stream; the receipt is finite and non-negative.
TEST(TensorSketchSpine, MisfitReceiptShrinksWithTheSketchWidth) {
  torch::NoGradGuard no_grad;
  const auto x = tokens(2, 60, 14);
  double narrow = 0.0, wide = 0.0;
  for (const auto& [width, into] : {std::pair{int64_t{4}, &narrow}, std::pair{int64_t{1024}, &wide}}) {
    auto model = make_model(15, small_options(width, 2));
    const auto state = stream(model, x, {30, 30}).second;
    for (const auto& layer : state.layers) {
      EXPECT_TRUE(torch::isfinite(layer.misfit).all().item<bool>());
      EXPECT_TRUE(layer.misfit.ge(0).all().item<bool>());
      *into += layer.misfit.mean().item<double>();
    }
  }
  EXPECT_GT(narrow, 2.0 * wide);
  EXPECT_GT(wide, 0.0);
}

TEST(TensorSketchSpine, StateSizeDoesNotGrowWithTheStream) {
  auto model = make_model(17, small_options(16, 2));
  torch::NoGradGuard no_grad;
  const auto short_state = stream(model, tokens(1, 5, 16), {5}).second;
  const auto long_state = stream(model, tokens(1, 300, 16), {100, 100, 100}).second;
  EXPECT_EQ(short_state.bytes(), long_state.bytes());
  // per layer and head: window 3 x (4 + 4) float32, S 16 x 4, Z 16, misfit float64; the shift row 8 float32
  EXPECT_EQ(long_state.bytes(), 2 * (2 * (3 * 8 * 4 + (16 * 4 + 16 + 1) * 8) + 8 * 4));
}

TEST(TensorSketchSpine, RejectsBadOptionsAndStates) {
  EXPECT_THROW(TensorSketchSpine(small_options(0, 2)), ValueError);
  EXPECT_THROW(TensorSketchSpine(small_options(8, 0)), ValueError);
  EXPECT_THROW(TensorSketchSpine(small_options(8, 2, 0)), ValueError);
  auto model = make_model(19, small_options(8, 2));
  torch::NoGradGuard no_grad;
  const auto x = tokens(1, 9, 18);
  auto state = stream(model, x, {9}).second;
  auto wrong_window = state;
  wrong_window.layers[0].window_v = wrong_window.layers[0].window_v.narrow(2, 0, 2);
  EXPECT_THROW(model->advance(wrong_window, x), ValueError);
  auto wrong_sums = state;
  wrong_sums.layers[1].sum_kv = wrong_sums.layers[1].sum_kv.to(torch::kFloat);
  EXPECT_THROW(model->advance(wrong_sums, x), ValueError);
  EXPECT_THROW(model->advance(model->init_state(2), x), ValueError);
}

}  // namespace
}  // namespace attnmix::stream
