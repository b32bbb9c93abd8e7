// SPDX-License-Identifier: Apache-2.0
/// @file atomic_file.hpp
/// Whole-file writes that never leave a partial file: the text goes to a temporary file in the target's directory,
/// is flushed with fsync, and is renamed over the target (atomic on POSIX). An existing file keeps its mode. On any
/// failure the temporary file is removed and the target is untouched.
///
/// Only regular files are replaced. A target that exists and is anything else (a directory, a device such as
/// /dev/null, a FIFO, a socket) is refused before anything is written: renaming over it would replace the node itself
/// with a regular file. A symbolic link is written through: its final target (a regular file, or a new file where a
/// dangling link points) is replaced and the link is kept.
///
/// Interruption: the temporary file of the write in progress is recorded in a slot that
/// remove_pending_temporary_file() reads, so that a program's signal handler can remove it before the program ends.
/// The library installs no signal handler itself. A process killed outright (SIGKILL, power loss) keeps the old file
/// (the rename has not happened) but may leave the hidden temporary file `.NAME.tmp.XXXXXX` beside it.
#pragma once

#include <string>
#include <string_view>

namespace attnmix {

/// Writes text to path atomically. `what` names the content in messages ("the model", "the results").
/// @throws IoError (a std::runtime_error) "path: cannot … <what>…: <reason>" (path is a directory, a device or a
///   FIFO, no permission, disk full).
void write_file_atomically(const std::string& path, std::string_view text, std::string_view what = "the file");

/// Removes the temporary file of the write_file_atomically in progress, if there is one, and returns whether there
/// was. Async-signal-safe (it reads a lock-free flag and calls unlink(2) on a path recorded before the write began):
/// meant for a SIGINT/SIGTERM handler that then ends the process; the interrupted write then fails, leaving the
/// target untouched, if the process goes on. One slot per copy of the library: when several threads write at once,
/// only the first one's temporary file is recorded.
bool remove_pending_temporary_file() noexcept;

}  // namespace attnmix
