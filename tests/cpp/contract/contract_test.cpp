// SPDX-License-Identifier: Apache-2.0
// Instantiations of the shared distribution contract (docs/mechanisms.md#building-blocks), one traits struct per
// family, and the keyed tying row F-5 (docs/mechanisms.md#building-blocks).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/sparse_responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/stats/categorical.hpp"
#include "attnmix/stats/composite.hpp"
#include "attnmix/stats/gaussian.hpp"
#include "attnmix/stats/log_math.hpp"
#include "attnmix/stats/mixture.hpp"
#include "contract/distribution_contract.hpp"
#include "testing/all_close.hpp"

namespace attnmix::contract {
namespace {

Vector dirichlet(Rng& rng, Index k) {
  Vector p(k);
  rng.dirichlet_ones({p.data(), static_cast<size_t>(k)});
  p /= accurate_sum({p.data(), static_cast<size_t>(k)});
  return p;
}

/// Counts with a wide dynamic range (≈ e^±10) and about 30 % exact zeros: hard cases for
/// normalisation.
double rough_count(Rng& rng) {
  return rng.uniform() < 0.3 ? 0.0 : std::exp(20.0 * (rng.uniform() - 0.5));
}

// ----- responsibility attention
// ------------------------------------------------------------------------------

struct ResponsibilityAttentionTraits {
  using Distribution = ResponsibilityAttention;
  using Batch = ResponsibilityAttentionBatch;
  using Acc = ResponsibilityAttentionAccumulator;
  using Estimator = ResponsibilityAttentionEstimator;
  static constexpr uint64_t kSeed = 101;
  static constexpr bool kExactEm = true;
  static constexpr int64_t S = 5, N = 4, D = 3, T = 4;

  static Distribution make_model(Rng& rng) {
    ResponsibilityAttentionParams p;
    p.key_means.resize(S, D);
    for (Index k = 0; k < p.key_means.size(); ++k) p.key_means.data()[k] = 2.0 * rng.normal();
    p.emission.resize(S, T);
    for (Index s = 0; s < S; ++s) p.emission.row(s) = dirichlet(rng, T).transpose();
    p.position_prior = dirichlet(rng, N);
    p.sigma2 = 0.8;
    return Distribution(std::move(p));
  }
  static Batch make_batch(const Distribution& model, Index n, Rng& rng) {
    return model.sampler(rng.next_u64()).sample(n);
  }
  static Batch row_alone(const Batch& batch, Index row) {
    const Batch one = batch.slice(row, 1);
    return ResponsibilityAttentionEncoder{}.encode(one.contexts(), one.queries(), one.targets());
  }
  static Estimator make_estimator(const Distribution& model) {
    ResponsibilityAttentionEstimatorOptions options;
    options.sigma2 = model.sigma2();
    options.emission_smoothing = 0.0;  // exact EM
    return {S, N, D, T, options};
  }
  static Acc other_layout_accumulator(const Distribution& /*model*/) { return {S + 1, N, D, T}; }
  static double total_mass(const Acc& acc) { return acc.total_mass(); }
  static bool tamper(Acc& acc) {
    acc.key_mass()[0] += 1.0;  // Σ key_mass now exceeds Σ position_count
    return true;
  }
  /// Emission = identity (S = T = 3): a target no context symbol emits is impossible.
  static std::optional<ImpossibleCase<Distribution>> impossible_case(Rng& rng) {
    ResponsibilityAttentionParams p;
    p.key_means.resize(3, 2);
    for (Index k = 0; k < p.key_means.size(); ++k) p.key_means.data()[k] = rng.normal();
    p.emission = Matrix::Identity(3, 3);
    p.position_prior = Vector::Constant(2, 0.5);
    IdMatrix contexts(6, 2);
    contexts << 0, 1, 0, 1, 2, 2, 1, 0, 1, 2, 0, 0;
    const IdVector targets = (IdVector(6) << 0, 2, 2, 2, 1, 1).finished();
    Matrix queries(6, 2);
    for (Index k = 0; k < queries.size(); ++k) queries.data()[k] = rng.normal();
    Batch batch = ResponsibilityAttentionEncoder{3, 2, 2, 3}.encode(contexts, queries, targets);
    return ImpossibleCase<Distribution>{Distribution(std::move(p)), std::move(batch), {1, 3, 5}};
  }
  /// T = 10⁵ random emission counts whose masses obey the laws; default smoothing and none.
  static std::vector<std::pair<Estimator, Acc>> large_support(Rng& rng) {
    const int64_t s = 3, n = 2, d = 2, t = 100000;
    Acc acc(s, n, d, t);
    for (Index k = 0; k < acc.emission_count().size(); ++k)
      acc.emission_count().data()[k] = rough_count(rng);
    acc.emission_count()(1, 7) = 0.0;
    acc.emission_count().row(2).setZero();  // an all-zero row: uniform without smoothing
    double total = 0.0;
    for (Index r = 0; r < s; ++r) {
      const ConstMatrixMap counts = std::as_const(acc).emission_count();
      acc.key_mass()[r] = accurate_sum({counts.data() + r * t, static_cast<size_t>(t)});
      total += acc.key_mass()[r];
      for (Index c = 0; c < d; ++c) acc.key_sum()(r, c) = rng.normal() * acc.key_mass()[r];
    }
    acc.position_count() << 0.3 * total, 0.7 * total;
    acc.query_sq() = 10.0 * total;
    ResponsibilityAttentionEstimatorOptions none;
    none.emission_smoothing = 0.0;
    return {{Estimator(s, n, d, t), acc}, {Estimator(s, n, d, t, none), acc}};
  }
};

// ----- responsibility attention with sparse tables
// ---------------------------------------------------------------------

/// Patterns that list every cell, so that every row the generator draws has its cells (sparse_responsibility_test.cpp
/// checks the tables against the dense family where they list fewer).
SparsePattern every_cell(Index rows, Index cols) {
  std::vector<int64_t> r, c;
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) {
      r.push_back(i);
      c.push_back(j);
    }
  return SparsePattern::of_cells(rows, cols, r, c);
}

struct SparseResponsibilityAttentionTraits {
  using Distribution = SparseResponsibilityAttention;
  using Batch = ResponsibilityAttentionBatch;
  using Acc = SparseResponsibilityAttentionAccumulator;
  using Estimator = SparseResponsibilityAttentionEstimator;
  static constexpr uint64_t kSeed = 131;
  static constexpr bool kExactEm = true;
  static constexpr int64_t S = 5, N = 4, D = 6, T = 4;

