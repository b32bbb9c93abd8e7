// SPDX-License-Identifier: Apache-2.0
#include "testing/all_close.hpp"

#include <cmath>
#include <cstdlib>
#include <sstream>

namespace attnmix::testing {

::testing::AssertionResult AllClose(std::span<const double> actual, std::span<const double> expected, double rtol,
                                    double atol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << "size " << actual.size() << " != " << expected.size();
  size_t worst = 0;
  double worst_excess = -1.0;
  bool ok = true;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], b = expected[i];
    if (a == b) continue;  // includes equal infinities
    const double err = std::fabs(a - b);
    const double allowed = atol + rtol * std::fabs(b);
    if (!(err <= allowed)) {
      ok = false;
      const double excess = std::isfinite(err) ? err - allowed : INFINITY;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  if (ok) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(17);
  os << "worst mismatch at index " << worst << ": actual " << actual[worst] << " vs expected " << expected[worst]
     << " (rtol " << rtol << ", atol " << atol << ")";
  return ::testing::AssertionFailure() << os.str();
}

void ExpectAllClose(std::span<const double> actual, std::span<const double> expected, double rtol, double atol) {
  EXPECT_TRUE(AllClose(actual, expected, rtol, atol));
}

uint64_t test_seed(uint64_t fallback) {
  if (const char* env = std::getenv("ATTNMIX_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  return fallback;
}

}  // namespace attnmix::testing
