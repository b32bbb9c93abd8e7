// SPDX-License-Identifier: Apache-2.0
// `attnmix score`: the log-likelihood of every row of a data file under a saved model. Prints
// "rows=N total=X mean=Y" on stdout, or with --per-row one log-likelihood per line on stdout and
// the summary on stderr.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "attnmix/inference/reduce.hpp"
#include "attnmix/stats/log_math.hpp"
#include "cli_support.hpp"
#include "commands/commands.hpp"
#include "model_data.hpp"

namespace attnmix::cli {

namespace {

struct ScoreArgs {
  std::string model;
  ModelInput input;
  bool per_row = false;
};

int run_score(const ScoreArgs& args) {
  const AnyDistribution model = read_saved_model(args.model);
  const ModelData data = read_model_input(model, args.model, args.input, TargetPolicy::kRequired);
  std::vector<double> log_p(static_cast<size_t>(data.batch.n_rows()));
  parallel_log_density(model, data.batch, log_p, ParallelOptions{});
  const double total = pairwise_sum(log_p);
  const std::string summary = "rows=" + std::to_string(log_p.size()) +
                              " total=" + format_double(total) +
                              " mean=" + format_double(total / static_cast<double>(log_p.size()));
  if (args.per_row) {
    for (double x : log_p) std::cout << format_double(x) << '\n';
    std::cout.flush();
    std::cerr << summary << '\n';
  } else {
    std::cout << summary << '\n';
  }
  return kExitOk;
}

}  // namespace

void add_score_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ScoreArgs>();
  CLI::App* cmd = app.add_subcommand("score", "Log-likelihood of data under a saved model");
  cmd->footer(
      "Prints 'rows=N total=X mean=Y' (natural log) on stdout. With --per-row: one log-likelihood per row on "
      "stdout, in file order, and the summary on stderr. A row the model finds impossible scores -inf. Give --data "
      "rows or, for a model fitted to --text, a --text corpus: its rows are the fit's (token p + N given the N before "
      "it), read through the vocabulary the fit wrote next to the model (NAME.vocab.json for NAME.json); a token "
      "outside it is read as its <unk> entry, or is an error naming the file, line and token when it has none.");
  add_model_flag(cmd, args->model);
  add_input_flags(cmd, args->input, "Data: JSON Lines or .npz, rows with targets");
  cmd->add_flag("--per-row", args->per_row, "Print each row's log-likelihood");
  cmd->callback([args, &exit_code] { exit_code = run_score(*args); });
}

}  // namespace attnmix::cli
