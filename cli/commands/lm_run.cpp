// SPDX-License-Identifier: Apache-2.0
// The language-model plugin (lm_plugin.hpp): what `attnmix lm train|eval|generate|recall` do once
// the executable (lm.cpp) has parsed and checked the command line. `train` cuts the text into a
// training part and a held-out tail, trains with truncated BPTT while a progress bar runs on
// stderr, evaluates the held-out tail and prints a summary (with the far field's per-layer cluster
// statistics for moment-closure); `eval` scores a text under a checkpoint; `generate` continues a
// prompt; `recall` compares window, moment-closure and full attention on associative recall
// beyond the window and on held-out text. Built into attnmix-lm.so with attnmix::torch
// (docs/lm.md, docs/far-field.md).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "attnmix/core/atomic_file.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/io/input_file.hpp"
#include "attnmix/stream/far_field.hpp"
#include "attnmix/stream/language_model.hpp"
#include "attnmix/stream/progress_record.hpp"
#include "attnmix/stream/memory_bench_record.hpp"
#include "attnmix/stream/memory_benchmark.hpp"
#include "attnmix/stream/option_table.hpp"
#include "cli_support.hpp"
#include "commands/lm_plugin.hpp"
#include "commands/lm_support.hpp"

namespace attnmix::cli {

using namespace attnmix::stream;  // the streaming models this file exposes

LmCorpus read_lm_corpus(const std::string& path, double holdout) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0)
    throw std::runtime_error(path + ": cannot read the text: " + std::strerror(errno));
  check_input_file(path, "the text");  // a FIFO would block the open until a writer comes
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read the text: " + std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw std::runtime_error(path + ": cannot read the text: read error");
  const std::string text = buffer.str();
  if (text.empty()) throw ValueError(path + ": the text is empty (0 bytes)");
  LmCorpus corpus;
  corpus.bytes = static_cast<int64_t>(text.size());
  std::vector<int64_t> tokens = stream::byte_tokens(text);
  if (holdout <= 0.0) {
    corpus.train = std::move(tokens);
    return corpus;
  }
  try {
    auto [train, heldout] = stream::split_heldout(tokens, holdout);
    corpus.train = std::move(train);
    corpus.heldout = std::move(heldout);
  } catch (const std::invalid_argument& e) {
    throw ValueError(path + ": " + e.what() + "; use a longer text or another --holdout");
  }
  return corpus;
}

std::string format_rate(double per_second) {
  if (per_second >= 1e6) return format_short(per_second / 1e6, 3) + "M";
  if (per_second >= 1e3) return format_short(per_second / 1e3, 3) + "k";
  return format_short(per_second, 3);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto total = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = total / 3600, m = total / 60 % 60, sec = total % 60;
  char buf[32];
  if (h > 0)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(h),
                  static_cast<long long>(m), static_cast<long long>(sec));
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(m),
                  static_cast<long long>(sec));
  return buf;
}

std::string history_line(const stream::Progress& p) { return stream::progress_record(p).dump() + "\n"; }

std::string heldout_history_line(int64_t step, double bits_per_byte) {
  return nlohmann::ordered_json{{"step", step}, {"heldout_bits_per_byte", bits_per_byte}}.dump() + "\n";
}

std::string format_lm_progress(const stream::Progress& p) {
  const int64_t percent = p.steps > 0 ? p.step * 100 / p.steps : 100;
  char loss[32];
  std::snprintf(loss, sizeof loss, "%.4f", p.loss);
  std::string text = "step " + std::to_string(p.step) + "/" + std::to_string(p.steps) + "  " +
                     std::to_string(percent) + "%  " + format_rate(p.tokens_per_second) + " tokens/s  loss " + loss;
  if (p.heldout_bits_per_byte) text += "  held out " + format_short(*p.heldout_bits_per_byte, 4) + " bits/byte";
  return text + "  ETA " + format_duration(p.eta_seconds);
}

