// SPDX-License-Identifier: Apache-2.0
// Linear attention with an exact window and a Frequent Directions sketch of the evicted tokens; see
// include/attnmix/stream/frequent_directions.hpp.
#include "attnmix/stream/frequent_directions.hpp"

#include "attnmix/core/errors.hpp"
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
constexpr double kBoundTolerance = 1e-9;    // relative to ‖A‖_F², for the receipt's comparison

std::string str(int64_t v) { return std::to_string(v); }

// B_kᵀ B_v of sketches (b, H, ℓ, 2·h_d): (b, H, h_d, h_d), what the sketch holds of Σ φ(k) vᵀ.
torch::Tensor sketch_cross(const torch::Tensor& sketch, int64_t hd) {
  return torch::matmul(sketch.narrow(-1, 0, hd).transpose(-1, -2), sketch.narrow(-1, hd, hd));
}

// out_i = Σ_{j ≤ i} (q_i·k_j) v_j over one run of tokens, (b, H, n, h_d) each.
torch::Tensor causal_linear(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  return torch::matmul(torch::matmul(q, k.transpose(-1, -2)).tril(), v);
}

// The rows in use and the shrinks after `evicted` insertions into an empty sketch of `rows` × `columns`: the
// schedule every stream and head of a layer follows.
std::pair<int64_t, int64_t> sketch_schedule(int64_t evicted, int64_t rows, int64_t columns) {
  if (evicted < rows) return {evicted, 0};
  const int64_t rank = std::min(rows, columns);
  const int64_t after = rows / 2 <= rank ? rows / 2 - 1 : rank;
  const int64_t period = rows - after;
  return {after + (evicted - rows) % period, 1 + (evicted - rows) / period};
}

struct FarField {
  torch::Tensor numerator;  // B_vᵀ B_k φ(q_i) + the rows inserted since the last shrink, (b, H, t, h_d)
  FrequentDirectionsLayerState sketch;  // sketch, filled, shrinks and shrink_total after the chunk
};

// Token by token in effect, segment by segment in cost: between two shrinks the sketch only gains rows, so the
// tokens of a segment read the sketch at its start plus causal linear attention over the rows inserted since.
// `rows` (b, H, t, 2·h_d) holds each token's evicted row (zero before `first_eviction`), without gradient.
FarField read_and_extend_sketch(const torch::Tensor& phi_q, const torch::Tensor& rows, int64_t first_eviction,
                                const FrequentDirectionsLayerState& state, int64_t hd) {
  const int64_t t = phi_q.size(2), capacity = state.sketch.size(2);
  FarField far;
  auto& s = far.sketch;
  s.sketch = state.sketch.detach();
  s.filled = state.filled;
  s.shrinks = state.shrinks;
  s.shrink_total = state.shrink_total.detach();
  std::vector<torch::Tensor> parts;
  for (int64_t start = 0; start < t;) {
    const int64_t first = std::max(start, first_eviction);
    const int64_t full_at = first < t ? first + (capacity - s.filled) - 1 : t;  // the token that fills the sketch
    const int64_t end = std::min(full_at, t);  // tokens [start, end) read the sketch before that
    if (end > start) {
      const auto q = phi_q.narrow(2, start, end - start);
      const auto run = rows.narrow(2, start, end - start);
      parts.push_back(torch::matmul(q, sketch_cross(s.sketch, hd)) +
                      causal_linear(q, run.narrow(-1, 0, hd), run.narrow(-1, hd, hd)));
    }
    const int64_t last = std::min(full_at, t - 1);
    if (first <= last) {
      torch::NoGradGuard no_grad;
      s.sketch = s.sketch.clone();
      s.sketch.narrow(2, s.filled, last - first + 1).copy_(rows.narrow(2, first, last - first + 1));
      s.filled += last - first + 1;
    }
    if (full_at >= t) break;
    auto shrink = frequent_directions_shrink(s.sketch);
    s.sketch = std::move(shrink.sketch);
    s.filled = shrink.filled;
    s.shrinks += 1;
    s.shrink_total = s.shrink_total + shrink.delta;
    parts.push_back(torch::matmul(phi_q.narrow(2, full_at, 1), sketch_cross(s.sketch, hd)));
    start = full_at + 1;
  }
  far.numerator = torch::cat(parts, 2);
  return far;
}

struct SublayerStep {
  torch::Tensor out;
  FrequentDirectionsLayerState state;
};

