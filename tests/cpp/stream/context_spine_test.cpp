// SPDX-License-Identifier: Apache-2.0
// The sliding-window spine (docs/mechanisms.md#streaming-language-model; acceptance rows E1-4 and E1-6) against oracles
// written here.
//
// Oracles written from docs/mechanisms.md#streaming-language-model and not from src/stream/context_spine.cpp (only the
// parameters are read):
//   * naive_forward: one pass over a whole sequence in float64 — explicit LayerNorm (eps 1e-5, biased variance),
//     Linear as x Wᵀ + b, GELU as ½x(1 + erf(x/√2)), RoPE as the rotation of each pair (x_k, x_{k+h/2}) by
//     p·10000^(−2k/h) with angles from std::pow/std::cos/std::sin, the mask 0 ≤ P_i − P_j < window built by a
//     double loop, a max-shifted softmax, and the head tied to the embedding. It never streams, so it has no cache:
//     comparing it with chunked streaming checks the cache (raw keys, eviction) and the mask at chunk borders.
//   * naive_visibility: the mask by a double loop over positions;
//   * mean_ce: the mean token cross-entropy computed in double from the logits by loops;
//   * central finite differences of the loss in float64 for the gradients.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "testing/all_close.hpp"
#include "testing/torch_values.hpp"

namespace attnmix::stream {
namespace {

using testing::ExpectAllClose;
using testing::to_vector;

/// max |a − b| / max |b|: the relative gap over a whole tensor (the "relative 1e-5" of
/// docs/mechanisms.md#streaming-language-model; per-element relative error is meaningless for logits that cross zero).
double relative_gap(const torch::Tensor& a, const torch::Tensor& b) {
  const auto a64 = a.detach().to(torch::kFloat64);
  const auto b64 = b.detach().to(torch::kFloat64);
  return (a64 - b64).abs().max().item<double>() / b64.abs().max().item<double>();
}

/// (b, t) int64 ids, uniform over [0, vocab), from attnmix's own generator.
torch::Tensor random_tokens(Rng& rng, int64_t b, int64_t t, int64_t vocab) {
  auto out = torch::empty({b, t}, torch::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(vocab)));
  return out;
}

SpineOptions small_options(std::optional<int64_t> window) {
  SpineOptions o;
  o.vocab = 11;
  o.d_model = 16;
  o.n_layer = 2;
  o.n_head = 2;
  o.window = window;
  return o;
}

std::string window_name(std::optional<int64_t> window) {
  return window ? "window " + std::to_string(*window) : std::string("window unbounded");
}

// ----- the naive whole-sequence reference --------------------------------------------------------------------------

torch::Tensor f64(const torch::Tensor& t) { return t.detach().to(torch::kFloat64); }

torch::Tensor naive_layer_norm(const torch::Tensor& x, torch::nn::LayerNorm& ln) {
  const auto mean = x.mean(-1, true);
  const auto var = (x - mean).pow(2).mean(-1, true);
  return (x - mean) / (var + 1e-5).sqrt() * f64(ln->weight) + f64(ln->bias);
}

torch::Tensor naive_linear(const torch::Tensor& x, torch::nn::Linear& l) {
  auto out = torch::matmul(x, f64(l->weight).t());
  return l->bias.defined() ? out + f64(l->bias) : out;
}

torch::Tensor naive_gelu(const torch::Tensor& x) { return 0.5 * x * (1.0 + torch::erf(x / std::sqrt(2.0))); }

/// x (b, T, H, h) rotated pair by pair at positions 0 … T−1.
torch::Tensor naive_rope(const torch::Tensor& x) {
  const int64_t t = x.size(1), h = x.size(3), half = h / 2;
  auto cos = torch::empty({t, 1, half}, torch::kFloat64);
  auto sin = torch::empty({t, 1, half}, torch::kFloat64);
  for (int64_t p = 0; p < t; ++p) {
    for (int64_t k = 0; k < half; ++k) {
      const double angle =
          static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(k) / static_cast<double>(h));
      cos[p][0][k] = std::cos(angle);
      sin[p][0][k] = std::sin(angle);
    }
  }
  const auto a = x.narrow(-1, 0, half);
  const auto b = x.narrow(-1, half, half);
  return torch::cat({a * cos - b * sin, b * cos + a * sin}, -1);
}

