// SPDX-License-Identifier: Apache-2.0
/// @file far_field.hpp
/// What the far field is for (issue 9): multi-query associative recall where every key-value pair lies further back
/// than the window. Torch-free interface; the implementation trains the mechanisms of context_spine.hpp and
/// moment_closure.hpp.
///
/// Task (ids: keys [0, K), values [K, K+V), filler [K+V, K+V+F), vocab K+V+F):
///   k₁ v₁ k₂ v₂ … k_P v_P  f f … f (gap)  q₁ a₁ q₂ a₂ … q_Q a_Q
/// with distinct keys k_i, values v_i drawn uniformly, each query q_j one of the stored keys and a_j its value. The
/// loss (training and evaluation) is the cross-entropy of a_j given the prefix ending in q_j; chance accuracy is 1/V.
/// With gap ≥ window every pair has left the window before the first query, so a window-only model cannot recall
/// better than chance; full attention can; moment-closure must recall through its cluster statistics — provided
/// the pairs were also evicted into the bank before the first query, i.e. a chunk boundary lies between them (the
/// bank ingests once per chunk, at its end).
/// Each sequence is streamed in chunks of `chunk` tokens with the state carried and backpropagated across chunks.
#pragma once

#include "attnmix/core/rng.hpp"
#include "attnmix/stream/language_model.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace attnmix::stream {

/// The sizes of the associative recall task (see the file comment; docs/far-field.md); validate_recall_task checks
/// them.
struct RecallTaskOptions {
  int64_t keys = 16;     ///< K, key tokens, ids [0, K)
  int64_t values = 16;   ///< V, value tokens, ids [K, K+V), drawn uniformly per pair (chance 1/V)
  int64_t filler = 8;    ///< F, filler tokens, ids [K+V, K+V+F)
  int64_t pairs = 4;     ///< P, key-value pairs at the start of a sequence (distinct keys: at most K)
  int64_t queries = 4;   ///< Q, stored keys asked again at the end, each at most once (at most P)
  int64_t gap = 24;  ///< filler tokens between the last pair and the first query
};

/// Total sequence length: 2·pairs + gap + 2·queries.
int64_t recall_sequence_length(const RecallTaskOptions& task);

/// Checks the task: keys, values, filler, pairs and queries positive, gap ≥ 0, pairs ≤ keys (the keys of a
/// sequence are distinct) and queries ≤ pairs. @throws ValueError naming the field.
void validate_recall_task(const RecallTaskOptions& task);

/// `batch` sequences of the task, row-major: tokens [batch][length] and answers [batch][length − 1], 1 where the
/// token after position p is a recalled value (the positions the loss and the accuracy score).
struct RecallSequences {
  int64_t batch = 0;             ///< sequences drawn
  int64_t length = 0;            ///< tokens per sequence
  std::vector<int64_t> tokens;   ///< batch · length token ids, row-major
  std::vector<uint8_t> answers;  ///< batch · (length − 1) flags, row-major: 1 where the next token is an answer
};

/// Draws `batch` sequences from rng, one after the other; per sequence: the distinct keys (partial Fisher–Yates),
/// each pair's value, the filler, then the asked keys (a partial Fisher–Yates over the pairs).
/// @throws ValueError for an invalid task or a non-positive batch.
RecallSequences recall_sequences(Rng& rng, const RecallTaskOptions& task, int64_t batch);

/// The generator of run_recall's data for a seed: stream 0 gives the training batches, stream 1 the held-out ones
/// and stream 2 the one sequence that measures the state; each stream's batches are drawn from it in turn.
Rng recall_data_rng(uint64_t seed, int64_t stream);

/// The mechanisms run_sequence_task trains: lm's six and "moment-closure+outliers", moment closure with an outlier
/// store of RecallRunOptions::outlier_capacity tokens per cluster (kv_quantization.hpp).
inline const std::vector<std::string> kSequenceMechanisms = {"window", "moment-closure", "moment-closure+outliers",
                                                             "linear", "frequent-directions", "tensor-sketch",
                                                             "full"};
/// @throws ValueError naming the known mechanisms unless `mechanism` is one of them.
void check_sequence_mechanism(const std::string& mechanism);

