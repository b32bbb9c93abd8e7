// SPDX-License-Identifier: Apache-2.0
// An exact polynomial-kernel window and running sums over a tensor sketch of the evicted tokens; see
// include/attnmix/stream/tensor_sketch.hpp.
#include "attnmix/stream/tensor_sketch.hpp"

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/linear_attention.hpp"
#include "dense_products_impl.hpp"
#include "layered_state.hpp"
#include "window_split.hpp"

#include <algorithm>
#include <string>
#include <utility>

namespace attnmix::stream {
namespace {

constexpr double kDenominatorFloor = 1e-6;  // ε of the header
constexpr double kTinyKernel = 1e-300;      // the misfit's denominator when every exact kernel value is zero

std::string str(int64_t v) { return std::to_string(v); }

struct SublayerStep {
  torch::Tensor out;
  TensorSketchLayerState state;
};

SublayerStep sublayer(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& proj, torch::nn::LinearImpl& shift,
                      const torch::Tensor& x, const TensorSketchLayerState& state, const TensorSketchOptions& o,
                      const torch::Tensor& hashes) {
  const auto split =
      detail::split_window(qkv, shift, x, state.window_k, state.window_v, state.last_x, o.n_head, o.window);
  const auto& phi_q = split.phi_q;
  const auto kernel = torch::matmul(phi_q, split.keys.transpose(-1, -2)).pow(o.degree) * split.in_window;
  const auto sketch_q = tensor_sketch(phi_q, hashes);             // (b, H, t, D)
  const auto sketch_k = tensor_sketch(split.evicted_k, hashes);   // zero rows where nothing is evicted
  const auto pairs = torch::matmul(sketch_q, sketch_k.transpose(-1, -2)).tril();  // TS(q_i)·TS(k_j), j ≤ i
  const auto numerator = torch::matmul(kernel, split.values) + torch::matmul(sketch_q, state.sum_kv) +
                         torch::matmul(pairs, split.evicted_v);
  const auto denominator = (kernel.sum(-1, true) + (sketch_q * state.sum_k.unsqueeze(2)).sum(-1, true) +
                            pairs.sum(-1, true))
                               .clamp_min(0.0) +
                           kDenominatorFloor;

  SublayerStep step;
  step.out = detail::fast_linear(detail::merge_heads(numerator / denominator, x), proj.weight, proj.bias);
  auto& next = step.state;
  next.window_k = split.next_window_k;
  next.window_v = split.next_window_v;
  next.sum_kv = state.sum_kv + torch::matmul(sketch_k.transpose(-1, -2), split.evicted_v);
  next.sum_k = state.sum_k + sketch_k.sum(2);
  next.last_x = x.select(1, x.size(1) - 1).clone();
  if (split.evictions == 0) {
    next.misfit = state.misfit;
  } else {
    torch::NoGradGuard no_grad;
    const auto exact = torch::matmul(phi_q, split.evicted_k.transpose(-1, -2)).pow(o.degree).tril();
    next.misfit = (pairs - exact).abs().sum({2, 3}) / exact.sum({2, 3}).clamp_min(kTinyKernel);
  }
  return step;
}

}  // namespace

torch::Tensor tensor_sketch_hashes(int64_t head_dim, int64_t sketch_dim, int64_t degree, uint64_t seed) {
  if (head_dim <= 0 || sketch_dim <= 0 || degree <= 0) {
    throw ValueError("tensor_sketch_hashes: head_dim, sketch_dim and degree must be positive integers (got " +
                     str(head_dim) + ", " + str(sketch_dim) + ", " + str(degree) + ")");
  }
  Rng rng(seed);
  auto hashes = torch::zeros({degree, head_dim, sketch_dim}, torch::kDouble);
  auto a = hashes.accessor<double, 3>();
  for (int64_t i = 0; i < degree; ++i) {
    for (int64_t j = 0; j < head_dim; ++j) {
      const auto bucket = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(sketch_dim)));
      a[i][j][bucket] = rng.bernoulli(0.5) ? 1.0 : -1.0;
    }
  }
  return hashes;
}

torch::Tensor tensor_sketch(const torch::Tensor& x, const torch::Tensor& hashes) {
  const int64_t degree = hashes.size(0), width = hashes.size(2);
  if (degree == 1) return torch::matmul(x, hashes[0]);
  auto spectrum = torch::fft::rfft(torch::matmul(x, hashes[0]), width, -1);
  for (int64_t i = 1; i < degree; ++i) spectrum = spectrum * torch::fft::rfft(torch::matmul(x, hashes[i]), width, -1);
  return torch::fft::irfft(spectrum, width, -1);
}

int64_t TensorSketchState::bytes() const {
  int64_t total = 0;
  for (const auto& layer : layers) {
    for (const auto* t : {&layer.window_k, &layer.window_v, &layer.sum_kv, &layer.sum_k, &layer.misfit,
                          &layer.last_x}) {
      if (t->defined()) total += t->numel() * static_cast<int64_t>(t->element_size());
    }
  }
  return total;
}

