// SPDX-License-Identifier: Apache-2.0
// Associative recall beyond the window (issue 9); see include/attnmix/stream/far_field.hpp.
#include "attnmix/stream/far_field.hpp"

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/frequent_directions.hpp"
#include "attnmix/stream/fused_adamw.hpp"
#include "attnmix/stream/linear_attention.hpp"
#include "attnmix/stream/tensor_sketch.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "model_options.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <utility>

namespace attnmix::stream {
namespace {

using Clock = std::chrono::steady_clock;

struct RecallBatch {
  torch::Tensor x;        // (B, L−1) inputs
  torch::Tensor y;        // (B, L−1) next tokens
  torch::Tensor answers;  // (B, L−1) bool: the positions whose target is a recalled value
};

RecallBatch make_batch(Rng& rng, const SequenceTask& task, int64_t batch) {
  const auto drawn = task.draw(rng, batch);
  const auto all = torch::tensor(drawn.tokens, torch::kLong).view({batch, drawn.length});
  RecallBatch out;
  out.x = all.narrow(1, 0, drawn.length - 1).contiguous();
  out.y = all.narrow(1, 1, drawn.length - 1).contiguous();
  out.answers = torch::tensor(std::vector<int64_t>(drawn.answers.begin(), drawn.answers.end()), torch::kLong)
                    .view({batch, drawn.length - 1})
                    .to(torch::kBool);
  return out;
}

// Streams the batch through the mechanism in chunks; returns the logits of every position (B, L−1, vocab) and the
// state bytes at the end.
template <class M>
std::pair<torch::Tensor, int64_t> stream(M& mechanism, const torch::Tensor& x, int64_t chunk) {
  auto state = mechanism.init_state(x.size(0));
  std::vector<torch::Tensor> logits;
  for (int64_t start = 0; start < x.size(1); start += chunk) {
    auto out = mechanism.advance(state, x.narrow(1, start, std::min(chunk, x.size(1) - start)));
    state = std::move(out.state);
    logits.push_back(out.logits);
  }
  return {torch::cat(logits, 1), state.bytes()};
}

template <class M>
RecallResult train_and_evaluate(M& mechanism, const SequenceTask& task, const RecallRunOptions& o,
                                const std::function<void(int64_t, double)>& on_step) {
  RecallResult result;
  FusedAdamW optimizer(mechanism.parameters(), torch::optim::AdamWOptions(o.lr).weight_decay(0.01));
  Rng train_rng = recall_data_rng(o.seed, 0);
  std::vector<double> losses;
  const auto start = Clock::now();
  for (int64_t step = 0; step < o.steps; ++step) {
    const auto batch = make_batch(train_rng, task, o.batch);
    const auto logits = stream(mechanism, batch.x, o.chunk).first;
    const auto loss = torch::nn::functional::cross_entropy(logits.index({batch.answers}), batch.y.index({batch.answers}));
    optimizer.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(mechanism.parameters(), 1.0);
    optimizer.step();
    losses.push_back(loss.template item<double>());
    if (on_step) on_step(step + 1, losses.back());
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const auto mean = [](auto first, auto last) {
    return std::accumulate(first, last, 0.0) / static_cast<double>(std::distance(first, last));
  };
  const auto k = std::min<size_t>(10, losses.size());
  result.first_loss = losses.empty() ? 0.0 : mean(losses.begin(), losses.begin() + static_cast<std::ptrdiff_t>(k));
  result.last_loss = losses.empty() ? 0.0 : mean(losses.end() - static_cast<std::ptrdiff_t>(k), losses.end());

  torch::NoGradGuard no_grad;
  Rng eval_rng = recall_data_rng(o.seed, 1);
  int64_t correct = 0, total = 0;
  double ce = 0.0;
  for (int64_t done = 0; done < o.eval_sequences; done += o.batch) {
    const auto batch = make_batch(eval_rng, task, std::min(o.batch, o.eval_sequences - done));
    const auto logits = stream(mechanism, batch.x, o.chunk).first.index({batch.answers});
    const auto targets = batch.y.index({batch.answers});
    correct += logits.argmax(-1).eq(targets).sum().template item<int64_t>();
    total += targets.size(0);
    ce += torch::nn::functional::cross_entropy(logits, targets,
                                               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
              .template item<double>();
  }
  result.accuracy = static_cast<double>(correct) / static_cast<double>(total);
  result.cross_entropy = ce / static_cast<double>(total);
  Rng one_rng = recall_data_rng(o.seed, 2);
  result.state_bytes = stream(mechanism, make_batch(one_rng, task, 1).x, o.chunk).second;
  return result;
}

}  // namespace

void validate_training(const RecallRunOptions& o) {
  const auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw ValueError(std::string("recall: ") + name + " must be a positive integer (got " + std::to_string(v) + ")");
  };
  positive("chunk", o.chunk);
  positive("batch", o.batch);
  positive("steps", o.steps);
  positive("eval_sequences", o.eval_sequences);
  positive("threads", o.threads);
  positive("outlier_capacity", o.outlier_capacity);
  if (o.sketch_rows < 4 || o.sketch_rows % 2 != 0) {
    throw ValueError("recall: sketch_rows must be an even integer >= 4 (got " + std::to_string(o.sketch_rows) + ")");
  }
  positive("sketch_dim", o.sketch_dim);
  positive("sketch_degree", o.sketch_degree);
  if (!(o.lr > 0.0)) throw ValueError("recall: lr must be positive");
}

void check_sequence_mechanism(const std::string& mechanism) {
  if (std::find(kSequenceMechanisms.begin(), kSequenceMechanisms.end(), mechanism) != kSequenceMechanisms.end()) {
    return;
  }
  std::string known;
  for (const auto& name : kSequenceMechanisms) known += (known.empty() ? "\"" : ", \"") + name + "\"";
  throw ValueError("mechanism must be one of " + known + " (got \"" + mechanism + "\")");
}

int64_t recall_sequence_length(const RecallTaskOptions& t) { return 2 * t.pairs + t.gap + 2 * t.queries; }

void validate_recall_task(const RecallTaskOptions& task) {
  const auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw ValueError(std::string("recall: ") + name + " must be a positive integer (got " + std::to_string(v) + ")");
  };
  positive("keys", task.keys);
  positive("values", task.values);
  positive("filler", task.filler);
  positive("pairs", task.pairs);
  positive("queries", task.queries);
  if (task.gap < 0) throw ValueError("recall: gap must be >= 0");
  if (task.pairs > task.keys) throw ValueError("recall: pairs must not exceed keys (keys are distinct)");
  if (task.queries > task.pairs) throw ValueError("recall: queries must not exceed pairs");
}

RecallSequences recall_sequences(Rng& rng, const RecallTaskOptions& task, int64_t batch) {
  validate_recall_task(task);
  if (batch <= 0) throw ValueError("recall: batch must be a positive integer (got " + std::to_string(batch) + ")");
  const int64_t length = recall_sequence_length(task);
  std::vector<int64_t> tokens(static_cast<size_t>(batch * length));
  std::vector<uint8_t> answer(static_cast<size_t>(batch * (length - 1)), 0);
  std::vector<int64_t> key_order(static_cast<size_t>(task.keys));
  for (int64_t b = 0; b < batch; ++b) {
    int64_t* s = tokens.data() + b * length;
    std::iota(key_order.begin(), key_order.end(), 0);
    for (int64_t i = 0; i < task.pairs; ++i) {  // partial Fisher–Yates: distinct keys
      const auto j = i + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(task.keys - i)));
      std::swap(key_order[static_cast<size_t>(i)], key_order[static_cast<size_t>(j)]);
    }
    std::vector<int64_t> value_of(static_cast<size_t>(task.pairs));
    for (int64_t i = 0; i < task.pairs; ++i) {
      value_of[static_cast<size_t>(i)] = task.keys + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(task.values)));
      s[2 * i] = key_order[static_cast<size_t>(i)];
      s[2 * i + 1] = value_of[static_cast<size_t>(i)];
    }
    for (int64_t g = 0; g < task.gap; ++g) {
      s[2 * task.pairs + g] = task.keys + task.values + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(task.filler)));
    }
    std::vector<int64_t> asked(static_cast<size_t>(task.pairs));
    std::iota(asked.begin(), asked.end(), 0);
    for (int64_t i = 0; i < task.queries; ++i) {
      const auto j = i + static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(task.pairs - i)));
      std::swap(asked[static_cast<size_t>(i)], asked[static_cast<size_t>(j)]);
      const int64_t p = 2 * task.pairs + task.gap + 2 * i;
      s[p] = key_order[static_cast<size_t>(asked[static_cast<size_t>(i)])];
      s[p + 1] = value_of[static_cast<size_t>(asked[static_cast<size_t>(i)])];
      answer[static_cast<size_t>(b * (length - 1) + p)] = 1;
    }
  }
  RecallSequences out;
  out.batch = batch;
  out.length = length;
  out.tokens = std::move(tokens);
  out.answers = std::move(answer);
  return out;
}

