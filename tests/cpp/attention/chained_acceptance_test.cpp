// SPDX-License-Identifier: Apache-2.0
// Chained-attention acceptance row of docs/mechanisms.md#chained-attention that fits models (label: slow).
#include <gtest/gtest.h>

#include <iostream>
#include <optional>
#include <string>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/transitive_task.hpp"
#include "attnmix/inference/optimize.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

/// Fraction of rows whose argmax_t predict_proba equals the target.
double accuracy_of(const ChainedAttention& model, const ChainedAttentionBatch& batch) {
  const Matrix proba = model.predict_proba(batch);
  double hits = 0.0;
  for (Index n = 0; n < batch.n_rows(); ++n) {
    Index best = 0;
    proba.row(n).maxCoeff(&best);
    hits += best == batch.target(n) ? 1.0 : 0.0;
  }
  return hits / static_cast<double>(batch.n_rows());
}

/// CA-4: transitive lookup (S = 30, 5 pairs, N = 10), 2000 train / 2000 test rows from different seeds, σ² 0.1,
/// 12 iterations, delta = None: the two-hop model answers a → b → c (accuracy > 0.8), a one-hop model cannot
/// (accuracy < 0.2), and the gap exceeds 0.5. Reference: 0.8975 vs 0.1505.
TEST(ChainedAttentionAcceptanceTest, TwoHopsSolveTransitiveLookup) {
  const uint64_t seed = testing::test_seed(7);
  const TransitiveTaskOptions task;  // S = 30, M = 5 pairs
  const ChainedAttentionBatch train = make_transitive_task(2000, seed, task);
  const ChainedAttentionBatch test = make_transitive_task(2000, seed + 1, task);
  ASSERT_EQ(train.context_length(), 10);
  OptimizeOptions options;
  options.max_its = 12;
  options.delta = std::nullopt;
  options.seed = seed;
  ChainedAttentionEstimatorOptions est;
  est.sigma2 = 0.1;
  const auto two_hop = optimize(train, ChainedAttentionEstimator(2, task.n_symbols, task.n_symbols, est), options);
  const auto one_hop = optimize(train, ChainedAttentionEstimator(1, task.n_symbols, task.n_symbols, est), options);
  EXPECT_EQ(two_hop.n_iterations, 12);
  EXPECT_EQ(one_hop.n_iterations, 12);
  const double acc2 = accuracy_of(two_hop.model, test);
  const double acc1 = accuracy_of(one_hop.model, test);
  RecordProperty("two_hop_accuracy", std::to_string(acc2));
  RecordProperty("one_hop_accuracy", std::to_string(acc1));
  std::cout << "[ CA-4 ] seed " << seed << ": two-hop accuracy " << acc2 << ", one-hop accuracy " << acc1
            << " (reference 0.8975 vs 0.1505)\n";
  EXPECT_GT(acc2, 0.8) << "seed " << seed;
  EXPECT_LT(acc1, 0.2) << "seed " << seed;
  EXPECT_GT(acc2 - acc1, 0.5) << "seed " << seed;
}

}  // namespace
}  // namespace attnmix
