// SPDX-License-Identifier: Apache-2.0
/// @file fuzz_support.hpp
/// What every libFuzzer target of attnmix shares (docs/fuzzing.md): a scratch file that holds the input bytes for
/// the readers that take a path, and the line between an expected rejection and a finding.
///
/// An input the product rejects the way the CLI reports it — attnmix::ValueError, attnmix::TypeError (both
/// std::invalid_argument), or a std::runtime_error such as attnmix::IoError — is not a finding: the target returns
/// 0. Anything else that escapes (std::length_error, std::out_of_range from std::stoll, std::bad_alloc, a JSON
/// library exception, c10::Error) reaches std::terminate and libFuzzer reports the input, as it does every
/// sanitizer report, assertion failure, timeout and leak.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "attnmix/core/errors.hpp"

namespace attnmix::fuzz {

/// A file in this process's own scratch directory (under $TMPDIR, removed at exit), rewritten with each input.
class ScratchFile {
 public:
  /// `name`: the file name, whose extension some messages quote ("data.jsonl").
  explicit ScratchFile(std::string_view name) : path_((directory() / std::string(name)).string()) {}

  /// Replaces the file's bytes; returns its path.
  const std::string& write(const uint8_t* data, size_t size) const {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.close();
    if (!out) {
      std::perror(path_.c_str());
      std::abort();  // the harness itself failed: not an input's fault, but never silently skipped
    }
    return path_;
  }

  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  static const std::filesystem::path& directory() {
    static const std::filesystem::path dir = [] {
      const char* tmp = std::getenv("TMPDIR");
      std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/attnmix-fuzz-XXXXXX";
      if (!mkdtemp(pattern.data())) {
        std::perror("mkdtemp");
        std::abort();
      }
      static std::filesystem::path made = pattern;
      std::atexit([] {
        std::error_code ignored;
        std::filesystem::remove_all(made, ignored);
      });
      return made;
    }();
    return dir;
  }

  std::string path_;
};

/// Runs one input through `body`, treating the rejections the CLI reports as errors as the expected outcome.
template <class F>
int run_one(F&& body) {
  try {
    std::forward<F>(body)();
  } catch (const attnmix::ValueError&) {     // also ImpossibleEvidenceError
  } catch (const attnmix::TypeError&) {
  } catch (const std::runtime_error&) {      // IoError, StateError, the readers' I/O errors
  }
  return 0;
}

/// Splits the first byte off an input (the mode byte that chooses what the rest is fed to).
struct ModeAndBytes {
  uint8_t mode = 0;
  const uint8_t* data = nullptr;
  size_t size = 0;
};
inline ModeAndBytes split_mode(const uint8_t* data, size_t size) {
  if (size == 0) return {0, data, 0};
  return {data[0], data + 1, size - 1};
}

}  // namespace attnmix::fuzz
