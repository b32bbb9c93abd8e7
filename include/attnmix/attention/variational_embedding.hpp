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
#include "attnmix/core/shared_rows.hpp"
#include "attnmix/core/types.hpp"
#include "attnmix/inference/sharded_mstep.hpp"

namespace attnmix {

struct FamilySpec;

class VariationalEmbeddingAttentionEncoder;
class VariationalEmbeddingAttentionEstimator;
class VariationalEmbeddingAttentionSampler;
class VariationalFloatTables;

/// The arrays of a variational-embedding-attention batch, one row per observation.
struct VariationalEmbeddingAttentionArrays {
  IdMatrix contexts;        ///< [n, N] context ids
  IdVector queries;         ///< [n] query ids
  IdVector targets;         ///< [n] target ids
  int64_t max_symbol = -1;  ///< the largest context or query id (−1 without rows)
  int64_t max_target = -1;  ///< the largest target (−1 without rows)
};

/// An immutable, validated batch: contexts [n, N], queries [n], targets [n] (ids). Slices share storage (O(1)).
class VariationalEmbeddingAttentionBatch
    : public SharedRows<VariationalEmbeddingAttentionBatch, VariationalEmbeddingAttentionArrays> {
 public:
  /// An empty batch: no rows and context length 0. Batches with rows come from
  /// VariationalEmbeddingAttentionEncoder::encode() or from a sampler.
  VariationalEmbeddingAttentionBatch() = default;
  /// The context length N, the width of every context row (0 for an empty default batch).
  [[nodiscard]] Index context_length() const noexcept { return arrays().contexts.cols(); }
  /// Largest context or query id and largest target in the underlying storage (−1 when empty).
  [[nodiscard]] int64_t max_symbol() const noexcept { return arrays().max_symbol; }
  /// The largest target id in the underlying storage, −1 when it is empty. Like max_symbol(), it covers the whole
  /// shared storage, not only this slice.
  [[nodiscard]] int64_t max_target() const noexcept { return arrays().max_target; }
  /// The N context ids of row `row` (0-based within this slice), contiguous. No bounds check: row must lie in
  /// [0, n_rows()).
  [[nodiscard]] const int64_t* context(Index row) const noexcept { return row_of(arrays().contexts, row); }
  /// The query symbol of row `row`. No bounds check: row must lie in [0, n_rows()).
  [[nodiscard]] int64_t query(Index row) const noexcept { return entry_of(arrays().queries, row); }
  /// The target id of row `row`. No bounds check: row must lie in [0, n_rows()).
  [[nodiscard]] int64_t target(Index row) const noexcept { return entry_of(arrays().targets, row); }
  /// Copies of the rows (for writers and bindings).
  [[nodiscard]] IdMatrix contexts() const { return copy_of(arrays().contexts); }
  /// A copy of this slice's query symbols, [n].
  [[nodiscard]] IdVector queries() const { return copy_of(arrays().queries); }
  /// A copy of this slice's targets, [n].
  [[nodiscard]] IdVector targets() const { return copy_of(arrays().targets); }

 private:
  friend class VariationalEmbeddingAttentionEncoder;
  VariationalEmbeddingAttentionBatch(VariationalEmbeddingAttentionArrays arrays, Index rows)
      : SharedRows(std::move(arrays), rows) {}
};

/// Validates raw arrays into a batch: exact ids, contexts 2-D with positive width equal to the
/// declared N, queries < S, targets < T. Undeclared bounds are checked against the model later.
class VariationalEmbeddingAttentionEncoder {
 public:
  /// The declared number of symbols S: context ids and query symbols must lie in [0, S). When unset, they are only
  /// checked to be ≥ 0, and the model checks the upper bound when it reads the batch.
  std::optional<int64_t> n_symbols;
  /// The declared context length N: contexts must have exactly N columns when there are rows. When unset, N is the
  /// width of the contexts.
  std::optional<int64_t> context_length;
  /// The declared number of targets T: targets must lie in [0, T). When unset, targets are only checked to be ≥ 0.
  std::optional<int64_t> n_targets;

