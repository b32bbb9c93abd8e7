// SPDX-License-Identifier: Apache-2.0
// Assignment-tree attention building blocks (docs/mechanisms.md#assignment-tree-attention): perturb-and-MAP sampling,
// frequency estimation, Kruskal's maximum spanning tree and (tree-sparse) softmax attention.
#include "attnmix/assign/assignment_tree.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>

#include "assignment_tree_impl.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/inference/reduce.hpp"
#include "lap_impl.hpp"

#ifdef ATTNMIX_HAVE_OPENMP
#include <omp.h>
#endif

namespace attnmix::assign {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  os.precision(17);
  (os << ... << parts);
  return os.str();
}

void check_tau(const char* where, double tau) {
  if (!(std::isfinite(tau) && tau >= 0.0))
    throw ValueError(concat(where, ": tau must be finite and >= 0 (got ", tau, ")"));
}

/// Entries finite or +∞ (a forbidden pair), as linear_sum_assignment accepts.
void check_cost(const char* where, const Matrix& cost) {
  const double* c = cost.data();
  for (Index e = 0; e < cost.size(); ++e)
    if (std::isnan(c[e]) || c[e] == -kInf)
      throw ValueError(concat(where, ": cost entries must be finite or +inf (entry [",
                              e / cost.cols(), ", ", e % cost.cols(), "] is ", c[e], ")"));
}

void check_finite(const char* where, const char* name, const Matrix& x) {
  const double* p = x.data();
  for (Index e = 0; e < x.size(); ++e)
    if (!std::isfinite(p[e]))
      throw ValueError(concat(where, ": ", name, " must be finite (entry [", e / x.cols(), ", ",
                              e % x.cols(), "] is ", p[e], ")"));
}

void check_attention_shapes(const char* where, const Matrix& q, const Matrix& k, const Matrix& v) {
  if (q.cols() == 0)
    throw ValueError(concat(where, ": q and k need at least one feature column (d >= 1)"));
  if (k.rows() == 0) throw ValueError(concat(where, ": k needs at least one key row"));
  if (k.cols() != q.cols())
    throw ValueError(
        concat(where, ": k must have as many columns as q (", q.cols(), "), got ", k.cols()));
  if (v.rows() != k.rows())
    throw ValueError(
        concat(where, ": v must have one row per key (", k.rows(), "), got ", v.rows()));
  check_finite(where, "q", q);
  check_finite(where, "k", k);
  check_finite(where, "v", v);
}

/// Row-wise softmax of logits in place (rows with −∞ entries allowed, each row needs one finite
/// entry).
void softmax_rows(Matrix& logits) {
  for (Index i = 0; i < logits.rows(); ++i) {
    auto row = logits.row(i);
    const double top = row.maxCoeff();
    double total = 0.0;
    for (Index j = 0; j < row.size(); ++j) {
      const double e = std::exp(row[j] - top);  // exp(−∞) = 0 off the support
      row[j] = e;
      total += e;
    }
    row /= total;
  }
}

/// Scaled dot-product logits q·kᵀ/√d [nq, nk].
Matrix dot_logits(const Matrix& q, const Matrix& k) {
  Matrix logits = q * k.transpose();
  logits /= std::sqrt(static_cast<double>(q.cols()));
  return logits;
}
}  // namespace

