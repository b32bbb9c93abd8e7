// SPDX-License-Identifier: Apache-2.0
/// @file row_table_impl.hpp
/// A data reader's rows, written in place. Each field's table (rows × width, row-major, or a vector) is allocated
/// once, when the field's width is first known, for the number of rows the reader counted before parsing (the data
/// lines of a JSON Lines stripe, the rows of an .npz stripe), then filled entry by entry in row order and handed over
/// without a copy. A reader's peak memory is thus about the rows themselves; growing vectors copied into matrices at
/// the end used to take two to three times that.
#pragma once

#include <stdexcept>
#include <utility>

#include "attnmix/core/types.hpp"

namespace attnmix {

/// M: IdMatrix or Matrix (rows × width), or IdVector (one entry per row).
template <class M>
class RowTable {
 public:
  using Scalar = typename M::Scalar;

  /// Allocates rows × width entries on the first call (width 1 for a vector); later calls do nothing.
  void allocate(Index rows, Index width) {
    if (allocated_) return;
    if constexpr (M::ColsAtCompileTime == 1) table_.resize(rows);
    else table_.resize(rows, width);
    allocated_ = true;
  }
  /// The next entry, in row order.
  void push_back(Scalar value) {
    if (next_ >= table_.size()) throw std::logic_error("RowTable: more entries than the rows counted");
    table_.data()[next_++] = value;
  }
  /// The first `rows` rows (copied only when they are fewer than expected: the file shrank between counting and
  /// reading).
  [[nodiscard]] M take(Index rows) && {
    if (rows < table_.rows()) return M(table_.topRows(rows));
    return std::move(table_);
  }

 private:
  M table_;
  Index next_ = 0;
  bool allocated_ = false;
};

}  // namespace attnmix
