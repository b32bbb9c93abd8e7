// SPDX-License-Identifier: Apache-2.0
// Shared CLI helpers: number formatting and the output-path pre-check.
#include "cli_support.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace attnmix::cli {

std::string format_double(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::array<char, 64> buf{};
  const auto result = std::to_chars(buf.data(), buf.data() + buf.size(), x);
  return {buf.data(), result.ptr};
}

std::string format_short(double x, int digits) {
  std::array<char, 64> buf{};
  std::snprintf(buf.data(), buf.size(), "%.*g", digits, x);
  return buf.data();
}

std::string format_seconds(double seconds) {
  std::array<char, 64> buf{};
  std::snprintf(buf.data(), buf.size(), "%.3f", seconds);
  return buf.data();
}

namespace {

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

}  // namespace

void check_output_path(const std::string& path, std::string_view what) {
  if (path.empty()) throw std::runtime_error("the output path is empty");
  const std::string cannot = path + ": cannot write " + std::string(what);
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode))
    throw std::runtime_error(cannot + " there: it is a directory");
  const std::string directory = parent_directory(path);
  if (::stat(directory.c_str(), &info) != 0)
    throw std::runtime_error(cannot + ": directory " + directory + ": " + std::strerror(errno));
  if (!S_ISDIR(info.st_mode))
    throw std::runtime_error(cannot + ": " + directory + " is not a directory");
  if (::access(directory.c_str(), W_OK) != 0)
    throw std::runtime_error(cannot + ": directory " + directory + ": " + std::strerror(errno));
}

}  // namespace attnmix::cli
