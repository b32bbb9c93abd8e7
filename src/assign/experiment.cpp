// SPDX-License-Identifier: Apache-2.0
// The assignment-tree experiment of seed 004 (docs/mechanisms.md#assignment-tree-attention). Every random quantity
// comes from a stream fixed by the procedure (base = Rng(seed), Rng(999), Rng(seed + 31K + r), Rng(777),
// Rng(4000 + t), Rng(7000 + t)), and every parallel part stores per-task results that are reduced
// in task order, so the result does not depend on n_threads.
#include "attnmix/assign/experiment.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include "assignment_tree_impl.hpp"
#include "attnmix/assign/assignment_tree.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/reduce.hpp"

namespace attnmix::assign {

namespace {

constexpr Index kN = 15;  // keys; queries are kN + 1
constexpr Index kD = 8;
constexpr double kTau = 1.7;
constexpr int64_t kReferenceSamples = 100000;
constexpr int64_t kReferenceSlices = 10;  // progress is reported between slices
constexpr std::array<int64_t, 8> kSampleSizes = {4, 8, 16, 32, 64, 128, 256, 512};
constexpr int64_t kTreeSamples = 128;
constexpr Index kValueDim = 5;
constexpr int64_t kRetrievalTrials = 80;
constexpr int64_t kRetrievalSamples = 16;
constexpr Index kRetrievalValueDim = 3;
constexpr double kRetrievalAlpha = 0.5;
constexpr double kKeyNoise = 0.8;
constexpr double kOccupancyFloor = 1e-4;
constexpr double kCorrEps = 1e-6;

Matrix normal_matrix(Rng& rng, Index rows, Index cols) {
  Matrix x(rows, cols);
  for (Index e = 0; e < x.size(); ++e) x.data()[e] = rng.normal();  // row-major draw order
  return x;
}

/// cost[i, j] = ‖q_i − k_j‖² [nq, nk].
Matrix squared_distances(const Matrix& q, const Matrix& k) {
  Matrix cost(q.rows(), k.rows());
  for (Index i = 0; i < q.rows(); ++i)
    for (Index j = 0; j < k.rows(); ++j) cost(i, j) = (q.row(i) - k.row(j)).squaredNorm();
  return cost;
}

double mean_of(const std::vector<double>& x) {
  double s = 0.0;
  for (double v : x) s += v;
  return s / static_cast<double>(x.size());
}

/// Pearson correlation of x and y.
double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const double mx = mean_of(x);
  const double my = mean_of(y);
  double sxy = 0.0, sxx = 0.0, syy = 0.0;
  for (size_t n = 0; n < x.size(); ++n) {
    sxy += (x[n] - mx) * (y[n] - my);
    sxx += (x[n] - mx) * (x[n] - mx);
    syy += (y[n] - my) * (y[n] - my);
  }
  return sxy / std::sqrt(sxx * syy);
}

/// Least-squares slope of y against x.
double ls_slope(const std::vector<double>& x, const std::vector<double>& y) {
  const double mx = mean_of(x);
  const double my = mean_of(y);
  double sxy = 0.0, sxx = 0.0;
  for (size_t n = 0; n < x.size(); ++n) {
    sxy += (x[n] - mx) * (y[n] - my);
    sxx += (x[n] - mx) * (x[n] - mx);
  }
  return sxy / sxx;
}

/// Runs body(t) for t ∈ [0, n) on up to `threads` threads; the first failing task's exception
/// (lowest t) is rethrown. body writes only to its own slot t.
template <class Body>
void parallel_tasks(int64_t n, int threads, Body&& body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
#ifdef ATTNMIX_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
#endif
  for (int64_t t = 0; t < n; ++t) {
    try {
      body(t);
    } catch (...) {
      errors[static_cast<size_t>(t)] = std::current_exception();
    }
  }
  (void)threads;
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
}

struct RetrievalTrial {
  double dense_mse = 0.0, sparse_mse = 0.0;
  Index tree_edges = 0, zero_frequency_edges = 0, repaired_rows = 0;
};

/// Retrieval trial t (the retrieval comparison of docs/mechanisms.md#assignment-tree-attention).
RetrievalTrial retrieval_trial(int64_t t) {
  Rng rr(static_cast<uint64_t>(4000 + t));
  const Matrix qq = normal_matrix(rr, kN + 1, kD);
  const Matrix kk = qq.topRows(kN) + kKeyNoise * normal_matrix(rr, kN, kD);
  const Matrix vv = normal_matrix(rr, kN, kRetrievalValueDim);
  const Matrix cc = squared_distances(qq, kk);
  Matrix target(kN + 1, kRetrievalValueDim);
  for (Index i = 0; i < kN + 1; ++i) {
    Index nearest = 0;  // first minimum, as numpy's argmin
    for (Index j = 1; j < kN; ++j)
      if (cc(i, j) < cc(i, nearest)) nearest = j;
    target.row(i) = vv.row(nearest);
  }
  const AttentionResult dense = dense_attention(qq, kk, vv);
  Rng tree_rng(static_cast<uint64_t>(7000 + t));
  const AssignmentTree tree = assignment_tree(cc, kTau, kRetrievalSamples, tree_rng, 1);
  const SparseAttentionResult sparse =
      sparse_attention(qq, kk, vv, tree.tree_freq, kRetrievalAlpha);
  RetrievalTrial r;
  r.dense_mse = (dense.out - target).squaredNorm() / static_cast<double>(target.size());
  r.sparse_mse = (sparse.out - target).squaredNorm() / static_cast<double>(target.size());
  r.tree_edges = tree.tree.count();
  r.zero_frequency_edges = zero_frequency_tree_edges(tree.tree, tree.freq);
  r.repaired_rows = static_cast<Index>(sparse.repaired_rows.size());
  return r;
}

}  // namespace