namespace {

std::string num(double x) { return format_short(x, 6); }

bool given(const LmTrainRequest& request, const std::string& flag) {
  return std::find(request.given.begin(), request.given.end(), flag) != request.given.end();
}

/// An option's value as the resume check quotes it (equal text means equal values: reals print the shortest
/// round-trip form).
template <class T>
std::string value_text(const T& value) {
  if constexpr (std::is_enum_v<T>) {
    return stream::NamedValues<T>::name(value);
  } else if constexpr (std::is_same_v<T, double>) {
    return format_double(value);
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    return value ? format_double(*value) : std::string("unset (the default rule)");
  } else if constexpr (std::is_same_v<T, std::string>) {
    return value;
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else {  // a list, as the flag takes it
    std::string out;
    for (const auto& item : value) {
      if (!out.empty()) out += ',';
      out += value_text(item);
    }
    return out;
  }
}

/// A --resume checkpoint fixes every option the table marks Kept::kFixed: a repeated flag must agree with it (so the
/// same command line plus --resume works). An option of another mechanism's models is refused.
void check_resume_flags(const LmTrainRequest& args, const stream::CheckpointInfo& info) {
  const stream::Mechanism stored_mechanism = info.options.model.mechanism;
  stream::TrainOptions requested = args.options, checkpoint = info.options;  // the fields are reached mutably
  for (const auto& option : stream::train_option_table()) {
    if (option.kept != stream::Kept::kFixed || option.flag.empty() || !given(args, std::string(option.flag))) continue;
    const std::string flag(option.flag);
    if (option.only_for && *option.only_for != stored_mechanism)
      throw ValueError(flag + " applies only to --mechanism " + stream::mechanism_name(*option.only_for) +
                       "; the --resume checkpoint " + args.resume + " uses " +
                       stream::mechanism_name(stored_mechanism));
    const auto [wanted, stored] = std::visit(
        [&](const auto& field) {
          return std::pair(value_text(field(requested)), value_text(field(checkpoint)));
        },
        option.field);
    if (wanted == stored) continue;
    throw ValueError(flag + " " + wanted + " does not match the --resume checkpoint " + args.resume + " (" +
                     std::string(option.name) + " = " + stored +
                     "); leave the flag out to continue with the checkpoint's settings");
  }
}

/// "last 64 bytes" / "every byte since the start of the pass": what the mechanism attends to.
std::string mechanism_text(const stream::ModelConfig& m) {
  switch (m.mechanism) {
    case stream::Mechanism::kFull:
      return "full causal attention";
    case stream::Mechanism::kMomentClosure:
      return "moment-closure attention: the last " + std::to_string(m.window) +
             " tokens exactly and a far field of up to " + std::to_string(m.max_clusters) +
             (m.max_clusters == 1 ? " cluster" : " clusters") +
             " per layer and head " +
             (m.cluster_rule == ClusterRule::kBudget
                  ? std::string("(budget rule: every evicted chunk founds a cluster, the closest two merge when "
                                "all are live)")
                  : "(birth threshold " + num(m.birth_threshold) + ", merge threshold " +
                        (m.merge_threshold ? num(*m.merge_threshold) : std::string("2.65 + 6/sqrt(n)")) + ")") +
             (m.outlier_capacity > 0 ? ", plus the " + std::to_string(m.outlier_capacity) +
                                           " worst-fitting evicted tokens per cluster kept exactly (int8)"
                                     : std::string());
    case stream::Mechanism::kLinear:
      return "causal linear attention over every token since the start of the pass (running sums, no window)";
    case stream::Mechanism::kFrequentDirections:
      return "linear attention over the last " + std::to_string(m.window) +
             " tokens exactly and a Frequent Directions sketch of " + std::to_string(m.sketch_rows) +
             " rows per layer and head of every token before them";
    case stream::Mechanism::kTensorSketch:
      return "a degree-" + std::to_string(m.sketch_degree) + " polynomial kernel over the last " +
             std::to_string(m.window) + " tokens exactly and a tensor sketch of width " +
             std::to_string(m.sketch_dim) + " per layer and head of every token before them";
    case stream::Mechanism::kWindow:
      break;
  }
  return "sliding-window attention over the last " + std::to_string(m.window) + " tokens";
}

/// The far field's per-layer statistics, one line per layer, indented by `indent`.
void print_far_field(std::ostream& out, const std::vector<stream::LayerClusterStats>& layers,
                     const std::string& indent, int64_t streams) {
  for (size_t l = 0; l < layers.size(); ++l) {
    const stream::LayerClusterStats& s = layers[l];
    std::string label = "layer " + std::to_string(l);
    label.resize(std::max<size_t>(label.size() + 1, 10), ' ');
    out << indent << label << format_short(s.clusters, 3)
        << (s.clusters == 1.0 ? " cluster" : " clusters")
        << (streams > 1 ? " (mean over streams)" : "") << ", " << s.births
        << (s.births == 1 ? " birth, " : " births, ") << s.merges
        << (s.merges == 1 ? " merge, " : " merges, ") << "mean misfit "
        << format_short(s.mean_misfit, 4) << " over " << s.ingestions << " ingestions\n";
  }
}

std::string model_text(const stream::ModelConfig& m) {
  return mechanism_text(m) + "; d_model " + std::to_string(m.d_model) + ", " +
         std::to_string(m.n_layer) + (m.n_layer == 1 ? " layer, " : " layers, ") +
         std::to_string(m.n_head) + (m.n_head == 1 ? " head" : " heads");
}

std::string optimizer_text(const stream::TrainOptions& o) {
  std::string text = "AdamW lr " + num(o.lr);
  text += o.schedule == stream::Schedule::kCosine
              ? " (cosine decay to " + num(o.lr * o.min_lr_ratio) + ")"
              : " (constant)";
  text += ", weight decay " + num(o.weight_decay) + ", ";
  text += o.clip > 0 ? "gradient norm clipped at " + num(o.clip) : "no clipping";
  text += ", an update every " + std::to_string(o.detach_horizon) +
          (o.detach_horizon == 1 ? " chunk" : " chunks") + " (detach horizon)";
  return text;
}

// ---- the progress bar ------------------------------------------------------------------------

/// Redraws one line on a terminal (\r), or prints a line every 5 % of the steps and at every held-out score
/// otherwise; stderr. The latest held-out score stays on the terminal's line.
class ProgressBar {
 public:
  explicit ProgressBar(std::ostream& err) : err_(err), tty_(::isatty(STDERR_FILENO) == 1) {}

  void update(stream::Progress p) {
    const bool scored = p.heldout_bits_per_byte.has_value();
    if (scored) heldout_ = p.heldout_bits_per_byte;
    if (tty_) {
      p.heldout_bits_per_byte = heldout_;
      const auto now = std::chrono::steady_clock::now();
      if (p.step != p.steps && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      drawn_ = true;
      const std::string line = bar(p) + format_lm_progress(p);
      err_ << '\r' << line;
      if (line.size() < width_) err_ << std::string(width_ - line.size(), ' ');
      width_ = line.size();
      err_ << std::flush;
      return;
    }
    const bool first = !drawn_;
    const bool crossed = p.step * 20 / p.steps != (p.step - 1) * 20 / p.steps;
    if (first || crossed || scored || p.step == p.steps) err_ << format_lm_progress(p) << '\n' << std::flush;
    drawn_ = true;
  }

  /// Ends a terminal's redrawn line.
  void finish() {
    if (tty_ && drawn_) err_ << '\n' << std::flush;
    drawn_ = false;
  }

 private:
  static std::string bar(const stream::Progress& p) {
    constexpr int64_t kWidth = 24;
    const int64_t filled =
        p.steps > 0 ? std::clamp<int64_t>(p.step * kWidth / p.steps, 0, kWidth) : kWidth;
    std::string text(static_cast<size_t>(kWidth + 3), '.');  // "[###.....] "
    text.front() = '[';
    std::fill_n(text.begin() + 1, filled, '#');
    text[static_cast<size_t>(kWidth + 1)] = ']';
    text.back() = ' ';
    return text;
  }

  std::ostream& err_;
  bool tty_;
  bool drawn_ = false;
  std::optional<double> heldout_;  // the latest held-out bits per byte
  size_t width_ = 0;
  std::chrono::steady_clock::time_point last_draw_{};
};

// ---- lm train ----------------------------------------------------------------------------------

double mean_of(const std::vector<double>& v, size_t from, size_t to) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from),
                         v.begin() + static_cast<std::ptrdiff_t>(to), 0.0) /
         static_cast<double>(to - from);
}