  /// @throws ValueError on shape mismatch or invalid ids.
  [[nodiscard]] VariationalEmbeddingAttentionBatch encode(IdMatrix contexts, IdVector queries,
                                                          IdVector targets) const;
  /// Whether both encoders declare the same bounds (member-wise comparison).
  [[nodiscard]] bool operator==(const VariationalEmbeddingAttentionEncoder&) const = default;
};

/// Constructor arguments under their Python names (what model files store).
struct VariationalEmbeddingAttentionParams {
  /// Posterior means m [S, D], the plug-in embeddings of scoring and prediction. S, D ≥ 1; every entry finite with
  /// magnitude at most 1e50.
  Matrix mean;            // [S, D]
  /// Posterior log variances log v [S, D], of the shape of mean; every entry finite with magnitude at most 2 ln 1e50.
  Matrix log_var;         // [S, D]
  /// Emission matrix B [S, T]: row s is p(t | attended symbol s), a distribution. A zero entry is a structural zero.
  Matrix emission;        // [S, T] row-simplex
  /// Position prior π [N], a distribution over the context positions. A zero entry is a structural zero.
  Vector position_prior;  // [N] simplex
  /// The fixed gate variance σ², finite and at least 1e-100 (default 0.5).
  double sigma2 = 0.5;
  /// The model's name, stored in model files (may be empty).
  std::string name;
  /// nullopt: AttentionOptimizerState::fresh(family, mean, log_var, seed 0). A supplied state must have this family,
  /// this geometry and bit-identical mean and log_var.
  std::optional<AttentionOptimizerState> optimizer_state;
};

/// Statistics, in value() order: grad_mean [S,D], grad_log_var [S,D], emission_count [S,T], position_count [N],
/// ll, n, plus the attached optimizer state. Mass laws: Σ position_count = n = Σ emission_count.
class VariationalEmbeddingAttentionAccumulator : public FlatAccumulator<VariationalEmbeddingAttentionAccumulator> {
 public:
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "VariationalEmbeddingAttentionAccumulator";
  /// The batch type that the E-step and initialize() read.
  using batch_type = VariationalEmbeddingAttentionBatch;
  /// Zeroed statistics without an attached state, for S = n_symbols, N = context_length, D = embed_dim and
  /// T = n_targets, carrying an optional tying key (keyed tying, `docs/mechanisms.md#building-blocks`). mc is the
  /// number of Monte-Carlo noise tables that an E-step into these statistics draws (default 6, the estimator's
  /// default). @throws ValueError when a dimension or mc is not positive, or the statistics would exceed 2^48 entries.
  VariationalEmbeddingAttentionAccumulator(int64_t n_symbols, int64_t context_length, int64_t embed_dim,
                                           int64_t n_targets, int64_t mc = 6,
                                           std::optional<std::string> keys = std::nullopt);

  /// The number of symbols S.
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  /// The context length N.
  [[nodiscard]] int64_t context_length() const noexcept { return N_; }
  /// The embedding dimension D.
  [[nodiscard]] int64_t embed_dim() const noexcept { return D_; }
  /// The number of targets T.
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }
  /// The number of Monte-Carlo noise tables of each E-step into these statistics.
  [[nodiscard]] int64_t mc() const noexcept { return mc_; }

  /// Writable view of grad_mean [S, D] (field 0, `grad_m` in value() and the layout): the weighted gradient of the
  /// log-likelihood with respect to the means, averaged over the mc noise tables.
  [[nodiscard]] MatrixMap grad_mean() { return {field(0), S_, D_}; }
  /// Writable view of grad_log_var [S, D] (field 1, `grad_logv` in value() and the layout): the reparameterised
  /// gradient with respect to the log variances, the average over k of G_k ⊙ ½ s ⊙ ε_k.
  [[nodiscard]] MatrixMap grad_log_var() { return {field(1), S_, D_}; }
  /// Writable view of emission_count [S, T] (field 2): Σ w r_i / mc at (c_i, t), with the posterior responsibilities r
  /// of every noise table.
  [[nodiscard]] MatrixMap emission_count() { return {field(2), S_, T_}; }
  /// Writable view of position_count [N] (field 3): Σ w r_i / mc per position. Its total is n.
  [[nodiscard]] VectorMap position_count() { return {field(3), N_}; }
  /// Writable reference to ll (field 4): Σ w log p / mc over the rows and noise tables of the E-step (initialize()
  /// leaves it unchanged).
  [[nodiscard]] double& ll() { return *field(4); }
  /// Writable reference to n (field 5): the total weight Σ w of the accumulated rows.
  [[nodiscard]] double& n() { return *field(5); }
  /// Read-only view of grad_mean [S, D] (field 0).
  [[nodiscard]] ConstMatrixMap grad_mean() const { return {field(0), S_, D_}; }
  /// Read-only view of grad_log_var [S, D] (field 1).
  [[nodiscard]] ConstMatrixMap grad_log_var() const { return {field(1), S_, D_}; }
  /// Read-only view of emission_count [S, T] (field 2).
  [[nodiscard]] ConstMatrixMap emission_count() const { return {field(2), S_, T_}; }
  /// Read-only view of position_count [N] (field 3).
  [[nodiscard]] ConstVectorMap position_count() const { return {field(3), N_}; }
  /// The value of ll (field 4).
  [[nodiscard]] double ll() const { return *field(4); }
  /// The value of n (field 5).
  [[nodiscard]] double n() const { return *field(5); }

