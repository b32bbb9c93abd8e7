// SPDX-License-Identifier: Apache-2.0
// Shared CLI helpers: number formatting, the input- and output-path checks, the thread cap, the
// checked standard output and the cleanup of interrupted atomic writes.
#include "cli_support.hpp"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <streambuf>

#include "attnmix/core/atomic_file.hpp"
#include "attnmix/core/errors.hpp"

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

std::string flag_name(std::string_view option) {
  std::string out = "--" + std::string(option);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

// ---- files -------------------------------------------------------------------------------------

namespace {

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

}  // namespace

void check_output_path(const std::string& path, std::string_view what,
                       const std::vector<InputFile>& inputs, std::string_view flag) {
  if (path.empty()) throw std::runtime_error("the output path is empty");
  const std::string cannot = path + ": cannot write " + std::string(what);
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0) {  // through symbolic links: the file that would be replaced
    if (S_ISDIR(info.st_mode)) throw std::runtime_error(cannot + " there: it is a directory");
    if (!S_ISREG(info.st_mode))
      throw std::runtime_error(cannot + " there: it is not a regular file (a device, a pipe or a socket), and "
                               "writing would replace it by one; give a regular file or a new path");
    for (const InputFile& input : inputs) {
      struct stat read {};
      if (input.path.empty() || ::stat(input.path.c_str(), &read) != 0) continue;
      if (read.st_dev == info.st_dev && read.st_ino == info.st_ino)
        throw std::runtime_error(std::string(flag) + " " + path + " is the file " + input.flag + " reads (" +
                                 input.path + "): writing " + std::string(what) +
                                 " there would replace it; give " + std::string(flag) + " another path");
    }
  }
  // A symbolic link is written through (write_file_atomically): the directory that matters is its target's.
  std::string directory = parent_directory(path);
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    std::array<char, 4096> resolved{};
    if (::realpath(path.c_str(), resolved.data()) != nullptr) directory = parent_directory(resolved.data());
  }
  if (::stat(directory.c_str(), &info) != 0)
    throw std::runtime_error(cannot + ": directory " + directory + ": " + std::strerror(errno));
  if (!S_ISDIR(info.st_mode))
    throw std::runtime_error(cannot + ": " + directory + " is not a directory");
  if (::access(directory.c_str(), W_OK) != 0)
    throw std::runtime_error(cannot + ": directory " + directory + ": " + std::strerror(errno));
}

// ---- threads -----------------------------------------------------------------------------------

namespace {

/// The hardware threads this process may run on (its CPU affinity), at least 1.
int hardware_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
}

}  // namespace

int capped_threads(int requested) {
  if (requested <= 0) return requested;
  return std::min(requested, hardware_threads());
}

// ---- standard output ---------------------------------------------------------------------------

namespace {

/// std::cout's buffer after install_checked_stdout: write(2) to descriptor 1, the first error kept
/// and thrown.
class CheckedStdoutBuffer : public std::streambuf {
 public:
  explicit CheckedStdoutBuffer(bool stop_at_first_error)
      : line_flush_(::isatty(STDOUT_FILENO) == 1), throw_(stop_at_first_error) {
    setp(buffer_.data(), buffer_.data() + buffer_.size());
  }

  /// The first failed write's message ("" if none).
  [[nodiscard]] const std::string& error() const { return error_; }

  /// Writes what is buffered without throwing; false on failure.
  bool drain() noexcept {
    try {
      return write_out();
    } catch (...) {
      return false;
    }
  }

  /// Forgets what is buffered (after a reported failure).
  void discard() { setp(buffer_.data(), buffer_.data() + buffer_.size()); }

 protected:
  int_type overflow(int_type c) override {
    if (!write_or_throw()) return traits_type::eof();
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    *pptr() = traits_type::to_char_type(c);
    pbump(1);
    if (line_flush_ && traits_type::to_char_type(c) == '\n' && !write_or_throw()) return traits_type::eof();
    return c;
  }

  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::streamsize done = 0;
    while (done < n) {
      if (pptr() == epptr() && !write_or_throw()) return done;
      const auto room = static_cast<std::streamsize>(epptr() - pptr());
      const std::streamsize k = std::min(room, n - done);
      std::memcpy(pptr(), s + done, static_cast<size_t>(k));
      pbump(static_cast<int>(k));
      done += k;
    }
    if (line_flush_ && std::memchr(s, '\n', static_cast<size_t>(n)) != nullptr && !write_or_throw()) return done;
    return done;
  }

  int sync() override { return write_or_throw() ? 0 : -1; }

 private:
  /// Writes the buffer to descriptor 1; on failure keeps the first error and returns false.
  bool write_out() {
    if (!error_.empty()) {
      discard();
      return false;
    }
    const char* p = pbase();
    while (p < pptr()) {
      const ssize_t n = ::write(STDOUT_FILENO, p, static_cast<size_t>(pptr() - p));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error_ = std::string("cannot write to standard output: ") + (n < 0 ? std::strerror(errno) : "nothing written");
        discard();
        return false;
      }
      p += n;
    }
    discard();
    return true;
  }

  /// write_out, throwing the error when the command is to stop there (std::cout rethrows it: its
  /// exceptions include badbit); otherwise the stream goes bad and drops the rest.
  bool write_or_throw() {
    if (!write_out()) {
      if (throw_) throw std::runtime_error(error_);
      return false;
    }
    return true;
  }

  std::array<char, 1 << 16> buffer_{};
  bool line_flush_;
  bool throw_;
  std::string error_;
};

CheckedStdoutBuffer* checked_stdout = nullptr;

}  // namespace

void install_checked_stdout(bool stop_at_first_error) {
  if (checked_stdout != nullptr) return;
  // Never destroyed: std::cout is flushed into it after every static destructor has run.
  checked_stdout = new CheckedStdoutBuffer(stop_at_first_error);
  std::cout.flush();
  std::cout.rdbuf(checked_stdout);
  if (stop_at_first_error) std::cout.exceptions(std::ios::badbit);
}

std::string finish_stdout() noexcept {
  if (checked_stdout == nullptr) return {};
  checked_stdout->drain();
  if (!checked_stdout->error().empty()) {
    checked_stdout->discard();
    std::cout.exceptions(std::ios::goodbit);  // the failure is reported once; later output is dropped
  }
  return checked_stdout->error();
}

// ---- interruption ------------------------------------------------------------------------------

namespace {

std::atomic<TemporaryFileCleanup> plugin_cleanup{nullptr};
static_assert(std::atomic<TemporaryFileCleanup>::is_always_lock_free, "read in a signal handler");

}  // namespace

void add_temporary_file_cleanup(TemporaryFileCleanup cleanup) noexcept { plugin_cleanup.store(cleanup); }

void remove_pending_temporary_files() noexcept {
  attnmix::remove_pending_temporary_file();
  if (const TemporaryFileCleanup cleanup = plugin_cleanup.load()) cleanup();
}

}  // namespace attnmix::cli
