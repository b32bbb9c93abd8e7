// SPDX-License-Identifier: Apache-2.0
// The attention sublayer of the streaming models; see include/attnmix/stream/self_attention.hpp.
//
// SlidingWindowSpine and MomentClosureAttention run their layers' attention through window_sublayer and
// moment_closure_sublayer, and so do the modules below: one implementation, one order of operations.
#include "attnmix/stream/self_attention.hpp"

#include "attnmix/core/errors.hpp"
#include "attnmix/core/sizes.hpp"
#include "attnmix/stream/rope.hpp"
#include "dense_products_impl.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace attnmix::stream {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

// The additive attention mask (t, L): 0 where visible, −∞ elsewhere, in dtype.
torch::Tensor additive_mask(const torch::Tensor& visible, torch::ScalarType dtype) {
  return torch::zeros(visible.sizes(), torch::TensorOptions().dtype(dtype).device(visible.device()))
      .masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
}

// The attention (before proj) of one layer: near tokens only, or near tokens, the bank's live clusters and the
// store's tokens through one softmax. (b, t, d). far_share (when given) receives the mean softmax weight on the
// clusters and stored tokens over streams, heads and queries (0 when there are none).
torch::Tensor attend(const NearField& f, const ClusterBank* bank, const OutlierStore* store,
                     double* far_share = nullptr) {
  const int64_t b = f.q.size(0), t = f.q.size(1), d = f.q.size(2) * f.q.size(3);
  const int64_t length = f.k_full.size(1);
  const auto values = f.v_full.transpose(1, 2);  // (b, H, L, hd)
  const bool far = bank != nullptr && std::any_of(bank->n_clusters.begin(), bank->n_clusters.end(),
                                                  [](int64_t n) { return n > 0; });
  const bool kept = store != nullptr && std::any_of(store->owner.begin(), store->owner.end(),
                                                    [](int64_t c) { return c >= 0; });
  if (!far && !kept) {
    return detail::fast_bmm(torch::softmax(f.scores, -1), values, false).transpose(1, 2).reshape({b, t, d});
  }
  std::vector<torch::Tensor> logits = {f.scores};
  std::vector<int64_t> sizes = {length};
  ClusterAttention clusters;
  if (far) {
    clusters = mgf_cluster_attention(f.q, *bank);  // out (b,t,n,H,hd), logits (b,t,n,H)
    logits.push_back(clusters.logits.permute({0, 3, 1, 2}));
    sizes.push_back(clusters.logits.size(2));
  }
  OutlierAttention stored;
  if (kept) {
    stored = outlier_attention(f.q, *store);  // logits (b,t,S,H), values (b,S,H,hd)
    logits.push_back(stored.logits.permute({0, 3, 1, 2}));
    sizes.push_back(stored.logits.size(2));
  }
  const auto weights = torch::softmax(torch::cat(logits, -1), -1);
  const auto parts = weights.split_with_sizes(sizes, -1);  // one backward node for every part
  if (far_share != nullptr) {
    const torch::NoGradGuard no_grad;
    auto far_weight = parts[1].sum(-1, /*keepdim=*/false, torch::kFloat64);
    for (size_t p = 2; p < parts.size(); ++p) far_weight += parts[p].sum(-1, false, torch::kFloat64);
    *far_share = far_weight.mean().item<double>();
  }
  auto out = detail::fast_bmm(parts[0], values, false);  // (b, H, t, hd)
  if (far) {
    out = out + detail::fast_bmm(parts[1].unsqueeze(-2), clusters.out.permute({0, 3, 1, 2, 4}), false).squeeze(-2);
  }
  if (kept) {
    out = out + detail::fast_bmm(parts.back(), stored.values.transpose(1, 2), false);
  }
  return out.transpose(1, 2).reshape({b, t, d});
}

// proj(attention) and the new cache: the part both sublayers share.
SublayerStep project_and_keep(torch::nn::LinearImpl& proj, const NearField& f, const torch::Tensor& attended,
                              const NearFieldGeometry& g) {
  const int64_t length = f.k_full.size(1);
  SublayerStep step;
  step.out = detail::fast_linear(attended, proj.weight, proj.bias);
  step.cache_k = f.k_full.narrow(1, length - g.keep, g.keep);
  step.cache_v = f.v_full.narrow(1, length - g.keep, g.keep);
  return step;
}

// ---- boundary checks of the modules ---------------------------------------------------------------------------

void require_positive(const std::string& where, const char* name, int64_t value) {
  if (value <= 0) {
    throw ValueError(where + ": " + name + " must be a positive integer (got " + str(value) + ")");
  }
}

