// SPDX-License-Identifier: Apache-2.0
/// @file atomic_file.hpp
/// Whole-file writes that never leave a partial file: the text goes to a temporary file in the target's directory,
/// is flushed with fsync, and is renamed over the target (atomic on POSIX). An existing file keeps its mode. On any
/// failure the temporary file is removed and the target is untouched.
#pragma once

#include <string>
#include <string_view>

namespace attnmix {

/// Writes text to path atomically. `what` names the content in messages ("the model", "the results").
/// @throws std::runtime_error "path: cannot … <what>…: <reason>" (path is a directory, no permission, disk full).
void write_file_atomically(const std::string& path, std::string_view text, std::string_view what = "the file");

}  // namespace attnmix
