// SPDX-License-Identifier: Apache-2.0
/// @file frequent_directions.hpp
/// FrequentDirectionsSpine: linear attention (linear_attention.hpp) whose exact part is a short window and whose
/// evicted history is a Frequent Directions sketch (Liberty 2013, Algorithm 1) — an oblivious bounded memory, the
/// sibling of moment closure's adaptive one.
///
/// The sketch. A stream of rows a_1, a_2, … ∈ ℝ^m is summarised by B ∈ ℝ^{ℓ×m} (ℓ even, ℓ ≥ 4), zero at the start.
/// Each row goes into the first zero row of B; when B has no zero row left it shrinks:
///   B = U Σ Vᵀ (thin SVD),  δ = σ_{ℓ/2}² (0 when ℓ/2 > rank bound min(ℓ, m)),  B ← sqrt(max(Σ² − δ, 0)) Vᵀ,
/// which makes every row from ℓ/2 on exactly zero. With A the matrix of every row inserted so far:
///   0 ≼ AᵀA − BᵀB ≼ (Σ δ) I   and   Σ δ ≤ (‖A‖_F² − ‖B‖_F²) / (ℓ/2) ≤ 2‖A‖_F² / ℓ,
/// the deterministic guarantee the receipt checks (each shrink removes at least (ℓ/2)·δ of squared mass).
/// Cost of one shrink: O(ℓ·m·min(ℓ, m)); one every ℓ/2 rows once full.
///
/// The spine. Per layer and head, with φ = elu + 1 and the token shift of linear attention (q, k, v from
/// linear_features), the token at position i reads the exact window W_i = {i − w + 1, …, i} and the sketch B_i of the
/// rows a_j = [φ(k_j); v_j] (m = 2·h_d) of every evicted position j ≤ i − w, split as B = [B_k | B_v]:
///   num_i = Σ_{j∈W_i} (φ(q_i)·φ(k_j)) v_j + B_vᵀ B_k φ(q_i)      (B_kᵀB_v approximates Σ_evicted φ(k_j) v_jᵀ)
///   den_i = Σ_{j∈W_i} φ(q_i)·φ(k_j) + φ(q_i)·Z_i + ε,   Z_i = Σ_{evicted j} φ(k_j) exactly,   ε = 1e-6
///   out_i = proj(num_i / den_i)
/// Token i evicts position i − w and the sketch takes its row (and shrinks if full) before token i reads it. When
/// the sketch never discards anything (no shrink, or ℓ/2 > 2·h_d) the spine equals LinearAttentionSpine with the
/// same weights. The sketch is never differentiated: it is computed without gradient, and while training the far
/// term gains the straight-through correction e_i − stop(e_i), e_i = Σ_{evicted j ≤ i in this chunk}
/// (stop(φ(q_i))·φ(k_j)) v_j, whose value is zero and whose gradient is exact linear attention's for the keys and
/// values the chunk evicts (as for the outlier store, docs/decisions/0008-outlier-store.md; docs/far-field.md).
/// Streaming a sequence in chunks follows the same per-token sequence of insertions and shrinks as one pass, so the
/// two agree up to the float32 rounding of the dense products.
/// Cost per chunk and layer: O(b·t·d²) projections, O(b·H·t·(w+t)·h_d) window attention, O(b·H·t·ℓ·h_d) far reads
/// and a shrink every ℓ/2 evictions; state per layer b·H·(2·w·h_d float32 + ℓ·2·h_d + h_d + 2 float64) + b·d
/// float32, independent of the stream's length.
#pragma once

#include "attnmix/stream/context_spine.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace attnmix::stream {

/// One Frequent Directions shrink of a full sketch (…, ℓ, m): the shrunk sketch (rows from `filled` on all zero),
/// δ per sketch (…) and the rows in use after it: ℓ/2 − 1, or min(ℓ, m) when ℓ/2 > min(ℓ, m) (then δ = 0).
struct FrequentDirectionsShrink {
  torch::Tensor sketch;  ///< the shrunk sketch, the input's shape and dtype; rows from `filled` on exactly zero
  torch::Tensor delta;   ///< δ = σ_{ℓ/2}² per sketch, the input's shape without its last two dimensions
  int64_t filled = 0;    ///< rows in use after the shrink: ℓ/2 − 1, or min(ℓ, m) when ℓ/2 > min(ℓ, m)
};
/// Shrinks every sketch of a batch (…, ℓ, m) by one thin SVD each, without gradient. Cost O(ℓ·m·min(ℓ, m)) per
/// sketch.
/// @throws ValueError unless sketch is floating point with at least 2 dimensions and an even ℓ >= 4 rows.
FrequentDirectionsShrink frequent_directions_shrink(const torch::Tensor& sketch);

/// Sizes of FrequentDirectionsSpine: every size positive, d_model % n_head == 0, sketch_rows even and >= 4. They are
/// checked as the spine's (validate_spine_options), so head_dim must also be even.
struct FrequentDirectionsOptions {
  int64_t vocab = 256;   ///< V, the number of token ids
  int64_t d_model = 32;  ///< d, the residual width (a multiple of n_head)
  int64_t n_layer = 2;   ///< Transformer layers
  int64_t n_head = 2;    ///< H, heads per layer; h_d = d_model / n_head, and each sketch row has m = 2·h_d entries
  int64_t window = 16;       ///< w: tokens attended exactly
  int64_t sketch_rows = 16;  ///< ℓ: rows of each head's sketch
};

