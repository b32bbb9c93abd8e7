// SPDX-License-Identifier: Apache-2.0
// Training, evaluation, sampling and checkpoints of the streaming language model; see
// include/attnmix/stream/language_model.hpp.
#include "attnmix/stream/language_model.hpp"

#include "attnmix/core/atomic_file.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/context_spine.hpp"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <fstream>
#include <numbers>
#include <sstream>

namespace attnmix::lm {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr const char* kFormat = "attnmix-lm-checkpoint";
constexpr int kSchemaVersion = 1;

std::string str(int64_t v) { return std::to_string(v); }

// FNV-1a over the token values: identifies the corpus a checkpoint was trained on.
uint64_t fingerprint(std::span<const int64_t> tokens) {
  uint64_t h = 1469598103934665603ULL;
  for (const int64_t t : tokens) {
    h ^= static_cast<uint64_t>(t);
    h *= 1099511628211ULL;
  }
  return h;
}

void check_vocabulary(std::span<const int64_t> tokens, int64_t vocab, const char* where) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      throw ValueError(std::string(where) + ": token " + str(static_cast<int64_t>(i)) + " is " + str(tokens[i]) +
                       ", outside the vocabulary [0, " + str(vocab) + ")");
    }
  }
}

SpineOptions spine_options(const ModelConfig& m) {
  SpineOptions o;
  o.vocab = m.vocab;
  o.d_model = m.d_model;
  o.n_layer = m.n_layer;
  o.n_head = m.n_head;
  o.window = m.mechanism == Mechanism::kFull ? std::nullopt : std::optional<int64_t>(m.window);
  return o;
}

// ---- checkpoint metadata (JSON inside the archive) ------------------------------------------------------------

json to_json(const TrainOptions& o) {
  return {{"mechanism", mechanism_name(o.model.mechanism)},
          {"vocab", o.model.vocab},
          {"d_model", o.model.d_model},
          {"n_layer", o.model.n_layer},
          {"n_head", o.model.n_head},
          {"window", o.model.window},
          {"batch", o.batch},
          {"chunk", o.chunk},
          {"steps", o.steps},
          {"detach_horizon", o.detach_horizon},
          {"lr", o.lr},
          {"min_lr_ratio", o.min_lr_ratio},
          {"schedule", schedule_name(o.schedule)},
          {"weight_decay", o.weight_decay},
          {"clip", o.clip},
          {"seed", o.seed}};
}

TrainOptions options_from_json(const json& j) {
  TrainOptions o;
  o.model.mechanism = parse_mechanism(j.at("mechanism").get<std::string>());
  o.model.vocab = j.at("vocab").get<int64_t>();
  o.model.d_model = j.at("d_model").get<int64_t>();
  o.model.n_layer = j.at("n_layer").get<int64_t>();
  o.model.n_head = j.at("n_head").get<int64_t>();
  o.model.window = j.at("window").get<int64_t>();
  o.batch = j.at("batch").get<int64_t>();
  o.chunk = j.at("chunk").get<int64_t>();
  o.steps = j.at("steps").get<int64_t>();
  o.detach_horizon = j.at("detach_horizon").get<int64_t>();
  o.lr = j.at("lr").get<double>();
  o.min_lr_ratio = j.at("min_lr_ratio").get<double>();
  o.schedule = parse_schedule(j.at("schedule").get<std::string>());
  o.weight_decay = j.at("weight_decay").get<double>();
  o.clip = j.at("clip").get<double>();
  o.seed = j.at("seed").get<uint64_t>();
  return o;
}

// ---- the training session: model, optimizer, carried state ---------------------------------------------------

