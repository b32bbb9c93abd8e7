// SPDX-License-Identifier: Apache-2.0
/// @file cli_support.hpp
/// Small pieces every attnmix subcommand shares: the exit codes, the usage-error type, number
/// formatting, the checks of input and output paths before a long run starts, the thread cap,
/// standard output that reports its write errors, and the cleanup of interrupted atomic writes.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace attnmix::cli {

/// Exit codes (docs/model-format.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 1;
inline constexpr int kExitData = 2;
inline constexpr int kExitNotConverged = 3;

/// A command line that parses but asks for something impossible (a family not in this build,
/// conflicting flags): reported like a CLI11 parse error, exit code 1.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The shortest decimal text that reads back to the same double ("-inf"/"inf"/"nan" for non-finite
/// values).
[[nodiscard]] std::string format_double(double x);

/// x with `digits` significant digits (%.*g), for human-readable summaries.
[[nodiscard]] std::string format_short(double x, int digits = 6);

/// "--max-clusters" for "max_clusters": an option as the command line names it.
[[nodiscard]] std::string flag_name(std::string_view option);

/// Seconds with three decimals ("0.123"), as printed after each progress line.
[[nodiscard]] std::string format_seconds(double seconds);

// ---- files -------------------------------------------------------------------------------------

/// A file a command reads, named by its flag ("--data"), for check_output_path's same-file test.
struct InputFile {
  std::string flag;
  std::string path;
};

/// Throws std::runtime_error unless `path` can be created or replaced: its directory exists and is
/// writable; `path`, if it exists, is a regular file (or a symbolic link to one) — not a directory,
/// nor a device, FIFO or socket, which the atomic rename would replace by a regular file; and it is
/// not the same file as any of `inputs` (same device and inode, so another spelling of the path, a
/// hard link or a symbolic link counts too): "--out d.jsonl is the file --data reads (./d.jsonl)".
/// Run before fitting so that a bad --out fails in milliseconds, not after the fit. `what` names
/// the file in messages ("cannot write the model"), `flag` the output's flag.
void check_output_path(const std::string& path, std::string_view what = "the model",
                       const std::vector<InputFile>& inputs = {}, std::string_view flag = "--out");


// ---- threads -----------------------------------------------------------------------------------

/// The threads a command runs with for --threads `requested` (> 0; 0 means every hardware thread
/// where a command allows it): at most the machine's hardware threads (at least 1), so that a huge
/// --threads cannot ask for millions of threads. Results of fit and assign-tree do not depend on
/// the count; an lm run's do (libtorch's reductions), and its summary prints the count used.
[[nodiscard]] int capped_threads(int requested);

// ---- standard output ---------------------------------------------------------------------------

/// Routes std::cout through a buffer that writes to file descriptor 1 with write(2) and keeps the
/// first error ("cannot write to standard output: <reason>": a full disk, /dev/full, a closed pipe
/// with SIGPIPE ignored). With stop_at_first_error the failing write throws it as a
/// std::runtime_error, so that a command stops at its first lost line and main() reports it with
/// exit code 2; without (a distributed fit, where rank 0 must not leave the others waiting in a
/// collective) the rest of the output is dropped and finish_stdout() reports it. Output is flushed
/// when the buffer fills, at each std::flush, at finish_stdout(), and, on a terminal, at every
/// newline. main() calls it once, before any output.
void install_checked_stdout(bool stop_at_first_error);

/// Flushes std::cout and returns the error of its first failed write ("" when every byte was
/// written, or before install_checked_stdout). Never throws; after a failure it discards what is
/// still buffered, so the failure is reported once.
[[nodiscard]] std::string finish_stdout() noexcept;

// ---- interruption ------------------------------------------------------------------------------

/// The cleanup of a loaded plugin's copy of the library (attnmix::remove_pending_temporary_file in
/// attnmix-lm.so, which has its own slot for its own writes).
using TemporaryFileCleanup = bool (*)() noexcept;

/// Registers a plugin's cleanup for remove_pending_temporary_files (commands/lm.cpp, on loading).
void add_temporary_file_cleanup(TemporaryFileCleanup cleanup) noexcept;

/// Removes the temporary file of every atomic write in progress: the executable's and the plugin's.
/// Async-signal-safe: main()'s SIGINT/SIGTERM/SIGHUP handler calls it before the signal ends the
/// process.
void remove_pending_temporary_files() noexcept;

}  // namespace attnmix::cli
