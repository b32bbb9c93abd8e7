// SPDX-License-Identifier: Apache-2.0
// The memory benchmark's synthetic tasks; see include/attnmix/stream/memory_tasks.hpp.
#include "attnmix/stream/memory_tasks.hpp"

#include "attnmix/core/errors.hpp"

#include <algorithm>
#include <numeric>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attnmix::stream {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

void require_positive(const char* task, const char* name, int64_t v) {
  if (v <= 0) throw ValueError(std::string(task) + ": " + name + " must be a positive integer (got " + str(v) + ")");
}

void require_batch(int64_t batch) {
  if (batch <= 0) throw ValueError("memory task: batch must be a positive integer (got " + str(batch) + ")");
}

int64_t draw(Rng& rng, int64_t n) { return static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(n))); }

// The first `count` entries of a uniformly shuffled 0 … n−1 (partial Fisher–Yates).
std::vector<int64_t> draw_distinct(Rng& rng, int64_t n, int64_t count) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = 0; i < count; ++i) {
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(i + draw(rng, n - i))]);
  }
  order.resize(static_cast<size_t>(count));
  return order;
}

RecallSequences empty_sequences(int64_t batch, int64_t length) {
  RecallSequences out;
  out.batch = batch;
  out.length = length;
  out.tokens.assign(static_cast<size_t>(batch * length), 0);
  out.answers.assign(static_cast<size_t>(batch * (length - 1)), 0);
  return out;
}

constexpr std::string_view kFillerText =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
constexpr std::string_view kNeedleHead = " The pass key is ";
constexpr std::string_view kNeedleMiddle = ". Remember it. ";
constexpr std::string_view kNeedleTail = " is the pass key. ";
constexpr std::string_view kQuestion = " What is the pass key? The pass key is ";

int64_t needle_length(int64_t digits) {
  return static_cast<int64_t>(kNeedleHead.size() + kNeedleMiddle.size() + kNeedleTail.size()) + 2 * digits;
}

}  // namespace

void validate_mqar_task(const MqarTaskOptions& t) {
  constexpr const char* w = "mqar";
  require_positive(w, "keys", t.keys);
  require_positive(w, "values", t.values);
  require_positive(w, "filler", t.filler);
  require_positive(w, "pairs", t.pairs);
  require_positive(w, "length", t.length);
  if (t.pairs > t.keys) throw ValueError("mqar: pairs must not exceed keys (keys are distinct)");
  if (t.length % 2 != 0 || t.length < 4 * t.pairs) {
    throw ValueError("mqar: length must be even and at least 4 x pairs = " + str(4 * t.pairs) + " (got " +
                     str(t.length) + ")");
  }
}

int64_t mqar_vocab(const MqarTaskOptions& t) { return t.keys + t.values + t.filler; }

RecallSequences mqar_sequences(Rng& rng, const MqarTaskOptions& t, int64_t batch) {
  validate_mqar_task(t);
  require_batch(batch);
  auto out = empty_sequences(batch, t.length);
  const int64_t slots = (t.length - 2 * t.pairs) / 2;  // aligned slots of two after the stored pairs
  for (int64_t b = 0; b < batch; ++b) {
    int64_t* s = out.tokens.data() + b * t.length;
    uint8_t* answer = out.answers.data() + b * (t.length - 1);
    const auto keys = draw_distinct(rng, t.keys, t.pairs);
    std::vector<int64_t> value_of(static_cast<size_t>(t.pairs));
    for (int64_t i = 0; i < t.pairs; ++i) {
      value_of[static_cast<size_t>(i)] = t.keys + draw(rng, t.values);
      s[2 * i] = keys[static_cast<size_t>(i)];
      s[2 * i + 1] = value_of[static_cast<size_t>(i)];
    }
    auto query_slots = draw_distinct(rng, slots, t.pairs);
    std::sort(query_slots.begin(), query_slots.end());
    const auto asked = draw_distinct(rng, t.pairs, t.pairs);
    size_t next_query = 0;
    for (int64_t slot = 0; slot < slots; ++slot) {
      const int64_t p = 2 * t.pairs + 2 * slot;
      if (next_query < query_slots.size() && query_slots[next_query] == slot) {
        const auto pair = static_cast<size_t>(asked[next_query++]);
        s[p] = keys[pair];
        s[p + 1] = value_of[pair];
        answer[p] = 1;
      } else {
        s[p] = t.keys + t.values + draw(rng, t.filler);
        s[p + 1] = t.keys + t.values + draw(rng, t.filler);
      }
    }
  }
  return out;
}

int64_t passkey_min_length(int64_t digits) {
  return needle_length(digits) + static_cast<int64_t>(kQuestion.size()) + digits + 1;
}

void validate_passkey_task(const PasskeyTaskOptions& t) {
  if (t.digits < 1 || t.digits > 18) {
    throw ValueError("passkey: digits must lie in [1, 18] (got " + str(t.digits) + ")");
  }
  if (t.length < passkey_min_length(t.digits)) {
    throw ValueError("passkey: length must be at least " + str(passkey_min_length(t.digits)) + " bytes for " +
                     str(t.digits) + " digits (got " + str(t.length) + ")");
  }
}

RecallSequences passkey_sequences(Rng& rng, const PasskeyTaskOptions& t, int64_t batch) {
  validate_passkey_task(t);
  require_batch(batch);
  auto out = empty_sequences(batch, t.length);
  const int64_t filler = t.length - needle_length(t.digits) - static_cast<int64_t>(kQuestion.size()) - t.digits;
  for (int64_t b = 0; b < batch; ++b) {
    std::string key;
    for (int64_t i = 0; i < t.digits; ++i) key += static_cast<char>('0' + draw(rng, 10));
    const int64_t depth = draw(rng, filler + 1);  // filler bytes before the needle
    const int64_t offset = draw(rng, static_cast<int64_t>(kFillerText.size()));
    std::string text;
    text.reserve(static_cast<size_t>(t.length));
    const auto add_filler = [&](int64_t from, int64_t count) {
      for (int64_t i = 0; i < count; ++i) {
        text += kFillerText[static_cast<size_t>((offset + from + i) % static_cast<int64_t>(kFillerText.size()))];
      }
    };
    add_filler(0, depth);
    text.append(kNeedleHead).append(key).append(kNeedleMiddle).append(key).append(kNeedleTail);
    add_filler(depth, filler - depth);
    text.append(kQuestion).append(key);
    int64_t* s = out.tokens.data() + b * t.length;
    for (int64_t i = 0; i < t.length; ++i) s[i] = static_cast<unsigned char>(text[static_cast<size_t>(i)]);
    for (int64_t i = 0; i < t.digits; ++i) out.answers[static_cast<size_t>(b * (t.length - 1) + t.length - 1 - t.digits + i)] = 1;
  }
  return out;
}

}  // namespace attnmix::stream