void validate_sizes(const std::string& where, int64_t d_model, int64_t n_head, std::optional<int64_t> window) {
  require_positive(where, "d_model", d_model);
  require_positive(where, "n_head", n_head);
  if (window) {
    require_positive(where, "window", *window);
  }
  if (d_model % n_head != 0) {
    throw ValueError(where + ": d_model (" + str(d_model) + ") must be divisible by n_head (" + str(n_head) + ")");
  }
  if ((d_model / n_head) % 2 != 0) {
    throw ValueError(where + ": head_dim = d_model / n_head (" + str(d_model / n_head) + ") must be even for RoPE");
  }
  static_cast<void>(checked_product(where, "the layer weights (4 x d_model x d_model)", {4, d_model, d_model}));
}

std::string dtype_name(const torch::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

// h: (b, t, d_model) with b, t ≥ 1, in the parameters' dtype and on their device.
void check_input(const torch::Tensor& h, const torch::Tensor& weight, int64_t d_model, const std::string& where) {
  if (!h.defined() || h.dim() != 3 || h.size(0) <= 0 || h.size(1) <= 0 || h.size(2) != d_model) {
    std::string shape = "undefined";
    if (h.defined()) {
      shape = "(";
      for (int64_t i = 0; i < h.dim(); ++i) shape += (i ? ", " : "") + str(h.size(i));
      shape += ")";
    }
    throw ValueError(where + ": h must be (batch, time, d_model " + str(d_model) +
                     ") with batch and time at least 1 (got " + shape + ")");
  }
  if (h.scalar_type() != weight.scalar_type() || h.device() != weight.device()) {
    throw ValueError(where + ": h must have the parameters' dtype " + dtype_name(weight) + " and device " +
                     weight.device().str() + " (got " + dtype_name(h) + " on " + h.device().str() + ")");
  }
}

// A layer state that fits the chunk h: its batch size, and a cache of the last min(window, pos) raw rows (both or
// neither of k and v), of h's dtype and device. Returns the cache length.
int64_t check_window_state(const WindowLayerState& s, const torch::Tensor& h, int64_t n_head, int64_t head_dim,
                           std::optional<int64_t> window, const std::string& where) {
  const int64_t b = h.size(0);
  if (s.batch_size != b) {
    throw ValueError(where + ": the chunk's batch size " + str(b) + " does not match the state's batch size " +
                     str(s.batch_size));
  }
  if (s.pos < 0) {
    throw ValueError(where + ": the state's pos must be >= 0 (got " + str(s.pos) + ")");
  }
  if (s.cache_k.defined() != s.cache_v.defined()) {
    throw ValueError(where + ": the state's cache_k and cache_v must both be present or both absent");
  }
  const int64_t expected = window ? std::min(*window, s.pos) : s.pos;
  const int64_t cache_len = s.cache_k.defined() ? s.cache_k.size(1) : 0;
  if (s.cache_k.defined()) {
    for (const auto* c : {&s.cache_k, &s.cache_v}) {
      if (c->dim() != 4 || c->size(0) != b || c->size(1) != cache_len || c->size(2) != n_head ||
          c->size(3) != head_dim) {
        throw ValueError(where + ": the state's cache_k and cache_v must both be (batch " + str(b) +
                         ", length, n_head " + str(n_head) + ", head_dim " + str(head_dim) + ")");
      }
      if (c->scalar_type() != h.scalar_type() || c->device() != h.device()) {
        throw ValueError(where + ": the state's cache must have h's dtype " + dtype_name(h) + " (got " +
                         dtype_name(*c) + ")");
      }
    }
  }
  if (cache_len != expected) {
    throw ValueError(where + ": the state's cache holds " + str(cache_len) + " tokens, but a state at position " +
                     str(s.pos) + " holds the last " + str(expected));
  }
  return cache_len;
}

}  // namespace

// ---- the shared pieces -----------------------------------------------------------------------------------------

NearFieldGeometry near_field_geometry(int64_t pos, int64_t t, int64_t cache_len, int64_t head_dim,
                                      std::optional<int64_t> window, torch::ScalarType dtype, torch::Device device) {
  const auto long_options = torch::TensorOptions().dtype(torch::kLong).device(device);
  const auto query_positions = torch::arange(pos, pos + t, long_options);
  const auto key_positions = torch::arange(pos - cache_len, pos + t, long_options);
  NearFieldGeometry g;
  g.pos = pos;
  g.t = t;
  g.cache_len = cache_len;
  g.keep = window ? std::min(*window, cache_len + t) : cache_len + t;
  g.rope_q = rope_tables(query_positions, head_dim, dtype);
  g.rope_k = cache_len > 0 ? rope_tables(key_positions, head_dim, dtype) : g.rope_q;
  g.mask = additive_mask(window_visibility(query_positions, key_positions, window), dtype);
  g.scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  return g;
}

