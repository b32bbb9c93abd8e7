// SPDX-License-Identifier: Apache-2.0
/// @file memory_tasks.hpp
/// The synthetic tasks of the memory benchmark (memory_benchmark.hpp), beside far_field.hpp's associative recall.
/// Each draws whole sequences as RecallSequences: the tokens and, per position p, whether the token after p is an
/// answer (the positions the loss and the accuracy score). Torch-free.
///
/// Multi-query associative recall (MQAR, the task of the Zoology benchmark; ids: keys [0, K), values [K, K+V),
/// filler [K+V, K+V+F)):
///   k₁ v₁ … k_P v_P  then length − 2P positions in aligned slots of two, P of which (chosen uniformly, in order)
///   hold a query k v — every stored key once, in a random order — and the others two filler tokens.
/// The queries are spread over the sequence, so the distance to the evidence varies from 0 to length − 2P.
///
/// Byte-level passkey retrieval (vocabulary 256): filler text (a cycle of plain sentences from a random offset) with
///   " The pass key is DDDDD. Remember it. DDDDD is the pass key. "
/// inserted at a uniformly drawn depth, ending in " What is the pass key? The pass key is DDDDD"; the digits of the
/// final key are the answers (chance 0.1 per digit). The sequence is exactly `length` bytes.
#pragma once

#include "attnmix/core/rng.hpp"
#include "attnmix/stream/far_field.hpp"

#include <cstdint>

namespace attnmix::stream {

/// The sizes of a multi-query associative recall task (see the file comment); validate_mqar_task checks them.
struct MqarTaskOptions {
  int64_t keys = 64;     ///< distinct key tokens, ids [0, keys)
  int64_t values = 64;   ///< value tokens, ids [keys, keys + values), drawn uniformly per pair (chance 1/values)
  int64_t filler = 4;    ///< filler tokens, ids [keys + values, keys + values + filler)
  int64_t pairs = 16;    ///< key-value pairs stored at the start and each asked once (distinct keys: at most `keys`)
  int64_t length = 256;  ///< tokens per sequence (even, at least 4·pairs)
};

/// Checks the task: every count positive, pairs ≤ keys, length even and ≥ 4·pairs. @throws ValueError naming the field.
void validate_mqar_task(const MqarTaskOptions& task);
/// keys + values + filler.
int64_t mqar_vocab(const MqarTaskOptions& task);
/// Draws `batch` MQAR sequences of task.length tokens from rng: the pairs k₁ v₁ … k_P v_P (distinct keys), then the
/// slots of queries and filler; a query's value is marked as an answer. The vocabulary is mqar_vocab(task).
/// @throws ValueError for an invalid task or a non-positive batch.
RecallSequences mqar_sequences(Rng& rng, const MqarTaskOptions& task, int64_t batch);

/// The sizes of a byte-level passkey retrieval task (see the file comment); validate_passkey_task checks them.
struct PasskeyTaskOptions {
  int64_t length = 1024;  ///< bytes per sequence
  int64_t digits = 5;     ///< digits of the key (1 … 18)
};

/// Checks the task: digits in [1, 18] and a length that holds the needle, the question and at least one filler byte.
/// @throws ValueError naming the field.
void validate_passkey_task(const PasskeyTaskOptions& task);
/// The shortest valid length for `digits`.
int64_t passkey_min_length(int64_t digits);
/// Draws `batch` passkey sequences of task.length bytes from rng (vocabulary 256); the digits of the key after the
/// final question are the answers.
/// @throws ValueError for an invalid task or a non-positive batch.
RecallSequences passkey_sequences(Rng& rng, const PasskeyTaskOptions& task, int64_t batch);

}  // namespace attnmix::stream