TensorSketchSpineImpl::TensorSketchSpineImpl(const TensorSketchOptions& options) : options_(options) {
  SpineOptions sizes;
  sizes.vocab = options_.vocab;
  sizes.d_model = options_.d_model;
  sizes.n_layer = options_.n_layer;
  sizes.n_head = options_.n_head;
  sizes.window = options_.window;
  validate_spine_options(sizes, "TensorSketchSpine");
  if (options_.sketch_dim <= 0 || options_.degree <= 0) {
    throw ValueError("TensorSketchSpine: sketch_dim and degree must be positive integers (got " +
                     str(options_.sketch_dim) + " and " + str(options_.degree) + ")");
  }
  backbone_ = register_module("backbone", SpineBackbone(options_.vocab, options_.d_model, options_.n_layer));
  shifts_ = register_token_shifts(*this, options_.d_model, options_.n_layer);
  hashes_ = tensor_sketch_hashes(head_dim(), options_.sketch_dim, options_.degree, options_.hash_seed);
}

TensorSketchState TensorSketchSpineImpl::init_state(int64_t batch_size, torch::Device device) const {
  if (batch_size <= 0) {
    throw ValueError("TensorSketchSpine.init_state: batch_size must be a positive integer (got " + str(batch_size) +
                     ")");
  }
  const int64_t H = options_.n_head, hd = head_dim(), D = options_.sketch_dim;
  const auto sums = torch::TensorOptions().dtype(torch::kDouble).device(device);
  const auto rows = torch::TensorOptions().dtype(backbone_->tok->weight.scalar_type()).device(device);
  TensorSketchState state;
  state.batch_size = batch_size;
  for (int64_t l = 0; l < options_.n_layer; ++l) {
    TensorSketchLayerState layer;
    layer.window_k = torch::zeros({batch_size, H, 0, hd}, rows);
    layer.window_v = torch::zeros({batch_size, H, 0, hd}, rows);
    layer.sum_kv = torch::zeros({batch_size, H, D, hd}, sums);
    layer.sum_k = torch::zeros({batch_size, H, D}, sums);
    layer.misfit = torch::zeros({batch_size, H}, sums);
    layer.last_x = torch::zeros({batch_size, options_.d_model}, rows);
    state.layers.push_back(std::move(layer));
  }
  return state;
}

void TensorSketchSpineImpl::check_state(const TensorSketchState& s, int64_t b, const char* where) const {
  const std::string w(where);
  detail::check_state_frame(s.batch_size, s.pos, static_cast<int64_t>(s.layers.size()), b, options_.n_layer, w);
  const auto fits = &detail::tensor_fits;
  const int64_t H = options_.n_head, hd = head_dim(), D = options_.sketch_dim, held = std::min(s.pos, options_.window);
  const auto dtype = backbone_->tok->weight.scalar_type();
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const auto& layer = s.layers[l];
    const std::string name = w + ": layer " + str(static_cast<int64_t>(l)) + " of the state";
    if (!fits(layer.window_k, {b, H, held, hd}, dtype) || !fits(layer.window_v, {b, H, held, hd}, dtype)) {
      throw ValueError(name + " must hold window_k and window_v (batch " + str(b) + ", n_head " + str(H) +
                       ", min(pos, window) = " + str(held) + ", head_dim " + str(hd) + ") in the parameters' dtype");
    }
    if (!fits(layer.sum_kv, {b, H, D, hd}, torch::kDouble) || !fits(layer.sum_k, {b, H, D}, torch::kDouble) ||
        !fits(layer.misfit, {b, H}, torch::kDouble) || !fits(layer.last_x, {b, options_.d_model}, dtype)) {
      throw ValueError(name + " must hold sum_kv (batch, n_head, sketch_dim " + str(D) + ", head_dim), sum_k " +
                       "(batch, n_head, sketch_dim) and misfit (batch, n_head) in float64 and last_x (batch, " +
                       "d_model) in the parameters' dtype");
    }
  }
}

TensorSketchOutput TensorSketchSpineImpl::advance(const TensorSketchState& state, const torch::Tensor& x) {
  validate_tokens(x, options_.vocab, "TensorSketchSpine.advance");
  return advance_checked(state, x);
}

TensorSketchOutput TensorSketchSpineImpl::advance_checked(const TensorSketchState& state, const torch::Tensor& x) {
  check_state(state, x.size(0), "TensorSketchSpine.step");
  const auto hashes = hashes_.to(x.device());
  auto [next, logits] = detail::advance_layers(
      *backbone_, state, x, [&](size_t l, SpineLayerImpl& layer, const torch::Tensor& h, const auto& layer_state) {
        auto attn = sublayer(*layer.qkv, *layer.proj, *shifts_[l], h, layer_state, options_, hashes);
        return std::pair{std::move(attn.out), std::move(attn.state)};
      });
  return {std::move(next), std::move(logits)};
}

MechanismStep<TensorSketchState> TensorSketchSpineImpl::step(const TensorSketchState& state, const torch::Tensor& x,
                                                              const torch::Tensor& y) {
  validate_chunk(x, y, options_.vocab, "TensorSketchSpine.step");
  auto out = advance_checked(state, x);
  return {std::move(out.state), mean_cross_entropy(out.logits, y)};
}

TensorSketchState TensorSketchSpineImpl::detach(const TensorSketchState& state) const {
  TensorSketchState out = state;
  for (auto& layer : out.layers) {
    for (auto* t : {&layer.window_k, &layer.window_v, &layer.sum_kv, &layer.sum_k, &layer.misfit, &layer.last_x}) {
      *t = t->detach();
    }
  }
  return out;
}

}  // namespace attnmix::stream
