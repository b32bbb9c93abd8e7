// SPDX-License-Identifier: Apache-2.0
/// @file interrupted_write.hpp
/// For the CLI tests of interrupted writes (cli_files_test.cpp, cli_lm_files_test.cpp): runs the attnmix binary,
/// catches it in the middle of an atomic write (its hidden temporary file `.NAME.tmp.XXXXXX` exists), and sends it a
/// signal there. Header-only.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace attnmix::testing {

/// The temporary file of an atomic write of `dir`/`name` in progress, if there is one.
inline std::optional<std::filesystem::path> temporary_file_of(const std::filesystem::path& dir,
                                                              const std::string& name) {
  const std::string prefix = "." + name + ".tmp.";
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) return entry.path();
  return std::nullopt;
}

/// Starts `args` (args[0]: the executable) in `dir` with stdout and stderr to /dev/null and SIGINT, SIGTERM and
/// SIGHUP at their default actions (as from a terminal, whatever the test runner ignores).
inline pid_t spawn_in(const std::filesystem::path& dir, const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const std::string where = dir.string();
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const int s : {SIGINT, SIGTERM, SIGHUP}) ::signal(s, SIG_DFL);
    const int null = ::open("/dev/null", O_WRONLY);
    if (null < 0 || ::chdir(where.c_str()) != 0) ::_exit(127);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

/// What interrupt_write saw.
struct Interruption {
  bool caught = false;  ///< the signal came while the temporary file existed
  int status = 0;       ///< the wait status of the (last) run
};

/// Runs `args` in `dir` until the temporary file of its write of `name` appears, stops it there (SIGSTOP, waiting
/// until it has stopped), and, if the temporary file is still there, sends `signal_number` and lets it go on
/// (SIGCONT). When the write had finished by then the run is repeated, after `reset()`, up to `attempts` times.
inline Interruption interrupt_write(const std::filesystem::path& dir, const std::vector<std::string>& args,
                                    const std::string& name, int signal_number,
                                    const std::function<void()>& reset, int attempts = 5) {
  Interruption result;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    reset();
    const pid_t pid = spawn_in(dir, args);
    if (pid < 0) return result;
    bool stopped = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(4);
    while (std::chrono::steady_clock::now() < deadline) {
      if (temporary_file_of(dir, name)) {
        ::kill(pid, SIGSTOP);
        if (::waitpid(pid, &result.status, WUNTRACED) == pid && WIFSTOPPED(result.status)) stopped = true;
        break;
      }
      if (::waitpid(pid, &result.status, WNOHANG) == pid) break;  // ended without our seeing the write
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (!stopped) {
      if (::waitpid(pid, &result.status, WNOHANG) == 0) {  // the deadline passed
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &result.status, 0);
      }
      continue;
    }
    if (temporary_file_of(dir, name)) {  // stopped in the middle of the write
      ::kill(pid, signal_number);
      ::kill(pid, SIGCONT);
      ::waitpid(pid, &result.status, 0);
      result.caught = true;
      return result;
    }
    ::kill(pid, SIGCONT);  // the write had finished before the process stopped
    ::waitpid(pid, &result.status, 0);
  }
  return result;
}

}  // namespace attnmix::testing
