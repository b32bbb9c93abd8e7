// SPDX-License-Identifier: Apache-2.0
// Atomic whole-file writes: temporary file, fsync, rename, fsync of the directory; the temporary file of the write in
// progress is recorded for remove_pending_temporary_file() (a signal handler's cleanup).
#include "attnmix/core/atomic_file.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <climits>
#include <cstring>
#include <stdexcept>

#include "attnmix/core/errors.hpp"

namespace attnmix {

namespace {

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

/// The file a write to `path` replaces: `path` itself, or, for a symbolic link, the end of its chain of links (which
/// may not exist yet: a dangling link's target is created). Relative links are relative to the link's directory.
std::string resolve_links(const std::string& path, const std::string& content) {
  constexpr int kMaxLinks = 40;  // Linux's own limit on a chain of links (ELOOP)
  std::string target = path;
  for (int depth = 0;; ++depth) {
    struct stat info {};
    if (::lstat(target.c_str(), &info) != 0 || !S_ISLNK(info.st_mode)) return target;
    if (depth == kMaxLinks) throw_io_error(path, "cannot write " + content, ELOOP);
    std::string link(PATH_MAX, '\0');
    const ssize_t n = ::readlink(target.c_str(), link.data(), link.size());
    if (n < 0) throw_io_error(path, "cannot write " + content + ": cannot read the symbolic link " + target, errno);
    link.resize(static_cast<size_t>(n));
    target = !link.empty() && link.front() == '/' ? link : parent_directory(target) + "/" + link;
  }
}

// The temporary file of the write in progress, for remove_pending_temporary_file(): the path is written while the
// state is kClaimed and read only in state kArmed (the atomic's seq_cst store/load order the two).
constexpr size_t kPendingCapacity = 4096;
constexpr int kFree = 0, kClaimed = 1, kArmed = 2;
char pending_path[kPendingCapacity];
std::atomic<int> pending_state{kFree};
static_assert(std::atomic<int>::is_always_lock_free, "remove_pending_temporary_file must be async-signal-safe");

/// Holds the slot for one write when it was free (a concurrent write goes unrecorded) and frees it when done.
class PendingSlot {
 public:
  explicit PendingSlot(const std::string& temp_template) {
    int expected = kFree;
    held_ = temp_template.size() < kPendingCapacity && pending_state.compare_exchange_strong(expected, kClaimed);
  }
  PendingSlot(const PendingSlot&) = delete;
  PendingSlot& operator=(const PendingSlot&) = delete;
  ~PendingSlot() { release(); }

  /// Records the temporary file before it is created, so that no moment exists when it is there but
  /// unrecorded (a signal caught right after the creation must still find it).
  void arm(const std::string& temp) {
    if (!held_) return;
    pending_state.store(kClaimed);
    std::memcpy(pending_path, temp.c_str(), temp.size() + 1);
    pending_state.store(kArmed);
  }
  /// The temporary file is gone (renamed or removed): nothing for a signal's cleanup to do.
  void release() {
    if (held_) pending_state.store(kFree);
    held_ = false;
  }

 private:
  bool held_ = false;
};

/// Six random characters from [A-Za-z0-9], as mkstemp's XXXXXX.
std::string random_suffix() {
  static constexpr char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  static std::atomic<uint64_t> counter{0};
  std::array<unsigned char, 6> bytes{};
  if (::getrandom(bytes.data(), bytes.size(), GRND_NONBLOCK) != static_cast<ssize_t>(bytes.size())) {
    // No entropy yet (early boot): a per-process sequence of the clock, the process id and a counter.
    uint64_t x = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                 (static_cast<uint64_t>(::getpid()) << 32) ^ counter.fetch_add(0x9e3779b97f4a7c15ULL);
    for (unsigned char& b : bytes) {
      x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ULL;
      b = static_cast<unsigned char>(x >> 56);
    }
  }
  std::string suffix(bytes.size(), 'X');
  for (size_t k = 0; k < bytes.size(); ++k) suffix[k] = kChars[bytes[k] % (sizeof kChars - 1)];
  return suffix;
}

/// Creates `prefix` + XXXXXX exclusively (mode 0600), as mkstemp does, recording each candidate in the slot
/// before creating it. Returns the descriptor and sets `temp`, or -1 with errno.
int create_temporary_file(const std::string& prefix, std::string& temp, PendingSlot& pending) {
  constexpr int kAttempts = 100;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    temp = prefix + random_suffix();
    pending.arm(temp);
    const int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

}  // namespace

bool remove_pending_temporary_file() noexcept {
  if (pending_state.load() != kArmed) return false;
  return ::unlink(pending_path) == 0;
}

void write_file_atomically(const std::string& path, std::string_view text, std::string_view what) {
  const std::string content(what);
  const std::string target_path = resolve_links(path, content);
  struct stat target {};
  mode_t mode = 0644;
  if (::stat(target_path.c_str(), &target) == 0) {
    if (S_ISDIR(target.st_mode)) throw_io_error(path, "cannot write " + content, EISDIR);
    // Renaming over a device, a FIFO or a socket would replace the node itself (as root: /dev/null).
    if (!S_ISREG(target.st_mode))
      throw IoError(path + ": cannot write " + content +
                        ": it is not a regular file (a device, a pipe or a socket); only regular files are replaced",
                    EINVAL);
    mode = target.st_mode & 07777;
  }
  const std::string directory = parent_directory(target_path);
  const size_t slash = target_path.find_last_of('/');
  const std::string base = slash == std::string::npos ? target_path : target_path.substr(slash + 1);
  const std::string prefix = directory + "/." + base + ".tmp.";
  std::string temp = prefix + "XXXXXX";
  PendingSlot pending(temp);
  const int fd = create_temporary_file(prefix, temp, pending);
  if (fd < 0) throw_io_error(path, "cannot write " + content + ": cannot create a temporary file in " + directory, errno);
  const auto fail = [&](const std::string& step) {
    const int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    throw_io_error(path, step, err);
  };
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write " + content);
    }
    written += static_cast<size_t>(n);
  }
  if (::fchmod(fd, mode) != 0) fail("cannot set the file mode");
  if (::fsync(fd) != 0) fail("cannot flush " + content + " to disk");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw_io_error(path, "cannot close " + content, err);
  }
  if (::rename(temp.c_str(), target_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw_io_error(path, "cannot move " + content + " into place", err);
  }
  pending.release();
  // Make the rename itself durable; a failure here cannot un-write the file, so it is not reported.
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace attnmix
