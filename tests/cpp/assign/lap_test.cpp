// SPDX-License-Identifier: Apache-2.0
// Rectangular linear assignment (docs/mechanisms.md#assignment-tree-attention) against brute-force enumeration of every
// injective assignment, on random problems up to 7 × 7, 6 × 8 and 8 × 6 with ties and forbidden (+inf) pairs;
// documented errors.
#include "attnmix/assign/lap.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "assign/lap_impl.hpp"  // white-box: the solver's strategies (src/ is on this test's include path)
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "testing/all_close.hpp"

namespace attnmix::assign {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// Least total cost over all injective maps of the smaller side into the larger (+inf when none is
/// finite).
double brute_force_min(const Matrix& cost) {
  const bool by_rows = cost.rows() <= cost.cols();
  const Index m = by_rows ? cost.rows() : cost.cols();
  const Index M = by_rows ? cost.cols() : cost.rows();
  auto at = [&](Index a, Index b) { return by_rows ? cost(a, b) : cost(b, a); };
  std::vector<bool> used(static_cast<size_t>(M), false);
  double best = kInf;
  // Depth-first over a ∈ [0, m): the smaller side's a-th vertex takes an unused vertex b of the
  // larger side.
  auto visit = [&](auto&& self, Index a, double total) -> void {
    if (a == m) {
      best = std::min(best, total);
      return;
    }
    for (Index b = 0; b < M; ++b) {
      if (used[static_cast<size_t>(b)] || at(a, b) == kInf) continue;
      used[static_cast<size_t>(b)] = true;
      self(self, a + 1, total + at(a, b));
      used[static_cast<size_t>(b)] = false;
    }
  };
  visit(visit, 0, 0.0);
  return best;
}

/// Checks that a is a valid matching of cost (min(nq, nk) pairs, rows strictly increasing, distinct
/// columns, all pairs finite) and returns its total cost.
double checked_total(const Matrix& cost, const Assignment& a) {
  const auto n = static_cast<size_t>(std::min(cost.rows(), cost.cols()));
  EXPECT_EQ(a.rows.size(), n);
  EXPECT_EQ(a.cols.size(), n);
  std::vector<bool> col_used(static_cast<size_t>(cost.cols()), false);
  double total = 0.0;
  for (size_t k = 0; k < std::min(n, std::min(a.rows.size(), a.cols.size())); ++k) {
    const Index i = a.rows[k];
    const Index j = a.cols[k];
    EXPECT_TRUE(i >= 0 && i < cost.rows()) << "row " << i;
    EXPECT_TRUE(j >= 0 && j < cost.cols()) << "col " << j;
    if (k > 0) {
      EXPECT_LT(a.rows[k - 1], i) << "pairs must be sorted by row";
    }
    if (j < 0 || j >= cost.cols() || i < 0 || i >= cost.rows()) continue;
    EXPECT_FALSE(col_used[static_cast<size_t>(j)]) << "column " << j << " used twice";
    col_used[static_cast<size_t>(j)] = true;
    EXPECT_LT(cost(i, j), kInf) << "forbidden pair (" << i << ", " << j << ") matched";
    total += cost(i, j);
  }
  return total;
}

enum class Entries { kContinuous, kTies, kTiesAndForbidden, kContinuousAndForbidden };

Matrix random_cost(Rng& rng, Index nq, Index nk, Entries kind) {
  Matrix c(nq, nk);
  for (Index e = 0; e < c.size(); ++e) {
    double x = 0.0;
    switch (kind) {
      case Entries::kContinuous:
      case Entries::kContinuousAndForbidden:
        x = 10.0 * rng.normal();
        break;
      case Entries::kTies:
      case Entries::kTiesAndForbidden:
        x = static_cast<double>(rng.uniform_int(3));  // {0, 1, 2}: many optimal assignments
        break;
    }
    if ((kind == Entries::kTiesAndForbidden || kind == Entries::kContinuousAndForbidden) &&
        rng.bernoulli(0.3))
      x = kInf;
    c.data()[e] = x;
  }
  return c;
}

TEST(LinearSumAssignmentTest, MatchesBruteForceOnEveryRandomShapeUpTo8) {
  const uint64_t seed = testing::test_seed(20240611);
  Rng rng(seed);
  std::vector<std::pair<Index, Index>> shapes;
  for (Index nq = 1; nq <= 7; ++nq)
    for (Index nk = 1; nk <= 7; ++nk) shapes.emplace_back(nq, nk);
  shapes.emplace_back(6, 8);
  shapes.emplace_back(8, 6);
  int n_infeasible = 0, n_feasible_with_inf = 0;
  for (const auto& [nq, nk] : shapes) {
    for (Entries kind : {Entries::kContinuous, Entries::kTies, Entries::kTiesAndForbidden,
                         Entries::kContinuousAndForbidden}) {
      for (int trial = 0; trial < 8; ++trial) {
        const Matrix cost = random_cost(rng, nq, nk, kind);
        const double expected = brute_force_min(cost);
        SCOPED_TRACE("seed " + std::to_string(seed) + ", shape " + std::to_string(nq) + "x" +
                     std::to_string(nk) + ", kind " + std::to_string(static_cast<int>(kind)) +
                     ", trial " + std::to_string(trial));
        if (expected == kInf) {
          ++n_infeasible;
          EXPECT_THROW((void)linear_sum_assignment(cost), ValueError);
          continue;
        }
        n_feasible_with_inf += (cost.array() == kInf).any() ? 1 : 0;
        const Assignment a = linear_sum_assignment(cost);
        const double total = checked_total(cost, a);
        EXPECT_NEAR(total, expected, 1e-9 * std::max(1.0, std::abs(expected)));
      }
    }
  }
  // The generator must exercise both branches.
  EXPECT_GT(n_infeasible, 10);
  EXPECT_GT(n_feasible_with_inf, 100);
}

TEST(LinearSumAssignmentTest, KnownSmallProblem) {
  Matrix c(3, 3);
  c << 4, 1, 3, 2, 0, 5, 3, 2, 2;  // scipy: rows [0 1 2], cols [1 0 2], cost 5
  const Assignment a = linear_sum_assignment(c);
  EXPECT_EQ(a.rows, (std::vector<Index>{0, 1, 2}));
  EXPECT_EQ(a.cols, (std::vector<Index>{1, 0, 2}));
}

TEST(LinearSumAssignmentTest, MoreRowsThanColumnsMatchesEveryColumnOnce) {
  Matrix c(4, 2);
  c << 5, 9, 1, 7, 6, 2, 3, 3;  // best: row 1 → col 0 (1), row 2 → col 1 (2)
  const Assignment a = linear_sum_assignment(c);
  EXPECT_EQ(a.rows, (std::vector<Index>{1, 2}));
  EXPECT_EQ(a.cols, (std::vector<Index>{0, 1}));
}

TEST(LinearSumAssignmentTest, TransposeAndPermutationKeepTheOptimalCostOnLargerProblems) {
  Rng rng(testing::test_seed(5));
  for (const auto& [nq, nk] : std::vector<std::pair<Index, Index>>{{40, 40}, {30, 70}, {90, 25}}) {
    Matrix c(nq, nk);
    for (Index e = 0; e < c.size(); ++e) c.data()[e] = rng.uniform();
    const double direct = checked_total(c, linear_sum_assignment(c));
    const Matrix ct = c.transpose();
    EXPECT_NEAR(checked_total(ct, linear_sum_assignment(ct)), direct, 1e-9);
    Matrix reversed = c.colwise().reverse();  // rows in reverse order
    EXPECT_NEAR(checked_total(reversed, linear_sum_assignment(reversed)), direct, 1e-9);
  }
}

TEST(LinearSumAssignmentTest, InfeasibleProblemsRaisePromptly) {
  const auto start = std::chrono::steady_clock::now();
  Matrix row_forbidden = Matrix::Ones(4, 4);
  row_forbidden.row(2).setConstant(kInf);
  EXPECT_THROW((void)linear_sum_assignment(row_forbidden), ValueError);

  Matrix column_forbidden = Matrix::Ones(5, 3);  // more rows: every column must be matched
  column_forbidden.col(1).setConstant(kInf);
  EXPECT_THROW((void)linear_sum_assignment(column_forbidden), ValueError);

  Matrix hall(3, 5);  // rows 0 and 1 may only use column 0: no matching of all rows
  hall.setConstant(kInf);
  hall(0, 0) = hall(1, 0) = 1.0;
  hall.row(2).setConstant(2.0);
  EXPECT_THROW((void)linear_sum_assignment(hall), ValueError);

  Matrix all_forbidden = Matrix::Constant(2, 2, kInf);
  EXPECT_THROW((void)linear_sum_assignment(all_forbidden), ValueError);

  Matrix big =
      Matrix::Random(300, 300).cwiseAbs();  // a forbidden last row found after 299 augmentations
  big.row(299).setConstant(kInf);
  EXPECT_THROW((void)linear_sum_assignment(big), ValueError);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);

