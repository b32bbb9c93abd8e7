// SPDX-License-Identifier: Apache-2.0
/// @file reduce.hpp
/// The deterministic multi-threaded E-step and scoring pass (SPEC.md §1.8).
///
/// Rows are split into fixed chunks of chunk_rows rows (independent of the thread count). Chunk c fills a zeroed
/// partial P_c; partials are added into the total in chunk order, total = ((0 + P_0) + P_1) + …, inside an OpenMP
/// `ordered` region, so each thread reuses one partial buffer and the result is bitwise identical for any thread
/// count. Impossible rows of all chunks are collected before the total is added to the caller's accumulator, so the
/// E-step stays atomic.
/// Cost: the family's per-row cost, plus one flat add of the statistics per chunk.
#pragma once

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/types.hpp"
#include "attnmix/stats/log_math.hpp"

namespace attnmix {

struct ParallelOptions {
  int n_threads = 0;        // 0: all hardware threads
  Index chunk_rows = 1024;  // fixed chunking; results change with it only at rounding level
  void validate() const;
};

/// Threads to use for n_threads (0 = hardware); 1 without OpenMP.
[[nodiscard]] int resolve_threads(int n_threads);

/// acc += statistics of (batch, w) under model, atomically; log_p_out (if non-empty) receives per-row log p.
/// @throws ImpossibleEvidenceError (listing rows of the whole batch) and every error of the family's E-step.
template <class D>
void parallel_accumulate(const D& model, const typename D::batch_type& batch, std::span<const double> w,
                         typename D::accumulator_type& acc, std::span<double> log_p_out,
                         const ParallelOptions& options) {
  options.validate();
  const Index n = batch.n_rows();
  if (static_cast<Index>(w.size()) != n)
    throw ValueError("E-step: weights must have one entry per row (" + std::to_string(n) + ", got " +
                     std::to_string(w.size()) + ")");
  if (!log_p_out.empty() && static_cast<Index>(log_p_out.size()) != n)
    throw ValueError("E-step: log-density output must have one entry per row");
  const Index chunk = options.chunk_rows;
  const Index n_chunks = (n + chunk - 1) / chunk;
  const int n_threads = std::max(1, std::min<int>(resolve_threads(options.n_threads), static_cast<int>(n_chunks)));

  auto total = model.make_accumulator();
  std::mutex error_mutex;
  std::exception_ptr error;
  std::string impossible_where;
  std::vector<int64_t> impossible;
  bool failed = false;  // read and written under error_mutex only

#pragma omp parallel num_threads(n_threads)
  {
    auto partial = model.make_accumulator();
#pragma omp for ordered schedule(static, 1)
    for (Index c = 0; c < n_chunks; ++c) {
      const Index begin = c * chunk;
      const Index count = std::min(chunk, n - begin);
      bool ok = false;
      try {
        partial.set_zero();
        model.accumulate(batch.slice(begin, count), w.subspan(static_cast<size_t>(begin), static_cast<size_t>(count)),
                         partial,
                         log_p_out.empty() ? log_p_out
                                           : log_p_out.subspan(static_cast<size_t>(begin), static_cast<size_t>(count)));
        ok = true;
      } catch (const ImpossibleEvidenceError& e) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        failed = true;
        impossible_where = e.where();
        for (int64_t row : e.rows()) impossible.push_back(row + begin);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        failed = true;
        if (!error) error = std::current_exception();
      }
#pragma omp ordered
      {
        if (ok) total.merge_trusted(partial);
      }
    }
  }
  if (error) std::rethrow_exception(error);
  if (failed) {
    std::sort(impossible.begin(), impossible.end());
    throw ImpossibleEvidenceError(impossible_where, std::move(impossible));
  }
  acc.merge_trusted(total);
}

/// out[n] = log p(x_n) computed chunk-parallel (no reduction, so trivially thread-count invariant).
template <class D>
void parallel_log_density(const D& model, const typename D::batch_type& batch, std::span<double> out,
                          const ParallelOptions& options) {
  options.validate();
  const Index n = batch.n_rows();
  if (static_cast<Index>(out.size()) != n) throw ValueError("log_density: output must have one entry per row");
  const Index chunk = options.chunk_rows;
  const Index n_chunks = (n + chunk - 1) / chunk;
  const int n_threads = std::max(1, std::min<int>(resolve_threads(options.n_threads), static_cast<int>(n_chunks)));
  std::mutex error_mutex;
  std::exception_ptr error;
#pragma omp parallel for num_threads(n_threads) schedule(static, 1)
  for (Index c = 0; c < n_chunks; ++c) {
    const Index begin = c * chunk;
    const Index count = std::min(chunk, n - begin);
    try {
      model.log_density(batch.slice(begin, count),
                        out.subspan(static_cast<size_t>(begin), static_cast<size_t>(count)));
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

/// Σ_n log p(x_n) with unit weights, summed in a fixed pairwise order.
template <class D>
[[nodiscard]] double score(const D& model, const typename D::batch_type& batch, const ParallelOptions& options) {
  std::vector<double> log_p(static_cast<size_t>(batch.n_rows()));
  parallel_log_density(model, batch, log_p, options);
  return pairwise_sum(log_p);
}

}  // namespace attnmix
