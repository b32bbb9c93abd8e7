// SPDX-License-Identifier: Apache-2.0
// What the attention families' descriptors share (private): their sizes and their common options.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "attnmix/core/precision.hpp"
#include "attnmix/family/spec.hpp"

#include "../family/settings_impl.hpp"

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

/// The gate variance (stored in the model) and the emission's pseudo-count.
template <class Options>
OptionTable<Options> with_gate(OptionTable<Options> table, std::string_view sigma2_help = "gate variance sigma^2") {
  return std::move(table)
      .add("sigma2", &Options::sigma2, sigma2_help, OptionCheck::kPositive, /*from_model=*/true)
      .add("emission_smoothing", &Options::emission_smoothing, "pseudo-count added to every emission count",
           OptionCheck::kNonNegative);
}

/// The Adam ascent of the variational families' embeddings.
template <class Options>
OptionTable<Options> with_adam(OptionTable<Options> table) {
  return std::move(table)
      .add("lr", &Options::lr, "Adam step size of the embedding update", OptionCheck::kPositive)
      .add("mc", &Options::mc, "Monte-Carlo samples of the embeddings per E-step", OptionCheck::kPositive,
           /*from_model=*/false, /*shapes_statistics=*/true)
      .add("prior_strength", &Options::prior_strength, "weight of the KL term to the N(0, I) embedding prior",
           OptionCheck::kNonNegative);
}

/// The E-step's arithmetic (core/precision.hpp).
template <class Options>
OptionTable<Options> with_precision(OptionTable<Options> table) {
  return std::move(table).add_choice(
      "precision", &Options::precision,
      "arithmetic of the E-step: float64, or mixed (distances, gate logits and their exponentials in float, every "
      "sum and the M-step in double; the log-likelihood agrees with float64 to about 8 digits; "
      "docs/mixed_precision.md)",
      {"float64", "mixed"}, &precision_name, &parse_precision);
}

/// The options a model stores: its gate variance.
template <class Model>
OptionValues stored_sigma2(const AnyDistribution& model) {
  return {{"sigma2", model.get_if<Model>()->sigma2()}};
}

}  // namespace attnmix::detail
