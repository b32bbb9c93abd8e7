// SPDX-License-Identifier: Apache-2.0
// Fit one responsibility-attention head by EM on the recall task and inspect what it learned.
// Referenced from include/attnmix/attention/responsibility.hpp; compiled in CI.
#include <cstdio>

#include "attnmix/attention/recall_task.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/inference/optimize.hpp"

int main() {
  using namespace attnmix;
  const RecallTask task = make_recall_task(/*n_train=*/2000, /*n_test=*/500, /*seed=*/1);
  ResponsibilityAttentionEstimatorOptions est;
  est.sigma2 = 0.5;
  OptimizeOptions options;
  options.max_its = 30;
  options.on_iteration = [](const IterationReport& r) { std::fputs(format_progress_line(r).c_str(), stdout); };
  const auto fit = optimize(task.train, ResponsibilityAttentionEstimator(16, 6, 16, 16, est), options);
  const double acc = accuracy(fit.model.predict_proba(task.test), task.test.targets());
  std::printf("test accuracy %.3f after %d iterations\n", acc, fit.n_iterations);
  return acc > 0.5 ? 0 : 1;
}
