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

/// Prediction 2 at one sample count K: the number of distinct (query, key) pairs seen in K samples, observed and
/// predicted (`docs/mechanisms.md#assignment-tree-attention`).
struct UnionEdges {
  /// The number of samples K.
  int64_t K = 0;
  /// The number of pairs of nonzero frequency, averaged over prediction 1's repetitions at this K.
  double observed = 0.0;
  /// The independent-occupancy prediction Σ_{ref_ij > 1e-4} [1 − (1 − ref_ij)^K] from the reference frequencies.
  double predicted = 0.0;
};

/// Every field of results.json (`docs/mechanisms.md#assignment-tree-attention`), in file order.
struct AssignmentTreeExperimentResult {
  /// The seed the experiment ran with (`--seed`).
  uint64_t seed = 1234;
  /// @var n_queries
  /// The number of queries n_q = 16 (the first entry of "shape").
  /// @var n_keys
  /// The number of keys n_k = n = 15 (the second entry of "shape").
  Index n_queries = 16, n_keys = 15;
  /// The noise scale τ of the Gumbel perturbations.
  double tau = 1.7;
  /// Prediction 1: the predicted slope of log RMSE against log K, −0.5 (Monte-Carlo error O(K^−½)).
  double rmse_slope_predicted = -0.5;
  /// Prediction 1: the least-squares slope of log RMSE against log K observed over rmse.
  double rmse_slope_observed = 0.0;
  /// Prediction 1: the RMSE of frequency_estimate against the 100 000-sample reference, averaged over the
  /// repetitions, for each K in {4, 8, …, 512}.
  std::map<int64_t, double> rmse;  // by K
  /// Prediction 2: one entry per K of prediction 1, in increasing K.
  std::vector<UnionEdges> union_edges;
  /// @var corr_alpha0
  /// Prediction 3: the Pearson correlation over the K = 128 tree's edges between log(1e-6 + f) and the tree-sparse
  /// attention probability at α = 0.
  /// @var corr_alpha1
  /// The same at α = 1 (prediction 3 holds when it is strictly larger than corr_alpha0).
  double corr_alpha0 = 0.0, corr_alpha1 = 0.0;
  /// @var transport_max_row_marginal_error
  /// The transport check on T = f / (n + 1) (f: the K = 128 frequencies): the largest deviation of a row (query)
  /// sum of T from 1/(n + 1).
  /// @var transport_max_key_marginal_error
  /// The transport check: the largest deviation of a column (key) sum of T from 1/n.
  double transport_max_row_marginal_error = 0.0, transport_max_key_marginal_error = 0.0;
  /// @var tree_edges_expected
  /// The edges a spanning tree must have: n_q + n_k − 1 = 30.
  /// @var tree_edges_observed
  /// The edges of the K = 128 tree.
  Index tree_edges_expected = 30, tree_edges_observed = 0;
  /// @var dense_retrieval_mse
  /// Retrieval: the mean squared error of dense attention's output against the nearest keys' values, averaged
  /// over the 80 trials.
  /// @var tree_sparse_retrieval_mse
  /// Retrieval: the same for tree-sparse attention (K = 16, α = 0.5).
  double dense_retrieval_mse = 0.0, tree_sparse_retrieval_mse = 0.0;
  /// @var tree_edges_K16_mean
  /// Retrieval: the mean number of edges of the trials' K = 16 trees.
  /// @var raw_union_edges_K16_mean
  /// Prediction 1's mean number of distinct pairs at K = 16 on the first cost matrix (not like-for-like with
  /// tree_edges_K16_mean).
  double tree_edges_K16_mean = 0.0, raw_union_edges_K16_mean = 0.0;
  // attnmix additions
  /// The key error the transport check expects: 1/n − 1/(n + 1) = 1/240, from the division by n + 1.
  double transport_max_key_marginal_error_expected = 0.0;
  /// The edges of the K = 128 tree whose frequency is zero (added by kruskal_tree for connectivity).
  Index prediction_3_tree_zero_frequency_edges = 0;
  /// Retrieval: the zero-frequency tree edges, summed over the trials.
  Index retrieval_zero_frequency_tree_edges_total = 0;
  /// Retrieval: the query rows sparse_attention repaired, summed over the trials.
  Index retrieval_repaired_query_rows_total = 0;
  /// Retrieval: the trials with at least one repaired row.
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
