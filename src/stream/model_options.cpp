// SPDX-License-Identifier: Apache-2.0
// The module options of an stream::ModelConfig; see src/stream/model_options.hpp.
#include "model_options.hpp"

#include <optional>

namespace attnmix::stream {

namespace {

/// The options O of a module with the backbone every mechanism shares: vocab, d_model, n_layer, n_head.
template <class O>
O backbone(const ModelConfig& m) {
  O o;
  o.vocab = m.vocab;
  o.d_model = m.d_model;
  o.n_layer = m.n_layer;
  o.n_head = m.n_head;
  return o;
}

}  // namespace

SpineOptions spine_options(const ModelConfig& m) {
  auto o = backbone<SpineOptions>(m);
  o.window = m.mechanism == Mechanism::kFull || m.mechanism == Mechanism::kLinear ? std::nullopt
                                                                                   : std::optional<int64_t>(m.window);
  return o;
}

LinearAttentionOptions linear_options(const ModelConfig& m) { return backbone<LinearAttentionOptions>(m); }

FrequentDirectionsOptions frequent_directions_options(const ModelConfig& m) {
  auto o = backbone<FrequentDirectionsOptions>(m);
  o.window = m.window;
  o.sketch_rows = m.sketch_rows;
  return o;
}

TensorSketchOptions tensor_sketch_options(const ModelConfig& m) {
  auto o = backbone<TensorSketchOptions>(m);
  o.window = m.window;
  o.sketch_dim = m.sketch_dim;
  o.degree = m.sketch_degree;
  return o;
}

MomentClosureOptions moment_options(const ModelConfig& m) {
  auto o = backbone<MomentClosureOptions>(m);
  o.window = m.window;
  o.max_clusters = m.max_clusters;
  o.birth_threshold = m.birth_threshold;
  o.merge_threshold = m.merge_threshold;
  o.cluster_rule = m.cluster_rule;
  o.outlier_capacity = m.outlier_capacity;
  return o;
}

}  // namespace attnmix::stream
