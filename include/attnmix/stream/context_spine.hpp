// SPDX-License-Identifier: Apache-2.0
/// @file context_spine.hpp
/// The streaming language-model spine (`docs/mechanisms.md#streaming-language-model`): a pre-norm causal Transformer
/// that reads a token stream chunk by chunk and keeps, per layer, the raw keys and values of the last `window` tokens.
///
/// Per layer, for a chunk of t tokens at absolute positions pos … pos+t−1 and a cache of length c:
///   q, k, v = split(qkv(ln1(h)))                               each (b, t, H, h_d), head-major
///   K = cache_k ++ k,  V = cache_v ++ v                        key positions pos−c … pos+t−1
///   a = softmax(RoPE(q) RoPE(K)ᵀ / √h_d + M),  M_ij = 0 iff 0 ≤ P_i − P_j < window, else −∞
///   h += proj(a V);  h += fc2(gelu(fc1(ln2(h))))
///   new cache = the last min(window, c+t) raw rows of K and V (all of them when the window is unbounded)
/// then logits = ln_f(h) tokᵀ (the head is tied to the embedding) and loss = mean cross-entropy.
/// RoPE is applied once, at absolute positions, to q and to the raw cached keys (docs/porting.md), so streaming a
/// sequence in chunks equals one pass over it whenever the window covers the stream. Each layer's attention is
/// the sublayer of self_attention.hpp.
/// Cost per chunk and layer: O(b·t·d²) for the projections and O(b·H·t·(c+t)·h_d) for attention; state
/// O(layers·b·window·d).
///
/// Example: examples/streaming_spine.cpp.
#pragma once

#include "attnmix/core/errors.hpp"
#include "attnmix/stream/rope.hpp"

#include <torch/torch.h>

#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace attnmix::stream {

/// What a mechanism's step returns: the carried state after the chunk and the chunk's mean cross-entropy.
template <class State>
struct MechanismStep {
  /// The carried state after the chunk, to pass to the next step (its tensors still attached to the graph).
  State state;
  torch::Tensor loss;  ///< scalar, differentiable
};

/// A mechanism streams a long token sequence in chunks and carries state between them.
/// `init_state(batch_size)`, `step(state, x, y)` with x, y (batch, t) int64 ids, and `detach(state)`.
template <class M>
concept ContextMechanism = requires(M& m, const typename M::state_type& s, const torch::Tensor& x) {
  typename M::state_type;
  { m.init_state(int64_t{1}) } -> std::same_as<typename M::state_type>;
  { m.step(s, x, x) } -> std::same_as<MechanismStep<typename M::state_type>>;
  { m.detach(s) } -> std::same_as<typename M::state_type>;
};

/// Sizes of the spine. Every size is a positive integer, d_model % n_head == 0 and head_dim is even;
/// window = nullopt means unbounded (full causal attention); cp_size (context parallelism) accepts only 1.
struct SpineOptions {
  /// V, the number of token ids (the embedding's rows and the logits' width).
  int64_t vocab = 256;
  /// d, the width of the residual stream; a multiple of n_head.
  int64_t d_model = 32;
  /// The number of Transformer layers.
  int64_t n_layer = 2;
  /// H, heads per layer; head_dim h_d = d_model / n_head must be even (RoPE rotates pairs).
  int64_t n_head = 2;
  /// W, the tokens a query sees (itself included); nullopt: every token since the state began (full attention).
  std::optional<int64_t> window = 64;
  /// Context-parallel group size, kept for the PyTorch signature; must be 1.
  int64_t cp_size = 1;
};

/// Checks SpineOptions. @throws ValueError naming the offending field.
void validate_spine_options(const SpineOptions& options, const char* where);

/// The carried state: per layer the raw keys and values of the cached tokens, (b, len, H, h_d), undefined while
/// empty; pos = the absolute position of the next token.
struct SlidingWindowState {
  /// Per layer, the raw (un-rotated) keys of the cached tokens, (b, len, H, h_d); undefined while empty.
  std::vector<torch::Tensor> cache_k;
  /// Per layer, the values of the cached tokens, (b, len, H, h_d); undefined while empty.
  std::vector<torch::Tensor> cache_v;
  /// The absolute position of the next token: the tokens seen since init_state.
  int64_t pos = 0;
  /// b, the number of streams; every chunk must have this many rows.
  int64_t batch_size = 0;
  /// H, heads per layer, as the model that made the state.
  int64_t n_head = 0;
  /// h_d, the size of one head, as the model that made the state.
  int64_t head_dim = 0;
  /// The device given to init_state (recorded; the caches live where the chunks' activations are computed).
  torch::Device device = torch::kCPU;

  /// Bytes held by the caches (what the state costs in memory).
  int64_t bytes() const;
};

/// Visibility of key positions (L) to query positions (t): (t, L) bool, true iff 0 ≤ P_i − P_j < window
/// (only causality when window is nullopt).
torch::Tensor window_visibility(const torch::Tensor& query_positions, const torch::Tensor& key_positions,
                                std::optional<int64_t> window);

