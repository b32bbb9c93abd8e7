// SPDX-License-Identifier: Apache-2.0
// Software prefetch of the rows a kernel reads next (private header; docs/PERFORMANCE.md).
#pragma once

#include <cstdint>

#include "attnmix/core/types.hpp"

namespace attnmix {

/// Rows ahead of the one being processed whose query and context lines are requested early: the hardware
/// prefetcher alone leaves the first access of each 256-byte query row waiting for memory (docs/PERFORMANCE.md).
constexpr Index kPrefetchRows = 6;

/// Requests the cache lines of bytes [p, p + size) (a hint; it changes no result). Always inlined: GCC drops
/// __builtin_prefetch from an out-of-line helper it deems pure.
[[gnu::always_inline]] inline void prefetch_lines(const void* p, Index size) {
  constexpr Index kCacheLine = 64;
  const char* bytes = static_cast<const char*>(p);
  for (Index b = 0; b < size; b += kCacheLine) __builtin_prefetch(bytes + b);
}

/// Requests the query and context lines of row n + kPrefetchRows of a responsibility-attention batch, if it has one.
template <class Batch>
[[gnu::always_inline]] inline void prefetch_rows_ahead(const Batch& batch, Index n) {
  if (n + kPrefetchRows >= batch.n_rows()) return;
  prefetch_lines(batch.query(n + kPrefetchRows), batch.query_dim() * Index{sizeof(double)});
  prefetch_lines(batch.context(n + kPrefetchRows), batch.context_length() * Index{sizeof(int64_t)});
}

}  // namespace attnmix
