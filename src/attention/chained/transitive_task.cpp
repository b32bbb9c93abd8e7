// SPDX-License-Identifier: Apache-2.0
#include "attnmix/attention/transitive_task.hpp"

#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"

namespace attnmix {

ChainedAttentionBatch make_transitive_task(Index n_rows, uint64_t seed, const TransitiveTaskOptions& o) {
  constexpr const char* kWhere = "make_transitive_task";
  check::positive_int(kWhere, "num_symbols", o.n_symbols);
  check::positive_int(kWhere, "n_pairs", o.n_pairs);
  if (3 * o.n_pairs > o.n_symbols)
    throw ValueError(std::string(kWhere) + ": 3 * n_pairs must be <= num_symbols (the symbols of a row are distinct)");
  if (n_rows < 0) throw ValueError(std::string(kWhere) + ": n_rows must be >= 0");
  const int64_t M = o.n_pairs;
  Rng rng(derive_seed(seed, SeedPurpose::kData, 0));
  IdMatrix keys(n_rows, 2 * M);
  IdMatrix values(n_rows, 2 * M);
  IdVector queries(n_rows);
  IdVector targets(n_rows);
  for (Index row = 0; row < n_rows; ++row) {
    const std::vector<int64_t> symbols = rng.sample_without_replacement(o.n_symbols, 3 * M);
    const std::vector<int64_t> perm = rng.sample_without_replacement(M, M);
    const auto a = [&](int64_t m) { return symbols[static_cast<size_t>(m)]; };
    const auto b = [&](int64_t m) { return symbols[static_cast<size_t>(M + m)]; };
    const auto c = [&](int64_t m) { return symbols[static_cast<size_t>(2 * M + m)]; };
    for (int64_t m = 0; m < M; ++m) {
      keys(row, m) = a(m);
      keys(row, M + m) = b(perm[static_cast<size_t>(m)]);
      values(row, m) = b(m);
      values(row, M + m) = c(m);
    }
    const auto i = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(M)));
    int64_t j = 0;
    while (perm[static_cast<size_t>(j)] != i) ++j;  // b_π(j) = b_i
    queries[row] = a(i);
    targets[row] = c(j);
  }
  return ChainedAttentionEncoder{o.n_symbols, o.n_symbols}.encode(std::move(keys), std::move(values),
                                                                    std::move(queries), std::move(targets));
}

}  // namespace attnmix
