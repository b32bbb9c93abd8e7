// SPDX-License-Identifier: Apache-2.0
// Chained-attention batches and the validating encoder (docs/mechanisms.md#building-blocks and #chained-attention).
#include <algorithm>
#include <functional>
#include <string>
#include <utility>

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
  ChainedAttentionArrays arrays;
  arrays.max_symbol = std::max({max_or_minus_one(all_of(keys)), max_or_minus_one(all_of(values)),
                                max_or_minus_one(all_of(queries))});
  arrays.max_target = max_or_minus_one(all_of(targets));
  arrays.keys = std::move(keys);
  arrays.values = std::move(values);
  arrays.queries = std::move(queries);
  arrays.targets = std::move(targets);
  return {std::move(arrays), n};
}

ChainedAttentionBatch encode_draws(const ChainedAttentionEncoder& encoder, Index N, Index m,
                                   const std::function<ChainedAttentionObservation()>& draw) {
  IdMatrix keys(m, N), values(m, N);
  IdVector queries(m), targets(m);
  for (Index row = 0; row < m; ++row) {
    const ChainedAttentionObservation obs = draw();
    for (Index i = 0; i < N; ++i) {
      keys(row, i) = obs.keys[static_cast<size_t>(i)];
      values(row, i) = obs.values[static_cast<size_t>(i)];
    }
    queries[row] = obs.query;
    targets[row] = obs.target;
  }
  return encoder.encode(std::move(keys), std::move(values), std::move(queries), std::move(targets));
}

}  // namespace attnmix
