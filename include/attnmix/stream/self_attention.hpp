// SPDX-License-Identifier: Apache-2.0
/// @file self_attention.hpp
/// The attention sublayer of the streaming models on its own: the one implementation of the attention math that
/// SlidingWindowSpine and MomentClosureAttention run in every layer, and two torch modules that put it in any
/// architecture, mapping (h, layer state) → (out, layer state).
///
/// For a chunk x (b, t, d) of normalised inputs at absolute positions pos … pos+t−1, a raw cache of c tokens and
/// h_d = d / H:
///   q, k, v = split(x Wᵀ + b)                                 W = qkv.weight (3d, d), each (b, t, H, h_d)
///   K = cache_k ++ k,  V = cache_v ++ v                       key positions pos−c … pos+t−1 (raw, un-rotated)
///   near_ij = RoPE(q_i, P_i) · RoPE(K_j, P_j) / √h_d + M_ij,  M_ij = 0 iff 0 ≤ P_i − P_j < window, else −∞
///   far_ic  = logit_c(q_i)  (un-rotated query; moment closure only, for each live cluster c of the stream)
///   kept_is = q_i · k̂_s / √h_d  (moment closure with an outlier store: each stored token s, kv_quantization.hpp)
///   w_i     = softmax([near_i ; far_i ; kept_i])              one joint softmax over tokens and clusters
///   out_i   = proj(Σ_j w_ij V_j + Σ_c w_ic out_c(q_i) + Σ_s w_is v̂_s)        proj = Linear(d, d)
/// with the MGF cluster logits and outputs of moment_closure.hpp. After the chunk the cache keeps the last
/// keep = min(window, c+t) raw rows (all of them for an unbounded window); moment closure ingests the c+t−keep
/// evicted rows into the stream's bank (birth/merge, then the differentiable soft update) and checks that every
/// position seen is represented exactly once, in the window or in the bank.
/// Cost per chunk: O(b·t·d²) for the projections, O(b·H·t·(c+t)·h_d) near and O(b·H·t·C·h_d²) far. State per
/// layer: O(b·window·d) for the cache plus O(b·H·C·h_d²) for the bank, independent of the stream's length (an
/// unbounded window grows with it).
#pragma once

#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/kv_quantization.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "attnmix/stream/rope.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>

