// SPDX-License-Identifier: Apache-2.0
// Demo section: responsibility attention on the recall task of docs/mechanisms.md#responsibility-attention (4000 train
// / 1500 test rows, seed 2, σ² = 0.5, at most 40 EM iterations). Reports test accuracy against the
// position-only baseline and how many of the 16 symbols had their key and emission recovered.
#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>

#include "attnmix/attention/recall_task.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/progress.hpp"
#include "cli_support.hpp"
#include "commands/demo_sections.hpp"

namespace attnmix::cli {

namespace {

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %%", 100.0 * fraction);
  return buf;
}

}  // namespace

void demo_responsibility_attention(std::ostream& out, DemoFigures* figures) {
  constexpr uint64_t kSeed = 2;
  const RecallTaskOptions
      task_options;  // S = N-from-the-spec defaults: 16 symbols, 6 positions, D = T = 16
  const RecallTask task = make_recall_task(4000, 1500, kSeed, task_options);
  const int64_t S = task_options.n_symbols;
  out << "The task: every context holds " << task_options.context_length
      << " distinct symbols out of " << S
      << ". The query is a noisy one-hot code of one\n"
         "of them (the attended position, chosen uniformly); the target is f(that symbol) for a "
         "fixed\n"
         "permutation f. To answer, a model has to find the context position the query points at, "
         "which is\n"
         "attention. Responsibility attention learns a key per symbol (K), a target table per "
         "symbol (B) and a\n"
         "position prior (π) by EM, from "
      << task.train.n_rows() << " training rows; σ² = 0.5, at most 40 iterations.\n\n";

  ResponsibilityAttentionEstimatorOptions estimator_options;
  estimator_options.sigma2 = 0.5;
  const ResponsibilityAttentionEstimator estimator(S, task_options.context_length,
                                                   task_options.query_dim, task_options.n_targets,
                                                   estimator_options);
  OptimizeOptions options;
  options.max_its = 40;
  options.seed = kSeed;
  options.on_iteration = [&out](const IterationReport& report) {
    std::string line = format_progress_line(report);
    line.pop_back();
    out << line << " (" << format_seconds(report.seconds) << " s)\n" << std::flush;
  };
  const auto start = std::chrono::steady_clock::now();
  const auto fit = optimize(task.train, estimator, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const ResponsibilityAttention& model = fit.model;
  if (figures) figures->add("responsibility", AnyDistribution(model), AnyBatch(task.test));
  const IdVector targets = task.test.targets();
  const double acc = accuracy(model.predict_proba(task.test), targets);
  const double baseline = accuracy(predict_position_only(model, task.test), targets);
  int keys_found = 0, emissions_found = 0;
  for (Index s = 0; s < S; ++s) {
    Index best_d = 0, best_t = 0;
    model.params().key_means.row(s).maxCoeff(&best_d);
    model.params().emission.row(s).maxCoeff(&best_t);
    keys_found += best_d == s ? 1 : 0;
    emissions_found += best_t == task.target_of_symbol[static_cast<size_t>(s)] ? 1 : 0;
  }
  out << "\nWhat it learned (on " << task.test.n_rows() << " held-out test rows):\n"
      << "  test accuracy            " << percent(acc) << "\n"
      << "  position-only baseline   " << percent(baseline)
      << "  (the same model ignoring the query: argmax_t Σ_i π_i B[c_i, t])\n"
      << "  keys recovered           " << keys_found << "/" << S
      << " symbols  (argmax_d K[s] = s: each key points at its symbol's code)\n"
      << "  targets recovered        " << emissions_found << "/" << S
      << " symbols  (argmax_t B[s] = f(s))\n"
      << "  EM                       " << fit.n_iterations << " iterations, "
      << (fit.status == OptimizeStatus::kConverged ? "converged" : "stopped at the iteration limit")
      << ", " << format_short(seconds, 3) << " s\n";
}

}  // namespace attnmix::cli
