// SPDX-License-Identifier: Apache-2.0
/// @file language_model.hpp
/// Training, evaluating and sampling a streaming language model (docs/lm.md) from token arrays and checkpoint files.
/// This interface has no libtorch types, so the CLI and other callers compile without libtorch headers; the
/// implementation (src/stream/language_model.cpp, target attnmix::torch) drives the mechanisms of context_spine.hpp
/// (window, full), moment_closure.hpp (moment-closure: the window plus a far-field cluster bank per layer),
/// linear_attention.hpp (linear: running sums over the whole stream, no window), frequent_directions.hpp and
/// tensor_sketch.hpp (frequent-directions and tensor-sketch: a window plus a sketch of the evicted tokens).
/// The option structs and the name helpers are header-only: a caller that only parses options needs no libtorch.
///
/// Training data layout: the token array is cut into `batch` contiguous streams of equal length L; step s feeds
/// every stream the chunk at offset (s mod P)·chunk, where P = ⌊(L − 1)/chunk⌋ chunks make one pass; x is the
/// chunk, y the same tokens shifted by one. At the start of every pass the carried state is reset. Updates follow
/// truncated BPTT with AdamW, gradient-norm clipping and a constant or cosine learning rate.
/// Checkpoints (model, optimizer, carried state — for moment-closure the near caches, every cluster-bank tensor
/// and the outlier stores —, step, corpus fingerprint) are written atomically; resuming from a checkpoint saved after
/// step s continues exactly as the uninterrupted run would (bitwise, same thread count), as long as s is a multiple of
/// detach_horizon (a run's remainder is flushed before saving) and the total number of steps is
/// unchanged (the cosine schedule depends on it). docs/lm.md describes the format.
#pragma once

#include "attnmix/core/errors.hpp"
#include "attnmix/stream/cluster_rule.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attnmix::stream {

/// The attention mechanism of a streaming language model (`--mechanism`; docs/lm.md and
/// `docs/mechanisms.md#streaming-language-model`).
enum class Mechanism {
  kWindow,         ///< sliding-window attention over the last `window` tokens
  kFull,           ///< unbounded causal attention (the quality reference)
  kMomentClosure,  ///< the window plus a bounded far field: a Gaussian cluster bank per layer
  kLinear,         ///< causal linear attention over the whole stream: running sums, no window
  kFrequentDirections,  ///< linear attention with an exact window and a Frequent Directions sketch of the rest
  kTensorSketch,        ///< a polynomial-kernel window and running sums over a tensor sketch of the rest
};

/// "window", "full", "moment-closure", "linear", "frequent-directions" or "tensor-sketch".
/// @throws ValueError for other names.
inline Mechanism parse_mechanism(std::string_view name) {
  if (name == "window") return Mechanism::kWindow;
  if (name == "full") return Mechanism::kFull;
  if (name == "moment-closure") return Mechanism::kMomentClosure;
  if (name == "linear") return Mechanism::kLinear;
  if (name == "frequent-directions") return Mechanism::kFrequentDirections;
  if (name == "tensor-sketch") return Mechanism::kTensorSketch;
  throw ValueError("mechanism must be \"window\", \"full\", \"moment-closure\", \"linear\", "
                   "\"frequent-directions\" or \"tensor-sketch\" (got \"" +
                   std::string(name) + "\")");
}
/// The name parse_mechanism reads for `mechanism` ("window", "full", …), as checkpoints and messages write it.
inline std::string mechanism_name(Mechanism mechanism) {
  switch (mechanism) {
    case Mechanism::kFull:
      return "full";
    case Mechanism::kMomentClosure:
      return "moment-closure";
    case Mechanism::kLinear:
      return "linear";
    case Mechanism::kFrequentDirections:
      return "frequent-directions";
    case Mechanism::kTensorSketch:
      return "tensor-sketch";
    case Mechanism::kWindow:
      break;
  }
  return "window";
}

