// SPDX-License-Identifier: Apache-2.0
// JSON Lines integrity (io/jsonl.hpp): a NUL byte in a data line is an error naming the file, the line
// and the column (nlohmann's lexer takes NUL for the end of its input, so `{...}\0 junk {{{` used to parse as
// `{...}`), in whichever stripe reads that line; duplicate keys stay errors; well-formed lines read as before.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/io/jsonl.hpp"

namespace attnmix {
namespace {

using namespace std::string_literals;

/// A data file holding `bytes` under the test temp directory, removed at the end of the test.
class DataFile {
 public:
  DataFile(const std::string& name, const std::string& bytes) : path_(::testing::TempDir() + "/" + name) {
    std::ofstream(path_, std::ios::binary) << bytes;
  }
  ~DataFile() { std::remove(path_.c_str()); }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// The ValueError message of reading every line of `path` in `stripe` ("" and a failure when it reads).
std::string read_error(const std::string& path, const RowStripe& stripe = {}) {
  try {
    for_each_json_line(path, stripe, [](int64_t, const nlohmann::json&) {});
    ADD_FAILURE() << path << " was read without an error";
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonLinesIntegrityTest, ANulByteInALineIsAnErrorNamingLineAndColumn) {
  // Line 2 holds a valid object, then a NUL and garbage.
  const DataFile file("nul.jsonl", "{\"a\": 1}\n{\"a\": 2}"s + '\0' + " junk {{{\n{\"a\": 3}\n");
  const std::string message = read_error(file.path());
  EXPECT_NE(message.find(file.path() + ": line 2: column 9: a NUL byte is not allowed"), std::string::npos)
      << message;
  // The lines before it were visited, in order; first_json_object of the stripe holding it reports nothing.
  std::vector<int64_t> seen;
  try {
    for_each_json_line(file.path(), [&](int64_t line, const nlohmann::json&) { seen.push_back(line); });
  } catch (const ValueError&) {
  }
  EXPECT_EQ(seen, std::vector<int64_t>{1});
  EXPECT_FALSE(first_json_object(file.path(), RowStripe{1, 3, true}).has_value());
  // With 3 parts of 3 lines, part 1 reads line 2 and reports it; parts 0 and 2 do not read it.
  EXPECT_NE(read_error(file.path(), RowStripe{1, 3, true}).find("line 2: column 9"), std::string::npos);
  for (int part : {0, 2})
    EXPECT_NO_THROW(for_each_json_line(file.path(), RowStripe{part, 3, true}, [](int64_t, const nlohmann::json&) {}));
}

TEST(JsonLinesIntegrityTest, NulBytesElsewhereInALineAreErrorsToo) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {std::string("\0", 1), "line 1: column 1"},                          // a line of only a NUL (not blank)
      {std::string("  \0  ", 5), "line 1: column 3"},                      // among blanks
      {std::string("{\"a\": \"x\0y\"}", 12), "line 1: column 9"},          // inside a string
      {std::string("{\"a\":\0 1}", 9), "line 1: column 6"},                // where a value belongs
      {std::string("\xEF\xBB\xBF{\"a\": 1}\r\0", 13), "line 1: column 10"}  // after a BOM and a CR
  };
  for (const auto& [bytes, where] : cases) {
    const DataFile file("nul_elsewhere.jsonl", bytes + "\n");
    const std::string message = read_error(file.path());
    EXPECT_NE(message.find(file.path() + ": " + where + ": a NUL byte"), std::string::npos) << message;
  }
}

TEST(JsonLinesIntegrityTest, DuplicateKeysStayErrorsAndCleanLinesReadAsBefore) {
  const DataFile dup("dup.jsonl", "{\"context\": [1], \"target\": 2, \"context\": [3]}\n");
  EXPECT_NE(read_error(dup.path()).find(dup.path() + ": line 1: field 'context' appears more than once"),
            std::string::npos);
  // Integral floats stay numbers for the id rules to judge (data ids may be written 2.0); blank lines count.
  const DataFile clean("clean.jsonl", "{\"context\": [1, 2.0], \"target\": 3}\n\n  \n{\"context\": [4, 5]}\r\n");
  std::vector<std::pair<int64_t, std::string>> rows;
  for_each_json_line(clean.path(), [&](int64_t line, const nlohmann::json& o) { rows.emplace_back(line, o.dump()); });
  ASSERT_EQ(rows.size(), 2U);
  EXPECT_EQ(rows[0], std::make_pair(int64_t{1}, std::string("{\"context\":[1,2.0],\"target\":3}")));
  EXPECT_EQ(rows[1], std::make_pair(int64_t{4}, std::string("{\"context\":[4,5]}")));
}

}  // namespace
}  // namespace attnmix