namespace attnmix::stream {

// ---- the shared pieces (every layer of a mechanism, and the modules below) ------------------------------------

/// What every layer of one chunk shares: the chunk (pos, t), the cache length c, the rows kept after it
/// (keep = min(window, c+t), or c+t when unbounded), the RoPE tables of the query positions pos … pos+t−1 and of
/// the key positions pos−c … pos+t−1, the additive window mask (t, c+t) and the score scale 1/√h_d.
struct NearFieldGeometry {
  /// The absolute position of the chunk's first token.
  int64_t pos = 0;
  /// t, the chunk's length.
  int64_t t = 0;
  /// c, the cached tokens before the chunk.
  int64_t cache_len = 0;
  /// The raw rows the cache keeps after the chunk: min(window, c+t), or c+t when unbounded.
  int64_t keep = 0;
  /// RoPE tables of the query positions pos … pos+t−1, each (t, h_d).
  RopeTables rope_q;
  /// RoPE tables of the key positions pos−c … pos+t−1, each (c+t, h_d) (rope_q itself when c = 0).
  RopeTables rope_k;
  /// The additive window mask (t, c+t): 0 where 0 ≤ P_i − P_j < window, −∞ elsewhere.
  torch::Tensor mask;
  /// The score scale 1/√h_d.
  double scale = 1.0;
};

/// Builds the geometry of a chunk of t tokens at position pos after a cache of cache_len tokens, with tables and
/// mask in dtype on device (window nullopt: unbounded). Cost O((c+t)·h_d + t·(c+t)). The sizes are not checked:
/// head_dim must be positive and even (rope_tables throws ValueError otherwise).
NearFieldGeometry near_field_geometry(int64_t pos, int64_t t, int64_t cache_len, int64_t head_dim,
                                      std::optional<int64_t> window, torch::ScalarType dtype, torch::Device device);

/// One layer's exact near field: the raw query q (b, t, H, h_d), the raw keys and values with the cache prepended
/// (b, c+t, H, h_d), and the masked scores RoPE(q)·RoPE(K)ᵀ/√h_d + M (b, H, t, c+t).
struct NearField {
  torch::Tensor q;       ///< the chunk's raw (un-rotated) queries, (b, t, H, h_d)
  torch::Tensor k_full;  ///< the raw keys, cache first: (b, c+t, H, h_d)
  torch::Tensor v_full;  ///< the values, cache first: (b, c+t, H, h_d)
  torch::Tensor scores;  ///< the masked near-field logits, (b, H, t, c+t)
};

/// The near field of one layer for a chunk.
/// @param qkv the layer's joint q, k, v projection (d → 3d)
/// @param x the normalised input (b, t, d)
/// @param cache_k the layer's raw key cache (b, c, H, h_d), undefined when empty
/// @param cache_v the layer's raw value cache, shaped as cache_k
/// @param geometry the chunk's positions, RoPE tables and mask (near_field_geometry)
/// @param n_head the number of heads H
NearField near_field(torch::nn::LinearImpl& qkv, const torch::Tensor& x, const torch::Tensor& cache_k,
                     const torch::Tensor& cache_v, const NearFieldGeometry& geometry, int64_t n_head);

/// What one layer's attention sublayer did with a chunk.
struct SublayerStep {
  torch::Tensor out;      ///< proj(attention), (b, t, d)
  torch::Tensor cache_k;  ///< the new raw cache, (b, keep, H, h_d)
  torch::Tensor cache_v;  ///< the new value cache, (b, keep, H, h_d)
  std::optional<ClusterBank> bank;      ///< moment closure: the bank after the evicted rows joined it
  std::optional<LayerReceipt> receipt;  ///< moment closure: what ingestion did, with the accounting per stream
  std::optional<OutlierStore> store;    ///< moment closure with a store: the store after the outliers joined it
};

/// The sliding-window sublayer (near field only) on a chunk; the inputs are trusted (the callers check them).
SublayerStep window_sublayer(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& proj, const torch::Tensor& x,
                             const torch::Tensor& cache_k, const torch::Tensor& cache_v,
                             const NearFieldGeometry& geometry, int64_t n_head);

/// The moment-closure sublayer on a chunk: near field, the far field of `bank` and the tokens of `store` (if given;
/// both as they were at the start of the chunk) through one joint softmax, then the eviction of the rows leaving
/// the cache into the bank (evict_to_far_field) and of the ingestion's outliers into the store
/// (quantize_cluster_outliers; each stream's accounting reports the stored copies as overlap tokens). `label`
/// names the layer in accounting errors.
/// @throws StateError ("one-token/one-representation") when the accounting fails; what ingest_cluster_batch throws.
SublayerStep moment_closure_sublayer(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& proj, const torch::Tensor& x,
                                     const torch::Tensor& cache_k, const torch::Tensor& cache_v,
                                     const ClusterBank& bank, const NearFieldGeometry& geometry, int64_t n_head,
                                     const BirthMergeOptions& ingest, const std::string& label,
                                     const OutlierStore* store = nullptr);

// ---- the modules ----------------------------------------------------------------------------------------------

/// Sizes of SlidingWindowSelfAttention: d_model % n_head == 0, an even head_dim, a positive window (nullopt:
/// unbounded, full causal attention, whose cache grows with the stream).
struct SlidingWindowSelfAttentionOptions {
  int64_t d_model = 32;                ///< d, the width of the input and the output (a multiple of n_head)
  int64_t n_head = 2;                  ///< H, heads; h_d = d_model / n_head must be even
  std::optional<int64_t> window = 64;  ///< tokens a query sees, itself included; nullopt: every earlier token
};

/// Sizes and far-field settings of MomentClosureSelfAttention (those of MomentClosureAttention's layers).
struct MomentClosureSelfAttentionOptions {
  int64_t d_model = 32;       ///< d, the width of the input and the output (a multiple of n_head)
  int64_t n_head = 2;         ///< H, heads; h_d = d_model / n_head must be even
  int64_t window = 16;        ///< the exact near field: tokens a query sees, itself included (positive)
  int64_t max_clusters = 4;   ///< C, clusters per stream and head (positive)
  double birth_threshold = -2.0;  ///< a chunk whose best cluster logit lies below this on every head births (finite)
  std::optional<double> merge_threshold;  ///< default 2.65 + 6/√max(n_small, 1)
  ClusterRule cluster_rule = ClusterRule::kThreshold;  ///< births and merges by thresholds or by the budget
};

/// One layer's carried near state: the raw keys and values of the last min(window, pos) tokens (b, c, H, h_d),
/// undefined while empty; pos = the absolute position of the next token.
struct WindowLayerState {
  torch::Tensor cache_k;   ///< raw (un-rotated) keys of the cached tokens, (b, c, H, h_d); undefined while empty
  torch::Tensor cache_v;   ///< values of the cached tokens, (b, c, H, h_d); undefined while empty
  int64_t pos = 0;         ///< the absolute position of the next token: the tokens seen so far
  int64_t batch_size = 0;  ///< b, the number of streams

  /// Bytes held by the two caches.
  int64_t bytes() const;
  /// The same state with the caches cut from the autograd graph.
  WindowLayerState detach() const;
};

/// One moment-closure layer's carried state: the window and the bank of the tokens evicted from it (per stream,
/// exactly pos − c tokens per head).
struct MomentClosureLayerState {
  WindowLayerState near;  ///< the exact window
  ClusterBank bank;       ///< the far field: per stream and head the clusters of the tokens evicted from the window

