// SPDX-License-Identifier: Apache-2.0
/// @file experiment.hpp
/// The assignment-tree experiment (`docs/mechanisms.md#assignment-tree-attention`): three predictions, the transport
/// check and the retrieval comparison, with attnmix random streams (matching mixle statistically, not bitwise).
/// Cost: dominated by the 100 000-sample reference frequency estimate and ~14 000 further samples of a 16 × 15 LAP.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnmix/assign/assignment_tree.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix::assign {

struct UnionEdges {
  int64_t K = 0;
  double observed = 0.0;
  double predicted = 0.0;
};

/// Every field of results.json (`docs/mechanisms.md#assignment-tree-attention`), in file order.
struct AssignmentTreeExperimentResult {
  uint64_t seed = 1234;
  Index n_queries = 16, n_keys = 15;
  double tau = 1.7;
  double rmse_slope_predicted = -0.5;
  double rmse_slope_observed = 0.0;
  std::map<int64_t, double> rmse;  // by K
  std::vector<UnionEdges> union_edges;
  double corr_alpha0 = 0.0, corr_alpha1 = 0.0;
  double transport_max_row_marginal_error = 0.0, transport_max_key_marginal_error = 0.0;
  Index tree_edges_expected = 30, tree_edges_observed = 0;
  double dense_retrieval_mse = 0.0, tree_sparse_retrieval_mse = 0.0;
  double tree_edges_K16_mean = 0.0, raw_union_edges_K16_mean = 0.0;
  // attnmix additions
  double transport_max_key_marginal_error_expected = 0.0;
  Index prediction_3_tree_zero_frequency_edges = 0;
  Index retrieval_zero_frequency_tree_edges_total = 0;
  Index retrieval_repaired_query_rows_total = 0;
  Index retrieval_trials_with_repair = 0;
  Matrix prediction_3_frequencies;  ///< prediction 3's matching frequencies (K = 128), queries × keys
  Mask prediction_3_tree;           ///< its maximum spanning tree

  /// The results document: keys in the order of the fields above.
  [[nodiscard]] nlohmann::ordered_json to_json() const;
};

/// Adds a frequency matrix and its tree to a results document as prediction_3_frequencies (one row per query) and
/// prediction_3_tree_edges ([query, key] pairs, row-major): what `attnmix plot --assign-tree` draws.
void add_tree_fields(nlohmann::ordered_json& doc, const Matrix& freq, const Mask& tree);

/// Runs the whole experiment on n_threads threads (0 = all); the result does not depend on the thread count, and two
/// runs with the same seed are bitwise identical. As in mixle, only base = Rng(seed) and prediction 1's streams
/// Rng(seed + 31K + r) follow the seed; the reference (Rng(999)), the K = 128 tree (Rng(777)) and the retrieval
/// trials (Rng(4000 + t), Rng(7000 + t)) use fixed seeds. progress(stage, fraction) is called on the calling thread
/// between stages and within long ones; stage is "reference", "prediction_1", "prediction_3", "retrieval" or "done",
/// and fraction ∈ [0, 1] is the non-decreasing share of all LAP samples done so far.
/// @throws ValueError when n_threads < 0.
[[nodiscard]] AssignmentTreeExperimentResult run_assignment_tree_experiment(
    uint64_t seed = 1234, int n_threads = 0, const std::function<void(const std::string&, double)>& progress = {});

}  // namespace attnmix::assign
