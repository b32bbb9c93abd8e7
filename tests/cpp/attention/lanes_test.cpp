// SPDX-License-Identifier: Apache-2.0
// The eight-lane helpers of the attention kernels (src/attention/lanes_impl.hpp, white-box) against independent
// oracles: glibc's exp and log (correctly rounded in nearly all cases), scalar sums in the documented tree order.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "attention/lanes_impl.hpp"  // white-box (src/ is on this test's include path)
#include "attnmix/core/rng.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

using lanes::kLanes;
using lanes::Lanes;

/// Distance in units in the last place between two finite doubles of the same sign.
int64_t ulps(double a, double b) {
  return std::llabs(static_cast<int64_t>(std::bit_cast<uint64_t>(a)) - static_cast<int64_t>(std::bit_cast<uint64_t>(b)));
}

/// exp_lanes is within 1 ulp of glibc's exp on [−708, 0] and bit-identical on the large majority of arguments
/// (docs/PERFORMANCE.md): both the wide range and [−1, 0], where most attention logits fall after the shift.
TEST(LanesTest, ExpLanesIsWithinOneUlpOfGlibc) {
  Rng rng(testing::test_seed(71));
  for (const double low : {-708.0, -1.0}) {
    int64_t identical = 0;
    int64_t worst = 0;
    constexpr int kVectors = 200000;
    for (int v = 0; v < kVectors; ++v) {
      Lanes x;
      for (Index j = 0; j < kLanes; ++j) x[j] = low * rng.uniform();
      const Lanes e = lanes::exp_lanes(x);
      for (Index j = 0; j < kLanes; ++j) {
        const int64_t d = ulps(e[j], std::exp(x[j]));
        worst = std::max(worst, d);
        identical += d == 0 ? 1 : 0;
      }
    }
    SCOPED_TRACE("range [" + std::to_string(low) + ", 0]");
    EXPECT_LE(worst, 1);
#if !defined(__SANITIZE_ADDRESS__)  // the share of identical results depends on the code generated (-O3 here)
    EXPECT_GT(static_cast<double>(identical) / (kVectors * kLanes), 0.9);
#endif
  }
  const Lanes ends = lanes::exp_lanes(Lanes{0.0, -0.0, -708.0, -1e-300, -0.5, -1.0, -2.0, -700.0});
  EXPECT_EQ(ends[0], 1.0);
  EXPECT_EQ(ends[1], 1.0);
  for (Index j = 2; j < kLanes; ++j) {
    const double x = std::array{0.0, -0.0, -708.0, -1e-300, -0.5, -1.0, -2.0, -700.0}[static_cast<size_t>(j)];
    EXPECT_LE(ulps(ends[j], std::exp(x)), 1) << "x = " << x;
  }
}

/// exp_shifted: arguments below −708 (where exp_lanes is not valid) go through std::exp, so −∞ gives exactly 0 and
/// a deep negative argument its subnormal value; a tail shorter than one vector is handled.
TEST(LanesTest, ExpShiftedIsExactAtMinusInfinityAndBelowTheLaneRange) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> x = {1.0, -inf, -744.0, 0.25, -720.0, 1.0 - 709.5, -3.0, 0.5, -inf, 0.75, -1000.0};
  std::vector<double> e(x.size());
  lanes::exp_shifted(x.data(), 1.0, -inf, e.data(), static_cast<Index>(x.size()));
  for (size_t k = 0; k < x.size(); ++k) {
    const double expected = std::exp(x[k] - 1.0);
    if (x[k] - 1.0 < lanes::kExpLanesMin)
      EXPECT_EQ(e[k], expected) << "k = " << k;
    else
      EXPECT_LE(ulps(e[k], expected), 1) << "k = " << k;
  }
  EXPECT_EQ(e[1], 0.0);
  EXPECT_EQ(e[8], 0.0);
  EXPECT_GT(e[2], 0.0);  // subnormal, not flushed
}

/// log_in_place: within 1 ulp of glibc's log for every length (whole packets and a padded tail), log 1 = 0.
TEST(LanesTest, LogInPlaceIsWithinOneUlpOfGlibcForEveryLength) {
  Rng rng(testing::test_seed(72));
  for (const Index n : {Index{1}, Index{3}, Index{8}, Index{13}, Index{1000}}) {
    std::vector<double> x(static_cast<size_t>(n));
    for (double& v : x) v = std::exp(-700.0 * rng.uniform()) * (0.5 + rng.uniform());
    x[0] = 1.0;
    std::vector<double> y = x;
    lanes::log_in_place(y.data(), n);
    EXPECT_EQ(y[0], 0.0);
    for (size_t k = 0; k < x.size(); ++k)
      EXPECT_LE(ulps(std::abs(y[k]), std::abs(std::log(x[k]))), 1) << "n = " << n << ", x = " << x[k];
  }
}

/// horizontal_sums gives, lane for lane, exactly horizontal_sum of each input (the documented tree
/// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), written out here in scalars).
TEST(LanesTest, HorizontalSumsFollowTheDocumentedTree) {
  Rng rng(testing::test_seed(73));
  for (int trial = 0; trial < 1000; ++trial) {
    Lanes v[kLanes];
    for (auto& vec : v)
      for (Index j = 0; j < kLanes; ++j) vec[j] = rng.normal() * std::pow(10.0, 8.0 * rng.uniform());
    const Lanes sums = lanes::horizontal_sums(v);
    for (Index k = 0; k < kLanes; ++k) {
      const Lanes& a = v[k];
      const double tree = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
      EXPECT_EQ(lanes::horizontal_sum(a), tree);
      EXPECT_EQ(sums[k], tree);
    }
  }
}

/// scratch: 64-byte aligned whatever the size asked for, and large enough after growing.
TEST(LanesTest, ScratchIsCacheLineAligned) {
  for (const size_t size : {size_t{1}, size_t{7}, size_t{100}, size_t{5000}, size_t{3}}) {
    double* p = lanes::scratch<99>(size);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << "size " << size;
    for (size_t k = 0; k < size; ++k) p[k] = static_cast<double>(k);  // the whole range is writable
    EXPECT_EQ(p[size - 1], static_cast<double>(size - 1));
  }
}

}  // namespace
}  // namespace attnmix