/// The architecture (`docs/mechanisms.md#streaming-language-model`).
struct ModelConfig {
  Mechanism mechanism = Mechanism::kWindow;  ///< the attention of every layer
  int64_t vocab = 256;  ///< byte-level tokens by default
  int64_t d_model = 32;  ///< d, the width of the residual stream (positive; a multiple of n_head)
  int64_t n_layer = 2;   ///< Transformer layers (positive)
  int64_t n_head = 2;    ///< H, heads per layer; head_dim = d_model / n_head must be even (RoPE)
  int64_t window = 64;  ///< tokens a query sees exactly; kFull and kLinear do not use it (validate() still checks it)
  // The far field of kMomentClosure; the other mechanisms ignore these (validate() still checks
  // them) and their checkpoints do not store them.
  int64_t max_clusters = 4;               ///< clusters per layer, stream and head (positive)
  double birth_threshold = -2.0;          ///< a chunk whose best cluster logit is below this on every head births
  std::optional<double> merge_threshold;  ///< cluster distance below which two merge; default 2.65 + 6/√n
  ClusterRule cluster_rule = ClusterRule::kThreshold;  ///< births and merges by thresholds or by the budget
  int64_t outlier_capacity = 0;  ///< per layer, stream and cluster, worst-fitting evicted tokens kept exactly; 0: none
  int64_t sketch_rows = 16;  ///< kFrequentDirections: rows of each head's sketch (even, >= 4); stored only for it
  int64_t sketch_dim = 64;     ///< kTensorSketch: the sketch's width D; stored only for it
  int64_t sketch_degree = 2;   ///< kTensorSketch: the polynomial kernel's degree p; stored only for it
};

/// How evaluate and generate hold the exact window's keys and values between chunks (window, full and
/// moment-closure; the other mechanisms keep no key-value cache).
enum class WindowCache {
  kFloat32,  ///< as computed
  kInt8,     ///< affine int8 with one scale per token and head (quantize_kv_cache, kv_quantization.hpp): a chunk
             ///< attends to the reconstruction of the cached tokens and exactly to its own
};

/// "float32" or "int8". @throws ValueError for other names.
inline WindowCache parse_window_cache(std::string_view name) {
  if (name == "float32") return WindowCache::kFloat32;
  if (name == "int8") return WindowCache::kInt8;
  throw ValueError("window_cache must be \"float32\" or \"int8\" (got \"" + std::string(name) + "\")");
}
/// The name parse_window_cache reads for `cache`: "int8" or "float32".
inline std::string window_cache_name(WindowCache cache) { return cache == WindowCache::kInt8 ? "int8" : "float32"; }

/// The learning-rate schedule of training (`--schedule`): kConstant keeps TrainOptions::lr; kCosine decays it from
/// lr at step 0 to lr · min_lr_ratio at the last step along half a cosine, lr_s = f + (lr − f)·½(1 + cos(π s/steps))
/// with f = lr · min_lr_ratio.
enum class Schedule { kConstant, kCosine };

/// "constant" or "cosine". @throws ValueError for other names.
inline Schedule parse_schedule(std::string_view name) {
  if (name == "constant") return Schedule::kConstant;
  if (name == "cosine") return Schedule::kCosine;
  throw ValueError("schedule must be \"constant\" or \"cosine\" (got \"" + std::string(name) + "\")");
}
/// The name parse_schedule reads for `schedule`: "cosine" or "constant".
inline std::string schedule_name(Schedule schedule) { return schedule == Schedule::kCosine ? "cosine" : "constant"; }

/// Everything `attnmix lm train` needs besides the data and the paths (the flags of `docs/lm.md#commands`; these are
/// the library's one source of their defaults). validate() checks them.
struct TrainOptions {
  ModelConfig model;  ///< the architecture to train (fixed by the checkpoint when resuming)
  int64_t batch = 8;             ///< parallel streams
  int64_t chunk = 64;            ///< tokens per stream per step
  int64_t steps = 300;           ///< total steps (chunks); a resumed run continues up to this step
  int64_t detach_horizon = 1;    ///< chunks per optimizer update (the truncation length of BPTT)
  double lr = 3e-3;              ///< peak learning rate (AdamW)
  double min_lr_ratio = 0.1;     ///< the cosine schedule ends at lr · min_lr_ratio
  Schedule schedule = Schedule::kCosine;  ///< constant or cosine decay of the learning rate over `steps`
  double weight_decay = 0.01;    ///< AdamW decoupled weight decay
  double clip = 1.0;             ///< maximum global gradient norm; 0 turns clipping off
  uint64_t seed = 0;             ///< torch::manual_seed for the initial parameters
  int threads = 1;               ///< libtorch intra-op threads
  int64_t checkpoint_every = 0;  ///< also save every this many steps (0: only at the end)
  /// also score the held-out tokens every this many steps (Progress::heldout_bits_per_byte; 0: only the final model;
  /// the step that ends the run is always left to the final evaluation, TrainSummary::heldout)
  int64_t eval_every = 0;
};

