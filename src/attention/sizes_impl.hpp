// SPDX-License-Identifier: Apache-2.0
// The sizes the attention families' descriptors share (private).
#pragma once

#include "attnmix/family/spec.hpp"

namespace attnmix::detail {

/// The sizes the attention families share: S symbols, N context positions (fixed by the model, or open: each data
/// set sets it), D embedding dimensions (8 unless given), T targets.
inline constexpr SizeSpec kSymbols{.symbol = "S", .flag = "symbols", .keyword = "num_symbols", .noun = "symbols",
                               .help = "number of symbols"};
inline constexpr SizeSpec kContext{.symbol = "N", .flag = "context-length", .keyword = "context_length",
                               .noun = "context positions", .help = "context positions"};
inline constexpr SizeSpec kOpenContext{.symbol = "N", .flag = "context-length", .keyword = "context_length",
                                   .noun = "context positions", .help = "context positions", .fixed_by_model = false};
inline constexpr SizeSpec kEmbedding{.symbol = "D", .flag = "embed-dim", .keyword = "embed_dim", .noun = "embedding dims",
                                 .help = "embedding dimension", .fallback = 8};
inline constexpr SizeSpec kTargets{.symbol = "T", .flag = "targets", .keyword = "num_targets", .noun = "targets",
                               .help = "number of targets"};

}  // namespace attnmix::detail
