// SPDX-License-Identifier: Apache-2.0
// Fit two chained attention hops by EM on the transitive-lookup task (a -> b -> c) and report the
// test accuracy. Referenced from include/attnmix/attention/chained.hpp; compiled in CI.
#include <cstdio>
#include <optional>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/recall_task.hpp"
#include "attnmix/attention/transitive_task.hpp"
#include "attnmix/inference/optimize.hpp"

int main() {
  using namespace attnmix;
  const TransitiveTaskOptions task;  // S = 30 symbols, 5 pairs: N = 10 positions
  const ChainedAttentionBatch train = make_transitive_task(/*n_rows=*/2000, /*seed=*/1, task);
  const ChainedAttentionBatch test = make_transitive_task(/*n_rows=*/1000, /*seed=*/2, task);
  ChainedAttentionEstimatorOptions est;
  est.sigma2 = 0.1;
  OptimizeOptions options;
  options.max_its = 12;
  options.delta = std::nullopt;  // generalised EM: run every iteration
  options.on_iteration = [](const IterationReport& r) { std::fputs(format_progress_line(r).c_str(), stdout); };
  const auto fit = optimize(train, ChainedAttentionEstimator(/*n_hops=*/2, task.n_symbols, task.n_symbols, est), options);
  const double acc = accuracy(fit.model.predict_proba(test), test.targets());
  std::printf("two-hop test accuracy %.3f after %d iterations\n", acc, fit.n_iterations);
  return acc > 0.5 ? 0 : 1;
}
