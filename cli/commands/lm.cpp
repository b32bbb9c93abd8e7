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
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "cli_support.hpp"
#include "number_checks.hpp"
#include "commands/commands.hpp"
#include "commands/demo_sections.hpp"
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

struct TrainArgs {
  LmTrainRequest request;
  std::string mechanism = stream::mechanism_name(stream::TrainOptions{}.model.mechanism);
  std::string schedule = stream::schedule_name(stream::TrainOptions{}.schedule);
  double merge_threshold = 0.0;  ///< --merge-threshold, when given
};

bool has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

/// Every --mechanism value of lm train (stream::parse_mechanism's names).
const std::vector<std::string> kMechanismNames = {"window", "moment-closure", "linear",
                                                  "frequent-directions", "tensor-sketch", "full"};

/// The flags of the moment-closure far field: meaningless for window and full attention.
constexpr const char* kFarFieldFlags[] = {"--max-clusters", "--birth-threshold",
                                          "--merge-threshold", "--outliers", "--cluster-rule"};

int run_train(TrainArgs& args, const CLI::App* cmd) {
  LmTrainRequest& r = args.request;
  r.options.model.mechanism = stream::parse_mechanism(args.mechanism);
  r.options.schedule = stream::parse_schedule(args.schedule);
  r.given = given_options(cmd);
  if (has(r.given, "--merge-threshold")) r.options.model.merge_threshold = args.merge_threshold;
  for (const char* flag : {"--birth-threshold", "--merge-threshold"}) {
    const double value = std::string(flag) == "--birth-threshold"
                             ? r.options.model.birth_threshold
                             : r.options.model.merge_threshold.value_or(0.0);
    if (has(r.given, flag) && !std::isfinite(value))
      throw UsageError(std::string(flag) + " must be a finite number");
  }
  // With --resume and no --mechanism the checkpoint decides; the plugin checks the flags then.
  const bool mechanism_known = has(r.given, "--mechanism") || r.resume.empty();
  if (mechanism_known && r.options.model.mechanism != stream::Mechanism::kMomentClosure)
    for (const char* flag : kFarFieldFlags)
      if (has(r.given, flag))
        throw UsageError(std::string(flag) +
                         " applies only to --mechanism moment-closure (the far field)");
  if (mechanism_known && r.options.model.mechanism != stream::Mechanism::kFrequentDirections &&
      has(r.given, "--sketch-rows"))
    throw UsageError("--sketch-rows applies only to --mechanism frequent-directions");
  for (const char* flag : {"--sketch-dim", "--sketch-degree"})
    if (mechanism_known && r.options.model.mechanism != stream::Mechanism::kTensorSketch && has(r.given, flag))
      throw UsageError(std::string(flag) + " applies only to --mechanism tensor-sketch");
  if (r.options.checkpoint_every > 0 && r.out.empty())
    throw UsageError("--checkpoint-every needs --out FILE (where the periodic checkpoints go)");
  if (!(r.holdout >= 0.0 && r.holdout < 1.0))
    throw UsageError("--holdout must lie in [0, 1) (got " + format_short(r.holdout) + ")");
  if (r.options.eval_every > 0 && r.holdout == 0.0)
    throw UsageError("--eval-every needs a held-out part (--holdout F with F > 0)");
  r.options.threads = capped_threads(r.options.threads);
  return lm_plugin().train(r);
}

/// --cluster-rule (moment-closure's births and merges) of lm train, lm recall and lm memory-bench.
void add_cluster_rule_flag(CLI::App* cmd, ClusterRule& rule) {
  static const std::map<std::string, ClusterRule> kNames{{"threshold", ClusterRule::kThreshold},
                                                          {"budget", ClusterRule::kBudget}};
  cmd->add_option("--cluster-rule", rule,
                  "moment-closure: how the far field founds and merges clusters: threshold (a chunk whose "
                  "mean key fits no cluster founds one; clusters closer than --merge-threshold merge) or "
                  "budget (every evicted chunk founds its own cluster; when --max-clusters are live the "
                  "closest two merge first; the thresholds are not used)")
      ->transform(CLI::CheckedTransformer(kNames))
      ->type_name("RULE")
      ->default_str(cluster_rule_name(rule));
}

