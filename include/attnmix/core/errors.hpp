// SPDX-License-Identifier: Apache-2.0
/// @file errors.hpp
/// The exception types of attnmix and the internal-invariant assertion.
///   TypeError, ValueError : std::invalid_argument   bad arguments (Python TypeError / ValueError)
///   ImpossibleEvidenceError : ValueError            rows with log p = -inf and positive weight
///   StateError : std::runtime_error                 violated streaming-state receipts
///   IoError : std::runtime_error                    a file cannot be opened, read or written (Python OSError)
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace attnmix {

/// A value of the wrong kind (bool ids, non-real data, wrong batch family).
class TypeError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A value of the right kind outside its support (shape, range, simplex, mass law).
class ValueError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Rows whose likelihood is exactly zero were given positive weight; nothing was changed.
class ImpossibleEvidenceError : public ValueError {
 public:
  /// The message is "<where> encountered impossible evidence at rows [3, 9]: log p = -inf with positive weight"
  /// (the first 20 rows, then their count).
  ImpossibleEvidenceError(const std::string& where, std::vector<int64_t> rows);
  /// The offending row indices, ascending, relative to the batch passed in.
  [[nodiscard]] const std::vector<int64_t>& rows() const noexcept { return rows_; }
  /// The component that raised the error, without the rows: a family's kWhere, such as
  /// "ResponsibilityAttentionDistribution".
  [[nodiscard]] const std::string& where() const noexcept { return where_; }

 private:
  std::string where_;
  std::vector<int64_t> rows_;
};

/// A streaming-state contract (conservation receipt) was violated.
class StateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A file could not be opened, read or written. The message names the path, the step and the system's reason;
/// error_number() is the errno value (0 when the cause is not a system error), from which Python picks the OSError
/// subclass (FileNotFoundError, PermissionError, IsADirectoryError, …).
class IoError : public std::runtime_error {
 public:
  /// An error with the whole message (path, step and reason) and the errno value behind it (0 when none).
  IoError(const std::string& message, int error_number) : std::runtime_error(message), error_number_(error_number) {}
  /// The errno value of the failure, or 0 when the cause is not a system error.
  [[nodiscard]] int error_number() const noexcept { return error_number_; }

 private:
  int error_number_;
};

/// Throws IoError("<path>: <step>: <strerror(error_number)>", error_number).
[[noreturn]] void throw_io_error(const std::string& path, const std::string& step, int error_number);

/// What ATTNMIX_ASSERT calls on a broken invariant: prints "file:line: attnmix internal assertion `condition`
/// failed: message" to stderr and aborts. Never returns and never throws.
[[noreturn]] void assertion_failed(const char* condition, const char* message, const char* file, int line);

}  // namespace attnmix

/// Broken internal invariant (a bug): prints file:line and aborts. Always on.
#define ATTNMIX_ASSERT(cond, msg) \
  ((cond) ? static_cast<void>(0) : ::attnmix::assertion_failed(#cond, msg, __FILE__, __LINE__))
#ifdef NDEBUG
/// Debug-only ATTNMIX_ASSERT: with NDEBUG defined it does nothing and cond is not evaluated.
#define ATTNMIX_DASSERT(cond, msg) static_cast<void>(0)
#else
/// Debug-only ATTNMIX_ASSERT, for checks too costly for release builds: without NDEBUG it is ATTNMIX_ASSERT; with
/// NDEBUG defined it does nothing and cond is not evaluated.
#define ATTNMIX_DASSERT(cond, msg) ATTNMIX_ASSERT(cond, msg)
#endif
