// SPDX-License-Identifier: Apache-2.0
// Writes the seed checkpoints of fuzz_checkpoint (fuzz/make_corpus.py runs it): one tiny model per attention
// mechanism, trained for two steps on 48 tokens of an 8-token vocabulary, so that each seed holds model, optimizer and carried state
// records in a few kilobytes. Usage: make_checkpoint_seed <out-dir>.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "attnmix/stream/language_model.hpp"

int main(int argc, char** argv) {
  using namespace attnmix;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <out-dir>\n", argv[0]);
    return 1;
  }
  const std::string dir = argv[1];
  try {
    std::vector<int64_t> tokens(48);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 5 + i / 3) % 8);
    for (const char* mechanism : {"window", "full", "moment-closure"}) {
      stream::TrainOptions o;
      o.model.mechanism = stream::parse_mechanism(mechanism);
      o.model.vocab = 8;
      o.model.d_model = 4;
      o.model.n_layer = 1;
      o.model.n_head = 1;
      o.model.window = 4;
      o.model.max_clusters = 2;
      o.batch = 2;
      o.chunk = 4;
      o.steps = 2;
      o.threads = 1;
      (void)stream::train(o, tokens, "", dir + "/" + mechanism + ".ckpt");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_checkpoint_seed: %s\n", e.what());
    return 2;
  }
  return 0;
}