  try {
    (void)linear_sum_assignment(row_forbidden);
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("linear_sum_assignment"), std::string::npos) << e.what();
  }
}

TEST(LinearSumAssignmentTest, NanAndNegativeInfinityRaise) {
  Matrix c = Matrix::Ones(3, 4);
  c(1, 2) = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW((void)linear_sum_assignment(c), ValueError);
  c(1, 2) = -kInf;
  EXPECT_THROW((void)linear_sum_assignment(c), ValueError);
  Matrix t = Matrix::Ones(4, 3);  // the transposed path checks too
  t(3, 0) = -kInf;
  EXPECT_THROW((void)linear_sum_assignment(t), ValueError);
}

TEST(LinearSumAssignmentTest, EmptyShapesGiveNoPairs) {
  for (const auto& [nq, nk] : std::vector<std::pair<Index, Index>>{{0, 0}, {0, 4}, {4, 0}}) {
    const Assignment a = linear_sum_assignment(Matrix(nq, nk));
    EXPECT_TRUE(a.rows.empty());
    EXPECT_TRUE(a.cols.empty());
  }
}

TEST(LinearSumAssignmentTest, SingleRowOrColumnTakesTheMinimum) {
  Matrix row(1, 5);
  row << 3, -1, 4, -1, 5;  // ties: any minimum is optimal
  Assignment a = linear_sum_assignment(row);
  ASSERT_EQ(a.rows.size(), 1u);
  EXPECT_EQ(row(0, a.cols[0]), -1.0);
  const Matrix col = row.transpose();
  a = linear_sum_assignment(col);
  ASSERT_EQ(a.rows.size(), 1u);
  EXPECT_EQ(a.cols[0], 0);
  EXPECT_EQ(col(a.rows[0], 0), -1.0);
}

}  // namespace
}  // namespace attnmix::assign