struct Session {
  TrainOptions options;
  SlidingWindowSpine spine{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  SlidingWindowState state;
  int64_t step = 0;
  uint64_t corpus_fingerprint = 0;
  int64_t corpus_tokens = 0;
};

std::unique_ptr<torch::optim::AdamW> make_optimizer(SlidingWindowSpine& spine, const TrainOptions& o) {
  return std::make_unique<torch::optim::AdamW>(spine->parameters(),
                                               torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
}

double learning_rate(const TrainOptions& o, int64_t step) {
  if (o.schedule == Schedule::kConstant) {
    return o.lr;
  }
  const double progress = static_cast<double>(step) / static_cast<double>(std::max<int64_t>(o.steps, 1));
  const double floor = o.lr * o.min_lr_ratio;
  return floor + (o.lr - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(progress, 1.0)));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

[[noreturn]] void bad_checkpoint(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": not a usable attnmix LM checkpoint: " + why);
}

void save_checkpoint(const std::string& path, const Session& s) {
  torch::serialize::OutputArchive root;
  json meta = {{"format", kFormat},
               {"schema_version", kSchemaVersion},
               {"options", to_json(s.options)},
               {"step", s.step},
               {"corpus", {{"tokens", s.corpus_tokens}, {"fnv1a", s.corpus_fingerprint}}}};
  root.write("meta", c10::IValue(meta.dump()));
  torch::serialize::OutputArchive model;
  s.spine->save(model);
  root.write("model", model);
  torch::serialize::OutputArchive optimizer;
  s.optimizer->save(optimizer);
  root.write("optimizer", optimizer);
  torch::serialize::OutputArchive state;
  state.write("pos", c10::IValue(s.state.pos));
  state.write("batch_size", c10::IValue(s.state.batch_size));
  for (size_t l = 0; l < s.state.cache_k.size(); ++l) {
    if (s.state.cache_k[l].defined()) {
      state.write("k" + std::to_string(l), s.state.cache_k[l]);
      state.write("v" + std::to_string(l), s.state.cache_v[l]);
    }
  }
  root.write("state", state);
  std::ostringstream bytes;
  root.save_to(bytes);
  write_file_atomically(path, bytes.str(), "the checkpoint");
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error(path + ": cannot open the checkpoint: " + std::strerror(errno));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct LoadedCheckpoint {
  json meta;
  torch::serialize::InputArchive root;
};

LoadedCheckpoint open_checkpoint(const std::string& path) {
  const std::string bytes = read_whole_file(path);
  LoadedCheckpoint c;
  try {
    c.root.load_from(bytes.data(), bytes.size());
    c10::IValue meta;
    c.root.read("meta", meta);
    c.meta = json::parse(meta.toStringRef());
  } catch (const c10::Error& e) {
    bad_checkpoint(path, "the file is not a torch archive with a \"meta\" record");
  } catch (const json::exception& e) {
    bad_checkpoint(path, std::string("the meta record is not valid JSON (") + e.what() + ")");
  }
  if (!c.meta.is_object() || c.meta.value("format", "") != kFormat) {
    bad_checkpoint(path, std::string("\"format\" must be \"") + kFormat + "\"");
  }
  if (c.meta.value("schema_version", 0) != kSchemaVersion) {
    bad_checkpoint(path, "unsupported schema_version (this build reads " + std::to_string(kSchemaVersion) + ")");
  }
  return c;
}

TrainOptions checkpoint_options(const std::string& path, const json& meta) {
  try {
    auto o = options_from_json(meta.at("options"));
    validate(o);
    return o;
  } catch (const json::exception& e) {
    bad_checkpoint(path, std::string("field options: ") + e.what());
  } catch (const std::invalid_argument& e) {
    bad_checkpoint(path, std::string("field options: ") + e.what());
  }
}

// Builds the model under the seed and restores parameters (and, with `with_training`, optimizer and state).
Session load_session(const std::string& path, bool with_training) {
  auto c = open_checkpoint(path);
  Session s;
  s.options = checkpoint_options(path, c.meta);
  torch::manual_seed(s.options.seed);
  s.spine = SlidingWindowSpine(spine_options(s.options.model));
  try {
    s.step = c.meta.at("step").get<int64_t>();
    s.corpus_tokens = c.meta.at("corpus").at("tokens").get<int64_t>();
    s.corpus_fingerprint = c.meta.at("corpus").at("fnv1a").get<uint64_t>();
  } catch (const json::exception& e) {
    bad_checkpoint(path, std::string("meta: ") + e.what());
  }
  try {
    torch::serialize::InputArchive model;
    c.root.read("model", model);
    s.spine->load(model);
    if (with_training) {
      s.optimizer = make_optimizer(s.spine, s.options);
      torch::serialize::InputArchive optimizer;
      c.root.read("optimizer", optimizer);
      s.optimizer->load(optimizer);
      torch::serialize::InputArchive state;
      c.root.read("state", state);
      c10::IValue pos;
      c10::IValue batch_size;
      state.read("pos", pos);
      state.read("batch_size", batch_size);
      s.state = s.spine->init_state(batch_size.toInt());
      s.state.pos = pos.toInt();
      for (size_t l = 0; l < s.state.cache_k.size(); ++l) {
        torch::Tensor k;
        torch::Tensor v;
        if (state.try_read("k" + std::to_string(l), k)) {
          state.read("v" + std::to_string(l), v);
          s.state.cache_k[l] = k;
          s.state.cache_v[l] = v;
        }
      }
    }
  } catch (const c10::Error& e) {
    bad_checkpoint(path, "its tensors do not match the model it describes");
  }
  return s;
}


}  // namespace

Mechanism parse_mechanism(std::string_view name) {
  if (name == "window") return Mechanism::kWindow;
  if (name == "full") return Mechanism::kFull;
  throw ValueError("mechanism must be \"window\" or \"full\" (got \"" + std::string(name) + "\")");
}

std::string mechanism_name(Mechanism mechanism) { return mechanism == Mechanism::kFull ? "full" : "window"; }

Schedule parse_schedule(std::string_view name) {
  if (name == "constant") return Schedule::kConstant;
  if (name == "cosine") return Schedule::kCosine;
  throw ValueError("schedule must be \"constant\" or \"cosine\" (got \"" + std::string(name) + "\")");
}

std::string schedule_name(Schedule schedule) { return schedule == Schedule::kCosine ? "cosine" : "constant"; }

void validate(const TrainOptions& o) {
  validate_spine_options(spine_options(o.model), "lm");
  const auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw ValueError(std::string("lm: ") + name + " must be a positive integer (got " + str(v) + ")");
  };
  positive("batch", o.batch);
  positive("chunk", o.chunk);
  positive("steps", o.steps);
  positive("detach_horizon", o.detach_horizon);
  positive("threads", o.threads);
  if (o.checkpoint_every < 0) throw ValueError("lm: checkpoint_every must be >= 0");
  if (!(o.lr > 0.0) || !std::isfinite(o.lr)) throw ValueError("lm: lr must be a positive number");
  if (!(o.min_lr_ratio >= 0.0 && o.min_lr_ratio <= 1.0)) throw ValueError("lm: min_lr_ratio must lie in [0, 1]");
  if (!(o.weight_decay >= 0.0) || !std::isfinite(o.weight_decay)) throw ValueError("lm: weight_decay must be >= 0");
  if (!(o.clip >= 0.0) || !std::isfinite(o.clip)) throw ValueError("lm: clip must be >= 0 (0 turns clipping off)");
}