  /// The state of the model whose E-step produced these statistics; null after initialize() or set_zero().
  [[nodiscard]] const std::shared_ptr<const AttentionOptimizerState>& optimizer_state() const noexcept {
    return state_.get();
  }
  /// Attaches state (null detaches it). The E-step attaches its model's state, and estimate() takes its Adam step from
  /// the attached one.
  void set_optimizer_state(std::shared_ptr<const AttentionOptimizerState> state) { state_.set(std::move(state)); }

  /// Finite entries, counts ≥ 0, Σ position_count = n, Σ emission_count = n. @throws ValueError when a check fails.
  void validate(std::string_view where) const;
  /// validate() on a rank of a sharded M-step (ResponsibilityAttentionAccumulator::validate_owned): split's entries
  /// of this rank checked, the mass laws with the emission total (split's run) summed over ranks. Collective.
  void validate_owned(std::string_view where, const StatsSplit& split, const Communicator& comm) const;
  /// seq_initialize: a_n ~ Dirichlet(1_N) per row in row order, scaled by w_n, added to
  /// emission_count[c_ni, t_n] and position_count[i]; n += Σ w; gradients, ll and the state untouched.
  void initialize(const VariationalEmbeddingAttentionBatch& batch, std::span<const double> w, Rng& rng);
  /// What rank r of a distributed fit runs (inference/optimize.hpp): the draws of initialize() over
  /// [rows_before other rows; batch; rows_after other rows], with only batch's rows accumulated. The other rows'
  /// draws never depend on their content, so they are made and dropped without the rows.
  void initialize_shard(const VariationalEmbeddingAttentionBatch& batch, std::span<const double> w, Rng& rng,
                        Index rows_before, Index rows_after);
  /// An encoder that declares these S, N and T.
  [[nodiscard]] VariationalEmbeddingAttentionEncoder encoder() const;
  /// Zeroes the statistics and detaches the state.
  void set_zero();
  /// The attachment rule of FlatAccumulator (combine requires equal states).
  void merge_attachment(const VariationalEmbeddingAttentionAccumulator& v, AttachmentMerge how) {
    state_.merge(v.state_, how, kWhere);
  }

 private:
  /// The mass laws of validate(), given Σ emission_count.
  void check_mass_laws(std::string_view where, double emitted) const;
  int64_t S_, N_, D_, T_, mc_;
  AttachedOptimizerState state_;
};

/// The immutable model. The constructor validates and precomputes log π.
class VariationalEmbeddingAttention {
 public:
  /// The parameter struct that the constructor takes (the four roles: docs/design.md).
  using params_type = VariationalEmbeddingAttentionParams;
  /// The validated batch that log_density() and the E-step read.
  using batch_type = VariationalEmbeddingAttentionBatch;
  /// The statistics that the E-step, accumulate(), fills.
  using accumulator_type = VariationalEmbeddingAttentionAccumulator;
  /// The M-step that turns those statistics into the next model.
  using estimator_type = VariationalEmbeddingAttentionEstimator;
  /// The encoder that validates raw arrays into a batch_type.
  using encoder_type = VariationalEmbeddingAttentionEncoder;
  /// The `family` name of this family's model files and of its optimizer state.
  static constexpr const char* kFamily = "variational_embedding_attention";
  /// The name of this class in error messages (its Python name).
  static constexpr const char* kWhere = "VariationalEmbeddingAttentionDistribution";