// ------------------------------------------------------------------------- the solver's two scan
// strategies
namespace attnmix::assign {
namespace {

using Strategy = detail::LapSolver::Strategy;

/// Total cost of the solver's matching of an m × M problem (m ≤ M); +inf when it reports
/// infeasibility.
double solver_total(detail::LapSolver& solver, const Matrix& cost, Strategy strategy) {
  if (solver.solve(cost.data(), cost.rows(), cost.cols(), strategy) >= 0) return kInf;
  std::vector<bool> used(static_cast<size_t>(cost.cols()), false);
  double total = 0.0;
  for (Index i = 0; i < cost.rows(); ++i) {
    const Index j = solver.col4row()[i];
    EXPECT_TRUE(j >= 0 && j < cost.cols() && !used[static_cast<size_t>(j)])
        << "row " << i << " -> " << j;
    if (j < 0 || j >= cost.cols()) return std::numeric_limits<double>::quiet_NaN();
    used[static_cast<size_t>(j)] = true;
    total += cost(i, j);
  }
  return total;
}

/// Both strategies (the dense one is used from LapSolver::kDenseColumns columns on) against brute
/// force.
TEST(LapSolverTest, ScanAndDenseStrategiesMatchBruteForce) {
  Rng rng(testing::test_seed(77));
  detail::LapSolver solver;
  for (Index m = 1; m <= 7; ++m)
    for (Index M = m; M <= std::min<Index>(8, m + 3); ++M)
      for (Entries kind : {Entries::kContinuous, Entries::kTies, Entries::kTiesAndForbidden}) {
        for (int trial = 0; trial < 6; ++trial) {
          const Matrix cost = random_cost(rng, m, M, kind);
          const double expected = brute_force_min(cost);
          for (Strategy s : {Strategy::kScan, Strategy::kDense}) {
            const double total = solver_total(solver, cost, s);
            if (expected == kInf) {
              EXPECT_EQ(total, kInf);
            } else {
              EXPECT_NEAR(total, expected, 1e-9 * std::max(1.0, std::abs(expected)))
                  << m << "x" << M << " kind " << static_cast<int>(kind) << " dense "
                  << (s == Strategy::kDense);
            }
          }
        }
      }
}

/// Larger problems (no brute force): the two strategies agree on the optimal cost, including ties
/// and +inf.
TEST(LapSolverTest, ScanAndDenseStrategiesAgreeOnLargerProblems) {
  Rng rng(testing::test_seed(78));
  detail::LapSolver solver;
  for (const auto& [m, M] :
       std::vector<std::pair<Index, Index>>{{60, 60}, {120, 120}, {100, 180}, {150, 151}}) {
    for (Entries kind : {Entries::kContinuous, Entries::kTies, Entries::kContinuousAndForbidden}) {
      const Matrix cost = random_cost(rng, m, M, kind);
      const double scan = solver_total(solver, cost, Strategy::kScan);
      const double dense = solver_total(solver, cost, Strategy::kDense);
      const double automatic = solver_total(solver, cost, Strategy::kAuto);
      EXPECT_LT(scan, kInf);
      EXPECT_NEAR(dense, scan, 1e-9 * std::max(1.0, std::abs(scan))) << m << "x" << M;
      EXPECT_EQ(automatic, M >= detail::LapSolver::kDenseColumns ? dense : scan);
    }
  }
  Matrix infeasible = Matrix::Ones(130, 140);
  infeasible.row(77).setConstant(kInf);
  EXPECT_EQ(solver.solve(infeasible.data(), 130, 140, Strategy::kDense), 77);
  EXPECT_EQ(solver.solve(infeasible.data(), 130, 140, Strategy::kScan), 77);
}

}  // namespace
}  // namespace attnmix::assign
