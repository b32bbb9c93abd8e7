// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the two variational families (private header): id scans, the M-step's embedding update and
// posterior-predictive tables.
#pragma once

#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/sharded_mstep.hpp"
#include "attnmix/stats/log_math.hpp"
#include "../lanes_impl.hpp"

namespace attnmix::variational {

inline std::span<const int64_t> all_of(const IdMatrix& m) { return {m.data(), static_cast<size_t>(m.size())}; }
inline std::span<const int64_t> all_of(const IdVector& v) { return {v.data(), static_cast<size_t>(v.size())}; }
inline int64_t max_or_minus_one(std::span<const int64_t> ids) {
  int64_t out = -1;
  for (int64_t id : ids) out = id > out ? id : out;
  return out;
}
inline double span_sum(const double* p, Index n) { return accurate_sum({p, static_cast<size_t>(n)}); }

/// ‖a − b‖² over D entries: 8-lane partial sums, the fixed horizontal sum, then the tail in order (the same
/// operations whatever the addresses, so results never depend on allocation).
inline double squared_distance(const double* __restrict a, const double* __restrict b, Index D) {
  using lanes::Lanes;
  Lanes acc{};
  Index d = 0;
  for (; d + lanes::kLanes <= D; d += lanes::kLanes) {
    const Lanes x = lanes::load(a + d) - lanes::load(b + d);
    acc += x * x;
  }
  double sum = lanes::horizontal_sum(acc);
  for (; d < D; ++d) {
    const double x = a[d] - b[d];
    sum += x * x;
  }
  return sum;
}

/// The M-step's embedding state (docs/mechanisms.md#variational-embedding-attention): without a carried state, the
/// initial one (m = initial_scale·N(0, 1) row-major and log v = log 0.3, from Rng(derive_seed(seed, kInit, 0)));
/// otherwise one Adam ascent step of the carried state with KL weight prior_weight(τ) for τ = carried iteration + 1.
/// @throws ValueError when the carried state belongs to another family or geometry.
template <class PriorWeight>
AttentionOptimizerState next_state(std::string_view where, std::string_view family,
                                   const std::shared_ptr<const AttentionOptimizerState>& carried,
                                   const ConstMatrixMap& grad_mean, const ConstMatrixMap& grad_log_var, uint64_t seed,
                                   double initial_scale, double lr, PriorWeight prior_weight) {
  const Index S = grad_mean.rows();
  const Index D = grad_mean.cols();
  if (!carried) {
    Rng rng(derive_seed(seed, SeedPurpose::kInit, 0));
    Matrix mean(S, D);
    for (Index k = 0; k < mean.size(); ++k) mean.data()[k] = initial_scale * rng.normal();
    return AttentionOptimizerState::fresh(std::string(family), std::move(mean),
                                          Matrix::Constant(S, D, std::log(0.3)), seed);
  }
  if (carried->family != family || carried->mean.rows() != S || carried->mean.cols() != D)
    throw ValueError(std::string(where) + ": the statistics carry an optimizer state of family '" + carried->family +
                     "' with embeddings " + std::to_string(carried->mean.rows()) + "x" +
                     std::to_string(carried->mean.cols()) + " (expected " + std::string(family) + ", " +
                     std::to_string(S) + "x" + std::to_string(D) + ")");
  return adam_ascent(*carried, grad_mean, grad_log_var, lr, prior_weight(carried->iteration + 1));
}

/// The sharded M-step of a variational family (inference/sharded_mstep.hpp): emission_count (field 2, S × T) summed
/// in this rank's rows only, every other field whole, the statistics checked (validate_owned), then
/// estimate_symbols(shard) — the family's M-step with its emission rows of shard. Collective.
template <class Accumulator, class EstimateSymbols>
auto sharded_mstep(std::string_view where, Accumulator& acc, const Communicator& comm,
                   EstimateSymbols estimate_symbols) {
  const SymbolShard shard = symbol_shard(comm, acc.n_symbols());
  const StatsSplit split{{table_run(acc.layout().fields()[2].offset, acc.n_targets(), shard)}, comm.rank()};
  sum_owned_statistics(acc, comm, split);
  acc.validate_owned(where, split, comm);
  return estimate_symbols(shard);
}

/// table = m + exp(½ log v) ⊙ ε with ε ~ N(0, 1) drawn row-major (a posterior-predictive embedding table).
inline void draw_table(const Matrix& mean, const Matrix& log_var, Rng& rng, Matrix& table) {
  table.resize(mean.rows(), mean.cols());
  for (Index k = 0; k < mean.size(); ++k)
    table.data()[k] = mean.data()[k] + std::exp(0.5 * log_var.data()[k]) * rng.normal();
}

/// Index drawn from the softmax of logits (−∞ entries never drawn); logits is overwritten.
inline int64_t draw_softmax(std::vector<double>& logits, Rng& rng) {
  double top = kNegInf;
  for (double x : logits) top = x > top ? x : top;
  for (double& x : logits) x = std::exp(x - top);
  return rng.categorical(logits);
}

}  // namespace attnmix::variational
