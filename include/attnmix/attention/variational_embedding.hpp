// SPDX-License-Identifier: Apache-2.0
/// @file variational_embedding.hpp
/// Variational embedding attention (`docs/mechanisms.md#variational-embedding-attention`): responsibility attention
/// over tied latent embeddings, one vector e_s per symbol serving as both query and key, with a mean-field Gaussian
/// posterior fitted by a reparameterised ELBO gradient step inside EM; the discrete attention stays exact.
///
/// Notation: S symbols, N positions, D embedding dimension, T targets; i ∈ [N].
///   mean m, log_var log v  [S, D]   q(e_s) = N(m_s, diag(v_s)), prior N(0, I)
///   emission B             [S, T]   row-simplex;  position_prior π [N] simplex;  σ² > 0 (default 0.5)
/// Observation x = (c ∈ [S]^N, q ∈ [S], t ∈ [T]); at an embedding table E:
///   d_i = E[q] − E[c_i];  s_i = log π_i − ‖d_i‖²/(2σ²);  a_i = softmax_i s_i;  b_i = B[c_i, t]
///   p = Σ_i a_i b_i;  r_i = a_i b_i / p (posterior);  ∂log p/∂s_i = r_i − a_i
/// Plug-in scoring and prediction use E = m. The E-step averages, over the mc noise tables E_k of iteration τ
/// (optimizer_state.hpp), the weighted data gradient (G[q] −= w Σ g_i d_i/σ², G[c_i] += w g_i d_i/σ²), ll, and the
/// counts emission_count[c_i, t] += w r_i, position_count[i] += w r_i. The M-step is one Adam ascent step on the
/// embeddings plus the closed-form emission and prior; the Adam state lives on the model.
/// Cost: O(mc·N·D) per row for the E-step, O(N·D) for scoring; O(S·(D + T) + N) for the M-step.
/// Numerics: probability space with max-subtraction; a row whose p falls below 1e-250 is recomputed in log space.
/// Precision::kMixed computes the gate (distances, logits, their exponentials) in float vectors and everything else
/// in double (docs/mixed_precision.md).
/// Example: examples/variational_embedding_attention.cpp
/// Reference design: mixle; Deng et al. (2018) latent alignment; Titsias & Lawrence (2010) Bayesian GP-LVM.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/precision.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

struct FamilySpec;

class VariationalEmbeddingAttentionEncoder;
class VariationalEmbeddingAttentionEstimator;
class VariationalEmbeddingAttentionSampler;
class VariationalFloatTables;

/// An immutable, validated batch: contexts [n, N], queries [n], targets [n] (ids). Slices share storage (O(1)).
class VariationalEmbeddingAttentionBatch {
 public:
  VariationalEmbeddingAttentionBatch();
  [[nodiscard]] Index n_rows() const noexcept { return count_; }
  [[nodiscard]] Index context_length() const noexcept { return storage_->contexts.cols(); }
  /// Largest context or query id and largest target in the underlying storage (−1 when empty).
  [[nodiscard]] int64_t max_symbol() const noexcept { return storage_->max_symbol; }
  [[nodiscard]] int64_t max_target() const noexcept { return storage_->max_target; }
  [[nodiscard]] const int64_t* context(Index row) const noexcept {
    return storage_->contexts.data() + (begin_ + row) * storage_->contexts.cols();
  }
  [[nodiscard]] int64_t query(Index row) const noexcept { return storage_->queries[begin_ + row]; }
  [[nodiscard]] int64_t target(Index row) const noexcept { return storage_->targets[begin_ + row]; }
  [[nodiscard]] VariationalEmbeddingAttentionBatch slice(Index begin, Index count) const;
  /// Copies of the rows (for writers and bindings).
  [[nodiscard]] IdMatrix contexts() const;
  [[nodiscard]] IdVector queries() const;
  [[nodiscard]] IdVector targets() const;

 private:
  friend class VariationalEmbeddingAttentionEncoder;
  struct Storage {
    IdMatrix contexts;
    IdVector queries;
    IdVector targets;
    int64_t max_symbol = -1;
    int64_t max_target = -1;
  };
  std::shared_ptr<const Storage> storage_;
  Index begin_ = 0;
  Index count_ = 0;
};

/// Validates raw arrays into a batch: exact ids, contexts 2-D with positive width equal to the
/// declared N, queries < S, targets < T. Undeclared bounds are checked against the model later.
class VariationalEmbeddingAttentionEncoder {
 public:
  std::optional<int64_t> n_symbols;
  std::optional<int64_t> context_length;
  std::optional<int64_t> n_targets;

