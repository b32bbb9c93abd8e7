// SPDX-License-Identifier: Apache-2.0
// The .npz reader (io/npz.hpp): a stripe of rows read for one process of a distributed fit holds
// exactly those rows of the whole array, for deflated and stored members, C and Fortran order, and every way of
// splitting six rows; shapes still describe the whole file. The oracle is the whole-array decode, which the CLI
// tests check against the same rows in JSON Lines. The integrity cases build their archives here (a small writer
// of stored zip members with any CRC and any names, and libzip for deflated ones): shapes whose sizes overflow,
// CRC-32 mismatches (in a stripe's rows or beyond them), duplicate member names, uint64 values above INT64_MAX and
// headers too short to hold their own length must all be ValueErrors naming the file, the member and the field.
#include <gtest/gtest.h>
#include <zip.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/io/npz.hpp"

namespace attnmix {
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

// ----- integrity: archives built here ------------------------------------------------------------------------------

/// CRC-32 (the zip polynomial, bit by bit: the test's own oracle, independent of zlib and libzip).
uint32_t crc32_of(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : bytes) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void put16(std::string& out, uint32_t v) {
  out += static_cast<char>(v & 0xFF);
  out += static_cast<char>((v >> 8) & 0xFF);
}
void put32(std::string& out, uint32_t v) {
  put16(out, v & 0xFFFF);
  put16(out, v >> 16);
}

struct StoredMember {
  std::string name;
  std::string data;
  bool bad_crc = false;  // store the CRC of the data with one byte flipped
};

/// A zip archive of stored (uncompressed) members, written field by field (APPNOTE 4.3): local headers and data, the
/// central directory, the end record. Unlike libzip's writer it accepts repeated names and wrong CRCs.
std::string stored_zip(const std::vector<StoredMember>& members) {
  std::string out, central;
  for (const StoredMember& m : members) {
    std::string flipped = m.data;
    if (m.bad_crc && !flipped.empty()) flipped.back() = static_cast<char>(flipped.back() ^ 0x40);
    const uint32_t crc = crc32_of(m.bad_crc ? flipped : m.data);
    const auto size = static_cast<uint32_t>(m.data.size());
    const auto name_size = static_cast<uint32_t>(m.name.size());
    const auto offset = static_cast<uint32_t>(out.size());
    put32(out, 0x04034b50);
    put16(out, 20);      // version needed
    put16(out, 0);       // flags
    put16(out, 0);       // method: stored
    put16(out, 0);       // time
    put16(out, 0x21);    // date: 1980-01-01
    put32(out, crc);
    put32(out, size);
    put32(out, size);
    put16(out, name_size);
    put16(out, 0);  // extra
    out += m.name + m.data;
    put32(central, 0x02014b50);
    put16(central, 20);  // made by
    put16(central, 20);  // version needed
    put16(central, 0);
    put16(central, 0);
    put16(central, 0);
    put16(central, 0x21);
    put32(central, crc);
    put32(central, size);
    put32(central, size);
    put16(central, name_size);
    put16(central, 0);  // extra
    put16(central, 0);  // comment
    put16(central, 0);  // disk
    put16(central, 0);  // internal attributes
    put32(central, 0);  // external attributes
    put32(central, offset);
    central += m.name;
  }
  const auto central_offset = static_cast<uint32_t>(out.size());
  out += central;
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint32_t>(members.size()));
  put16(out, static_cast<uint32_t>(members.size()));
  put32(out, static_cast<uint32_t>(central.size()));
  put32(out, central_offset);
  put16(out, 0);
  return out;
}

/// A version-1 .npy member: magic, version, header length, the header dict padded to 64 bytes, then `data`.
std::string npy(const std::string& descr, const std::string& shape, const std::string& data,
                bool fortran = false) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                       ", 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  put16(out, static_cast<uint32_t>(header.size()));
  return out + header + data;
}