std::vector<int64_t> byte_tokens(std::string_view text) {
  std::vector<int64_t> out(text.size());
  std::transform(text.begin(), text.end(), out.begin(), [](char c) { return static_cast<int64_t>(static_cast<unsigned char>(c)); });
  return out;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> split_heldout(std::span<const int64_t> tokens, double fraction) {
  if (!(fraction > 0.0 && fraction < 1.0)) {
    throw ValueError("lm: the held-out fraction must lie in (0, 1)");
  }
  const auto n = static_cast<int64_t>(tokens.size());
  const auto held = static_cast<int64_t>(std::ceil(fraction * static_cast<double>(n)));
  if (held < 2 || n - held < 2) {
    throw ValueError("lm: the text is too short to split into training and held-out parts (" + str(n) + " tokens)");
  }
  return {{tokens.begin(), tokens.end() - held}, {tokens.end() - held, tokens.end()}};
}

TrainSummary train(const TrainOptions& requested, std::span<const int64_t> tokens, const std::string& resume_from,
                   const std::string& out, const std::function<void(const Progress&)>& on_progress) {
  validate(requested);
  at::set_num_threads(requested.threads);
  Session s;
  if (resume_from.empty()) {
    s.options = requested;
    torch::manual_seed(s.options.seed);
    s.spine = SlidingWindowSpine(spine_options(s.options.model));
    s.optimizer = make_optimizer(s.spine, s.options);
    s.corpus_tokens = static_cast<int64_t>(tokens.size());
    s.corpus_fingerprint = fingerprint(tokens);
  } else {
    s = load_session(resume_from, /*with_training=*/true);
    if (s.corpus_tokens != static_cast<int64_t>(tokens.size()) || s.corpus_fingerprint != fingerprint(tokens)) {
      throw std::runtime_error(resume_from + ": the checkpoint was trained on a different corpus (" +
                               str(s.corpus_tokens) + " tokens, fingerprint " + std::to_string(s.corpus_fingerprint) +
                               "); resume with the same text");
    }
    s.options.steps = requested.steps;
    if (s.step > s.options.steps) {
      throw ValueError("lm: the checkpoint is at step " + str(s.step) + ", beyond --steps " + str(requested.steps));
    }
  }
  s.options.threads = requested.threads;
  s.options.checkpoint_every = requested.checkpoint_every;
  const auto& o = s.options;
  check_vocabulary(tokens, o.model.vocab, "lm train");
  const int64_t stream_len = static_cast<int64_t>(tokens.size()) / o.batch;
  const int64_t chunks_per_pass = (stream_len - 1) / o.chunk;
  if (chunks_per_pass < 1) {
    throw ValueError("lm train: the corpus (" + str(static_cast<int64_t>(tokens.size())) + " tokens) is too short for " +
                     str(o.batch) + " streams of one chunk of " + str(o.chunk) + " tokens plus one (needs " +
                     str(o.batch * (o.chunk + 1)) + ")");
  }
  const auto data = torch::from_blob(const_cast<int64_t*>(tokens.data()), {o.batch, stream_len}, torch::kLong).clone();

  int64_t current_step = s.step;
  TbpttOptions tbptt;
  tbptt.detach_horizon = o.detach_horizon;
  const auto parameters = s.spine->parameters();
  tbptt.before_update = [&](int64_t) {
    if (o.clip > 0.0) {
      torch::nn::utils::clip_grad_norm_(parameters, o.clip);
    }
    set_learning_rate(*s.optimizer, learning_rate(o, current_step));
  };
  TbpttRunner<SlidingWindowSpineImpl> runner(*s.spine, *s.optimizer, tbptt);

  TrainSummary summary;
  summary.first_step = s.step;
  for (const auto& p : parameters) summary.parameters += p.numel();
  const auto start = Clock::now();
  const int64_t tokens_per_step = o.batch * o.chunk;
  for (; s.step < o.steps; ++s.step) {
    current_step = s.step;
    const int64_t within_pass = s.step % chunks_per_pass;
    if (within_pass == 0) {
      s.state = s.spine->init_state(o.batch);
    }
    const int64_t offset = within_pass * o.chunk;
    const double loss = runner.feed(s.state, data.narrow(1, offset, o.chunk), data.narrow(1, offset + 1, o.chunk));
    summary.losses.push_back(loss);
    summary.tokens += tokens_per_step;
    if (o.checkpoint_every > 0 && !out.empty() && (s.step + 1) % o.checkpoint_every == 0 &&
        (s.step + 1) % o.detach_horizon == 0 && s.step + 1 < o.steps) {
      ++s.step;
      save_checkpoint(out, s);
      --s.step;
    }
    if (on_progress) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      Progress p;
      p.step = s.step + 1;
      p.steps = o.steps;
      p.loss = loss;
      p.elapsed_seconds = elapsed;
      p.tokens_per_second = elapsed > 0 ? static_cast<double>(summary.tokens) / elapsed : 0.0;
      const auto done = static_cast<double>(s.step + 1 - summary.first_step);
      p.eta_seconds = elapsed / done * static_cast<double>(o.steps - s.step - 1);
      on_progress(p);
    }
  }
  runner.flush(s.state);
  summary.steps = s.step;
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  summary.state_bytes = s.state.bytes();
  if (!out.empty()) {
    save_checkpoint(out, s);
  }
  return summary;
}