  static SparsePatterns full(Index s, Index d, Index t) {
    return {std::make_shared<const SparsePattern>(every_cell(s, d)),
            std::make_shared<const SparsePattern>(every_cell(s, t))};
  }
  static Distribution make_model(Rng& rng) {
    SparseResponsibilityAttentionParams p;
    p.patterns = full(S, D, T);
    p.key_values.resize(S * D);
    for (double& k : p.key_values) k = rng.normal();
    p.emission_values.resize(S * T);
    for (Index s = 0; s < S; ++s) p.emission_values.segment(s * T, T) = dirichlet(rng, T);
    p.emission_default = Vector::Zero(S);
    p.position_prior = dirichlet(rng, N);
    p.sigma2 = 0.8;
    return Distribution(std::move(p));
  }
  static Batch make_batch(const Distribution& /*model*/, Index n, Rng& rng) {
    IdMatrix contexts(n, N);
    IdVector queries(n), targets(n);
    for (Index row = 0; row < n; ++row) {
      for (Index i = 0; i < N; ++i) contexts(row, i) = static_cast<int64_t>(rng.uniform_int(S));
      queries[row] = static_cast<int64_t>(rng.uniform_int(D));
      targets[row] = static_cast<int64_t>(rng.uniform_int(T));
    }
    return ResponsibilityAttentionEncoder{S, N, D, T}.encode_symbols(contexts, queries, targets);
  }
  static Batch row_alone(const Batch& batch, Index row) {
    const Batch one = batch.slice(row, 1);
    return ResponsibilityAttentionEncoder{}.encode_symbols(one.contexts(), one.query_symbols(), one.targets());
  }
  static Estimator make_estimator(const Distribution& model) {
    SparseResponsibilityAttentionEstimatorOptions options;
    options.sigma2 = model.sigma2();
    options.emission_smoothing = 0.0;  // exact EM
    return {model.params().patterns, N, options};
  }
  static Acc other_layout_accumulator(const Distribution& /*model*/) { return {full(S + 1, D, T), N}; }
  static double total_mass(const Acc& acc) { return acc.total_mass(); }
  static bool tamper(Acc& acc) {
    acc.key_mass()[0] += 1.0;  // Σ key_mass now exceeds Σ position_count
    return true;
  }
  /// The dense family's case (emission = identity) with every cell listed and symbol queries: the same rows are
  /// impossible.
  static std::optional<ImpossibleCase<Distribution>> impossible_case(Rng& rng) {
    const auto dense = ResponsibilityAttentionTraits::impossible_case(rng);
    const ResponsibilityAttentionParams& d = dense->model.params();
    SparseResponsibilityAttentionParams p;
    p.patterns = full(d.key_means.rows(), d.key_means.cols(), d.emission.cols());
    p.key_values = Eigen::Map<const Vector>(d.key_means.data(), d.key_means.size());  // row-major: the pattern's order
    p.emission_values = Eigen::Map<const Vector>(d.emission.data(), d.emission.size());
    p.emission_default = Vector::Zero(d.emission.rows());
    p.position_prior = d.position_prior;
    IdVector queries(dense->batch.n_rows());
    for (Index row = 0; row < queries.size(); ++row) queries[row] = row % d.key_means.cols();
    Batch batch = ResponsibilityAttentionEncoder{}.encode_symbols(dense->batch.contexts(), queries,
                                                                  dense->batch.targets());
    return ImpossibleCase<Distribution>{Distribution(std::move(p)), std::move(batch), dense->rows};
  }
};

// ----- chained attention
// ------------------------------------------------------------------------------------

struct ChainedAttentionTraits {
  using Distribution = ChainedAttention;
  using Batch = ChainedAttentionBatch;
  using Acc = ChainedAttentionAccumulator;
  using Estimator = ChainedAttentionEstimator;
  static constexpr uint64_t kSeed = 707;
  static constexpr bool kExactEm = false;
  static constexpr int64_t L = 2, S = 5, T = 4, N = 4;

