// SPDX-License-Identifier: Apache-2.0
/// @file input_file.hpp
/// The check every reader of a named input file (data, model, text, checkpoint) makes before opening it.
#pragma once

#include <string>
#include <string_view>

namespace attnmix {

/// Refuses a directory, a pipe or a device named as an input file (a FIFO would block the open until a writer
/// comes, and a file read more than once must be a regular file): IoError "<path>: cannot read <what>: it is a
/// directory" (EISDIR) or "…: it is not a regular file (a pipe or a device); <advice>" (EINVAL). A missing file passes:
/// its reader reports it.
void check_input_file(const std::string& path, std::string_view what,
                      std::string_view advice = "save its contents to a file first");

/// The whole contents of the input file `path`, after check_input_file.
/// @throws IoError "<path>: cannot open <what>: <reason>" or "<path>: cannot read <what>: <reason>" (with its errno)
///         when it cannot be opened or read.
[[nodiscard]] std::string read_input_file(const std::string& path, std::string_view what);

}  // namespace attnmix
