// SPDX-License-Identifier: Apache-2.0
/// @file assignment_tree.hpp
/// Assignment-tree attention (`docs/mechanisms.md#assignment-tree-attention`): perturb-and-MAP matchings of nq
/// queries to nk keys, their edge frequencies, a maximum spanning tree of the bipartite graph and attention on it.
///
///   sample:     σ = argmin_σ Σ_i (cost[i, σ(i)] + τ·g[i, σ(i)]),  g ~ Gumbel(0, 1) iid, one (nq, nk) table row-major
///   frequency:  freq = (1/K) Σ_k 1[σ_k],  every column sums to exactly 1 when nq ≥ nk
///   tree:       Kruskal maximum spanning tree on nq + nk nodes (query i = node i, key j = node nq + j)
///   attention:  logits q·kᵀ/√d + α·log(ε + f) on the tree support (−∞ elsewhere), softmax, p·v
/// The cost is a squared distance while the attention logits are dot products: that mixing of geometries is part
/// of the seed's design and is kept.
#pragma once

#include <cstdint>
#include <vector>

#include "attnmix/assign/lap.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix::assign {

/// A set of (query, key) edges as a boolean matrix [nq, nk], row-major: entry (i, j) is true for the edge between
/// query i and key j.
using Mask = Eigen::Matrix<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// One perturb-and-MAP sample: the (nq, nk) Gumbel table is drawn from rng row-major, scaled by tau and added to cost.
/// Each entry is −log(−log U), U = rng.uniform_open(), with the logs vectorised (so it may differ from rng.gumbel()
/// in the last bits; the draws consumed are the same). Sample k of frequency_estimate is the matching of the
/// (k mod 64)-th of consecutive assignment_sample calls on Rng(derive_seed(base, SeedPurpose::kSampler, k / 64))
/// (both are optimal for the same perturbed cost; they can differ only among tied optima, which have probability 0
/// when tau > 0).
/// Cost O(nq·nk) draws plus one linear_sum_assignment.
/// @throws ValueError unless tau is finite and ≥ 0; as linear_sum_assignment on NaN/−∞ costs or infeasibility.
[[nodiscard]] Assignment assignment_sample(const Matrix& cost, double tau, Rng& rng);

/// Mean of K assignment indicator matrices [nq, nk]. The samples are drawn in fixed blocks of 64 consecutive
/// samples, one stream per block: block b (samples 64b … 64b + 63) draws them in order from
/// Rng(derive_seed(base, SeedPurpose::kSampler, b)), with base = rng.next_u64() (one draw from rng). Blocks run in
/// parallel (n_threads, 0 = all) and the integer counts, hence the result, do not depend on the thread count
/// (docs/decisions/0004-assignment-sample-streams.md).
/// Each perturbed problem is solved warm-started from the column prices of the unperturbed one (a fixed function of
/// cost, so sample k still depends only on its own stream). Cost O(K·LAP), no allocation per sample.
/// @throws ValueError unless K ≥ 1, tau is finite and ≥ 0 and n_threads ≥ 0; on NaN/−∞ costs; when the +∞ pattern
/// of cost admits no complete matching.
[[nodiscard]] Matrix frequency_estimate(const Matrix& cost, double tau, int64_t K, Rng& rng, int n_threads = 0);

/// Maximum spanning tree of the complete bipartite graph weighted by score [nq, nk]. Edges in the order
/// (−score, i, nq + j); union-find with path halving, union sets parent[root(u)] = root(v); stops at nq + nk − 1
/// edges (zero-score edges are used when connectivity needs them). Cost O(nq·nk·log(nq·nk)).
/// @throws ValueError on non-finite scores or an empty side.
[[nodiscard]] Mask kruskal_tree(const Matrix& score);

/// The building blocks composed: freq = frequency_estimate(cost, tau, K, rng), tree = kruskal_tree(freq).
struct AssignmentTree {
  /// freq ⊙ tree [nq, nk]: the frequencies on the tree's edges, 0 elsewhere (sparse_attention's tree_freq).
  Matrix tree_freq;  // freq ⊙ tree
  /// The maximum spanning tree kruskal_tree(freq) [nq, nk]: nq + nk − 1 edges.
  Mask tree;
  /// The matching frequencies frequency_estimate(cost, tau, K, rng) [nq, nk], each in [0, 1].
  Matrix freq;
};
/// freq = frequency_estimate(cost, tau, K, rng, n_threads), tree = kruskal_tree(freq) and their product (see
/// AssignmentTree). Cost: the two steps' costs. @throws ValueError as frequency_estimate.
[[nodiscard]] AssignmentTree assignment_tree(const Matrix& cost, double tau, int64_t K, Rng& rng, int n_threads = 0);

/// Attention output [nq, dv] and probabilities [nq, nk].
struct AttentionResult {
  /// The output p·v [nq, dv].
  Matrix out;
  /// The attention probabilities [nq, nk]; each row sums to 1.
  Matrix p;
};

/// Standard softmax attention with logits q·kᵀ/√d. Cost O(nq·nk·(d + dv)).
[[nodiscard]] AttentionResult dense_attention(const Matrix& q, const Matrix& k, const Matrix& v);

/// Tree-sparse attention: support tree_freq > 0; a query row with empty support is repaired with
/// argmax_j tree_freq[i, j] (the first maximum); logits q·kᵀ/√d + alpha·log(eps + tree_freq) on the support, −∞ off
/// it; softmax; p·v. Cost O(nq·nk·(d + dv)).
struct SparseAttentionResult {
  /// The output p·v [nq, dv].
  Matrix out;
  /// The attention probabilities [nq, nk]: each row sums to 1 and is 0 off its support.
  Matrix p;
  /// The query rows whose support was empty and were repaired, in increasing order.
  std::vector<Index> repaired_rows;
};
/// @throws ValueError on shape mismatches, non-finite inputs, negative tree_freq or eps ≤ 0.
[[nodiscard]] SparseAttentionResult sparse_attention(const Matrix& q, const Matrix& k, const Matrix& v,
                                                     const Matrix& tree_freq, double alpha = 1.0, double eps = 1e-6);

/// Tree edges whose frequency is zero (they are not in sparse_attention's support).
[[nodiscard]] Index zero_frequency_tree_edges(const Mask& tree, const Matrix& freq);

}  // namespace attnmix::assign
