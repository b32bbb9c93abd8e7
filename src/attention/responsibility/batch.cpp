// SPDX-License-Identifier: Apache-2.0
// Responsibility-attention batches, the validating encoder and sequence_to_triples (docs/mechanisms.md#building-blocks
// and #responsibility-attention).
#include <cmath>
#include <string>
#include <utility>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/sizes.hpp"
#include "attnmix/core/errors.hpp"

namespace attnmix {

namespace {
constexpr const char* kEncoderWhere = "ResponsibilityAttentionDataEncoder";

/// The checks both kinds of queries share: `query_rows` queries (of either kind) for the n contexts and targets, the
/// context length, and the context and target ids. Returns the arrays with the contexts and targets moved in.
ResponsibilityAttentionArrays checked_rows(const ResponsibilityAttentionEncoder& encoder, IdMatrix contexts,
                                           Index query_rows, IdVector targets) {
  const Index n = contexts.rows();
  if (query_rows != n || targets.size() != n)
    throw ValueError(std::string(kEncoderWhere) + ": context, query and target must have the same number of rows (" +
                     std::to_string(n) + ", " + std::to_string(query_rows) + ", " + std::to_string(targets.size()) +
                     ")");
  if (encoder.context_length)
    check::dimension(kEncoderWhere, "context length N", *encoder.context_length, contexts.cols());
  if (contexts.cols() <= 0 && n > 0) throw ValueError(std::string(kEncoderWhere) + ": contexts must have width N >= 1");
  check::ids(kEncoderWhere, "context", {contexts.data(), static_cast<size_t>(contexts.size())}, encoder.n_symbols);
  check::ids(kEncoderWhere, "target", {targets.data(), static_cast<size_t>(targets.size())}, encoder.n_targets);
  ResponsibilityAttentionArrays arrays;
  arrays.max_symbol = contexts.size() ? contexts.maxCoeff() : -1;
  arrays.max_target = targets.size() ? targets.maxCoeff() : -1;
  arrays.contexts = std::move(contexts);
  arrays.targets = std::move(targets);
  return arrays;
}
}  // namespace

ResponsibilityAttentionBatch ResponsibilityAttentionEncoder::encode(IdMatrix contexts, Matrix queries,
                                                                    IdVector targets) const {
  const Index n = contexts.rows();
  ResponsibilityAttentionArrays arrays = checked_rows(*this, std::move(contexts), queries.rows(), std::move(targets));
  if (query_dim) check::dimension(kEncoderWhere, "query dimension D", *query_dim, queries.cols());
  if (queries.cols() <= 0 && n > 0) throw ValueError(std::string(kEncoderWhere) + ": queries must have D >= 1 columns");
  check::bounded_rows(kEncoderWhere, "query", queries);
  arrays.queries = std::move(queries);
  return {std::move(arrays), n};
}

ResponsibilityAttentionBatch ResponsibilityAttentionEncoder::encode_symbols(IdMatrix contexts, IdVector query_symbols,
                                                                            IdVector targets) const {
  const Index n = contexts.rows();
  ResponsibilityAttentionArrays arrays =
      checked_rows(*this, std::move(contexts), query_symbols.size(), std::move(targets));
  check::ids(kEncoderWhere, "query symbol", {query_symbols.data(), static_cast<size_t>(query_symbols.size())},
             query_dim);
  arrays.max_query_symbol = n ? query_symbols.maxCoeff() : -1;
  arrays.symbol_queries = true;
  arrays.symbol_query_dim = query_dim ? *query_dim : arrays.max_query_symbol + 1;
  arrays.query_symbols = std::move(query_symbols);
  return {std::move(arrays), n};
}

Matrix ResponsibilityAttentionBatch::queries() const {
  if (!has_symbol_queries()) return copy_of(arrays().queries);
  Matrix one_hot = Matrix::Zero(n_rows(), query_dim());
  for (Index row = 0; row < n_rows(); ++row) one_hot(row, query_symbol(row)) = 1.0;
  return one_hot;
}

void ResponsibilityAttentionBatch::check_query_dim(const char* where, Index D) const {
  if (n_rows() == 0) return;
  if (!has_symbol_queries()) {
    check::dimension(where, "batch query dimension D", D, query_dim());
  } else if (max_query_symbol() >= D) {
    throw ValueError(std::string(where) + ": out-of-range query symbol (" + std::to_string(max_query_symbol()) +
                     " >= D = " + std::to_string(D) + ")");
  }
}

ResponsibilityAttentionBatch sequence_to_triples(std::span<const int64_t> tokens, int64_t context_length,
                                                 std::optional<int64_t> n_symbols, const Matrix* embeddings) {
  constexpr const char* kWhere = "sequence_to_triples";
  check::positive_int(kWhere, "context_length", context_length);
  if (n_symbols) check::positive_int(kWhere, "num_symbols", *n_symbols);
  check::ids(kWhere, "tokens", tokens, n_symbols);
  int64_t max_token = -1;
  for (int64_t t : tokens) max_token = t > max_token ? t : max_token;
  const int64_t S = n_symbols ? *n_symbols : max_token + 1;
  if (S <= 0) throw ValueError(std::string(kWhere) + ": tokens must be non-empty when num_symbols is not given");
  if (embeddings) {
    if (embeddings->rows() < S || embeddings->cols() < 1)
      throw ValueError(std::string(kWhere) + ": embeddings must be 2-D with at least " + std::to_string(S) +
                       " rows (got " + std::to_string(embeddings->rows()) + "x" + std::to_string(embeddings->cols()) +
                       ")");
    check::bounded_reals(kWhere, "embeddings", {embeddings->data(), static_cast<size_t>(embeddings->size())});
  }
  const Index len = static_cast<Index>(tokens.size());
  const Index n = len > context_length ? len - context_length : 0;
  const Index D = embeddings ? embeddings->cols() : S;
  static_cast<void>(checked_product(kWhere, "the contexts (rows x context_length)", {n, context_length}));
  if (embeddings) static_cast<void>(checked_product(kWhere, "the queries (rows x query_dim)", {n, D}));
  IdMatrix contexts(n, context_length);
  IdVector current(n);
  IdVector targets(n);
  for (Index row = 0; row < n; ++row) {
    const Index p = row + context_length - 1;
    for (Index i = 0; i < context_length; ++i) contexts(row, i) = tokens[static_cast<size_t>(p - context_length + 1 + i)];
    current[row] = tokens[static_cast<size_t>(p)];
    targets[row] = tokens[static_cast<size_t>(p + 1)];
  }
  const ResponsibilityAttentionEncoder encoder{S, context_length, D, S};
  if (!embeddings) return encoder.encode_symbols(std::move(contexts), std::move(current), std::move(targets));
  Matrix queries(n, D);
  for (Index row = 0; row < n; ++row) queries.row(row) = embeddings->row(current[row]);
  return encoder.encode(std::move(contexts), std::move(queries), std::move(targets));
}

}  // namespace attnmix
