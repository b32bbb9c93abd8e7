// SPDX-License-Identifier: Apache-2.0
// launcher_world(): the process count and rank an MPI launcher put in the environment (communicator.hpp).
#include <cstdlib>

#include "attnmix/inference/communicator.hpp"

namespace attnmix {

namespace {

/// The value of a variable holding a decimal integer ≥ minimum, or fallback when it is unset or anything else.
int env_int(const char* name, int minimum, int fallback) noexcept {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < minimum || value > 1'000'000'000L) return fallback;
  return static_cast<int>(value);
}

}  // namespace

LauncherWorld launcher_world() noexcept {
  LauncherWorld world;
  world.launched = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
                   std::getenv("PMIX_RANK") != nullptr;
  if (!world.launched) return world;
  world.size = env_int("OMPI_COMM_WORLD_SIZE", 1, env_int("PMI_SIZE", 1, 1));
  world.rank = env_int("OMPI_COMM_WORLD_RANK", 0, env_int("PMI_RANK", 0, env_int("PMIX_RANK", 0, 0)));
  return world;
}

}  // namespace attnmix
