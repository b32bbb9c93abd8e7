// SPDX-License-Identifier: Apache-2.0
// write_file_atomically (core/atomic_file.hpp): only regular files are replaced (a FIFO or a device node is refused,
// not replaced by a regular file), symbolic links are written through, and the interrupted-write cleanup is a no-op
// when no write is in progress.
#include "attnmix/core/atomic_file.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"

namespace attnmix {
namespace {

namespace fs = std::filesystem;

class AtomicFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("attnmix_atomic_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  [[nodiscard]] std::string file(const std::string& name) const { return (dir_ / name).string(); }
  [[nodiscard]] static std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  [[nodiscard]] std::vector<std::string> listing(const std::string& sub = ".") const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_ / sub)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path dir_;
};

TEST_F(AtomicFileTest, WritesANewFileAndReplacesARegularOneKeepingItsMode) {
  write_file_atomically(file("a.txt"), "first", "the text");
  EXPECT_EQ(read(file("a.txt")), "first");
  ASSERT_EQ(::chmod(file("a.txt").c_str(), 0600), 0);
  write_file_atomically(file("a.txt"), "second", "the text");
  EXPECT_EQ(read(file("a.txt")), "second");
  struct stat info {};
  ASSERT_EQ(::stat(file("a.txt").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0600U);
  EXPECT_EQ(listing(), std::vector<std::string>{"a.txt"});
}

TEST_F(AtomicFileTest, RefusesAFifoAndADeviceNodeAndKeepsThem) {
  ASSERT_EQ(::mkfifo(file("fifo").c_str(), 0600), 0);
  std::vector<std::string> nodes{"fifo"};
  // A node of our own with the null device's numbers (never /dev/null itself); mknod needs root.
  if (::mknod(file("null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) nodes.emplace_back("null");
  for (const std::string& node : nodes) {
    try {
      write_file_atomically(file(node), "text", "the model");
      ADD_FAILURE() << node << ": no error";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(file(node) + ": cannot write the model: it is not a regular file"),
                std::string::npos)
          << e.what();
    }
    struct stat info {};
    ASSERT_EQ(::lstat(file(node).c_str(), &info), 0);
    EXPECT_TRUE(node == "fifo" ? S_ISFIFO(info.st_mode) : S_ISCHR(info.st_mode)) << node;
  }
  // A link to a FIFO is refused as well.
  fs::create_symlink("fifo", file("to_fifo"));
  EXPECT_THROW(write_file_atomically(file("to_fifo"), "text"), IoError);
  EXPECT_TRUE(fs::is_fifo(file("fifo")));
  std::vector<std::string> expected = nodes;
  expected.emplace_back("to_fifo");
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(listing(), expected);  // no temporary file
}

TEST_F(AtomicFileTest, WritesThroughSymbolicLinks) {
  fs::create_directories(dir_ / "store");
  {
    std::ofstream(file("store/real.txt")) << "old";
  }
  fs::create_symlink("store/real.txt", file("link.txt"));  // relative to the link's directory
  fs::create_symlink("link.txt", file("link2.txt"));       // a chain
  write_file_atomically(file("link2.txt"), "new", "the text");
  EXPECT_TRUE(fs::is_symlink(file("link.txt")));
  EXPECT_TRUE(fs::is_symlink(file("link2.txt")));
  EXPECT_EQ(read(file("store/real.txt")), "new");
  // A dangling link: its target is created, in the target's directory.
  fs::create_symlink(file("store/fresh.txt"), file("dangling.txt"));  // absolute
  write_file_atomically(file("dangling.txt"), "fresh", "the text");
  EXPECT_TRUE(fs::is_symlink(file("dangling.txt")));
  EXPECT_EQ(read(file("store/fresh.txt")), "fresh");
  EXPECT_EQ(listing("store"), (std::vector<std::string>{"fresh.txt", "real.txt"}));
  EXPECT_EQ(listing(), (std::vector<std::string>{"dangling.txt", "link.txt", "link2.txt", "store"}));
  // A loop of links is an error.
  fs::create_symlink("loop_b", file("loop_a"));
  fs::create_symlink("loop_a", file("loop_b"));
  EXPECT_THROW(write_file_atomically(file("loop_a"), "x"), IoError);
}

TEST_F(AtomicFileTest, NothingToCleanUpWhenNoWriteIsInProgress) {
  EXPECT_FALSE(remove_pending_temporary_file());
  write_file_atomically(file("a.txt"), "text");
  EXPECT_FALSE(remove_pending_temporary_file());  // the finished write freed its slot
  EXPECT_THROW(write_file_atomically(file("no/such/dir/a.txt"), "text"), IoError);
  EXPECT_FALSE(remove_pending_temporary_file());  // so did the failed one
  EXPECT_EQ(read(file("a.txt")), "text");
}

}  // namespace
}  // namespace attnmix