  static Distribution make_model(Rng& rng) {
    ChainedAttentionParams p;
    for (Index hop = 0; hop < L; ++hop) {
      Matrix K(S, S);
      for (Index k = 0; k < K.size(); ++k) K.data()[k] = rng.normal();
      p.key_tables.push_back(std::move(K));
    }
    p.emission.resize(S, T);
    for (Index s = 0; s < S; ++s) p.emission.row(s) = dirichlet(rng, T).transpose();
    p.sigma2 = 0.5;
    return Distribution(std::move(p));
  }
  static Batch make_batch(const Distribution& model, Index n, Rng& rng) {
    return model.sampler(rng.next_u64(), N).sample(n);
  }
  static Batch row_alone(const Batch& batch, Index row) {
    const Batch one = batch.slice(row, 1);
    return ChainedAttentionEncoder{}.encode(one.keys(), one.values(), one.queries(), one.targets());
  }
  static Estimator make_estimator(const Distribution& model) {
    ChainedAttentionEstimatorOptions options;
    options.sigma2 = model.sigma2();
    options.emission_smoothing = 0.0;
    return {L, S, T, options};
  }
  static Acc other_layout_accumulator(const Distribution& /*model*/) { return {L, S + 1, T}; }
  static double total_mass(const Acc& acc) { return acc.n(); }
  static bool tamper(Acc& acc) {
    acc.key_mass()(1, 0) += 1.0;  // Σ key_mass[1] now exceeds n
    return true;
  }
  /// Emission = identity (S = T = 3): a row whose target is none of its values is impossible
  /// (docs/mechanisms.md#chained-attention).
  static std::optional<ImpossibleCase<Distribution>> impossible_case(Rng& rng) {
    ChainedAttentionParams p;
    for (Index hop = 0; hop < L; ++hop) {
      Matrix K(3, 3);
      for (Index k = 0; k < K.size(); ++k) K.data()[k] = rng.normal();
      p.key_tables.push_back(std::move(K));
    }
    p.emission = Matrix::Identity(3, 3);
    IdMatrix keys(6, 2), values(6, 2);
    keys << 0, 1, 2, 2, 1, 0, 0, 0, 2, 1, 1, 2;
    values << 0, 1, 0, 1, 2, 2, 1, 1, 0, 2, 0, 0;
    const IdVector queries = (IdVector(6) << 0, 1, 2, 0, 1, 2).finished();
    const IdVector targets = (IdVector(6) << 1, 2, 2, 0, 2, 1).finished();  // rows 1, 3, 5: no value emits it
    Batch batch = ChainedAttentionEncoder{3, 3}.encode(keys, values, queries, targets);
    return ImpossibleCase<Distribution>{Distribution(std::move(p)), std::move(batch), {1, 3, 5}};
  }
  /// T = 10⁵ random emission counts whose masses obey the laws; default smoothing and none.
  static std::vector<std::pair<Estimator, Acc>> large_support(Rng& rng) {
    const int64_t l = 2, s = 3, t = 100000;
    Acc acc(l, s, t);
    for (Index k = 0; k < acc.emission_count().size(); ++k) acc.emission_count().data()[k] = rough_count(rng);
    acc.emission_count()(1, 7) = 0.0;
    acc.emission_count().row(2).setZero();  // an all-zero row: uniform without smoothing
    const ConstMatrixMap counts = std::as_const(acc).emission_count();
    const double total = accurate_sum({counts.data(), static_cast<size_t>(counts.size())});
    acc.n() = total;
    for (Index hop = 0; hop < l; ++hop) {
      acc.key_mass().row(hop) << 0.2 * total, 0.5 * total, 0.3 * total;
      for (Index r = 0; r < s; ++r)
        for (Index c = 0; c < s; ++c) acc.key_num(hop)(r, c) = rng.uniform() * acc.key_mass()(hop, r);
    }
    ChainedAttentionEstimatorOptions none;
    none.emission_smoothing = 0.0;
    return {{Estimator(l, s, t), acc}, {Estimator(l, s, t, none), acc}};
  }
};

// ----- variational embedding attention
// ----------------------------------------------------------------------

/// The variational families (docs/mechanisms.md#variational-embedding-attention and #variational-multi-hop-attention)
/// run the whole contract. Their E-step is a Monte-Carlo estimate whose noise depends only on the model's optimizer
/// state (seed, iteration), so every law below (merge = concatenation, snapshots, zero weights, scaling, atomic
/// impossible evidence, thread-count invariance) holds exactly as for an exact family. Only the EM monotonicity check
/// is skipped (kExactEm = false): each M-step is one stochastic Adam step on the ELBO, which need not increase the
/// plug-in log-likelihood that optimize() scores.
struct VariationalEmbeddingAttentionTraits {
  using Distribution = VariationalEmbeddingAttention;
  using Batch = VariationalEmbeddingAttentionBatch;
  using Acc = VariationalEmbeddingAttentionAccumulator;
  using Estimator = VariationalEmbeddingAttentionEstimator;
  static constexpr uint64_t kSeed = 808;
  static constexpr bool kExactEm = false;  // the objective is stochastic (one Adam step on a Monte-Carlo ELBO)
  static constexpr int64_t S = 5, N = 4, D = 3, T = 4;