  /// precision: the arithmetic of the gate in log_density and the E-step (core/precision.hpp; mixed builds float
  /// copies of the mean, O(S·D), and of each E-step's noise tables on first use). predict_proba and log_density_at
  /// are float64 in either precision.
  /// @throws ValueError on invalid parameters or a mismatched optimizer state.
  explicit VariationalEmbeddingAttention(VariationalEmbeddingAttentionParams params,
                                         Precision precision = Precision::kFloat64);

  /// The parameters; optimizer_state is always present.
  [[nodiscard]] const VariationalEmbeddingAttentionParams& params() const noexcept { return params_; }
  /// The Adam state: the same values as params().optimizer_state, shared by the copies of this model.
  [[nodiscard]] const AttentionOptimizerState& optimizer_state() const noexcept { return *state_; }
  /// The posterior means m [S, D].
  [[nodiscard]] const Matrix& mean() const noexcept { return params_.mean; }
  /// The posterior log variances log v [S, D].
  [[nodiscard]] const Matrix& log_var() const noexcept { return params_.log_var; }
  /// The plug-in embedding table E = m [S, D] of scoring and prediction (the same matrix as mean()).
  [[nodiscard]] const Matrix& embeddings() const noexcept { return params_.mean; }
  /// The emission matrix B [S, T].
  [[nodiscard]] const Matrix& emission() const noexcept { return params_.emission; }
  /// The position prior π [N].
  [[nodiscard]] const Vector& position_prior() const noexcept { return params_.position_prior; }
  /// The fixed gate variance σ².
  [[nodiscard]] double sigma2() const noexcept { return params_.sigma2; }
  /// The number of symbols S (the rows of mean).
  [[nodiscard]] int64_t n_symbols() const noexcept { return params_.mean.rows(); }
  /// The context length N (the length of position_prior).
  [[nodiscard]] int64_t context_length() const noexcept { return params_.position_prior.size(); }
  /// The embedding dimension D (the columns of mean).
  [[nodiscard]] int64_t embed_dim() const noexcept { return params_.mean.cols(); }
  /// The number of targets T (the columns of emission).
  [[nodiscard]] int64_t n_targets() const noexcept { return params_.emission.cols(); }
  /// The arithmetic of the gate in log_density and the E-step (core/precision.hpp).
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
  /// The same for the rows of a batch; the batch's targets are not used. O(N·(D + T)) per row. @throws ValueError on a
  /// batch of another context length or with out-of-range ids.
  [[nodiscard]] Matrix predict_proba(const VariationalEmbeddingAttentionBatch& batch) const;
  /// log p of one row at an arbitrary embedding table [S, D] (tests and diagnostics).
  [[nodiscard]] double log_density_at(const Matrix& table, const VariationalEmbeddingAttentionBatch& batch,
                                      Index row) const;

  /// An accumulator with mc samples (default: the estimator default 6).
  [[nodiscard]] VariationalEmbeddingAttentionAccumulator make_accumulator() const;
  /// Estimator with this model's dimensions, σ², seed = optimizer_state().seed, name and precision; other options
  /// default.
  [[nodiscard]] VariationalEmbeddingAttentionEstimator estimator() const;
  /// An encoder that declares this model's S, N and T.
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
  /// The fixed gate variance σ² of the returned models (finite, at least 1e-100; default 0.5).
  double sigma2 = 0.5;
  /// The Adam step size of the embedding update (finite, > 0; default 0.05).
  double lr = 0.05;
  /// The number of Monte-Carlo noise tables per E-step of the accumulators that make_accumulator() returns (positive;
  /// default 6). More tables reduce the gradient noise, at proportional cost.
  int64_t mc = 6;
  /// The KL weight λ (finite, ≥ 0; default 1); 0 turns the prior off.
  double prior_strength = 1.0;
  /// The pseudo-count ε added to every emission count before the rows are normalised (finite, ≥ 0; default 1e-4).
  double emission_smoothing = 1e-4;
  /// The seed of the initial embeddings, stored in their optimizer state as the seed of all Monte-Carlo noise
  /// (default 0). Statistics that carry a state keep that state's seed.
  uint64_t seed = 0;
  /// The name of the models that estimate() returns.
  std::string name;
  /// The tying key of the accumulators that make_accumulator() returns: sites with the same key pool their statistics
  /// after the E-step (`docs/mechanisms.md#building-blocks`).
  std::optional<std::string> keys;
  /// The precision of the models estimate() returns (their E-steps; core/precision.hpp).
  Precision precision = Precision::kFloat64;
};

