// SPDX-License-Identifier: Apache-2.0
#include "attnmix/core/errors.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace attnmix {

namespace {
std::string impossible_message(const std::string& where, const std::vector<int64_t>& rows) {
  std::ostringstream os;
  os << where << " encountered impossible evidence at rows [";
  const size_t shown = rows.size() < 20 ? rows.size() : 20;
  for (size_t i = 0; i < shown; ++i) os << (i ? ", " : "") << rows[i];
  if (shown < rows.size()) os << ", ... (" << rows.size() << " rows)";
  os << "]: log p = -inf with positive weight";
  return os.str();
}
}  // namespace

ImpossibleEvidenceError::ImpossibleEvidenceError(const std::string& where, std::vector<int64_t> rows)
    : ValueError(impossible_message(where, rows)), where_(where), rows_(std::move(rows)) {}

void throw_io_error(const std::string& path, const std::string& step, int error_number) {
  throw IoError(path + ": " + step + ": " + std::strerror(error_number), error_number);
}

void assertion_failed(const char* condition, const char* message, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: attnmix internal assertion `%s` failed: %s\n", file, line, condition, message);
  std::abort();
}

}  // namespace attnmix