  /// Means N(0, 1), log variances log 0.3 ± 0.3, Dirichlet emission and prior, and a carried optimizer state
  /// (seed 17, iteration 2, non-zero moments) so the noise stream is not the default one.
  static Distribution make_model(Rng& rng) {
    VariationalEmbeddingAttentionParams p;
    p.mean.resize(S, D);
    p.log_var.resize(S, D);
    for (Index k = 0; k < p.mean.size(); ++k) {
      p.mean.data()[k] = rng.normal();
      p.log_var.data()[k] = std::log(0.3) + 0.3 * rng.normal();
    }
    p.emission.resize(S, T);
    for (Index s = 0; s < S; ++s) p.emission.row(s) = dirichlet(rng, T).transpose();
    p.position_prior = dirichlet(rng, N);
    p.sigma2 = 0.5;
    AttentionOptimizerState state = AttentionOptimizerState::fresh(Distribution::kFamily, p.mean, p.log_var, 17);
    state.iteration = 2;
    state.mean_first_moment = Matrix::Constant(S, D, 0.01);
    state.mean_second_moment = Matrix::Constant(S, D, 0.02);
    p.optimizer_state = std::move(state);
    return Distribution(std::move(p));
  }
  static Batch make_batch(const Distribution& model, Index n, Rng& rng) {
    return model.sampler(rng.next_u64()).sample(n);
  }
  static Batch row_alone(const Batch& batch, Index row) {
    const Batch one = batch.slice(row, 1);
    return VariationalEmbeddingAttentionEncoder{}.encode(one.contexts(), one.queries(), one.targets());
  }
  static Estimator make_estimator(const Distribution& model) {
    VariationalEmbeddingAttentionEstimatorOptions options;
    options.sigma2 = model.sigma2();
    options.seed = model.optimizer_state().seed;
    options.mc = 3;
    return {S, N, D, T, options};
  }
  static Acc other_layout_accumulator(const Distribution& /*model*/) { return {S + 1, N, D, T}; }
  static double total_mass(const Acc& acc) { return acc.n(); }
  static bool tamper(Acc& acc) {
    acc.position_count()[0] += 1.0;  // Σ position_count now exceeds n
    return true;
  }
  /// Emission = identity (S = T = 3) and π = (½, ½): a target no context symbol emits is impossible.
  static std::optional<ImpossibleCase<Distribution>> impossible_case(Rng& rng) {
    VariationalEmbeddingAttentionParams p;
    p.mean.resize(3, 2);
    for (Index k = 0; k < p.mean.size(); ++k) p.mean.data()[k] = rng.normal();
    p.log_var = Matrix::Constant(3, 2, std::log(0.3));
    p.emission = Matrix::Identity(3, 3);
    p.position_prior = Vector::Constant(2, 0.5);
    IdMatrix contexts(6, 2);
    contexts << 0, 1, 0, 1, 2, 2, 1, 0, 1, 2, 0, 0;
    const IdVector queries = (IdVector(6) << 0, 1, 2, 0, 1, 2).finished();
    const IdVector targets = (IdVector(6) << 0, 2, 2, 2, 1, 1).finished();
    Batch batch = VariationalEmbeddingAttentionEncoder{3, 2, 3}.encode(contexts, queries, targets);
    return ImpossibleCase<Distribution>{Distribution(std::move(p)), std::move(batch), {1, 3, 5}};
  }
  /// T = 10⁵ random emission counts whose masses obey the laws: state-free statistics (the initialisation call) and
  /// statistics carrying a state (one Adam step); default smoothing and none.
  static std::vector<std::pair<Estimator, Acc>> large_support(Rng& rng) {
    const int64_t s = 3, n = 2, d = 2, t = 100000;
    Acc acc(s, n, d, t);
    for (Index k = 0; k < acc.emission_count().size(); ++k) acc.emission_count().data()[k] = rough_count(rng);
    acc.emission_count()(1, 7) = 0.0;
    acc.emission_count().row(2).setZero();  // an all-zero row: uniform without smoothing
    const ConstMatrixMap counts = std::as_const(acc).emission_count();
    const double total = accurate_sum({counts.data(), static_cast<size_t>(counts.size())});
    acc.n() = total;
    acc.position_count() << 0.4 * total, 0.6 * total;
    Acc with_state = acc;
    for (Index k = 0; k < with_state.grad_mean().size(); ++k) with_state.grad_mean().data()[k] = rng.normal();
    with_state.set_optimizer_state(std::make_shared<const AttentionOptimizerState>(AttentionOptimizerState::fresh(
        Distribution::kFamily, Matrix::Zero(s, d), Matrix::Zero(s, d), 0)));
    VariationalEmbeddingAttentionEstimatorOptions none;
    none.emission_smoothing = 0.0;
    return {{Estimator(s, n, d, t), acc},
            {Estimator(s, n, d, t, none), acc},
            {Estimator(s, n, d, t), with_state},
            {Estimator(s, n, d, t, none), with_state}};
  }
};

// ----- variational multi-hop attention
// -----------------------------------------------------------------------

/// As VariationalEmbeddingAttentionTraits (see there why kExactEm is false); the statistics have one internal mass
/// law, Σ emission_count = n.
struct VariationalMultiHopAttentionTraits {
  using Distribution = VariationalMultiHopAttention;
  using Batch = ChainedAttentionBatch;
  using Acc = VariationalMultiHopAttentionAccumulator;
  using Estimator = VariationalMultiHopAttentionEstimator;
  static constexpr uint64_t kSeed = 909;
  static constexpr bool kExactEm = false;  // the objective is stochastic (one Adam step on a Monte-Carlo ELBO)
  static constexpr int64_t S = 5, D = 3, T = 4, N = 4;

