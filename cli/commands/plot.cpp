// SPDX-License-Identifier: Apache-2.0
// `attnmix plot`: the figures of the Python module's attnmix.plot (matplotlib) for a saved model, a training history
// or the assignment-tree results. The command and its options live in python/attnmix/_plot_command.py, run in the
// Python the build used (its arguments, --help included, pass through unchanged); this file only finds that Python
// and runs it.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli_support.hpp"
#include "commands/commands.hpp"

namespace attnmix::cli {

int run_plot(const std::vector<std::string>& arguments) {
#ifdef ATTNMIX_PLOT_PYTHON
  // The build's package first, so that the attnmix beside this program is the one imported.
  const char* previous = std::getenv("PYTHONPATH");
  const std::string path =
      std::string(ATTNMIX_PLOT_PYTHONPATH) + (previous && *previous ? ":" + std::string(previous) : "");
  std::vector<std::string> environment{"PYTHONPATH=" + path};
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "PYTHONPATH=", 11) != 0) environment.emplace_back(*e);
  std::vector<std::string> argv{ATTNMIX_PLOT_PYTHON, "-m", "attnmix._plot_command"};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  const auto pointers = [](std::vector<std::string>& strings) {
    std::vector<char*> p;
    for (std::string& s : strings) p.push_back(s.data());
    p.push_back(nullptr);
    return p;
  };
  std::vector<char*> args = pointers(argv), env = pointers(environment);
  std::cout.flush();
  pid_t child = 0;
  if (const int error = ::posix_spawn(&child, args[0], nullptr, nullptr, args.data(), env.data()); error != 0) {
    std::cerr << "attnmix: error: cannot run " << ATTNMIX_PLOT_PYTHON << " for 'attnmix plot': "
              << std::strerror(error) << "\n";
    return kExitData;
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : kExitData;
#else
  (void)arguments;
  std::cerr << "attnmix: error: 'attnmix plot' draws with the Python module, which this build leaves out "
               "(configure with -DATTNMIX_WITH_PYTHON=ON)\n";
  return kExitData;
#endif
}

void add_plot_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("plot",
                                     "Draw a saved model, a training history or the assignment-tree results as PNG "
                                     "and SVG files (matplotlib)");
  cmd->prefix_command();  // every argument goes to the Python command, which parses them
  cmd->set_help_flag();
  cmd->callback([cmd, &exit_code] { exit_code = run_plot(cmd->remaining()); });
}

}  // namespace attnmix::cli
