// SPDX-License-Identifier: Apache-2.0
/// @file sizes.hpp
/// Checked size arithmetic. Every element count that sizes an allocation from user-chosen dimensions
/// (L·S·S key tables, S·T emissions, S·D key means, n·N contexts, n·D queries, archive shapes, LM sizes) is computed
/// here, never by a bare multiplication: a product of non-negative extents that exceeds kMaxElements (or overflows
/// int64) is a ValueError naming where it arose and the extents, before anything is allocated.
///
/// kMaxElements = 2^48 elements (2 PiB of doubles) is far beyond any machine and far below the 2^63 of int64, so a
/// product that passes may still be too large for this machine's memory: that shows as std::bad_alloc, which
/// the CLI reports as an error (exit 2) and Python as MemoryError.
/// Cost: O(number of extents).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace attnmix {

/// The largest element count any array of attnmix may have.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;

/// The product of `extents`, each ≥ 0.
/// @throws ValueError "<where>: <what> (a x b x …) must have at most 2^48 elements" when the product exceeds
///         kMaxElements (an overflow of int64 included), or "<where>: <what>: extent k is negative (got e)".
[[nodiscard]] int64_t checked_product(std::string_view where, std::string_view what,
                                      std::initializer_list<int64_t> extents);

/// checked_product for an extent list held elsewhere (an archive's shape).
[[nodiscard]] int64_t checked_product(std::string_view where, std::string_view what, const int64_t* extents,
                                      size_t n_extents);

}  // namespace attnmix