  static Distribution make_model(Rng& rng) {
    VariationalMultiHopAttentionParams p;
    p.mean.resize(S, D);
    p.log_var.resize(S, D);
    for (Index k = 0; k < p.mean.size(); ++k) {
      p.mean.data()[k] = rng.normal();
      p.log_var.data()[k] = std::log(0.3) + 0.3 * rng.normal();
    }
    p.emission.resize(S, T);
    for (Index s = 0; s < S; ++s) p.emission.row(s) = dirichlet(rng, T).transpose();
    p.sigma2 = 0.3;
    AttentionOptimizerState state = AttentionOptimizerState::fresh(Distribution::kFamily, p.mean, p.log_var, 23);
    state.iteration = 5;
    p.optimizer_state = std::move(state);
    return Distribution(std::move(p));
  }
  static Batch make_batch(const Distribution& model, Index n, Rng& rng) {
    return model.sampler(rng.next_u64(), N).sample(n);
  }
  static Batch row_alone(const Batch& batch, Index row) {
    const Batch one = batch.slice(row, 1);
    return ChainedAttentionEncoder{}.encode(one.keys(), one.values(), one.queries(), one.targets());
  }
  static Estimator make_estimator(const Distribution& model) {
    VariationalMultiHopAttentionEstimatorOptions options;
    options.sigma2 = model.sigma2();
    options.seed = model.optimizer_state().seed;
    options.mc = 2;
    return {S, D, T, options};
  }
  static Acc other_layout_accumulator(const Distribution& /*model*/) { return {S + 1, D, T}; }
  static double total_mass(const Acc& acc) { return acc.n(); }
  static bool tamper(Acc& acc) {
    acc.emission_count()(0, 0) += 1.0;  // Σ emission_count now exceeds n
    return true;
  }
  /// Emission = identity (S = T = 3): a row whose target is none of its values is impossible
  /// (docs/mechanisms.md#variational-multi-hop-attention).
  static std::optional<ImpossibleCase<Distribution>> impossible_case(Rng& rng) {
    VariationalMultiHopAttentionParams p;
    p.mean.resize(3, 2);
    for (Index k = 0; k < p.mean.size(); ++k) p.mean.data()[k] = rng.normal();
    p.log_var = Matrix::Constant(3, 2, std::log(0.3));
    p.emission = Matrix::Identity(3, 3);
    IdMatrix keys(6, 2), values(6, 2);
    keys << 0, 1, 2, 2, 1, 0, 0, 0, 2, 1, 1, 2;
    values << 0, 1, 0, 1, 2, 2, 1, 1, 0, 2, 0, 0;
    const IdVector queries = (IdVector(6) << 0, 1, 2, 0, 1, 2).finished();
    const IdVector targets = (IdVector(6) << 1, 2, 2, 0, 2, 1).finished();  // rows 1, 3, 5: no value emits it
    Batch batch = ChainedAttentionEncoder{3, 3}.encode(keys, values, queries, targets);
    return ImpossibleCase<Distribution>{Distribution(std::move(p)), std::move(batch), {1, 3, 5}};
  }
  /// T = 10⁵ random emission counts with n = Σ counts, with and without a carried state; default smoothing and none.
  static std::vector<std::pair<Estimator, Acc>> large_support(Rng& rng) {
    const int64_t s = 3, d = 2, t = 100000;
    Acc acc(s, d, t);
    for (Index k = 0; k < acc.emission_count().size(); ++k) acc.emission_count().data()[k] = rough_count(rng);
    acc.emission_count()(1, 7) = 0.0;
    acc.emission_count().row(2).setZero();
    const ConstMatrixMap counts = std::as_const(acc).emission_count();
    acc.n() = accurate_sum({counts.data(), static_cast<size_t>(counts.size())});
    Acc with_state = acc;
    with_state.set_optimizer_state(std::make_shared<const AttentionOptimizerState>(AttentionOptimizerState::fresh(
        Distribution::kFamily, Matrix::Zero(s, d), Matrix::Zero(s, d), 0)));
    VariationalMultiHopAttentionEstimatorOptions none;
    none.emission_smoothing = 0.0;
    return {{Estimator(s, d, t), acc},
            {Estimator(s, d, t, none), acc},
            {Estimator(s, d, t), with_state},
            {Estimator(s, d, t, none), with_state}};
  }
};

// ----- categorical
// -------------------------------------------------------------------------------------------

struct CategoricalTraits {
  using Distribution = Categorical;
  using Batch = CategoricalBatch;
  using Acc = CategoricalAccumulator;
  using Estimator = CategoricalEstimator;
  static constexpr uint64_t kSeed = 202;
  static constexpr bool kExactEm = true;
  static constexpr int64_t K = 6;