template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// A file under the test temp directory holding `bytes`, removed at the end of the test.
class ArchiveFile {
 public:
  ArchiveFile(const std::string& name, const std::string& bytes) : path_(::testing::TempDir() + "/" + name) {
    std::ofstream(path_, std::ios::binary) << bytes;
  }
  ~ArchiveFile() { std::remove(path_.c_str()); }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// The ValueError message of read_npz(path, part, parts), or "" (with a test failure) when it does not throw one.
std::string npz_error(const std::string& path, int part = 0, int parts = 1) {
  try {
    static_cast<void>(read_npz(path, part, parts));
    ADD_FAILURE() << path << " was accepted";
  } catch (const ValueError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << path << ": not a ValueError: " << e.what();
  }
  return "";
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(NpzIntegrityTest, AValidBuiltArchiveLoads) {
  // The writer itself is right: what the other cases corrupt loads when left intact.
  const std::vector<int64_t> ids{0, 1, 2, 3, 4, 5};
  const ArchiveFile file("valid_built.npz", stored_zip({{"context.npy", npy("<i8", "(3, 2)", raw_bytes(ids))}}));
  for (int parts = 1; parts <= 3; ++parts)
    for (int part = 0; part < parts; ++part) {
      const auto arrays = read_npz(file.path(), part, parts);
      const NpyArray& a = arrays.at("context");
      EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 2}));
      for (int64_t r = a.first_row; r < a.first_row + static_cast<int64_t>(a.size()) / 2; ++r)
        EXPECT_EQ(a.ints.at(a.at(r, 1)), 2 * r + 1);
    }
}

TEST(NpzIntegrityTest, ShapesWhoseSizesOverflowAreValueErrorsNamingTheShape) {
  const std::string eight(8, '\0');
  // Extents of at most 18 digits whose product (or row size, shape[1:]) exceeds 2^48; before, 2^62 · 4 elements
  // wrapped to 0 and 2^61 · 8 bytes to 0 in 64 bits.
  for (const std::string& shape : {std::string("(999999999999999999,)"), std::string("(16777216, 16777216, 2)"),
                                   std::string("(1, 281474976710656, 4)"), std::string("(0, 281474976710657)"),
                                   std::string("(4, 70368744177665)")}) {
    SCOPED_TRACE(shape);
    const ArchiveFile file("huge_shape.npz", stored_zip({{"context.npy", npy("<i8", shape, eight)}}));
    const std::string message = npz_error(file.path());
    EXPECT_CONTAINS(message, file.path() + ": context.npy: shape");
    EXPECT_CONTAINS(message, "2^48");
    try {
      static_cast<void>(parse_npy(npy("<i8", shape, eight), "x.npz: context.npy"));
      ADD_FAILURE() << "parse_npy accepted " << shape;
    } catch (const ValueError& e) {
      EXPECT_CONTAINS(e.what(), "x.npz: context.npy: shape");
    }
  }
}

TEST(NpzIntegrityTest, ExtentsOfMoreThanEighteenDigitsAreValueErrors) {
  // 20 digits (was std::stoll's std::out_of_range "stoll"); (2^61 + 1,), 19 digits (was std::length_error
  // "vector::_M_default_append": 2^61 + 1 elements of 8 bytes wrapped to 8 bytes); leading zeros count too.
  for (const std::string& shape : {std::string("(12345678901234567890,)"), std::string("(2305843009213693953,)"),
                                   std::string("(1000000000000000000,)"), std::string("(2, 00000000000000000001)")}) {
    SCOPED_TRACE(shape);
    const ArchiveFile file("long_extent.npz", stored_zip({{"context.npy", npy("<i8", shape, std::string(16, '\0'))}}));
    const std::string message = npz_error(file.path());
    EXPECT_CONTAINS(message, file.path() + ": context.npy: shape: extent");
    EXPECT_CONTAINS(message, "more than 18 digits (an array has at most 2^48 elements)");
  }
}

TEST(NpzIntegrityTest, ACrcMismatchIsAValueErrorInEveryStripe) {
  // Stored member whose data no longer matches its CRC-32 (one flipped bit in the last row): a stripe that does not
  // hold the damaged row must still find it, since the rest of the member is read to its end.
  const std::vector<double> values{0.5, 1.5, 2.5, 3.5, 4.5, 5.5};
  const ArchiveFile file("bad_crc.npz", stored_zip({{"target.npy", npy("<i8", "(2,)", raw_bytes(std::vector<int64_t>{1, 2}))},
                                                     {"query.npy", npy("<f8", "(6,)", raw_bytes(values)), true}}));
  for (int parts = 1; parts <= 4; ++parts)
    for (int part = 0; part < parts; ++part) {
      SCOPED_TRACE("part " + std::to_string(part) + " of " + std::to_string(parts));
      const std::string message = npz_error(file.path(), part, parts);
      EXPECT_CONTAINS(message, file.path() + ": query.npy: CRC-32 mismatch");
    }
}

