// SPDX-License-Identifier: Apache-2.0
// Demo section: chained attention on the transitive-lookup task of docs/mechanisms.md#chained-attention (S = 30, 5
// pairs, N = 10, 2000 train / 2000 test rows, σ² = 0.1, 12 EM iterations, delta none). Fits one hop and
// two hops with the same settings and compares their test accuracy and time.
#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/recall_task.hpp"
#include "attnmix/attention/transitive_task.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/progress.hpp"
#include "cli_support.hpp"
#include "commands/demo_sections.hpp"

namespace attnmix::cli {

namespace {

constexpr uint64_t kSeed = 1;
constexpr Index kRows = 2000;  // train and test each
constexpr int kIterations = 12;

struct HopResult {
  double accuracy = 0.0;
  double seconds = 0.0;
  AnyDistribution model;
};

HopResult fit_hops(std::ostream& out, int64_t n_hops, const ChainedAttentionBatch& train,
                   const ChainedAttentionBatch& test, const TransitiveTaskOptions& task) {
  ChainedAttentionEstimatorOptions estimator_options;
  estimator_options.sigma2 = 0.1;
  const ChainedAttentionEstimator estimator(n_hops, task.n_symbols, task.n_symbols,
                                            estimator_options);
  OptimizeOptions options;
  options.max_its = kIterations;
  options.delta = std::nullopt;  // generalised EM (docs/mechanisms.md#chained-attention): run every iteration
  options.seed = kSeed;
  options.print_iter = 4;
  options.on_iteration = [&out](const IterationReport& report) {
    std::string line = format_progress_line(report);
    line.pop_back();
    out << "  " << line << " (" << format_seconds(report.seconds) << " s)\n" << std::flush;
  };
  out << (n_hops == 1 ? "One hop" : "Two hops") << " (L = " << n_hops << "):\n";
  const auto start = std::chrono::steady_clock::now();
  const auto fit = optimize(train, estimator, options);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {accuracy(fit.model.predict_proba(test), test.targets()), seconds, AnyDistribution(fit.model)};
}

std::string fixed3(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", x);
  return buf;
}

}  // namespace

void demo_chained_attention(std::ostream& out, DemoFigures* figures) {
  const TransitiveTaskOptions task;  // S = 30 symbols, M = 5 pairs, so N = 10 positions
  const int64_t M = task.n_pairs;
  const ChainedAttentionBatch train = make_transitive_task(kRows, kSeed, task);
  const ChainedAttentionBatch test = make_transitive_task(kRows, kSeed + 1, task);
  out << "The task: each context holds " << 2 * M << " key -> value pairs over " << task.n_symbols
      << " symbols: a_i -> b_i and b_j -> c_j for\n"
         "i, j = 1.."
      << M
      << ", all distinct. The query is some a_i and the target is the c reached by following\n"
         "a_i -> b_i -> c: two lookups, the second keyed by the value the first one found. "
         "Chained attention\n"
         "stacks L hops, each hop's query being the value the previous hop attended to, and fits "
         "the key\n"
         "tables and the value -> target table by forward-backward EM: "
      << kRows << " training rows, " << kRows << " test rows,\nσ² = 0.1, " << kIterations
      << " iterations each.\n\n";
  const HopResult one = fit_hops(out, 1, train, test, task);
  const HopResult two = fit_hops(out, 2, train, test, task);
  if (figures) figures->add("chained", two.model, AnyBatch(test));
  out << "\nTest accuracy (on " << test.n_rows() << " held-out rows; chance is about 1/" << 2 * M
      << " = " << fixed3(1.0 / static_cast<double>(2 * M)) << "):\n"
      << "  one hop  (L = 1)   " << fixed3(one.accuracy) << "   fitted in "
      << format_short(one.seconds, 3) << " s\n"
      << "  two hops (L = 2)   " << fixed3(two.accuracy) << "   fitted in "
      << format_short(two.seconds, 3) << " s\n"
      << "Why one hop fails: a single hop can only return the value stored under the query's "
         "key (b_i),\n"
         "while the target is the value stored under b_i; reaching it needs a second lookup "
         "keyed by b_i.\n";
}

}  // namespace attnmix::cli
