// SPDX-License-Identifier: Apache-2.0
/// @file allocator.hpp
/// Process-wide allocator policy for programs that run many EM iterations (the attnmix CLI calls it at start-up).
///
/// Every iteration builds a new model and frees the previous one; their large arrays (an S×T emission table is
/// megabytes) go back to the system on free and fault in again on the next allocation. On a virtual machine a page
/// fault costs about 15 µs, i.e. about 4 ms per MiB allocated, which can exceed the E-step itself
/// (docs/PERFORMANCE.md). With glibc, retain_freed_memory() serves allocations up to 32 MiB from the heap and never
/// trims it, so freed buffers are reused; the resident size then stays at its peak. The equivalent for any process
/// is GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295.
/// A library never calls this on its own: it changes the whole process.
#pragma once

namespace attnmix {

/// Applies the policy above; returns false (and changes nothing) where the C library does not support it.
bool retain_freed_memory() noexcept;

}  // namespace attnmix
