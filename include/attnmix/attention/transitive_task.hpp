// SPDX-License-Identifier: Apache-2.0
/// @file transitive_task.hpp
/// The transitive-lookup task, used by the acceptance tests, `attnmix demo` and the benchmarks.
///
/// Each row draws distinct symbols a_1..a_M, b_1..b_M, c_1..c_M of [S] and a permutation π of [M]:
///   keys = [a_1..a_M, b_π(1)..b_π(M)],  values = [b_1..b_M, c_1..c_M]   (N = 2M)
///   query = a_i for a uniform i,  target = c_j where b_π(j) = b_i       (T = S)
/// One hop finds b_i but never c_j: answering needs a → b → c, two chained lookups.
#pragma once

#include <cstdint>

#include "attnmix/attention/chained.hpp"

namespace attnmix {

/// The sizes of the transitive-lookup task (make_transitive_task()).
struct TransitiveTaskOptions {
  /// S, the number of symbols, which is also the number of targets T (positive and at least 3·M; default 30).
  int64_t n_symbols = 30;  // S (= T)
  /// M, the number of pairs per row (positive; default 5). The context length is N = 2M.
  int64_t n_pairs = 5;     // M; the context length is N = 2M
};

/// n rows drawn from a stream seeded by derive_seed(seed, kData, 0).
/// @throws ValueError unless 3·M ≤ S (the symbols of a row are distinct).
/// The batch declares S = T = n_symbols. @throws ValueError also when S or M is not positive, or n_rows is negative.
[[nodiscard]] ChainedAttentionBatch make_transitive_task(Index n_rows, uint64_t seed,
                                                         const TransitiveTaskOptions& options = {});

}  // namespace attnmix
