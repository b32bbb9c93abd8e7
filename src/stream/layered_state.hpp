// SPDX-License-Identifier: Apache-2.0
// What the per-layer carried states of the linear-feature spines share (private to attnmix::torch): the checks of
// a state's frame and tensors, and the pass of a chunk through the backbone's layers. Used by
// LinearAttentionSpine, FrequentDirectionsSpine and TensorSketchSpine.
#pragma once

#include "attnmix/core/errors.hpp"
#include "attnmix/stream/context_spine.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>

namespace attnmix::stream::detail {

/// The state's batch size matches the chunk's, pos >= 0 and it has one entry per layer.
/// @throws ValueError naming `where` and what does not fit.
inline void check_state_frame(int64_t state_batch, int64_t pos, int64_t state_layers, int64_t chunk_batch,
                              int64_t n_layer, const std::string& where) {
  if (state_batch != chunk_batch) {
    throw ValueError(where + ": the chunk's batch size " + std::to_string(chunk_batch) +
                     " does not match the state's batch size " + std::to_string(state_batch));
  }
  if (pos < 0) throw ValueError(where + ": the state's pos must be >= 0 (got " + std::to_string(pos) + ")");
  if (state_layers != n_layer) {
    throw ValueError(where + ": the state has " + std::to_string(state_layers) + " layers, the model " +
                     std::to_string(n_layer));
  }
}

/// t is defined, of these sizes and this dtype.
inline bool tensor_fits(const torch::Tensor& t, c10::IntArrayRef sizes, torch::ScalarType dtype) {
  return t.defined() && t.sizes() == sizes && t.scalar_type() == dtype;
}

/// A chunk x (b, t) through the backbone: per layer h += attention(l, ln1(h), the layer's state), then the MLP;
/// `attention` returns {output (b, t, d), the layer's next state}. Returns the next per-layer states and the logits.
template <class State, class Attention>
std::pair<State, torch::Tensor> advance_layers(SpineBackboneImpl& backbone, const State& state, const torch::Tensor& x,
                                               Attention&& attention) {
  auto h = backbone.tok(x);
  State next = state;
  for (size_t l = 0; l < backbone.layers.size(); ++l) {
    auto& layer = *backbone.layers[l];
    auto [out, layer_state] = attention(l, layer, layer.ln1(h), state.layers[l]);
    h = layer.finish(h, out);
    next.layers[l] = std::move(layer_state);
  }
  next.pos = state.pos + x.size(1);
  return {std::move(next), backbone.logits(h)};
}

}  // namespace attnmix::stream::detail
