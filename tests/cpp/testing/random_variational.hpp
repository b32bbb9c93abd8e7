// SPDX-License-Identifier: Apache-2.0
/// @file random_variational.hpp
/// Random variational-embedding-attention rows for tests: contexts and queries uniform over [S] (repeats allowed, so a
/// query may sit in its own context) and targets uniform over [T].
#pragma once

#include <cstdint>

#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/core/rng.hpp"

namespace attnmix::testing {

inline VariationalEmbeddingAttentionBatch random_variational_rows(Index n, Index N, Index S, Index T, Rng& rng) {
  IdMatrix contexts(n, N);
  IdVector queries(n), targets(n);
  for (Index k = 0; k < contexts.size(); ++k) contexts.data()[k] = static_cast<int64_t>(rng.uniform_int(S));
  for (Index k = 0; k < n; ++k) {
    queries[k] = static_cast<int64_t>(rng.uniform_int(S));
    targets[k] = static_cast<int64_t>(rng.uniform_int(T));
  }
  return VariationalEmbeddingAttentionEncoder{S, N, T}.encode(contexts, queries, targets);
}

}  // namespace attnmix::testing