  /// @throws ValueError on shape mismatch or invalid ids.
  [[nodiscard]] VariationalEmbeddingAttentionBatch encode(IdMatrix contexts, IdVector queries,
                                                          IdVector targets) const;
  [[nodiscard]] bool operator==(const VariationalEmbeddingAttentionEncoder&) const = default;
};

/// Constructor arguments under their Python names (what model files store).
struct VariationalEmbeddingAttentionParams {
  Matrix mean;            // [S, D]
  Matrix log_var;         // [S, D]
  Matrix emission;        // [S, T] row-simplex
  Vector position_prior;  // [N] simplex
  double sigma2 = 0.5;
  std::string name;
  /// nullopt: AttentionOptimizerState::fresh(family, mean, log_var, seed 0). A supplied state must have this family,
  /// this geometry and bit-identical mean and log_var.
  std::optional<AttentionOptimizerState> optimizer_state;
};

/// Statistics, in value() order: grad_mean [S,D], grad_log_var [S,D], emission_count [S,T], position_count [N],
/// ll, n, plus the attached optimizer state. Mass laws: Σ position_count = n = Σ emission_count.
class VariationalEmbeddingAttentionAccumulator : public FlatAccumulator<VariationalEmbeddingAttentionAccumulator> {
 public:
  static constexpr const char* kWhere = "VariationalEmbeddingAttentionAccumulator";
  using batch_type = VariationalEmbeddingAttentionBatch;
  VariationalEmbeddingAttentionAccumulator(int64_t n_symbols, int64_t context_length, int64_t embed_dim,
                                           int64_t n_targets, int64_t mc = 6,
                                           std::optional<std::string> keys = std::nullopt);

  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  [[nodiscard]] int64_t context_length() const noexcept { return N_; }
  [[nodiscard]] int64_t embed_dim() const noexcept { return D_; }
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }
  [[nodiscard]] int64_t mc() const noexcept { return mc_; }

  [[nodiscard]] MatrixMap grad_mean() { return {field(0), S_, D_}; }
  [[nodiscard]] MatrixMap grad_log_var() { return {field(1), S_, D_}; }
  [[nodiscard]] MatrixMap emission_count() { return {field(2), S_, T_}; }
  [[nodiscard]] VectorMap position_count() { return {field(3), N_}; }
  [[nodiscard]] double& ll() { return *field(4); }
  [[nodiscard]] double& n() { return *field(5); }
  [[nodiscard]] ConstMatrixMap grad_mean() const { return {field(0), S_, D_}; }
  [[nodiscard]] ConstMatrixMap grad_log_var() const { return {field(1), S_, D_}; }
  [[nodiscard]] ConstMatrixMap emission_count() const { return {field(2), S_, T_}; }
  [[nodiscard]] ConstVectorMap position_count() const { return {field(3), N_}; }
  [[nodiscard]] double ll() const { return *field(4); }
  [[nodiscard]] double n() const { return *field(5); }

  /// The state of the model whose E-step produced these statistics; null after initialize() or set_zero().
  [[nodiscard]] const std::shared_ptr<const AttentionOptimizerState>& optimizer_state() const noexcept {
    return state_.get();
  }
  void set_optimizer_state(std::shared_ptr<const AttentionOptimizerState> state) { state_.set(std::move(state)); }

  /// Finite entries, counts ≥ 0, Σ position_count = n, Σ emission_count = n. @throws ValueError.
  void validate(std::string_view where) const;
  /// seq_initialize: a_n ~ Dirichlet(1_N) per row in row order, scaled by w_n, added to
  /// emission_count[c_ni, t_n] and position_count[i]; n += Σ w; gradients, ll and the state untouched.
  void initialize(const VariationalEmbeddingAttentionBatch& batch, std::span<const double> w, Rng& rng);
  /// What rank r of a distributed fit runs (inference/optimize.hpp): the draws of initialize() over
  /// [rows_before other rows; batch; rows_after other rows], with only batch's rows accumulated. The other rows'
  /// draws never depend on their content, so they are made and dropped without the rows.
  void initialize_shard(const VariationalEmbeddingAttentionBatch& batch, std::span<const double> w, Rng& rng,
                        Index rows_before, Index rows_after);
  [[nodiscard]] VariationalEmbeddingAttentionEncoder encoder() const;
  /// Zeroes the statistics and detaches the state.
  void set_zero();
  /// The attachment rule of FlatAccumulator (combine requires equal states).
  void merge_attachment(const VariationalEmbeddingAttentionAccumulator& v, AttachmentMerge how) {
    state_.merge(v.state_, how, kWhere);
  }

 private:
  int64_t S_, N_, D_, T_, mc_;
  AttachedOptimizerState state_;
};

