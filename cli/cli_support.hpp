// SPDX-License-Identifier: Apache-2.0
/// @file cli_support.hpp
/// Small pieces every attnmix subcommand shares: the exit codes, the usage-error type, number
/// formatting, the check that an output path can be written before a long run starts, and the
/// atomic writer of result files.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace attnmix::cli {

/// Exit codes (SPEC.md §1.10).
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

/// Seconds with three decimals ("0.123"), as printed after each progress line.
[[nodiscard]] std::string format_seconds(double seconds);

/// Throws std::runtime_error unless `path` can be created or replaced: its directory exists and is
/// writable and `path` is not a directory. Run before fitting so that a bad --out fails in
/// milliseconds, not after the fit. `what` names the file in messages ("cannot write the model").
void check_output_path(const std::string& path, std::string_view what = "the model");

}  // namespace attnmix::cli
