// SPDX-License-Identifier: Apache-2.0
/// @file lap_impl.hpp
/// Private: the reusable shortest-augmenting-path solver behind linear_sum_assignment
/// (include/attnmix/assign/lap.hpp).
///
/// Notation: an m × M problem with m ≤ M (the caller transposes when it has more rows than
/// columns); rows are augmented one at a time. Duals u [m], v [M] keep every reduced cost
/// c̄[i, j] = c[i, j] − u[i] − v[j] ≥ 0, with equality on matched pairs, and v[j] = 0 on unmatched
/// columns (so v ≤ 0 throughout: the optimality condition of the rectangular problem, where a
/// column may stay unmatched).
///
/// Augmenting row r is Dijkstra over reduced costs from r: d[j] = shortest reduced path length to
/// column j. Each step scans the columns from the newest row, fixes the column of least d (ties: an
/// unmatched column first, which ends the search), and continues from that column's row, until an
/// unmatched column (the sink) is fixed. Then u, v move by the path lengths (keeping c̄ ≥ 0 and
/// making the path tight) and the path is flipped.
///
/// Cost: O(M) per step, O(s·M) for an augmentation that reaches s rows, O(m²·M) worst case;
/// O(m + M) memory kept between calls, so repeated solves allocate nothing.
///
/// References: D. F. Crouse (2016), On implementing 2D rectangular assignment algorithms, IEEE
/// Trans. Aerospace and Electronic Systems 52(4); R. Jonker, A. Volgenant (1987), A shortest
/// augmenting path algorithm for dense and sparse linear assignment problems, Computing 38.
#pragma once

#include <cstdint>
#include <vector>

#include "attnmix/core/types.hpp"

namespace attnmix::assign::detail {

class LapSolver {
 public:
  /// How each Dijkstra step scans the columns (the same augmenting paths up to ties; both exact).
  /// kScan goes over the unfinished columns through an index list and remembers each column's
  /// predecessor row: least work per step, best for small problems. kDense goes over every column
  /// in one branch-free vectorised pass (finished columns are masked by +∞ distances) and recovers
  /// predecessors afterwards, only along the augmenting path: best from about a hundred columns on
  /// (2–3× faster than kScan at 256), and on small problems with long augmenting paths. kAuto picks
  /// kDense when M ≥ kDenseColumns.
  enum class Strategy { kAuto, kScan, kDense };
  /// The measured crossover (AMD EPYC, AVX-512) lies between 96 and 128 columns.
  static constexpr Index kDenseColumns = 112;

  /// Solves the m × M problem (1 ≤ m ≤ M) whose row i is c[i·M, (i + 1)·M), from zero duals.
  /// Entries must be finite or +∞. Returns −1 on success (col4row() then holds row i's column), or
  /// the first row that cannot be matched (no finite augmenting path exists: the problem has no
  /// complete matching of finite cost).
  [[nodiscard]] Index solve(const double* c, Index m, Index M, Strategy strategy = Strategy::kAuto);
  /// Solves the square n × n problem c warm-started from column prices v_start [n] (any values: the
  /// row duals are set to u[i] = min_j (c[i, j] − v_start[j]), and each row whose minimum column is
  /// still free takes it), then augments the rows left free. Good prices (the final v() of a
  /// similar problem) leave few rows to augment. Only for square problems: a rectangular one needs
  /// v = 0 on unmatched columns, which warm prices break (pad it with zero rows instead). The
  /// optimum is the same as solve()'s; among tied optima either may differ. Returns as solve().
  [[nodiscard]] Index solve_warm(const double* c, Index n, const double* v_start,
                                 Strategy strategy = Strategy::kAuto);
  /// Row i's column after a successful solve, i ∈ [0, m).
  [[nodiscard]] const int32_t* col4row() const { return col4row_.data(); }
  /// The column duals after a successful solve [M].
  [[nodiscard]] const double* v() const { return v_.data(); }

 private:
  void reserve(Index m, Index M);
  /// One Dijkstra search from free row r and the augmentation along the path found; false when no
  /// finite path exists. Needs feasible duals (c̄ ≥ 0) and complementary slackness on the current
  /// matching.
  bool augment(const double* c, Index M, int32_t r, Strategy strategy);
  bool augment_scan(const double* c, Index M, int32_t r);
  bool augment_dense(const double* c, Index M, int32_t r);

  std::vector<double> u_, v_, w_, d_, shift_seen_, dist_seen_;
  std::vector<int32_t> col4row_, row4col_, rows_seen_, cols_seen_, path_, unsettled_;
};

/// A thread's solver and scratch matrix, reused across calls on that thread.
struct LapWorkspace {
  LapSolver solver;
  std::vector<double> scratch;  // the transposed (or perturbed) cost
};
[[nodiscard]] LapWorkspace& thread_workspace();

}  // namespace attnmix::assign::detail
