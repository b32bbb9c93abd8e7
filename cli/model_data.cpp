// SPDX-License-Identifier: Apache-2.0
// Saved models and data files, through the family descriptors (reading a model file, reading rows for a model, drawing
// and writing sampled rows).
#include "model_data.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <utility>

#include "attnmix/family/spec.hpp"
#include "attnmix/io/input_file.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/stats/composite.hpp"
#include "cli_support.hpp"

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
