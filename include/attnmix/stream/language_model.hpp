// SPDX-License-Identifier: Apache-2.0
/// @file language_model.hpp
/// Training, evaluating and sampling a streaming language model (SPEC §6) from token arrays and checkpoint files.
/// This interface has no libtorch types, so the CLI and other callers compile without libtorch headers; the
/// implementation (src/stream/language_model.cpp) drives the mechanisms of context_spine.hpp.
///
/// Training data layout: the token array is cut into `batch` contiguous streams of equal length L; step s feeds
/// every stream the chunk at offset (s mod P)·chunk, where P = ⌊(L − 1)/chunk⌋ chunks make one pass; x is the
/// chunk, y the same tokens shifted by one. At the start of every pass the carried state is reset. Updates follow
/// truncated BPTT (SPEC §6.5) with AdamW, gradient-norm clipping and a constant or cosine learning rate.
/// Checkpoints (model, optimizer, carried state, step, corpus fingerprint) are written atomically; resuming from a
/// checkpoint saved after step s continues exactly as the uninterrupted run would (bitwise, same thread count), as
/// long as s is a multiple of detach_horizon (a run's remainder is flushed before saving, SPEC §6.5).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace attnmix::lm {

enum class Mechanism {
  kWindow,  ///< sliding-window attention over the last `window` tokens
  kFull,    ///< unbounded causal attention (the quality reference)
};

/// "window" or "full". @throws ValueError for other names.
Mechanism parse_mechanism(std::string_view name);
std::string mechanism_name(Mechanism mechanism);

/// The architecture (SPEC §6.2).
struct ModelConfig {
  Mechanism mechanism = Mechanism::kWindow;
  int64_t vocab = 256;  ///< byte-level tokens by default
  int64_t d_model = 32;
  int64_t n_layer = 2;
  int64_t n_head = 2;
  int64_t window = 64;  ///< ignored by kFull
};

enum class Schedule { kConstant, kCosine };

/// "constant" or "cosine". @throws ValueError for other names.
Schedule parse_schedule(std::string_view name);
std::string schedule_name(Schedule schedule);

struct TrainOptions {
  ModelConfig model;
  int64_t batch = 8;             ///< parallel streams
  int64_t chunk = 64;            ///< tokens per stream per step
  int64_t steps = 300;           ///< total steps (chunks); a resumed run continues up to this step
  int64_t detach_horizon = 1;    ///< chunks per optimizer update (SPEC §6.5)
  double lr = 3e-3;              ///< peak learning rate (AdamW)
  double min_lr_ratio = 0.1;     ///< the cosine schedule ends at lr · min_lr_ratio
  Schedule schedule = Schedule::kCosine;
  double weight_decay = 0.01;    ///< AdamW decoupled weight decay
  double clip = 1.0;             ///< maximum global gradient norm; 0 turns clipping off
  uint64_t seed = 0;             ///< torch::manual_seed for the initial parameters
  int threads = 1;               ///< libtorch intra-op threads
  int64_t checkpoint_every = 0;  ///< also save every this many steps (0: only at the end)
};

/// @throws ValueError naming the offending field.
void validate(const TrainOptions& options);

/// One line of progress, reported after every step.
struct Progress {
  int64_t step = 0;   ///< 1-based step just finished
  int64_t steps = 0;  ///< total steps of the run
  double loss = 0.0;  ///< this step's mean cross-entropy (nats per token)
  double tokens_per_second = 0.0;
  double elapsed_seconds = 0.0;
  double eta_seconds = 0.0;
};

struct TrainSummary {
  int64_t first_step = 0;        ///< 0 for a fresh run, the checkpoint's step when resumed
  int64_t steps = 0;             ///< the step reached
  std::vector<double> losses;    ///< one per step run here
  int64_t tokens = 0;            ///< tokens trained on in this run
  double seconds = 0.0;
  int64_t parameters = 0;        ///< number of trainable scalars
  int64_t state_bytes = 0;       ///< size of the carried state after the last step
};

/// Held-out evaluation: mean cross-entropy in nats and bits per token, streaming one chunk at a time.
struct Evaluation {
  int64_t tokens = 0;
  double mean_cross_entropy = 0.0;
  double bits_per_token = 0.0;
  double seconds = 0.0;
  int64_t state_bytes = 0;  ///< size of the carried state at the end
};

/// Bytes of a text as token ids 0…255.
std::vector<int64_t> byte_tokens(std::string_view text);

/// Splits tokens into a training prefix and a held-out suffix of ⌈fraction·n⌉ tokens.
/// @throws ValueError unless 0 < fraction < 1 and both parts keep at least 2 tokens.
std::pair<std::vector<int64_t>, std::vector<int64_t>> split_heldout(std::span<const int64_t> tokens, double fraction);

/// Trains a fresh model (resume_from empty) or continues a checkpoint, writes the checkpoint to `out` (atomically;
/// empty: no file) and returns what happened. on_progress, if set, is called after every step.
/// When resuming, `options` supplies only steps, threads and checkpoint_every; everything else comes from the
/// checkpoint, and the corpus must be the one it was trained on.
/// @throws ValueError for invalid options, ids outside the vocabulary, or a corpus too short for one chunk per
///   stream; std::runtime_error for an unreadable, malformed or mismatched checkpoint (message names the file).
TrainSummary train(const TrainOptions& options, std::span<const int64_t> tokens, const std::string& resume_from,
                   const std::string& out, const std::function<void(const Progress&)>& on_progress = {});

/// Streams tokens through the checkpoint's model in chunks of `chunk` (one stream, no gradients).
/// @throws std::runtime_error for a bad checkpoint; ValueError for ids outside the vocabulary or < 2 tokens.
Evaluation evaluate(const std::string& checkpoint, std::span<const int64_t> tokens, int64_t chunk, int threads);

struct GenerateOptions {
  int64_t tokens = 200;       ///< how many to draw
  double temperature = 0.8;   ///< > 0
  int64_t top_k = 0;          ///< 0: the whole vocabulary
  uint64_t seed = 0;
  int threads = 1;
};

/// Feeds the prompt, then draws tokens one at a time from the model's next-token distribution.
/// @throws ValueError for an empty prompt or invalid options; std::runtime_error for a bad checkpoint.
std::vector<int64_t> generate(const std::string& checkpoint, std::span<const int64_t> prompt,
                              const GenerateOptions& options);

/// What a checkpoint holds, for messages: its config and step.
struct CheckpointInfo {
  ModelConfig model;
  TrainOptions options;
  int64_t step = 0;
};
CheckpointInfo read_checkpoint_info(const std::string& checkpoint);

}  // namespace attnmix::lm
