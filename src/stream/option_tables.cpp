// SPDX-License-Identifier: Apache-2.0
// The option tables of the streaming models (stream/option_table.hpp): one entry per option, in the order the help
// lists them.
#include "attnmix/stream/option_table.hpp"

namespace attnmix::stream {

namespace {

// The field `path` of the options struct O.
#define ATTNMIX_FIELD(path) field_of<O>([](O& o) -> auto& { return o.path; })

constexpr auto kFarField = Mechanism::kMomentClosure;

/// `inner`, reached in Outer through `part` (the training settings of a sweep, for example).
template <class Outer, class Inner>
StreamOption<Outer> nested(const StreamOption<Inner>& inner, Inner& (*part)(Outer&)) {
  StreamOption<Outer> out{inner.name, inner.flag, inner.help, {}, inner.check, inner.kept, inner.only_for,
                          inner.choices, inner.older_files_lack};
  out.field = std::visit(
      [part](const auto& field) -> OptionField<Outer> {
        using T = std::remove_reference_t<decltype(field(std::declval<Inner&>()))>;
        return FieldOf<Outer, T>([field, part](Outer& o) -> T& { return field(part(o)); });
      },
      inner.field);
  return out;
}

}  // namespace

const OptionTableOf<TrainOptions>& train_option_table() {
  using O = TrainOptions;
  using enum OptionCheck;
  static const OptionTableOf<O> table = {
      {"mechanism", "--mechanism",
       "Attention: window (the last {window} tokens, bounded state), full (every token since the start of the "
       "pass), moment-closure (the window plus a bounded far field of Gaussian clusters over the evicted tokens; "
       "docs/mechanisms.md#moment-closure-far-field) or linear (causal linear attention: running sums over every "
       "token, no window, bounded state), frequent-directions (linear attention over the window exactly and a "
       "Frequent Directions sketch of every evicted token, bounded state) or tensor-sketch (a polynomial kernel over "
       "the window exactly and running sums over a tensor sketch of every evicted token, bounded state)",
       ATTNMIX_FIELD(model.mechanism), kAny, Kept::kFixed},
      {"vocab", "", "Token ids the model predicts (256: bytes)", ATTNMIX_FIELD(model.vocab), kPositive, Kept::kFixed},
      {"window", "--window", "Tokens a query sees exactly (window and moment-closure)", ATTNMIX_FIELD(model.window),
       kPositive, Kept::kFixed},
      {"max_clusters", "--max-clusters", "moment-closure: far-field clusters per layer, stream and head",
       ATTNMIX_FIELD(model.max_clusters), kPositive, Kept::kFixed, kFarField},
      {"birth_threshold", "--birth-threshold",
       "moment-closure: a chunk of evicted tokens whose best cluster logit lies below this on every head founds a "
       "new cluster (while fewer than {max_clusters} live)",
       ATTNMIX_FIELD(model.birth_threshold), kFinite, Kept::kFixed, kFarField},
      {"merge_threshold", "--merge-threshold",
       "moment-closure: two clusters closer than this (RMS standardised distance of their key means) merge "
       "(default: 2.65 + 6/sqrt(n) for the smaller count n)",
       ATTNMIX_FIELD(model.merge_threshold), kFinite, Kept::kFixed, kFarField},
      {"cluster_rule", "--cluster-rule",
       "moment-closure: how the far field founds and merges clusters: threshold (a chunk whose mean key fits no "
       "cluster founds one; clusters closer than {merge_threshold} merge) or budget (every evicted chunk founds its "
       "own cluster; when {max_clusters} are live the closest two merge first; the thresholds are not used)",
       ATTNMIX_FIELD(model.cluster_rule), kAny, Kept::kFixed, kFarField, nullptr, /*older_files_lack=*/true},
      {"outlier_capacity", "--outliers",
       "moment-closure: per layer, stream and cluster, keep this many of the evicted tokens the cluster predicts "
       "worst exactly (int8) and attend to them beside the clusters (0: none)",
       ATTNMIX_FIELD(model.outlier_capacity), kNonNegative, Kept::kFixed, kFarField, nullptr,
       /*older_files_lack=*/true},
      {"sketch_rows", "--sketch-rows",
       "frequent-directions: rows of each layer's and head's sketch of the evicted tokens (even, >= 4; the sketch "
       "keeps rows/2 - 1 directions after each shrink)",
       ATTNMIX_FIELD(model.sketch_rows), kPositive, Kept::kFixed, Mechanism::kFrequentDirections},
      {"sketch_dim", "--sketch-dim", "tensor-sketch: width of each layer's and head's sketch",
       ATTNMIX_FIELD(model.sketch_dim), kPositive, Kept::kFixed, Mechanism::kTensorSketch},
      {"sketch_degree", "--sketch-degree",
       "tensor-sketch: degree p of the kernel (q.k)^p the window computes and the sketch estimates",
       ATTNMIX_FIELD(model.sketch_degree), kPositive, Kept::kFixed, Mechanism::kTensorSketch},
      {"d_model", "--d-model", "Width of the model", ATTNMIX_FIELD(model.d_model), kPositive, Kept::kFixed},
      {"n_layer", "--n-layer", "Transformer layers", ATTNMIX_FIELD(model.n_layer), kPositive, Kept::kFixed},
      {"n_head", "--n-head", "Attention heads (d_model / n_head must be an even integer)",
       ATTNMIX_FIELD(model.n_head), kPositive, Kept::kFixed},
      {"batch", "--batch", "Parallel streams", ATTNMIX_FIELD(batch), kPositive, Kept::kFixed},
      {"chunk", "--chunk", "Bytes per stream per step", ATTNMIX_FIELD(chunk), kPositive, Kept::kFixed},
      {"steps", "--steps", "Total steps (with --resume: the step to reach; default the checkpoint's)",
       ATTNMIX_FIELD(steps), kPositive, Kept::kStored},
      {"detach_horizon", "--detach-horizon",
       "Chunks per optimizer update (truncated BPTT: gradients flow back over this many chunks)",
       ATTNMIX_FIELD(detach_horizon), kPositive, Kept::kFixed},
      {"lr", "--lr", "Peak learning rate (AdamW)", ATTNMIX_FIELD(lr), kPositive, Kept::kFixed},
      {"min_lr_ratio", "--min-lr-ratio", "The cosine schedule ends at lr times this", ATTNMIX_FIELD(min_lr_ratio),
       kUnitInterval, Kept::kFixed},
      {"schedule", "--schedule", "Learning rate: cosine (decays over {steps}) or constant", ATTNMIX_FIELD(schedule),
       kAny, Kept::kFixed},
      {"weight_decay", "--weight-decay", "AdamW decoupled weight decay", ATTNMIX_FIELD(weight_decay), kNonNegative,
       Kept::kFixed},
      {"clip", "--clip", "Maximum global gradient norm (0: no clipping)", ATTNMIX_FIELD(clip), kNonNegative,
       Kept::kFixed},
      {"seed", "--seed", "Seed of the initial parameters", ATTNMIX_FIELD(seed), kAny, Kept::kFixed},
      {"threads", "--threads",
       "libtorch intra-op threads, at most the machine's hardware threads (results are reproducible for a fixed "
       "count)",
       ATTNMIX_FIELD(threads), kPositive},
      {"checkpoint_every", "--checkpoint-every",
       "Also write {out} every this many steps (at whole updates; 0: only at the end)",
       ATTNMIX_FIELD(checkpoint_every), kNonNegative},
      {"eval_every", "--eval-every",
       "Also score the held-out part every this many steps (bits per byte in the progress reports; the training is "
       "unchanged, its speed excludes the scoring; 0: only the final model)",
       ATTNMIX_FIELD(eval_every), kNonNegative},
  };
  return table;
}

const OptionTableOf<GenerateOptions>& generate_option_table() {
  using O = GenerateOptions;
  using enum OptionCheck;
  static const OptionTableOf<O> table = {
      {"tokens", "--tokens", "Bytes to sample", ATTNMIX_FIELD(tokens), kNonNegative},
      {"temperature", "--temperature", "Divides the logits (lower: more conservative)", ATTNMIX_FIELD(temperature),
       kPositive},
      {"top_k", "--top-k", "Sample among the k most likely bytes (0: all)", ATTNMIX_FIELD(top_k), kNonNegative},
      {"seed", "--seed", "Seed of the sampler", ATTNMIX_FIELD(seed)},
      {"threads", "--threads", "libtorch intra-op threads (at most the hardware threads)", ATTNMIX_FIELD(threads),
       kPositive},
      {"window_cache", "--window-cache",
       "How the window's keys and values are held between steps: float32 (default) or int8 (one scale per token "
       "and head: about a quarter of the bytes; window, full and moment-closure checkpoints)",
       ATTNMIX_FIELD(window_cache)},
  };
  return table;
}

namespace {

/// The model and training options of run_recall, which the memory benchmark shares.
OptionTableOf<RecallRunOptions> recall_model_options() {
  using O = RecallRunOptions;
  using enum OptionCheck;
  return {
      {"window", "--window",
       "Tokens a query sees exactly (window, moment-closure and the sketches; linear and full have none)",
       ATTNMIX_FIELD(window), kPositive},
      {"chunk", "--chunk", "Tokens per streamed chunk", ATTNMIX_FIELD(chunk), kPositive},
      {"d_model", "--d-model", "Width of the model", ATTNMIX_FIELD(d_model), kPositive},
      {"n_layer", "--n-layer", "Transformer layers", ATTNMIX_FIELD(n_layer), kPositive},
      {"n_head", "--n-head", "Attention heads (d_model / n_head an even integer)", ATTNMIX_FIELD(n_head), kPositive},
      {"max_clusters", "--max-clusters", "moment-closure: clusters per layer and head", ATTNMIX_FIELD(max_clusters),
       kPositive},
      {"birth_threshold", "--birth-threshold", "moment-closure: the cluster-birth threshold",
       ATTNMIX_FIELD(birth_threshold), kFinite},
      {"cluster_rule", "--cluster-rule",
       "moment-closure: how the far field founds and merges clusters: threshold (a chunk whose mean key fits no "
       "cluster founds one; clusters closer than the merge threshold merge) or budget (every evicted chunk founds "
       "its own cluster; when {max_clusters} are live the closest two merge first; the thresholds are not used)",
       ATTNMIX_FIELD(cluster_rule)},
      {"outlier_capacity", "--outliers",
       "moment-closure+outliers: the worst-fitting evicted tokens kept exactly (int8) per layer, stream and cluster",
       ATTNMIX_FIELD(outlier_capacity), kPositive},
      {"sketch_rows", "--sketch-rows", "frequent-directions: rows of each layer's and head's sketch (even, >= 4)",
       ATTNMIX_FIELD(sketch_rows), kPositive},
      {"sketch_dim", "--sketch-dim", "tensor-sketch: width of each layer's and head's sketch",
       ATTNMIX_FIELD(sketch_dim), kPositive},
      {"sketch_degree", "--sketch-degree", "tensor-sketch: degree of the polynomial kernel",
       ATTNMIX_FIELD(sketch_degree), kPositive},
      {"batch", "--batch", "Sequences per training step", ATTNMIX_FIELD(batch), kPositive},
      {"steps", "--steps", "Training steps per mechanism", ATTNMIX_FIELD(steps), kPositive},
      {"lr", "--lr", "Learning rate of the recall runs (AdamW, constant)", ATTNMIX_FIELD(lr), kPositive},
      {"eval_sequences", "--eval-sequences", "Held-out sequences scored", ATTNMIX_FIELD(eval_sequences), kPositive},
      {"threads", "--threads", "libtorch intra-op threads (at most the hardware threads)", ATTNMIX_FIELD(threads),
       kPositive},
  };
}

}  // namespace

const OptionTableOf<RecallRunOptions>& recall_option_table() {
  using O = RecallRunOptions;
  using enum OptionCheck;
  static const OptionTableOf<O> table = [] {
    OptionTableOf<O> out = {
        {"keys", "--keys", "Distinct key tokens", ATTNMIX_FIELD(task.keys), kPositive},
        {"values", "--values", "Value tokens (chance accuracy is 1/values)", ATTNMIX_FIELD(task.values), kPositive},
        {"filler", "--filler", "Filler tokens", ATTNMIX_FIELD(task.filler), kPositive},
        {"pairs", "--pairs", "Key-value pairs per sequence (at most {keys})", ATTNMIX_FIELD(task.pairs), kPositive},
        {"queries", "--queries", "Keys asked per sequence (at most {pairs})", ATTNMIX_FIELD(task.queries),
         kPositive},
        {"gap", "--gap", "Filler tokens between the last pair and the first query", ATTNMIX_FIELD(task.gap),
         kNonNegative},
    };
    for (StreamOption<O>& option : recall_model_options()) out.push_back(std::move(option));
    out.push_back({"seed", "--seed", "Seed of the parameters and the sequences", ATTNMIX_FIELD(seed)});
    return out;
  }();
  return table;
}

const OptionTableOf<MemoryBenchOptions>& memory_bench_option_table() {
  using O = MemoryBenchOptions;
  using enum OptionCheck;
  static const OptionTableOf<O> table = [] {
    const auto training = +[](O& o) -> RecallRunOptions& { return o.training; };
    OptionTableOf<O> out = {
        {"mechanisms", "--mechanisms", "Mechanisms to compare, in order", ATTNMIX_FIELD(mechanisms), kAny, Kept::kNo,
         std::nullopt, &kSequenceMechanisms},
        {"tasks", "--tasks", "Tasks to run, in order", ATTNMIX_FIELD(tasks), kAny, Kept::kNo, std::nullopt,
         &kMemoryBenchTasks},
        {"recall_gaps", "--gaps", "recall: filler tokens between the pairs and the queries",
         ATTNMIX_FIELD(recall_gaps), kNonNegative},
        {"recall_pairs", "--pairs", "recall: key-value pairs per sequence (all asked)", ATTNMIX_FIELD(recall_pairs),
         kPositive},
        {"keys", "--keys", "recall: distinct key tokens (at least the pairs)", ATTNMIX_FIELD(training.task.keys),
         kPositive},
        {"values", "--values", "recall: value tokens (chance 1/values)", ATTNMIX_FIELD(training.task.values),
         kPositive},
        {"mqar_lengths", "--mqar-lengths", "mqar: tokens per sequence (even, at least 4 x pairs)",
         ATTNMIX_FIELD(mqar_lengths), kPositive},
        {"mqar_pairs", "--mqar-pairs", "mqar: key-value pairs per sequence (all asked)", ATTNMIX_FIELD(mqar_pairs),
         kPositive},
        {"passkey_lengths", "--passkey-lengths", "passkey: bytes per sequence", ATTNMIX_FIELD(passkey_lengths),
         kPositive},
        {"seeds", "--seeds", "Seeds of the parameters and the sequences (one run each)", ATTNMIX_FIELD(seeds)},
    };
    for (const StreamOption<RecallRunOptions>& option : recall_model_options()) out.push_back(nested(option, training));
    return out;
  }();
  return table;
}

#undef ATTNMIX_FIELD

}  // namespace attnmix::stream
