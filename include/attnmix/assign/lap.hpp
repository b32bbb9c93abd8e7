// SPDX-License-Identifier: Apache-2.0
/// @file lap.hpp
/// Rectangular linear assignment: min Σ cost[i, σ(i)] over injective matchings of min(nq, nk) pairs.
///
/// Algorithm: shortest augmenting paths with dual prices (Jonker–Volgenant as described by Crouse, 2016 — the
/// family scipy.optimize.linear_sum_assignment uses). The smaller side is augmented one vertex at a time with a
/// Dijkstra-like search over reduced costs; dual feasibility keeps every reduced cost ≥ 0.
/// Cost: O(m²·M) time for an m × M problem with m = min(nq, nk), M = max(nq, nk); O(nq·nk) memory (a transposed
/// copy when nq > nk).
/// Forbidden pairs: +∞ entries are never matched. NaN or −∞ entries, or a problem with no finite matching of
/// min(nq, nk) pairs, raise ValueError (never hang).
#pragma once

#include <vector>

#include "attnmix/core/types.hpp"

namespace attnmix::assign {

/// Matched pairs (rows[k], cols[k]), sorted by row; min(nq, nk) of them.
struct Assignment {
  /// The matched rows (queries), increasing.
  std::vector<Index> rows;
  /// cols[k]: the column (key) matched to rows[k].
  std::vector<Index> cols;
};

/// The minimum-cost assignment of cost [nq, nk] (see the file comment); empty when a side is empty.
/// @throws ValueError on NaN or −∞ entries, a side of 2³¹ − 1 or more, or when no complete assignment of finite cost
/// exists.
[[nodiscard]] Assignment linear_sum_assignment(const Matrix& cost);

}  // namespace attnmix::assign