namespace detail {

namespace {
// The perturbed problems of frequency_estimate need long augmenting paths (many rows compete for
// the same columns), where the vectorised dense scan is faster than the index-list scan even at 16
// columns.
constexpr LapSolver::Strategy kSampleStrategy = LapSolver::Strategy::kDense;
}  // namespace

void fill_gumbel(Rng& rng, std::span<double> out) {
  for (double& x : out) {
    do {  // rng.uniform_open(), inlined
      x = rng.uniform();
    } while (x == 0.0);
  }
  // g = −log(−log U), both logs in one vectorised pass (Eigen's SIMD log; the scalar std::log per
  // draw costs more than the whole 16 × 15 assignment).
  Eigen::Map<Eigen::ArrayXd> g(out.data(), static_cast<Index>(out.size()));
  g = -(-g.log()).log();
}

void skip_gumbel(Rng& rng, size_t n) {
  for (size_t e = 0; e < n; ++e) {
    while (rng.uniform() == 0.0) {
    }
  }
}

void add_assignment_counts(const Matrix& cost, double tau, uint64_t base, int64_t k_begin,
                           int64_t k_end, std::span<int64_t> counts, int n_threads) {
  const Index nq = cost.rows();
  const Index nk = cost.cols();
  ATTNMIX_ASSERT(counts.size() == static_cast<size_t>(nq * nk), "counts must be [nq, nk]");
  if (k_end <= k_begin || nq == 0 || nk == 0) return;
  // The solver augments the smaller side, so with nq > nk the perturbed cost is stored transposed
  // ([nk, nq]) while the Gumbel table is still drawn row-major over (i, j). It is padded to a
  // square [M, M] with zero rows, so every sample can start from the column prices of the
  // unperturbed problem (LapSolver::solve_warm): typically most rows are then matched by a single
  // pass. The prices are a fixed function of cost, so sample k's matching depends only on its own
  // stream. With tau = 0 every sample is the plain solve of cost (assignment_sample's matching).
  const bool transposed = nq > nk;
  const Index m = std::min(nq, nk);
  const Index M = std::max(nq, nk);
  const double* c = cost.data();
  const auto n_entries = static_cast<size_t>(nq * nk);
  const auto n_square = static_cast<size_t>(M * M);
  // at(i, j): the solver-matrix offset of query i, key j.
  const auto at = [&](Index i, Index j) { return transposed ? j * M + i : i * M + j; };

  std::vector<double> prices;
  if (tau > 0.0) {
    std::vector<double> square(n_square, 0.0);
    for (Index i = 0; i < nq; ++i)
      for (Index j = 0; j < nk; ++j) square[static_cast<size_t>(at(i, j))] = c[i * nk + j];
    LapSolver& solver = thread_workspace().solver;
    const Index failed = solver.solve(square.data(), M, M);
    if (failed >= 0)
      throw ValueError(concat("frequency_estimate: no complete assignment of finite cost exists (",
                              transposed ? "column " : "row ", failed, " cannot be matched)"));
    prices.assign(solver.v(), solver.v() + M);
  }

  std::exception_ptr error;
  Index failed_row = -1;
  // Samples [b·S, (b + 1)·S) (S = kSamplesPerStream) are drawn in order from stream b; count
  // samples [k0, k1) of block b into out, first skipping the draws of the block's samples before k0.
  // A block uses only its own stream, and integer counts add exactly, so any split of blocks over
  // threads gives the same counts.
  auto run_block = [&](int64_t b, int64_t k0, int64_t k1, std::span<int64_t> out) {
    LapWorkspace& ws = thread_workspace();
    if (ws.scratch.size() < n_square + n_entries) ws.scratch.resize(n_square + n_entries);
    double* noisy = ws.scratch.data();
    std::fill(noisy + m * M, noisy + M * M, 0.0);  // the padding rows
    const std::span<double> gumbel(ws.scratch.data() + n_square, n_entries);
    Rng rng(derive_seed(base, SeedPurpose::kSampler, static_cast<uint64_t>(b)));
    for (int64_t k = b * kSamplesPerStream; k < k0; ++k) skip_gumbel(rng, n_entries);
    for (int64_t k = k0; k < k1; ++k) {
      fill_gumbel(rng, gumbel);
      for (Index i = 0; i < nq; ++i) {
        const double* ci = c + i * nk;
        const double* gi = gumbel.data() + i * nk;
        for (Index j = 0; j < nk; ++j) noisy[at(i, j)] = ci[j] + tau * gi[j];
      }
      const Index failed = prices.empty()
                               ? ws.solver.solve(noisy, m, M)
                               : ws.solver.solve_warm(noisy, M, prices.data(), kSampleStrategy);
      if (failed >= 0) return failed;
      const int32_t* col4row = ws.solver.col4row();
      if (transposed) {
        for (Index j = 0; j < m; ++j) ++out[static_cast<size_t>(col4row[j] * nk + j)];
      } else {
        for (Index i = 0; i < m; ++i) ++out[static_cast<size_t>(i * nk + col4row[i])];
      }
    }
    return Index{-1};
  };
  const int64_t b_first = k_begin / kSamplesPerStream;
  const int64_t n_blocks = (k_end - 1) / kSamplesPerStream + 1 - b_first;
  const auto block_range = [&](int64_t b) {
    return std::pair{std::max(k_begin, b * kSamplesPerStream),
                     std::min(k_end, (b + 1) * kSamplesPerStream)};
  };
  const int threads =
      static_cast<int>(std::min<int64_t>(resolve_threads(n_threads), n_blocks));

  if (threads <= 1) {
    for (int64_t b = b_first; b < b_first + n_blocks && failed_row < 0; ++b) {
      const auto [k0, k1] = block_range(b);
      failed_row = run_block(b, k0, k1, counts);
    }
  } else {
#ifdef ATTNMIX_HAVE_OPENMP
    // Each thread counts into its own buffer; blocks are taken dynamically (the machine may be
    // shared) since the order of integer additions does not matter.
    std::vector<std::vector<int64_t>> part(static_cast<size_t>(threads),
                                           std::vector<int64_t>(static_cast<size_t>(nq * nk), 0));
    std::vector<Index> failed(static_cast<size_t>(threads), -1);
#pragma omp parallel num_threads(threads)
    {
      const auto t = static_cast<size_t>(omp_get_thread_num());
      try {
#pragma omp for schedule(dynamic, 1)
        for (int64_t b = b_first; b < b_first + n_blocks; ++b) {
          const auto [k0, k1] = block_range(b);
          const Index f = run_block(b, k0, k1, part[t]);
          if (f >= 0) failed[t] = f;
        }
      } catch (...) {
#pragma omp critical(attnmix_assign_counts)
        if (!error) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    for (size_t t = 0; t < part.size(); ++t) {
      if (failed[t] >= 0) failed_row = failed[t];
      for (size_t e = 0; e < counts.size(); ++e) counts[e] += part[t][e];
    }
#else
    for (int64_t b = b_first; b < b_first + n_blocks && failed_row < 0; ++b) {
      const auto [k0, k1] = block_range(b);
      failed_row = run_block(b, k0, k1, counts);
    }
#endif
  }
  // Feasibility depends only on the +inf pattern, so every sample fails at the same row.
  if (failed_row >= 0)
    throw ValueError(concat("frequency_estimate: no complete assignment of finite cost exists (",
                            transposed ? "column " : "row ", failed_row, " cannot be matched)"));
}

Matrix counts_to_frequency(std::span<const int64_t> counts, Index nq, Index nk, int64_t K) {
  Matrix freq(nq, nk);
  const auto denom = static_cast<double>(K);
  for (Index e = 0; e < nq * nk; ++e)
    freq.data()[e] = static_cast<double>(counts[static_cast<size_t>(e)]) / denom;
  return freq;
}

void check_frequency_arguments(const char* where, const Matrix& cost, double tau, int64_t K,
                               int n_threads) {
  check_tau(where, tau);
  if (K < 1) throw ValueError(concat(where, ": K must be >= 1 (got ", K, ")"));
  if (n_threads < 0)
    throw ValueError(concat(where, ": n_threads must be >= 0 (0 = all hardware threads)"));
  check_cost(where, cost);
}

}  // namespace detail

Assignment assignment_sample(const Matrix& cost, double tau, Rng& rng) {
  check_tau("assignment_sample", tau);
  check_cost("assignment_sample", cost);
  Matrix noisy(cost.rows(), cost.cols());
  detail::fill_gumbel(rng, std::span<double>(noisy.data(), static_cast<size_t>(noisy.size())));
  noisy = cost + tau * noisy;
  return linear_sum_assignment(noisy);
}

Matrix frequency_estimate(const Matrix& cost, double tau, int64_t K, Rng& rng, int n_threads) {
  detail::check_frequency_arguments("frequency_estimate", cost, tau, K, n_threads);
  const uint64_t base = rng.next_u64();
  std::vector<int64_t> counts(static_cast<size_t>(cost.size()), 0);
  detail::add_assignment_counts(cost, tau, base, 0, K, counts, n_threads);
  return detail::counts_to_frequency(counts, cost.rows(), cost.cols(), K);
}

Mask kruskal_tree(const Matrix& score) {
  const Index nq = score.rows();
  const Index nk = score.cols();
  if (nq == 0 || nk == 0)
    throw ValueError(concat("kruskal_tree: score must have at least one query and one key (got ",
                            nq, "x", nk, ")"));
  check_finite("kruskal_tree", "score", score);
  // Edge e = i·nk + j; ordering by e is ordering by (i, nq + j), so the key (−score, i, nq + j) is
  // (score descending, e ascending).
  const double* s = score.data();
  std::vector<int64_t> edges(static_cast<size_t>(nq * nk));
  std::iota(edges.begin(), edges.end(), int64_t{0});
  std::sort(edges.begin(), edges.end(),
            [s](int64_t a, int64_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });

  std::vector<Index> parent(static_cast<size_t>(nq + nk));
  std::iota(parent.begin(), parent.end(), Index{0});
  auto root = [&parent](Index x) {
    while (parent[static_cast<size_t>(x)] != x) {
      parent[static_cast<size_t>(x)] =
          parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];  // halving
      x = parent[static_cast<size_t>(x)];
    }
    return x;
  };
  Mask tree = Mask::Constant(nq, nk, false);
  const Index n_edges = nq + nk - 1;
  Index chosen = 0;
  for (const int64_t e : edges) {
    const Index i = e / nk;
    const Index j = e % nk;
    const Index a = root(i);
    const Index b = root(nq + j);
    if (a == b) continue;
    parent[static_cast<size_t>(a)] = b;
    tree(i, j) = true;
    if (++chosen == n_edges) break;
  }
  return tree;
}

AssignmentTree assignment_tree(const Matrix& cost, double tau, int64_t K, Rng& rng, int n_threads) {
  AssignmentTree result;
  result.freq = frequency_estimate(cost, tau, K, rng, n_threads);
  result.tree = kruskal_tree(result.freq);
  result.tree_freq = result.freq.cwiseProduct(result.tree.cast<double>());
  return result;
}

AttentionResult dense_attention(const Matrix& q, const Matrix& k, const Matrix& v) {
  check_attention_shapes("dense_attention", q, k, v);
  AttentionResult result;
  result.p = dot_logits(q, k);
  softmax_rows(result.p);
  result.out = result.p * v;
  return result;
}

SparseAttentionResult sparse_attention(const Matrix& q, const Matrix& k, const Matrix& v,
                                       const Matrix& tree_freq, double alpha, double eps) {
  constexpr const char* kWhere = "sparse_attention";
  check_attention_shapes(kWhere, q, k, v);
  if (tree_freq.rows() != q.rows() || tree_freq.cols() != k.rows())
    throw ValueError(concat(kWhere, ": tree_freq must be [", q.rows(), ", ", k.rows(), "] (got ",
                            tree_freq.rows(), "x", tree_freq.cols(), ")"));
  check_finite(kWhere, "tree_freq", tree_freq);
  if ((tree_freq.array() < 0.0).any()) throw ValueError(concat(kWhere, ": tree_freq must be >= 0"));
  if (!std::isfinite(alpha))
    throw ValueError(concat(kWhere, ": alpha must be finite (got ", alpha, ")"));
  if (!(std::isfinite(eps) && eps > 0.0))
    throw ValueError(concat(kWhere, ": eps must be finite and > 0 (got ", eps, ")"));

  SparseAttentionResult result;
  result.p = dot_logits(q, k);
  for (Index i = 0; i < q.rows(); ++i) {
    const auto f = tree_freq.row(i);
    // Repair: a row without positive frequency keeps its first largest entry (column 0 when all are
    // zero).
    Index keep = -1;
    if (!(f.array() > 0.0).any()) {
      keep = 0;
      for (Index j = 1; j < f.size(); ++j)
        if (f[j] > f[keep]) keep = j;
      result.repaired_rows.push_back(i);
    }
    auto row = result.p.row(i);
    for (Index j = 0; j < row.size(); ++j)
      row[j] = (f[j] > 0.0 || j == keep) ? row[j] + alpha * std::log(eps + f[j]) : -kInf;
  }
  softmax_rows(result.p);
  result.out = result.p * v;
  return result;
}

Index zero_frequency_tree_edges(const Mask& tree, const Matrix& freq) {
  if (tree.rows() != freq.rows() || tree.cols() != freq.cols())
    throw ValueError(concat("zero_frequency_tree_edges: tree (", tree.rows(), "x", tree.cols(),
                            ") and freq (", freq.rows(), "x", freq.cols(),
                            ") must have the same shape"));
  Index n = 0;
  for (Index e = 0; e < tree.size(); ++e) n += (tree.data()[e] && freq.data()[e] == 0.0) ? 1 : 0;
  return n;
}

}  // namespace attnmix::assign
