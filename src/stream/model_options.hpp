// SPDX-License-Identifier: Apache-2.0
// The module options of an stream::ModelConfig (private to attnmix::torch): the one mapping from the torch-free model
// description of language_model.hpp to the options of the modules, shared by lm training and the far-field runs.
#pragma once

#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/language_model.hpp"
#include "attnmix/stream/frequent_directions.hpp"
#include "attnmix/stream/linear_attention.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "attnmix/stream/tensor_sketch.hpp"

namespace attnmix::stream {

/// window (the window) and full (no window; also linear's reading of the config).
SpineOptions spine_options(const ModelConfig& m);
LinearAttentionOptions linear_options(const ModelConfig& m);
FrequentDirectionsOptions frequent_directions_options(const ModelConfig& m);
TensorSketchOptions tensor_sketch_options(const ModelConfig& m);
MomentClosureOptions moment_options(const ModelConfig& m);

}  // namespace attnmix::stream