/// The immutable model. The constructor validates and precomputes log π.
class VariationalEmbeddingAttention {
 public:
  using params_type = VariationalEmbeddingAttentionParams;
  using batch_type = VariationalEmbeddingAttentionBatch;
  using accumulator_type = VariationalEmbeddingAttentionAccumulator;
  using estimator_type = VariationalEmbeddingAttentionEstimator;
  using encoder_type = VariationalEmbeddingAttentionEncoder;
  static constexpr const char* kFamily = "variational_embedding_attention";
  static constexpr const char* kWhere = "VariationalEmbeddingAttentionDistribution";

  /// precision: the arithmetic of the gate in log_density and the E-step (core/precision.hpp; mixed builds float
  /// copies of the mean, O(S·D), and of each E-step's noise tables on first use). predict_proba and log_density_at
  /// are float64 in either precision.
  /// @throws ValueError on invalid parameters or a mismatched optimizer state.
  explicit VariationalEmbeddingAttention(VariationalEmbeddingAttentionParams params,
                                         Precision precision = Precision::kFloat64);

  /// The parameters; optimizer_state is always present.
  [[nodiscard]] const VariationalEmbeddingAttentionParams& params() const noexcept { return params_; }
  [[nodiscard]] const AttentionOptimizerState& optimizer_state() const noexcept { return *state_; }
  [[nodiscard]] const Matrix& mean() const noexcept { return params_.mean; }
  [[nodiscard]] const Matrix& log_var() const noexcept { return params_.log_var; }
  [[nodiscard]] const Matrix& embeddings() const noexcept { return params_.mean; }
  [[nodiscard]] const Matrix& emission() const noexcept { return params_.emission; }
  [[nodiscard]] const Vector& position_prior() const noexcept { return params_.position_prior; }
  [[nodiscard]] double sigma2() const noexcept { return params_.sigma2; }
  [[nodiscard]] int64_t n_symbols() const noexcept { return params_.mean.rows(); }
  [[nodiscard]] int64_t context_length() const noexcept { return params_.position_prior.size(); }
  [[nodiscard]] int64_t embed_dim() const noexcept { return params_.mean.cols(); }
  [[nodiscard]] int64_t n_targets() const noexcept { return params_.emission.cols(); }
  [[nodiscard]] Precision precision() const noexcept { return precision_; }

  /// out[n] = log p(t_n | c_n, q_n, E = m) (exact; −∞ for impossible rows). @throws ValueError on invalid ids.
  void log_density(const VariationalEmbeddingAttentionBatch& batch, std::span<double> out) const;
  /// The Monte-Carlo E-step with acc.mc() noise tables, atomically; attaches this model's state to
  /// acc. log_p_out (empty, or one per row) receives the plug-in log densities. @throws ImpossibleEvidenceError
  /// (nothing changed) for rows with w_n > 0 that no position can explain; ValueError on a foreign accumulator.
  void accumulate(const VariationalEmbeddingAttentionBatch& batch, std::span<const double> w,
                  VariationalEmbeddingAttentionAccumulator& acc, std::span<double> log_p_out = {}) const;
  /// Σ_i a_i B[c_i, ·] at E = m: [n, T].
  [[nodiscard]] Matrix predict_proba(const IdMatrix& contexts, const IdVector& queries) const;
  [[nodiscard]] Matrix predict_proba(const VariationalEmbeddingAttentionBatch& batch) const;
  /// log p of one row at an arbitrary embedding table [S, D] (tests and diagnostics).
  [[nodiscard]] double log_density_at(const Matrix& table, const VariationalEmbeddingAttentionBatch& batch,
                                      Index row) const;

  /// An accumulator with mc samples (default: the estimator default 6).
  [[nodiscard]] VariationalEmbeddingAttentionAccumulator make_accumulator() const;
  /// Estimator with this model's dimensions, σ², seed = optimizer_state().seed, name and precision; other options
  /// default.
  [[nodiscard]] VariationalEmbeddingAttentionEstimator estimator() const;
  [[nodiscard]] VariationalEmbeddingAttentionEncoder encoder() const;
  /// Plug-in sampler (uses m only).
  [[nodiscard]] VariationalEmbeddingAttentionSampler sampler(uint64_t seed) const;
  /// Draws a fresh embedding table from q for every event.
  [[nodiscard]] VariationalEmbeddingAttentionSampler posterior_predictive_sampler(uint64_t seed) const;

