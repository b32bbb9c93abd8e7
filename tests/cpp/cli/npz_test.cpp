// SPDX-License-Identifier: Apache-2.0
// The .npz reader (cli/npz.cpp, white-box): a stripe of rows read for one process of a distributed fit holds
// exactly those rows of the whole array, for deflated and stored members, C and Fortran order, and every way of
// splitting six rows; shapes still describe the whole file. The oracle is the whole-array decode, which the CLI
// tests check against the same rows in JSON Lines.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "attnmix/core/errors.hpp"
#include "npz.hpp"

namespace attnmix::cli {
namespace {

std::string data(const std::string& name) { return std::string(ATTNMIX_TEST_DATA_DIR) + "/" + name; }

double element(const NpyArray& a, int64_t row, int64_t col) {
  const size_t k = a.at(row, col);
  return a.kind == NpyArray::Kind::kFloat ? a.reals.at(k) : static_cast<double>(a.ints.at(k));
}

TEST(NpzTest, StripesHoldExactlyTheirRowsOfTheWholeArray) {
  // ra_small.npz: deflated, C order; ra_small_stored.npz: stored, Fortran-order float32 query (decoded whole);
  // ca_small_stored.npz, vea_small_stored.npz: stored, C order, int32 and float64.
  for (const char* file : {"ra_small.npz", "ra_small_stored.npz", "ca_small_stored.npz", "vea_small_stored.npz"}) {
    const std::map<std::string, NpyArray> whole = read_npz(data(file));
    ASSERT_FALSE(whole.empty()) << file;
    for (int parts = 1; parts <= 7; ++parts) {
      for (int part = 0; part < parts; ++part) {
        SCOPED_TRACE(std::string(file) + ", part " + std::to_string(part) + " of " + std::to_string(parts));
        const std::map<std::string, NpyArray> stripe = read_npz(data(file), part, parts);
        ASSERT_EQ(stripe.size(), whole.size());
        for (const auto& [name, full] : whole) {
          const NpyArray& a = stripe.at(name);
          EXPECT_EQ(a.shape, full.shape) << name;
          EXPECT_EQ(a.descr, full.descr) << name;
          EXPECT_EQ(a.row_size, full.row_size) << name;
          const int64_t n = full.shape.at(0);
          const int64_t begin = n * part / parts;
          const int64_t end = n * (part + 1) / parts;
          // The one Fortran-ordered matrix among the fixtures is decoded whole; everything else holds its stripe.
          const bool fortran_matrix = std::string(file) == "ra_small_stored.npz" && name == "query";
          EXPECT_EQ(a.first_row, fortran_matrix ? 0 : begin) << name;
          EXPECT_EQ(static_cast<int64_t>(a.size()), fortran_matrix ? n * full.row_size : (end - begin) * full.row_size)
              << name;
          for (int64_t r = begin; r < end; ++r)
            for (int64_t c = 0; c < full.row_size; ++c)
              EXPECT_EQ(element(a, r, c), element(full, r, c)) << name << "[" << r << ", " << c << "]";
        }
      }
    }
  }
}

TEST(NpzTest, OnlyTheFortranOrderedMatrixIsDecodedWhole) {
  const std::map<std::string, NpyArray> stripe = read_npz(data("ra_small_stored.npz"), 1, 3);
  EXPECT_EQ(stripe.at("query").first_row, 0);  // (6, 4) float32 in Fortran order: every row
  EXPECT_EQ(stripe.at("query").size(), 24u);
  EXPECT_EQ(stripe.at("context").first_row, 2);  // C order: rows 2 and 3 only
  EXPECT_EQ(stripe.at("context").size(), 6u);
  EXPECT_EQ(stripe.at("target").size(), 2u);
}

TEST(NpzTest, UnreadableArchivesAndMembersAreReported) {
  EXPECT_THROW(static_cast<void>(read_npz(data("no_such_file.npz"), 0, 2)), std::runtime_error);
  EXPECT_THROW(static_cast<void>(read_npz(data("ra_small.jsonl"), 1, 2)), std::runtime_error);  // not a zip
  try {
    static_cast<void>(parse_npy(std::string("\x93NUMPY\x01\x00\x10\x00{'descr'", 18), "x.npy"));
    ADD_FAILURE() << "a truncated header was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("x.npy: truncated .npy header"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnmix::cli
