// SPDX-License-Identifier: Apache-2.0
/// @file assignment_tree_impl.hpp
/// Private: the counting kernel of frequency_estimate, split so the experiment can run its
/// 10⁵-sample reference in slices (reporting progress between them) and still get exactly
/// frequency_estimate's result.
#pragma once

#include <cstdint>
#include <span>

#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix::assign::detail {

/// The Gumbel(0, 1) table of one sample: out[e] = −log(−log U_e) with U_e = rng.uniform_open()
/// drawn in order (row-major for a table). The logs are Eigen's vectorised ones, so values may
/// differ from rng.gumbel()'s in the last bits; the draws consumed are the same.
void fill_gumbel(Rng& rng, std::span<double> out);

/// Consumes the draws of fill_gumbel over n entries without computing the logs.
void skip_gumbel(Rng& rng, size_t n);

/// Samples per stream in frequency_estimate: samples [b·S, (b + 1)·S) are drawn, in order, from
/// Rng(derive_seed(base, SeedPurpose::kSampler, b)) (docs/decisions/0004-assignment-sample-streams.md).
inline constexpr int64_t kSamplesPerStream = 64;

/// counts[i, j] += #{k ∈ [k_begin, k_end) : sample k matches query i to key j}, sample k being the
/// (k mod S)-th sample of stream b = k / S (S = kSamplesPerStream), so the counts of [0, K) equal
/// the sum of the counts of any split of [0, K) into slices (a slice starting inside a block skips
/// the block's earlier draws). counts is [nq, nk] row-major. Blocks run on n_threads threads
/// (0 = all); the counts do not depend on it. Arguments are trusted
/// (check_frequency_arguments first).
/// @throws ValueError when the +inf pattern of cost admits no complete matching.
void add_assignment_counts(const Matrix& cost, double tau, uint64_t base, int64_t k_begin,
                           int64_t k_end, std::span<int64_t> counts, int n_threads);

/// freq = counts / K [nq, nk].
[[nodiscard]] Matrix counts_to_frequency(std::span<const int64_t> counts, Index nq, Index nk,
                                         int64_t K);

/// frequency_estimate's argument checks. @throws ValueError naming the argument.
void check_frequency_arguments(const char* where, const Matrix& cost, double tau, int64_t K,
                               int n_threads);

}  // namespace attnmix::assign::detail
