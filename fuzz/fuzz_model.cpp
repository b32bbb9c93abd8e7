// SPDX-License-Identifier: Apache-2.0
// Fuzz target: model files (io/model_file.hpp: load_model, model_from_json and every family's codec, which ends in
// the family's validating constructor). Input: the file's bytes. A model that loads is then used as the CLI uses
// one: saved again (model_to_json, format_model_json), its data sizes taken, two rows sampled (for a family without
// a sampler, two rows of zeros in its data schema), scored, predicted and written as JSON Lines through its family's
// descriptor (family/spec.hpp), so a constructor that lets through parameters its own sampler, density or prediction
// cannot handle shows up here.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/io/model_file.hpp"
#include "fuzz_support.hpp"
#include "attnmix/family/spec.hpp"

namespace {

/// Two rows of the model's data files with every id and every real 0 (each width the size the model fixes).
attnmix::AnyBatch zero_rows(const attnmix::DataOf& data) {
  using namespace attnmix;
  Rows rows;
  for (const DataField& field : data.schema->fields) {
    const Index width = field.width.empty() ? 1 : data.dims.at(std::string(field.width)).value;
    Column column;
    if (field.kind == DataKind::kIds)
      column.ids = IdMatrix::Zero(2, width);
    else
      column.reals = Matrix::Zero(2, width);
    rows.columns.push_back(std::move(column));
  }
  return data.encode(std::move(rows), data.dims);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnmix;
  static const fuzz::ScratchFile file("model.json");
  const std::string& path = file.write(data, size);
  return fuzz::run_one([&] {
    const AnyDistribution model = load_model(path);
    (void)format_model_json(model_to_json(model));
    const DataOf data = data_of(model);  // ValueError for a family without data files
    const FamilySpec& family = spec_of(model);
    AnyBatch batch;
    if (family.sample) {
      batch = family.sample(model, 2, /*seed=*/7, std::nullopt);
    } else {
      try {
        batch = model.sample(2, 7);
      } catch (const ValueError&) {  // a family without a sampler
        batch = zero_rows(data);
      }
    }
    std::vector<double> log_p(2);
    model.log_density(batch, log_p);
    if (model.predicts()) (void)model.predict_proba(batch);
    std::ostringstream out;
    write_json_lines(*data.schema, data.rows_of(batch),
                     [&](const std::string& line) { out << line << '\n'; });
  });
}
