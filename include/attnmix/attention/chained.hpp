// SPDX-License-Identifier: Apache-2.0
/// @file chained.hpp
/// Chained (multi-hop) attention (`docs/mechanisms.md#chained-attention`): L content-addressed hops whose latent
/// positions form a time-inhomogeneous chain, fitted by exact forward–backward EM.
///
/// Notation: S symbols, N positions, T targets, L hops; i, j ∈ [N]; s, u ∈ [S].
///   key_tables K⁽ℓ⁾ [S, S] per hop (query space = one-hot space), ρ⁽ℓ⁾[s] = ‖K⁽ℓ⁾[s]‖²
///   emission B      [S, T] row-simplex, indexed by value symbol
///   σ²                     fixed gate variance
/// Observation x = (k ∈ [S]^N keys, v ∈ [S]^N values, q ∈ [S], t ∈ [T]).
///   gate g(u, K)_j = softmax_j((2 K[k_j, u] − ρ[k_j]) / (2σ²))     (one-hot expansion of −‖e_u − K[k_j]‖²/(2σ²))
///   z_0 ~ g(q, K⁽⁰⁾);  z_ℓ | z_{ℓ−1} = i ~ g(v_i, K⁽ℓ⁾);  t ~ Cat(B[v_{z_{L−1}}, ·])
///   log p(t | k, v, q) by forward–backward; γ_ℓ(i), ξ_ℓ(i, j) the posterior marginals.
/// Cost per row: O(L·N²) time and O(L·N²) scratch; an (N, N, S) tensor is never formed.
/// Numerics: probability space with exact normalisation per hop (every α_ℓ is a distribution); a row whose
/// likelihood falls below 1e-250 is recomputed in log space, so long chains never underflow.
/// Example: examples/chained_attention.cpp
/// Reference design: mixle; Sukhbaatar et al. (2015) memory networks; Vogel & Ney (1996) HMM alignment.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

struct FamilySpec;

class ChainedAttentionEncoder;
class ChainedAttentionEstimator;
class ChainedAttentionSampler;

/// An immutable, validated batch: keys [n, N], values [n, N], queries [n], targets [n] (ids).
/// Slices share storage (O(1)); only the encoder creates batches.
class ChainedAttentionBatch {
 public:
  ChainedAttentionBatch();
  [[nodiscard]] Index n_rows() const noexcept { return count_; }
  [[nodiscard]] Index context_length() const noexcept { return storage_->keys.cols(); }
  /// Largest key, value or query id and largest target in the underlying storage (−1 when empty).
  [[nodiscard]] int64_t max_symbol() const noexcept { return storage_->max_symbol; }
  [[nodiscard]] int64_t max_target() const noexcept { return storage_->max_target; }
  [[nodiscard]] const int64_t* keys(Index row) const noexcept {
    return storage_->keys.data() + (begin_ + row) * storage_->keys.cols();
  }
  [[nodiscard]] const int64_t* values(Index row) const noexcept {
    return storage_->values.data() + (begin_ + row) * storage_->values.cols();
  }
  [[nodiscard]] int64_t query(Index row) const noexcept { return storage_->queries[begin_ + row]; }
  [[nodiscard]] int64_t target(Index row) const noexcept { return storage_->targets[begin_ + row]; }
  [[nodiscard]] ChainedAttentionBatch slice(Index begin, Index count) const;
  /// Copies of the rows (for writers and bindings).
  [[nodiscard]] IdMatrix keys() const;
  [[nodiscard]] IdMatrix values() const;
  [[nodiscard]] IdVector queries() const;
  [[nodiscard]] IdVector targets() const;

 private:
  friend class ChainedAttentionEncoder;
  struct Storage {
    IdMatrix keys;
    IdMatrix values;
    IdVector queries;
    IdVector targets;
    int64_t max_symbol = -1;
    int64_t max_target = -1;
  };
  std::shared_ptr<const Storage> storage_;
  Index begin_ = 0;
  Index count_ = 0;
};

/// Validates raw arrays into a batch. Undeclared bounds are checked against the model later.
class ChainedAttentionEncoder {
 public:
  std::optional<int64_t> n_symbols;
  std::optional<int64_t> n_targets;

  /// @throws ValueError on shape mismatch or invalid ids.
  [[nodiscard]] ChainedAttentionBatch encode(IdMatrix keys, IdMatrix values, IdVector queries,
                                             IdVector targets) const;
  [[nodiscard]] bool operator==(const ChainedAttentionEncoder&) const = default;
};

/// Constructor arguments under their Python names (what model files store).
struct ChainedAttentionParams {
  std::vector<Matrix> key_tables;  // L tables [S, S]
  Matrix emission;                 // [S, T] row-simplex
  double sigma2 = 0.1;
  std::string name;
};