int run_train(const LmTrainRequest& args) {
  std::ostream& out = std::cout;
  stream::TrainOptions o = args.options;
  // Fail before training, not after it: the output path, the checkpoint, the options, the text.
  // --out may be the --resume checkpoint: it is read whole before training and replaced, atomically,
  // only by its own continuation (docs/lm.md: resuming in place after an interruption).
  const std::string path = args.text.empty() ? std::string(kDefaultCorpus) : args.text;
  const InputFile text_input{args.text.empty() ? "--text (by default)" : "--text", path};
  if (!args.out.empty()) check_output_path(args.out, "the checkpoint", {text_input});
  if (!args.history.empty()) {
    std::vector<InputFile> inputs{text_input};
    if (!args.resume.empty()) inputs.push_back({"--resume", args.resume});
    if (!args.out.empty()) inputs.push_back({"--out", args.out});
    check_output_path(args.history, "the history", inputs, "--history");
  }
  std::optional<stream::CheckpointInfo> info;
  if (!args.resume.empty()) {
    check_input_file(args.resume, "the checkpoint");
    info = stream::read_checkpoint_info(args.resume);
    check_resume_flags(args, *info);
    const int64_t steps = given(args, "--steps") ? o.steps : info->options.steps;
    const int threads = o.threads;
    const int64_t every = o.checkpoint_every;
    o = info->options;  // the checkpoint's settings, for the messages below
    o.steps = steps;
    o.threads = threads;
    o.checkpoint_every = every;
    if (info->step >= o.steps)
      throw ValueError(args.resume + ": the checkpoint has already trained " +
                       std::to_string(info->step) + " of " + std::to_string(o.steps) +
                       " steps; give --steps N with N > " + std::to_string(info->step) +
                       " to train further");
  }
  stream::validate(o);

  const LmCorpus corpus = read_lm_corpus(path, args.holdout);
  const auto n_train = static_cast<int64_t>(corpus.train.size());
  const int64_t needed = o.batch * (o.chunk + 1);
  if (n_train < needed)
    throw ValueError(path + ": " + std::to_string(n_train) + " training bytes are too few for " +
                     std::to_string(o.batch) + " streams (--batch) of one chunk of " +
                     std::to_string(o.chunk) + " bytes (--chunk) plus one: at least " +
                     std::to_string(needed) +
                     " are needed; use a longer text or a smaller --batch or --chunk");
  if (info && (info->corpus_tokens != n_train ||
               info->corpus_fingerprint != stream::corpus_fingerprint(corpus.train)))
    throw ValueError("--resume " + args.resume + ": the checkpoint was trained on other text (" +
                     std::to_string(info->corpus_tokens) + " training bytes) than " + path +
                     " gives with --holdout " + num(args.holdout) + " (" + std::to_string(n_train) +
                     " training bytes); resume with the same --text and --holdout");

  const int64_t stream_len = n_train / o.batch;
  const int64_t chunks_per_pass = (stream_len - 1) / o.chunk;
  if (info)
    out << "Resuming " << args.resume << " at step " << info->step << " of " << o.steps << ": ";
  else
    out << "Training ";
  out << "a byte-level language model (" << model_text(o.model) << ")\n"
      << "  on " << path << ": " << corpus.bytes << " bytes, " << n_train << " for training";
  if (!corpus.heldout.empty())
    out << " and the last " << corpus.heldout.size() << " held out (--holdout " << num(args.holdout)
        << ")";
  out << "\n  " << o.batch << " streams of " << stream_len << " bytes read in chunks of " << o.chunk
      << " (" << chunks_per_pass << " steps make one pass), " << o.steps << " steps, " << o.threads
      << (o.threads == 1 ? " thread" : " threads") << "\n  " << optimizer_text(o) << "\n"
      << std::flush;

  ProgressBar bar(std::cerr);
  stream::TrainSummary summary;
  std::string history;
  try {
    summary = stream::train(
        o, corpus.train, args.resume, args.out,
        [&bar, &history](const stream::Progress& p) {
          bar.update(p);
          history += history_line(p);
        },
        corpus.heldout);
  } catch (...) {
    bar.finish();
    throw;
  }
  bar.finish();

  const auto& losses = summary.losses;
  const size_t k = std::min<size_t>(10, losses.size());
  const int64_t run_steps = summary.steps - summary.first_step;
  out << "\nSummary\n";
  out << "  text          " << path << ": " << n_train << " training bytes";
  if (!corpus.heldout.empty()) out << ", " << corpus.heldout.size() << " held out";
  out << "\n  model         " << model_text(o.model) << ": " << summary.parameters
      << " parameters\n";
  out << "  training      steps " << summary.first_step + 1 << "-" << summary.steps << " ("
      << run_steps << " steps, "
      << format_short(static_cast<double>(summary.steps) / static_cast<double>(chunks_per_pass), 3)
      << " passes over the training bytes in all): " << summary.tokens << " tokens in "
      << format_seconds(summary.seconds) << " s ("
      << format_rate(summary.seconds > 0 ? static_cast<double>(summary.tokens) / summary.seconds
                                         : 0.0)
      << " tokens/s)\n";
  if (k > 0)
    out << "  loss          " << format_short(mean_of(losses, 0, k), 4) << " -> "
        << format_short(mean_of(losses, losses.size() - k, losses.size()), 4)
        << " nats per byte (mean of the first " << k << " and the last " << k
        << " steps of this run)\n";
  if (summary.heldout) {
    const stream::Evaluation& e = *summary.heldout;
    out << "  held out      " << format_short(e.mean_cross_entropy, 4)
        << " nats = " << format_short(e.bits_per_token, 4) << " bits per byte on " << e.tokens
        << " predicted bytes (a uniform guess over 256 byte values: 8 bits)\n";
  } else {
    out << "  held out      none (--holdout 0)\n";
  }
  out << "  state         " << summary.state_bytes << " bytes carried for " << o.batch
      << " streams (";
  switch (o.model.mechanism) {
    case stream::Mechanism::kFull:
      out << "full attention keeps every key and value since the start of the pass)";
      break;
    case stream::Mechanism::kMomentClosure:
      out << "bounded: the keys and values of the last " << o.model.window << " tokens and "
          << o.model.max_clusters << " cluster slots per layer)";
      break;
    case stream::Mechanism::kLinear:
      out << "bounded: the running sums of every layer and head, whatever the stream's length)";
      break;
    case stream::Mechanism::kFrequentDirections:
      out << "bounded: the last " << o.model.window << " tokens' features and a sketch of "
          << o.model.sketch_rows << " rows per layer and head)";
      break;
    case stream::Mechanism::kTensorSketch:
      out << "bounded: the last " << o.model.window << " tokens' features and sums over a sketch of width "
          << o.model.sketch_dim << " per layer and head)";
      break;
    case stream::Mechanism::kWindow:
      out << "bounded: the keys and values of the last " << o.model.window << " tokens per layer)";
      break;
  }
  out << "\n";
  if (!summary.far_field.empty()) {
    out << "  far field     per layer, over the steps of this run and " << o.batch
        << " streams (at most " << o.model.max_clusters << " clusters; the count is the final "
        << "state's):\n";
    print_far_field(out, summary.far_field, "    ", o.batch);
  }
  if (!args.history.empty()) {
    if (summary.heldout) history += heldout_history_line(summary.steps, summary.heldout->bits_per_token);
    write_file_atomically(args.history, history, "the history");
    out << "  history       " << args.history << " (" << summary.steps - summary.first_step << " steps)\n";
  }
  if (args.out.empty())
    out << "  checkpoint    not written (give --out FILE to keep the model for lm eval and lm "
           "generate)\n";
  else
    out << "  checkpoint    " << args.out << " (step " << summary.steps
        << "; train further with --resume " << args.out << " --steps N)\n";
  return kExitOk;
}

