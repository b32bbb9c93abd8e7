// SPDX-License-Identifier: Apache-2.0
/// @file types.hpp
/// Array types shared by every attnmix family. Reals are double, ids are int64; matrices are row-major,
/// so row n of a [n, D] matrix is contiguous (the layout numpy uses).
#pragma once

#include <Eigen/Core>
#include <cstdint>

namespace attnmix {

/// Sizes and indices: Eigen's signed index type (std::ptrdiff_t).
using Index = Eigen::Index;
/// A dense row-major matrix of reals, such as [n, D] queries or an [S, T] emission table.
using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A dense column vector of reals.
using Vector = Eigen::Matrix<double, Eigen::Dynamic, 1>;
/// A dense row-major matrix of int64 ids, such as [n, N] contexts.
using IdMatrix = Eigen::Matrix<int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A dense column vector of int64 ids, such as the [n] targets of a batch.
using IdVector = Eigen::Matrix<int64_t, Eigen::Dynamic, 1>;
/// A writable Matrix view of memory owned elsewhere (a field of an accumulator's flat buffer); it copies nothing.
using MatrixMap = Eigen::Map<Matrix>;
/// A read-only Matrix view of memory owned elsewhere.
using ConstMatrixMap = Eigen::Map<const Matrix>;
/// A writable Vector view of memory owned elsewhere.
using VectorMap = Eigen::Map<Vector>;
/// A read-only Vector view of memory owned elsewhere.
using ConstVectorMap = Eigen::Map<const Vector>;

}  // namespace attnmix
