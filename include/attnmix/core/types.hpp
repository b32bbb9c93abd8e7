// SPDX-License-Identifier: Apache-2.0
/// @file types.hpp
/// Array types shared by every attnmix family. Reals are double, ids are int64; matrices are row-major,
/// so row n of a [n, D] matrix is contiguous (the layout numpy uses).
#pragma once

#include <Eigen/Core>
#include <cstdint>

namespace attnmix {

using Index = Eigen::Index;
using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Vector = Eigen::Matrix<double, Eigen::Dynamic, 1>;
using IdMatrix = Eigen::Matrix<int64_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using IdVector = Eigen::Matrix<int64_t, Eigen::Dynamic, 1>;
using MatrixMap = Eigen::Map<Matrix>;
using ConstMatrixMap = Eigen::Map<const Matrix>;
using VectorMap = Eigen::Map<Vector>;
using ConstVectorMap = Eigen::Map<const Vector>;

}  // namespace attnmix