SublayerStep sublayer(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& proj, torch::nn::LinearImpl& shift,
                      const torch::Tensor& x, const FrequentDirectionsLayerState& state, int64_t n_head,
                      int64_t window) {
  const int64_t t = x.size(1), hd = x.size(2) / n_head;
  const auto split =
      detail::split_window(qkv, shift, x, state.window_k, state.window_v, state.last_x, n_head, window);
  const auto& phi_q = split.phi_q;
  const auto scores = torch::matmul(phi_q, split.keys.transpose(-1, -2)) * split.in_window;
  auto numerator = torch::matmul(scores, split.values);
  const auto sums_k = state.sum_k.unsqueeze(2) + torch::cumsum(split.evicted_k, 2);  // Z_i exactly, (b, H, t, h_d)
  const auto denominator = scores.sum(-1, true) + (phi_q * sums_k).sum(-1, true) + kDenominatorFloor;

  const auto rows = torch::cat({split.evicted_k, split.evicted_v}, -1).detach();
  auto far = read_and_extend_sketch(phi_q, rows, split.first_eviction, state, hd);
  numerator = numerator + far.numerator;
  if (torch::GradMode::is_enabled() && split.evictions > 0 && split.evicted_k.requires_grad()) {
    const auto exact = causal_linear(phi_q.detach(), split.evicted_k, split.evicted_v);  // straight-through
    numerator = numerator + (exact - exact.detach());
  }

  SublayerStep step;
  step.out = detail::fast_linear(detail::merge_heads(numerator / denominator, x), proj.weight, proj.bias);
  auto& next = step.state;
  next = std::move(far.sketch);
  next.window_k = split.next_window_k;
  next.window_v = split.next_window_v;
  next.sum_k = sums_k.select(2, t - 1).clone();
  next.mass = state.mass + rows.square().sum({2, 3});
  next.last_x = x.select(1, t - 1).clone();
  return step;
}

}  // namespace

int64_t FrequentDirectionsState::bytes() const {
  int64_t total = 0;
  for (const auto& layer : layers) {
    for (const auto* t : {&layer.window_k, &layer.window_v, &layer.sketch, &layer.sum_k, &layer.mass,
                          &layer.shrink_total, &layer.last_x}) {
      if (t->defined()) total += t->numel() * static_cast<int64_t>(t->element_size());
    }
  }
  return total;
}

FrequentDirectionsSpineImpl::FrequentDirectionsSpineImpl(const FrequentDirectionsOptions& options)
    : options_(options) {
  SpineOptions sizes;
  sizes.vocab = options_.vocab;
  sizes.d_model = options_.d_model;
  sizes.n_layer = options_.n_layer;
  sizes.n_head = options_.n_head;
  sizes.window = options_.window;
  validate_spine_options(sizes, "FrequentDirectionsSpine");
  if (options_.sketch_rows < 4 || options_.sketch_rows % 2 != 0) {
    throw ValueError("FrequentDirectionsSpine: sketch_rows must be an even integer >= 4 (got " +
                     str(options_.sketch_rows) + ")");
  }
  backbone_ = register_module("backbone", SpineBackbone(options_.vocab, options_.d_model, options_.n_layer));
  shifts_ = register_token_shifts(*this, options_.d_model, options_.n_layer);
}

FrequentDirectionsState FrequentDirectionsSpineImpl::init_state(int64_t batch_size, torch::Device device) const {
  if (batch_size <= 0) {
    throw ValueError("FrequentDirectionsSpine.init_state: batch_size must be a positive integer (got " +
                     str(batch_size) + ")");
  }
  const int64_t H = options_.n_head, hd = head_dim();
  const auto sums = torch::TensorOptions().dtype(torch::kDouble).device(device);
  const auto rows = torch::TensorOptions().dtype(backbone_->tok->weight.scalar_type()).device(device);
  FrequentDirectionsState state;
  state.batch_size = batch_size;
  for (int64_t l = 0; l < options_.n_layer; ++l) {
    FrequentDirectionsLayerState layer;
    layer.window_k = torch::zeros({batch_size, H, 0, hd}, rows);
    layer.window_v = torch::zeros({batch_size, H, 0, hd}, rows);
    layer.sketch = torch::zeros({batch_size, H, options_.sketch_rows, 2 * hd}, sums);
    layer.sum_k = torch::zeros({batch_size, H, hd}, sums);
    layer.mass = torch::zeros({batch_size, H}, sums);
    layer.shrink_total = torch::zeros({batch_size, H}, sums);
    layer.last_x = torch::zeros({batch_size, options_.d_model}, rows);
    state.layers.push_back(std::move(layer));
  }
  return state;
}

std::pair<int64_t, int64_t> FrequentDirectionsSpineImpl::schedule(int64_t pos) const {
  return sketch_schedule(pos - std::min(pos, options_.window), options_.sketch_rows, 2 * head_dim());
}