/// One layer's carried state. `filled` and `shrinks` are the same for every stream and head: all streams evict in
/// step, so their sketches fill and shrink together.
struct FrequentDirectionsLayerState {
  torch::Tensor window_k;      ///< φ(k) of the last min(pos, w) tokens, (b, H, n, h_d), oldest first
  torch::Tensor window_v;      ///< their values, (b, H, n, h_d); both in the parameters' dtype
  torch::Tensor sketch;        ///< B, (b, H, ℓ, 2·h_d) float64; rows from `filled` on are zero
  torch::Tensor sum_k;         ///< Z = Σ φ(k) over the evicted tokens, (b, H, h_d) float64
  torch::Tensor mass;          ///< ‖A‖_F² of the evicted rows, (b, H) float64
  torch::Tensor shrink_total;  ///< Σ δ over the shrinks so far, (b, H) float64
  torch::Tensor last_x;        ///< the layer's normalised input at the previous token, (b, d)
  int64_t filled = 0;          ///< rows of the sketch in use
  int64_t shrinks = 0;         ///< shrinks so far
};

/// What FrequentDirectionsSpine carries between chunks: per layer the window, the sketch and its sums.
struct FrequentDirectionsState {
  std::vector<FrequentDirectionsLayerState> layers;  ///< one per layer, in order
  int64_t pos = 0;  ///< tokens seen (the absolute position of the next one)
  int64_t batch_size = 0;  ///< b, the number of streams

  /// Bytes held by the windows, sketches, sums and shift rows.
  int64_t bytes() const;
};

/// What FrequentDirectionsSpine::advance returns.
struct FrequentDirectionsOutput {
  FrequentDirectionsState state;  ///< the state after the chunk
  torch::Tensor logits;  ///< (b, t, vocab)
};

/// What one layer's sketch guarantees, read off its state. Conservation: window + evicted = pos.
struct FrequentDirectionsReceipt {
  int64_t window = 0;          ///< tokens held exactly
  int64_t evicted = 0;         ///< tokens the sketch has taken (each once)
  int64_t filled = 0;          ///< rows of the sketch in use (as FrequentDirectionsLayerState::filled)
  int64_t shrinks = 0;         ///< shrinks so far (as FrequentDirectionsLayerState::shrinks)
  torch::Tensor mass;          ///< ‖A‖_F², (b, H)
  torch::Tensor kept;          ///< ‖B‖_F², (b, H)
  torch::Tensor shrink_total;  ///< Σ δ, (b, H): the bound on ‖AᵀA − BᵀB‖₂
  torch::Tensor bound;         ///< (‖A‖_F² − ‖B‖_F²) / (ℓ/2), (b, H)
  bool bound_holds = false;    ///< Σ δ ≤ bound (relative tolerance 1e-9 of ‖A‖_F²) in every stream and head
};

/// A ContextMechanism: the spine's backbone (same construction order) with the window + sketch attention above in
/// each layer and linear attention's token shifts, so that its parameters are LinearAttentionSpine's.
class FrequentDirectionsSpineImpl : public torch::nn::Module {
 public:
  /// The state this mechanism carries between chunks (ContextMechanism).
  using state_type = FrequentDirectionsState;

  /// @throws ValueError for invalid sizes (naming the field).
  explicit FrequentDirectionsSpineImpl(const FrequentDirectionsOptions& options);

  /// Empty windows and zero sketches for batch_size streams. @throws ValueError unless batch_size is positive.
  FrequentDirectionsState init_state(int64_t batch_size, torch::Device device = torch::kCPU) const;
  /// Runs one chunk. @throws ValueError for ids outside [0, vocab), a malformed chunk or a state that does not fit.
  FrequentDirectionsOutput advance(const FrequentDirectionsState& state, const torch::Tensor& x);
  /// advance() plus the mean cross-entropy against y (same shape as x).
  /// @throws ValueError for what advance() rejects and for a bad y.
  MechanismStep<FrequentDirectionsState> step(const FrequentDirectionsState& state, const torch::Tensor& x,
                                              const torch::Tensor& y);
  /// Stop-gradient on every carried tensor.
  FrequentDirectionsState detach(const FrequentDirectionsState& state) const;
  /// Every layer's receipt. @throws ValueError for a state that does not fit.
  std::vector<FrequentDirectionsReceipt> receipts(const FrequentDirectionsState& state) const;
  /// The sketch rows in use and the shrinks after pos tokens (every layer, stream and head follows this schedule).
  std::pair<int64_t, int64_t> schedule(int64_t pos) const;
  /// Checks a state's shapes, dtypes and counts against the model. @throws ValueError naming what does not fit.
  void check_state(const FrequentDirectionsState& state, int64_t batch_size, const char* where) const;

  /// The sizes the spine was built with.
  const FrequentDirectionsOptions& options() const { return options_; }
  /// h_d = d_model / n_head.
  int64_t head_dim() const { return options_.d_model / options_.n_head; }
  /// The spine's parameters (embedding, layers, final norm), registered as "backbone".
  SpineBackbone& backbone() { return backbone_; }
  /// The token shifts, one per layer.
  const std::vector<torch::nn::Linear>& shifts() const { return shifts_; }

 private:
  FrequentDirectionsOutput advance_checked(const FrequentDirectionsState& state, const torch::Tensor& x);

  FrequentDirectionsOptions options_;
  SpineBackbone backbone_{nullptr};
  std::vector<torch::nn::Linear> shifts_;
};
/// FrequentDirectionsSpine, the module holder of FrequentDirectionsSpineImpl (libtorch's TORCH_MODULE).
TORCH_MODULE(FrequentDirectionsSpine);

static_assert(ContextMechanism<FrequentDirectionsSpineImpl>);

}  // namespace attnmix::stream
