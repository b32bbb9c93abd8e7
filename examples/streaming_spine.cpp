// SPDX-License-Identifier: Apache-2.0
// Streaming a token sequence through the sliding-window spine (include/attnmix/stream/context_spine.hpp):
// streaming in chunks equals one pass when the window covers the stream, and a few TBPTT updates on a lag-3 copy
// task lower the loss.
#include "attnmix/stream/context_spine.hpp"

#include <cstdio>

int main() {
  using namespace attnmix::stream;
  torch::manual_seed(0);
  SpineOptions options;
  options.vocab = 16;
  options.window = std::nullopt;  // full attention: chunking must not change anything
  SlidingWindowSpine spine(options);
  const auto tokens = torch::randint(0, 16, {2, 25}, torch::kLong);

  auto whole = spine->advance(spine->init_state(2), tokens.narrow(1, 0, 24));
  auto state = spine->init_state(2);
  std::vector<torch::Tensor> parts;
  for (int64_t start : {0, 7, 15}) {
    auto out = spine->advance(state, tokens.narrow(1, start, start == 15 ? 9 : (start == 0 ? 7 : 8)));
    state = out.state;
    parts.push_back(out.logits);
  }
  const double gap = (torch::cat(parts, 1) - whole.logits).abs().max().item<double>();
  std::printf("streamed in 3 chunks vs one pass: max |logit difference| = %.2e\n", gap);

  // Lag-3 copy task (y_t = x_{t-3}) with a window of 8, TBPTT over chunks of 6.
  options.window = 8;
  SlidingWindowSpine windowed(options);
  torch::optim::AdamW optimizer(windowed->parameters(), torch::optim::AdamWOptions(1e-2));
  const auto stream = torch::randint(0, 16, {4, 6 * 40 + 3}, torch::kLong);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> chunks;
  for (int64_t c = 0; c < 40; ++c) {
    chunks.emplace_back(stream.narrow(1, 3 + 6 * c, 6), stream.narrow(1, 6 * c, 6));
  }
  const auto result = train_tbptt(*windowed, windowed->init_state(4), chunks, optimizer);
  std::printf("lag-3 copy: loss %.3f (first chunk) -> %.3f (last chunk); cache holds %lld bytes\n",
              result.losses.front(), result.losses.back(), static_cast<long long>(result.state.bytes()));
  return gap < 1e-4 && result.losses.back() < result.losses.front() ? 0 : 1;
}