/// Checks the options: the model's sizes (positive, d_model divisible by n_head, head_dim even); batch, chunk,
/// steps, detach_horizon, threads, max_clusters, sketch_dim and sketch_degree positive; sketch_rows even and ≥ 4;
/// outlier_capacity, checkpoint_every and eval_every ≥ 0; lr positive, min_lr_ratio in [0, 1], weight_decay and
/// clip ≥ 0 and finite; finite thresholds; and that the state and one step's tensors have a size that can exist.
/// @throws ValueError naming the offending field.
void validate(const TrainOptions& options);

/// One line of progress, reported after every step.
struct Progress {
  int64_t step = 0;   ///< 1-based step just finished
  int64_t steps = 0;  ///< total steps of the run
  double loss = 0.0;  ///< this step's mean cross-entropy (nats per token)
  double tokens_per_second = 0.0;  ///< training tokens per second of training time (held-out scoring excluded)
  double elapsed_seconds = 0.0;    ///< since the run began, held-out scoring included
  double eta_seconds = 0.0;        ///< estimated time to the last step: elapsed time per step of this run × steps left
  /// moment-closure: each layer's live clusters after this step, mean over the streams; empty otherwise.
  std::vector<double> clusters;
  /// moment-closure: each layer's bank mass after this step (the tokens its clusters summarise, Σ_c n_c, mean over
  /// streams and heads); empty otherwise.
  std::vector<double> bank_mass;
  /// moment-closure: each layer's far-field share of this step's attention (LayerReceipt::far_attention_share);
  /// empty otherwise.
  std::vector<double> far_share;
  /// the held-out tokens' bits per token under the model after this step, at every TrainOptions::eval_every-th step
  /// (a train() given held-out tokens); empty otherwise.
  std::optional<double> heldout_bits_per_byte;
};

/// What the far field of one moment-closure layer did over a run (from the per-step receipts; docs/lm.md).
struct LayerClusterStats {
  double clusters = 0.0;     ///< live clusters at the end, mean over the streams
  int64_t births = 0;        ///< clusters born, summed over steps and streams
  int64_t merges = 0;        ///< pairs merged, summed over steps and streams
  int64_t ingestions = 0;    ///< (step, stream) pairs that evicted tokens into the bank
  double mean_misfit = 0.0;  ///< mean of the stream misfit receipts (misfit_scalar) over those ingestions
};

/// Held-out evaluation: mean cross-entropy in nats and bits per token, streaming one chunk at a time.
struct Evaluation {
  int64_t tokens = 0;               ///< tokens scored: every token but the first (n − 1 of n)
  double mean_cross_entropy = 0.0;  ///< mean next-token cross-entropy over the scored tokens (nats per token)
  double bits_per_token = 0.0;      ///< mean_cross_entropy / ln 2 (bits per byte for the byte-level model)
  double seconds = 0.0;             ///< wall-clock time of the streaming pass
  int64_t state_bytes = 0;  ///< size of the carried state at the end
  std::vector<LayerClusterStats> far_field;  ///< moment-closure: one per layer (one stream); empty otherwise
};

/// What train() did: the steps and losses of this run, the model's size, and its final held-out score.
struct TrainSummary {
  int64_t first_step = 0;        ///< 0 for a fresh run, the checkpoint's step when resumed
  int64_t steps = 0;             ///< the step reached
  std::vector<double> losses;    ///< one per step run here
  int64_t tokens = 0;            ///< tokens trained on in this run
  double seconds = 0.0;          ///< training time of this run (the eval_every scoring excluded)
  int64_t parameters = 0;        ///< number of trainable scalars
  int64_t state_bytes = 0;       ///< size of the carried state after the last step
  /// moment-closure: one per layer, over the steps run here and every stream (clusters: the final state);
  /// empty otherwise.
  std::vector<LayerClusterStats> far_field;
  std::optional<Evaluation> heldout;  ///< the final model on the held-out tokens, when train() was given any
};