  /// Bytes held by the cache and the bank.
  int64_t bytes() const;
  /// Stop-gradient on the cache and the bank.
  MomentClosureLayerState detach() const;
};

/// What SlidingWindowSelfAttention::forward returns.
struct SlidingWindowSelfAttentionOutput {
  torch::Tensor out;  ///< (b, t, d_model)
  WindowLayerState state;  ///< the state after the chunk, for the next call
};

/// What MomentClosureSelfAttention::forward returns.
struct MomentClosureSelfAttentionOutput {
  torch::Tensor out;  ///< (b, t, d_model)
  MomentClosureLayerState state;  ///< the state after the chunk (evicted rows ingested), for the next call
  LayerReceipt receipt;  ///< per stream: ingestion and accounting
};

/// The sliding-window attention sublayer as a module: parameters qkv = Linear(d, 3d) and proj = Linear(d, d)
/// (registered in that order; libtorch's default initialisation). Differentiable in h, the parameters and the
/// carried cache.
class SlidingWindowSelfAttentionImpl : public torch::nn::Module {
 public:
  /// @throws ValueError for invalid sizes.
  explicit SlidingWindowSelfAttentionImpl(const SlidingWindowSelfAttentionOptions& options);

  /// An empty state of batch_size streams. @throws ValueError unless batch_size is positive.
  WindowLayerState init_state(int64_t batch_size) const;
  /// Attention of the chunk h (b, t, d_model), which has the parameters' dtype and device, given the state of
  /// the stream before it (nullopt: an empty state of b streams).
  /// @throws ValueError for a bad h or a state that does not fit it ("batch size", "cache").
  SlidingWindowSelfAttentionOutput forward(const torch::Tensor& h,
                                           const std::optional<WindowLayerState>& state = std::nullopt);
  /// Stop-gradient on the carried cache (state.detach()).
  WindowLayerState detach(const WindowLayerState& state) const { return state.detach(); }

  /// The sizes the module was built with.
  const SlidingWindowSelfAttentionOptions& options() const { return options_; }
  /// h_d = d_model / n_head.
  int64_t head_dim() const { return options_.d_model / options_.n_head; }

  /// Linear(d, 3d): the queries, keys and values, each split head-major into (H, h_d).
  torch::nn::Linear qkv{nullptr};
  /// Linear(d, d): the projection of the attended values.
  torch::nn::Linear proj{nullptr};

 private:
  SlidingWindowSelfAttentionOptions options_;
};
/// SlidingWindowSelfAttention, the module holder of SlidingWindowSelfAttentionImpl (libtorch's TORCH_MODULE).
TORCH_MODULE(SlidingWindowSelfAttention);

/// The moment-closure attention sublayer as a module: the window of SlidingWindowSelfAttention plus a bank of at
/// most max_clusters Gaussian clusters per stream and head over the evicted tokens, attended through the same
/// softmax. Parameters as SlidingWindowSelfAttention. Gradients reach h, the parameters, the cache and the bank
/// through the soft-update path; birth and merge decisions and birth statistics carry none.
class MomentClosureSelfAttentionImpl : public torch::nn::Module {
 public:
  /// @throws ValueError for invalid sizes or a non-finite threshold.
  explicit MomentClosureSelfAttentionImpl(const MomentClosureSelfAttentionOptions& options);

  /// An empty state (empty cache, empty banks) of batch_size streams in the parameters' dtype.
  /// @throws ValueError unless batch_size is positive.
  MomentClosureLayerState init_state(int64_t batch_size) const;
  /// As SlidingWindowSelfAttention::forward; the receipt says what ingestion did.
  /// @throws ValueError for a bad h or a state that does not fit; StateError ("one-token/one-representation") when
  ///   the bank does not hold exactly the evicted tokens.
  MomentClosureSelfAttentionOutput forward(const torch::Tensor& h,
                                           const std::optional<MomentClosureLayerState>& state = std::nullopt);
  /// Stop-gradient on the carried cache and bank (state.detach()).
  MomentClosureLayerState detach(const MomentClosureLayerState& state) const { return state.detach(); }

  /// The sizes and far-field settings the module was built with.
  const MomentClosureSelfAttentionOptions& options() const { return options_; }
  /// h_d = d_model / n_head.
  int64_t head_dim() const { return options_.d_model / options_.n_head; }

  /// Linear(d, 3d): the queries, keys and values, each split head-major into (H, h_d).
  torch::nn::Linear qkv{nullptr};
  /// Linear(d, d): the projection of the attended values and cluster outputs.
  torch::nn::Linear proj{nullptr};

 private:
  MomentClosureSelfAttentionOptions options_;
  BirthMergeOptions ingest_;
};
/// MomentClosureSelfAttention, the module holder of MomentClosureSelfAttentionImpl (libtorch's TORCH_MODULE).
TORCH_MODULE(MomentClosureSelfAttention);

}  // namespace attnmix::stream
