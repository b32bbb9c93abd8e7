// SPDX-License-Identifier: Apache-2.0
// attnmix: the command-line tool (docs/model-format.md). Parses the command line with CLI11, runs one
// subcommand and maps errors to the documented exit codes: 0 success, 1 usage, 2
// data/I/O/validation, 3 not converged (--strict).
//
// Under an MPI launcher (mpirun -np P attnmix fit ..., in a build with ATTNMIX_WITH_MPI) the
// program holds an MPI session for its lifetime and, when P > 1, `fit` runs distributed over
// MPI_COMM_WORLD (commands/fit.cpp, distributed.hpp); every other subcommand is then a usage error,
// since only `fit` has a distributed form. Without a launcher, or with P = 1, nothing changes and
// MPI is never initialised (P = 1 initialises it but does not use it). Errors that every process
// has alike (command-line errors, and every failure a distributed fit agrees on) are printed once,
// by rank 0; each process exits with the same code. A build without MPI started by a launcher with
// P > 1 refuses to run (usage error, printed by rank 0): its P processes could not cooperate.
//
// Output: standard output goes through a checked buffer (cli_support.hpp): the first failed write
// (a full disk, /dev/full) stops the command, and any output lost, on stdout or stderr, makes the
// exit code 2 ("cannot write to standard output: No space left on device"). SIGINT, SIGTERM and
// SIGHUP remove the temporary file of an atomic write in progress (core/atomic_file.hpp) and then
// end the process as the signal would have (exit status 128 + signal in a shell); a signal that
// was ignored when attnmix started (nohup) stays ignored.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "attnmix/core/allocator.hpp"
#include "attnmix/inference/communicator.hpp"
#include "cli_support.hpp"
#include "commands/commands.hpp"
#include "distributed.hpp"
#ifdef ATTNMIX_HAVE_MPI
#include "attnmix/mpi/mpi.hpp"
#endif

