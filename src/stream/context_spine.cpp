// SPDX-License-Identifier: Apache-2.0
// The sliding-window spine (docs/mechanisms.md#streaming-language-model); see include/attnmix/stream/context_spine.hpp.
#include "attnmix/stream/context_spine.hpp"

#include "attnmix/core/errors.hpp"
#include "attnmix/core/sizes.hpp"
#include "attnmix/stream/self_attention.hpp"
#include "dense_products_impl.hpp"

#include <cmath>
#include <string>

namespace attnmix::stream {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

void require_positive(const char* where, const char* name, int64_t value) {
  if (value <= 0) {
    throw ValueError(std::string(where) + ": " + name + " must be a positive integer (got " + str(value) + ")");
  }
}

}  // namespace

void validate_spine_options(const SpineOptions& o, const char* where) {
  require_positive(where, "vocab", o.vocab);
  require_positive(where, "d_model", o.d_model);
  require_positive(where, "n_layer", o.n_layer);
  require_positive(where, "n_head", o.n_head);
  if (o.window) {
    require_positive(where, "window", *o.window);
  }
  if (o.d_model % o.n_head != 0) {
    throw ValueError(std::string(where) + ": d_model (" + str(o.d_model) + ") must be divisible by n_head (" +
                     str(o.n_head) + ")");
  }
  if ((o.d_model / o.n_head) % 2 != 0) {
    throw ValueError(std::string(where) + ": head_dim = d_model / n_head (" + str(o.d_model / o.n_head) +
                     ") must be even for RoPE");
  }
  // The parameters must have a size that can exist (a layer holds about 12 d_model² weights).
  static_cast<void>(checked_product(where, "the token embedding (vocab x d_model)", {o.vocab, o.d_model}));
  static_cast<void>(
      checked_product(where, "the layer weights (n_layer x 12 x d_model x d_model)", {o.n_layer, 12, o.d_model, o.d_model}));
  if (o.cp_size != 1) {
    throw ValueError(std::string(where) + ": cp_size must be 1 (context parallelism is not supported; got " +
                     str(o.cp_size) + ")");
  }
}

int64_t SlidingWindowState::bytes() const {
  int64_t total = 0;
  for (const auto* caches : {&cache_k, &cache_v}) {
    for (const auto& c : *caches) {
      if (c.defined()) {
        total += c.numel() * static_cast<int64_t>(c.element_size());
      }
    }
  }
  return total;
}

torch::Tensor window_visibility(const torch::Tensor& query_positions, const torch::Tensor& key_positions,
                                std::optional<int64_t> window) {
  const auto delta = query_positions.unsqueeze(1) - key_positions.unsqueeze(0);  // (t, L)
  auto visible = delta.ge(0);
  if (window) {
    visible = visible.logical_and(delta.lt(*window));
  }
  return visible;
}

void validate_tokens(const torch::Tensor& ids, int64_t vocab, const char* where) {
  const std::string w(where);
  if (!ids.defined() || ids.scalar_type() != torch::kLong || ids.dim() != 2) {
    throw ValueError(w + ": token ids must be a (batch, time) int64 tensor");
  }
  if (ids.size(0) <= 0 || ids.size(1) <= 0) {
    throw ValueError(w + ": a chunk needs batch >= 1 and time >= 1");
  }
  const auto [lo_t, hi_t] = torch::aminmax(ids);
  const auto lo = lo_t.item<int64_t>();
  const auto hi = hi_t.item<int64_t>();
  if (lo < 0 || hi >= vocab) {
    throw ValueError(w + ": token ids must lie in [0, " + str(vocab) + ") (saw " + str(lo < 0 ? lo : hi) + ")");
  }
}

void validate_chunk(const torch::Tensor& x, const torch::Tensor& y, int64_t vocab, const char* where) {
  validate_tokens(x, vocab, where);
  validate_tokens(y, vocab, where);
  if (x.sizes() != y.sizes()) {
    throw ValueError(std::string(where) + ": x and y must have equal shapes");
  }
}

torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

SpineLayerImpl::SpineLayerImpl(int64_t d_model) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model}).eps(1e-5)));
  qkv = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
  proj = register_module("proj", torch::nn::Linear(d_model, d_model));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model}).eps(1e-5)));
  fc1 = register_module("fc1", torch::nn::Linear(d_model, 4 * d_model));
  fc2 = register_module("fc2", torch::nn::Linear(4 * d_model, d_model));
}

torch::Tensor SpineLayerImpl::finish(const torch::Tensor& h, const torch::Tensor& attn) {
  auto out = h + attn;
  const auto hidden = torch::gelu(detail::fast_linear(ln2(out), fc1->weight, fc1->bias));
  return out + detail::fast_linear(hidden, fc2->weight, fc2->bias);
}