Rng recall_data_rng(uint64_t seed, int64_t stream) {
  return Rng(derive_seed(seed, SeedPurpose::kData, static_cast<uint64_t>(stream)));
}

SequenceTask recall_task(const RecallTaskOptions& task) {
  validate_recall_task(task);
  return {"recall", task.keys + task.values + task.filler, recall_sequence_length(task),
          [task](Rng& rng, int64_t batch) { return recall_sequences(rng, task, batch); }};
}

ModelConfig sequence_model_config(const std::string& mechanism, const RecallRunOptions& o) {
  check_sequence_mechanism(mechanism);
  const bool outliers = mechanism == "moment-closure+outliers";
  ModelConfig m;
  m.mechanism = outliers ? Mechanism::kMomentClosure : parse_mechanism(mechanism);
  m.d_model = o.d_model;
  m.n_layer = o.n_layer;
  m.n_head = o.n_head;
  m.window = o.window;
  m.max_clusters = o.max_clusters;
  m.birth_threshold = o.birth_threshold;
  m.cluster_rule = o.cluster_rule;
  m.outlier_capacity = outliers ? o.outlier_capacity : 0;
  m.sketch_rows = o.sketch_rows;
  m.sketch_dim = o.sketch_dim;
  m.sketch_degree = o.sketch_degree;
  return m;
}

