// SPDX-License-Identifier: Apache-2.0
/// @file tensor_sketch.hpp
/// TensorSketchSpine: an exact window under the polynomial kernel (φ(q)·φ(k))^p and, for every evicted token, running
/// sums over a tensor sketch of φ(k) (Pham & Pagh 2013) — the polynomial kernel's oblivious bounded memory, the
/// sibling of FrequentDirectionsSpine (frequent_directions.hpp) with a random rather than a data-adapted basis.
///
/// The sketch. For x ∈ ℝ^{h_d}, p Count Sketches C_i(x) = x M_i ∈ ℝ^D (M_i has one ±1 per row: bucket h_i(j), sign
/// s_i(j), drawn once from hash_seed) combined by circular convolution:
///   TS(x) = IFFT( Π_i FFT(C_i(x)) ) ∈ ℝ^D,     E[TS(x)·TS(y)] = (x·y)^p
/// over the draw of the hashes, with variance O(‖x‖^{2p}‖y‖^{2p} / D) for a fixed degree (Pham & Pagh 2013).
/// Cost of one sketch: O(p·D log D).
///
/// The spine. Per layer and head, with φ = elu + 1 and the token shift of linear attention, the token at position i
/// reads the window W_i = {i − w + 1, …, i} exactly and the evicted tokens through the sketch:
///   num_i = Σ_{j∈W_i} (φ(q_i)·φ(k_j))^p v_j + S_iᵀ TS(φ(q_i)),   S_i = Σ_{evicted j} TS(φ(k_j)) v_jᵀ   (D × h_d)
///   den_i = max(Σ_{j∈W_i} (φ(q_i)·φ(k_j))^p + TS(φ(q_i))·Z_i, 0) + ε,  Z_i = Σ_{evicted j} TS(φ(k_j)),  ε = 1e-6
///   out_i = proj(num_i / den_i)
/// S and Z are float64 sums carried from chunk to chunk, so streaming a sequence in chunks equals one pass up to
/// rounding, and everything is differentiable (no straight-through term is needed). The sketch's estimate of the
/// far kernel can be negative; the floor keeps the normaliser positive. With p = 1 and hashes without collisions
/// TS is a signed permutation, TS(x)·TS(y) = x·y, and the spine is LinearAttentionSpine with the same weights.
/// Misfit receipt: for the (query, evicted key) pairs of the last chunk that evicted tokens, Σ |TS(φ(q))·TS(φ(k)) −
/// (φ(q)·φ(k))^p| / Σ (φ(q)·φ(k))^p per stream and head — how well the sketch stands in for the kernel it replaces.
/// Cost per chunk and layer: O(b·t·d²) projections, O(b·H·t·(w+t)·h_d) window, O(b·H·t·(p·D log D + D·h_d)) sketch;
/// state per layer b·H·(2·w·h_d + D·(h_d + 1) + 1) + b·d numbers, independent of the stream's length.
#pragma once

#include "attnmix/stream/context_spine.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace attnmix::stream {

/// The p Count Sketch matrices M_i (h_d × D, float64) drawn from seed: row j holds s_i(j) = ±1 at column h_i(j).
/// @throws ValueError unless head_dim, sketch_dim and degree are positive.
torch::Tensor tensor_sketch_hashes(int64_t head_dim, int64_t sketch_dim, int64_t degree, uint64_t seed);
/// TS(x) of the header for x (…, h_d) float64 and hashes (p, h_d, D): (…, D). Differentiable in x.
torch::Tensor tensor_sketch(const torch::Tensor& x, const torch::Tensor& hashes);

/// Sizes of TensorSketchSpine: every size positive, d_model % n_head == 0 and head_dim even.
struct TensorSketchOptions {
  int64_t vocab = 256;   ///< V, the number of token ids
  int64_t d_model = 32;  ///< d, the residual width (a multiple of n_head)
  int64_t n_layer = 2;   ///< Transformer layers
  int64_t n_head = 2;    ///< H, heads per layer; h_d = d_model / n_head
  int64_t window = 16;      ///< w: tokens attended exactly
  int64_t sketch_dim = 64;  ///< D: the sketch's width
  int64_t degree = 2;       ///< p: the polynomial kernel's degree
  uint64_t hash_seed = 0;   ///< the Count Sketch hashes (the same in every layer and head)
};