// ---- lm eval -----------------------------------------------------------------------------------

int run_eval(const LmEvalRequest& args) {
  std::ostream& out = std::cout;
  check_input_file(args.checkpoint, "the checkpoint");
  const stream::CheckpointInfo info = stream::read_checkpoint_info(args.checkpoint);
  const std::string path = args.text.empty() ? std::string(kDefaultCorpus) : args.text;
  const LmCorpus corpus = read_lm_corpus(path, args.holdout);
  const std::vector<int64_t>& tokens = args.holdout > 0 ? corpus.heldout : corpus.train;
  if (tokens.size() < 2)
    throw ValueError(path + ": the text has " + std::to_string(tokens.size()) +
                     " byte; evaluation needs at least 2 (one to read, one to predict)");
  const int64_t chunk = args.chunk > 0 ? args.chunk : info.options.chunk;
  const stream::Evaluation e = stream::evaluate(args.checkpoint, tokens, chunk, args.threads, args.window_cache);
  out << "Evaluating " << args.checkpoint << " (" << model_text(info.model) << "; trained "
      << info.step << " steps)\n  on " << path;
  if (args.holdout > 0)
    out << ": its last " << tokens.size() << " of " << corpus.bytes << " bytes (--holdout "
        << num(args.holdout) << ")";
  else
    out << " (" << tokens.size() << " bytes)";
  out << ", streamed in chunks of " << chunk
      << (args.window_cache == stream::WindowCache::kInt8 ? ", the window's keys and values held as int8" : "")
      << "\n\nSummary\n";
  out << "  predicted      " << e.tokens << " bytes (every byte after the first)\n";
  out << "  cross-entropy  " << format_short(e.mean_cross_entropy, 6) << " nats per byte\n";
  out << "  bits per byte  " << format_short(e.bits_per_token, 6)
      << " (a uniform guess over 256 byte values: 8)\n";
  out << "  state          " << e.state_bytes << " bytes carried at the end\n";
  out << "  time           " << format_seconds(e.seconds) << " s\n";
  if (!e.far_field.empty()) {
    out << "  far field      per layer (at most " << info.model.max_clusters
        << " clusters; the count at the end of the text):\n";
    print_far_field(out, e.far_field, "    ", 1);
  }
  return kExitOk;
}