/// (T, T) bool: key j visible to query i iff 0 ≤ i − j < window (only causality when unbounded).
torch::Tensor naive_mask(int64_t t, std::optional<int64_t> window) {
  auto mask = torch::zeros({t, t}, torch::kBool);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < t; ++j) {
      mask[i][j] = i - j >= 0 && (!window || i - j < *window);
    }
  }
  return mask;
}

struct NaiveOutput {
  torch::Tensor logits;            ///< (b, T, vocab), float64
  std::vector<torch::Tensor> k;    ///< per layer, raw keys (b, T, H, h)
  std::vector<torch::Tensor> v;    ///< per layer, values (b, T, H, h)
};

/// docs/mechanisms.md#streaming-language-model over the whole sequence x (b, T) in one pass, in float64, with the
/// spine's parameters.
NaiveOutput naive_forward(SlidingWindowSpine& spine, const torch::Tensor& x, std::optional<int64_t> window) {
  torch::NoGradGuard no_grad;
  const auto& o = spine->options();
  auto& bb = spine->backbone();
  const int64_t b = x.size(0), t = x.size(1), n_head = o.n_head, hd = o.d_model / o.n_head;
  const auto tok = f64(bb->tok->weight);
  auto h = tok.index_select(0, x.reshape({-1})).view({b, t, o.d_model});
  const auto visible = naive_mask(t, window);
  NaiveOutput out;
  for (auto& layer : bb->layers) {
    const auto qkv = naive_linear(naive_layer_norm(h, layer->ln1), layer->qkv);  // (b, T, 3d): [q | k | v]
    const auto q = qkv.narrow(-1, 0, o.d_model).reshape({b, t, n_head, hd});
    const auto k = qkv.narrow(-1, o.d_model, o.d_model).reshape({b, t, n_head, hd});
    const auto v = qkv.narrow(-1, 2 * o.d_model, o.d_model).reshape({b, t, n_head, hd});
    const auto qr = naive_rope(q).permute({0, 2, 1, 3});  // (b, H, T, h)
    const auto kr = naive_rope(k).permute({0, 2, 1, 3});
    auto scores = torch::matmul(qr, kr.transpose(-1, -2)) / std::sqrt(static_cast<double>(hd));
    scores = scores.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
    const auto e = (scores - std::get<0>(scores.max(-1, true))).exp();
    const auto weights = e / e.sum(-1, true);
    const auto attn = torch::matmul(weights, v.permute({0, 2, 1, 3})).permute({0, 2, 1, 3}).reshape({b, t, -1});
    h = h + naive_linear(attn, layer->proj);
    h = h + naive_linear(naive_gelu(naive_linear(naive_layer_norm(h, layer->ln2), layer->fc1)), layer->fc2);
    out.k.push_back(k);
    out.v.push_back(v);
  }
  out.logits = torch::matmul(naive_layer_norm(h, bb->ln_f), tok.t());
  return out;
}

/// Mean over all positions of log Σ_v exp(logit_v) − logit_y, in double by loops.
double mean_ce(const torch::Tensor& logits, const torch::Tensor& y) {
  const auto l = to_vector(logits);
  const auto yc = y.contiguous();
  const int64_t vocab = logits.size(-1), n = y.numel();
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double* row = l.data() + i * vocab;
    const double m = *std::max_element(row, row + vocab);
    double s = 0.0;
    for (int64_t c = 0; c < vocab; ++c) s += std::exp(row[c] - m);
    total += m + std::log(s) - row[yc.data_ptr<int64_t>()[i]];
  }
  return total / static_cast<double>(n);
}

// ----- streaming helper ---------------------------------------------------------------------------------------------

struct Streamed {
  torch::Tensor logits;  ///< (b, T, vocab), the chunks' logits concatenated
  double loss = 0.0;     ///< Σ_c t_c·loss_c / T: the mean over every position of the stream
  SlidingWindowState state;
  std::vector<int64_t> cache_lengths;  ///< after each chunk (layer 0)
};