/// The stateless M-step: initial embeddings from Rng(derive_seed(seed, kInit, 0)) when the statistics carry no state
/// (m = 0.1·N(0, 1), log v = log 0.3), otherwise one Adam ascent step of the carried state; then
/// B = (emission_count + ε) row-normalised and π = position_count / Σ.
class VariationalEmbeddingAttentionEstimator {
 public:
  /// The model that estimate() returns.
  using distribution_type = VariationalEmbeddingAttention;
  /// The statistics that estimate() reads.
  using accumulator_type = VariationalEmbeddingAttentionAccumulator;
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "VariationalEmbeddingAttentionEstimator";

  /// @throws ValueError on non-positive dimensions or invalid options.
  VariationalEmbeddingAttentionEstimator(int64_t n_symbols, int64_t context_length, int64_t embed_dim,
                                         int64_t n_targets, VariationalEmbeddingAttentionEstimatorOptions options = {});

  /// The options of the M-step.
  [[nodiscard]] const VariationalEmbeddingAttentionEstimatorOptions& options() const noexcept { return options_; }
  /// The number of symbols S.
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  /// The context length N.
  [[nodiscard]] int64_t context_length() const noexcept { return N_; }
  /// The embedding dimension D.
  [[nodiscard]] int64_t embed_dim() const noexcept { return D_; }
  /// The number of targets T.
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }

  /// Zeroed statistics of these dimensions with options().mc noise tables, carrying options().keys.
  [[nodiscard]] VariationalEmbeddingAttentionAccumulator make_accumulator() const;
  /// An encoder that declares these S, N and T.
  [[nodiscard]] VariationalEmbeddingAttentionEncoder encoder() const;
  /// The M-step of the class comment: the next model from acc, with these options' σ², name and precision.
  /// @throws ValueError on invalid statistics, a state of another family or geometry, or nobs ≠ n.
  [[nodiscard]] VariationalEmbeddingAttention estimate(std::optional<double> nobs,
                                                       const VariationalEmbeddingAttentionAccumulator& acc) const;
  /// The sharded M-step of a distributed fit (inference/sharded_mstep.hpp): each rank sums and estimates its symbols'
  /// rows of the emission, which are then gathered; the embeddings' Adam step (O(S·D)) runs whole on every rank.
  /// Returns, bit for bit, what estimate(nullopt, Σ acc) returns; acc is left partly summed. Collective.
  [[nodiscard]] VariationalEmbeddingAttention estimate_sharded(VariationalEmbeddingAttentionAccumulator& acc,
                                                               const Communicator& comm) const;

 private:
  void check_layout(const VariationalEmbeddingAttentionAccumulator& acc) const;
  /// The M-step from summed statistics: emission rows [shard.begin, shard.end) estimated here, the rest gathered
  /// from the other ranks of comm; without comm, shard covers every symbol.
  [[nodiscard]] VariationalEmbeddingAttention estimate_symbols(const VariationalEmbeddingAttentionAccumulator& acc,
                                                               const SymbolShard& shard,
                                                               const Communicator* comm) const;
  int64_t S_, N_, D_, T_;
  VariationalEmbeddingAttentionEstimatorOptions options_;
};

/// One observation.
struct VariationalEmbeddingAttentionObservation {
  /// The context symbol ids [N], each in [0, S).
  std::vector<int64_t> context;
  /// The query symbol, in [0, S).
  int64_t query = 0;
  /// The target id, in [0, T).
  int64_t target = 0;
};

/// Draws, per event in this order: (posterior-predictive only: the table m + s ⊙ ε, ε row-major); N context symbols
/// (without replacement when N ≤ S, else with); q uniform over [S]; z ~ a (the gate with π); t ~ B[c_z].
class VariationalEmbeddingAttentionSampler {
 public:
  /// A sampler of model whose random stream is seeded with seed. With posterior_predictive, every event first draws a
  /// fresh embedding table from q; otherwise the plug-in table m is used.
  VariationalEmbeddingAttentionSampler(VariationalEmbeddingAttention model, uint64_t seed,
                                       bool posterior_predictive = false);
  /// Draws one observation (see the class comment).
  [[nodiscard]] VariationalEmbeddingAttentionObservation sample();
  /// m consecutive sample() draws as a batch.
  /// @throws ValueError when m is negative.
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
