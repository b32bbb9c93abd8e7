// SPDX-License-Identifier: Apache-2.0
/// @file model_data.hpp
/// The commands that use a saved model (score, predict, sample, fit --init): its --model flag and file, and the bridge
/// between the loaded model and data files, through its family's descriptor (family/spec.hpp): the rows a model reads
/// (checked against the model's own sizes), its samples and how they are written. A mixture reads and writes its
/// components' rows.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "attnmix/core/any.hpp"
#include "attnmix/io/rows.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace attnmix::cli {

/// The required `--model FILE` of the commands that read a saved model (score, predict, sample).
void add_model_flag(CLI::App* cmd, std::string& path);

/// The model saved at `path` (fit --init, score, predict, sample), checked as an input file first.
/// @throws IoError for a missing or unreadable file; ValueError for an invalid model file.
[[nodiscard]] AnyDistribution read_saved_model(const std::string& path);

/// Rows read for a model: where they came from, their targets, and the encoded batch.
struct ModelData {
  RowOrigin origin;
  bool has_targets = true;
  IdVector targets;  // [n]; zeros when !has_targets
  AnyBatch batch;
};

/// Reads `data_path` with the model's sizes (ids out of the model's range are errors naming file, line and field).
/// @throws ValueError for a model that reads no data files.
[[nodiscard]] ModelData read_model_data(const AnyDistribution& model, const std::string& data_path,
                                        TargetPolicy policy);

/// Where score and predict read rows: a data file (--data) or a text corpus (--text) with the vocabulary and
/// embeddings it is read through.
struct ModelInput {
  std::string data;        ///< --data FILE
  std::string text;        ///< --text FILE
  std::string vocabulary;  ///< --vocabulary FILE ("": the one the fit wrote next to the model)
  std::string embeddings;  ///< --embeddings FILE (models fitted with --embeddings)
};

/// --data, --text, --vocabulary and --embeddings of score and predict (`data_help` describes --data).
void add_input_flags(CLI::App* cmd, ModelInput& input, const std::string& data_help);

/// The rows of `input` for the model saved at `model_path`: read_model_data, or a text corpus tokenised by the
/// vocabulary (tokens outside it: its <unk> entry, else an error naming the file, line and token; a note on stderr
/// counts the <unk> tokens) into the next-token rows of a text fit (text_corpus.hpp).
/// @throws UsageError unless exactly one of --data and --text is given, or for --vocabulary/--embeddings without
///         --text; ValueError for a family that reads no text, a vocabulary or embeddings that do not fit the model.
[[nodiscard]] ModelData read_model_input(const AnyDistribution& model, const std::string& model_path,
                                         const ModelInput& input, TargetPolicy policy);

/// m observations from the model's sampler. `context_length`: the rows' N where the family leaves it open (chained
/// and variational multi-hop attention; default: their samplers', 6); a family whose models fix N takes only that
/// N. @throws UsageError on a context length the model cannot use; ValueError for a family without a sampler.
[[nodiscard]] AnyBatch draw_samples(const AnyDistribution& model, Index m, uint64_t seed,
                                    std::optional<int64_t> context_length);

/// Writes every row of a batch drawn from `model` as one JSON Lines observation, in the data-file format of the
/// model's family.
void write_jsonl(std::ostream& out, const AnyDistribution& model, const AnyBatch& batch);

}  // namespace attnmix::cli
