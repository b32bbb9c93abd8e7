// SPDX-License-Identifier: Apache-2.0
// attnmix: the command-line tool (SPEC.md §1.10). Parses the command line with CLI11, runs one
// subcommand and maps errors to the documented exit codes: 0 success, 1 usage, 2
// data/I/O/validation, 3 not converged (--strict).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>
#include <stdexcept>

#include "attnmix/core/allocator.hpp"
#include "cli_support.hpp"
#include "commands/commands.hpp"

int main(int argc, char** argv) {
  using namespace attnmix::cli;
  // Every EM iteration frees a model and allocates the next: keep freed memory for reuse instead of faulting it
  // in again (core/allocator.hpp; docs/PERFORMANCE.md).
  attnmix::retain_freed_memory();
  CLI::App app{
      "attnmix: attention as a mixture. Fit probabilistic attention models by EM, score and "
      "predict with them, "
      "draw samples, or run the built-in demo.\nStart with:  attnmix demo",
      "attnmix"};
  app.require_subcommand(1);
  int exit_code = kExitOk;
  add_fit_command(app, exit_code);
  add_score_command(app, exit_code);
  add_predict_command(app, exit_code);
  add_sample_command(app, exit_code);
  add_demo_command(app, exit_code);
  add_assign_tree_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Error& e) {  // --help (exit 0) and every parse error (exit 1)
    return app.exit(e) == 0 ? kExitOk : kExitUsage;
  } catch (const UsageError& e) {
    std::cout.flush();
    std::cerr << "attnmix: usage error: " << e.what()
              << "\nRun with --help for more information.\n";
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    std::cout.flush();
    std::cerr << "attnmix: error: out of memory (are the dimensions what you meant?)\n";
    return kExitData;
  } catch (const std::exception&
               e) {  // ValueError, TypeError, ImpossibleEvidenceError, I/O runtime_error
    std::cout.flush();
    std::cerr << "attnmix: error: " << e.what() << "\n";
    return kExitData;
  }
  return exit_code;
}
