// SPDX-License-Identifier: Apache-2.0
// Demo section: assignment-tree attention (docs/mechanisms.md#assignment-tree-attention) on the 16 × 15 problem of the
// experiment (seed 1234, τ = 1.7). Estimates the matching frequencies from K = 128 perturb-and-MAP samples,
// builds their maximum spanning tree, and compares dense with tree-sparse attention on a few
// retrieval trials generated as in the experiment (docs/mechanisms.md#assignment-tree-attention). Runs in well under a
// second; the whole experiment is `attnmix assign-tree`.
#include <chrono>
#include <cstdio>
#include <ostream>
#include <string>

#include "attnmix/assign/assignment_tree.hpp"
#include "attnmix/assign/lap.hpp"
#include "attnmix/core/rng.hpp"
#include "cli_support.hpp"
#include "commands/demo_sections.hpp"

namespace attnmix::cli {

namespace {

constexpr Index kKeys = 15, kQueries = kKeys + 1, kDim = 8, kValueDim = 3;
constexpr double kTau = 1.7;
constexpr uint64_t kSeed = 1234;
constexpr int64_t kSamples = 128;      // the prediction-3 tree of the experiment
constexpr int64_t kTrialSamples = 16;  // per retrieval trial, as in the experiment
constexpr int kTrials = 20;            // the experiment runs 80
constexpr double kAlpha = 0.5;

Matrix normals(Rng& rng, Index rows, Index cols) {
  Matrix m(rows, cols);
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) m(i, j) = rng.normal();
  return m;
}

/// cost[i, j] = ||q_i − k_j||²   [nq, nk]
Matrix squared_distances(const Matrix& q, const Matrix& k) {
  Matrix cost(q.rows(), k.rows());
  for (Index i = 0; i < q.rows(); ++i)
    for (Index j = 0; j < k.rows(); ++j) cost(i, j) = (q.row(i) - k.row(j)).squaredNorm();
  return cost;
}

std::string fixed(double x, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}

}  // namespace

void demo_assignment_tree(std::ostream& out, DemoFigures* figures) {
  const auto start = std::chrono::steady_clock::now();
  Rng base(kSeed);
  const Matrix q = normals(base, kQueries, kDim);
  const Matrix k = normals(base, kKeys, kDim);
  const Matrix cost = squared_distances(q, k);
  out << "The problem: " << kQueries << " queries and " << kKeys << " keys in R^" << kDim
      << " (seed " << kSeed
      << "); matching query i to key j costs\n"
         "||q_i - k_j||^2. A perturb-and-MAP sample adds tau * Gumbel noise (tau = "
      << format_short(kTau)
      << ") to every\n"
         "cost and solves the assignment exactly, so each sample matches every key once and "
         "leaves one query\n"
         "out. The mean of K samples estimates how often each pair is matched; its maximum "
         "spanning tree\n"
         "becomes a sparse attention support, with log-frequency as a bias on the logits.\n\n";

  Rng tree_rng(777);
  const assign::AssignmentTree tree = assign::assignment_tree(cost, kTau, kSamples, tree_rng);
  const Index distinct = (tree.freq.array() > 0.0).count();
  const Vector column_sums = tree.freq.colwise().sum().transpose();
  const Vector row_sums = tree.freq.rowwise().sum();
  const double column_error = (column_sums.array() - 1.0).abs().maxCoeff();
  const Index tree_edges = tree.tree.count();
  if (figures != nullptr) figures->add_assignment_tree("assign_tree", tree.freq, tree.tree);
  out << "From K = " << kSamples << " samples:\n"
      << "  pairs ever matched         " << distinct << " of " << kQueries * kKeys << "\n"
      << "  key column sums            "
      << (column_error == 0.0 ? std::string("exactly 1")
                              : "1 within " + format_short(column_error, 3))
      << " (every sample matches every key once)\n"
      << "  query match probabilities  " << fixed(row_sums.minCoeff(), 3) << " ... "
      << fixed(row_sums.maxCoeff(), 3) << " (one query is left out of every sample)\n"
      << "  spanning tree              " << tree_edges << " edges = " << kQueries << " + " << kKeys
      << " - 1, " << assign::zero_frequency_tree_edges(tree.tree, tree.freq)
      << " of them never matched\n\n";

  // Retrieval trials as in the experiment (docs/mechanisms.md#assignment-tree-attention): the target of query i is the
  // value of its nearest key; dense attention against tree-sparse attention (alpha = 0.5).
  double dense_se = 0.0, sparse_se = 0.0;
  Index n_outputs = 0, repaired = 0, zero_frequency = 0, support = 0;
  for (int t = 0; t < kTrials; ++t) {
    Rng rr(4000 + static_cast<uint64_t>(t));
    const Matrix qq = normals(rr, kQueries, kDim);
    const Matrix kk = qq.topRows(kKeys) + 0.8 * normals(rr, kKeys, kDim);
    const Matrix vv = normals(rr, kKeys, kValueDim);
    const Matrix cc = squared_distances(qq, kk);
    Matrix target(kQueries, kValueDim);
    for (Index i = 0; i < kQueries; ++i) {
      Index nearest = 0;
      cc.row(i).minCoeff(&nearest);
      target.row(i) = vv.row(nearest);
    }
    const assign::AttentionResult dense = assign::dense_attention(qq, kk, vv);
    Rng trial_rng(7000 + static_cast<uint64_t>(t));
    const assign::AssignmentTree trial_tree =
        assign::assignment_tree(cc, kTau, kTrialSamples, trial_rng);
    const assign::SparseAttentionResult sparse =
        assign::sparse_attention(qq, kk, vv, trial_tree.tree_freq, kAlpha);
    dense_se += (dense.out - target).squaredNorm();
    sparse_se += (sparse.out - target).squaredNorm();
    n_outputs += target.size();
    repaired += static_cast<Index>(sparse.repaired_rows.size());
    zero_frequency += assign::zero_frequency_tree_edges(trial_tree.tree, trial_tree.freq);
    support += (sparse.p.array() > 0.0).count();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto n = static_cast<double>(n_outputs);
  out << "Retrieval on " << kTrials << " trials (the target of a query is the value of its "
      << "nearest key; trees from K = " << kTrialSamples << "):\n"
      << "  dense attention        MSE " << fixed(dense_se / n, 4) << "   attends to all " << kKeys
      << " keys\n"
      << "  tree-sparse attention  MSE " << fixed(sparse_se / n, 4) << "   attends to "
      << fixed(static_cast<double>(support) / (kTrials * static_cast<double>(kQueries)), 2)
      << " keys per query on average\n"
      << "  " << zero_frequency << " tree edges had zero frequency and were left out of the "
      << "support; " << repaired << " query rows\n"
      << "  had no positive-frequency tree edge and were repaired (given key 0, the first maximum "
         "of a zero row).\n"
      << "  Section time " << format_short(seconds, 3) << " s.\n"
      << "The full experiment (three predictions, the transport check, 80 retrieval trials): "
         "attnmix assign-tree\n";
}

}  // namespace attnmix::cli