  static Distribution make_model(Rng& rng) { return Distribution({dirichlet(rng, K), "c"}); }
  static Batch make_batch(const Distribution& model, Index n, Rng& rng) {
    return model.sampler(rng.next_u64()).sample(n);
  }
  static Batch row_alone(const Batch& batch, Index row) {
    return CategoricalEncoder{}.encode(IdVector::Constant(1, batch.id(row)));
  }
  static Estimator make_estimator(const Distribution& /*model*/) { return Estimator(K); }
  static Acc other_layout_accumulator(const Distribution& /*model*/) { return Acc(K + 1); }
  static double total_mass(const Acc& acc) { return acc.total_mass(); }
  static bool tamper(Acc& /*acc*/) { return false; }  // one field: the only mass law is nobs
  static std::optional<ImpossibleCase<Distribution>> impossible_case(Rng& /*rng*/) {
    Vector p(5);
    p << 0.5, 0.0, 0.25, 0.0, 0.25;
    Batch batch = CategoricalEncoder{5}.encode((IdVector(8) << 0, 1, 2, 3, 4, 0, 3, 2).finished());
    return ImpossibleCase<Distribution>{
        Distribution({p, "impossible"}), std::move(batch), {1, 3, 6}};
  }
  static std::vector<std::pair<Estimator, Acc>> large_support(Rng& rng) {
    const int64_t k = 100000;
    Acc acc(k);
    for (Index i = 0; i < k; ++i) acc.counts()[i] = rough_count(rng);
    Acc zero(k);  // zero total: uniform
    CategoricalEstimatorOptions smooth;
    smooth.smoothing = 0.37;
    return {{Estimator(k), acc}, {Estimator(k, smooth), acc}, {Estimator(k), zero}};
  }
};

// ----- diagonal Gaussian
// -------------------------------------------------------------------------------------

struct DiagonalGaussianTraits {
  using Distribution = DiagonalGaussian;
  using Batch = DiagonalGaussianBatch;
  using Acc = DiagonalGaussianAccumulator;
  using Estimator = DiagonalGaussianEstimator;
  static constexpr uint64_t kSeed = 303;
  static constexpr bool kExactEm = true;
  static constexpr int64_t D = 3;

  static Distribution make_model(Rng& rng) {
    DiagonalGaussianParams p;
    p.mu.resize(D);
    p.sigma2.resize(D);
    for (Index d = 0; d < D; ++d) {
      p.mu[d] = 3.0 * rng.normal();
      p.sigma2[d] = 0.5 + rng.uniform();
    }
    return Distribution(std::move(p));
  }
  static Batch make_batch(const Distribution& model, Index n, Rng& rng) {
    return model.sampler(rng.next_u64()).sample(n);
  }
  static Batch row_alone(const Batch& batch, Index row) {
    return DiagonalGaussianEncoder{}.encode(batch.slice(row, 1).values());
  }
  static Estimator make_estimator(const Distribution& /*model*/) { return Estimator(D); }
  static Acc other_layout_accumulator(const Distribution& /*model*/) { return Acc(D + 1); }
  static double total_mass(const Acc& acc) { return acc.count(); }
  static bool tamper(Acc& /*acc*/) { return false; }
};

// ----- mixture of two responsibility-attention heads (through AnyBatch)
// --------------------------------------

struct MixtureOfAttentionTraits {
  using Distribution = Mixture;
  using Batch = AnyBatch;
  using Acc = MixtureAccumulator;
  using Estimator = MixtureEstimator;
  using RA = ResponsibilityAttentionTraits;
  static constexpr uint64_t kSeed = 404;
  static constexpr bool kExactEm = true;