Streamed stream(SlidingWindowSpine& spine, const torch::Tensor& x, const torch::Tensor& y,
                const std::vector<int64_t>& splits) {
  torch::NoGradGuard no_grad;
  Streamed out;
  out.state = spine->init_state(x.size(0));
  std::vector<torch::Tensor> parts;
  int64_t start = 0;
  for (const int64_t len : splits) {
    const auto xc = x.narrow(1, start, len);
    const auto yc = y.narrow(1, start, len);
    parts.push_back(spine->advance(out.state, xc).logits);
    auto step = spine->step(out.state, xc, yc);
    out.loss += step.loss.item<double>() * static_cast<double>(len);
    out.state = std::move(step.state);
    out.cache_lengths.push_back(out.state.cache_k[0].size(1));
    start += len;
  }
  EXPECT_EQ(start, x.size(1)) << "the splits must cover the stream";
  out.loss /= static_cast<double>(start);
  out.logits = torch::cat(parts, 1);
  return out;
}

std::string splits_name(const std::vector<int64_t>& splits) {
  std::string s = "splits";
  for (const int64_t v : splits) s.append(" ").append(std::to_string(v));
  return s;
}

// ----- SpineOptions -------------------------------------------------------------------------------------------------

/// E1-6 / docs/mechanisms.md#streaming-language-model: every size must be positive, d_model % n_head == 0, head_dim
/// even and cp_size 1 (ValueError naming the field, from validate_spine_options and from the constructor); valid
/// options construct.
TEST(SpineOptionsTest, InvalidOptionsThrowNamingTheField) {
  struct Case {
    std::string what;
    std::function<void(SpineOptions&)> change;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"vocab 0", [](SpineOptions& o) { o.vocab = 0; }, "vocab"},
      {"vocab -3", [](SpineOptions& o) { o.vocab = -3; }, "vocab"},
      {"d_model 0", [](SpineOptions& o) { o.d_model = 0; }, "d_model"},
      {"n_layer 0", [](SpineOptions& o) { o.n_layer = 0; }, "n_layer"},
      {"n_head 0", [](SpineOptions& o) { o.n_head = 0; }, "n_head"},
      {"window 0", [](SpineOptions& o) { o.window = 0; }, "window"},
      {"window -4", [](SpineOptions& o) { o.window = -4; }, "window"},
      {"d_model 30 % n_head 4", [](SpineOptions& o) { o.d_model = 30; o.n_head = 4; }, "divisible"},
      {"head_dim 3 (odd)", [](SpineOptions& o) { o.d_model = 6; o.n_head = 2; }, "even"},
      {"head_dim 1 (odd)", [](SpineOptions& o) { o.d_model = 4; o.n_head = 4; }, "even"},
      {"cp_size 2", [](SpineOptions& o) { o.cp_size = 2; }, "cp_size"},
      {"cp_size 0", [](SpineOptions& o) { o.cp_size = 0; }, "cp_size"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    SpineOptions o;
    c.change(o);
    try {
      validate_spine_options(o, "where");
      ADD_FAILURE() << "no ValueError";
    } catch (const ValueError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(c.needle), std::string::npos) << message;
      EXPECT_EQ(message.rfind("where", 0), 0u) << message;
    }
    EXPECT_THROW(SlidingWindowSpine{o}, ValueError);
  }
  SpineOptions ok;
  EXPECT_NO_THROW(validate_spine_options(ok, "where"));
  ok.window = std::nullopt;
  EXPECT_NO_THROW(validate_spine_options(ok, "where"));
  ok.d_model = 4;
  ok.n_head = 2;  // head_dim 2
  EXPECT_NO_THROW(SlidingWindowSpine{ok});
}

// ----- the window mask ----------------------------------------------------------------------------------------------

/// The visibility rule (docs/mechanisms.md#streaming-language-model): window_visibility equals a double loop over 0 ≤
/// P_i − P_j < window (or P_i ≥ P_j when unbounded) for random, unsorted, partly negative positions and several windows
/// (exact).
TEST(WindowVisibilityTest, MatchesNaiveDoubleLoop) {
  const uint64_t seed = testing::test_seed(201);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t t = 1 + static_cast<int64_t>(rng.uniform_int(9));
    const int64_t len = 1 + static_cast<int64_t>(rng.uniform_int(15));
    std::vector<int64_t> qp(static_cast<size_t>(t)), kp(static_cast<size_t>(len));
    for (auto& p : qp) p = static_cast<int64_t>(rng.uniform_int(40)) - 5;
    for (auto& p : kp) p = static_cast<int64_t>(rng.uniform_int(40)) - 5;
    for (const std::optional<int64_t> window : {std::optional<int64_t>{}, std::optional<int64_t>{1},
                                                std::optional<int64_t>{2}, std::optional<int64_t>{5},
                                                std::optional<int64_t>{13}, std::optional<int64_t>{1000}}) {
      SCOPED_TRACE(window_name(window) + ", trial " + std::to_string(trial));
      const auto visible = window_visibility(torch::tensor(qp, torch::kLong), torch::tensor(kp, torch::kLong), window);
      ASSERT_EQ(visible.scalar_type(), torch::kBool);
      ASSERT_EQ(visible.sizes(), torch::IntArrayRef({t, len}));
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t j = 0; j < len; ++j) {
          const int64_t delta = qp[static_cast<size_t>(i)] - kp[static_cast<size_t>(j)];
          const bool expected = delta >= 0 && (!window || delta < *window);
          EXPECT_EQ(visible[i][j].item<bool>(), expected) << "i " << i << " j " << j << " delta " << delta;
        }
      }
    }
  }
}

