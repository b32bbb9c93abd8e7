// SPDX-License-Identifier: Apache-2.0
#include "attnmix/io/input_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

#include "attnmix/core/errors.hpp"

namespace attnmix {

void check_input_file(const std::string& path, std::string_view what, std::string_view advice) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return;  // the reader reports a missing file
  const std::string cannot = path + ": cannot read " + std::string(what);
  if (S_ISDIR(info.st_mode)) throw IoError(cannot + ": it is a directory", EISDIR);
  if (!S_ISREG(info.st_mode))
    throw IoError(cannot + ": it is not a regular file (a pipe or a device)" +
                      (advice.empty() ? std::string() : "; " + std::string(advice)),
                  EINVAL);
}

std::string read_input_file(const std::string& path, std::string_view what) {
  check_input_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_io_error(path, "cannot open " + std::string(what), errno);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw_io_error(path, "cannot read " + std::string(what), errno != 0 ? errno : EIO);
  return text.str();
}

}  // namespace attnmix
