// SPDX-License-Identifier: Apache-2.0
/// @file fit_checkpoint.hpp
/// `attnmix fit --checkpoint FILE` and `--resume FILE` (docs/mechanisms.md#training, "Checkpoints"): the state of the
/// EM loop (optimize.hpp's OptimizeState: the iterations run, the model the next iteration starts from, the best model
/// so far and its iteration, the scores) and the progress lines reported so far, as one JSON document that rank 0
/// writes atomically after every --checkpoint-every iterations. A fit resumed from it goes on to the model the
/// uninterrupted fit writes, bit for bit, on any number of threads (under mpirun, with as many processes). The
/// document records the settings of its fit (family, data, sizes, options, seed, loop); a resumed fit must have the
/// same ones, --max-its excepted, which may be raised to go on further.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/progress.hpp"
#include "commands/fit_problem.hpp"

namespace attnmix::cli {

/// What a checkpoint holds: the loop's state and the progress lines reported up to it (for --history).
struct FitCheckpoint {
  OptimizeState<AnyDistribution> state;
  std::vector<IterationReport> history;
};

/// The settings of a fit that its checkpoints record and that a resumed fit must repeat.
[[nodiscard]] nlohmann::ordered_json fit_settings(const FitArgs& args, const OptimizeOptions& options,
                                                  const FamilySpec& family, const FitProblem& problem);

/// The text of the checkpoint of `state`, with the progress lines so far and the fit's settings.
[[nodiscard]] std::string checkpoint_text(const OptimizeState<AnyDistribution>& state,
                                          const std::vector<IterationReport>& history,
                                          const nlohmann::ordered_json& settings);

/// Reads the checkpoint `path` of a fit with `settings` (fit_settings); its models are rebuilt in the fit's precision.
/// @throws ValueError naming the file and the field for a file that is not a checkpoint, is damaged, or was written
///         by a fit with other settings; IoError when it cannot be read.
[[nodiscard]] FitCheckpoint read_checkpoint(const std::string& path, const nlohmann::ordered_json& settings,
                                            const FamilySpec& family, const FitProblem& problem);

}  // namespace attnmix::cli