// ----- E1-4: streaming equals one pass ------------------------------------------------------------------------------

/// E1-4: float32, window unbounded and window 24 = the stream length: streaming 24 tokens (batch 2) in chunks
/// [24], [1 2 3 4 5 6 3], [7 8 9], [12 12], [23 1] gives the per-token logits and the mean loss of one pass over the
/// whole sequence (relative 1e-5, max-norm); the single pass itself equals the float64 naive reference (1e-5).
TEST(SlidingWindowSpineTest, StreamingEqualsSinglePass) {
  const uint64_t seed = testing::test_seed(202);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t b = 2, t = 24;
  for (const std::optional<int64_t> window : {std::optional<int64_t>{}, std::optional<int64_t>{t}}) {
    SCOPED_TRACE(window_name(window));
    torch::manual_seed(static_cast<uint64_t>(seed));
    SlidingWindowSpine spine(small_options(window));
    const auto x = random_tokens(rng, b, t, 11);
    const auto y = random_tokens(rng, b, t, 11);
    const auto whole = stream(spine, x, y, {t});
    EXPECT_LT(relative_gap(whole.logits, naive_forward(spine, x, window).logits), 1e-5);
    for (const std::vector<int64_t>& splits : std::vector<std::vector<int64_t>>{
             {1, 2, 3, 4, 5, 6, 3}, {7, 8, 9}, {12, 12}, {23, 1}}) {
      SCOPED_TRACE(splits_name(splits));
      const auto streamed = stream(spine, x, y, splits);
      EXPECT_LT(relative_gap(streamed.logits, whole.logits), 1e-5);
      EXPECT_NEAR(streamed.loss, whole.loss, 1e-5 * whole.loss);
      EXPECT_EQ(streamed.state.pos, t);
      EXPECT_EQ(streamed.cache_lengths.back(), t);  // nothing evicted: the window covers the stream
    }
  }
}

