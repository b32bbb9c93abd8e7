// SPDX-License-Identifier: Apache-2.0
// `attnmix predict`: p(target | context, query) under a saved model. Per row prints the argmax
// target and its probability (tab-separated) or, with --proba, the whole predictive row; prints the
// accuracy, the log loss −(1/n) Σ_n ln p(t_n | input_n) and the perplexity exp(log loss) on stderr when the rows
// carry targets. Rows are predicted in blocks of at most AnyDistribution::kPredictBlockCells
// probabilities, so a text model over tens of thousands of words predicts any number of rows in bounded memory.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>

#include "cli_support.hpp"
#include "commands/commands.hpp"
#include "model_data.hpp"

namespace attnmix::cli {

namespace {

struct PredictArgs {
  std::string model;
  ModelInput input;
  bool proba = false;
};

int run_predict(const PredictArgs& args) {
  const AnyDistribution model = read_saved_model(args.model);
  if (!model.predicts())
    throw ValueError(args.model + ": a " + model.family() +
                     " model has no predictive distribution p(target | input) to predict with (the attention "
                     "families have one); 'attnmix score' gives the rows' log-density under it");
  const ModelData data = read_model_input(model, args.model, args.input, TargetPolicy::kOptional);
  const Index n_rows = data.batch.n_rows();
  Index correct = 0;
  double loss = 0.0;  // Σ_n −ln p(t_n | input_n), in row order
  Index block = 1;  // one row first, which gives T; then as many rows as kPredictBlockCells holds
  for (Index begin = 0, count = 0; begin < n_rows; begin += count) {
    count = std::min(block, n_rows - begin);
    const Matrix proba = model.predict_proba(data.batch.slice(begin, count));  // [count, T]
    block = std::max<Index>(1, AnyDistribution::kPredictBlockCells / std::max<Index>(1, proba.cols()));
    for (Index row = 0; row < proba.rows(); ++row) {
      Index best = 0;
      const double p = proba.row(row).maxCoeff(&best);
      if (data.has_targets) {
        const Index target = data.targets[begin + row];
        if (best == target) ++correct;
        loss -= std::log(proba(row, target));
      }
      if (args.proba) {
        for (Index t = 0; t < proba.cols(); ++t)
          std::cout << (t ? " " : "") << format_double(proba(row, t));
        std::cout << '\n';
      } else {
        std::cout << best << '\t' << format_double(p) << '\n';
      }
    }
  }
  std::cout.flush();
  if (data.has_targets) {
    const double log_loss = n_rows > 0 ? loss / static_cast<double>(n_rows) : 0.0;
    std::cerr << "accuracy=" << format_double(static_cast<double>(correct) / static_cast<double>(n_rows)) << " ("
              << correct << "/" << n_rows << " rows) log_loss=" << format_double(log_loss)
              << " perplexity=" << format_double(std::exp(log_loss)) << "\n";
  }
  return kExitOk;
}

}  // namespace

void add_predict_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<PredictArgs>();
  CLI::App* cmd = app.add_subcommand("predict", "Predict targets with a saved model");
  cmd->footer(
      "Prints, per row, the most probable target and its probability separated by a tab (with "
      "--proba: all T "
      "probabilities, space-separated). When the rows carry targets, 'accuracy=A (k/n rows) log_loss=L "
      "perplexity=P' goes to stderr: L is the mean of −ln p(target | input) over the rows (natural log; inf when "
      "some row's target has probability 0) and P = exp(L), the number of equally likely targets that would give "
      "the same loss. "
      "The target field is optional here, but either every row has one or none does. --text reads a corpus as "
      "score --text does (the target of each row is its next token).");
  add_model_flag(cmd, args->model);
  add_input_flags(cmd, args->input, "Data: JSON Lines or .npz");
  cmd->add_flag("--proba", args->proba, "Print the whole predictive distribution of each row");
  cmd->callback([args, &exit_code] { exit_code = run_predict(*args); });
}

}  // namespace attnmix::cli
