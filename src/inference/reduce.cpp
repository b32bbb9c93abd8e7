// SPDX-License-Identifier: Apache-2.0
#include "attnmix/inference/reduce.hpp"

#include <algorithm>
#include <bit>

#ifdef ATTNMIX_HAVE_OPENMP
#include <omp.h>
#endif

namespace attnmix {

void ParallelOptions::validate() const {
  if (n_threads < 0) throw ValueError("ParallelOptions: n_threads must be >= 0 (0 = all hardware threads)");
  if (chunk_rows < 0) throw ValueError("ParallelOptions: chunk_rows must be >= 0 (0 = chosen from the statistics' size)");
}

Index chunk_rows_for(const ParallelOptions& options, size_t stat_entries) {
  if (options.chunk_rows > 0) return options.chunk_rows;
  const size_t wanted = std::bit_floor(stat_entries / 16);
  return std::clamp(static_cast<Index>(std::min<size_t>(wanted, kMaxAutoChunkRows)), kMinAutoChunkRows,
                    kMaxAutoChunkRows);
}

int resolve_threads(int n_threads) {
#ifdef ATTNMIX_HAVE_OPENMP
  return n_threads > 0 ? n_threads : omp_get_num_procs();
#else
  (void)n_threads;
  return 1;
#endif
}

}  // namespace attnmix
