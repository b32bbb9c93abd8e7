// SPDX-License-Identifier: Apache-2.0
/// @file lm_support.hpp
/// Inside the language-model plugin (lm_plugin.hpp), what the commands (lm_run.cpp) and the demo's
/// section (demo_lm.cpp) share: the default corpus, reading a text file into byte tokens with a
/// held-out tail, and the progress line. Implemented in lm_run.cpp.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "attnmix/stream/language_model.hpp"
#include "commands/lm_plugin.hpp"

namespace attnmix::cli {

/// A text file as byte tokens: all of it in `train` (holdout 0) or split by stream::split_heldout.
struct LmCorpus {
  int64_t bytes = 0;             ///< size of the file
  std::vector<int64_t> train;    ///< the first bytes
  std::vector<int64_t> heldout;  ///< the last ⌈holdout · bytes⌉ (empty for holdout 0)
};

/// Reads `path` and splits off the held-out tail (0 ≤ holdout < 1).
/// @throws std::runtime_error "path: cannot read the text: <reason>" (also for a directory, a pipe
///   or a device: check_input_file, so a FIFO never blocks); ValueError naming the file for an
///   empty text or one too short to split.
[[nodiscard]] LmCorpus read_lm_corpus(const std::string& path, double holdout);

/// "step 120/300  40%  6.1k tokens/s  loss 2.4312  ETA 0:12".
[[nodiscard]] std::string format_lm_progress(const stream::Progress& progress);

/// One line of `lm train --history` (JSON, newline-terminated): step, loss, tokens_per_second, elapsed_seconds and,
/// for moment closure, per layer clusters, bank_mass and far_share.
[[nodiscard]] std::string history_line(const stream::Progress& progress);

/// The history's last line when a held-out part was scored: step and heldout_bits_per_byte.
[[nodiscard]] std::string heldout_history_line(int64_t step, double bits_per_byte);

/// A rate with a k/M suffix: "950", "6.1k", "1.23M".
[[nodiscard]] std::string format_rate(double per_second);

/// Seconds as "m:ss" or "h:mm:ss".
[[nodiscard]] std::string format_duration(double seconds);

/// The demo's language-model section (demo_lm.cpp); the executable reaches it through
/// LmPlugin::demo. `history` (when not null) receives its training history (history_line).
void demo_lm_section(std::ostream& out, std::string* history);

}  // namespace attnmix::cli
