// SPDX-License-Identifier: Apache-2.0
// `attnmix lm train|eval|generate|recall`: the streaming byte-level language model of
// docs/mechanisms.md#streaming-language-model and #moment-closure-far-field on a text file, and the far-field
// evaluation (associative recall beyond the window). This file parses and checks the command line (every default comes
// from the library's options structs in the torch-free headers stream/language_model.hpp and stream/far_field.hpp) and
// hands the request to the language-model plugin attnmix-lm.so (lm_plugin.hpp, lm_run.cpp), which it loads only
// then, so that no other command pays libtorch's start-up. In a build without libtorch, or when the
// plugin cannot be loaded, `attnmix lm` exists and fails with exit code 2, saying why. docs/lm.md
// describes the commands and the checkpoint format, docs/far-field.md the recall evaluation.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "cli_support.hpp"
#include "number_checks.hpp"
#include "commands/commands.hpp"
#include "commands/demo_sections.hpp"
#include "commands/lm_flags.hpp"
#include "commands/lm_plugin.hpp"

namespace attnmix::cli {

using namespace attnmix::stream;  // the streaming models this file exposes

namespace {

#ifdef ATTNMIX_LM_PLUGIN
/// The plugin: attnmix-lm.so beside the executable, else where this build put it. Loaded once;
/// never unloaded (libtorch's static state lives until exit).
const LmPlugin& lm_plugin() {
  static const LmPlugin* plugin = [] {
    std::vector<std::string> candidates;
    std::error_code error;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
    if (!error) candidates.push_back((self.parent_path() / ATTNMIX_LM_PLUGIN).string());
    candidates.emplace_back(ATTNMIX_LM_PLUGIN_BUILD_PATH);
    std::string tried;
    for (const std::string& path : candidates) {
      if (!std::filesystem::exists(path, error)) {
        tried += (tried.empty() ? "" : ", ") + path;
        continue;
      }
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!handle)
        throw std::runtime_error("cannot load the language-model plugin " + path + ": " +
                                 ::dlerror());
      using Entry = const LmPlugin* (*)();
      const auto entry = reinterpret_cast<Entry>(::dlsym(handle, "attnmix_lm_plugin"));
      const LmPlugin* p = entry ? entry() : nullptr;
      // The plugin's own copy of the library's interrupted-write cleanup (cli_support.hpp).
      if (void* cleanup = ::dlsym(handle, "attnmix_lm_remove_pending_temporary_file"))
        add_temporary_file_cleanup(reinterpret_cast<TemporaryFileCleanup>(cleanup));
      if (!p || p->version != kLmPluginVersion || p->train_request_size != sizeof(LmTrainRequest) ||
          p->eval_request_size != sizeof(LmEvalRequest) ||
          p->generate_request_size != sizeof(LmGenerateRequest) ||
          p->recall_request_size != sizeof(LmRecallRequest) ||
          p->memory_bench_request_size != sizeof(LmMemoryBenchRequest))
        throw std::runtime_error("the language-model plugin " + path +
                                 " does not match this attnmix executable; rebuild both");
      return p;
    }
    throw std::runtime_error("the language-model plugin (" + std::string(ATTNMIX_LM_PLUGIN) +
                             ") is missing: looked for " + tried + "; rebuild attnmix");
  }();
  return *plugin;
}
#else
[[noreturn]] const LmPlugin& lm_plugin() {
  throw std::runtime_error(
      "attnmix lm needs libtorch, and this attnmix was built without it "
      "(ATTNMIX_WITH_TORCH=OFF). Install libtorch-dev (scripts/install-deps.sh does) and "
      "rebuild.");
}
#endif

/// The long names of the options given on the command line ("--d-model", ...).
std::vector<std::string> given_options(const CLI::App* cmd) {
  std::vector<std::string> names;
  for (const CLI::Option* option : cmd->get_options())
    if (option->count() > 0) names.push_back(option->get_name());
  return names;
}

bool has(const std::vector<std::string>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

int run_train(LmTrainRequest& r, const CLI::App* cmd) {
  r.given = given_options(cmd);
  // With --resume and no --mechanism the checkpoint decides; the plugin checks the flags then.
  if (has(r.given, "--mechanism") || r.resume.empty())
    for (const auto& option : stream::train_option_table())
      if (option.only_for && *option.only_for != r.options.model.mechanism && has(r.given, option.flag))
        throw UsageError(std::string(option.flag) + " applies only to --mechanism " +
                         stream::mechanism_name(*option.only_for));
  if (r.options.checkpoint_every > 0 && r.out.empty())
    throw UsageError("--checkpoint-every needs --out FILE (where the periodic checkpoints go)");
  if (!(r.holdout >= 0.0 && r.holdout < 1.0))
    throw UsageError("--holdout must lie in [0, 1) (got " + format_short(r.holdout) + ")");
  if (r.options.eval_every > 0 && r.holdout == 0.0)
    throw UsageError("--eval-every needs a held-out part (--holdout F with F > 0)");
  r.options.threads = capped_threads(r.options.threads);
  return lm_plugin().train(r);
}

void add_train(CLI::App* lm_cmd, int& exit_code) {
  auto request = std::make_shared<LmTrainRequest>();
  LmTrainRequest& r = *request;
  CLI::App* cmd = lm_cmd->add_subcommand(
      "train", "Train a byte-level streaming language model on a text file and save a checkpoint");
  cmd->footer(
      std::string("Data: the bytes of --text (default ") + kDefaultCorpus +
      "); the last --holdout fraction is held out and scored at the end (and every --eval-every "
      "steps). The training bytes are "
      "cut into --batch contiguous streams; step s feeds every stream its next chunk of --chunk "
      "bytes (after one pass the streams start again, with a fresh state) and the model predicts "
      "each byte from those before it.\n"
      "Output: a progress bar on stderr (step, tokens/s, loss in nats per byte, ETA; on a "
      "terminal it redraws one line, otherwise a line every 5% of the steps), then a summary on "
      "stdout. The checkpoint (model, optimizer, carried state, step) is written atomically at "
      "the end and every --checkpoint-every steps; a run that fails before that leaves --out "
      "untouched.\n"
      "--resume CKPT continues a checkpoint on the same --text and --holdout up to --steps "
      "(default: the checkpoint's): the result equals the uninterrupted run bit for bit (same "
      "--threads, unchanged --steps). The checkpoint fixes every other setting; a repeated flag "
      "must agree with it.\n"
      "Exit codes: 0 ok, 1 usage, 2 data/I/O/validation error. See docs/lm.md.");
  cmd->add_option("--text", r.text,
                  std::string("Training text (any bytes; default ") + kDefaultCorpus + ")")
      ->type_name("FILE");
  cmd->add_option("--holdout", r.holdout,
                  "Fraction of the text, at its end, held out for the final evaluation (0: none)")
      ->capture_default_str();
  cmd->add_option("--out", r.out, "Where to write the checkpoint (default: not written)")
      ->type_name("CKPT");
  cmd->add_option("--resume", r.resume, "Continue training this checkpoint")->type_name("CKPT");
  cmd->add_option("--history", r.history,
                  "Also write one JSON line per step of this run (step, loss in nats per byte, tokens_per_second, "
                  "elapsed_seconds; moment-closure, per layer: clusters (live clusters), bank_mass (tokens the clusters "
                  "summarise) and far_share (the far field's share of the attention); every --eval-every steps "
                  "heldout_bits_per_byte) and, with a held-out part, a last line with the final model's held-out "
                  "bits per byte; for plots (attnmix.plot.lm_history)")
      ->type_name("FILE");
  add_table_flags(cmd, r.options, stream::train_option_table());
  cmd->callback([request, cmd, &exit_code] { exit_code = run_train(*request, cmd); });
}

void add_eval(CLI::App* lm_cmd, int& exit_code) {
  auto r = std::make_shared<LmEvalRequest>();
  r->threads = stream::TrainOptions{}.threads;
  CLI::App* cmd = lm_cmd->add_subcommand(
      "eval", "Score a text under a checkpoint: mean cross-entropy and bits per byte");
  cmd->footer(
      "Streams the bytes of --text through the model (one stream, chunks of --chunk bytes; the "
      "result does not depend on the chunk size beyond rounding) and reports the mean "
      "cross-entropy of each byte given those before it, in nats and in bits.\n"
      "With --holdout F only the last F of the text is scored: the part `lm train --holdout F` "
      "held out.\nExit codes: 0 ok, 1 usage, 2 data/I/O error (a missing or malformed "
      "checkpoint).");
  cmd->add_option("--checkpoint", r->checkpoint, "A checkpoint written by lm train")
      ->required()
      ->type_name("CKPT");
  cmd->add_option("--text", r->text, std::string("Text to score (default ") + kDefaultCorpus + ")")
      ->type_name("FILE");
  cmd->add_option("--holdout", r->holdout,
                  "Score only this final fraction of the text (0: all of it)")
      ->capture_default_str();
  cmd->add_option("--chunk", r->chunk, "Bytes per step (default: the checkpoint's --chunk)")
      ->check(kPositive);
  cmd->add_option("--threads", r->threads, "libtorch intra-op threads (at most the hardware threads)")
      ->check(kPositive)
      ->capture_default_str();
  for (const auto& option : stream::generate_option_table())
    if (option.name == "window_cache") add_option_flag(cmd, r->window_cache, option);
  cmd->callback([r, &exit_code] {
    if (!(r->holdout >= 0.0 && r->holdout < 1.0))
      throw UsageError("--holdout must lie in [0, 1) (got " + format_short(r->holdout) + ")");
    r->threads = capped_threads(r->threads);
    exit_code = lm_plugin().eval(*r);
  });
}

void add_recall(CLI::App* lm_cmd, int& exit_code) {
  auto r = std::make_shared<LmRecallRequest>();
  stream::RecallRunOptions& o = r->options;
  o.steps = kDefaultRecallSteps;
  r->mechanisms = stream::kSequenceMechanisms;
  CLI::App* cmd = lm_cmd->add_subcommand(
      "recall",
      "What the far field is for: associative recall beyond the window, and held-out bits per "
      "byte, for window, moment-closure, linear and full attention");
  cmd->footer(
      "Recall task: each sequence stores --pairs key-value pairs, then --gap filler tokens, then "
      "asks --queries of the keys again; the model must name each one's value. With --gap at "
      "least --window - 1 every pair has left the window before the first query: window "
      "attention can only guess (chance 1/--values), full attention can look back, "
      "moment-closure must recall through its far-field clusters (moment-closure+outliers also "
      "through the --outliers worst-fitting evicted tokens it keeps exactly) and linear attention through "
      "its running sums. Every mechanism starts from "
      "the same parameters and sees the same sequences; the table gives the accuracy and "
      "cross-entropy at the answers of --eval-sequences fresh sequences, the state carried at the "
      "end of one sequence, and the training time.\n"
      "Then (unless --text-steps 0) each mechanism trains as `lm train` would (8 streams, "
      "--text-steps steps of --text-chunk bytes, --text-lr) with the same model flags, on "
      "--text with its last --holdout held out, and the held-out bits per byte are compared.\n"
      "Exit codes: 0 ok, 1 usage, 2 data/validation error. See "
      "docs/far-field.md.");
  cmd->add_option("--mechanisms", r->mechanisms, "Mechanisms to compare, in order")
      ->delimiter(',')
      ->check(CLI::IsMember(stream::kSequenceMechanisms))
      ->capture_default_str();
  add_table_flags(cmd, o, stream::recall_option_table());
  cmd->add_option(
         "--text", r->text,
         std::string("Text of the bits-per-byte comparison (default ") + kDefaultCorpus + ")")
      ->type_name("FILE");
  cmd->add_option("--holdout", r->holdout, "Final fraction of --text held out and scored")
      ->capture_default_str();
  cmd->add_option("--text-steps", r->text_steps,
                  "Training steps of each text run (8 streams; 0: no text comparison)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--text-chunk", r->text_chunk,
                  "Bytes per stream per step of the text runs (default: --chunk)")
      ->check(kPositive);
  cmd->add_option("--text-lr", r->text_lr,
                  "Peak learning rate of the text runs (AdamW, cosine decay to a tenth)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->callback([r, &exit_code] {
    if (r->text_steps > 0 && !(r->holdout > 0.0 && r->holdout < 1.0))
      throw UsageError("--holdout must lie in (0, 1) (got " + format_short(r->holdout) + ")");
    if (r->mechanisms.empty()) throw UsageError("--mechanisms needs at least one mechanism");
    r->options.threads = capped_threads(r->options.threads);
    exit_code = lm_plugin().recall(*r);
  });
}

void add_memory_bench(CLI::App* lm_cmd, int& exit_code) {
  auto r = std::make_shared<LmMemoryBenchRequest>();
  stream::MemoryBenchOptions& b = r->options;
  b.training.steps = kDefaultRecallSteps;
  CLI::App* cmd = lm_cmd->add_subcommand(
      "memory-bench",
      "How much each mechanism remembers: accuracy against the distance to the evidence, the "
      "load on the memory and the state carried");
  cmd->footer(
      "For every task setting, mechanism and seed, trains a fresh model (the same initial "
      "parameters and sequences for every mechanism of a seed) and scores --eval-sequences fresh "
      "sequences at their answers. Tasks: recall (--pairs key-value pairs, --gap filler tokens, "
      "then every key asked again), mqar (multi-query associative recall: --mqar-pairs pairs, then "
      "the queries spread over a sequence of each --mqar-lengths) and passkey (a 5-digit key hidden "
      "at a random depth in filler text of each --passkey-lengths bytes, asked at the end). The "
      "table gives per case the mean accuracy over the seeds (with its range when several), the "
      "answer cross-entropy, chance, the state one stream carries at the end of a sequence, the "
      "training time and the share of full attention's gain over the window that the mechanism "
      "recovers. --json FILE writes every run and case, rewritten (atomically) after every run, so a sweep "
      "that stops keeps what it finished; --resume continues such a sweep, reusing the runs --json holds "
      "(written with the same model and training settings) and training only the rest.\n"
      "Exit codes: 0 ok, 1 usage, 2 data/validation error. See docs/far-field.md.");
  add_table_flags(cmd, b, stream::memory_bench_option_table());
  cmd->add_option("--json", r->json, "Also write every run and case to this file (JSON), after every run")
      ->type_name("FILE");
  cmd->add_flag("--resume", r->resume, "Reuse the finished runs of --json FILE (same settings) and train the rest");
  cmd->callback([r, &exit_code] {
    if (r->resume && r->json.empty()) throw UsageError("--resume needs --json FILE: the sweep to continue");
    r->options.training.threads = capped_threads(r->options.training.threads);
    exit_code = lm_plugin().memory_bench(*r);
  });
}

void add_generate(CLI::App* lm_cmd, int& exit_code) {
  auto r = std::make_shared<LmGenerateRequest>();
  CLI::App* cmd = lm_cmd->add_subcommand(
      "generate", "Continue a prompt by sampling bytes from a checkpoint's model");
  cmd->footer(
      "Prints the prompt followed by the sampled bytes, then a newline, on stdout. The same "
      "--seed gives the same text (same --threads).\nExit codes: 0 ok, 1 usage, 2 data/I/O "
      "error.");
  cmd->add_option("--checkpoint", r->checkpoint, "A checkpoint written by lm train")
      ->required()
      ->type_name("CKPT");
  cmd->add_option("--prompt", r->prompt, "Text to continue (its bytes are the first tokens)")
      ->required();
  add_table_flags(cmd, r->options, stream::generate_option_table());
  cmd->callback([r, &exit_code] {
    if (r->prompt.empty()) throw UsageError("--prompt must not be empty (the model continues it)");
    r->options.threads = capped_threads(r->options.threads);
    exit_code = lm_plugin().generate(*r);
  });
}

}  // namespace

void add_lm_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "lm",
      "Streaming byte-level language models (docs/lm.md): train, eval, generate; recall (the far "
      "field against the window); memory-bench (memory against distance, load and state)");
#ifdef ATTNMIX_LM_PLUGIN
  cmd->require_subcommand(1);
#else
  // Without libtorch even a bare `attnmix lm` says what is missing (exit code 2).
  cmd->require_subcommand(0, 1);
  cmd->callback([cmd] {
    if (cmd->get_subcommands().empty()) (void)lm_plugin();
  });
#endif
  add_train(cmd, exit_code);
  add_eval(cmd, exit_code);
  add_generate(cmd, exit_code);
  add_recall(cmd, exit_code);
  add_memory_bench(cmd, exit_code);
}

void demo_streaming_language_model(std::ostream& out, DemoFigures* figures) {
  const LmPlugin* plugin = nullptr;
  try {
    plugin = &lm_plugin();
  } catch (const std::exception& e) {
    out << "Skipped: " << e.what() << "\n";
    return;
  }
  std::string history;
  plugin->demo(out, figures != nullptr ? &history : nullptr);
  if (figures != nullptr && !history.empty()) figures->add_history("language_model", std::move(history));
}

}  // namespace attnmix::cli
