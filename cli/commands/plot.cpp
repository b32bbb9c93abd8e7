// SPDX-License-Identifier: Apache-2.0
// `attnmix plot`: the figures of the Python module's attnmix.plot (matplotlib) for a saved model, a fit history or the
// assignment-tree results. The command and its options live in python/attnmix/_plot_command.py, run in the Python the
// build used (its arguments, --help included, pass through unchanged); this file only finds that Python.
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

namespace {

int run_plot(const std::vector<std::string>& arguments) {
#ifdef ATTNMIX_PLOT_PYTHON
  // The build's package first, so that the attnmix beside this program is the one imported.
  const char* previous = std::getenv("PYTHONPATH");
  const std::string path =
      std::string(ATTNMIX_PLOT_PYTHONPATH) + (previous && *previous ? ":" + std::string(previous) : "");
  ::setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<std::string> argv{ATTNMIX_PLOT_PYTHON, "-m", "attnmix._plot_command"};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  std::vector<char*> pointers;
  for (std::string& a : argv) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  std::cout.flush();
  ::execv(pointers[0], pointers.data());
  std::cerr << "attnmix: error: cannot run " << ATTNMIX_PLOT_PYTHON << " for 'attnmix plot': " << std::strerror(errno)
            << "\n";
#else
  (void)arguments;
  std::cerr << "attnmix: error: 'attnmix plot' draws with the Python module, which this build leaves out "
               "(configure with -DATTNMIX_WITH_PYTHON=ON)\n";
#endif
  return kExitData;
}

}  // namespace

void add_plot_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "plot", "Draw a saved model, a fit history or the assignment-tree results as PNG and SVG files (matplotlib)");
  cmd->prefix_command();  // every argument goes to the Python command, which parses them
  cmd->set_help_flag();
  cmd->callback([cmd, &exit_code] { exit_code = run_plot(cmd->remaining()); });
}

}  // namespace attnmix::cli
