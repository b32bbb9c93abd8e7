// SPDX-License-Identifier: Apache-2.0
// checked_product against an independent 128-bit product, and the statistics layout built on it.
#include "attnmix/core/sizes.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/errors.hpp"

namespace attnmix {
namespace {

__extension__ using Int128 = __int128;  // a GCC/Clang extension (-Wpedantic)

/// The oracle: the exact product in 128 bits, saturated far above kMaxElements.
Int128 exact_product(const std::vector<int64_t>& extents) {
  Int128 p = 1;
  for (int64_t e : extents) {
    if (e == 0) return 0;
  }
  const Int128 cap = Int128{1} << 80;
  for (int64_t e : extents) {
    if (p > cap / e) return cap;
    p *= e;
  }
  return p;
}

TEST(SizesTest, CheckedProductAgreesWithTheExactProduct) {
  const std::vector<int64_t> values{0,
                                    1,
                                    2,
                                    3,
                                    1000,
                                    (int64_t{1} << 24),
                                    (int64_t{1} << 24) + 1,
                                    (int64_t{1} << 31) - 1,
                                    int64_t{1} << 48,
                                    (int64_t{1} << 48) + 1,
                                    (int64_t{1} << 62) + 1,
                                    std::numeric_limits<int64_t>::max()};
  int checked = 0;
  for (int64_t a : values)
    for (int64_t b : values)
      for (int64_t c : values) {
        const std::vector<int64_t> extents{a, b, c};
        const Int128 exact = exact_product(extents);
        if (exact <= kMaxElements) {
          EXPECT_EQ(checked_product("test", "x", {a, b, c}), static_cast<int64_t>(exact)) << a << " " << b << " " << c;
        } else {
          EXPECT_THROW(static_cast<void>(checked_product("test", "x", {a, b, c})), ValueError)
              << a << " " << b << " " << c;
        }
        ++checked;
      }
  EXPECT_EQ(checked, 12 * 12 * 12);
}

TEST(SizesTest, MessagesNameWhereWhatAndTheExtents) {
  try {
    static_cast<void>(checked_product("ChainedAttentionEstimator", "statistic key_num",
                                      {2, (int64_t{1} << 62) + 1, (int64_t{1} << 62) + 1}));
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(),
                 "ChainedAttentionEstimator: statistic key_num (2 x 4611686018427387905 x 4611686018427387905) must "
                 "have at most 2^48 elements");
  }
  EXPECT_THROW(static_cast<void>(checked_product("w", "x", {3, -1})), ValueError);
  EXPECT_EQ(checked_product("w", "x", {}), 1);  // a scalar
}

TEST(SizesTest, StatLayoutRefusesFieldsTooLargeToExist) {
  const int64_t huge = (int64_t{1} << 31) + 7;
  EXPECT_THROW(StatLayout("Acc", {{"table", {huge, huge}, FieldKind::kCount}}), ValueError);
  // Each field fits, but not all of them together.
  const int64_t half = int64_t{1} << 47;
  EXPECT_THROW(StatLayout("Acc", {{"a", {half}, FieldKind::kCount}, {"b", {half}, FieldKind::kCount},
                                  {"c", {2}, FieldKind::kCount}}),
               ValueError);
  const StatLayout ok("Acc", {{"a", {3, 4}, FieldKind::kCount}, {"b", {}, FieldKind::kReal}});
  EXPECT_EQ(ok.flat_size(), 13);
  EXPECT_EQ(ok.fields()[1].offset, 12);
}

}  // namespace
}  // namespace attnmix