/// Statistics, in value() order: key_num [L,S,S], key_mass [L,S], emission_count [S,T], ll, n.
class ChainedAttentionAccumulator : public FlatAccumulator<ChainedAttentionAccumulator> {
 public:
  static constexpr const char* kWhere = "ChainedAttentionAccumulator";
  using batch_type = ChainedAttentionBatch;
  ChainedAttentionAccumulator(int64_t n_hops, int64_t n_symbols, int64_t n_targets,
                              std::optional<std::string> keys = std::nullopt);

  [[nodiscard]] int64_t n_hops() const noexcept { return L_; }
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }

  [[nodiscard]] MatrixMap key_num(Index hop) { return {field(0) + hop * S_ * S_, S_, S_}; }
  [[nodiscard]] MatrixMap key_mass() { return {field(1), L_, S_}; }
  [[nodiscard]] MatrixMap emission_count() { return {field(2), S_, T_}; }
  [[nodiscard]] double& ll() { return *field(3); }
  [[nodiscard]] double& n() { return *field(4); }
  [[nodiscard]] ConstMatrixMap key_num(Index hop) const { return {field(0) + hop * S_ * S_, S_, S_}; }
  [[nodiscard]] ConstMatrixMap key_mass() const { return {field(1), L_, S_}; }
  [[nodiscard]] ConstMatrixMap emission_count() const { return {field(2), S_, T_}; }
  [[nodiscard]] double ll() const { return *field(3); }
  [[nodiscard]] double n() const { return *field(4); }

  /// Finite entries, counts ≥ 0, Σ key_mass[ℓ] = n for every hop, Σ emission_count = n. @throws ValueError.
  void validate(std::string_view where) const;
  /// seq_initialize: γ_ℓ ~ Dirichlet(1_N) for every hop and row (hop-major), then
  /// ξ_ℓ ~ Dirichlet(1_{N²}) for ℓ = 0..L−2, accumulated with weights w; n += Σ w; ll untouched.
  void initialize(const ChainedAttentionBatch& batch, std::span<const double> w, Rng& rng);
  /// What rank r of a distributed fit runs (inference/optimize.hpp): the draws of initialize() over
  /// [rows_before other rows; batch; rows_after other rows], with only batch's rows accumulated. The other rows'
  /// draws never depend on their content, so they are made and dropped without the rows, hop by hop.
  void initialize_shard(const ChainedAttentionBatch& batch, std::span<const double> w, Rng& rng, Index rows_before,
                        Index rows_after);
  [[nodiscard]] ChainedAttentionEncoder encoder() const;

 private:
  int64_t L_, S_, T_;
};

/// Posterior marginals of one row (tests and diagnostics): gamma [L, N], xi[ℓ] [N, N] for ℓ = 0..L−2.
struct ChainedAttentionPosterior {
  double log_p = 0.0;
  Matrix gamma;
  std::vector<Matrix> xi;
};

/// The immutable model. The constructor validates and precomputes the gate logit tables.
class ChainedAttention {
 public:
  using params_type = ChainedAttentionParams;
  using batch_type = ChainedAttentionBatch;
  using accumulator_type = ChainedAttentionAccumulator;
  using estimator_type = ChainedAttentionEstimator;
  using encoder_type = ChainedAttentionEncoder;
  static constexpr const char* kFamily = "chained_attention";
  static constexpr const char* kWhere = "ChainedAttentionDistribution";

  /// @throws ValueError on invalid parameters.
  explicit ChainedAttention(ChainedAttentionParams params);

  [[nodiscard]] const ChainedAttentionParams& params() const noexcept { return params_; }
  [[nodiscard]] int64_t n_hops() const noexcept { return static_cast<int64_t>(params_.key_tables.size()); }
  [[nodiscard]] int64_t n_symbols() const noexcept { return params_.emission.rows(); }
  [[nodiscard]] int64_t n_targets() const noexcept { return params_.emission.cols(); }
  [[nodiscard]] double sigma2() const noexcept { return params_.sigma2; }

  /// out[n] = log p(t_n | k_n, v_n, q_n) (exact; −∞ for impossible rows). @throws ValueError on invalid ids.
  void log_density(const ChainedAttentionBatch& batch, std::span<double> out) const;
  /// The E-step: adds the w-weighted γ/ξ statistics of every row to acc, atomically. @throws
  /// ImpossibleEvidenceError (nothing changed) for rows with w_n > 0 and log p = −∞.
  void accumulate(const ChainedAttentionBatch& batch, std::span<const double> w, ChainedAttentionAccumulator& acc,
                  std::span<double> log_p_out = {}) const;
  /// Exact posterior of one row (row of batch).
  [[nodiscard]] ChainedAttentionPosterior posterior(const ChainedAttentionBatch& batch, Index row) const;
  /// p(t | k, v, q) [n, T] = Σ_j α_{L−1}(j) B[v_j, ·], the target marginalised.
  [[nodiscard]] Matrix predict_proba(const IdMatrix& keys, const IdMatrix& values, const IdVector& queries) const;
  [[nodiscard]] Matrix predict_proba(const ChainedAttentionBatch& batch) const;