 private:
  void check_batch(const VariationalEmbeddingAttentionBatch& batch) const;

  VariationalEmbeddingAttentionParams params_;
  std::shared_ptr<const AttentionOptimizerState> state_;  // the same object as *params_.optimizer_state
  Vector log_prior_;                                       // [N]
  std::shared_ptr<MonteCarloCache> noise_;
  Precision precision_ = Precision::kFloat64;
  std::shared_ptr<const VariationalFloatTables> float_tables_;  // mixed precision only
};

/// Options of the M-step (`docs/mechanisms.md#variational-embedding-attention`); the single source of the defaults.
struct VariationalEmbeddingAttentionEstimatorOptions {
  double sigma2 = 0.5;
  double lr = 0.05;
  int64_t mc = 6;
  double prior_strength = 1.0;
  double emission_smoothing = 1e-4;
  uint64_t seed = 0;
  std::string name;
  std::optional<std::string> keys;
  /// The precision of the models estimate() returns (their E-steps; core/precision.hpp).
  Precision precision = Precision::kFloat64;
};

/// The stateless M-step: initial embeddings from Rng(derive_seed(seed, kInit, 0)) when the statistics carry no state
/// (m = 0.1·N(0, 1), log v = log 0.3), otherwise one Adam ascent step of the carried state; then
/// B = (emission_count + ε) row-normalised and π = position_count / Σ.
class VariationalEmbeddingAttentionEstimator {
 public:
  using distribution_type = VariationalEmbeddingAttention;
  using accumulator_type = VariationalEmbeddingAttentionAccumulator;
  static constexpr const char* kWhere = "VariationalEmbeddingAttentionEstimator";

  /// @throws ValueError on non-positive dimensions or invalid options.
  VariationalEmbeddingAttentionEstimator(int64_t n_symbols, int64_t context_length, int64_t embed_dim,
                                         int64_t n_targets, VariationalEmbeddingAttentionEstimatorOptions options = {});

  [[nodiscard]] const VariationalEmbeddingAttentionEstimatorOptions& options() const noexcept { return options_; }
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  [[nodiscard]] int64_t context_length() const noexcept { return N_; }
  [[nodiscard]] int64_t embed_dim() const noexcept { return D_; }
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }

  [[nodiscard]] VariationalEmbeddingAttentionAccumulator make_accumulator() const;
  [[nodiscard]] VariationalEmbeddingAttentionEncoder encoder() const;
  /// @throws ValueError on invalid statistics, a state of another family or geometry, or nobs ≠ n.
  [[nodiscard]] VariationalEmbeddingAttention estimate(std::optional<double> nobs,
                                                       const VariationalEmbeddingAttentionAccumulator& acc) const;

 private:
  int64_t S_, N_, D_, T_;
  VariationalEmbeddingAttentionEstimatorOptions options_;
};

/// One observation.
struct VariationalEmbeddingAttentionObservation {
  std::vector<int64_t> context;
  int64_t query = 0;
  int64_t target = 0;
};

/// Draws, per event in this order: (posterior-predictive only: the table m + s ⊙ ε, ε row-major); N context symbols
/// (without replacement when N ≤ S, else with); q uniform over [S]; z ~ a (the gate with π); t ~ B[c_z].
class VariationalEmbeddingAttentionSampler {
 public:
  VariationalEmbeddingAttentionSampler(VariationalEmbeddingAttention model, uint64_t seed,
                                       bool posterior_predictive = false);
  [[nodiscard]] VariationalEmbeddingAttentionObservation sample();
  /// m consecutive sample() draws as a batch.
  [[nodiscard]] VariationalEmbeddingAttentionBatch sample(Index m);

 private:
  VariationalEmbeddingAttention model_;
  Rng rng_;
  bool posterior_predictive_;
  Matrix table_;  // the posterior-predictive table of the current event
};

/// The family's descriptor (family/spec.hpp), registered in src/family/registry.cpp.
[[nodiscard]] const FamilySpec& variational_embedding_attention_family();

}  // namespace attnmix

#include "attnmix/core/concepts.hpp"
static_assert(attnmix::Batch<attnmix::VariationalEmbeddingAttentionBatch>);
static_assert(attnmix::Distribution<attnmix::VariationalEmbeddingAttention>);
static_assert(attnmix::Estimator<attnmix::VariationalEmbeddingAttentionEstimator>);