// ---- lm generate -------------------------------------------------------------------------------

int run_generate(const LmGenerateRequest& args) {
  check_input_file(args.checkpoint, "the checkpoint");
  const std::vector<int64_t> prompt = stream::byte_tokens(args.prompt);
  const std::vector<int64_t> tokens = stream::generate(args.checkpoint, prompt, args.options);
  std::string text = args.prompt;
  for (const int64_t t : tokens) text.push_back(static_cast<char>(static_cast<unsigned char>(t)));
  std::cout << text << '\n' << std::flush;
  return kExitOk;
}

// ---- lm recall ---------------------------------------------------------------------------------

/// `lm train`'s options for one mechanism of the text comparison: the recall model's sizes, window,
/// far field, seed and threads, the --text-* settings; lm train's defaults otherwise.
stream::TrainOptions text_options(const LmRecallRequest& r, const std::string& mechanism) {
  stream::TrainOptions o;
  o.model = stream::sequence_model_config(mechanism, r.options);
  o.chunk = r.text_chunk > 0 ? r.text_chunk : r.options.chunk;
  o.steps = r.text_steps;
  o.lr = r.text_lr;
  o.seed = r.options.seed;
  o.threads = r.options.threads;
  return o;
}

/// Width of the mechanism column of the tables (the longest name, "moment-closure+outliers", and a space).
constexpr size_t kMechanismColumn = 25;

/// Left-aligned in `width` columns.
std::string pad(std::string text, size_t width) {
  if (text.size() < width) text.resize(width, ' ');
  return text;
}

/// Right-aligned in `width` columns.
std::string right(const std::string& text, size_t width) {
  return text.size() >= width ? text : std::string(width - text.size(), ' ') + text;
}

std::string fixed(double x, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}