/// One pre-norm Transformer layer's parameters. The attention sublayer (ln1's output through qkv, attention and
/// proj) is self_attention.hpp's; the layer adds its output to the residual and runs the MLP.
struct SpineLayerImpl : torch::nn::Module {
  /// Registers, in this order, ln1, qkv, proj, ln2, fc1 and fc2 for width d_model, with libtorch's default
  /// initialisation (drawn under torch::manual_seed).
  explicit SpineLayerImpl(int64_t d_model);
  /// The attention sublayer's LayerNorm over d_model (ε = 1e−5), applied to the residual stream.
  torch::nn::LayerNorm ln1{nullptr};
  /// d_model → 3·d_model: the queries, keys and values, each split head-major into (H, h_d).
  torch::nn::Linear qkv{nullptr};
  /// d_model → d_model: the attention output's projection back into the residual stream.
  torch::nn::Linear proj{nullptr};
  /// The MLP's LayerNorm over d_model (ε = 1e−5).
  torch::nn::LayerNorm ln2{nullptr};
  /// d_model → 4·d_model, the MLP's first linear map (followed by GELU).
  torch::nn::Linear fc1{nullptr};
  /// 4·d_model → d_model, the MLP's second linear map.
  torch::nn::Linear fc2{nullptr};

  /// h + attn (the sublayer's projected output) followed by the MLP residual: the part of the layer after
  /// attention.
  torch::Tensor finish(const torch::Tensor& h, const torch::Tensor& attn);
};
/// SpineLayer, the module holder of SpineLayerImpl (libtorch's TORCH_MODULE: a ModuleHolder that shares one Impl).
TORCH_MODULE(SpineLayer);

/// The parameters shared by every mechanism: embedding (tied head), layers, final norm.
/// Construction order (and hence the draws under torch::manual_seed): tok, then per layer ln1, qkv, proj, ln2,
/// fc1, fc2, then ln_f.
struct SpineBackboneImpl : torch::nn::Module {
  /// Registers tok (vocab × d_model), n_layer layers ("layer0", "layer1", …) and ln_f, in that order. The sizes are
  /// not checked here (validate_spine_options does).
  SpineBackboneImpl(int64_t vocab, int64_t d_model, int64_t n_layer);
  /// The token embedding, (vocab, d_model), N(0, 1) at initialisation; its weight is also the output head.
  torch::nn::Embedding tok{nullptr};
  /// The Transformer layers, in order (registered as "layer0", "layer1", …).
  std::vector<SpineLayer> layers;
  /// The final LayerNorm over d_model (ε = 1e−5), applied before the tied head.
  torch::nn::LayerNorm ln_f{nullptr};

  /// ln_f(h) tokᵀ: (b, t, vocab).
  torch::Tensor logits(const torch::Tensor& h);
};
/// SpineBackbone, the module holder of SpineBackboneImpl (libtorch's TORCH_MODULE).
TORCH_MODULE(SpineBackbone);

/// Checks a near state against a chunk of batch size b and the spine's sizes and returns the (common) cache length.
/// @throws ValueError ("batch size" for a batch mismatch; "cache" for an inconsistent cache).
int64_t checked_cache_length(const SlidingWindowState& state, int64_t b, int64_t n_layer, int64_t n_head,
                             int64_t head_dim, const char* where);

/// What advance() returns: the state after the chunk and the logits of every position, (b, t, vocab).
struct SpineOutput {
  /// The carried state after the chunk: the caches' last rows and pos advanced by t.
  SlidingWindowState state;
  /// Next-token logits of every position of the chunk, (b, t, vocab), in the parameters' dtype.
  torch::Tensor logits;
};

/// The sliding-window spine, a ContextMechanism. window = nullopt is the full-attention reference.
class SlidingWindowSpineImpl : public torch::nn::Module {
 public:
  /// The state this mechanism carries between chunks (ContextMechanism).
  using state_type = SlidingWindowState;

  /// @throws ValueError for invalid sizes (validate_spine_options).
  explicit SlidingWindowSpineImpl(const SpineOptions& options);

  /// An empty state for batch_size streams. @throws ValueError unless batch_size is positive.
  SlidingWindowState init_state(int64_t batch_size, torch::Device device = torch::kCPU) const;
  /// Runs one chunk: logits of every position and the advanced state.
  /// @throws ValueError for ids outside [0, vocab), non-int64 or non-2-D input, t = 0, or a state whose batch
  ///   size or layout does not match.
  SpineOutput advance(const SlidingWindowState& state, const torch::Tensor& x);
  /// advance() plus the mean cross-entropy against y (same shape as x).
  MechanismStep<SlidingWindowState> step(const SlidingWindowState& state, const torch::Tensor& x,
                                         const torch::Tensor& y);
  /// Stop-gradient on every carried tensor.
  SlidingWindowState detach(const SlidingWindowState& state) const;

