// SPDX-License-Identifier: Apache-2.0
/// @file ra_workload.hpp
/// The responsibility-attention benchmark workload shared by bench_em_iteration.cpp and bench_mpi.cpp: model and
/// data drawn from one Rng, in this order (so a given seed gives the same model and rows in both programs).
///   model: K ~ N(0, 1) [S, D] row-major; B rows = normalised U(0.05, 1) draws [S, T]; π = normalised U(0.5, 1) [N];
///          σ² = 1
///   rows:  contexts uniform over S; query = key of a uniformly chosen position + N(0, σ²) noise; targets uniform
#pragma once

#include <cmath>
#include <cstdint>
#include <utility>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/rng.hpp"

namespace attnmix::bench {

struct RaShape {
  Index N = 16;   // context length
  Index D = 32;   // query dimension
  Index S = 256;  // symbols
  Index T = 256;  // targets
};

/// The foundation's problem (issue 1): N = 16, D = 32, S = T = 256 (200000 rows in the benchmarks).
inline constexpr RaShape kFoundationShape{16, 32, 256, 256};

inline ResponsibilityAttention make_ra_model(const RaShape& shape, Rng& rng) {
  ResponsibilityAttentionParams p;
  p.key_means.resize(shape.S, shape.D);
  for (Index k = 0; k < p.key_means.size(); ++k) p.key_means.data()[k] = rng.normal();
  p.emission.resize(shape.S, shape.T);
  for (Index s = 0; s < shape.S; ++s) {
    for (Index t = 0; t < shape.T; ++t) p.emission(s, t) = 0.05 + 0.95 * rng.uniform();
    p.emission.row(s) /= p.emission.row(s).sum();
  }
  p.position_prior.resize(shape.N);
  for (Index i = 0; i < shape.N; ++i) p.position_prior[i] = 0.5 + 0.5 * rng.uniform();
  p.position_prior /= p.position_prior.sum();
  p.sigma2 = 1.0;
  return ResponsibilityAttention(std::move(p));
}

inline ResponsibilityAttentionBatch make_ra_batch(const ResponsibilityAttention& model, Index rows, Rng& rng) {
  const Index N = model.context_length();
  const Index D = model.query_dim();
  const Index S = model.n_symbols();
  const Index T = model.n_targets();
  IdMatrix contexts(rows, N);
  Matrix queries(rows, D);
  IdVector targets(rows);
  const Matrix& K = model.params().key_means;
  const double sigma = std::sqrt(model.sigma2());
  for (Index n = 0; n < rows; ++n) {
    for (Index i = 0; i < N; ++i) contexts(n, i) = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(S)));
    const int64_t s = contexts(n, static_cast<Index>(rng.uniform_int(static_cast<uint64_t>(N))));
    for (Index d = 0; d < D; ++d) queries(n, d) = K(s, d) + sigma * rng.normal();
    targets[n] = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(T)));
  }
  return model.encoder().encode(std::move(contexts), std::move(queries), std::move(targets));
}

/// Rows [begin, begin + count) of batch in storage of their own (a rank's shard: its rows only, contiguous).
inline ResponsibilityAttentionBatch own_rows(const ResponsibilityAttention& model,
                                             const ResponsibilityAttentionBatch& batch, Index begin, Index count) {
  const ResponsibilityAttentionBatch view = batch.slice(begin, count);
  return model.encoder().encode(view.contexts(), view.queries(), view.targets());
}

}  // namespace attnmix::bench
