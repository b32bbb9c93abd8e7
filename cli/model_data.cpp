// SPDX-License-Identifier: Apache-2.0
// Saved models and data files, through the family descriptors (reading a model file, reading rows for a model, drawing
// and writing sampled rows).
#include "model_data.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <optional>
#include <utility>

#include "attnmix/family/spec.hpp"
#include "attnmix/io/input_file.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/stats/composite.hpp"
#include "cli_support.hpp"
#include "text_corpus.hpp"

namespace attnmix::cli {

void add_model_flag(CLI::App* cmd, std::string& path) {
  cmd->add_option("--model", path, "Model file written by 'attnmix fit'")->required()->type_name("FILE");
}

AnyDistribution read_saved_model(const std::string& path) {
  check_input_file(path, "the model file");
  return load_model(path);
}

ModelData read_model_data(const AnyDistribution& model, const std::string& data_path, TargetPolicy policy) {
  const DataOf data = data_of(model);
  const RowSchema& schema = *data.schema;
  Rows rows = read_rows(data_path, schema, data.dims, policy);
  const Dims dims = infer_dims(schema, data.dims, {&rows});  // the sizes the model leaves open
  ModelData out;
  out.has_targets = rows.has_targets;
  for (size_t k = 0; k < schema.fields.size(); ++k)
    if (schema.fields[k].target) out.targets = id_vector(rows.columns[k]);
  out.origin = std::move(static_cast<RowOrigin&>(rows));
  out.batch = data.encode(std::move(rows), dims);
  return out;
}

void add_input_flags(CLI::App* cmd, ModelInput& input, const std::string& data_help) {
  cmd->add_option("--data", input.data, data_help)->type_name("FILE");
  cmd->add_option("--text", input.text,
                  "Text corpus instead of --data (models fitted to --text): its next-token rows")
      ->type_name("FILE");
  cmd->add_option("--vocabulary", input.vocabulary,
                  "The vocabulary --text is read through (default: the one the fit wrote next to the model)")
      ->type_name("FILE");
  cmd->add_option("--embeddings", input.embeddings,
                  "The query embeddings the model was fitted with (fit --embeddings)")
      ->type_name("FILE");
}

namespace {

ModelData read_model_text(const AnyDistribution& model, const std::string& model_path, const ModelInput& input) {
  const FamilySpec& family = spec_of(model);
  if (!family.fit.text.rows)
    throw ValueError(model_path + ": a " + model.family() + " model does not read text corpora (--text); give --data");
  const std::string vocabulary_path = input.vocabulary.empty() ? vocabulary_path_of(model_path) : input.vocabulary;
  check_input_file(vocabulary_path, "the vocabulary");
  Vocabulary vocab = read_vocabulary(vocabulary_path, std::nullopt);
  const Dims dims = data_of(model).dims;
  const int64_t S = dims.at("S").value, N = dims.at("N").value, D = dims.at("D").value;
  if (vocab.size() > S)
    throw ValueError(vocabulary_path + ": lists " + std::to_string(vocab.size()) + " tokens but " + model_path +
                     " has S = " + std::to_string(S) + " symbols");
  std::optional<Matrix> embeddings;
  if (!input.embeddings.empty()) {
    embeddings = read_embeddings(input.embeddings, vocab, vocabulary_path);
    if (embeddings->cols() != D)
      throw ValueError(input.embeddings + ": has rows of " + std::to_string(embeddings->cols()) + " entries but " +
                       model_path + " has queries of D = " + std::to_string(D));
  } else if (vocab.queries == "embeddings" || vocab.size() > D) {
    throw ValueError(model_path + ": the model was fitted with query embeddings (D = " + std::to_string(D) +
                     "); give them again with --embeddings FILE");
  }
  const TokenizedText tokens = tokenize_text(input.text, vocab, /*grow=*/false, "the vocabulary " + vocabulary_path);
  check_text_length(tokens, input.text, N, vocab.mode);
  if (tokens.unknown > 0)
    std::cerr << "note: " << tokens.unknown << " tokens of " << input.text << " are not in " << vocabulary_path
              << " and were read as " << kUnknownToken << "\n";
  ModelData out;
  out.origin.source = input.text;
  out.targets.resize(static_cast<Index>(tokens.ids.size()) - N);
  for (Index r = 0; r < out.targets.size(); ++r) {  // row r predicts token r + N
    out.targets[r] = tokens.ids[static_cast<size_t>(r + N)];
    out.origin.line_of_row.push_back(tokens.line_of_token[static_cast<size_t>(r + N)]);
  }
  out.batch = family.fit.text.rows(tokens.ids, dims, embeddings ? &*embeddings : nullptr);
  return out;
}

}  // namespace

ModelData read_model_input(const AnyDistribution& model, const std::string& model_path, const ModelInput& input,
                           TargetPolicy policy) {
  if (input.data.empty() == input.text.empty()) throw UsageError("give exactly one of --data FILE or --text FILE");
  if (input.text.empty() && !(input.vocabulary.empty() && input.embeddings.empty()))
    throw UsageError(std::string(input.vocabulary.empty() ? "--embeddings" : "--vocabulary") +
                     " applies only to --text corpora");
  return input.text.empty() ? read_model_data(model, input.data, policy) : read_model_text(model, model_path, input);
}

AnyBatch draw_samples(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> context_length) {
  const FamilySpec& family = spec_of(model);
  if (!family.sample) return model.sample(m, seed);  // the library's error for a family without a sampler
  const DataOf data = data_of(model);
  const auto& fields = data.schema->fields;
  const bool has_context = std::any_of(fields.begin(), fields.end(), [](const DataField& f) { return f.width == "N"; });
  if (context_length && !has_context)
    throw UsageError("--context-length does not apply to this model: " +
                     (model.get_if<Composite>() != nullptr
                          ? std::string("a composite draws each field with its component's default context length")
                          : "a " + std::string(family.title) + "'s rows have no context length") +
                     " (omit --context-length)");
  const Dims& fixed = data.dims;
  if (const auto n = fixed.find("N"); n != fixed.end() && context_length && *context_length != n->second.value) {
    const std::string N = std::to_string(n->second.value);
    throw UsageError("--context-length " + std::to_string(*context_length) + " does not match the model: " +
                     std::string(family.title) + " has a fixed context length, N = " + N +
                     " for this model (omit --context-length or pass " + N + ")");
  }
  return family.sample(model, m, seed, context_length);
}

void write_jsonl(std::ostream& out, const AnyDistribution& model, const AnyBatch& batch) {
  const DataOf data = data_of(model);
  write_json_lines(*data.schema, data.rows_of(batch), [&](const std::string& line) { out << line << '\n'; });
}

}  // namespace attnmix::cli
