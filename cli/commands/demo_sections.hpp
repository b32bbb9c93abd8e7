// SPDX-License-Identifier: Apache-2.0
/// @file demo_sections.hpp
/// The sections of `attnmix demo`, one per mechanism, each in its own file. A section fits its
/// mechanism on a built-in task, printing the progress lines and a short report of what it learned
/// against a baseline.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnmix/assign/assignment_tree.hpp"
#include "attnmix/core/any.hpp"

namespace attnmix::cli {

/// What `attnmix demo --plots DIR` draws after the tour: the models the sections fitted, each with the rows whose
/// posteriors to show, and the assignment tree's frequencies. Sections get it only when --plots was given (null otherwise).
class DemoFigures {
 public:
  /// Keeps `model` as section `name`, with the first rows of `rows` (none: the model alone).
  void add(std::string name, AnyDistribution model, std::optional<AnyBatch> rows = std::nullopt);
  /// Keeps a matching-frequency matrix and its spanning tree as section `name` (drawn by `attnmix plot --assign-tree`).
  void add_assignment_tree(std::string name, const Matrix& freq, const assign::Mask& tree);
  /// Keeps a training history (JSON Lines of `lm train --history`) as section `name` (`attnmix plot --history`).
  void add_history(std::string name, std::string history);
  /// Writes each model and its rows to DIR/<name>/ and runs `attnmix plot` on them there (PNG, SVG and
  /// index.html); prints a line per section. Returns 0, or the first failing plot's exit code.
  [[nodiscard]] int draw(const std::string& dir, std::ostream& out) const;

 private:
  struct Entry {
    std::string name;
    std::optional<AnyDistribution> model;  ///< a model to draw, or
    std::optional<AnyBatch> rows;
    nlohmann::ordered_json results;  ///< an assignment-tree results document, or
    std::string history;             ///< a training history
  };
  std::vector<Entry> entries_;
};

/// Responsibility attention on the content-recall task of docs/mechanisms.md#responsibility-attention
/// (demo_responsibility.cpp).
void demo_responsibility_attention(std::ostream& out, DemoFigures* figures);

/// Chained attention, one hop against two, on the transitive-lookup task of docs/mechanisms.md#chained-attention
/// (demo_chained.cpp).
void demo_chained_attention(std::ostream& out, DemoFigures* figures);

/// Variational embedding attention against untied responsibility attention on held-out synonyms
/// (docs/mechanisms.md#variational-embedding-attention, VEA-2): tied embeddings transfer to query symbols never seen as
/// queries (demo_variational.cpp).
void demo_variational_embedding_attention(std::ostream& out, DemoFigures* figures);

/// Assignment-tree attention on the 16 × 15 problem of docs/mechanisms.md#assignment-tree-attention: frequencies, the
/// spanning tree, and dense against tree-sparse attention on a few retrieval trials (demo_assign_tree.cpp).
void demo_assignment_tree(std::ostream& out, DemoFigures* figures);

/// The streaming byte-level language model of docs/mechanisms.md#streaming-language-model (`attnmix lm`): a short
/// sliding-window training run on /usr/share/common-licenses/GPL-3 showing the loss falling, and the held-out bits
/// per byte against byte frequencies alone. Defined in lm.cpp, which runs demo_lm.cpp's section in
/// the language-model plugin (lm_plugin.hpp); says so and returns when built without libtorch, when
/// the plugin cannot be loaded or when the text is missing.
void demo_streaming_language_model(std::ostream& out, DemoFigures* figures);

}  // namespace attnmix::cli