/// Bytes of a text as token ids 0…255.
std::vector<int64_t> byte_tokens(std::string_view text);

/// Splits tokens into a training prefix and a held-out suffix of ⌈fraction·n⌉ tokens.
/// @throws ValueError unless 0 < fraction < 1 and both parts keep at least 2 tokens.
std::pair<std::vector<int64_t>, std::vector<int64_t>> split_heldout(std::span<const int64_t> tokens, double fraction);

/// Trains a fresh model (resume_from empty) or continues a checkpoint, writes the checkpoint to `out` (atomically;
/// empty: no file) and returns what happened. on_progress, if set, is called after every step (after the periodic
/// checkpoint of that step, if one is due). With `heldout` tokens (at least 2), the final model is evaluated on them
/// in chunks of `chunk` (TrainSummary::heldout) after the checkpoint is written.
/// With `heldout` tokens and options.eval_every > 0 they are also scored every eval_every steps, without changing the
/// training (Progress::heldout_bits_per_byte).
/// When resuming, `options` supplies only steps, threads, checkpoint_every and eval_every; everything else comes from
/// the checkpoint, and the corpus must be the one it was trained on.
/// Nothing is written before the first step succeeds; a loss that turns non-finite stops the run with an error
/// before the next checkpoint is written (an earlier periodic checkpoint stays).
/// @throws ValueError for invalid options, ids outside the vocabulary, a corpus too short for one chunk per stream,
///   fewer than 2 held-out tokens, or a checkpoint beyond options.steps; std::runtime_error for an unreadable,
///   malformed or mismatched checkpoint (message names the file), or a non-finite loss.
TrainSummary train(const TrainOptions& options, std::span<const int64_t> tokens, const std::string& resume_from,
                   const std::string& out, const std::function<void(const Progress&)>& on_progress = {},
                   std::span<const int64_t> heldout = {});

/// Streams tokens through the checkpoint's model in chunks of `chunk` (one stream, no gradients).
/// @throws std::runtime_error for a bad checkpoint; ValueError for ids outside the vocabulary or < 2 tokens.
/// window_cache kInt8 holds the window's cache as int8 between chunks and reports state_bytes of that form.
/// @throws ValueError for kInt8 on a mechanism without a key-value cache (linear and the sketches).
Evaluation evaluate(const std::string& checkpoint, std::span<const int64_t> tokens, int64_t chunk, int threads,
                    WindowCache window_cache = WindowCache::kFloat32);

/// How generate() samples (`attnmix lm generate`, `docs/lm.md#commands`).
struct GenerateOptions {
  int64_t tokens = 200;       ///< how many to draw
  double temperature = 0.8;   ///< > 0
  int64_t top_k = 0;          ///< 0: the whole vocabulary
  uint64_t seed = 0;          ///< seed of the sampler's Rng: the same seed and checkpoint give the same tokens
  int threads = 1;            ///< libtorch intra-op threads (positive)
  WindowCache window_cache = WindowCache::kFloat32;  ///< how the window's keys and values are held between tokens
};

/// Feeds the prompt, then draws tokens one at a time from the model's next-token distribution.
/// @throws ValueError for an empty prompt or invalid options; std::runtime_error for a bad checkpoint.
std::vector<int64_t> generate(const std::string& checkpoint, std::span<const int64_t> prompt,
                              const GenerateOptions& options);

/// FNV-1a over the token values: identifies the corpus a checkpoint was trained on.
uint64_t corpus_fingerprint(std::span<const int64_t> tokens);

/// What a checkpoint holds, for messages and resume checks: its config, step and training corpus.
struct CheckpointInfo {
  ModelConfig model;         ///< the architecture (the same as options.model)
  TrainOptions options;      ///< threads, checkpoint_every and eval_every are not stored (their defaults)
  int64_t step = 0;          ///< steps trained so far
  int64_t corpus_tokens = 0;        ///< the number of tokens train() was given to train on
  uint64_t corpus_fingerprint = 0;  ///< corpus_fingerprint() of the training tokens
};
/// @throws std::runtime_error for a missing, unreadable or malformed checkpoint (the message names the file).
CheckpointInfo read_checkpoint_info(const std::string& checkpoint);

}  // namespace attnmix::stream