/// E1-4 (the mask and eviction): windows 1, 3, 4 and 7 (smaller than the 24-token stream) and unbounded, chunks of 3
/// and uneven chunks longer than the window: streaming equals the naive whole-sequence pass with the window mask
/// (float64: logits relative 1e-10, loss 1e-10, and every layer's cache equals the last min(window, pos) raw keys and
/// values of the naive pass; float32 chunks of 3 at window 4: relative 1e-5). The cache length after each chunk is
/// min(window, pos). A check that the window matters guards against a vacuous pass.
TEST(SlidingWindowSpineTest, SmallWindowStreamingEqualsNaiveWindowedPass) {
  const uint64_t seed = testing::test_seed(203);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t b = 2, t = 24;
  const auto x = random_tokens(rng, b, t, 11);
  const auto y = random_tokens(rng, b, t, 11);
  for (const std::optional<int64_t> window : {std::optional<int64_t>{4}, std::optional<int64_t>{1},
                                              std::optional<int64_t>{3}, std::optional<int64_t>{7},
                                              std::optional<int64_t>{}}) {
    SCOPED_TRACE(window_name(window));
    torch::manual_seed(static_cast<uint64_t>(seed));
    SlidingWindowSpine spine(small_options(window));
    spine->to(torch::kFloat64);
    const auto naive = naive_forward(spine, x, window);
    const double naive_loss = mean_ce(naive.logits, y);
    for (const std::vector<int64_t>& splits : std::vector<std::vector<int64_t>>{
             {3, 3, 3, 3, 3, 3, 3, 3}, {1, 1, 2, 5, 12, 3}, {24}, {10, 1, 13}}) {
      SCOPED_TRACE(splits_name(splits));
      const auto streamed = stream(spine, x, y, splits);
      EXPECT_LT(relative_gap(streamed.logits, naive.logits), 1e-10);
      EXPECT_NEAR(streamed.loss, naive_loss, 1e-10 * naive_loss);
      int64_t pos = 0;
      for (size_t c = 0; c < splits.size(); ++c) {
        pos += splits[c];
        EXPECT_EQ(streamed.cache_lengths[c], window ? std::min(*window, pos) : pos) << "after chunk " << c;
      }
      const int64_t keep = window ? std::min(*window, t) : t;
      for (size_t l = 0; l < naive.k.size(); ++l) {
        SCOPED_TRACE("layer " + std::to_string(l));
        ASSERT_EQ(streamed.state.cache_k[l].sizes(), torch::IntArrayRef({b, keep, 2, 8}));
        EXPECT_LT(relative_gap(streamed.state.cache_k[l], naive.k[l].narrow(1, t - keep, keep)), 1e-10);
        EXPECT_LT(relative_gap(streamed.state.cache_v[l], naive.v[l].narrow(1, t - keep, keep)), 1e-10);
      }
    }
    if (window) {  // the oracle can tell windows apart
      EXPECT_GT(relative_gap(naive_forward(spine, x, std::nullopt).logits, naive.logits), 1e-3);
    }
  }
  // float32, window 4, chunks of 3 against the float64 naive pass.
  torch::manual_seed(static_cast<uint64_t>(seed));
  SlidingWindowSpine spine(small_options(4));
  const auto streamed = stream(spine, x, y, {3, 3, 3, 3, 3, 3, 3, 3});
  const auto naive = naive_forward(spine, x, 4);
  EXPECT_LT(relative_gap(streamed.logits, naive.logits), 1e-5);
  EXPECT_NEAR(streamed.loss, mean_ce(naive.logits, y), 1e-5 * streamed.loss);
}

// ----- E1-6: the ContextMechanism protocol ---------------------------------------------------------------------------

struct MissingDetach {
  using state_type = int;
  int init_state(int64_t) { return 0; }
  MechanismStep<int> step(const int&, const torch::Tensor&, const torch::Tensor&) { return {}; }
};
struct WrongStepResult {
  using state_type = int;
  int init_state(int64_t) { return 0; }
  torch::Tensor step(const int&, const torch::Tensor&, const torch::Tensor&) { return {}; }
  int detach(const int&) { return 0; }
};
static_assert(ContextMechanism<SlidingWindowSpineImpl>);
static_assert(!ContextMechanism<MissingDetach>);
static_assert(!ContextMechanism<WrongStepResult>);

/// E1-6 / docs/mechanisms.md#streaming-language-model: the spine is a ContextMechanism (static_assert, and two
/// non-conforming types are rejected); init_state rejects batch sizes ≤ 0 and returns an empty state at position 0;
/// step returns a differentiable scalar loss equal to the mean token cross-entropy of advance()'s logits (float64,
/// 1e-12), moves pos by t and keeps (b, min(window, pos), H, head_dim) caches.
TEST(SlidingWindowSpineTest, ConformsToContextMechanism) {
  const uint64_t seed = testing::test_seed(204);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  torch::manual_seed(static_cast<uint64_t>(seed));
  SlidingWindowSpine spine(small_options(5));
  spine->to(torch::kFloat64);
  for (const int64_t bad : {0, -1, -7}) {
    EXPECT_THROW(spine->init_state(bad), ValueError) << "batch_size " << bad;
  }
  auto state = spine->init_state(3);
  EXPECT_EQ(state.batch_size, 3);
  EXPECT_EQ(state.pos, 0);
  EXPECT_EQ(state.n_head, 2);
  EXPECT_EQ(state.head_dim, 8);
  ASSERT_EQ(state.cache_k.size(), 2u);
  ASSERT_EQ(state.cache_v.size(), 2u);
  EXPECT_FALSE(state.cache_k[0].defined());
  EXPECT_EQ(state.bytes(), 0);
  int64_t pos = 0;
  for (const int64_t t : {4, 3, 1}) {
    const auto x = random_tokens(rng, 3, t, 11);
    const auto y = random_tokens(rng, 3, t, 11);
    const auto logits = spine->advance(state, x).logits;
    ASSERT_EQ(logits.sizes(), torch::IntArrayRef({3, t, 11}));
    auto result = spine->step(state, x, y);
    ASSERT_EQ(result.loss.dim(), 0);
    EXPECT_TRUE(result.loss.requires_grad());
    EXPECT_NEAR(result.loss.item<double>(), mean_ce(logits, y), 1e-12);
    pos += t;
    state = spine->detach(result.state);
    EXPECT_EQ(state.pos, pos);
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_EQ(state.cache_k[l].sizes(), torch::IntArrayRef({3, std::min<int64_t>(5, pos), 2, 8}));
      EXPECT_EQ(state.cache_v[l].sizes(), state.cache_k[l].sizes());
    }
    EXPECT_EQ(state.bytes(), 2 * 2 * 3 * std::min<int64_t>(5, pos) * 16 * 8);  // layers·{k,v}·b·len·d·8 bytes
  }
}