NearField near_field(torch::nn::LinearImpl& qkv, const torch::Tensor& x, const torch::Tensor& cache_k,
                     const torch::Tensor& cache_v, const NearFieldGeometry& g, int64_t n_head) {
  const int64_t b = x.size(0);
  const int64_t t = x.size(1);
  const int64_t hd = x.size(2) / n_head;
  const auto projected = detail::fast_linear(x, qkv.weight, qkv.bias).view({b, t, 3, n_head, hd});
  NearField f;
  f.q = projected.select(2, 0);
  f.k_full = projected.select(2, 1);
  f.v_full = projected.select(2, 2);
  if (g.cache_len > 0) {
    f.k_full = torch::cat({cache_k, f.k_full}, 1);
    f.v_full = torch::cat({cache_v, f.v_full}, 1);
  }
  const auto q_rot = apply_rope(f.q, g.rope_q).transpose(1, 2);       // (b, H, t, hd)
  const auto k_rot = apply_rope(f.k_full, g.rope_k).transpose(1, 2);  // (b, H, L, hd)
  f.scores = detail::fast_bmm(q_rot, k_rot, /*transpose_b=*/true) * g.scale + g.mask;
  return f;
}

SublayerStep window_sublayer(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& proj, const torch::Tensor& x,
                             const torch::Tensor& cache_k, const torch::Tensor& cache_v, const NearFieldGeometry& g,
                             int64_t n_head) {
  const auto f = near_field(qkv, x, cache_k, cache_v, g, n_head);
  return project_and_keep(proj, f, attend(f, nullptr, nullptr), g);
}

SublayerStep moment_closure_sublayer(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& proj, const torch::Tensor& x,
                                     const torch::Tensor& cache_k, const torch::Tensor& cache_v,
                                     const ClusterBank& bank, const NearFieldGeometry& g, int64_t n_head,
                                     const BirthMergeOptions& ingest, const std::string& label,
                                     const OutlierStore* store) {
  const auto f = near_field(qkv, x, cache_k, cache_v, g, n_head);
  double far_share = 0.0;
  auto step = project_and_keep(proj, f, attend(f, &bank, store, &far_share), g);
  const int64_t evicted = f.k_full.size(1) - g.keep;
  auto update = evict_to_far_field(bank, f.k_full.narrow(1, 0, evicted), f.v_full.narrow(1, 0, evicted), g.pos + g.t,
                                   g.keep, ingest, label);
  if (store != nullptr) {
    auto kept = quantize_cluster_outliers(*store, update.receipt.streams, update.bank.n_clusters,
                                          f.k_full.narrow(1, 0, evicted), f.v_full.narrow(1, 0, evicted));
    for (size_t b = 0; b < update.receipt.streams.size(); ++b) {
      auto& accounting = update.receipt.streams[b].accounting;
      if (accounting) accounting->overlap_tokens = kept.store.held(static_cast<int64_t>(b));
    }
    step.store = std::move(kept.store);
    update.receipt.outliers = kept.receipt;
  }
  step.bank = std::move(update.bank);
  update.receipt.far_attention_share = far_share;
  step.receipt = std::move(update.receipt);
  return step;
}

// ---- states ----------------------------------------------------------------------------------------------------

int64_t WindowLayerState::bytes() const {
  int64_t total = 0;
  for (const auto* c : {&cache_k, &cache_v}) {
    if (c->defined()) {
      total += c->numel() * static_cast<int64_t>(c->element_size());
    }
  }
  return total;
}

WindowLayerState WindowLayerState::detach() const {
  WindowLayerState out = *this;
  for (auto* c : {&out.cache_k, &out.cache_v}) {
    if (c->defined()) {
      *c = c->detach();
    }
  }
  return out;
}

int64_t MomentClosureLayerState::bytes() const { return near.bytes() + bank.bytes(); }

MomentClosureLayerState MomentClosureLayerState::detach() const { return {near.detach(), bank.detach()}; }

// ---- SlidingWindowSelfAttention --------------------------------------------------------------------------------

SlidingWindowSelfAttentionImpl::SlidingWindowSelfAttentionImpl(const SlidingWindowSelfAttentionOptions& options)
    : options_(options) {
  validate_sizes("SlidingWindowSelfAttention", options_.d_model, options_.n_head, options_.window);
  qkv = register_module("qkv", torch::nn::Linear(options_.d_model, 3 * options_.d_model));
  proj = register_module("proj", torch::nn::Linear(options_.d_model, options_.d_model));
}

WindowLayerState SlidingWindowSelfAttentionImpl::init_state(int64_t batch_size) const {
  require_positive("SlidingWindowSelfAttention.init_state", "batch_size", batch_size);
  WindowLayerState state;
  state.batch_size = batch_size;
  return state;
}

