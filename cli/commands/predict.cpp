// SPDX-License-Identifier: Apache-2.0
// `attnmix predict`: p(target | context, query) under a saved model. Per row prints the argmax
// target and its probability (tab-separated) or, with --proba, the whole predictive row; prints the
// accuracy on stderr when the rows carry targets.
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
  const Matrix proba = model.predict_proba(data.batch);  // [n, T]
  Index correct = 0;
  for (Index row = 0; row < proba.rows(); ++row) {
    Index best = 0;
    const double p = proba.row(row).maxCoeff(&best);
    if (data.has_targets && best == data.targets[row]) ++correct;
    if (args.proba) {
      for (Index t = 0; t < proba.cols(); ++t)
        std::cout << (t ? " " : "") << format_double(proba(row, t));
      std::cout << '\n';
    } else {
      std::cout << best << '\t' << format_double(p) << '\n';
    }
  }
  std::cout.flush();
  if (data.has_targets)
    std::cerr << "accuracy="
              << format_double(static_cast<double>(correct) / static_cast<double>(proba.rows()))
              << " (" << correct << "/" << proba.rows() << " rows)\n";
  return kExitOk;
}

}  // namespace

void add_predict_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<PredictArgs>();
  CLI::App* cmd = app.add_subcommand("predict", "Predict targets with a saved model");
  cmd->footer(
      "Prints, per row, the most probable target and its probability separated by a tab (with "
      "--proba: all T "
      "probabilities, space-separated). When the rows carry targets, 'accuracy=A (k/n rows)' goes "
      "to stderr. "
      "The target field is optional here, but either every row has one or none does. --text reads a corpus as "
      "score --text does (the target of each row is its next token).");
  add_model_flag(cmd, args->model);
  add_input_flags(cmd, args->input, "Data: JSON Lines or .npz");
  cmd->add_flag("--proba", args->proba, "Print the whole predictive distribution of each row");
  cmd->callback([args, &exit_code] { exit_code = run_predict(*args); });
}

}  // namespace attnmix::cli
