// SPDX-License-Identifier: Apache-2.0
// Demo section: the streaming byte-level language model of docs/mechanisms.md#streaming-language-model (`attnmix lm`).
// Trains the sliding-window spine (window 32, d_model 32, 2 layers, 2 heads) for 100 steps of 8 streams × 64
// bytes (AdamW, lr 0.02 with cosine decay, one update per chunk) on the GNU GPL v3 that every
// Debian system carries, with its last 10 % held out; prints the loss falling and the held-out bits
// per byte against a context-free byte-frequency model and a uniform guess. About 5 s on one core.
// Then what moment-closure's far field is for: a small associative-recall task whose key-value
// pairs have left an 8-token window before they are asked for, trained 150 steps each with window,
// moment-closure and full attention (stream::run_recall; about 25 s of CPU on one core). The full
// comparison is `attnmix lm recall` (docs/far-field.md).
// Part of the language-model plugin (lm_plugin.hpp); `attnmix demo` reaches it through
// demo_streaming_language_model (lm.cpp), which says so when the plugin or the text is missing.
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "attnmix/stream/far_field.hpp"
#include "cli_support.hpp"
#include "commands/lm_support.hpp"

namespace attnmix::cli {

namespace {

constexpr int64_t kSteps = 100;
constexpr double kLr = 0.02;
constexpr int64_t kWindow = 32;
constexpr int64_t kReportEvery = 10;

/// The recall comparison: a small version of `attnmix lm recall` (2 pairs of 8 keys and 8 values,
/// 12 filler tokens, a window and chunks of 8) that shows the far field within the demo's time.
stream::RecallRunOptions demo_recall_options() {
  stream::RecallRunOptions o;
  o.task.keys = 8;
  o.task.values = 8;
  o.task.pairs = 2;
  o.task.queries = 2;
  o.task.gap = 12;
  o.window = 8;
  o.chunk = 8;
  o.steps = 150;
  o.lr = 0.01;
  o.eval_sequences = 256;
  return o;
}

/// Bits per byte of the held-out bytes (each after the first, as the model scores them) under the
/// training bytes' frequencies with add-one smoothing: what a model without context achieves.
double byte_frequency_bits(const std::vector<int64_t>& train, const std::vector<int64_t>& heldout) {
  std::array<double, 256> count{};
  count.fill(1.0);
  for (const int64_t b : train) count[static_cast<size_t>(b)] += 1.0;
  const double total = std::accumulate(count.begin(), count.end(), 0.0);
  double bits = 0.0;
  for (size_t i = 1; i < heldout.size(); ++i)
    bits -= std::log2(count[static_cast<size_t>(heldout[i])] / total);
  return bits / static_cast<double>(heldout.size() - 1);
}

std::string fixed(double x, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}

/// Pads on the right to `width` columns.
std::string pad(std::string text, size_t width) {
  if (text.size() < width) text.resize(width, ' ');
  return text;
}

void demo_far_field(std::ostream& out) {
  const stream::RecallRunOptions o = demo_recall_options();
  const stream::RecallTaskOptions& t = o.task;
  out << "\nWhat a far field is for. The window forgets everything older than its last bytes. "
         "Moment-closure\nattention (lm train --mechanism moment-closure, "
         "docs/mechanisms.md#moment-closure-far-field)\nkeeps the window and adds, per layer, a few "
         "Gaussian clusters that summarise the keys and values\nevicted from it, attended through the "
         "same softmax. A recall task tests it: each sequence stores\n"
      << t.pairs << " key-value pairs, then " << t.gap << " filler tokens, then asks for the "
      << t.queries << " keys again; by then every pair has\nleft the " << o.window
      << "-token window. Window, moment-closure (at most " << o.max_clusters
      << " clusters) and full attention each\ntrain " << o.steps << " steps of " << o.batch
      << " sequences from the same start, then answer " << o.eval_sequences * t.queries
      << " questions about\nfresh sequences (chance: 1/" << t.values << " = "
      << fixed(1.0 / static_cast<double>(t.values), 3) << ").\n\n"
      << "  mechanism        accuracy  answer cross-entropy  state bytes (one stream)\n"
      << std::flush;
  std::vector<stream::RecallResult> results;  // window, moment-closure, full
  for (const char* name : {"window", "moment-closure", "full"}) {
    results.push_back(stream::run_recall(name, o));
    const stream::RecallResult& r = results.back();
    out << "  " << pad(name, 16) << " " << fixed(r.accuracy, 3) << "     "
        << fixed(r.cross_entropy, 3) << " nats            " << r.state_bytes << "\n"
        << std::flush;
  }
  const stream::RecallResult &window = results[0], &mca = results[1], &full = results[2];
  // Four standard errors of the accuracy at chance: what counts as "above chance" here.
  const double chance = 1.0 / static_cast<double>(t.values);
  const double noise =
      4.0 * std::sqrt(chance * (1.0 - chance) / static_cast<double>(o.eval_sequences * t.queries));
  out << "\nThe window can only guess; full attention looks back at the pairs; moment-closure, "
         "which sees\nthem only through its cluster statistics, "
      << (mca.accuracy > window.accuracy + noise
              ? (mca.accuracy < full.accuracy ? "recalls well above chance but below full attention"
                                              : "recalls as well as full attention")
              : "is here no better than the window")
      << ".\nIts state is bounded however long the stream, while full attention's grows with "
         "every token\n(here the sequences are only "
      << stream::recall_sequence_length(t) << " tokens long"
      << (full.state_bytes < mca.state_bytes ? ", so full attention's is still the smaller" : "")
      << ").\nThe full comparison, with held-out bits per byte on text: attnmix lm recall "
         "(docs/far-field.md).\n";
}

}  // namespace

void demo_lm_section(std::ostream& out, std::string* history) {
  if (!std::filesystem::exists(kDefaultCorpus)) {
    out << "Skipped: the language model trains on " << kDefaultCorpus
        << ", which this system does not have.\n";
    demo_far_field(out);  // needs no text
    return;
  }
  const LmCorpus corpus = read_lm_corpus(kDefaultCorpus, kDefaultHoldout);
  stream::TrainOptions options;  // the library's defaults, but for a shorter run
  options.model.mechanism = stream::Mechanism::kWindow;
  options.model.window = kWindow;
  options.steps = kSteps;
  options.lr = kLr;
  if (history != nullptr) options.eval_every = kReportEvery;  // the figure's held-out curve
  const stream::ModelConfig& m = options.model;
  out << "A small causal Transformer reads text one byte at a time, in chunks, and predicts each "
         "byte from\nthose before it. Each layer attends to the last "
      << m.window
      << " bytes only and carries their keys and values from\none chunk to the next, "
         "so its memory stays bounded however long the text. It trains on\n"
      << kDefaultCorpus << " (" << corpus.train.size() << " bytes; the last "
      << corpus.heldout.size() << " are held out)\nfor " << options.steps << " steps of "
      << options.batch << " streams x " << options.chunk << " bytes: d_model " << m.d_model << ", "
      << m.n_layer << " layers, " << m.n_head << " heads, AdamW lr " << format_short(options.lr)
      << " with cosine decay.\nThe loss is the mean cross-entropy of the next byte in nats (a "
         "uniform guess over 256 values: ln 256 = 5.55).\n\n";
  double block = 0.0;  // the sum of the losses since the last report
  const auto summary = stream::train(
      options, corpus.train, /*resume_from=*/"", /*out=*/"",
      [&out, &block, history](const stream::Progress& p) {
        if (history != nullptr) *history += history_line(p);
        block += p.loss;
        if (p.step % kReportEvery != 0 && p.step != p.steps) return;
        const int64_t first = (p.step - 1) / kReportEvery * kReportEvery + 1;
        char line[96];
        std::snprintf(line, sizeof line, "  steps %3lld-%-3lld  mean loss %6.3f nats per byte\n",
                      static_cast<long long>(first), static_cast<long long>(p.step),
                      block / static_cast<double>(p.step - first + 1));
        out << line << std::flush;
        block = 0.0;
      },
      corpus.heldout);
  const stream::Evaluation& e = *summary.heldout;
  if (history != nullptr) *history += heldout_history_line(summary.steps, e.bits_per_token);
  out << "\nThe training loss fell from " << fixed(summary.losses.front(), 2)
      << " nats per byte (first step) to " << fixed(summary.losses.back(), 2) << " (last step) in "
      << format_seconds(summary.seconds) << " s.\n"
      << "On the held-out text, which it never trained on (bits per byte, lower is better):\n"
      << "  this model                           " << fixed(e.bits_per_token, 2) << "\n"
      << "  byte frequencies alone (no context)  "
      << fixed(byte_frequency_bits(corpus.train, corpus.heldout), 2) << "\n"
      << "  a uniform guess over 256 values      8.00\n"
      << "It carries " << summary.state_bytes << " bytes of state for its " << options.batch
      << " streams, whatever the length of the text.\n"
      << "More: attnmix lm train --out lm.ckpt, then\n"
         "      attnmix lm generate --checkpoint lm.ckpt --prompt 'This License' (docs/lm.md).\n";
  demo_far_field(out);
}

}  // namespace attnmix::cli