namespace {

using namespace attnmix::cli;

/// Removes the temporary file of an interrupted atomic write, then lets the signal end the process
/// with its default action (re-raised: it is delivered when the handler returns). Async-signal-safe.
extern "C" void on_terminating_signal(int signal_number) {
  remove_pending_temporary_files();
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

/// Installs on_terminating_signal for SIGINT, SIGTERM and SIGHUP, except where the signal is
/// ignored (nohup, a shell's background job): that stays as it was.
void install_signal_cleanup() {
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(signal_number, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = on_terminating_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(signal_number, &action, nullptr);
  }
}

/// Flushes standard output before an error message; a write error there is printed too, unless it
/// is the error being reported.
void flush_before_error(const std::string& reported) {
  const std::string lost = finish_stdout();
  if (!lost.empty() && lost != reported) std::cerr << "attnmix: error: " << lost << "\n";
}

#ifndef ATTNMIX_HAVE_MPI
/// Why a build without MPI does not run under a launcher of `processes` processes, and what to do instead.
std::string without_mpi_message(int processes) {
  return "attnmix: usage error: started by an MPI launcher as " + std::to_string(processes) +
         " processes, but this attnmix was built without MPI (ATTNMIX_WITH_MPI=OFF), so each process would run "
         "the whole command alone and write the same files.\nRebuild with MPI (Debian packages libopenmpi-dev and "
         "openmpi-bin, cmake -DATTNMIX_WITH_MPI=ON) to fit across processes, or run attnmix without mpirun.\n";
}
#endif

/// Parses and runs one subcommand. comm: the processes of a distributed run (null: one process).
int run(int argc, char** argv, const attnmix::Communicator* comm) {
  CLI::App app{
      "attnmix: attention as a mixture. Fit probabilistic attention models by EM, score and "
      "predict with them, "
      "draw samples, train streaming byte-level language models (attnmix lm), or run the built-in "
      "demo.\nStart with:  attnmix demo",
      "attnmix"};
  app.require_subcommand(1);
  int exit_code = kExitOk;
  add_fit_command(app, exit_code, comm);
  add_score_command(app, exit_code);
  add_predict_command(app, exit_code);
  add_sample_command(app, exit_code);
  add_demo_command(app, exit_code);
  add_assign_tree_command(app, exit_code);
  add_plot_command(app, exit_code);
  add_lm_command(app, exit_code);
  if (comm) {  // runs after parsing, before the subcommand's callback
    app.parse_complete_callback([&app, comm] {
      for (const CLI::App* command : app.get_subcommands())
        if (command->get_name() != "fit")
          throw UsageError("under mpirun (" + std::to_string(comm->size()) +
                           " processes) only `attnmix fit` runs distributed; run `attnmix " +
                           command->get_name() + "` as one process, without mpirun");
    });
  }
  // Errors every process has alike are printed by rank 0 alone; an error of one process's own is
  // printed by that process, naming its rank.
  const bool root = !comm || comm->rank() == 0;
  const std::string rank_note =
      comm ? " (rank " + std::to_string(comm->rank()) + " of " + std::to_string(comm->size()) + ")"
           : "";
  try {
    app.parse(argc, argv);
  } catch (const CLI::Error& e) {  // --help (exit 0) and every parse error (exit 1)
    std::ostringstream discard;
    const int code = root ? app.exit(e) : app.exit(e, discard, discard);
    return code == 0 ? kExitOk : kExitUsage;
  } catch (const AgreedError& e) {  // a distributed fit's failure, agreed on by every process
    if (root) {
      flush_before_error(e.what());
      if (e.exit_code() == kExitUsage)
        std::cerr << "attnmix: usage error: " << e.what()
                  << "\nRun with --help for more information.\n";
      else
        std::cerr << "attnmix: error (rank " << e.rank() << " of " << e.n_ranks()
                  << "): " << e.what() << "\n";
    }
    return e.exit_code();
  } catch (const UsageError& e) {  // the same on every process: the command line is
    if (root) {
      flush_before_error(e.what());
      std::cerr << "attnmix: usage error: " << e.what()
                << "\nRun with --help for more information.\n";
    }
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    flush_before_error("");
    std::cerr << "attnmix: error" << rank_note
              << ": out of memory (are the dimensions what you meant?)\n";
    return kExitData;
  } catch (const std::exception&
               e) {  // ValueError, TypeError, ImpossibleEvidenceError, I/O runtime_error, stdout
    flush_before_error(e.what());
    std::cerr << "attnmix: error" << rank_note << ": " << e.what() << "\n";
    return kExitData;
  }
  return exit_code;
}

/// The exit code once the output is complete: 2 when a write to stdout failed (said on stderr) or
/// one to stderr did (nowhere left to say it), unless the command failed already.
int finish_output(int exit_code) {
  const std::string lost = finish_stdout();
  if (!lost.empty()) {
    if (exit_code == kExitOk || exit_code == kExitNotConverged)
      std::cerr << "attnmix: error: " << lost << "\n";
    if (exit_code != kExitUsage) exit_code = kExitData;
  }
  std::cerr.flush();
  if (!std::cerr.good() && exit_code == kExitOk) exit_code = kExitData;
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  // Every EM iteration frees a model and allocates the next: keep freed memory for reuse instead of
  // faulting it in again (core/allocator.hpp; docs/PERFORMANCE.md).
  attnmix::retain_freed_memory();
  const attnmix::LauncherWorld launcher = attnmix::launcher_world();
#ifdef ATTNMIX_HAVE_MPI
  // Declared before the run so that MPI_Finalize comes after everything that uses MPI.
  std::optional<attnmix::MpiSession> session;
  std::optional<attnmix::MpiCommunicator> world;
  if (launcher.launched) {
    try {
      session.emplace(argc, argv);
      world.emplace(MPI_COMM_WORLD);
    } catch (const std::exception& e) {
      std::cerr << "attnmix: error: " << e.what() << "\n";
      return attnmix::cli::kExitData;
    }
  }
  const attnmix::Communicator* comm = world && world->size() > 1 ? &*world : nullptr;
#else
  // Without MPI every process would run the whole command alone and write the same files.
  if (launcher.size > 1) {
    if (launcher.rank == 0) std::cerr << without_mpi_message(launcher.size);
    return kExitUsage;
  }
  const attnmix::Communicator* comm = nullptr;
#endif
  // Before any output. Under mpirun rank 0 keeps going after a failed write (the other ranks wait
  // for it in collectives) and reports the failure at the end.
  install_checked_stdout(/*stop_at_first_error=*/comm == nullptr);
  install_signal_cleanup();  // after MPI's initialisation, which may install handlers of its own
  int exit_code = kExitData;
  try {
    exit_code = run(argc, argv, comm);
  } catch (const std::exception& e) {  // thrown while reporting another error (stdout failed then)
    std::cerr << "attnmix: error: " << e.what() << "\n";
  }
  return finish_output(exit_code);
}