RecallResult run_sequence_task(const std::string& mechanism, const SequenceTask& task, const RecallRunOptions& o,
                               const std::function<void(int64_t, double)>& on_step) {
  validate_training(o);
  if (task.vocab <= 0 || !task.draw) throw ValueError("recall: the task needs a positive vocabulary and a generator");
  at::set_num_threads(o.threads);
  torch::manual_seed(o.seed);
  ModelConfig m = sequence_model_config(mechanism, o);
  m.vocab = task.vocab;
  RecallResult result;
  if (m.mechanism == Mechanism::kMomentClosure) {
    MomentClosureAttention model(moment_options(m));
    result = train_and_evaluate(*model, task, o, on_step);
  } else if (m.mechanism == Mechanism::kLinear) {
    LinearAttentionSpine model(linear_options(m));
    result = train_and_evaluate(*model, task, o, on_step);
  } else if (m.mechanism == Mechanism::kFrequentDirections) {
    FrequentDirectionsSpine model(frequent_directions_options(m));
    result = train_and_evaluate(*model, task, o, on_step);
  } else if (m.mechanism == Mechanism::kTensorSketch) {
    TensorSketchSpine model(tensor_sketch_options(m));
    result = train_and_evaluate(*model, task, o, on_step);
  } else {
    SlidingWindowSpine model(spine_options(m));
    result = train_and_evaluate(*model, task, o, on_step);
  }
  result.mechanism = mechanism;
  return result;
}

RecallResult run_recall(const std::string& mechanism, const RecallRunOptions& o,
                        const std::function<void(int64_t, double)>& on_step) {
  return run_sequence_task(mechanism, recall_task(o.task), o, on_step);
}

}  // namespace attnmix::stream