  static Distribution make_model(Rng& rng) {
    return Mixture({AnyDistribution(RA::make_model(rng)), AnyDistribution(RA::make_model(rng))},
                   dirichlet(rng, 2));
  }
  static Batch make_batch(const Distribution& model, Index n, Rng& rng) {
    return model.components()[0].sample(n, rng.next_u64());
  }
  static Batch row_alone(const Batch& batch, Index row) {
    return AnyBatch(RA::row_alone(batch.get<RA::Batch>("row_alone"), row));
  }
  static Estimator make_estimator(const Distribution& model) {
    std::vector<AnyEstimator> estimators;
    for (const AnyDistribution& c : model.components())
      estimators.emplace_back(RA::make_estimator(*c.get_if<ResponsibilityAttention>()));
    return MixtureEstimator(std::move(estimators));
  }
  static Acc other_layout_accumulator(const Distribution& /*model*/) {
    return Acc({AnyAccumulator(RA::Acc(RA::S + 1, RA::N, RA::D, RA::T)),
                AnyAccumulator(RA::Acc(RA::S, RA::N, RA::D, RA::T))});
  }
  static double total_mass(const Acc& acc) {
    return accurate_sum({acc.comp_count().data(), static_cast<size_t>(acc.comp_count().size())});
  }
  static bool tamper(Acc& acc) { return RA::tamper(acc.children()[1].get<RA::Acc>("tamper")); }
  /// Both components have identity emissions: the impossible rows are impossible under every
  /// component.
  static std::optional<ImpossibleCase<Distribution>> impossible_case(Rng& rng) {
    auto first = RA::impossible_case(rng);
    auto second = RA::impossible_case(rng);
    Mixture model({AnyDistribution(first->model), AnyDistribution(second->model)},
                  Vector::Constant(2, 0.5));
    return ImpossibleCase<Distribution>{std::move(model), AnyBatch(first->batch), first->rows};
  }
};

// ----- composite: categorical label × Gaussian feature
// -------------------------------------------------------

struct CompositeTraits {
  using Distribution = Composite;
  using Batch = CompositeBatch;
  using Acc = CompositeAccumulator;
  using Estimator = CompositeEstimator;
  using Cat = CategoricalTraits;
  using Gauss = DiagonalGaussianTraits;
  static constexpr uint64_t kSeed = 505;
  static constexpr bool kExactEm = true;

