// SPDX-License-Identifier: Apache-2.0
/// @file errors.hpp
/// The exception types of attnmix (SPEC.md §1.9) and the internal-invariant assertion.
///   TypeError, ValueError : std::invalid_argument   bad arguments (Python TypeError / ValueError)
///   ImpossibleEvidenceError : ValueError            rows with log p = -inf and positive weight
///   StateError : std::runtime_error                 violated streaming-state receipts
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
  ImpossibleEvidenceError(const std::string& where, std::vector<int64_t> rows);
  /// The offending row indices, ascending, relative to the batch passed in.
  [[nodiscard]] const std::vector<int64_t>& rows() const noexcept { return rows_; }
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

[[noreturn]] void assertion_failed(const char* condition, const char* message, const char* file, int line);

}  // namespace attnmix

/// Broken internal invariant (a bug): prints file:line and aborts. Always on.
#define ATTNMIX_ASSERT(cond, msg) \
  ((cond) ? static_cast<void>(0) : ::attnmix::assertion_failed(#cond, msg, __FILE__, __LINE__))
#ifdef NDEBUG
#define ATTNMIX_DASSERT(cond, msg) static_cast<void>(0)
#else
#define ATTNMIX_DASSERT(cond, msg) ATTNMIX_ASSERT(cond, msg)
#endif