int run_recall(const LmRecallRequest& r) {
  std::ostream& out = std::cout;
  const stream::RecallRunOptions& o = r.options;
  const stream::RecallTaskOptions& task = o.task;
  // Fail before training anything: the text and the text runs' options.
  std::optional<LmCorpus> corpus;
  const std::string path = r.text.empty() ? std::string(kDefaultCorpus) : r.text;
  if (r.text_steps > 0) {
    for (const std::string& name : r.mechanisms)
      stream::validate(text_options(r, name));
    corpus = read_lm_corpus(path, r.holdout);
    const stream::TrainOptions t = text_options(r, "window");
    const int64_t needed = t.batch * (t.chunk + 1);
    if (static_cast<int64_t>(corpus->train.size()) < needed)
      throw ValueError(path + ": " + std::to_string(corpus->train.size()) +
                       " training bytes are too few for " + std::to_string(t.batch) +
                       " streams of one chunk of " + std::to_string(t.chunk) + " bytes plus one (" +
                       std::to_string(needed) + "); use a longer text or a smaller --text-chunk");
  }

  const int64_t length = stream::recall_sequence_length(task);
  const int64_t distance = task.gap + 1;  // from the last value to the first query
  out << "Associative recall beyond the window (docs/far-field.md)\n"
      << "  task      " << task.pairs << " key-value pairs (keys from " << task.keys
      << " tokens, values from " << task.values << "), " << task.gap << " filler tokens, then "
      << task.queries << " of the keys again: " << length << " tokens per sequence\n"
      << "            the last pair lies " << distance
      << " tokens before the first query; the window is " << o.window
      << (distance >= o.window ? " (every pair has left it)"
                               : " (so some pairs are still inside it)")
      << "\n";
  // Tokens join the far field when they are evicted, at the end of a chunk
  // (docs/mechanisms.md#moment-closure-far-field): the pairs are all there when the chunk holding the first query
  // starts at least a window after them.
  const int64_t first_query = 2 * task.pairs + task.gap;
  if (first_query / o.chunk * o.chunk - o.window < 2 * task.pairs)
    out << "            note: with chunks of " << o.chunk
        << ", some pairs are not yet evicted into moment-closure's far field when the first "
           "query comes\n";
  out << "  model     d_model " << o.d_model << ", " << o.n_layer
      << (o.n_layer == 1 ? " layer, " : " layers, ") << o.n_head
      << (o.n_head == 1 ? " head" : " heads") << ", chunks of " << o.chunk
      << " tokens; moment-closure: up to " << o.max_clusters
      << " clusters per layer and head, "
      << (o.cluster_rule == ClusterRule::kBudget ? std::string("budget rule")
                                                 : "birth threshold " + num(o.birth_threshold))
      << "; moment-closure+outliers: " << o.outlier_capacity << " stored outliers per cluster"
      << "; frequent-directions: a sketch of " << o.sketch_rows << " rows per layer and head"
      << "; tensor-sketch: degree " << o.sketch_degree << ", width " << o.sketch_dim << "\n"
      << "  training  " << o.steps << " steps of " << o.batch << " sequences (AdamW lr "
      << num(o.lr) << ", loss at the answers only), seed " << o.seed << ", " << o.threads
      << (o.threads == 1 ? " thread" : " threads") << "\n"
      << "  scoring   " << o.eval_sequences << " fresh sequences ("
      << o.eval_sequences * task.queries << " answers)\n\n"
      << std::flush;

  std::vector<stream::RecallResult> results;
  for (const std::string& mechanism : r.mechanisms) {
    ProgressBar bar(std::cerr);
    const auto start = std::chrono::steady_clock::now();
    const double tokens_per_step = static_cast<double>(o.batch * (length - 1));
    try {
      results.push_back(stream::run_recall(mechanism, o, [&](int64_t step, double loss) {
        stream::Progress p;
        p.step = step;
        p.steps = o.steps;
        p.loss = loss;
        p.elapsed_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        p.tokens_per_second = p.elapsed_seconds > 0
                                  ? tokens_per_step * static_cast<double>(step) / p.elapsed_seconds
                                  : 0.0;
        p.eta_seconds =
            p.elapsed_seconds / static_cast<double>(step) * static_cast<double>(o.steps - step);
        bar.update(p);
      }));
    } catch (...) {
      bar.finish();
      throw;
    }
    bar.finish();
  }
  const double chance = 1.0 / static_cast<double>(task.values);
  out << "Recall (held out; chance: accuracy 1/" << task.values << " = " << fixed(chance, 4)
      << ", cross-entropy ln " << task.values << " = " << fixed(std::log(task.values), 3)
      << " nats)\n"
      << "  " << pad("mechanism", kMechanismColumn) << right("accuracy", 9) << right("answer CE", 11)
      << right("chance", 8) << right("state bytes", 13) << right("train s", 9) << "\n";
  for (const stream::RecallResult& x : results)
    out << "  " << pad(x.mechanism, kMechanismColumn) << right(fixed(x.accuracy, 3), 9)
        << right(fixed(x.cross_entropy, 3), 11) << right(fixed(chance, 4), 8)
        << right(std::to_string(x.state_bytes), 13) << right(fixed(x.seconds, 1), 9) << "\n";
  const int64_t answers = o.eval_sequences * task.queries;
  const double noise = std::sqrt(chance * (1.0 - chance) / static_cast<double>(answers));
  out << "  (" << answers << " answers: at chance the accuracy's standard error is "
      << fixed(noise, 3) << ". State bytes: what one stream carries at the end of a " << length
      << "-token sequence; every mechanism but full attention stays at that size however long the "
         "stream, full attention grows with every token)\n";
  const auto find = [&](const std::string& name) -> const stream::RecallResult* {
    for (const auto& x : results)
      if (x.mechanism == name) return &x;
    return nullptr;
  };
  const stream::RecallResult* window = find("window");
  const stream::RecallResult* mca = find("moment-closure");
  const stream::RecallResult* full = find("full");
  if (window && mca) {
    out << "  The far field adds " << fixed(mca->accuracy - window->accuracy, 3)
        << " accuracy to the window at the same window size";
    if (full && full->accuracy - window->accuracy > 4.0 * noise)
      out << "; full attention adds " << fixed(full->accuracy - window->accuracy, 3)
          << " (moment-closure recovers "
          << fixed(100.0 * (mca->accuracy - window->accuracy) / (full->accuracy - window->accuracy),
                   0)
          << "% of that)";
    out << ".\n";
  }
  out << std::flush;

  if (r.text_steps == 0) return kExitOk;
  const stream::TrainOptions shown = text_options(r, "window");
  out << "\nHeld-out text: " << path << " (" << corpus->train.size()
      << " bytes for training, the last " << corpus->heldout.size()
      << " held out); each mechanism trains " << shown.steps << " steps of " << shown.batch
      << " streams x " << shown.chunk << " bytes (lm train with the model flags "
      << "above, AdamW lr " << num(shown.lr) << " with cosine decay), then scores the held-out "
      << "bytes as one stream\n\n"
      << std::flush;
  struct TextResult {
    std::string mechanism;
    stream::TrainSummary summary;
  };
  std::vector<TextResult> text;
  for (const std::string& name : r.mechanisms) {
    ProgressBar bar(std::cerr);
    TextResult t;
    t.mechanism = name;
    try {
      t.summary = stream::train(
          text_options(r, name), corpus->train, "", "",
          [&bar](const stream::Progress& p) { bar.update(p); }, corpus->heldout);
    } catch (...) {
      bar.finish();
      throw;
    }
    bar.finish();
    text.push_back(std::move(t));
  }
  out << "Text (held out; lower is better; a uniform guess is 8 bits per byte)\n"
      << "  " << pad("mechanism", kMechanismColumn) << right("bits/byte", 10) << right("state bytes", 13)
      << right("train s", 9) << "\n";
  for (const TextResult& t : text)
    out << "  " << pad(t.mechanism, kMechanismColumn) << right(fixed(t.summary.heldout->bits_per_token, 4), 10)
        << right(std::to_string(t.summary.heldout->state_bytes), 13)
        << right(fixed(t.summary.seconds, 1), 9) << "\n";
  out << "  (state bytes: one stream at the end of the " << corpus->heldout.size()
      << " held-out bytes)\n";
  for (const TextResult& t : text)
    if (!t.summary.heldout->far_field.empty()) {
      out << "  moment-closure far field on the held-out text (at most " << r.options.max_clusters
          << " clusters):\n";
      print_far_field(out, t.summary.heldout->far_field, "    ", 1);
    }
  return kExitOk;
}