  static Distribution make_model(Rng& rng) {
    return Composite(
        {AnyDistribution(Cat::make_model(rng)), AnyDistribution(Gauss::make_model(rng))});
  }
  static Batch make_batch(const Distribution& model, Index n, Rng& rng) {
    return model.sampler(rng.next_u64()).sample(n);
  }
  static Batch row_alone(const Batch& batch, Index row) {
    return CompositeBatch(
        {AnyBatch(Cat::row_alone(batch.field(0).get<Cat::Batch>("row_alone"), row)),
         AnyBatch(Gauss::row_alone(batch.field(1).get<Gauss::Batch>("row_alone"), row))});
  }
  static Estimator make_estimator(const Distribution& /*model*/) {
    return CompositeEstimator(
        {AnyEstimator(Cat::Estimator(Cat::K)), AnyEstimator(Gauss::Estimator(Gauss::D))});
  }
  static Acc other_layout_accumulator(const Distribution& /*model*/) {
    return Acc({AnyAccumulator(Cat::Acc(Cat::K + 1)), AnyAccumulator(Gauss::Acc(Gauss::D))});
  }
  static double total_mass(const Acc& acc) {
    return acc.components()[0].get<Cat::Acc>("total_mass").total_mass();
  }
  static bool tamper(Acc& /*acc*/) {
    return false;
  }  // neither child has an internal law (see composite_test.cpp)
  static std::optional<ImpossibleCase<Distribution>> impossible_case(Rng& rng) {
    auto label = Cat::impossible_case(rng);
    const Distribution model(
        {AnyDistribution(label->model), AnyDistribution(Gauss::make_model(rng))});
    const AnyBatch feature(Gauss::make_batch(*model.components()[1].get_if<DiagonalGaussian>(),
                                             label->batch.n_rows(), rng));
    return ImpossibleCase<Distribution>{model, CompositeBatch({AnyBatch(label->batch), feature}),
                                        label->rows};
  }
};

using Families =
    ::testing::Types<ResponsibilityAttentionTraits, SparseResponsibilityAttentionTraits, ChainedAttentionTraits,
                     CategoricalTraits, DiagonalGaussianTraits, MixtureOfAttentionTraits, CompositeTraits,
                     VariationalEmbeddingAttentionTraits, VariationalMultiHopAttentionTraits>;
INSTANTIATE_TYPED_TEST_SUITE_P(Families, DistributionContractTest, Families);
// The Gaussian's density is positive everywhere, so it has no impossible evidence.
using FamiliesWithImpossibleEvidence =
    ::testing::Types<ResponsibilityAttentionTraits, SparseResponsibilityAttentionTraits, ChainedAttentionTraits,
                     CategoricalTraits, MixtureOfAttentionTraits, CompositeTraits,
                     VariationalEmbeddingAttentionTraits, VariationalMultiHopAttentionTraits>;
INSTANTIATE_TYPED_TEST_SUITE_P(Families, ImpossibleEvidenceContractTest, FamiliesWithImpossibleEvidence);
using FamiliesWithLargeSupport =
    ::testing::Types<ResponsibilityAttentionTraits, ChainedAttentionTraits, CategoricalTraits,
                     VariationalEmbeddingAttentionTraits, VariationalMultiHopAttentionTraits>;
INSTANTIATE_TYPED_TEST_SUITE_P(Families, LargeSupportContractTest, FamiliesWithLargeSupport);

// ----- F-5: keyed tying
// --------------------------------------------------------------------------------------

/// F-5 (docs/mechanisms.md#building-blocks): two RA components of a mixture whose estimators carry the same key end one
/// EM step with identical parameters, equal (rel 1e-12) to estimate() of the sum of their separate
/// statistics; the tying is the same through optimize's em_step and by hand.
TEST(KeyTyingTest, TiedMixtureComponentsShareEstimateOfSummedStatistics) {
  using RA = ResponsibilityAttentionTraits;
  const uint64_t seed = testing::test_seed(606);
  SCOPED_TRACE("test seed " + std::to_string(seed));
  Rng rng(seed);
  const Mixture model({AnyDistribution(RA::make_model(rng)), AnyDistribution(RA::make_model(rng))},
                      dirichlet(rng, 2));
  const AnyBatch batch = model.components()[0].sample(200, rng.next_u64());
  ResponsibilityAttentionEstimatorOptions options;
  options.keys = "shared";
  const RA::Estimator ra_estimator(RA::S, RA::N, RA::D, RA::T, options);
  const MixtureEstimator estimator({AnyEstimator(ra_estimator), AnyEstimator(ra_estimator)});

  // Untied statistics: the oracle is estimate(c_0 + c_1).
  const std::vector<double> ones(static_cast<size_t>(batch.n_rows()), 1.0);
  MixtureAccumulator untied = estimator.make_accumulator();
  model.accumulate(batch, ones, untied);
  RA::Acc summed = untied.components()[0].get<RA::Acc>("F-5");
  summed.combine(untied.components()[1].get<RA::Acc>("F-5"));
  const ResponsibilityAttention expected = ra_estimator.estimate(std::nullopt, summed);

  // By hand: key_merge / key_replace over the type-erased top-level accumulator.
  AnyAccumulator tied(untied);
  tie_keys(tied);
  const Mixture by_hand = estimator.estimate(std::nullopt, tied.get<MixtureAccumulator>("F-5"));
  // Through optimize's em_step on the type-erased handles.
  const AnyDistribution stepped =
      em_step(AnyDistribution(model), batch, AnyEstimator(estimator), {}, ParallelOptions{});
  const Mixture* via_em = stepped.get_if<Mixture>();
  ASSERT_NE(via_em, nullptr);

  for (const Mixture* fitted : {&by_hand, via_em}) {
    for (const AnyDistribution& component : fitted->components()) {
      const ResponsibilityAttentionParams& p =
          component.get_if<ResponsibilityAttention>()->params();
      const ResponsibilityAttentionParams& q = expected.params();
      testing::ExpectAllClose(p.key_means, q.key_means, 1e-12, 1e-12);
      testing::ExpectAllClose(p.emission, q.emission, 1e-12, 1e-12);
      testing::ExpectAllClose(Matrix(p.position_prior), Matrix(q.position_prior), 1e-12, 1e-12);
      EXPECT_EQ(p.sigma2, q.sigma2);
    }
    const auto& a = fitted->components()[0].get_if<ResponsibilityAttention>()->params();
    const auto& b = fitted->components()[1].get_if<ResponsibilityAttention>()->params();
    EXPECT_EQ(a.key_means, b.key_means);
    EXPECT_EQ(a.emission, b.emission);
    EXPECT_EQ(a.position_prior, b.position_prior);
  }
}

/// F-5: without a key the two components keep their own statistics (the tying pass is a no-op).
TEST(KeyTyingTest, UnkeyedComponentsStayDistinct) {
  using RA = ResponsibilityAttentionTraits;
  Rng rng(testing::test_seed(607));
  const Mixture model({AnyDistribution(RA::make_model(rng)), AnyDistribution(RA::make_model(rng))},
                      dirichlet(rng, 2));
  const AnyBatch batch = model.components()[0].sample(100, rng.next_u64());
  const MixtureEstimator estimator(
      {AnyEstimator(RA::make_estimator(*model.components()[0].get_if<ResponsibilityAttention>())),
       AnyEstimator(RA::make_estimator(*model.components()[1].get_if<ResponsibilityAttention>()))});
  const std::vector<double> ones(static_cast<size_t>(batch.n_rows()), 1.0);
  MixtureAccumulator acc = estimator.make_accumulator();
  model.accumulate(batch, ones, acc);
  AnyAccumulator any(acc);
  tie_keys(any);
  EXPECT_TRUE(any == AnyAccumulator(acc));
}

}  // namespace
}  // namespace attnmix::contract
