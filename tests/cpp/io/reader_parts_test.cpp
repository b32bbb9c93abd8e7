// SPDX-License-Identifier: Apache-2.0
// Two pieces of the data reader on their own (io/jsonl.hpp, and the private io/row_table_impl.hpp): for_each_json_line
// reports the number of data lines of a stripe before visiting them, which the reader uses to allocate its rows once;
// RowTable fills those rows in place and hands them over.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnmix/io/jsonl.hpp"
#include "io/row_table_impl.hpp"

namespace attnmix {
namespace {

TEST(RowTableTest, FillsRowsInPlaceAndHandsThemOver) {
  RowTable<IdMatrix> table;
  table.allocate(3, 2);
  table.allocate(4, 5);  // later calls do nothing
  for (int64_t v = 0; v < 6; ++v) table.push_back(v);
  EXPECT_THROW(table.push_back(6), std::logic_error);  // more entries than the rows counted
  const IdMatrix m = std::move(table).take(3);
  ASSERT_EQ(m.rows(), 3);
  ASSERT_EQ(m.cols(), 2);
  EXPECT_EQ(m(0, 0), 0);
  EXPECT_EQ(m(1, 1), 3);
  EXPECT_EQ(m(2, 0), 4);
}

TEST(RowTableTest, FewerRowsThanCountedKeepTheFirstOnes) {
  RowTable<Matrix> table;
  table.allocate(4, 3);
  for (int k = 0; k < 6; ++k) table.push_back(0.5 * k);
  const Matrix m = std::move(table).take(2);
  ASSERT_EQ(m.rows(), 2);
  ASSERT_EQ(m.cols(), 3);
  EXPECT_EQ(m(1, 2), 2.5);

  RowTable<IdVector> vector;
  vector.allocate(5, 1);
  vector.push_back(7);
  vector.push_back(8);
  const IdVector v = std::move(vector).take(2);
  ASSERT_EQ(v.size(), 2);
  EXPECT_EQ(v[1], 8);
}

/// A file of 7 data lines among blank ones; for_each_json_line must report each stripe's data lines first.
TEST(JsonLinesTest, ReportsTheRowCountOfEveryStripeBeforeTheRows) {
  const std::string path = ::testing::TempDir() + "/reader_parts_test.jsonl";
  {
    std::ofstream out(path);
    out << "{\"a\":0}\n\n{\"a\":1}\n  \n{\"a\":2}\n{\"a\":3}\n\t\n{\"a\":4}\n{\"a\":5}\n{\"a\":6}\n\n";
  }
  for (int parts = 1; parts <= 4; ++parts) {
    int64_t seen = 0;
    for (int part = 0; part < parts; ++part) {
      const RowStripe stripe{part, parts, parts > 1};
      int64_t reported = -1;
      std::vector<int64_t> values;
      for_each_json_line(
          path, stripe,
          [&](int64_t /*line*/, const nlohmann::json& object) {
            EXPECT_GE(reported, 0) << "the count comes before the rows";
            values.push_back(object["a"].get<int64_t>());
          },
          [&](int64_t rows) { reported = rows; });
      const auto [begin, end] = stripe.range(7);
      EXPECT_EQ(reported, end - begin) << "part " << part << " of " << parts;
      ASSERT_EQ(static_cast<int64_t>(values.size()), end - begin);
      for (int64_t k = 0; k < end - begin; ++k) EXPECT_EQ(values[static_cast<size_t>(k)], begin + k);
      seen += reported;
    }
    EXPECT_EQ(seen, 7) << parts << " parts";
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace attnmix