void FrequentDirectionsSpineImpl::check_state(const FrequentDirectionsState& s, int64_t b, const char* where) const {
  const std::string w(where);
  detail::check_state_frame(s.batch_size, s.pos, static_cast<int64_t>(s.layers.size()), b, options_.n_layer, w);
  const auto fits = &detail::tensor_fits;
  const int64_t H = options_.n_head, hd = head_dim(), held = std::min(s.pos, options_.window);
  const auto [filled, shrinks] = schedule(s.pos);
  const auto dtype = backbone_->tok->weight.scalar_type();
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const auto& layer = s.layers[l];
    const std::string name = w + ": layer " + str(static_cast<int64_t>(l)) + " of the state";
    if (!fits(layer.window_k, {b, H, held, hd}, dtype) || !fits(layer.window_v, {b, H, held, hd}, dtype)) {
      throw ValueError(name + " must hold window_k and window_v (batch " + str(b) + ", n_head " + str(H) +
                       ", min(pos, window) = " + str(held) + ", head_dim " + str(hd) + ") in the parameters' dtype");
    }
    if (!fits(layer.sketch, {b, H, options_.sketch_rows, 2 * hd}, torch::kDouble) ||
        !fits(layer.sum_k, {b, H, hd}, torch::kDouble) || !fits(layer.mass, {b, H}, torch::kDouble) ||
        !fits(layer.shrink_total, {b, H}, torch::kDouble) || !fits(layer.last_x, {b, options_.d_model}, dtype)) {
      throw ValueError(name + " must hold sketch (batch, n_head, sketch_rows " + str(options_.sketch_rows) +
                       ", 2 head_dim), sum_k (batch, n_head, head_dim), mass and shrink_total (batch, n_head) in " +
                       "float64 and last_x (batch, d_model) in the parameters' dtype");
    }
    if (layer.filled != filled || layer.shrinks != shrinks) {
      throw ValueError(name + " has " + str(layer.filled) + " sketch rows filled after " + str(layer.shrinks) +
                       " shrinks; " + str(s.pos - held) + " evicted tokens give " + str(filled) + " after " +
                       str(shrinks));
    }
  }
}

FrequentDirectionsOutput FrequentDirectionsSpineImpl::advance(const FrequentDirectionsState& state,
                                                              const torch::Tensor& x) {
  validate_tokens(x, options_.vocab, "FrequentDirectionsSpine.advance");
  return advance_checked(state, x);
}

FrequentDirectionsOutput FrequentDirectionsSpineImpl::advance_checked(const FrequentDirectionsState& state,
                                                                      const torch::Tensor& x) {
  check_state(state, x.size(0), "FrequentDirectionsSpine.step");
  auto [next, logits] = detail::advance_layers(
      *backbone_, state, x, [&](size_t l, SpineLayerImpl& layer, const torch::Tensor& h, const auto& layer_state) {
        auto attn = sublayer(*layer.qkv, *layer.proj, *shifts_[l], h, layer_state, options_.n_head, options_.window);
        return std::pair{std::move(attn.out), std::move(attn.state)};
      });
  return {std::move(next), std::move(logits)};
}

MechanismStep<FrequentDirectionsState> FrequentDirectionsSpineImpl::step(const FrequentDirectionsState& state,
                                                                          const torch::Tensor& x,
                                                                          const torch::Tensor& y) {
  validate_chunk(x, y, options_.vocab, "FrequentDirectionsSpine.step");
  auto out = advance_checked(state, x);
  return {std::move(out.state), mean_cross_entropy(out.logits, y)};
}

FrequentDirectionsState FrequentDirectionsSpineImpl::detach(const FrequentDirectionsState& state) const {
  FrequentDirectionsState out = state;
  for (auto& layer : out.layers) {
    for (auto* t : {&layer.window_k, &layer.window_v, &layer.sketch, &layer.sum_k, &layer.mass, &layer.shrink_total,
                    &layer.last_x}) {
      *t = t->detach();
    }
  }
  return out;
}

std::vector<FrequentDirectionsReceipt> FrequentDirectionsSpineImpl::receipts(
    const FrequentDirectionsState& state) const {
  check_state(state, state.batch_size, "FrequentDirectionsSpine.receipts");
  torch::NoGradGuard no_grad;
  std::vector<FrequentDirectionsReceipt> out;
  for (const auto& layer : state.layers) {
    FrequentDirectionsReceipt r;
    r.window = layer.window_k.size(2);
    r.evicted = state.pos - r.window;
    r.filled = layer.filled;
    r.shrinks = layer.shrinks;
    r.mass = layer.mass;
    r.kept = layer.sketch.square().sum({2, 3});
    r.shrink_total = layer.shrink_total;
    r.bound = (r.mass - r.kept) / static_cast<double>(options_.sketch_rows / 2);
    r.bound_holds = r.shrink_total.le(r.bound + kBoundTolerance * r.mass).all().item<bool>();
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace attnmix::stream