/// One layer's carried state: the exact window and the running sums over the sketches of the evicted tokens.
struct TensorSketchLayerState {
  torch::Tensor window_k;  ///< φ(k) of the last min(pos, w) tokens, (b, H, n, h_d), oldest first
  torch::Tensor window_v;  ///< their values, (b, H, n, h_d); both in the parameters' dtype
  torch::Tensor sum_kv;    ///< S = Σ TS(φ(k)) vᵀ over the evicted tokens, (b, H, D, h_d) float64
  torch::Tensor sum_k;     ///< Z = Σ TS(φ(k)), (b, H, D) float64
  torch::Tensor misfit;    ///< the receipt's relative kernel misfit of the last evicting chunk, (b, H) float64
  torch::Tensor last_x;    ///< the layer's normalised input at the previous token, (b, d)
};

/// What TensorSketchSpine carries between chunks: per layer the window, the sketch sums and the misfit receipt.
struct TensorSketchState {
  std::vector<TensorSketchLayerState> layers;  ///< one per layer, in order
  int64_t pos = 0;         ///< tokens seen (the absolute position of the next one)
  int64_t batch_size = 0;  ///< b, the number of streams

  /// Bytes held by the windows, sums, receipts and shift rows.
  int64_t bytes() const;
};

/// What TensorSketchSpine::advance returns.
struct TensorSketchOutput {
  TensorSketchState state;  ///< the state after the chunk
  torch::Tensor logits;  ///< (b, t, vocab)
};

/// A ContextMechanism: the spine's backbone (same construction order) with the window + sketch attention above in
/// each layer and linear attention's token shifts (the parameters are LinearAttentionSpine's).
class TensorSketchSpineImpl : public torch::nn::Module {
 public:
  /// The state this mechanism carries between chunks (ContextMechanism).
  using state_type = TensorSketchState;

  /// @throws ValueError for invalid sizes (naming the field).
  explicit TensorSketchSpineImpl(const TensorSketchOptions& options);

  /// Empty windows and zero sums (float64; windows and shift rows in the parameters' dtype) for batch_size streams
  /// on `device`. @throws ValueError unless batch_size is positive.
  TensorSketchState init_state(int64_t batch_size, torch::Device device = torch::kCPU) const;
  /// Runs one chunk. @throws ValueError for ids outside [0, vocab), a malformed chunk or a state that does not fit.
  TensorSketchOutput advance(const TensorSketchState& state, const torch::Tensor& x);
  /// advance() plus the mean cross-entropy against y (same shape as x).
  /// @throws ValueError for what advance() rejects and for a bad y.
  MechanismStep<TensorSketchState> step(const TensorSketchState& state, const torch::Tensor& x,
                                        const torch::Tensor& y);
  /// Stop-gradient on every carried tensor.
  TensorSketchState detach(const TensorSketchState& state) const;
  /// Checks a state's shapes and dtypes against the model. @throws ValueError naming what does not fit.
  void check_state(const TensorSketchState& state, int64_t batch_size, const char* where) const;

  /// The sizes the spine was built with.
  const TensorSketchOptions& options() const { return options_; }
  /// h_d = d_model / n_head.
  int64_t head_dim() const { return options_.d_model / options_.n_head; }
  /// The spine's parameters (embedding, layers, final norm), registered as "backbone".
  SpineBackbone& backbone() { return backbone_; }
  /// The token shifts, one per layer ("shift0", "shift1", …; zero at initialisation).
  const std::vector<torch::nn::Linear>& shifts() const { return shifts_; }
  /// The Count Sketch matrices, (degree, head_dim, sketch_dim) float64.
  const torch::Tensor& hashes() const { return hashes_; }

 private:
  TensorSketchOutput advance_checked(const TensorSketchState& state, const torch::Tensor& x);

  TensorSketchOptions options_;
  SpineBackbone backbone_{nullptr};
  std::vector<torch::nn::Linear> shifts_;
  torch::Tensor hashes_;
};
/// TensorSketchSpine, the module holder of TensorSketchSpineImpl (libtorch's TORCH_MODULE).
TORCH_MODULE(TensorSketchSpine);

static_assert(ContextMechanism<TensorSketchSpineImpl>);

}  // namespace attnmix::stream