// ---- lm memory-bench -----------------------------------------------------------------------------

/// The settings a sweep's runs depend on (model and training), as --json records them.
nlohmann::json memory_bench_settings(const stream::MemoryBenchOptions& o) {
  const stream::RecallRunOptions& t = o.training;
  return {{"model", {{"d_model", t.d_model}, {"n_layer", t.n_layer}, {"n_head", t.n_head},
                     {"window", t.window}, {"chunk", t.chunk}, {"max_clusters", t.max_clusters},
                     {"birth_threshold", t.birth_threshold},
                     {"cluster_rule", cluster_rule_name(t.cluster_rule)}, {"outlier_capacity", t.outlier_capacity},
                     {"sketch_rows", t.sketch_rows}, {"sketch_dim", t.sketch_dim}, {"sketch_degree", t.sketch_degree}}},
          {"training", {{"steps", t.steps}, {"batch", t.batch}, {"lr", t.lr}, {"eval_sequences", t.eval_sequences},
                        {"keys", t.task.keys}, {"values", t.task.values}, {"filler", t.task.filler},
                        {"mqar_pairs", o.mqar_pairs}, {"threads", t.threads}}}};
}

/// The --json file of a sweep: its settings, then its runs and cases (memory_bench_record), keys in sorted order.
nlohmann::json memory_bench_json(const stream::MemoryBenchOptions& o, const std::vector<stream::MemoryBenchRun>& runs) {
  nlohmann::json out = memory_bench_settings(o);
  const auto record = nlohmann::json::parse(stream::memory_bench_record({runs, stream::memory_bench_cases(o, runs)}).dump());
  out["runs"] = record["runs"];
  out["cases"] = record["cases"];
  return out;
}

/// The runs a sweep written to `path` finished. @throws ValueError naming the file when it cannot be read as one,
/// or when it was written with other settings (its runs would not be this sweep's).
std::vector<stream::MemoryBenchRun> finished_runs(const std::string& path, const stream::MemoryBenchOptions& o) {
  using nlohmann::json;
  check_input_file(path, "the benchmark results");
  std::ifstream in(path);
  if (!in) throw_io_error(path, "cannot open the benchmark results to resume", errno);
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {
    throw ValueError(path + ": not the JSON of lm memory-bench: " + e.what());
  }
  const json settings = memory_bench_settings(o);
  for (const char* part : {"model", "training"})
    if (!doc.is_object() || !doc.contains(part) || doc[part] != settings[part])
      throw ValueError(path + ": --resume: written with other " + part + " settings (" +
                       (doc.is_object() && doc.contains(part) ? doc[part].dump() : std::string("none")) + ", now " +
                       settings[part].dump() + "); rerun without --resume or with the same flags");
  try {
    return stream::memory_bench_runs(doc.at("runs"));
  } catch (const json::exception& e) {
    throw ValueError(path + ": runs: " + e.what());
  }
}

