// SPDX-License-Identifier: Apache-2.0
/// @file checkpoint_weights.hpp
/// The trained parameters of an `attnmix lm train` checkpoint (docs/lm.md), copied into a mechanism that the
/// caller built: how the Python modules of attnmix.torch (and any C++ caller that assembles its own mechanism) start
/// from a trained model. The checkpoint's `model` record holds the mechanism's parameters by module path
/// (`backbone.tok.weight`, `backbone.layer0.qkv.weight`, …, and the sketch spines' `shift0.weight`, …; float32).
#pragma once

#include <torch/torch.h>

#include <string>

namespace attnmix::stream {

/// Copies the checkpoint's parameters into `mechanism` (a SlidingWindowSpine, MomentClosureAttention,
/// LinearAttentionSpine, … module), converting them to its dtype. The file is first checked as
/// stream::read_checkpoint_info checks it (format, version, CRC-32 of every member, options); then every parameter of
/// the module must be stored under its path, with its shape, as float32 and finite. Nothing is copied unless all
/// of them are.
/// @throws IoError (a std::runtime_error) for a file that cannot be read; std::runtime_error naming the file (and
///   the parameter) for a malformed checkpoint or a missing, mis-shaped, non-float32 or non-finite parameter.
void load_checkpoint_weights(const std::string& path, torch::nn::Module& mechanism);

}  // namespace attnmix::stream
