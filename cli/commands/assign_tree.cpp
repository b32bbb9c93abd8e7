// SPDX-License-Identifier: Apache-2.0
// `attnmix assign-tree`: the assignment-tree experiment of seed 004 (docs/mechanisms.md#assignment-tree-attention).
// Runs run_assignment_tree_experiment with progress lines on stderr, writes the results document
// atomically (2-space indentation, keys in the documented order), prints it on stdout and then a readable
// verdict for each prediction. The retrieval comparison is reported, not judged
// (docs/mechanisms.md#assignment-tree-attention:
// attnmix reports the numbers and does not carry the seed's label).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>

#include "attnmix/assign/experiment.hpp"
#include "attnmix/core/atomic_file.hpp"
#include "cli_support.hpp"
#include "number_checks.hpp"
#include "commands/commands.hpp"

namespace attnmix::cli {

namespace {

using assign::AssignmentTreeExperimentResult;

// The thresholds of the verdicts (docs/mechanisms.md#assignment-tree-attention, AT-4 … AT-7).
constexpr double kSlopeTolerance = 0.06;      // AT-4: |observed − (−0.5)| ≤ 0.06
constexpr double kOccupancyTolerance = 0.05;  // AT-5: |observed − predicted| / predicted ≤ 5 %
constexpr double kKeyMarginalTolerance = 1e-12;  // AT-7: key error = 1/n − 1/(n+1)

struct AssignTreeArgs {
  std::string out = "results.json";
  uint64_t seed = 1234;
  int n_threads = 0;
};

std::string fixed(double x, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}

std::string verdict(bool holds) { return holds ? "holds" : "DOES NOT HOLD"; }

/// One progress line on stderr when the stage changes and at every further tenth of the whole run
/// (the experiment reports the fraction of all its samples done). The lock keeps lines whole should
/// a report ever come from a worker thread.
class ProgressPrinter {
 public:
  void operator()(const std::string& stage, double fraction) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (stage == "done") return;  // run_assign_tree prints the closing line
    const int tenth = static_cast<int>(std::floor(std::clamp(fraction, 0.0, 1.0) * 10.0));
    if (stage == stage_ && tenth <= tenth_) return;
    stage_ = stage;
    tenth_ = tenth;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::cerr << "assign-tree: " << fixed(100.0 * std::clamp(fraction, 0.0, 1.0), 0) << " % done, "
              << stage << " (" << format_seconds(seconds) << " s)\n"
              << std::flush;
  }