Evaluation evaluate(const std::string& checkpoint, std::span<const int64_t> tokens, int64_t chunk, int threads) {
  if (chunk <= 0) throw ValueError("lm eval: chunk must be a positive integer");
  if (threads <= 0) throw ValueError("lm eval: threads must be a positive integer");
  if (tokens.size() < 2) throw ValueError("lm eval: the text needs at least 2 tokens");
  at::set_num_threads(threads);
  auto s = load_session(checkpoint, /*with_training=*/false);
  check_vocabulary(tokens, s.options.model.vocab, "lm eval");
  torch::NoGradGuard no_grad;
  s.spine->eval();
  const auto n = static_cast<int64_t>(tokens.size());
  const auto data = torch::from_blob(const_cast<int64_t*>(tokens.data()), {1, n}, torch::kLong);
  auto state = s.spine->init_state(1);
  double total = 0.0;
  const auto start = Clock::now();
  for (int64_t offset = 0; offset < n - 1; offset += chunk) {
    const int64_t t = std::min(chunk, n - 1 - offset);
    auto step = s.spine->advance(state, data.narrow(1, offset, t));
    state = std::move(step.state);
    const auto targets = data.narrow(1, offset + 1, t).reshape({-1});
    total += torch::nn::functional::cross_entropy(
                 step.logits.reshape({-1, step.logits.size(-1)}), targets,
                 torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                 .item<double>();
  }
  Evaluation e;
  e.tokens = n - 1;
  e.mean_cross_entropy = total / static_cast<double>(n - 1);
  e.bits_per_token = e.mean_cross_entropy / std::numbers::ln2;
  e.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  e.state_bytes = state.bytes();
  return e;
}

std::vector<int64_t> generate(const std::string& checkpoint, std::span<const int64_t> prompt,
                              const GenerateOptions& g) {
  if (prompt.empty()) throw ValueError("lm generate: the prompt must not be empty");
  if (g.tokens < 0) throw ValueError("lm generate: the number of tokens must be >= 0");
  if (!(g.temperature > 0.0) || !std::isfinite(g.temperature)) throw ValueError("lm generate: temperature must be > 0");
  if (g.top_k < 0) throw ValueError("lm generate: top_k must be >= 0");
  if (g.threads <= 0) throw ValueError("lm generate: threads must be a positive integer");
  at::set_num_threads(g.threads);
  auto s = load_session(checkpoint, /*with_training=*/false);
  check_vocabulary(prompt, s.options.model.vocab, "lm generate");
  torch::NoGradGuard no_grad;
  s.spine->eval();
  auto state = s.spine->init_state(1);
  auto step = s.spine->advance(
      state, torch::from_blob(const_cast<int64_t*>(prompt.data()), {1, static_cast<int64_t>(prompt.size())},
                              torch::kLong));
  Rng rng(g.seed);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(g.tokens));
  for (int64_t i = 0; i < g.tokens; ++i) {
    auto logits = step.logits.select(1, step.logits.size(1) - 1).squeeze(0).to(torch::kDouble) / g.temperature;
    if (g.top_k > 0 && g.top_k < logits.size(0)) {
      const auto kth = std::get<0>(logits.topk(g.top_k)).min();
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
    }
    const auto probs = torch::softmax(logits, 0).contiguous();
    const double* p = probs.data_ptr<double>();
    double u = rng.uniform();
    int64_t token = probs.size(0) - 1;
    for (int64_t v = 0; v < probs.size(0); ++v) {
      if (u < p[v]) {
        token = v;
        break;
      }
      u -= p[v];
    }
    out.push_back(token);
    step = s.spine->advance(step.state, torch::full({1, 1}, token, torch::kLong));
  }
  return out;
}

CheckpointInfo read_checkpoint_info(const std::string& checkpoint) {
  auto c = open_checkpoint(checkpoint);
  CheckpointInfo info;
  info.options = checkpoint_options(checkpoint, c.meta);
  info.model = info.options.model;
  info.step = c.meta.value("step", int64_t{0});
  return info;
}

}  // namespace attnmix::lm
