// SPDX-License-Identifier: Apache-2.0
// Flat additive statistics (docs/mechanisms.md#building-blocks): one buffer with a declared layout; validated combine /
// from_value / unpack; mass laws with tol_mass; snapshots.
#include <gtest/gtest.h>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/stats/mass_law.hpp"

namespace attnmix {
namespace {

ResponsibilityAttentionAccumulator filled_accumulator() {
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Zero(3, 2);
  p.emission = Matrix::Constant(3, 4, 0.25);
  p.position_prior = Vector::Constant(2, 0.5);
  const ResponsibilityAttention model(p);
  auto acc = model.make_accumulator();
  model.accumulate(model.sampler(1).sample(10), std::vector<double>(10, 1.0), acc);
  return acc;
}

TEST(FlatStatsTest, LayoutIsDeclaredOnceInValueOrder) {
  const auto acc = filled_accumulator();
  const auto& fields = acc.layout().fields();
  ASSERT_EQ(fields.size(), 5u);
  EXPECT_EQ(fields[0].name, "key_sum");
  EXPECT_EQ(fields[4].name, "query_sq");
  EXPECT_EQ(acc.flat_size(), 3 * 2 + 3 + 3 * 4 + 2 + 1);
  EXPECT_EQ(fields[2].offset, 9);
  EXPECT_EQ(acc.layout().describe(),
            "key_sum (3,2), key_mass (3,), emission_count (3,4), position_count (2,), query_sq ()");
  // The typed views alias the flat buffer.
  EXPECT_EQ(acc.emission_count().data(), acc.flat().data() + 9);
}

TEST(FlatStatsTest, ValueIsASnapshotAndRoundTripsExactly) {
  auto acc = filled_accumulator();
  const auto snapshot = acc.value();
  acc.combine(snapshot);
  EXPECT_FALSE(acc == snapshot);
  auto copy = filled_accumulator();
  copy.set_zero();
  copy.from_value(snapshot);
  EXPECT_TRUE(copy == snapshot);
  std::vector<double> buf(static_cast<size_t>(acc.flat_size()));
  acc.pack(buf);
  copy.unpack(buf);
  EXPECT_TRUE(copy == acc);
}

TEST(FlatStatsTest, MassLawViolationsAreRejectedWithoutChange) {
  auto acc = filled_accumulator();
  const auto before = acc.value();
  std::vector<double> buf(static_cast<size_t>(acc.flat_size()));
  acc.pack(buf);
  buf[6] += 1.0;  // key_mass[0] only: Σ key_mass exceeds Σ position_count
  try {
    acc.unpack(buf);
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot exceed"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(acc == before);
  acc.pack(buf);
  buf[9] -= 0.5;  // emission_count[0,0]: now below the declared mass
  try {
    acc.unpack(buf);
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("must equal"), std::string::npos) << e.what();
  }
  acc.pack(buf);
  buf[9] = -1e-3;  // a negative count
  EXPECT_THROW(acc.unpack(buf), ValueError);
  acc.pack(buf);
  buf[0] = NAN;
  EXPECT_THROW(acc.unpack(buf), ValueError);
  EXPECT_THROW(acc.unpack(std::vector<double>(3, 0.0)), ValueError);
  EXPECT_TRUE(acc == before);
  // estimate() checks nobs against the assigned mass.
  const ResponsibilityAttentionEstimator est(3, 2, 2, 4);
  EXPECT_THROW((void)est.estimate(11.0, acc), ValueError);
  EXPECT_NO_THROW((void)est.estimate(10.0, acc));
  // Different dimensions are a layout error.
  EXPECT_THROW(acc.combine(ResponsibilityAttentionAccumulator(3, 2, 2, 5)), ValueError);
}

TEST(FlatStatsTest, ToleranceIsFloat32Derived) {
  EXPECT_DOUBLE_EQ(tol_mass(1.0, 1.0), 64.0 * std::pow(2.0, -23));
  EXPECT_NO_THROW(check_mass_law("w", "a", 1e6, "b", 1e6 + 7.0));  // within 7.63e-6 relative
  EXPECT_THROW(check_mass_law("w", "a", 1e6, "b", 1e6 + 8.0), ValueError);
  EXPECT_THROW(check_mass_law("w", "a", 1e6, "b", 1e6 - 8.0), ValueError);
}

TEST(FlatStatsTest, ScaleMultipliesEveryField) {
  auto acc = filled_accumulator();
  const auto before = acc.value();
  acc.scale(2.5);
  for (Index k = 0; k < acc.flat_size(); ++k) EXPECT_EQ(acc.flat()[k], 2.5 * before.flat()[k]);
  EXPECT_THROW(acc.scale(-1.0), ValueError);
  EXPECT_THROW(acc.scale(INFINITY), ValueError);
}

}  // namespace
}  // namespace attnmix
