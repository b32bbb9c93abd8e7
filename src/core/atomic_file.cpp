// SPDX-License-Identifier: Apache-2.0
// Atomic whole-file writes: temporary file, fsync, rename, fsync of the directory.
#include "attnmix/core/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
}  // namespace

void write_file_atomically(const std::string& path, std::string_view text, std::string_view what) {
  const std::string content(what);
  struct stat target {};
  mode_t mode = 0644;
  if (::stat(path.c_str(), &target) == 0) {
    if (S_ISDIR(target.st_mode)) throw_io_error(path, "cannot write " + content, EISDIR);
    mode = target.st_mode & 07777;
  }
  const std::string directory = parent_directory(path);
  const size_t slash = path.find_last_of('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string temp = directory + "/." + base + ".tmp.XXXXXX";
  const int fd = ::mkstemp(temp.data());
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
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw_io_error(path, "cannot move " + content + " into place", err);
  }
  // Make the rename itself durable; a failure here cannot un-write the file, so it is not reported.
  const int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace attnmix