nlohmann::ordered_json AssignmentTreeExperimentResult::to_json() const {
  nlohmann::ordered_json out;
  out["seed"] = seed;
  out["shape"] = {n_queries, n_keys};
  out["tau"] = tau;
  out["prediction_1_rmse_slope_predicted"] = rmse_slope_predicted;
  out["prediction_1_rmse_slope_observed"] = rmse_slope_observed;
  nlohmann::ordered_json by_k = nlohmann::ordered_json::object();
  for (const auto& [K, value] : rmse) by_k[std::to_string(K)] = value;
  out["prediction_1_rmse"] = by_k;
  nlohmann::ordered_json union_list = nlohmann::ordered_json::array();
  for (const UnionEdges& u : union_edges) {
    nlohmann::ordered_json item;
    item["K"] = u.K;
    item["observed"] = u.observed;
    item["predicted"] = u.predicted;
    union_list.push_back(item);
  }
  out["prediction_2_union_edges"] = union_list;
  out["prediction_3_frequency_corr_alpha0"] = corr_alpha0;
  out["prediction_3_frequency_corr_alpha1"] = corr_alpha1;
  out["transport_max_row_marginal_error"] = transport_max_row_marginal_error;
  out["transport_max_key_marginal_error"] = transport_max_key_marginal_error;
  out["tree_edges_expected"] = tree_edges_expected;
  out["tree_edges_observed"] = tree_edges_observed;
  out["dense_retrieval_mse"] = dense_retrieval_mse;
  out["tree_sparse_retrieval_mse"] = tree_sparse_retrieval_mse;
  out["tree_edges_K16_mean"] = tree_edges_K16_mean;
  out["raw_union_edges_K16_mean"] = raw_union_edges_K16_mean;
  out["transport_max_key_marginal_error_expected"] = transport_max_key_marginal_error_expected;
  out["prediction_3_tree_zero_frequency_edges"] = prediction_3_tree_zero_frequency_edges;
  out["retrieval_zero_frequency_tree_edges_total"] = retrieval_zero_frequency_tree_edges_total;
  out["retrieval_repaired_query_rows_total"] = retrieval_repaired_query_rows_total;
  out["retrieval_trials_with_repair"] = retrieval_trials_with_repair;
  add_tree_fields(out, prediction_3_frequencies, prediction_3_tree);
  return out;
}