std::string value_error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a ValueError: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

/// E1-6 / docs/mechanisms.md#streaming-language-model: a chunk whose batch size differs from the state's → ValueError
/// mentioning "batch size", on a fresh state and on one that already holds caches; a state made by a spine with another
/// layout → ValueError.
TEST(SlidingWindowSpineTest, ChangedBatchSizeThrows) {
  const uint64_t seed = testing::test_seed(205);
  Rng rng(seed);
  torch::manual_seed(static_cast<uint64_t>(seed));
  SlidingWindowSpine spine(small_options(4));
  const auto fresh = spine->init_state(2);
  const auto x3 = random_tokens(rng, 3, 5, 11);
  EXPECT_NE(value_error_message([&] { spine->step(fresh, x3, x3); }).find("batch size"), std::string::npos);
  EXPECT_NE(value_error_message([&] { spine->advance(fresh, x3); }).find("batch size"), std::string::npos);
  const auto x2 = random_tokens(rng, 2, 5, 11);
  const auto used = spine->step(fresh, x2, x2).state;
  const auto x1 = random_tokens(rng, 1, 5, 11);
  EXPECT_NE(value_error_message([&] { spine->step(used, x1, x1); }).find("batch size"), std::string::npos);
  EXPECT_NO_THROW(spine->step(used, x2, x2));

  auto other_options = small_options(4);
  other_options.n_layer = 3;
  SlidingWindowSpine other(other_options);
  EXPECT_THROW(spine->step(other->init_state(2), x2, x2), ValueError);
}

/// E1-6 / docs/mechanisms.md#streaming-language-model: x and y must be (batch, t) int64 with equal shapes, t ≥ 1 and
/// ids in [0, vocab): each violation → ValueError from step (and from advance for x).
TEST(SlidingWindowSpineTest, InvalidChunksThrow) {
  const uint64_t seed = testing::test_seed(206);
  Rng rng(seed);
  torch::manual_seed(static_cast<uint64_t>(seed));
  SlidingWindowSpine spine(small_options(4));
  const auto state = spine->init_state(2);
  const auto good = random_tokens(rng, 2, 5, 11);
  auto too_big = good.clone();
  too_big[1][3] = 11;
  auto negative = good.clone();
  negative[0][0] = -1;
  const std::vector<std::pair<std::string, torch::Tensor>> bad_x = {
      {"id = vocab", too_big},
      {"id -1", negative},
      {"int32", good.to(torch::kInt)},
      {"float", good.to(torch::kFloat32)},
      {"t = 0", torch::empty({2, 0}, torch::kLong)},
      {"1-D", good[0]},
      {"3-D", good.unsqueeze(0)},
  };
  for (const auto& [what, bad] : bad_x) {
    SCOPED_TRACE(what);
    EXPECT_THROW(spine->step(state, bad, good), ValueError);
    EXPECT_THROW(spine->advance(state, bad), ValueError);
    if (bad.dim() == 2 && bad.size(1) == 5) {
      EXPECT_THROW(spine->step(state, good, bad), ValueError) << "as y";
    }
  }
  EXPECT_THROW(spine->step(state, good, good.narrow(1, 0, 4)), ValueError) << "y shorter than x";
  EXPECT_THROW(spine->step(state, good, random_tokens(rng, 3, 5, 11)), ValueError) << "y with another batch";
  EXPECT_NO_THROW(spine->step(state, good, good));
}