int run_memory_bench(const LmMemoryBenchRequest& r) {
  std::ostream& out = std::cout;
  const stream::MemoryBenchOptions& o = r.options;
  stream::validate(o);  // before anything trains or is written
  stream::MemoryBenchHooks hooks;
  if (r.resume) hooks.done = finished_runs(r.json, o);
  if (!r.json.empty()) check_output_path(r.json, "the benchmark results", {}, "--json");
  const stream::RecallRunOptions& t = o.training;
  out << "Memory benchmark (docs/far-field.md)\n"
      << "  model     d_model " << t.d_model << ", " << t.n_layer << (t.n_layer == 1 ? " layer, " : " layers, ")
      << t.n_head << (t.n_head == 1 ? " head" : " heads") << ", chunks of " << t.chunk << " tokens, window "
      << t.window << " (window, moment-closure, the sketches), up to " << t.max_clusters
      << " clusters (moment-closure, " << cluster_rule_name(t.cluster_rule) << " rule), "
      << t.outlier_capacity << " stored outliers per cluster (moment-closure+outliers), sketches of "
      << t.sketch_rows << " rows (frequent-directions), degree-" << t.sketch_degree << " sketches of width "
      << t.sketch_dim << " (tensor-sketch)\n"
      << "  training  " << t.steps << " steps of " << t.batch << " sequences per run (AdamW lr " << num(t.lr)
      << ", loss at the answers only), " << t.threads << (t.threads == 1 ? " thread" : " threads") << "\n"
      << "  scoring   " << t.eval_sequences << " fresh sequences per run\n\n"
      << std::flush;
  if (r.resume) out << "  resuming " << hooks.done.size() << " finished runs of " << r.json << "\n\n";
  ProgressBar bar(std::cerr);
  auto start = std::chrono::steady_clock::now();
  double tokens_per_step = 0.0;
  hooks.on_run = [&](int64_t index, int64_t total, const stream::MemoryBenchRun& run) {
    bar.finish();
    std::cerr << "run " << index << "/" << total << ": " << run.task << " (" << run.setting << "), "
              << run.result.mechanism << ", seed " << run.seed << "\n";
    start = std::chrono::steady_clock::now();
    tokens_per_step = static_cast<double>(t.batch * (run.length - 1));
  };
  hooks.on_step = [&](int64_t step, double loss) {
    stream::Progress p;
    p.step = step;
    p.steps = t.steps;
    p.loss = loss;
    p.elapsed_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    p.eta_seconds = p.elapsed_seconds / static_cast<double>(step) * static_cast<double>(t.steps - step);
    p.tokens_per_second =
        p.elapsed_seconds > 0 ? tokens_per_step * static_cast<double>(step) / p.elapsed_seconds : 0.0;
    bar.update(p);
  };
  // Every finished run goes to --json at once (atomically): a sweep that stops keeps it, and --resume reuses it.
  if (!r.json.empty())
    hooks.on_result = [&](const stream::MemoryBenchReport& so_far) {
      write_file_atomically(r.json, memory_bench_json(o, so_far.runs).dump(2) + "\n", "the benchmark results");
    };
  const auto report = stream::run_memory_benchmark(o, hooks);
  bar.finish();
  out << "Results (accuracy at the answers, mean over " << o.seeds.size()
      << (o.seeds.size() == 1 ? " seed" : " seeds") << "; share: of full attention's gain over the window)\n"
      << "  " << pad("task", 9) << pad("setting", 22) << pad("mechanism", kMechanismColumn) << right("accuracy", 9)
      << right("range", 14) << right("answer CE", 11) << right("chance", 8) << right("state bytes", 13)
      << right("train s", 9) << right("share", 8) << "\n";
  for (const auto& c : report.cases) {
    const std::string range =
        c.seeds > 1 ? fixed(c.accuracy_min, 3) + "-" + fixed(c.accuracy_max, 3) : std::string("-");
    out << "  " << pad(c.task, 9) << pad(c.setting, 22) << pad(c.mechanism, kMechanismColumn) << right(fixed(c.accuracy, 3), 9)
        << right(range, 14) << right(fixed(c.cross_entropy, 3), 11) << right(fixed(c.chance, 4), 8)
        << right(std::to_string(c.state_bytes), 13) << right(fixed(c.seconds, 1), 9)
        << right(c.share_of_full_gain ? fixed(100.0 * *c.share_of_full_gain, 0) + "%" : std::string("-"), 8)
        << "\n";
  }
  out << "  (state bytes: what one stream carries at the end of one sequence; every mechanism but full "
         "attention stays at that size however long the stream, full attention grows with every token. share: "
         "shown where window and full attention ran on the case and full attention beat the window by more than "
         "four standard errors of a guess at chance)\n";
  if (!r.json.empty())
    out << "  wrote " << r.json << " (" << report.runs.size() << " runs, " << report.cases.size() << " cases)\n";
  out << std::flush;
  return kExitOk;
}

}  // namespace

}  // namespace attnmix::cli

/// The plugin's copy of the library records its own atomic writes (checkpoints): the executable's
/// signal handler calls this too (commands/lm.cpp registers it on loading). Async-signal-safe.
extern "C" bool attnmix_lm_remove_pending_temporary_file() noexcept {
  return attnmix::remove_pending_temporary_file();
}

extern "C" const attnmix::cli::LmPlugin* attnmix_lm_plugin() {
  static const attnmix::cli::LmPlugin plugin = [] {
    attnmix::cli::LmPlugin p;
    p.train = &attnmix::cli::run_train;
    p.eval = &attnmix::cli::run_eval;
    p.generate = &attnmix::cli::run_generate;
    p.recall = &attnmix::cli::run_recall;
    p.memory_bench = &attnmix::cli::run_memory_bench;
    p.demo = &attnmix::cli::demo_lm_section;
    return p;
  }();
  return &plugin;
}
