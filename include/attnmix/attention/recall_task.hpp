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

/// The sizes and the query noise of the recall task (make_recall_task()).
struct RecallTaskOptions {
  /// S, the number of symbols (positive; default 16).
  int64_t n_symbols = 16;      // S
  /// N, the context length (positive and at most S, since a context holds distinct symbols; default 6).
  int64_t context_length = 6;  // N
  /// D, the query dimension (positive; default 16). With D = S the noiseless queries are one-hot codes.
  int64_t query_dim = 16;      // D
  /// T, the number of targets (positive; default 16). With T = S the target map is a permutation.
  int64_t n_targets = 16;      // T
  /// The standard deviation of the Gaussian noise added to every query coordinate (default 0.3).
  double noise = 0.3;
};

/// A drawn recall task: training and test rows of one task definition, and that definition.
struct RecallTask {
  /// The n_train training rows, with declared S, N, D and T.
  ResponsibilityAttentionBatch train;
  /// The n_test test rows, drawn after the training rows from the same stream.
  ResponsibilityAttentionBatch test;
  /// The target map f [S], values in [0, T): a random permutation when T = S, independent uniform draws otherwise.
  std::vector<int64_t> target_of_symbol;  // f: [S] → [T]
  /// The noiseless query of each symbol [S, D]: the identity when D = S, standard normal draws otherwise.
  Matrix symbol_codes;                    // [S, D]: the noiseless query of each symbol
};

/// Draws a recall task from one stream seeded by derive_seed(seed, kData, 0), in this order: the target map, the symbol
/// codes (only when D ≠ S), the n_train training rows, then the n_test test rows. Each row draws N distinct context
/// symbols, a uniform position z and the query noise; its target is f(c_z).
/// @throws ValueError when N > S (contexts hold distinct symbols).
/// @throws ValueError when a size of `options` is not positive, or n_train or n_test is negative.
[[nodiscard]] RecallTask make_recall_task(Index n_train, Index n_test, uint64_t seed,
                                          const RecallTaskOptions& options = {});

/// p(t | c) = Σ_i π_i B[c_i, t] [n, T]: the model's prediction when it ignores the query.
/// The batch must have the model's context length and ids in its range; this is not checked. O(N·T) per row.
[[nodiscard]] Matrix predict_position_only(const ResponsibilityAttention& model,
                                           const ResponsibilityAttentionBatch& batch);

/// Fraction of rows whose argmax column equals the target.
/// Ties go to the lowest column, and a matrix without rows gives 0. @throws ValueError unless targets has one entry per
/// row of proba.
[[nodiscard]] double accuracy(const Matrix& proba, const IdVector& targets);

}  // namespace attnmix