void add_train(CLI::App* lm_cmd, int& exit_code) {
  auto args = std::make_shared<TrainArgs>();
  LmTrainRequest& r = args->request;
  stream::TrainOptions& o = r.options;
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
  cmd->add_option("--mechanism", args->mechanism,
                  "Attention: window (the last --window tokens, bounded state), full (every "
                  "token since the start of the pass), moment-closure (the window plus a "
                  "bounded far field of Gaussian clusters over the evicted tokens; "
                  "docs/mechanisms.md#moment-closure-far-field) or "
                  "linear (causal linear attention: running sums over every token, no window, "
                  "bounded state), frequent-directions (linear attention over the window exactly "
                  "and a Frequent Directions sketch of every evicted token, bounded state) or "
                  "tensor-sketch (a polynomial kernel over the window exactly and running sums over "
                  "a tensor sketch of every evicted token, bounded state)")
      ->check(CLI::IsMember(kMechanismNames))
      ->capture_default_str();
  cmd->add_option("--window", o.model.window,
                  "Tokens a query sees exactly (window and moment-closure)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--max-clusters", o.model.max_clusters,
                  "moment-closure: far-field clusters per layer, stream and head")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--birth-threshold", o.model.birth_threshold,
                  "moment-closure: a chunk of evicted tokens whose best cluster logit lies below "
                  "this on every head founds a new cluster (while fewer than --max-clusters live)")
      ->capture_default_str();
  cmd->add_option("--merge-threshold", args->merge_threshold,
                  "moment-closure: two clusters closer than this (RMS standardised distance of "
                  "their key means) merge (default: 2.65 + 6/sqrt(n) for the smaller count n)")
      ->type_name("FLOAT");
  add_cluster_rule_flag(cmd, o.model.cluster_rule);
  cmd->add_option("--outliers", o.model.outlier_capacity,
                  "moment-closure: per layer, stream and cluster, keep this many of the evicted "
                  "tokens the cluster predicts worst exactly (int8) and attend to them beside the "
                  "clusters (0: none)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--sketch-rows", o.model.sketch_rows,
                  "frequent-directions: rows of each layer's and head's sketch of the evicted "
                  "tokens (even, >= 4; the sketch keeps rows/2 - 1 directions after each shrink)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--sketch-dim", o.model.sketch_dim,
                  "tensor-sketch: width of each layer's and head's sketch")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--sketch-degree", o.model.sketch_degree,
                  "tensor-sketch: degree p of the kernel (q.k)^p the window computes and the sketch "
                  "estimates")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--d-model", o.model.d_model, "Width of the model")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--n-layer", o.model.n_layer, "Transformer layers")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--n-head", o.model.n_head,
                  "Attention heads (d_model / n_head must be an even integer)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--batch", o.batch, "Parallel streams")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--chunk", o.chunk, "Bytes per stream per step")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--steps", o.steps,
                  "Total steps (with --resume: the step to reach; default the checkpoint's)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--detach-horizon", o.detach_horizon,
                  "Chunks per optimizer update (truncated BPTT: gradients flow back over this "
                  "many chunks)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--lr", o.lr, "Peak learning rate (AdamW)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--min-lr-ratio", o.min_lr_ratio, "The cosine schedule ends at lr times this")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--schedule", args->schedule,
                  "Learning rate: cosine (decays over --steps) or constant")
      ->check(CLI::IsMember({"cosine", "constant"}))
      ->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "AdamW decoupled weight decay")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--clip", o.clip, "Maximum global gradient norm (0: no clipping)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seed of the initial parameters")->capture_default_str();
  cmd->add_option("--threads", o.threads,
                  "libtorch intra-op threads, at most the machine's hardware threads (results are "
                  "reproducible for a fixed count)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--checkpoint-every", o.checkpoint_every,
                  "Also write --out every this many steps (at whole updates; 0: only at the end)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--eval-every", o.eval_every,
                  "Also score the held-out part every this many steps (bits per byte in the progress and the "
                  "--history; the training is unchanged, its speed excludes the scoring; 0: only the final model)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->callback([args, cmd, &exit_code] { exit_code = run_train(*args, cmd); });
}

/// --window-cache of lm eval and lm generate.
void add_window_cache_flag(CLI::App* cmd, stream::WindowCache& cache) {
  static const std::map<std::string, stream::WindowCache> kNames{{"float32", stream::WindowCache::kFloat32},
                                                                 {"int8", stream::WindowCache::kInt8}};
  cmd->add_option("--window-cache", cache,
                  "How the window's keys and values are held between steps: float32 (default) or int8 "
                  "(one scale per token and head: about a quarter of the bytes; window, full and "
                  "moment-closure checkpoints)")
      ->transform(CLI::CheckedTransformer(kNames))
      ->type_name("KIND");
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
  add_window_cache_flag(cmd, r->window_cache);
  cmd->callback([r, &exit_code] {
    if (!(r->holdout >= 0.0 && r->holdout < 1.0))
      throw UsageError("--holdout must lie in [0, 1) (got " + format_short(r->holdout) + ")");
    r->threads = capped_threads(r->threads);
    exit_code = lm_plugin().eval(*r);
  });
}

