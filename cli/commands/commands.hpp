// SPDX-License-Identifier: Apache-2.0
/// @file commands.hpp
/// One registration function per subcommand (one file each under cli/commands/). Each adds its
/// subcommand to the app; the subcommand's callback runs the command and stores its exit code in
/// `exit_code`. Errors are thrown (UsageError → 1, ValueError/TypeError/std::runtime_error → 2) and
/// mapped to exit codes by main.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "attnmix/inference/communicator.hpp"

namespace attnmix::cli {

/// comm: the processes of a distributed fit (mpirun with more than one process; not owned, it must
/// outlive the parse), or null for one process.
void add_fit_command(CLI::App& app, int& exit_code, const Communicator* comm = nullptr);
void add_score_command(CLI::App& app, int& exit_code);
void add_predict_command(CLI::App& app, int& exit_code);
void add_sample_command(CLI::App& app, int& exit_code);
void add_demo_command(CLI::App& app, int& exit_code);
void add_assign_tree_command(CLI::App& app, int& exit_code);
void add_plot_command(CLI::App& app, int& exit_code);
/// Runs `attnmix plot` with these arguments (in the build's Python) and waits for it: its exit code.
int run_plot(const std::vector<std::string>& arguments);
/// `attnmix lm train|eval|generate` (lm.cpp). In a build without libtorch the subcommand exists
/// and fails with exit code 2, saying so.
void add_lm_command(CLI::App& app, int& exit_code);

}  // namespace attnmix::cli
