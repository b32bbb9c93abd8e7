// SPDX-License-Identifier: Apache-2.0
// Assignment-tree building blocks (docs/mechanisms.md#assignment-tree-attention): perturb-and-MAP sampling and
// frequencies (AT-3), Kruskal's maximum spanning tree (AT-2), dense and tree-sparse attention.
#include "attnmix/assign/assignment_tree.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "testing/all_close.hpp"

namespace attnmix::assign {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kSumTol = 1e-12;  // AT-3 for K not a power of 2 (one rounding per addend)

Matrix normal_matrix(Rng& rng, Index rows, Index cols) {
  Matrix x(rows, cols);
  for (Index e = 0; e < x.size(); ++e) x.data()[e] = rng.normal();
  return x;
}

Matrix squared_distances(const Matrix& q, const Matrix& k) {
  Matrix c(q.rows(), k.rows());
  for (Index i = 0; i < q.rows(); ++i)
    for (Index j = 0; j < k.rows(); ++j) c(i, j) = (q.row(i) - k.row(j)).squaredNorm();
  return c;
}

/// The 16 × 15 cost of the experiment's kind (queries and keys standard normal, d = 8).
Matrix experiment_like_cost(uint64_t seed) {
  Rng rng(seed);
  const Matrix q = normal_matrix(rng, 16, 8);
  const Matrix k = normal_matrix(rng, 15, 8);
  return squared_distances(q, k);
}

/// Number of nodes reached from node 0 over tree edges (query i = node i, key j = node nq + j).
Index reachable_nodes(const Mask& tree) {
  const Index nq = tree.rows();
  const Index nk = tree.cols();
  std::vector<bool> seen(static_cast<size_t>(nq + nk), false);
  std::queue<Index> frontier;
  frontier.push(0);
  seen[0] = true;
  Index n = 0;
  while (!frontier.empty()) {
    const Index u = frontier.front();
    frontier.pop();
    ++n;
    for (Index w = 0; w < nq + nk; ++w) {
      const bool edge = u < nq ? (w >= nq && tree(u, w - nq)) : (w < nq && tree(w, u - nq));
      if (edge && !seen[static_cast<size_t>(w)]) {
        seen[static_cast<size_t>(w)] = true;
        frontier.push(w);
      }
    }
  }
  return n;
}

Mask mask_of(std::initializer_list<std::initializer_list<int>> rows) {
  Mask m(static_cast<Index>(rows.size()), static_cast<Index>(rows.begin()->size()));
  Index i = 0;
  for (const auto& r : rows) {
    Index j = 0;
    for (int x : r) m(i, j++) = x != 0;
    ++i;
  }
  return m;
}

// ----------------------------------------------------------------------------------------------
// sampling (AT-3)

TEST(AssignmentSampleTest, ZeroTemperatureIsTheMapAssignmentAndNoiseGivesValidMatchings) {
  const Matrix cost = experiment_like_cost(1);
  Rng rng(testing::test_seed(3));
  const Assignment map = linear_sum_assignment(cost);
  const Assignment a0 = assignment_sample(cost, 0.0, rng);
  EXPECT_EQ(a0.rows, map.rows);
  EXPECT_EQ(a0.cols, map.cols);
  const Assignment a = assignment_sample(cost, 1.7, rng);
  ASSERT_EQ(a.rows.size(), 15u);
  std::vector<bool> used(15, false);
  for (size_t k = 0; k < a.rows.size(); ++k) {
    if (k > 0) {
      EXPECT_LT(a.rows[k - 1], a.rows[k]);
    }
    EXPECT_FALSE(used[static_cast<size_t>(a.cols[k])]);
    used[static_cast<size_t>(a.cols[k])] = true;
  }
  EXPECT_THROW((void)assignment_sample(cost, -1.0, rng), ValueError);
  EXPECT_THROW((void)assignment_sample(cost, std::nan(""), rng), ValueError);
}

/// AT-3: every key is matched once per sample, so every column of freq sums to 1 (exactly for K a
/// power of 2).
TEST(FrequencyEstimateTest, ColumnSumsAreOne) {
  const Matrix cost = experiment_like_cost(2);
  Rng rng(testing::test_seed(4));
  const Matrix f64 = frequency_estimate(cost, 1.7, 64, rng);
  for (Index j = 0; j < f64.cols(); ++j) EXPECT_EQ(f64.col(j).sum(), 1.0) << "column " << j;
  const Matrix f100 = frequency_estimate(cost, 1.7, 100, rng);
  for (Index j = 0; j < f100.cols(); ++j)
    EXPECT_NEAR(f100.col(j).sum(), 1.0, kSumTol) << "column " << j;
  for (Index i = 0; i < f100.rows(); ++i) EXPECT_LE(f100.row(i).sum(), 1.0 + kSumTol);
  // Fewer queries than keys: every query is matched once per sample instead.
  const Matrix wide = cost.transpose();
  const Matrix fw = frequency_estimate(wide, 1.7, 32, rng);
  for (Index i = 0; i < fw.rows(); ++i) EXPECT_EQ(fw.row(i).sum(), 1.0) << "row " << i;
  EXPECT_TRUE((f100.array() >= 0.0).all());
}

/// AT-3: one stream per sample and integer counts, so 1 and 2 threads give bitwise-identical
/// frequencies; the caller's rng advances by exactly one draw.
TEST(FrequencyEstimateTest, ThreadCountIndependentAndReproducible) {
  const Matrix cost = experiment_like_cost(5);
  const uint64_t seed = testing::test_seed(6);
  Rng r1(seed), r2(seed), r3(seed), reference(seed);
  const Matrix f1 = frequency_estimate(cost, 1.7, 1000, r1, 1);
  const Matrix f2 = frequency_estimate(cost, 1.7, 1000, r2, 2);
  const Matrix f3 = frequency_estimate(cost, 1.7, 1000, r3, 3);
  EXPECT_TRUE(f1 == f2) << "seed " << seed;
  EXPECT_TRUE(f1 == f3) << "seed " << seed;
  (void)reference.next_u64();
  const uint64_t next = reference.next_u64();
  EXPECT_EQ(r1.next_u64(), next);
  EXPECT_EQ(r2.next_u64(), next);
  EXPECT_EQ(r3.next_u64(), next);
}

/// Sample k of frequency_estimate is the (k mod 64)-th of consecutive assignment_sample calls on
/// the stream Rng(derive_seed(base, kSampler, k / 64)), where base is the caller's next draw.
TEST(FrequencyEstimateTest, SampleKIsAssignmentSampleOnItsBlockStream) {
  const Matrix cost = experiment_like_cost(21);
  const uint64_t seed = testing::test_seed(22);
  constexpr int64_t kK = 70;  // a full block of 64 and 6 samples of the next
  Rng rng(seed), copy(seed);
  const Matrix f = frequency_estimate(cost, 1.7, kK, rng, 2);
  const uint64_t base = copy.next_u64();
  Matrix expected = Matrix::Zero(cost.rows(), cost.cols());
  for (int64_t k = 0; k < kK;) {
    Rng stream(derive_seed(base, SeedPurpose::kSampler, static_cast<uint64_t>(k / 64)));
    for (const int64_t end = std::min<int64_t>(kK, k + 64); k < end; ++k) {
      const Assignment a = assignment_sample(cost, 1.7, stream);
      for (size_t n = 0; n < a.rows.size(); ++n) expected(a.rows[n], a.cols[n]) += 1.0;
    }
  }
  EXPECT_TRUE(f == expected / static_cast<double>(kK)) << "seed " << seed;
}

TEST(FrequencyEstimateTest, ForbiddenPairsAreNeverSampled) {
  Matrix cost = experiment_like_cost(7);
  cost(3, 4) = kInf;
  cost(0, 0) = kInf;
  Rng rng(testing::test_seed(8));
  const Matrix f = frequency_estimate(cost, 5.0, 256, rng, 2);
  EXPECT_EQ(f(3, 4), 0.0);
  EXPECT_EQ(f(0, 0), 0.0);
}

TEST(FrequencyEstimateTest, InvalidArgumentsRaise) {
  const Matrix cost = experiment_like_cost(9);
  Rng rng(1);
  EXPECT_THROW((void)frequency_estimate(cost, 1.7, 0, rng), ValueError);
  EXPECT_THROW((void)frequency_estimate(cost, -0.5, 8, rng), ValueError);
  EXPECT_THROW((void)frequency_estimate(cost, kInf, 8, rng), ValueError);
  EXPECT_THROW((void)frequency_estimate(cost, 1.7, 8, rng, -1), ValueError);
  Matrix bad = cost;
  bad(2, 2) = std::nan("");
  EXPECT_THROW((void)frequency_estimate(bad, 1.7, 8, rng), ValueError);
  Matrix infeasible = cost;
  infeasible.col(3).setConstant(kInf);  // key 3 can never be matched, but every key must be
  EXPECT_THROW((void)frequency_estimate(infeasible, 1.7, 200, rng, 2), ValueError);
  EXPECT_THROW((void)frequency_estimate(infeasible, 1.7, 200, rng, 1), ValueError);
}

// -------------------------------------------------------------------------------------------------
// tree (AT-2)

/// AT-2: nq + nk − 1 edges that connect all nq + nk nodes, on random and all-tied scores of many
/// shapes.
TEST(KruskalTreeTest, SpanningTreeWithNqPlusNkMinusOneEdges) {
  Rng rng(testing::test_seed(10));
  for (const auto& [nq, nk] : std::vector<std::pair<Index, Index>>{
           {1, 1}, {1, 5}, {5, 1}, {2, 2}, {16, 15}, {7, 12}, {30, 4}}) {
    for (int kind = 0; kind < 3; ++kind) {
      Matrix score(nq, nk);
      for (Index e = 0; e < score.size(); ++e)
        score.data()[e] = kind == 0   ? rng.uniform()
                          : kind == 1 ? 0.0
                                      : static_cast<double>(rng.uniform_int(2));
      const Mask tree = kruskal_tree(score);
      EXPECT_EQ(tree.count(), nq + nk - 1) << nq << "x" << nk << " kind " << kind;
      EXPECT_EQ(reachable_nodes(tree), nq + nk) << nq << "x" << nk << " kind " << kind;
    }
  }
}

/// AT-2: equal scores are taken in (i, nq + j) order, a larger score first.
TEST(KruskalTreeTest, TiesFollowQueryThenKeyOrder) {
  // All tied: (0,0), (0,1), (1,0) join; (1,1) would close a cycle; (2,0) completes the 4 edges.
  EXPECT_TRUE(kruskal_tree(Matrix::Constant(3, 2, 0.5)) == mask_of({{1, 1}, {1, 0}, {1, 0}}));
  // (1,1) first by score; then (0,0), (0,1) join everything but query 2; (1,0) is a cycle; (2,0)
  // completes.
  Matrix s(3, 2);
  s << 0.5, 0.5, 0.5, 0.9, 0.5, 0.5;
  EXPECT_TRUE(kruskal_tree(s) == mask_of({{1, 1}, {0, 1}, {1, 0}}));
  // A key-major order would pick (0,0), (1,0), (2,0), (0,1) instead.
  Matrix t(3, 2);
  t << 1, 1, 1, 0, 1, 1;
  EXPECT_TRUE(kruskal_tree(t) == mask_of({{1, 1}, {1, 0}, {1, 0}}));
  // Zero scores are used when connectivity needs them (a disconnected positive part).
  Matrix z = Matrix::Zero(2, 2);
  z(0, 0) = 0.7;
  z(1, 1) = 0.3;
  EXPECT_TRUE(kruskal_tree(z) == mask_of({{1, 1}, {0, 1}}));
}

TEST(KruskalTreeTest, InvalidScoresRaise) {
  Matrix s = Matrix::Ones(2, 3);
  s(1, 1) = std::nan("");
  EXPECT_THROW((void)kruskal_tree(s), ValueError);
  s(1, 1) = kInf;
  EXPECT_THROW((void)kruskal_tree(s), ValueError);
  EXPECT_THROW((void)kruskal_tree(Matrix(0, 3)), ValueError);
  EXPECT_THROW((void)kruskal_tree(Matrix(3, 0)), ValueError);
}

TEST(AssignmentTreeTest, TreeFrequencyIsFrequencyOnTheTree) {
  const Matrix cost = experiment_like_cost(11);
  Rng a(testing::test_seed(12));
  Rng b = a;
  const AssignmentTree t = assignment_tree(cost, 1.7, 128, a);
  const Matrix freq = frequency_estimate(cost, 1.7, 128, b);
  EXPECT_TRUE(t.freq == freq);
  EXPECT_TRUE(t.tree == kruskal_tree(freq));
  for (Index e = 0; e < freq.size(); ++e)
    EXPECT_EQ(t.tree_freq.data()[e], t.tree.data()[e] ? freq.data()[e] : 0.0);
  EXPECT_EQ(t.tree.count(), 30);
}

TEST(AssignmentTreeTest, ZeroFrequencyTreeEdgesAreCounted) {
  const Mask tree = mask_of({{1, 1}, {0, 1}, {1, 0}});
  Matrix freq(3, 2);
  freq << 0.5, 0.0, 0.5, 0.5, 0.0, 1.0;  // tree edges (0,1) and (2,0) have zero frequency
  EXPECT_EQ(zero_frequency_tree_edges(tree, freq), 2);
  EXPECT_THROW((void)zero_frequency_tree_edges(tree, Matrix::Zero(2, 3)), ValueError);
}

// -------------------------------------------------------------------------------------------------
// attention

/// p[i, j] ∝ exp(q_i·k_j/√d + alpha·log(eps + f[i, j])) over the support S_i, computed entry by
/// entry.
Matrix reference_probabilities(const Matrix& q, const Matrix& k, const Matrix& f,
                               const Mask& support, double alpha, double eps) {
  Matrix p = Matrix::Zero(q.rows(), k.rows());
  for (Index i = 0; i < q.rows(); ++i) {
    double top = -kInf;
    std::vector<double> z(static_cast<size_t>(k.rows()), -kInf);
    for (Index j = 0; j < k.rows(); ++j) {
      if (!support(i, j)) continue;
      double dot = 0.0;
      for (Index c = 0; c < q.cols(); ++c) dot += q(i, c) * k(j, c);
      z[static_cast<size_t>(j)] =
          dot / std::sqrt(static_cast<double>(q.cols())) + alpha * std::log(eps + f(i, j));
      top = std::max(top, z[static_cast<size_t>(j)]);
    }
    double total = 0.0;
    for (Index j = 0; j < k.rows(); ++j)
      if (support(i, j)) total += std::exp(z[static_cast<size_t>(j)] - top);
    for (Index j = 0; j < k.rows(); ++j)
      if (support(i, j)) p(i, j) = std::exp(z[static_cast<size_t>(j)] - top) / total;
  }
  return p;
}

struct AttentionCase {
  Matrix q, k, v, tree_freq;
};

AttentionCase attention_case(uint64_t seed) {
  Rng rng(seed);
  AttentionCase c{normal_matrix(rng, 6, 4), normal_matrix(rng, 5, 4), normal_matrix(rng, 5, 3),
                  Matrix::Zero(6, 5)};
  // A sparse support with varied frequencies; row 4 has none (it gets repaired).
  c.tree_freq(0, 1) = 0.25;
  c.tree_freq(0, 3) = 0.5;
  c.tree_freq(1, 0) = 1.0;
  c.tree_freq(2, 2) = 0.125;
  c.tree_freq(2, 4) = 0.75;
  c.tree_freq(3, 1) = 0.5;
  c.tree_freq(3, 2) = 0.0625;
  c.tree_freq(3, 4) = 0.3;
  c.tree_freq(5, 3) = 0.9;
  return c;
}

TEST(SparseAttentionTest, AlphaZeroIsDenseAttentionRestrictedToTheSupport) {
  const AttentionCase c = attention_case(testing::test_seed(13));
  Mask support = (c.tree_freq.array() > 0.0).matrix();
  support(4, 0) = true;  // the repaired row
  const SparseAttentionResult r = sparse_attention(c.q, c.k, c.v, c.tree_freq, 0.0);
  testing::ExpectAllClose(r.p, reference_probabilities(c.q, c.k, c.tree_freq, support, 0.0, 1e-6),
                          1e-12, 1e-15);
  testing::ExpectAllClose(r.out, Matrix(r.p * c.v), 1e-12, 1e-15);
}

TEST(SparseAttentionTest, BiasFollowsTheFormulaAndSupportIsRespected) {
  const AttentionCase c = attention_case(testing::test_seed(14));
  Mask support = (c.tree_freq.array() > 0.0).matrix();
  support(4, 0) = true;
  for (double alpha : {1.0, 0.5, -2.0}) {
    const SparseAttentionResult r = sparse_attention(c.q, c.k, c.v, c.tree_freq, alpha, 1e-3);
    testing::ExpectAllClose(
        r.p, reference_probabilities(c.q, c.k, c.tree_freq, support, alpha, 1e-3), 1e-12, 1e-15);
    for (Index i = 0; i < r.p.rows(); ++i) {
      EXPECT_NEAR(r.p.row(i).sum(), 1.0, 1e-12) << "row " << i;
      for (Index j = 0; j < r.p.cols(); ++j)
        if (!support(i, j)) {
          EXPECT_EQ(r.p(i, j), 0.0) << "(" << i << ", " << j << ") is off the support";
        }
    }
  }
}

TEST(SparseAttentionTest, AllZeroRowIsRepairedWithColumnZero) {
  const AttentionCase c = attention_case(testing::test_seed(15));
  const SparseAttentionResult r = sparse_attention(c.q, c.k, c.v, c.tree_freq);
  EXPECT_EQ(r.repaired_rows, (std::vector<Index>{4}));
  EXPECT_EQ(r.p(4, 0), 1.0);
  EXPECT_EQ(r.p.row(4).sum(), 1.0);
  testing::ExpectAllClose(Matrix(r.out.row(4)), Matrix(c.v.row(0)), 0.0, 0.0);
  // Nothing to repair when every row has support.
  Matrix full = c.tree_freq;
  full(4, 2) = 0.1;
  EXPECT_TRUE(sparse_attention(c.q, c.k, c.v, full).repaired_rows.empty());
}

TEST(SparseAttentionTest, InvalidInputsRaise) {
  const AttentionCase c = attention_case(1);
  Matrix negative = c.tree_freq;
  negative(0, 0) = -0.1;
  EXPECT_THROW((void)sparse_attention(c.q, c.k, c.v, negative), ValueError);
  EXPECT_THROW((void)sparse_attention(c.q, c.k, c.v, c.tree_freq, 1.0, 0.0), ValueError);
  EXPECT_THROW((void)sparse_attention(c.q, c.k, c.v, c.tree_freq, kInf), ValueError);
  EXPECT_THROW((void)sparse_attention(c.q, c.k, c.v, c.tree_freq.leftCols(4)), ValueError);
  EXPECT_THROW((void)sparse_attention(c.q, c.k.leftCols(3), c.v, c.tree_freq), ValueError);
  EXPECT_THROW((void)sparse_attention(c.q, c.k, c.v.topRows(4), c.tree_freq), ValueError);
  Matrix nan_q = c.q;
  nan_q(0, 0) = std::nan("");
  EXPECT_THROW((void)sparse_attention(nan_q, c.k, c.v, c.tree_freq), ValueError);
}

TEST(DenseAttentionTest, SoftmaxOfScaledDotProducts) {
  const AttentionCase c = attention_case(testing::test_seed(16));
  const Mask all = Mask::Constant(c.q.rows(), c.k.rows(), true);
  const AttentionResult r = dense_attention(c.q, c.k, c.v);
  testing::ExpectAllClose(r.p, reference_probabilities(c.q, c.k, c.tree_freq, all, 0.0, 1.0), 1e-12,
                          1e-15);
  testing::ExpectAllClose(r.out, Matrix(r.p * c.v), 1e-12, 1e-15);
  EXPECT_THROW((void)dense_attention(c.q, c.k.leftCols(2), c.v), ValueError);
}

}  // namespace
}  // namespace attnmix::assign
