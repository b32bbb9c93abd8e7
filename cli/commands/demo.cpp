// SPDX-License-Identifier: Apache-2.0
// `attnmix demo`: the project's main job, needing no arguments and no files. Runs every demo
// section in turn; a new mechanism adds its section function to kSections.
#include <array>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "attnmix/assign/experiment.hpp"
#include "attnmix/core/atomic_file.hpp"
#include "attnmix/io/model_file.hpp"
#include "cli_support.hpp"
#include "commands/commands.hpp"
#include "commands/demo_sections.hpp"
#include "model_data.hpp"

namespace attnmix::cli {

namespace {

struct DemoSection {
  const char* title;
  void (*run)(std::ostream& out, DemoFigures* figures);
};

constexpr std::array<DemoSection, 5> kSections{{
    {"Responsibility attention: content-addressed recall", &demo_responsibility_attention},
    {"Chained attention: transitive lookup needs two hops", &demo_chained_attention},
    {"Variational embedding attention: tied embeddings transfer to unseen synonyms",
     &demo_variational_embedding_attention},
    {"Assignment-tree attention: matchings as a sparse support",
     &demo_assignment_tree},
    {"Streaming language model: a sliding-window Transformer learns to predict text",
     &demo_streaming_language_model},
}};

constexpr Index kPlottedRows = 8;

int run_demo(const std::string& plots) {
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
  std::optional<DemoFigures> figures;
  if (!plots.empty()) figures.emplace();
  int number = 1;
  for (const DemoSection& section : kSections) {
    out << "\n" << number++ << ". " << section.title << "\n\n";
    section.run(out, figures ? &*figures : nullptr);
  }
  out.flush();
  return figures ? figures->draw(plots, out) : kExitOk;
}

}  // namespace

void DemoFigures::add(std::string name, AnyDistribution model, std::optional<AnyBatch> rows) {
  if (rows && rows->n_rows() > kPlottedRows) rows = rows->slice(0, kPlottedRows);
  entries_.push_back({std::move(name), std::move(model), std::move(rows), {}, {}});
}

void DemoFigures::add_assignment_tree(std::string name, const Matrix& freq, const assign::Mask& tree) {
  nlohmann::ordered_json results;
  assign::add_tree_fields(results, freq, tree);
  entries_.push_back({std::move(name), std::nullopt, std::nullopt, std::move(results), {}});
}

void DemoFigures::add_history(std::string name, std::string history) {
  entries_.push_back({std::move(name), std::nullopt, std::nullopt, {}, std::move(history)});
}

int DemoFigures::draw(const std::string& dir, std::ostream& out) const {
  out << "\nFigures (attnmix plot):\n" << std::flush;
  for (const Entry& e : entries_) {
    const std::filesystem::path folder = std::filesystem::path(dir) / e.name;
    std::filesystem::create_directories(folder);
    std::vector<std::string> arguments{"--out", folder.string(), "--html"};
    if (!e.history.empty()) {
      const std::string history = (folder / "history.jsonl").string();
      write_file_atomically(history, e.history, "the history");
      arguments.insert(arguments.end(), {"--history", history});
    } else if (!e.model) {
      const std::string results = (folder / "results.json").string();
      write_file_atomically(results, e.results.dump(2) + "\n", "the results");
      arguments.insert(arguments.end(), {"--assign-tree", results});
    } else {
      const std::string model = (folder / "model.json").string();
      save_model(*e.model, model);
      arguments.insert(arguments.begin(), model);
    }
    if (e.rows) {
      std::ostringstream rows;
      write_jsonl(rows, *e.model, *e.rows);
      const std::string path = (folder / "rows.jsonl").string();
      write_file_atomically(path, rows.str(), "the rows");
      arguments.insert(arguments.end(), {"--data", path, "--rows", std::to_string(e.rows->n_rows())});
    }
    out << "  " << e.name << ": " << std::flush;
    if (const int code = run_plot(arguments); code != kExitOk) return code;
  }
  out << "  open " << (std::filesystem::path(dir) / "*" / "index.html").string() << " to see them\n";
  return kExitOk;
}

void add_demo_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd =
      app.add_subcommand("demo",
                         "A short tour: fit each mechanism on a built-in task and see what it "
                         "learned (no arguments, no files)");
  auto plots = std::make_shared<std::string>();
  cmd->add_option("--plots", *plots,
                  "Also draw what each section fitted or trained (attnmix plot: PNG, SVG and an index.html) into "
                  "DIR/<section>")
      ->type_name("DIR");
  cmd->callback([plots, &exit_code] { exit_code = run_demo(*plots); });
}

}  // namespace attnmix::cli
