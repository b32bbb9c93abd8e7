// SPDX-License-Identifier: Apache-2.0
// The sixteen-lane float helpers of the mixed-precision kernels (src/attention/float_lanes_impl.hpp, white-box)
// against independent oracles: glibc's double exp rounded to float, scalar sums in the documented tree order.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "attention/float_lanes_impl.hpp"  // white-box (src/ is on this test's include path)
#include "attnmix/core/rng.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

namespace fl = float_lanes;

/// Distance in units in the last place between two positive floats.
int64_t ulps(float a, float b) {
  return std::llabs(static_cast<int64_t>(std::bit_cast<uint32_t>(a)) - static_cast<int64_t>(std::bit_cast<uint32_t>(b)));
}

/// exp_lanes is within 2 ulp of exp correctly rounded to float on [−87, 0] (1 ulp on nearly all arguments), both on
/// the wide range and on [−1, 0], where most attention logits fall after the shift.
TEST(FloatLanesTest, ExpLanesIsWithinTwoUlpOfDoubleExp) {
  Rng rng(testing::test_seed(91));
  for (const double low : {-87.0, -1.0}) {
    int64_t within_one = 0;
    int64_t worst = 0;
    constexpr int kVectors = 100000;
    for (int v = 0; v < kVectors; ++v) {
      fl::Lanes x;
      for (int j = 0; j < fl::kLanes; ++j) x[j] = static_cast<float>(low * rng.uniform());
      const fl::Lanes e = fl::exp_lanes(x);
      for (int j = 0; j < fl::kLanes; ++j) {
        const int64_t u = ulps(e[j], static_cast<float>(std::exp(static_cast<double>(x[j]))));
        worst = std::max(worst, u);
        within_one += u <= 1;
      }
    }
    EXPECT_LE(worst, 2) << "on [" << low << ", 0]";
    EXPECT_GE(static_cast<double>(within_one), 0.999 * kVectors * fl::kLanes) << "on [" << low << ", 0]";
  }
}

/// Exactly 0 below −87 and for −∞ (a zero-probability position is never revived), exactly 1 at 0.
TEST(FloatLanesTest, ExpLanesEndpoints) {
  const float inf = std::numeric_limits<float>::infinity();
  const fl::Lanes x = {-inf, -1e30F, -87.5F, -87.0001F, -87.0F, -0.0F, 0.0F, -1e-30F,
                       -100.0F, -86.9F, -inf, -inf, -inf, -inf, -inf, -inf};
  const fl::Lanes e = fl::exp_lanes(x);
  for (const int j : {0, 1, 2, 3, 8, 10}) EXPECT_EQ(e[j], 0.0F) << j;
  EXPECT_GT(e[4], 0.0F);
  EXPECT_TRUE(std::isnormal(e[4]));
  EXPECT_EQ(e[5], 1.0F);
  EXPECT_EQ(e[6], 1.0F);
  EXPECT_EQ(e[7], 1.0F);
  EXPECT_LE(ulps(e[9], static_cast<float>(std::exp(static_cast<double>(-86.9F)))), 2);
}

/// Sum of 16 floats by the tree (((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))) + (… v8 … v15), in scalars.
float tree_sum(const float* v, int n) {
  if (n == 1) return v[0];
  return tree_sum(v, n / 2) + tree_sum(v + n / 2, n / 2);
}

/// Lane j of horizontal_sums is, bit for bit, the scalar tree sum of vector j, for every j.
TEST(FloatLanesTest, HorizontalSumsFollowTheTree) {
  Rng rng(testing::test_seed(92));
  for (int trial = 0; trial < 200; ++trial) {
    fl::Lanes v[fl::kLanes];
    float copy[fl::kLanes][fl::kLanes];
    for (int p = 0; p < fl::kLanes; ++p)
      for (int j = 0; j < fl::kLanes; ++j) copy[p][j] = v[p][j] = static_cast<float>(rng.normal() * 1e3);
    const fl::Lanes sums = fl::horizontal_sums(v);
    for (int p = 0; p < fl::kLanes; ++p) EXPECT_EQ(sums[p], tree_sum(copy[p], fl::kLanes)) << "vector " << p;
  }
}

TEST(FloatLanesTest, RoundingAndWideningConvertEveryLane) {
  double x[fl::kLanes];
  for (int j = 0; j < fl::kLanes; ++j) x[j] = 1.0 / (j + 3.0) - 7.5 * j;
  const fl::Lanes f = fl::load_rounded(x);
  for (int j = 0; j < fl::kLanes; ++j) EXPECT_EQ(f[j], static_cast<float>(x[j])) << j;
  const lanes::Lanes low = fl::widen(f, 0);
  const lanes::Lanes high = fl::widen(f, 1);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(low[j], static_cast<double>(f[j]));
    EXPECT_EQ(high[j], static_cast<double>(f[j + 8]));
  }
}

}  // namespace
}  // namespace attnmix
