// SPDX-License-Identifier: Apache-2.0
// Fuzz target: language-model checkpoints (src/stream/language_model.cpp: open_checkpoint, the meta record's JSON,
// the options it describes, and the restore of model, optimizer and carried state that `attnmix lm eval`,
// `lm generate` and `lm train --resume` go through). Input: the checkpoint file's bytes. A checkpoint whose info
// reads is evaluated on a few tokens and asked for a few generated ones, on one thread.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attnmix/stream/language_model.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnmix;
  static const fuzz::ScratchFile file("model.ckpt");
  const std::string& path = file.write(data, size);
  return fuzz::run_one([&] {
    const stream::CheckpointInfo info = stream::read_checkpoint_info(path);
    const int64_t vocab = info.model.vocab;
    if (vocab <= 0) __builtin_trap();  // read_checkpoint_info validates the options
    std::vector<int64_t> tokens(8);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i) % vocab;
    (void)stream::evaluate(path, tokens, /*chunk=*/4, /*threads=*/1);
    stream::GenerateOptions options;
    options.tokens = 3;
    options.temperature = 1.0;
    options.seed = 1;
    options.threads = 1;
    (void)stream::generate(path, std::vector<int64_t>{0}, options);
  });
}