/// The model and training flags of `lm recall` and `lm memory-bench` (stream::RecallRunOptions).
void add_recall_model_flags(CLI::App* cmd, stream::RecallRunOptions& o) {
  cmd->add_option("--window", o.window,
                  "Tokens a query sees exactly (window, moment-closure and the sketches; linear and full "
                  "have none)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--chunk", o.chunk, "Tokens per streamed chunk")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--d-model", o.d_model, "Width of the model")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--n-layer", o.n_layer, "Transformer layers")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--n-head", o.n_head, "Attention heads (d_model / n_head an even integer)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--max-clusters", o.max_clusters, "moment-closure: clusters per layer and head")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--birth-threshold", o.birth_threshold,
                  "moment-closure: the cluster-birth threshold")
      ->capture_default_str();
  add_cluster_rule_flag(cmd, o.cluster_rule);
  cmd->add_option("--outliers", o.outlier_capacity,
                  "moment-closure+outliers: the worst-fitting evicted tokens kept exactly (int8) per "
                  "layer, stream and cluster")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--sketch-rows", o.sketch_rows,
                  "frequent-directions: rows of each layer's and head's sketch (even, >= 4)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--sketch-dim", o.sketch_dim, "tensor-sketch: width of each layer's and head's sketch")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--sketch-degree", o.sketch_degree, "tensor-sketch: degree of the polynomial kernel")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--batch", o.batch, "Sequences per training step")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--steps", o.steps, "Training steps per mechanism")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--lr", o.lr, "Learning rate of the recall runs (AdamW, constant)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--eval-sequences", o.eval_sequences, "Held-out sequences scored")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "libtorch intra-op threads (at most the hardware threads)")
      ->check(kPositive)
      ->capture_default_str();
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
  cmd->add_option("--keys", o.task.keys, "Distinct key tokens")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--values", o.task.values, "Value tokens (chance accuracy is 1/values)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--filler", o.task.filler, "Filler tokens")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--pairs", o.task.pairs, "Key-value pairs per sequence (at most --keys)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--queries", o.task.queries, "Keys asked per sequence (at most --pairs)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--gap", o.task.gap, "Filler tokens between the last pair and the first query")
      ->check(kNonNegative)
      ->capture_default_str();
  add_recall_model_flags(cmd, o);
  cmd->add_option("--seed", o.seed, "Seed of the parameters and the sequences")
      ->capture_default_str();
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
    if (!std::isfinite(r->options.birth_threshold))
      throw UsageError("--birth-threshold must be a finite number");
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
  cmd->add_option("--mechanisms", b.mechanisms, "Mechanisms to compare, in order")
      ->delimiter(',')
      ->check(CLI::IsMember(stream::kSequenceMechanisms))
      ->capture_default_str();
  cmd->add_option("--tasks", b.tasks, "Tasks to run, in order")
      ->delimiter(',')
      ->check(CLI::IsMember({"recall", "mqar", "passkey"}))
      ->capture_default_str();
  cmd->add_option("--gaps", b.recall_gaps, "recall: filler tokens between the pairs and the queries")
      ->delimiter(',')
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--pairs", b.recall_pairs, "recall: key-value pairs per sequence (all asked)")
      ->delimiter(',')
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--keys", b.training.task.keys, "recall: distinct key tokens (at least the pairs)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--values", b.training.task.values, "recall: value tokens (chance 1/values)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--mqar-lengths", b.mqar_lengths, "mqar: tokens per sequence (even, at least 4 x pairs)")
      ->delimiter(',')
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--mqar-pairs", b.mqar_pairs, "mqar: key-value pairs per sequence (all asked)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--passkey-lengths", b.passkey_lengths, "passkey: bytes per sequence")
      ->delimiter(',')
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--seeds", b.seeds, "Seeds of the parameters and the sequences (one run each)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--json", r->json, "Also write every run and case to this file (JSON), after every run")
      ->type_name("FILE");
  cmd->add_flag("--resume", r->resume, "Reuse the finished runs of --json FILE (same settings) and train the rest");
  add_recall_model_flags(cmd, b.training);
  cmd->callback([r, &exit_code] {
    if (!std::isfinite(r->options.training.birth_threshold))
      throw UsageError("--birth-threshold must be a finite number");
    if (r->resume && r->json.empty()) throw UsageError("--resume needs --json FILE: the sweep to continue");
    r->options.training.threads = capped_threads(r->options.training.threads);
    exit_code = lm_plugin().memory_bench(*r);
  });
}

void add_generate(CLI::App* lm_cmd, int& exit_code) {
  auto r = std::make_shared<LmGenerateRequest>();
  stream::GenerateOptions& g = r->options;
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
  cmd->add_option("--tokens", g.tokens, "Bytes to sample")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--temperature", g.temperature, "Divides the logits (lower: more conservative)")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_option("--top-k", g.top_k, "Sample among the k most likely bytes (0: all)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--seed", g.seed, "Seed of the sampler")->capture_default_str();
  cmd->add_option("--threads", g.threads, "libtorch intra-op threads (at most the hardware threads)")
      ->check(kPositive)
      ->capture_default_str();
  add_window_cache_flag(cmd, g.window_cache);
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
