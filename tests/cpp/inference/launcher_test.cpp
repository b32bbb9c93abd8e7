// SPDX-License-Identifier: Apache-2.0
// launcher_world(): the size and rank an MPI launcher sets in the environment (communicator.hpp). Each test sets
// the variables it needs and restores every launcher variable afterwards.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "attnmix/inference/communicator.hpp"

namespace attnmix {
namespace {

class LauncherWorldTest : public ::testing::Test {
 protected:
  const std::vector<std::string> names_{"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK",
                                        "PMIX_RANK"};
  std::vector<std::optional<std::string>> saved_;

  void SetUp() override {
    for (const std::string& name : names_) {
      const char* value = std::getenv(name.c_str());
      saved_.push_back(value ? std::optional<std::string>(value) : std::nullopt);
      unsetenv(name.c_str());
    }
  }
  /// launcher_world() as the environment stands now, against the expected world.
  static void expect_world(bool launched, int size, int rank, const std::string& context = "") {
    const LauncherWorld world = launcher_world();
    EXPECT_EQ(world.launched, launched) << context;
    EXPECT_EQ(world.size, size) << context;
    EXPECT_EQ(world.rank, rank) << context;
  }
  void TearDown() override {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (saved_[i]) setenv(names_[i].c_str(), saved_[i]->c_str(), 1);
      else unsetenv(names_[i].c_str());
    }
  }
};

TEST_F(LauncherWorldTest, NoLauncherIsOneProcess) { expect_world(false, 1, 0); }

TEST_F(LauncherWorldTest, ReadsOpenMpiVariables) {
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  expect_world(true, 4, 3);
}

TEST_F(LauncherWorldTest, ReadsPmiVariables) {
  setenv("PMI_SIZE", "3", 1);
  setenv("PMI_RANK", "2", 1);
  expect_world(true, 3, 2);
}

TEST_F(LauncherWorldTest, PmixRankAloneIsLaunchedWithUnknownSize) {
  setenv("PMIX_RANK", "1", 1);
  expect_world(true, 1, 1);
}

TEST_F(LauncherWorldTest, MalformedValuesReadAsOneProcessRankZero) {
  for (const char* bad : {"", "two", "3x", "-2", "0", "99999999999"}) {
    setenv("OMPI_COMM_WORLD_SIZE", bad, 1);
    setenv("OMPI_COMM_WORLD_RANK", bad[0] == '0' ? "-1" : bad, 1);
    expect_world(true, 1, 0, bad);
  }
}

}  // namespace
}  // namespace attnmix
