// SPDX-License-Identifier: Apache-2.0
// The allocator policy of core/allocator.hpp (glibc mallopt; a no-op elsewhere).
#include "attnmix/core/allocator.hpp"

#include <cstddef>  // defines __GLIBC__ (through <features.h>) before the test below

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace attnmix {

bool retain_freed_memory() noexcept {
#if defined(__GLIBC__)
  constexpr int kMmapThreshold = 32 * 1024 * 1024;  // glibc's maximum: larger blocks are mmapped regardless
  constexpr int kTrimThreshold = 2147483647;        // never give the heap top back
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 && mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace attnmix
