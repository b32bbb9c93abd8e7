// SPDX-License-Identifier: Apache-2.0
// Fuzz target: model files (io/model_file.hpp: load_model, model_from_json and every family's codec, which ends in
// the family's validating constructor). Input: the file's bytes. A model that loads is then used as the CLI uses
// one: saved again (model_to_json, format_model_json), its data sizes taken, two rows sampled, scored and written
// as JSON Lines through its family's descriptor (family/spec.hpp), so a constructor that lets through parameters its
// own sampler or density cannot handle shows up here.
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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnmix;
  static const fuzz::ScratchFile file("model.json");
  const std::string& path = file.write(data, size);
  return fuzz::run_one([&] {
    const AnyDistribution model = load_model(path);
    (void)format_model_json(model_to_json(model));
    const DataOf data = data_of(model);  // ValueError for a family without data files
    const FamilySpec& family = spec_of(model);
    const AnyBatch batch = family.sample ? family.sample(model, 2, /*seed=*/7, std::nullopt) : model.sample(2, 7);
    std::vector<double> log_p(2);
    model.log_density(batch, log_p);
    std::ostringstream out;
    write_json_lines(*data.schema, data.rows_of(batch),
                     [&](const std::string& line) { out << line << '\n'; });
  });
}