TEST(NpzIntegrityTest, ACrcMismatchOfADeflatedMemberIsAValueError) {
  // libzip writes a deflated archive; its CRC fields (local header and central directory) are then changed.
  const std::string path = ::testing::TempDir() + "/bad_crc_deflated.npz";
  std::remove(path.c_str());
  std::string member = npy("<i4", "(64,)", std::string(256, '\x01'));
  {
    int code = 0;
    zip_t* archive = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &code);
    ASSERT_NE(archive, nullptr);
    zip_source_t* source = zip_source_buffer(archive, member.data(), member.size(), 0);
    ASSERT_GE(zip_file_add(archive, "context.npy", source, 0), 0);
    ASSERT_EQ(zip_set_file_compression(archive, 0, ZIP_CM_DEFLATE, 9), 0);
    ASSERT_EQ(zip_close(archive), 0);
  }
  EXPECT_NO_THROW(static_cast<void>(read_npz(path)));
  std::stringstream buffer;
  buffer << std::ifstream(path, std::ios::binary).rdbuf();
  std::string bytes = buffer.str();
  ASSERT_EQ(bytes.compare(0, 4, "PK\x03\x04"), 0);
  const size_t central = bytes.find("PK\x01\x02");
  ASSERT_NE(central, std::string::npos);
  bytes[14] = static_cast<char>(bytes[14] ^ 0x01);            // local header: CRC-32 at offset 14
  bytes[central + 16] = static_cast<char>(bytes[central + 16] ^ 0x01);  // central directory: at offset 16
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  for (int parts : {1, 2}) EXPECT_CONTAINS(npz_error(path, 0, parts), path + ": context.npy: CRC-32 mismatch");
  std::remove(path.c_str());
}

TEST(NpzIntegrityTest, DuplicateMemberNamesAreRejected) {
  const std::string ids = npy("<i8", "(1,)", raw_bytes(std::vector<int64_t>{1}));
  const std::string other = npy("<i8", "(1,)", raw_bytes(std::vector<int64_t>{2}));
  const ArchiveFile file("duplicate.npz", stored_zip({{"target.npy", ids}, {"context.npy", ids}, {"target.npy", other}}));
  EXPECT_CONTAINS(npz_error(file.path()), file.path() + ": duplicate member 'target.npy'");
}

TEST(NpzIntegrityTest, Uint64AboveInt64MaxIsRejectedNamingTheRow) {
  const uint64_t big = uint64_t{1} << 63;
  {  // 1-D: row 2 (INT64_MAX itself is representable and loads)
    const ArchiveFile file("u8.npz", stored_zip({{"target.npy", npy("<u8", "(3,)",
                                                                     raw_bytes(std::vector<uint64_t>{0, big - 1, big}))}}));
    EXPECT_CONTAINS(npz_error(file.path()),
                    file.path() + ": target.npy: row 2: the uint64 value 9223372036854775808 is above the int64");
  }
  {  // 2-D, in a stripe: row 1, element 0 (the first row of part 1 of 2)
    const ArchiveFile file("u8_2d.npz", stored_zip({{"context.npy", npy("<u8", "(2, 2)",
                                                                         raw_bytes(std::vector<uint64_t>{1, 2, ~uint64_t{0}, 3}))}}));
    EXPECT_CONTAINS(npz_error(file.path(), 1, 2), file.path() + ": context.npy: row 1, element 0: the uint64 value 18446744073709551615");
    EXPECT_CONTAINS(npz_error(file.path()), "row 1, element 0");
  }
  const ArchiveFile file("u8_max.npz", stored_zip({{"target.npy", npy("<u8", "(1,)", raw_bytes(std::vector<uint64_t>{big - 1}))}}));
  EXPECT_EQ(read_npz(file.path()).at("target").ints.at(0), INT64_MAX);
}

TEST(NpzIntegrityTest, HeadersTooShortToHoldTheirFieldsAreValueErrors) {
  // Version 1 with a header length of 0 or 1 (the header ends inside the first 12 bytes), then versions 2 and 3 cut
  // inside their 4-byte length: each must be a clean ValueError, not a read of (size_t)-1 bytes.
  for (const std::string& member :
       {std::string("\x93NUMPY\x01\x00\x00\x00\x01\x02\x03\x04", 14), std::string("\x93NUMPY\x01\x00\x01\x00{", 11),
        std::string("\x93NUMPY\x02\x00\x01", 9), std::string("\x93NUMPY\x03\x00\x01\x00\x00", 11),
        std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12)}) {
    const ArchiveFile file("short_header.npz", stored_zip({{"context.npy", member}}));
    EXPECT_CONTAINS(npz_error(file.path()), file.path() + ": context.npy: ");
  }
}

}  // namespace
}  // namespace attnmix