// ----- gradients -----------------------------------------------------------------------------------------------------

/// docs/mechanisms.md#streaming-language-model (gradients flow through the cache): float64, window 3, a stream of two
/// chunks of 4 (the second chunk's queries see 3 cached keys of the first), loss of the second chunk without detaching:
/// the autograd gradient of 12 random entries across tok, qkv (q, k and v rows, bias), proj, fc1, fc2, ln1, ln2 and
/// ln_f equals central finite differences (eps 1e-6; |g − fd| ≤ 1e-5·|fd| + 1e-8, the rounding error of the difference
/// being ~1e-10). With the state detached between the chunks the gradient differs (> 1e-6 somewhere), so the cache path
/// is exercised.
TEST(SlidingWindowSpineTest, GradientMatchesCentralDifferences) {
  const uint64_t seed = testing::test_seed(207);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  torch::manual_seed(static_cast<uint64_t>(seed));
  SlidingWindowSpine spine(small_options(3));
  spine->to(torch::kFloat64);
  const auto x = random_tokens(rng, 2, 8, 11);
  const auto y = random_tokens(rng, 2, 8, 11);
  const auto second_loss = [&](bool detach_between) {
    auto state = spine->init_state(2);
    state = spine->step(state, x.narrow(1, 0, 4), y.narrow(1, 0, 4)).state;
    if (detach_between) state = spine->detach(state);
    return spine->step(state, x.narrow(1, 4, 4), y.narrow(1, 4, 4)).loss;
  };
  const auto gradient = [&](bool detach_between) {
    spine->zero_grad();
    second_loss(detach_between).backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : spine->parameters()) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    return grads;
  };
  const auto attached = gradient(false);
  const auto detached = gradient(true);

  const auto named = spine->named_parameters();
  const auto params = spine->parameters();
  const auto index_of = [&](const std::string& name) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].is_same(named[name])) return i;
    }
    ADD_FAILURE() << "no parameter " << name;
    return size_t{0};
  };
  // (parameter, first flat index, number of candidate entries)
  const int64_t d = 16;
  const std::vector<std::tuple<std::string, int64_t, int64_t>> picks = {
      {"backbone.tok.weight", 0, 11 * d},
      {"backbone.layer0.qkv.weight", 0, d * d},          // q rows
      {"backbone.layer0.qkv.weight", d * d, d * d},      // k rows
      {"backbone.layer0.qkv.weight", 2 * d * d, d * d},  // v rows
      {"backbone.layer0.qkv.bias", d, d},                // k bias
      {"backbone.layer0.proj.weight", 0, d * d},
      {"backbone.layer0.fc1.weight", 0, 4 * d * d},
      {"backbone.layer0.ln1.weight", 0, d},
      {"backbone.layer1.qkv.weight", 0, 3 * d * d},
      {"backbone.layer1.fc2.bias", 0, d},
      {"backbone.layer1.ln2.bias", 0, d},
      {"backbone.ln_f.weight", 0, d},
  };
  const double eps = 1e-6;
  double largest_detach_gap = 0.0;
  for (const auto& [name, first, count] : picks) {
    const int64_t index = first + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(count)));
    SCOPED_TRACE(name + "[" + std::to_string(index) + "]");
    const size_t i = index_of(name);
    auto& p = named[name];
    ASSERT_TRUE(p.is_contiguous());
    double fd = 0.0;
    {
      torch::NoGradGuard no_grad;
      double* entry = p.data_ptr<double>() + index;
      const double original = *entry;
      *entry = original + eps;
      const double plus = second_loss(false).item<double>();
      *entry = original - eps;
      const double minus = second_loss(false).item<double>();
      *entry = original;
      fd = (plus - minus) / (2.0 * eps);
    }
    ASSERT_TRUE(attached[i].defined());
    const double g = attached[i].view(-1)[index].item<double>();
    EXPECT_NEAR(g, fd, 1e-5 * std::fabs(fd) + 1e-8);
    if (detached[i].defined()) {
      largest_detach_gap = std::max(largest_detach_gap, std::fabs(detached[i].view(-1)[index].item<double>() - fd));
    }
  }
  EXPECT_GT(largest_detach_gap, 1e-6);
}

}  // namespace
}  // namespace attnmix::stream
