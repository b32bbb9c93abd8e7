// SPDX-License-Identifier: Apache-2.0
/// @file linear_attention.hpp
/// LinearAttentionSpine: the spine of context_spine.hpp with every layer's softmax attention replaced by causal
/// linear attention over the whole stream (Katharopoulos et al. 2020, "Transformers are RNNs"): no window, and a
/// carried state whose size does not grow with the stream.
///
/// Per layer, for the chunk's normalised input x (b, t, d) and the layer's state (S₀, Z₀, x₋₁), with h_d = d / H:
///   q, k, v = split(x Wᵀ + b)                       W = qkv.weight (3d, d), each (b, t, H, h_d)
///   k_i   += (U x_{i−1})                             token shift: x₋₁ = the previous chunk's last row (0 at the start)
///   φ(z)   = elu(z) + 1                              positive features
///   S_i    = S₀ + Σ_{j ≤ i} φ(k_j) v_jᵀ              (h_d × h_d) per head
///   Z_i    = Z₀ + Σ_{j ≤ i} φ(k_j)                   (h_d) per head
///   out_i  = proj( S_iᵀ φ(q_i) / (φ(q_i) · Z_i + ε) ),  ε = 1e-6
/// S and Z are float64 running sums, added token by token in stream order (a sequential scan) from exact products of
/// float32 factors, so a chunk continues the sums exactly where the previous one stopped; streaming a sequence in
/// chunks equals one pass up to the float32 rounding of the dense products, whose result for a row depends on how
/// many rows one call multiplies (not bit for bit).
/// The token shift U = Linear(d, d, no bias) starts at zero: it lets a token's key carry the token before it, which
/// associative recall needs (a value is found through the key just before it) and which causal linear attention,
/// having no positions, cannot otherwise form; it is the shortest of the causal convolutions H3 and Based put next to
/// linear attention. Every other parameter is the spine's, built in the spine's order, so a seed gives the window,
/// full and moment-closure models the same initial weights.
/// Cost per chunk and layer: O(b·t·d²) for the projections and O(b·t·H·h_d²) for attention; state per layer
/// b·H·(h_d² + h_d) float64 plus b·d float32, independent of the stream's length.
#pragma once

#include "attnmix/stream/context_spine.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace attnmix::stream {

/// Sizes of LinearAttentionSpine: every size positive, d_model % n_head == 0 (no window: the state is the sums).
/// They are checked as the spine's (validate_spine_options), so head_dim must also be even, although no RoPE is
/// applied.
struct LinearAttentionOptions {
  int64_t vocab = 256;   ///< V, the number of token ids
  int64_t d_model = 32;  ///< d, the residual width (a multiple of n_head)
  int64_t n_layer = 2;   ///< Transformer layers
  int64_t n_head = 2;    ///< H, heads per layer; h_d = d_model / n_head
};

/// One layer's carried state: the running sums of every token seen so far and the last normalised input row.
struct LinearAttentionLayerState {
  torch::Tensor sum_kv;  ///< S = Σ φ(k) vᵀ, (b, H, h_d, h_d) float64 (key index before value index)
  torch::Tensor sum_k;   ///< Z = Σ φ(k), (b, H, h_d) float64
  torch::Tensor last_x;  ///< the layer's normalised input at the previous token, (b, d); zero at the start
};

/// What LinearAttentionSpine carries between chunks: per layer the running sums and the shift row.
struct LinearAttentionState {
  std::vector<LinearAttentionLayerState> layers;  ///< one per layer, in order
  int64_t pos = 0;  ///< tokens seen (the absolute position of the next one)
  int64_t batch_size = 0;  ///< b, the number of streams

  /// Bytes held by the sums and the shift rows.
  int64_t bytes() const;
};

/// What LinearAttentionSpine::advance returns.
struct LinearAttentionOutput {
  LinearAttentionState state;  ///< the state after the chunk
  torch::Tensor logits;  ///< (b, t, vocab)
};

