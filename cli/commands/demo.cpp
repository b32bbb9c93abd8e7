// SPDX-License-Identifier: Apache-2.0
// `attnmix demo`: the project's main job, needing no arguments and no files. Runs every demo
// section in turn; a new mechanism adds its section function to kSections.
#include <array>
#include <iostream>

#include "cli_support.hpp"
#include "commands/commands.hpp"
#include "commands/demo_sections.hpp"

namespace attnmix::cli {

namespace {

struct DemoSection {
  const char* title;
  void (*run)(std::ostream& out);
};

constexpr std::array<DemoSection, 5> kSections{{
    {"Responsibility attention: content-addressed recall", &demo_responsibility_attention},
    {"Chained attention: transitive lookup needs two hops", &demo_chained_attention},
    {"Variational embedding attention: tied embeddings transfer to unseen synonyms",
     &demo_variational_embedding_attention},
    {"Assignment-tree attention: matchings as a sparse support", &demo_assignment_tree},
    {"Streaming language model: a sliding-window Transformer learns to predict text",
     &demo_streaming_language_model},
}};

int run_demo() {
  std::ostream& out = std::cout;
  out << "attnmix demo: attention as a mixture\n"
         "In every attnmix mechanism, which context position is attended is a hidden variable, so "
         "each mechanism\n"
         "is a mixture over positions and can be fitted by EM. Each section below fits one "
         "mechanism on a\n"
         "built-in task and shows what it learned against a baseline; the fourth builds a "
         "sparse attention\n"
         "support from perturb-and-MAP matchings and compares it with dense attention, and the "
         "last trains a small\n"
         "streaming Transformer language model on a text file with a bounded attention window.\n";
  int number = 1;
  for (const DemoSection& section : kSections) {
    out << "\n" << number++ << ". " << section.title << "\n\n";
    section.run(out);
  }
  out.flush();
  return kExitOk;
}

}  // namespace

void add_demo_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd =
      app.add_subcommand("demo",
                         "A short tour: fit each mechanism on a built-in task and see what it "
                         "learned (no arguments, no files)");
  cmd->callback([&exit_code] { exit_code = run_demo(); });
}

}  // namespace attnmix::cli
