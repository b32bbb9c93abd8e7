// SPDX-License-Identifier: Apache-2.0
// Fuzz target: NumPy .npz archives (io/npz.hpp: the zip layer through libzip, the .npy header and data decoding,
// row stripes) and the schema reader on top of them (io/rows.hpp) for three families' schemas. Input: one mode byte (data_rows.hpp: family, declared dimensions, target policy,
// stripe), then the archive's bytes. Family 3 decodes every member with read_npz alone and checks that each stripe
// holds what its shape says; the .npy decoder (parse_npy) is also fed the bytes directly when they start with the
// .npy magic, so that mutations of a bare member reach it without the zip layer.
#include <cstddef>
#include <cstdint>
#include <string>

#include "data_rows.hpp"
#include "fuzz_support.hpp"
#include "attnmix/io/npz.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnmix;
  static const fuzz::ScratchFile file("data.npz");
  const fuzz::ModeAndBytes input = fuzz::split_mode(data, size);
  const fuzz::DataMode mode(input.mode);
  const std::string& path = file.write(input.data, input.size);
  return fuzz::run_one([&] {
    if (mode.family != 3) {
      fuzz::read_and_encode(mode, path);
      return;
    }
    const std::string text(reinterpret_cast<const char*>(input.data), input.size);
    if (text.rfind("\x93NUMPY", 0) == 0) {
      const NpyArray array = parse_npy(text, "fuzz.npy");
      (void)array.shape_text();
      return;
    }
    for (const auto& [name, array] : read_npz(path, mode.stripe.part, mode.stripe.parts)) {
      (void)array.shape_text();
      if (array.shape.empty()) {
        if (array.size() != 1) __builtin_trap();  // a scalar holds one element
        continue;
      }
      // The rows held are a stripe of the shape's first axis, each of row_size = prod(shape[1:]) elements.
      int64_t row_size = 1;
      for (size_t i = 1; i < array.shape.size(); ++i)
        if (__builtin_mul_overflow(row_size, array.shape[i], &row_size)) __builtin_trap();  // an accepted absurd shape
      if (row_size != array.row_size || array.first_row < 0) __builtin_trap();
      if (row_size == 0) continue;
      const auto held = static_cast<int64_t>(array.size());
      if (held % row_size != 0 || array.first_row + held / row_size > array.shape[0]) __builtin_trap();
      if (held > 0) (void)array.at(array.first_row + held / row_size - 1, row_size - 1);
    }
  });
}