 private:
  std::mutex mutex_;
  std::string stage_;
  int tenth_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// The readable verdicts, one block per prediction, after the JSON document.
void print_verdicts(std::ostream& out, const AssignmentTreeExperimentResult& r) {
  const auto nq = static_cast<double>(r.n_queries);
  out << "\nVerdicts (thresholds: RMSE slope within " << format_short(kSlopeTolerance)
      << " of -0.5; union occupancy within " << format_short(100.0 * kOccupancyTolerance)
      << " % of the prediction at every K;\nkey error 1/n - 1/(n+1) to within "
      << format_short(kKeyMarginalTolerance)
      << " and 0 < row error <= 1/(n+1); prediction 3 strict; tree edge count exact)\n";

  // Prediction 1: Monte-Carlo RMSE O(K^-1/2).
  const double slope_gap = std::abs(r.rmse_slope_observed - r.rmse_slope_predicted);
  out << "  Prediction 1, Monte-Carlo error O(K^-1/2): " << verdict(slope_gap <= kSlopeTolerance)
      << "\n    RMSE slope in log K " << fixed(r.rmse_slope_observed, 4) << ", predicted "
      << format_short(r.rmse_slope_predicted) << " (difference " << fixed(slope_gap, 4)
      << ", allowed " << format_short(kSlopeTolerance) << ")\n";

  // Prediction 2: union occupancy against the independent-occupancy formula.
  double worst = 0.0;
  const assign::UnionEdges* worst_at = nullptr;
  for (const assign::UnionEdges& u : r.union_edges) {
    const double deviation = u.predicted > 0.0 ? std::abs(u.observed - u.predicted) / u.predicted
                                               : std::numeric_limits<double>::infinity();
    if (worst_at == nullptr || deviation > worst) {
      worst = deviation;
      worst_at = &u;
    }
  }
  out << "  Prediction 2, union occupancy: " << verdict(worst_at && worst <= kOccupancyTolerance)
      << "\n    non-zero entries, observed against predicted: largest relative deviation "
      << fixed(100.0 * worst, 1) << " %";
  if (worst_at != nullptr)
    out << " at K = " << worst_at->K << "\n    (" << fixed(worst_at->observed, 2) << " observed, "
        << fixed(worst_at->predicted, 2) << " predicted)";
  out << ", allowed " << format_short(100.0 * kOccupancyTolerance) << " %\n";

  // Prediction 3: the frequency bias aligns probabilities with frequencies.
  out << "  Prediction 3, the bias aligns attention with frequency: "
      << verdict(r.corr_alpha1 > r.corr_alpha0)
      << "\n    corr(log(1e-6 + f), p) over the tree edges " << fixed(r.corr_alpha0, 4)
      << " at alpha = 0, " << fixed(r.corr_alpha1, 4) << " at alpha = 1\n    (K = 128 tree; "
      << r.prediction_3_tree_zero_frequency_edges << " zero-frequency tree edges)\n";

  // Transport: key marginals exact, query marginals not.
  const bool key_exact =
      std::abs(r.transport_max_key_marginal_error - r.transport_max_key_marginal_error_expected) <=
      kKeyMarginalTolerance;
  const bool row_positive =
      r.transport_max_row_marginal_error > 0.0 && r.transport_max_row_marginal_error <= 1.0 / nq;
  out << "  Transport check, T = freq / " << r.n_queries << ": "
      << verdict(key_exact && row_positive)
      << "\n    key (column) marginals are exact: every sample matches every key once, so the\n"
         "    key error "
      << fixed(r.transport_max_key_marginal_error, 9) << " is 1/" << r.n_keys << " - 1/"
      << r.n_queries << " = " << fixed(r.transport_max_key_marginal_error_expected, 9) << " ("
      << (key_exact ? "equal" : "NOT equal") << ")\n    query (row) marginals are not: one query "
      << "is unmatched in every sample;\n    row error "
      << fixed(r.transport_max_row_marginal_error, 9)
      << (row_positive ? " > 0" : " (expected in (0, 1/" + std::to_string(r.n_queries) + "])")
      << "\n";

  // The spanning tree.
  const bool tree_ok = r.tree_edges_observed == r.tree_edges_expected &&
                       r.tree_edges_K16_mean == static_cast<double>(r.tree_edges_expected);
  out << "  Tree edges: " << verdict(tree_ok) << "\n    " << r.tree_edges_observed << " observed, "
      << r.tree_edges_expected << " expected (" << r.n_queries << " + " << r.n_keys
      << " - 1); mean over the K = 16 retrieval trees " << format_short(r.tree_edges_K16_mean)
      << "\n";

  // Retrieval: reported, not judged.
  const double change =
      r.dense_retrieval_mse > 0.0
          ? (r.tree_sparse_retrieval_mse - r.dense_retrieval_mse) / r.dense_retrieval_mse
          : 0.0;
  out << "  Retrieval, dense vs tree-sparse attention (reported, no prediction):\n"
      << "    MSE dense " << fixed(r.dense_retrieval_mse, 4) << ", tree-sparse "
      << fixed(r.tree_sparse_retrieval_mse, 4) << " (tree-sparse "
      << fixed(100.0 * std::abs(change), 1) << (change <= 0.0 ? " % lower" : " % higher") << ")\n"
      << "    repaired query rows " << r.retrieval_repaired_query_rows_total << " (in "
      << r.retrieval_trials_with_repair << " trials); zero-frequency tree edges "
      << r.retrieval_zero_frequency_tree_edges_total << " (excluded from the support)\n"
      << "    raw_union_edges_K16_mean " << format_short(r.raw_union_edges_K16_mean, 4)
      << " is the prediction-1 union at K = 16 on the first cost matrix;\n"
         "    it is not like-for-like with tree_edges_K16_mean (the retrieval trees)\n";
}

/// The results' matrices, written to --out but not printed.
constexpr const char* kUnprintedKeys[] = {"prediction_3_frequencies", "prediction_3_tree_edges"};

int run_assign_tree(const AssignTreeArgs& args) {
  check_output_path(args.out, "the results");
  std::cerr << "assign-tree: seed " << args.seed << ", results to " << args.out << "\n";
  ProgressPrinter progress;
  const auto start = std::chrono::steady_clock::now();
  const AssignmentTreeExperimentResult result = assign::run_assignment_tree_experiment(
      args.seed, capped_threads(args.n_threads),
      [&progress](const std::string& stage, double fraction) { progress(stage, fraction); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto document = result.to_json();
  attnmix::write_file_atomically(args.out, document.dump(2) + "\n", "the results");
  std::cerr << "assign-tree: done in " << format_seconds(seconds) << " s; wrote " << args.out
            << "\n"
            << std::flush;
  for (const char* matrix : kUnprintedKeys) document.erase(matrix);
  std::cout << document.dump(2) << "\n"
            << "(prediction 3's frequency matrix and spanning tree are in " << args.out
            << "; attnmix plot --assign-tree " << args.out << " --out DIR draws them)\n";
  print_verdicts(std::cout, result);
  std::cout.flush();
  return kExitOk;
}

}  // namespace

void add_assign_tree_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<AssignTreeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "assign-tree",
      "The assignment-tree experiment: perturb-and-MAP assignment "
      "frequencies, their spanning tree, and tree-sparse attention");
  cmd->footer(
      "Runs the three predictions, the transport check and the retrieval comparison of the "
      "experiment (docs/mechanisms.md#assignment-tree-attention; a few seconds), writes the results "
      "document atomically to --out (JSON, keys in a fixed order), prints it on stdout (without prediction "
      "3's frequency matrix and tree edges) followed by a verdict for each prediction. Progress lines go to stderr. Results do not depend on --threads.\n"
      "Exit codes: 0 ok (whatever the verdicts), 1 usage, 2 I/O error (nothing is written).");
  cmd->add_option("--out", args->out, "Where to write the results document (JSON)")
      ->type_name("FILE")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed,
                  "SEED of the experiment (the base stream and the per-K "
                  "repetition streams)")
      ->capture_default_str();
  cmd->add_option("--threads", args->n_threads,
                  "Threads for the frequency estimates (0 = all cores)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->callback([args, &exit_code] { exit_code = run_assign_tree(*args); });
}

}  // namespace attnmix::cli