  [[nodiscard]] ChainedAttentionAccumulator make_accumulator() const;
  /// Estimator with this model's dimensions, σ² and name.
  [[nodiscard]] ChainedAttentionEstimator estimator() const;
  [[nodiscard]] ChainedAttentionEncoder encoder() const;
  [[nodiscard]] ChainedAttentionSampler sampler(uint64_t seed, int64_t context_length = 6) const;

  /// Gate logits of hop ℓ for query symbol u, by key symbol: (2 K⁽ℓ⁾[s, u] − ρ⁽ℓ⁾[s]) / (2σ²), s ∈ [S].
  [[nodiscard]] const double* gate_logits(Index hop, int64_t u) const noexcept {
    return gate_logits_.data() + (hop * n_symbols() + u) * n_symbols();
  }
  /// Gate weights of hop ℓ for query symbol u: exp(gate_logits(ℓ, u)[s] − max_s′ gate_logits(ℓ, u)[s′]), s ∈ [S].
  /// A row's softmax over its keys is these weights gathered and normalised (exact while none underflowed).
  [[nodiscard]] const double* gate_weights(Index hop, int64_t u) const noexcept {
    return gate_weights_.data() + (hop * n_symbols() + u) * n_symbols();
  }
  [[nodiscard]] const Matrix& emission() const noexcept { return params_.emission; }

 private:
  void check_batch(const ChainedAttentionBatch& batch) const;

  ChainedAttentionParams params_;
  Matrix gate_logits_;  // [L·S, S]: row (ℓ, u) holds the logits of query u against every key symbol
  Matrix gate_weights_;  // [L·S, S]: exp(row − row max) of gate_logits_
};

/// Options of the M-step (`docs/mechanisms.md#chained-attention`); the single source of the defaults.
struct ChainedAttentionEstimatorOptions {
  double sigma2 = 0.1;
  double emission_smoothing = 1e-4;
  std::string name;
  std::optional<std::string> keys;
};

/// The M-step: K⁽ℓ⁾[s] = key_num[ℓ][s] / max(key_mass[ℓ][s], 1e-9); B = (emission_count + ε) row-normalised.
class ChainedAttentionEstimator {
 public:
  using distribution_type = ChainedAttention;
  using accumulator_type = ChainedAttentionAccumulator;
  static constexpr const char* kWhere = "ChainedAttentionEstimator";

  /// @throws ValueError on non-positive dimensions or invalid options.
  ChainedAttentionEstimator(int64_t n_hops, int64_t n_symbols, int64_t n_targets,
                            ChainedAttentionEstimatorOptions options = {});

  [[nodiscard]] const ChainedAttentionEstimatorOptions& options() const noexcept { return options_; }
  [[nodiscard]] int64_t n_hops() const noexcept { return L_; }
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }

  [[nodiscard]] ChainedAttentionAccumulator make_accumulator() const;
  [[nodiscard]] ChainedAttentionEncoder encoder() const;
  /// @throws ValueError on invalid statistics, or when nobs differs from n.
  [[nodiscard]] ChainedAttention estimate(std::optional<double> nobs, const ChainedAttentionAccumulator& acc) const;

 private:
  int64_t L_, S_, T_;
  ChainedAttentionEstimatorOptions options_;
};

/// One observation.
struct ChainedAttentionObservation {
  std::vector<int64_t> keys;
  std::vector<int64_t> values;
  int64_t query = 0;
  int64_t target = 0;
};

/// Draws, per observation in this order: keys and values iid uniform over [S] (context_length each), q uniform,
/// the L hop positions from their gates, t ~ B[v_{z_{L−1}}].
class ChainedAttentionSampler {
 public:
  /// @throws ValueError unless context_length ≥ 1.
  ChainedAttentionSampler(ChainedAttention model, uint64_t seed, int64_t context_length = 6);
  [[nodiscard]] ChainedAttentionObservation sample();
  /// m consecutive sample() draws as a batch.
  [[nodiscard]] ChainedAttentionBatch sample(Index m);

 private:
  ChainedAttention model_;
  Rng rng_;
  int64_t context_length_;
};

/// The family's descriptor (family/spec.hpp), registered in src/family/registry.cpp.
[[nodiscard]] const FamilySpec& chained_attention_family();

}  // namespace attnmix

#include "attnmix/core/concepts.hpp"
static_assert(attnmix::Batch<attnmix::ChainedAttentionBatch>);
static_assert(attnmix::Distribution<attnmix::ChainedAttention>);
static_assert(attnmix::Estimator<attnmix::ChainedAttentionEstimator>);