/// The features one layer's linear attention reads from a chunk x (b, t, d): φ(q), φ(k) with the token shift added
/// to k before φ, and v, each (b, t, H, h_d) in float64 (exact copies of the float32 values). last_x is the layer's
/// input at the token before the chunk (b, d). Shared by LinearAttentionSpine and FrequentDirectionsSpine.
struct LinearFeatures {
  torch::Tensor phi_q;  ///< φ(q) = elu(q) + 1, (b, t, H, h_d) float64
  torch::Tensor phi_k;  ///< φ(k + U x_{i−1}), (b, t, H, h_d) float64
  torch::Tensor v;      ///< the values, (b, t, H, h_d) float64
};
/// Computes the features of the chunk x (b, t, d) from the layer's qkv and token `shift` maps, with last_x (b, d) the
/// input row before the chunk. The inputs are trusted (t ≥ 1, d divisible by n_head). Cost O(b·t·d²).
LinearFeatures linear_features(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& shift, const torch::Tensor& x,
                               const torch::Tensor& last_x, int64_t n_head);

/// Registers one zero-initialised token shift Linear(d_model, d_model, no bias) per layer on `module`, named
/// "shift<l>", after whatever the module registered before (the backbone), and returns them.
std::vector<torch::nn::Linear> register_token_shifts(torch::nn::Module& module, int64_t d_model, int64_t n_layer);

/// One layer's linear attention on a chunk (before the residual): proj(attention) (b, t, d) and the layer's state
/// after it. The inputs are trusted (the module checks them).
struct LinearAttentionSublayerStep {
  torch::Tensor out;               ///< proj(attention), (b, t, d), in x's dtype
  LinearAttentionLayerState state;  ///< the sums after the chunk's last token and its input row
};
/// Runs one layer's causal linear attention (the formulas of the file comment) on the normalised chunk x (b, t, d)
/// from `state`. Cost O(b·t·d² + b·t·H·h_d²).
LinearAttentionSublayerStep linear_attention_sublayer(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& proj,
                                                      torch::nn::LinearImpl& shift, const torch::Tensor& x,
                                                      const LinearAttentionLayerState& state, int64_t n_head);

/// A ContextMechanism: the spine's backbone (SpineBackbone, same construction order) with linear attention in each
/// layer, plus one token-shift Linear per layer (registered after the backbone, zero-initialised).
class LinearAttentionSpineImpl : public torch::nn::Module {
 public:
  /// The state this mechanism carries between chunks (ContextMechanism).
  using state_type = LinearAttentionState;

  /// @throws ValueError for invalid sizes (naming the field).
  explicit LinearAttentionSpineImpl(const LinearAttentionOptions& options);

  /// Zero sums for batch_size streams, in the parameters' dtype for last_x. @throws ValueError unless positive.
  LinearAttentionState init_state(int64_t batch_size, torch::Device device = torch::kCPU) const;
  /// Runs one chunk. @throws ValueError for ids outside [0, vocab), a malformed chunk or a state that does not fit
  ///   (batch size, layers, shapes or dtypes).
  LinearAttentionOutput advance(const LinearAttentionState& state, const torch::Tensor& x);
  /// advance() plus the mean cross-entropy against y (same shape as x).
  /// @throws ValueError for what advance() rejects and for a bad y.
  MechanismStep<LinearAttentionState> step(const LinearAttentionState& state, const torch::Tensor& x,
                                           const torch::Tensor& y);
  /// Stop-gradient on every carried tensor.
  LinearAttentionState detach(const LinearAttentionState& state) const;

  /// The sizes the spine was built with.
  const LinearAttentionOptions& options() const { return options_; }
  /// h_d = d_model / n_head.
  int64_t head_dim() const { return options_.d_model / options_.n_head; }
  /// The spine's parameters (embedding, layers, final norm), registered as "backbone".
  SpineBackbone& backbone() { return backbone_; }
  /// The token shifts, one per layer.
  const std::vector<torch::nn::Linear>& shifts() const { return shifts_; }

 private:
  LinearAttentionOutput advance_checked(const LinearAttentionState& state, const torch::Tensor& x);
  void check_state(const LinearAttentionState& state, int64_t b, const char* where) const;

  LinearAttentionOptions options_;
  SpineBackbone backbone_{nullptr};
  std::vector<torch::nn::Linear> shifts_;
};
/// LinearAttentionSpine, the module holder of LinearAttentionSpineImpl (libtorch's TORCH_MODULE).
TORCH_MODULE(LinearAttentionSpine);

static_assert(ContextMechanism<LinearAttentionSpineImpl>);

}  // namespace attnmix::stream
