// SPDX-License-Identifier: Apache-2.0
/// @file recall_task.hpp
/// The synthetic content-recall task, used by the acceptance tests, `attnmix demo` and the
/// benchmarks, and its position-only baseline.
///
/// Each context holds N distinct symbols of [S]; the attended position z is uniform; the query is
/// one_hot(c_z) + noise·N(0, I) (D = S), or, when D ≠ S, a fixed random code of c_z plus noise; the target is
/// f(c_z) for a fixed permutation f (T = S) or a fixed random map (T ≠ S).
/// Baseline: argmax_t Σ_i π_i B[c_i, t] — the fitted emission and position prior without the query.
#pragma once

#include <cstdint>
#include <vector>

#include "attnmix/attention/responsibility.hpp"

namespace attnmix {

struct RecallTaskOptions {
  int64_t n_symbols = 16;      // S
  int64_t context_length = 6;  // N
  int64_t query_dim = 16;      // D
  int64_t n_targets = 16;      // T
  double noise = 0.3;
};

struct RecallTask {
  ResponsibilityAttentionBatch train;
  ResponsibilityAttentionBatch test;
  std::vector<int64_t> target_of_symbol;  // f: [S] → [T]
  Matrix symbol_codes;                    // [S, D]: the noiseless query of each symbol
};

/// @throws ValueError when N > S (contexts hold distinct symbols).
[[nodiscard]] RecallTask make_recall_task(Index n_train, Index n_test, uint64_t seed,
                                          const RecallTaskOptions& options = {});

/// p(t | c) = Σ_i π_i B[c_i, t] [n, T]: the model's prediction when it ignores the query.
[[nodiscard]] Matrix predict_position_only(const ResponsibilityAttention& model,
                                           const ResponsibilityAttentionBatch& batch);

/// Fraction of rows whose argmax column equals the target.
[[nodiscard]] double accuracy(const Matrix& proba, const IdVector& targets);

}  // namespace attnmix