SlidingWindowSelfAttentionOutput SlidingWindowSelfAttentionImpl::forward(const torch::Tensor& h,
                                                                         const std::optional<WindowLayerState>& state) {
  const std::string where = "SlidingWindowSelfAttention.forward";
  check_input(h, qkv->weight, options_.d_model, where);
  const WindowLayerState s = state ? *state : init_state(h.size(0));
  const int64_t cache_len = check_window_state(s, h, options_.n_head, head_dim(), options_.window, where);
  const auto g =
      near_field_geometry(s.pos, h.size(1), cache_len, head_dim(), options_.window, h.scalar_type(), h.device());
  auto step = window_sublayer(*qkv, *proj, h, s.cache_k, s.cache_v, g, options_.n_head);
  SlidingWindowSelfAttentionOutput out;
  out.out = std::move(step.out);
  out.state.cache_k = std::move(step.cache_k);
  out.state.cache_v = std::move(step.cache_v);
  out.state.pos = s.pos + h.size(1);
  out.state.batch_size = s.batch_size;
  return out;
}

// ---- MomentClosureSelfAttention --------------------------------------------------------------------------------

MomentClosureSelfAttentionImpl::MomentClosureSelfAttentionImpl(const MomentClosureSelfAttentionOptions& options)
    : options_(options) {
  const std::string where = "MomentClosureSelfAttention";
  validate_sizes(where, options_.d_model, options_.n_head, options_.window);
  require_positive(where, "max_clusters", options_.max_clusters);
  if (!std::isfinite(options_.birth_threshold)) {
    throw ValueError(where + ": birth_threshold must be finite");
  }
  if (options_.merge_threshold && !std::isfinite(*options_.merge_threshold)) {
    throw ValueError(where + ": merge_threshold must be finite when given");
  }
  ingest_.birth_threshold = options_.birth_threshold;
  ingest_.merge_threshold = options_.merge_threshold;
  ingest_.cluster_rule = options_.cluster_rule;
  qkv = register_module("qkv", torch::nn::Linear(options_.d_model, 3 * options_.d_model));
  proj = register_module("proj", torch::nn::Linear(options_.d_model, options_.d_model));
}

MomentClosureLayerState MomentClosureSelfAttentionImpl::init_state(int64_t batch_size) const {
  require_positive("MomentClosureSelfAttention.init_state", "batch_size", batch_size);
  MomentClosureLayerState state;
  state.near.batch_size = batch_size;
  state.bank = empty_cluster_bank(batch_size, options_.n_head, options_.max_clusters, head_dim(),
                                  torch::TensorOptions().dtype(qkv->weight.scalar_type()).device(qkv->weight.device()));
  return state;
}

MomentClosureSelfAttentionOutput MomentClosureSelfAttentionImpl::forward(
    const torch::Tensor& h, const std::optional<MomentClosureLayerState>& state) {
  const std::string where = "MomentClosureSelfAttention.forward";
  check_input(h, qkv->weight, options_.d_model, where);
  const MomentClosureLayerState s = state ? *state : init_state(h.size(0));
  const int64_t cache_len = check_window_state(s.near, h, options_.n_head, head_dim(), options_.window, where);
  const auto& bank = s.bank;
  if (!bank.count.defined() || !bank.mu_k.defined() || bank.mu_k.dim() != 4 || bank.batch_size() != h.size(0) ||
      bank.max_clusters != options_.max_clusters || bank.mu_k.size(1) != options_.n_head ||
      bank.mu_k.size(3) != head_dim()) {
    throw ValueError(where + ": the state's cluster bank must have batch size " + str(h.size(0)) + ", n_head " +
                     str(options_.n_head) + ", max_clusters " + str(options_.max_clusters) + " and head_dim " +
                     str(head_dim()));
  }
  if (bank.count.scalar_type() != h.scalar_type() || bank.count.device() != h.device()) {
    throw ValueError(where + ": the state's cluster bank must have h's dtype " + dtype_name(h) + " (got " +
                     dtype_name(bank.count) + ")");
  }
  check_far_field_accounting(bank, s.near.pos, cache_len, where);
  const auto g =
      near_field_geometry(s.near.pos, h.size(1), cache_len, head_dim(), options_.window, h.scalar_type(), h.device());
  auto step = moment_closure_sublayer(*qkv, *proj, h, s.near.cache_k, s.near.cache_v, bank, g, options_.n_head,
                                      ingest_, where);
  MomentClosureSelfAttentionOutput out;
  out.out = std::move(step.out);
  out.state.near.cache_k = std::move(step.cache_k);
  out.state.near.cache_v = std::move(step.cache_v);
  out.state.near.pos = s.near.pos + h.size(1);
  out.state.near.batch_size = s.near.batch_size;
  out.state.bank = std::move(*step.bank);
  out.receipt = std::move(*step.receipt);
  return out;
}

}  // namespace attnmix::stream