void add_tree_fields(nlohmann::ordered_json& doc, const Matrix& freq, const Mask& tree) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  nlohmann::ordered_json edges = nlohmann::ordered_json::array();
  for (Index i = 0; i < freq.rows(); ++i) {
    nlohmann::ordered_json row = nlohmann::ordered_json::array();
    for (Index j = 0; j < freq.cols(); ++j) {
      row.push_back(freq(i, j));
      if (tree(i, j)) edges.push_back({i, j});
    }
    rows.push_back(std::move(row));
  }
  doc["prediction_3_frequencies"] = std::move(rows);
  doc["prediction_3_tree_edges"] = std::move(edges);
}

AssignmentTreeExperimentResult run_assignment_tree_experiment(
    uint64_t seed, int n_threads, const std::function<void(const std::string&, double)>& progress) {
  if (n_threads < 0)
    throw ValueError(
        "run_assignment_tree_experiment: n_threads must be >= 0 (0 = all hardware threads)");
  const int threads = resolve_threads(n_threads);
  // Progress is the fraction of all LAP samples done (the reference estimate dominates).
  int64_t total_samples = kReferenceSamples + kTreeSamples + kRetrievalTrials * kRetrievalSamples;
  for (int64_t K : kSampleSizes) total_samples += K * (K <= 128 ? 30 : 15);
  int64_t done_samples = 0;
  auto report = [&](const std::string& stage, int64_t samples) {
    done_samples += samples;
    if (progress)
      progress(stage, static_cast<double>(done_samples) / static_cast<double>(total_samples));
  };

  AssignmentTreeExperimentResult res;
  res.seed = seed;
  res.n_queries = kN + 1;
  res.n_keys = kN;
  res.tau = kTau;
  res.rmse_slope_predicted = -0.5;

  Rng base(seed);
  const Matrix q = normal_matrix(base, kN + 1, kD);
  const Matrix k = normal_matrix(base, kN, kD);
  const Matrix cost = squared_distances(q, k);
  if (progress) progress("reference", 0.0);

  // Prediction 1: ref = frequency_estimate(cost, τ, 100 000, Rng(999)), in slices of the same
  // sample sequence.
  Matrix ref;
  {
    Rng ref_rng(999);
    detail::check_frequency_arguments("run_assignment_tree_experiment", cost, kTau,
                                      kReferenceSamples, n_threads);
    const uint64_t ref_base = ref_rng.next_u64();  // what frequency_estimate draws
    std::vector<int64_t> counts(static_cast<size_t>(cost.size()), 0);
    for (int64_t s = 0; s < kReferenceSlices; ++s) {
      // Slice boundaries on whole stream blocks, so no slice re-draws a block's earlier samples.
      const auto boundary = [](int64_t slice) {
        const int64_t first = kReferenceSamples * slice / kReferenceSlices;
        return slice == kReferenceSlices ? first : first / detail::kSamplesPerStream * detail::kSamplesPerStream;
      };
      const int64_t k0 = boundary(s);
      const int64_t k1 = boundary(s + 1);
      detail::add_assignment_counts(cost, kTau, ref_base, k0, k1, counts, threads);
      report("reference", k1 - k0);
    }
    ref = detail::counts_to_frequency(counts, cost.rows(), cost.cols(), kReferenceSamples);
  }

  std::vector<double> log_k, log_rmse, distinct;
  for (int64_t K : kSampleSizes) {
    const int64_t reps = K <= 128 ? 30 : 15;
    std::vector<double> rmse_r(static_cast<size_t>(reps)), nonzero_r(static_cast<size_t>(reps));
    parallel_tasks(reps, threads, [&](int64_t r) {
      Rng rr(seed + static_cast<uint64_t>(31 * K + r));
      const Matrix f = frequency_estimate(cost, kTau, K, rr, 1);
      rmse_r[static_cast<size_t>(r)] =
          std::sqrt((f - ref).squaredNorm() / static_cast<double>(f.size()));
      nonzero_r[static_cast<size_t>(r)] = static_cast<double>((f.array() != 0.0).count());
    });
    const double rmse_k = mean_of(rmse_r);
    const double distinct_k = mean_of(nonzero_r);
    // Prediction 2: E[#distinct pairs in K samples] ≈ Σ_{ref_ij > 1e-4} 1 − (1 − ref_ij)^K
    // (independent occupancy).
    double predicted = 0.0;
    for (Index e = 0; e < ref.size(); ++e) {
      const double p = ref.data()[e];
      if (p > kOccupancyFloor) predicted += 1.0 - std::pow(1.0 - p, static_cast<double>(K));
    }
    res.rmse[K] = rmse_k;
    res.union_edges.push_back({K, distinct_k, predicted});
    log_k.push_back(std::log(static_cast<double>(K)));
    log_rmse.push_back(std::log(rmse_k));
    distinct.push_back(distinct_k);
    report("prediction_1", K * reps);
  }
  res.rmse_slope_observed = ls_slope(log_k, log_rmse);

  // Prediction 3: a K = 128 tree; v is drawn from base after q and k.
  Rng tree_rng(777);
  const AssignmentTree tree = assignment_tree(cost, kTau, kTreeSamples, tree_rng, threads);
  const Matrix v = normal_matrix(base, kN, kValueDim);
  const SparseAttentionResult p0 = sparse_attention(q, k, v, tree.tree_freq, 0.0);
  const SparseAttentionResult p1 = sparse_attention(q, k, v, tree.tree_freq, 1.0);
  std::vector<double> log_f, prob0, prob1;  // over tree edges, row-major
  for (Index i = 0; i < tree.tree.rows(); ++i)
    for (Index j = 0; j < tree.tree.cols(); ++j) {
      if (!tree.tree(i, j)) continue;
      log_f.push_back(std::log(kCorrEps + tree.tree_freq(i, j)));
      prob0.push_back(p0.p(i, j));
      prob1.push_back(p1.p(i, j));
    }
  res.corr_alpha0 = pearson(log_f, prob0);
  res.corr_alpha1 = pearson(log_f, prob1);
  res.tree_edges_observed = tree.tree.count();
  res.prediction_3_frequencies = tree.freq;
  res.prediction_3_tree = tree.tree;
  res.prediction_3_tree_zero_frequency_edges = zero_frequency_tree_edges(tree.tree, tree.freq);

  // Transport check on T = freq / (n + 1): key (column) sums of freq are exactly 1, so the key
  // error is the constant 1/n − 1/(n + 1); the row error reflects the one query left unmatched in
  // every sample.
  const auto n = static_cast<double>(kN);
  const Matrix transport = tree.freq / (n + 1.0);
  res.transport_max_row_marginal_error =
      (transport.rowwise().sum().array() - 1.0 / (n + 1.0)).abs().maxCoeff();
  res.transport_max_key_marginal_error =
      (transport.colwise().sum().array() - 1.0 / n).abs().maxCoeff();
  res.transport_max_key_marginal_error_expected = 1.0 / n - 1.0 / (n + 1.0);
  res.tree_edges_expected = 2 * kN;
  report("prediction_3", kTreeSamples);

  // Retrieval: 80 trials, each on its own streams.
  std::vector<RetrievalTrial> trials(static_cast<size_t>(kRetrievalTrials));
  parallel_tasks(kRetrievalTrials, threads,
                 [&](int64_t t) { trials[static_cast<size_t>(t)] = retrieval_trial(t); });
  std::vector<double> dense_err, sparse_err, edges;
  for (const RetrievalTrial& t : trials) {
    dense_err.push_back(t.dense_mse);
    sparse_err.push_back(t.sparse_mse);
    edges.push_back(static_cast<double>(t.tree_edges));
    res.retrieval_zero_frequency_tree_edges_total += t.zero_frequency_edges;
    res.retrieval_repaired_query_rows_total += t.repaired_rows;
    res.retrieval_trials_with_repair += t.repaired_rows > 0 ? 1 : 0;
  }
  res.dense_retrieval_mse = mean_of(dense_err);
  res.tree_sparse_retrieval_mse = mean_of(sparse_err);
  res.tree_edges_K16_mean = mean_of(edges);
  // Prediction 1's union size at K = 16 on the first cost matrix (not like-for-like with
  // tree_edges_K16_mean).
  res.raw_union_edges_K16_mean = distinct[2];
  report("retrieval", kRetrievalTrials * kRetrievalSamples);
  if (progress) progress("done", 1.0);
  return res;
}

}  // namespace attnmix::assign
