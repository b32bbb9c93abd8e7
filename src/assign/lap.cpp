// SPDX-License-Identifier: Apache-2.0
// Rectangular linear assignment by shortest augmenting paths with dual prices
// (docs/mechanisms.md#assignment-tree-attention); the algorithm is described in lap_impl.hpp.
#include "attnmix/assign/lap.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>

#include "attnmix/core/errors.hpp"
#include "lap_impl.hpp"

namespace attnmix::assign {

namespace detail {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

template <class T>
void ensure_size(std::vector<T>& buf, Index n) {
  if (buf.size() < static_cast<size_t>(n)) buf.resize(static_cast<size_t>(n));
}
}  // namespace

void LapSolver::reserve(Index m, Index M) {
  for (auto* buf : {&u_, &shift_seen_}) ensure_size(*buf, m);
  for (auto* buf : {&v_, &w_, &d_, &dist_seen_}) ensure_size(*buf, M);
  for (auto* buf : {&col4row_, &rows_seen_}) ensure_size(*buf, m);
  for (auto* buf : {&row4col_, &cols_seen_, &path_, &unsettled_}) ensure_size(*buf, M);
}

bool LapSolver::augment(const double* c, Index M, int32_t r, Strategy strategy) {
  if (strategy == Strategy::kAuto)
    strategy = M >= kDenseColumns ? Strategy::kDense : Strategy::kScan;
  return strategy == Strategy::kDense ? augment_dense(c, M, r) : augment_scan(c, M, r);
}

Index LapSolver::solve(const double* c, Index m, Index M, Strategy strategy) {
  ATTNMIX_DASSERT(m >= 1 && m <= M, "LapSolver needs 1 <= rows <= columns");
  reserve(m, M);
  std::fill_n(u_.begin(), m, 0.0);
  std::fill_n(v_.begin(), M, 0.0);
  std::fill_n(w_.begin(), M, 0.0);
  std::fill_n(col4row_.begin(), m, -1);
  std::fill_n(row4col_.begin(), M, -1);
  for (Index r = 0; r < m; ++r)
    if (!augment(c, M, static_cast<int32_t>(r), strategy)) return r;
  return -1;
}

Index LapSolver::solve_warm(const double* c, Index n, const double* v_start, Strategy strategy) {
  ATTNMIX_DASSERT(n >= 1, "LapSolver needs a non-empty problem");
  reserve(n, n);
  double* __restrict u = u_.data();
  double* __restrict v = v_.data();
  int32_t* __restrict col4row = col4row_.data();
  int32_t* __restrict row4col = row4col_.data();
  std::copy_n(v_start, n, v);
  std::copy_n(v_start, n, w_.data());
  std::fill_n(col4row, n, -1);
  std::fill_n(row4col, n, -1);
  // Feasible duals for the given column prices: u[i] = min_j (c[i, j] − v[j]). A row whose minimum
  // is free takes that column at reduced cost 0, so complementary slackness holds for the partial
  // matching.
  for (Index i = 0; i < n; ++i) {
    const double* ci = c + i * n;
    double best = kInf;
    Index at = -1;
    for (Index j = 0; j < n; ++j) {
      const double reduced = ci[j] - v[j];
      if (reduced < best) {
        best = reduced;
        at = j;
      }
    }
    if (at < 0) return i;  // a row of +inf
    u[i] = best;
    if (row4col[at] < 0) {
      row4col[at] = static_cast<int32_t>(i);
      col4row[i] = static_cast<int32_t>(at);
    }
  }
  for (Index r = 0; r < n; ++r)
    if (col4row[r] < 0 && !augment(c, n, static_cast<int32_t>(r), strategy)) return r;
  return -1;
}

bool LapSolver::augment_scan(const double* c, Index M, int32_t r) {
  double* __restrict u = u_.data();
  double* __restrict v = v_.data();
  double* __restrict d = d_.data();
  int32_t* __restrict path = path_.data();
  int32_t* __restrict col4row = col4row_.data();
  int32_t* __restrict row4col = row4col_.data();
  int32_t* __restrict unsettled = unsettled_.data();
  int32_t* __restrict rows_seen = rows_seen_.data();
  int32_t* __restrict cols_seen = cols_seen_.data();
  const auto M32 = static_cast<int32_t>(M);

  // Dijkstra from row r; unsettled[0, n_unsettled) are the columns whose distance d is not final yet, path[j]
  // the row that offered d[j].
  std::fill(d, d + M, kInf);
  std::iota(unsettled, unsettled + M, 0);
  int32_t n_unsettled = M32;
  int32_t n_rows_seen = 0;
  int32_t n_cols_seen = 0;
  double min_dist = 0.0;  // distance of the row being scanned (0 for r itself)
  int32_t i = r;
  int32_t sink = -1;
  while (sink < 0) {
    rows_seen[n_rows_seen++] = i;
    const double* __restrict ci = c + static_cast<Index>(i) * M;
    const double shift = min_dist - u[i];  // via i: min_dist + c̄[i, j] = (c[i, j] + shift) − v[j]
    double lowest = kInf;
    int32_t at = -1;
    for (int32_t t = 0; t < n_unsettled; ++t) {
      const int32_t j = unsettled[t];
      const double via = (ci[j] + shift) - v[j];
      double dj = d[j];
      if (via < dj) {
        dj = via;
        d[j] = via;
        path[j] = i;
      }
      // Ties go to an unmatched column: it ends the search now.
      if (dj < lowest || (dj == lowest && row4col[j] < 0)) {
        lowest = dj;
        at = t;
      }
    }
    min_dist = lowest;
    // Every remaining column forbidden: no complete matching exists.
    if (!(min_dist < kInf)) return false;
    const int32_t j = unsettled[at];
    cols_seen[n_cols_seen++] = j;
    unsettled[at] = unsettled[--n_unsettled];
    if (row4col[j] < 0) {
      sink = j;
    } else {
      i = row4col[j];
    }
  }
  // Dual update: rows and columns whose distance became final move by min_dist − distance, which
  // keeps every reduced cost ≥ 0 and makes the path tight. The sink's distance is min_dist, so
  // unmatched columns keep v = 0.
  u[r] += min_dist;
  for (int32_t k = 1; k < n_rows_seen; ++k) {
    const int32_t row = rows_seen[k];
    u[row] += min_dist - d[col4row[row]];
  }
  for (int32_t k = 0; k < n_cols_seen; ++k) {
    const int32_t col = cols_seen[k];
    v[col] -= min_dist - d[col];
  }
  // Flip the path: each column on it takes the row it was reached from.
  int32_t j = sink;
  for (;;) {
    const int32_t row = path[j];
    row4col[j] = row;
    std::swap(col4row[row], j);
    if (row == r) break;
  }
  return true;
}

bool LapSolver::augment_dense(const double* c, Index M, int32_t r) {
  double* __restrict u = u_.data();
  double* __restrict v = v_.data();
  double* __restrict w = w_.data();
  double* __restrict d = d_.data();
  int32_t* __restrict col4row = col4row_.data();
  int32_t* __restrict row4col = row4col_.data();
  int32_t* __restrict rows_seen = rows_seen_.data();
  double* __restrict shift_seen = shift_seen_.data();
  int32_t* __restrict cols_seen = cols_seen_.data();
  double* __restrict dist_seen = dist_seen_.data();
  const auto M32 = static_cast<int32_t>(M);

  // Dijkstra from row r. d[j] is the tentative distance of column j, +inf once j is final (its
  // distance moves to dist_seen); w[j] is v[j], or −inf once j is final, so that shift + c − w =
  // +inf never lowers a final d.
  std::fill(d, d + M, kInf);
  int32_t n_seen = 0;     // scanned rows = n_seen + 1; final columns = n_seen (+1 with the sink)
  double min_dist = 0.0;  // distance of the row being scanned (0 for r itself)
  int32_t i = r;
  int32_t sink = -1;
  while (sink < 0) {
    const double* __restrict ci = c + static_cast<Index>(i) * M;
    const double shift = min_dist - u[i];  // via i: min_dist + c̄[i, j] = (c[i, j] + shift) − v[j]
    rows_seen[n_seen] = i;
    shift_seen[n_seen] = shift;
    // Dense over all columns, so it vectorises (final columns stay at +inf).
    for (int32_t j = 0; j < M32; ++j) {
      const double via = (ci[j] + shift) - w[j];
      d[j] = via < d[j] ? via : d[j];
    }
    const double lowest = Eigen::Map<const Eigen::ArrayXd>(d, M).minCoeff();
    // Every remaining column forbidden: no complete matching exists.
    if (!(lowest < kInf)) return false;
    // The first column at the least distance, or an unmatched one among ties (it ends the search).
    int32_t j = 0;
    while (d[j] != lowest) ++j;
    if (row4col[j] >= 0) {
      for (int32_t t = j + 1; t < M32; ++t)
        if (d[t] == lowest && row4col[t] < 0) {
          j = t;
          break;
        }
    }
    min_dist = lowest;
    cols_seen[n_seen] = j;
    dist_seen[n_seen] = lowest;
    ++n_seen;
    d[j] = kInf;
    w[j] = -kInf;
    if (row4col[j] < 0) {
      sink = j;
    } else {
      i = row4col[j];
    }
  }
  // The path back from the sink. Final column k was reached from the first of the rows scanned
  // before it (rows_seen[0..k]) whose offer equals its distance: the offer that set d (later equal
  // offers do not replace it), recomputed with the same operations, so the comparison is exact. Row
  // t ≥ 1 was reached through final column t − 1, its matched column.
  for (int32_t k = n_seen - 1;;) {
    const int32_t j = cols_seen[k];
    int32_t t = 0;
    while (t < k &&
           (c[static_cast<Index>(rows_seen[t]) * M + j] + shift_seen[t]) - v[j] != dist_seen[k])
      ++t;
    ATTNMIX_DASSERT(
        (c[static_cast<Index>(rows_seen[t]) * M + j] + shift_seen[t]) - v[j] == dist_seen[k],
        "LapSolver: augmenting path lost");
    const int32_t row = rows_seen[t];
    row4col[j] = row;
    col4row[row] = j;  // row t ≥ 1 gives up column k' = t − 1, which the next step reassigns
    if (t == 0) break;
    k = t - 1;
  }
  // Dual update: rows and columns whose distance became final move by min_dist − distance, which
  // keeps every reduced cost ≥ 0 and makes the new matching tight. The sink's distance is min_dist,
  // so unmatched columns keep v = 0. Row t ≥ 1 has the distance of final column t − 1.
  u[r] += min_dist;
  for (int32_t t = 1; t < n_seen; ++t) u[rows_seen[t]] += min_dist - dist_seen[t - 1];
  for (int32_t k = 0; k < n_seen; ++k) {
    const int32_t col = cols_seen[k];
    v[col] -= min_dist - dist_seen[k];
    w[col] = v[col];
  }
  return true;
}

LapWorkspace& thread_workspace() {
  thread_local LapWorkspace workspace;
  return workspace;
}

}  // namespace detail