  /// The sizes the spine was built with.
  const SpineOptions& options() const { return options_; }
  /// h_d = d_model / n_head.
  int64_t head_dim() const { return options_.d_model / options_.n_head; }
  /// The parameters (embedding, layers, final norm), registered as "backbone".
  SpineBackbone& backbone() { return backbone_; }

 private:
  SpineOutput advance_checked(const SlidingWindowState& state, const torch::Tensor& x);

  SpineOptions options_;
  SpineBackbone backbone_{nullptr};
};
/// SlidingWindowSpine, the module holder of SlidingWindowSpineImpl (libtorch's TORCH_MODULE).
TORCH_MODULE(SlidingWindowSpine);

static_assert(ContextMechanism<SlidingWindowSpineImpl>);

/// Checks token ids: a (batch, time) int64 tensor, both sizes positive, ids in [0, vocab).
/// @throws ValueError naming the problem.
void validate_tokens(const torch::Tensor& ids, int64_t vocab, const char* where);

/// Checks a chunk against a vocabulary: x and y int64, 2-D, equal shapes, t ≥ 1, ids in [0, vocab).
/// @throws ValueError naming the problem.
void validate_chunk(const torch::Tensor& x, const torch::Tensor& y, int64_t vocab, const char* where);

/// Mean cross-entropy of logits (b, t, V) against targets (b, t).
torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets);

// ---------------------------------------------------------------------------------------------------------------
// Truncated backpropagation through time (`docs/mechanisms.md#streaming-language-model`).

/// How TbpttRunner and train_tbptt update: the truncation length and a hook before each optimizer step.
struct TbpttOptions {
  int64_t detach_horizon = 1;  ///< chunks per update (positive)
  /// Called after backward and before opt.step() with the 0-based update index (gradient clipping, a learning-rate
  /// schedule). Optional.
  std::function<void(int64_t update)> before_update;
};

/// Feeds chunks one at a time: each loss joins a running sum; every detach_horizon chunks (and at flush) the
/// optimizer takes one step on sum / count and the state is detached. Only the backward graph is cut; the forward
/// state is never reset.
template <ContextMechanism M>
class TbpttRunner {
 public:
  /// The mechanism's carried state.
  using State = typename M::state_type;

  /// Keeps references to `mechanism` and `optimizer`, which must outlive the runner.
  /// @throws ValueError unless options.detach_horizon is positive.
  TbpttRunner(M& mechanism, torch::optim::Optimizer& optimizer, TbpttOptions options)
      : mechanism_(mechanism), optimizer_(optimizer), options_(std::move(options)) {
    if (options_.detach_horizon <= 0) {
      throw ValueError("train_tbptt: detach_horizon must be a positive integer (got " +
                       std::to_string(options_.detach_horizon) + ")");
    }
  }

  /// One chunk: returns its loss (a double); updates when the horizon is reached.
  double feed(State& state, const torch::Tensor& x, const torch::Tensor& y) {
    auto result = mechanism_.step(state, x, y);
    state = std::move(result.state);
    const double value = result.loss.template item<double>();
    sum_ = pending_ == 0 ? result.loss : sum_ + result.loss;
    if (++pending_ == options_.detach_horizon) {
      update(state);
    }
    return value;
  }

  /// Applies the pending remainder (if any) as one update.
  void flush(State& state) {
    if (pending_ > 0) {
      update(state);
    }
  }

  /// Optimizer steps taken so far (by feed and flush).
  int64_t updates() const { return updates_; }

 private:
  void update(State& state) {
    optimizer_.zero_grad();
    (sum_ / static_cast<double>(pending_)).backward();
    if (options_.before_update) {
      options_.before_update(updates_);
    }
    optimizer_.step();
    state = mechanism_.detach(state);
    sum_ = torch::Tensor();
    pending_ = 0;
    ++updates_;
  }

  M& mechanism_;
  torch::optim::Optimizer& optimizer_;
  TbpttOptions options_;
  torch::Tensor sum_;
  int64_t pending_ = 0;
  int64_t updates_ = 0;
};

/// What train_tbptt returns: every chunk's loss and the state after the last chunk (detached by the final update).
template <class State>
struct TbpttResult {
  std::vector<double> losses;  ///< one per chunk
  State state;                 ///< the final state
};

/// `train_tbptt`: runs every chunk (x, y) through a TbpttRunner and flushes the remainder.
template <ContextMechanism M>
TbpttResult<typename M::state_type> train_tbptt(M& mechanism, typename M::state_type state,
                                                const std::vector<std::pair<torch::Tensor, torch::Tensor>>& chunks,
                                                torch::optim::Optimizer& optimizer, TbpttOptions options = {}) {
  TbpttRunner<M> runner(mechanism, optimizer, std::move(options));
  TbpttResult<typename M::state_type> result;
  result.losses.reserve(chunks.size());
  for (const auto& [x, y] : chunks) {
    result.losses.push_back(runner.feed(state, x, y));
  }
  runner.flush(state);
  result.state = std::move(state);
  return result;
}

}  // namespace attnmix::stream
