// SPDX-License-Identifier: Apache-2.0
// `attnmix sample`: K observations drawn from a saved model with its family's sampler, as JSON
// Lines on stdout.
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli_support.hpp"
#include "number_checks.hpp"
#include "commands/commands.hpp"
#include "model_data.hpp"

namespace attnmix::cli {

namespace {

struct SampleArgs {
  std::string model;
  int64_t n = 0;
  uint64_t seed = 0;
  int64_t context_length = 0;
  CLI::Option* context_length_opt = nullptr;
};

int run_sample(const SampleArgs& args) {
  const AnyDistribution model = read_saved_model(args.model);
  std::optional<int64_t> context_length;
  if (args.context_length_opt->count()) context_length = args.context_length;
  write_jsonl(std::cout, model, draw_samples(model, args.n, args.seed, context_length));
  std::cout.flush();
  return kExitOk;
}

}  // namespace

void add_sample_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<SampleArgs>();
  CLI::App* cmd = app.add_subcommand("sample", "Draw observations from a saved model");
  cmd->footer(
      "Prints one JSON object per line, in the data-file format that fit, score and predict read. "
      "The same "
      "--seed always gives the same rows.");
  add_model_flag(cmd, args->model);
  cmd->add_option("-n,--n", args->n, "Number of observations")
      ->required()
      ->check(kNonNegative);
  cmd->add_option("--seed", args->seed, "Random seed")->required();
  args->context_length_opt =
      cmd->add_option("--context-length", args->context_length,
                      "Context length N (chained and variational multi-hop attention: default "
                      "6; responsibility and variational embedding attention: must equal the "
                      "model's N; not accepted for models whose rows have no context length)")
          ->check(kPositive);
  cmd->callback([args, &exit_code] { exit_code = run_sample(*args); });
}

}  // namespace attnmix::cli
