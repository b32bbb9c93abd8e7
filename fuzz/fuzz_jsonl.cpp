// SPDX-License-Identifier: Apache-2.0
// Fuzz target: JSON Lines data files (io/jsonl.hpp and the schema reader on top of it, io/rows.hpp and
// io/fields.hpp, for three families' schemas). Input: one mode byte (data_rows.hpp:
// family, declared dimensions, target policy, stripe), then the file's bytes. Family 3 runs the line reader alone,
// with the row count callback a distributed fit uses, and the peek at the first row (first_json_object).
#include <cstddef>
#include <cstdint>

#include "data_rows.hpp"
#include "fuzz_support.hpp"
#include "attnmix/io/jsonl.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnmix;
  static const fuzz::ScratchFile file("data.jsonl");
  const fuzz::ModeAndBytes input = fuzz::split_mode(data, size);
  const fuzz::DataMode mode(input.mode);
  const std::string& path = file.write(input.data, input.size);
  return fuzz::run_one([&] {
    if (mode.family != 3) {
      fuzz::read_and_encode(mode, path);
      return;
    }
    (void)first_json_object(path, mode.stripe);  // never throws
    int64_t counted = -1;
    int64_t visited = 0;
    for_each_json_line(
        path, mode.stripe, [&](int64_t, const nlohmann::json& object) {
          ++visited;
          (void)json_kind(object);
        },
        [&](int64_t rows) { counted = rows; });
    if (counted >= 0 && visited > counted) __builtin_trap();  // more lines visited than the stripe was said to hold
  });
}
