// SPDX-License-Identifier: Apache-2.0
// Chained-attention batches and the validating encoder (docs/mechanisms.md#building-blocks and #chained-attention).
#include <algorithm>
#include <string>

#include "attnmix/attention/chained.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"

namespace attnmix {

namespace {
std::span<const int64_t> all_of(const IdMatrix& m) { return {m.data(), static_cast<size_t>(m.size())}; }
std::span<const int64_t> all_of(const IdVector& v) { return {v.data(), static_cast<size_t>(v.size())}; }
int64_t max_or_minus_one(std::span<const int64_t> ids) {
  int64_t out = -1;
  for (int64_t id : ids) out = id > out ? id : out;
  return out;
}
}  // namespace

ChainedAttentionBatch::ChainedAttentionBatch() : storage_(std::make_shared<Storage>()) {}

ChainedAttentionBatch ChainedAttentionBatch::slice(Index begin, Index count) const {
  ATTNMIX_ASSERT(begin >= 0 && count >= 0 && begin + count <= count_, "batch slice out of range");
  ChainedAttentionBatch out = *this;
  out.begin_ = begin_ + begin;
  out.count_ = count;
  return out;
}

IdMatrix ChainedAttentionBatch::keys() const { return storage_->keys.middleRows(begin_, count_); }
IdMatrix ChainedAttentionBatch::values() const { return storage_->values.middleRows(begin_, count_); }
IdVector ChainedAttentionBatch::queries() const { return storage_->queries.segment(begin_, count_); }
IdVector ChainedAttentionBatch::targets() const { return storage_->targets.segment(begin_, count_); }

ChainedAttentionBatch ChainedAttentionEncoder::encode(IdMatrix keys, IdMatrix values, IdVector queries,
                                                      IdVector targets, std::string_view where) const {
  const Index n = keys.rows();
  if (values.rows() != n || values.cols() != keys.cols())
    throw ValueError(std::string(where) + ": keys and values must have the same shape (got " +
                     std::to_string(n) + "x" + std::to_string(keys.cols()) + " and " +
                     std::to_string(values.rows()) + "x" + std::to_string(values.cols()) + ")");
  if (queries.size() != n || targets.size() != n)
    throw ValueError(std::string(where) + ": keys, values, queries and targets must have the same number of "
                     "rows (" + std::to_string(n) + ", " + std::to_string(values.rows()) + ", " +
                     std::to_string(queries.size()) + ", " + std::to_string(targets.size()) + ")");
  if (n > 0 && keys.cols() <= 0)
    throw ValueError(std::string(where) + ": keys and values must have a positive width N");
  check::ids(where, "keys", all_of(keys), n_symbols);
  check::ids(where, "values", all_of(values), n_symbols);
  check::ids(where, "query", all_of(queries), n_symbols);
  check::ids(where, "target", all_of(targets), n_targets);
  auto storage = std::make_shared<ChainedAttentionBatch::Storage>();
  storage->max_symbol = std::max({max_or_minus_one(all_of(keys)), max_or_minus_one(all_of(values)),
                                  max_or_minus_one(all_of(queries))});
  storage->max_target = max_or_minus_one(all_of(targets));
  storage->keys = std::move(keys);
  storage->values = std::move(values);
  storage->queries = std::move(queries);
  storage->targets = std::move(targets);
  ChainedAttentionBatch batch;
  batch.storage_ = std::move(storage);
  batch.count_ = n;
  return batch;
}

}  // namespace attnmix
