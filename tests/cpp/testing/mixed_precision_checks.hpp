// SPDX-License-Identifier: Apache-2.0
/// @file mixed_precision_checks.hpp
/// Checks shared by the mixed-precision tests of the attention families (header-only): the same EM run at several
/// thread counts, one EM run in each precision with the checks every family's mixed precision must pass, and the
/// rejection of impossible rows.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/precision.hpp"
#include "attnmix/inference/optimize.hpp"

namespace attnmix::testing {

/// The models `estimator` fits from `batch` in `iterations` EM iterations (no convergence stop), in chunks of 256
/// rows, with 1, 2 and 3 threads.
template <class Batch, class Estimator>
auto fits_for_thread_counts(const Batch& batch, const Estimator& estimator, int iterations) {
  std::vector<decltype(optimize(batch, estimator, OptimizeOptions{}).model)> fits;
  for (const int threads : {1, 2, 3}) {
    OptimizeOptions o;
    o.max_its = iterations;
    o.delta = std::nullopt;
    o.n_threads = threads;
    o.chunk_rows = 256;
    fits.push_back(optimize(batch, estimator, o).model);
  }
  return fits;
}

/// `iterations` EM iterations from the same start (seed 3) in float64 and in mixed precision; checks that each fit
/// carries its estimator's precision (estimate() returns mixed models, model.estimator() keeps mixed) and that the
/// final log-likelihoods agree within 1e-5 relative. Returns {float64 result, mixed result}.
template <class Batch, class Estimator>
auto em_in_both_precisions(const Batch& batch, const Estimator& float64, const Estimator& mixed, int iterations) {
  OptimizeOptions o;
  o.max_its = iterations;
  o.delta = std::nullopt;
  o.seed = 3;
  auto exact = optimize(batch, float64, o);
  auto approx = optimize(batch, mixed, o);
  EXPECT_EQ(approx.model.precision(), Precision::kMixed);
  EXPECT_EQ(approx.model.estimator().options().precision, Precision::kMixed);
  EXPECT_EQ(exact.model.precision(), Precision::kFloat64);
  EXPECT_NEAR(approx.scores.back(), exact.scores.back(), 1e-5 * std::abs(exact.scores.back()));
  return std::pair{std::move(exact), std::move(approx)};
}

/// model.accumulate(batch, weights, acc) throws ImpossibleEvidenceError naming exactly `rows` (the caller checks that
/// acc is untouched, in its family's terms).
template <class Model, class Batch, class Accumulator>
void expect_impossible_rows(const Model& model, const Batch& batch, const std::vector<double>& weights,
                            Accumulator& acc, const std::vector<int64_t>& rows) {
  try {
    model.accumulate(batch, weights, acc);
    FAIL() << "no ImpossibleEvidenceError";
  } catch (const ImpossibleEvidenceError& e) {
    EXPECT_EQ(e.rows(), rows);
  }
}

}  // namespace attnmix::testing