/// The model and training settings of run_recall and run_sequence_task (`attnmix lm recall` and
/// `attnmix lm memory-bench`; docs/far-field.md), and run_recall's task. Training uses FusedAdamW at a constant
/// learning rate (weight decay 0.01) and clips the gradient norm at 1; the loss is the answers' cross-entropy.
struct RecallRunOptions {
  RecallTaskOptions task;  ///< the recall task of run_recall (run_sequence_task ignores it)
  int64_t d_model = 32;    ///< the model's width d (a multiple of n_head)
  int64_t n_layer = 2;     ///< Transformer layers
  int64_t n_head = 2;      ///< heads per layer; d_model / n_head must be even (RoPE)
  int64_t window = 16;     ///< tokens a query sees exactly (ignored by full and linear)
  int64_t chunk = 16;      ///< tokens per chunk when a sequence is streamed (keep it at most `window`)
  int64_t max_clusters = 4;      ///< moment-closure only
  int64_t outlier_capacity = 8;   ///< moment-closure+outliers: tokens per cluster kept exactly (positive)
  int64_t sketch_rows = 16;       ///< frequent-directions: rows of each head's sketch (even, >= 4)
  int64_t sketch_dim = 64;        ///< tensor-sketch: the sketch's width (positive)
  int64_t sketch_degree = 2;      ///< tensor-sketch: the polynomial kernel's degree (positive)
  double birth_threshold = -2.0;  ///< moment-closure only
  ClusterRule cluster_rule = ClusterRule::kThreshold;  ///< moment-closure only
  int64_t batch = 32;             ///< sequences per step
  int64_t steps = 300;           ///< training steps, one batch of fresh sequences each
  double lr = 3e-3;               ///< the AdamW learning rate (constant)
  int64_t eval_sequences = 512;   ///< held-out sequences scored after training, in batches of `batch`
  uint64_t seed = 0;              ///< torch::manual_seed for the initial parameters, and the data (recall_data_rng)
  int threads = 1;                ///< libtorch intra-op threads (results are reproducible for a fixed count)
};

/// The lm model of a sequence mechanism with the sizes of `options` (vocab: ModelConfig's, the 256 bytes):
/// "moment-closure+outliers" is moment-closure with outlier_capacity = options.outlier_capacity.
/// @throws ValueError for an unknown mechanism.
ModelConfig sequence_model_config(const std::string& mechanism, const RecallRunOptions& options);

/// One mechanism's result on a sequence task: held-out answer accuracy and cross-entropy, training losses, the
/// state's size and the training time.
struct RecallResult {
  std::string mechanism;          ///< one of kSequenceMechanisms
  double accuracy = 0.0;          ///< held-out recall accuracy (argmax at answer positions)
  double cross_entropy = 0.0;     ///< held-out mean cross-entropy at answer positions (nats)
  double first_loss = 0.0;        ///< mean training loss of the first 10 steps
  double last_loss = 0.0;         ///< mean training loss of the last 10 steps
  int64_t state_bytes = 0;        ///< carried state at the end of one sequence (batch 1)
  double seconds = 0.0;           ///< training time
};

/// Checks the model and training settings (not the task): chunk, batch, steps, eval_sequences, threads,
/// outlier_capacity, sketch_dim and sketch_degree positive, sketch_rows even and ≥ 4, lr positive. The model's sizes
/// are checked when the mechanism is built. @throws ValueError naming the field.
void validate_training(const RecallRunOptions& options);

/// A task to train and evaluate on: its vocabulary and how it draws `batch` sequences from a generator.
struct SequenceTask {
  std::string name;    ///< the task's name in reports ("recall", …)
  int64_t vocab = 0;   ///< token ids lie in [0, vocab); the model is built with this vocabulary (positive)
  int64_t length = 0;  ///< tokens per sequence
  /// Draws `batch` sequences of `length` tokens from rng (required: run_sequence_task rejects an empty function).
  std::function<RecallSequences(Rng& rng, int64_t batch)> draw;
};

/// The recall task of `task` as a SequenceTask (vocabulary keys + values + filler).
/// @throws ValueError for an invalid task.
SequenceTask recall_task(const RecallTaskOptions& task);

/// Trains and evaluates one mechanism on `task` with the model and training settings of `options` (its `task`
/// field unused): run_recall for any task. @throws ValueError for invalid options or an unknown mechanism.
RecallResult run_sequence_task(const std::string& mechanism, const SequenceTask& task, const RecallRunOptions& options,
                               const std::function<void(int64_t step, double loss)>& on_step = {});

/// Trains and evaluates one mechanism (one of kSequenceMechanisms) on the recall task. Every
/// mechanism gets the same initial parameters of the shared backbone (same seed and construction order; linear's
/// token shifts start at zero) and the same training sequences.
/// @throws ValueError for invalid options or an unknown mechanism.
RecallResult run_recall(const std::string& mechanism, const RecallRunOptions& options,
                        const std::function<void(int64_t step, double loss)>& on_step = {});

}  // namespace attnmix::stream
