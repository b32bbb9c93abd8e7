// SPDX-License-Identifier: Apache-2.0
/// @file shared_rows.hpp
/// What every batch class is made of: immutable arrays of rows that slices share, and the range of rows
/// [begin, begin + count) one slice sees. Slicing copies a pointer and moves the range, O(1); a batch's accessor for
/// row r of its slice reads row begin + r of the arrays.
#pragma once

#include <memory>
#include <utility>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

/// The shared arrays of the batch class `Batch` and the range of their rows that it sees. `Arrays` holds one row of
/// each of its arrays per observation (a row of a matrix, an entry of a vector).
template <class Batch, class Arrays>
class SharedRows {
 public:
  /// The number of rows n of this batch (of this slice, not of the shared arrays).
  [[nodiscard]] Index n_rows() const noexcept { return count_; }
  /// Rows [begin, begin + count) of this batch, sharing its arrays, in O(1). The range must lie within this batch (a
  /// broken precondition aborts).
  [[nodiscard]] Batch slice(Index begin, Index count) const {
    ATTNMIX_ASSERT(begin >= 0 && count >= 0 && begin + count <= count_, "batch slice out of range");
    Batch out = static_cast<const Batch&>(*this);
    SharedRows& range = out;
    range.begin_ = begin_ + begin;
    range.count_ = count;
    return out;
  }

 protected:
  /// No rows: empty arrays.
  SharedRows() : arrays_(std::make_shared<const Arrays>()) {}
  /// All `rows` rows of `arrays`.
  SharedRows(Arrays arrays, Index rows) : arrays_(std::make_shared<const Arrays>(std::move(arrays))), count_(rows) {}

  /// The arrays: every row of them, not only this slice's.
  [[nodiscard]] const Arrays& arrays() const noexcept { return *arrays_; }
  /// The first entry of row `row` of this slice in a row-major matrix or a vector of the arrays (no bounds check).
  template <class Array>
  [[nodiscard]] const typename Array::Scalar* row_of(const Array& a, Index row) const noexcept {
    return a.data() + (begin_ + row) * a.cols();
  }
  /// Entry `row` of this slice in a vector of the arrays (no bounds check).
  template <class Column>
  [[nodiscard]] typename Column::Scalar entry_of(const Column& v, Index row) const noexcept {
    return v[begin_ + row];
  }
  /// A copy of this slice's rows of a matrix or vector of the arrays.
  template <class Array>
  [[nodiscard]] Array copy_of(const Array& a) const {
    if constexpr (Array::IsVectorAtCompileTime) return a.segment(begin_, count_);
    else return a.middleRows(begin_, count_);
  }

 private:
  std::shared_ptr<const Arrays> arrays_;
  Index begin_ = 0;
  Index count_ = 0;
};

}  // namespace attnmix
