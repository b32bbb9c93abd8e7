// SPDX-License-Identifier: Apache-2.0
/// @file progress_record.hpp
/// A training step's progress as one JSON record: the line `attnmix lm train --history` writes for the step, and the
/// dict (plus `steps` and `eta_seconds`) Python's `on_progress` receives (docs/lm.md). One function builds both, so
/// the two cannot disagree on a field. Cost: O(layers).
#pragma once

#include <nlohmann/json.hpp>

#include "attnmix/stream/language_model.hpp"

namespace attnmix::stream {

/// {step, loss, tokens_per_second, elapsed_seconds} in that order, then the moment-closure lists clusters,
/// bank_mass and far_share when the model has them, then heldout_bits_per_byte at the steps that scored it.
[[nodiscard]] nlohmann::ordered_json progress_record(const Progress& progress);

}  // namespace attnmix::stream