namespace {
constexpr const char* kWhere = "linear_sum_assignment";

std::string infeasible_message(Index row, bool transposed) {
  std::ostringstream os;
  os << kWhere << ": no complete assignment of finite cost exists ("
     << (transposed ? "column " : "row ") << row << " cannot be matched once the "
     << (transposed ? "columns" : "rows")
     << " before it are: every candidate pair is +inf or taken)";
  return os.str();
}
}  // namespace

Assignment linear_sum_assignment(const Matrix& cost) {
  const Index nq = cost.rows();
  const Index nk = cost.cols();
  Assignment result;
  if (nq == 0 || nk == 0) return result;
  if (std::max(nq, nk) >= std::numeric_limits<int32_t>::max())
    throw ValueError(std::string(kWhere) + ": each side must have fewer than 2^31 - 1 entries");
  const double* c = cost.data();
  for (Index e = 0; e < cost.size(); ++e) {
    if (std::isnan(c[e]) || c[e] == -std::numeric_limits<double>::infinity()) {
      std::ostringstream os;
      os << kWhere << ": cost entries must be finite or +inf (entry [" << e / nk << ", " << e % nk
         << "] is " << c[e] << ")";
      throw ValueError(os.str());
    }
  }

  detail::LapWorkspace& ws = detail::thread_workspace();
  const bool transposed = nq > nk;
  const Index m = std::min(nq, nk);
  const Index M = std::max(nq, nk);
  if (transposed) {
    // Augment the smaller side: solve the [nk, nq] transpose, whose rows are then contiguous.
    if (ws.scratch.size() < static_cast<size_t>(cost.size()))
      ws.scratch.resize(static_cast<size_t>(cost.size()));
    double* t = ws.scratch.data();
    for (Index i = 0; i < nq; ++i)
      for (Index j = 0; j < nk; ++j) t[j * nq + i] = c[i * nk + j];
    c = t;
  }
  const Index failed = ws.solver.solve(c, m, M);
  if (failed >= 0) throw ValueError(infeasible_message(failed, transposed));

  const int32_t* col4row = ws.solver.col4row();
  result.rows.resize(static_cast<size_t>(m));
  if (!transposed) {
    result.cols.resize(static_cast<size_t>(m));
    for (Index i = 0; i < m; ++i) {
      result.rows[static_cast<size_t>(i)] = i;
      result.cols[static_cast<size_t>(i)] = col4row[i];
    }
  } else {
    // Solver row j is key j, matched to query col4row[j]; list the pairs by query (cols first
    // serves as the query → key map, then is compacted in place: entry k is written only after
    // entry i ≥ k was read).
    result.cols.assign(static_cast<size_t>(nq), -1);
    for (Index j = 0; j < m; ++j) result.cols[static_cast<size_t>(col4row[j])] = j;
    size_t k = 0;
    for (Index i = 0; i < nq; ++i) {
      const Index key = result.cols[static_cast<size_t>(i)];
      if (key < 0) continue;
      result.rows[k] = i;
      result.cols[k] = key;
      ++k;
    }
    result.cols.resize(static_cast<size_t>(m));
  }
  return result;
}

}  // namespace attnmix::assign
