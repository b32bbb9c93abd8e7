// SPDX-License-Identifier: Apache-2.0
#include "attnmix/attention/recall_task.hpp"

#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"

namespace attnmix {

namespace {
ResponsibilityAttentionBatch draw_rows(Index n, const RecallTaskOptions& o, const RecallTask& task, Rng& rng) {
  IdMatrix contexts(n, o.context_length);
  Matrix queries(n, o.query_dim);
  IdVector targets(n);
  for (Index row = 0; row < n; ++row) {
    const std::vector<int64_t> ctx = rng.sample_without_replacement(o.n_symbols, o.context_length);
    for (Index i = 0; i < o.context_length; ++i) contexts(row, i) = ctx[static_cast<size_t>(i)];
    const int64_t z = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(o.context_length)));
    const int64_t s = ctx[static_cast<size_t>(z)];
    for (Index d = 0; d < o.query_dim; ++d) queries(row, d) = task.symbol_codes(s, d) + o.noise * rng.normal();
    targets[row] = task.target_of_symbol[static_cast<size_t>(s)];
  }
  return ResponsibilityAttentionEncoder{o.n_symbols, o.context_length, o.query_dim, o.n_targets}.encode(
      std::move(contexts), std::move(queries), std::move(targets));
}
}  // namespace

RecallTask make_recall_task(Index n_train, Index n_test, uint64_t seed, const RecallTaskOptions& o) {
  constexpr const char* kWhere = "make_recall_task";
  check::positive_int(kWhere, "num_symbols", o.n_symbols);
  check::positive_int(kWhere, "context_length", o.context_length);
  check::positive_int(kWhere, "query_dim", o.query_dim);
  check::positive_int(kWhere, "num_targets", o.n_targets);
  if (n_train < 0 || n_test < 0)
    throw ValueError(std::string(kWhere) + ": n_train and n_test must be >= 0 (got " + std::to_string(n_train) + " and " +
                     std::to_string(n_test) + ")");
  if (o.context_length > o.n_symbols)
    throw ValueError(std::string(kWhere) + ": context_length must be <= num_symbols (contexts are distinct)");
  Rng rng(derive_seed(seed, SeedPurpose::kData, 0));
  RecallTask task;
  if (o.n_targets == o.n_symbols) {
    task.target_of_symbol = rng.sample_without_replacement(o.n_symbols, o.n_symbols);  // a permutation
  } else {
    task.target_of_symbol.resize(static_cast<size_t>(o.n_symbols));
    for (int64_t& t : task.target_of_symbol) t = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(o.n_targets)));
  }
  if (o.query_dim == o.n_symbols) {
    task.symbol_codes = Matrix::Identity(o.n_symbols, o.query_dim);
  } else {
    task.symbol_codes.resize(o.n_symbols, o.query_dim);
    for (Index k = 0; k < task.symbol_codes.size(); ++k) task.symbol_codes.data()[k] = rng.normal();
  }
  task.train = draw_rows(n_train, o, task, rng);
  task.test = draw_rows(n_test, o, task, rng);
  return task;
}

Matrix predict_position_only(const ResponsibilityAttention& model, const ResponsibilityAttentionBatch& batch) {
  const auto& p = model.params();
  Matrix out = Matrix::Zero(batch.n_rows(), model.n_targets());
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const int64_t* ctx = batch.context(n);
    for (Index i = 0; i < model.context_length(); ++i) out.row(n) += p.position_prior[i] * p.emission.row(ctx[i]);
  }
  return out;
}

double accuracy(const Matrix& proba, const IdVector& targets) {
  if (proba.rows() != targets.size()) throw ValueError("accuracy: one target per row is required");
  if (proba.rows() == 0) return 0.0;
  Index correct = 0;
  for (Index n = 0; n < proba.rows(); ++n) {
    Index best = 0;
    proba.row(n).maxCoeff(&best);
    correct += best == targets[n];
  }
  return static_cast<double>(correct) / static_cast<double>(proba.rows());
}

}  // namespace attnmix
