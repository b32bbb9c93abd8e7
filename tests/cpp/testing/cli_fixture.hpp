// SPDX-License-Identifier: Apache-2.0
/// @file cli_fixture.hpp
/// The end-to-end CLI tests' fixture: each test runs shell commands (the attnmix binary, mpirun) inside its own
/// empty directory, removed afterwards, and gets the exit code, stdout and stderr back. Header-only: the binary's
/// path comes from the test target's ATTNMIX_CLI definition.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace attnmix::testing {

struct RunResult {
  int code = -1;
  std::string out;
  std::string err;
  std::map<int, int> rank_codes;  ///< mpirun runs with the exit-code wrapper: each rank's exit code
};

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

class CliFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() / ("attnmix_" + std::string(info->test_suite_name()) + "_" +
                                                     std::string(info->name()) + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// Runs `command` with sh in the test directory, capturing stdout and stderr (as files: no terminal).
  RunResult shell(const std::string& command) const {
    const auto out = dir_ / ".stdout", err = dir_ / ".stderr";
    const std::string line = "cd '" + dir_.string() + "' && " + command + " >'" + out.string() + "' 2>'" +
                             err.string() + "'";
    const int status = std::system(line.c_str());
    RunResult result;
    result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.out = read_text(out);
    result.err = read_text(err);
    std::filesystem::remove(out);
    std::filesystem::remove(err);
    return result;
  }
  /// `attnmix <args>` as one process.
  RunResult run(const std::string& args) const { return shell(quoted(ATTNMIX_CLI) + " " + args); }

  /// 'text' for the shell (built piecewise: GCC 12 warns falsely on "'" + std::string(...)).
  static std::string quoted(const char* text) {
    std::string out = "'";
    out += text;
    out += "'";
    return out;
  }
  [[nodiscard]] std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }

  std::filesystem::path dir_;
};

}  // namespace attnmix::testing
