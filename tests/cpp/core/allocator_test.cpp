// SPDX-License-Identifier: Apache-2.0
// retain_freed_memory (core/allocator.hpp): on glibc it must actually change the allocator's policy.
#include "attnmix/core/allocator.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace attnmix {
namespace {

#if defined(__GLIBC__)
TEST(AllocatorTest, RetainFreedMemoryServesLargeBlocksFromTheHeap) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer replaces glibc's malloc, whose policy this test measures";
#endif
  ASSERT_TRUE(retain_freed_memory());
  // 8 MiB is above glibc's default mmap threshold (128 KiB, at most 32 MiB when adjusted dynamically) but below the
  // retained policy's 32 MiB: it must come from the heap, not from a fresh mapping that free() would unmap.
  const size_t mapped_before = mallinfo2().hblkhd;
  constexpr size_t kBytes = 8u << 20;
  auto* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  EXPECT_EQ(mallinfo2().hblkhd, mapped_before);
  std::free(block);
}
#else
TEST(AllocatorTest, RetainFreedMemoryReportsUnsupportedOutsideGlibc) { EXPECT_FALSE(retain_freed_memory()); }
#endif

}  // namespace
}  // namespace attnmix