SpineBackboneImpl::SpineBackboneImpl(int64_t vocab, int64_t d_model, int64_t n_layer) {
  tok = register_module("tok", torch::nn::Embedding(vocab, d_model));
  for (int64_t l = 0; l < n_layer; ++l) {
    layers.push_back(register_module("layer" + str(l), SpineLayer(d_model)));
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model}).eps(1e-5)));
}

torch::Tensor SpineBackboneImpl::logits(const torch::Tensor& h) {
  return detail::fast_linear(ln_f(h), tok->weight, torch::Tensor());
}

SlidingWindowSpineImpl::SlidingWindowSpineImpl(const SpineOptions& options) : options_(options) {
  validate_spine_options(options_, "SlidingWindowSpine");
  backbone_ = register_module("backbone", SpineBackbone(options_.vocab, options_.d_model, options_.n_layer));
}

SlidingWindowState SlidingWindowSpineImpl::init_state(int64_t batch_size, torch::Device device) const {
  if (batch_size <= 0) {
    throw ValueError("SlidingWindowSpine.init_state: batch_size must be a positive integer (got " + str(batch_size) +
                     ")");
  }
  SlidingWindowState state;
  state.cache_k.resize(static_cast<size_t>(options_.n_layer));
  state.cache_v.resize(static_cast<size_t>(options_.n_layer));
  state.batch_size = batch_size;
  state.n_head = options_.n_head;
  state.head_dim = head_dim();
  state.device = device;
  return state;
}

SpineOutput SlidingWindowSpineImpl::advance(const SlidingWindowState& state, const torch::Tensor& x) {
  validate_tokens(x, options_.vocab, "SlidingWindowSpine.advance");
  return advance_checked(state, x);
}

int64_t checked_cache_length(const SlidingWindowState& state, int64_t b, int64_t n_layer, int64_t n_head,
                             int64_t hd, const char* where) {
  if (b != state.batch_size) {
    throw ValueError(std::string(where) + ": the chunk's batch size " + str(b) +
                     " does not match the state's batch size " + str(state.batch_size));
  }
  if (static_cast<int64_t>(state.cache_k.size()) != n_layer ||
      static_cast<int64_t>(state.cache_v.size()) != n_layer || state.n_head != n_head || state.head_dim != hd) {
    throw ValueError(std::string(where) + ": the state was not made by this model (layers, heads or head_dim differ)");
  }
  const auto& first_cache = state.cache_k[0];
  const int64_t cache_len = first_cache.defined() ? first_cache.size(1) : 0;
  for (int64_t l = 0; l < n_layer; ++l) {
    const auto& ck = state.cache_k[static_cast<size_t>(l)];
    const auto& cv = state.cache_v[static_cast<size_t>(l)];
    const bool ok = ck.defined() == cv.defined() && ck.defined() == (cache_len > 0) &&
                    (!ck.defined() || (ck.sizes() == cv.sizes() && ck.dim() == 4 && ck.size(0) == b &&
                                       ck.size(1) == cache_len && ck.size(2) == n_head && ck.size(3) == hd));
    if (!ok) {
      throw ValueError(std::string(where) + ": layer " + str(l) + " has an invalid key/value cache");
    }
  }
  return cache_len;
}

SpineOutput SlidingWindowSpineImpl::advance_checked(const SlidingWindowState& state, const torch::Tensor& x) {
  const int64_t b = x.size(0);
  const int64_t t = x.size(1);
  const int64_t n_head = options_.n_head;
  const int64_t cache_len = checked_cache_length(state, b, options_.n_layer, n_head, head_dim(),
                                                 "SlidingWindowSpine.step");
  auto h = backbone_->tok(x);
  const auto geometry =
      near_field_geometry(state.pos, t, cache_len, head_dim(), options_.window, h.scalar_type(), x.device());

  SlidingWindowState next = state;
  for (size_t l = 0; l < backbone_->layers.size(); ++l) {
    auto& layer = *backbone_->layers[l];
    auto attn = window_sublayer(*layer.qkv, *layer.proj, layer.ln1(h), state.cache_k[l], state.cache_v[l], geometry,
                                n_head);
    h = layer.finish(h, attn.out);
    next.cache_k[l] = std::move(attn.cache_k);
    next.cache_v[l] = std::move(attn.cache_v);
  }
  next.pos = state.pos + t;
  return {std::move(next), backbone_->logits(h)};
}

MechanismStep<SlidingWindowState> SlidingWindowSpineImpl::step(const SlidingWindowState& state,
                                                                const torch::Tensor& x, const torch::Tensor& y) {
  validate_chunk(x, y, options_.vocab, "SlidingWindowSpine.step");
  auto out = advance_checked(state, x);
  return {std::move(out.state), mean_cross_entropy(out.logits, y)};
}

SlidingWindowState SlidingWindowSpineImpl::detach(const SlidingWindowState& state) const {
  SlidingWindowState out = state;
  for (auto* caches : {&out.cache_k, &out.cache_v}) {
    for (auto& c : *caches) {
      if (c.defined()) {
        c = c.detach();
      }
    }
  }
  return out;
}

}  // namespace attnmix::stream
