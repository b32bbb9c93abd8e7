// SPDX-License-Identifier: Apache-2.0
/// @file all_close.hpp
/// ExpectAllClose: |a − b| ≤ atol + rtol·|b| element-wise, reporting the worst index; test seeds.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>

#include "attnmix/core/types.hpp"

namespace attnmix::testing {

/// Passes when every |actual_i − expected_i| ≤ atol + rtol·|expected_i|; otherwise names the worst index.
::testing::AssertionResult AllClose(std::span<const double> actual, std::span<const double> expected, double rtol,
                                    double atol);
void ExpectAllClose(std::span<const double> actual, std::span<const double> expected, double rtol, double atol);
inline void ExpectAllClose(const Matrix& actual, const Matrix& expected, double rtol, double atol) {
  ASSERT_EQ(actual.rows(), expected.rows());
  ASSERT_EQ(actual.cols(), expected.cols());
  ExpectAllClose(std::span<const double>(actual.data(), static_cast<size_t>(actual.size())),
                 std::span<const double>(expected.data(), static_cast<size_t>(expected.size())), rtol, atol);
}
/// The test seed: `fallback` unless ATTNMIX_TEST_SEED is set (printed in failure messages by callers).
[[nodiscard]] uint64_t test_seed(uint64_t fallback);

}  // namespace attnmix::testing
