// SPDX-License-Identifier: Apache-2.0
/// @file variational_multihop.hpp
/// Variational multi-hop attention (`docs/mechanisms.md#variational-multi-hop-attention`): a 2-hop chain over tied
/// latent embeddings (one e_s serves as query, key and value), fitted like variational embedding attention with
/// annealed KL.
/// Observations are those of chained attention (keys k ∈ [S]^N, values v ∈ [S]^N, query q, target t; free N) and use
/// its batch and encoder. At an embedding table E:
///   d1_i = E[q] − E[k_i];   a1_i = softmax_i(−‖d1_i‖²/(2σ²))
///   d2_ij = E[v_i] − E[k_j];  a2_ij = softmax_j(−‖d2_ij‖²/(2σ²))
///   b_j = B[v_j, t];  h_i = Σ_j a2_ij b_j;  p = Σ_i a1_i h_i   (log space, exact; −∞ allowed)
///   ρ1_i = a1_i h_i/p;  ρ_ij = a1_i a2_ij b_j/p;  r_j = Σ_i ρ_ij;  gs1_i = ρ1_i − a1_i;  gs2_ij = ρ_ij − ρ1_i a2_ij
///   G[q] −= w Σ_i gs1_i d1_i/σ²;  G[k_i] += w gs1_i d1_i/σ²;  G[v_i] −= w Σ_j gs2_ij d2_ij/σ²;
///   G[k_j] += w Σ_i gs2_ij d2_ij/σ²;  emission_count[v_j, t] += w r_j / mc
/// KL weight of Adam step τ: λ_τ = prior_strength · min(1, τ / max(1, anneal_iters)). Initial means N(0, 1).
/// Cost: O(mc·N²·D) per row for the E-step, O(N²·D) for scoring.
/// Example: examples/variational_embedding_attention.cpp (two-hop section)
/// Reference design: mixle; Sukhbaatar et al. (2015) memory networks.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

struct FamilySpec;

class VariationalMultiHopAttentionEstimator;
class VariationalMultiHopAttentionSampler;

/// Constructor arguments under their Python names (what model files store).
struct VariationalMultiHopAttentionParams {
  /// Posterior means m [S, D], the plug-in embeddings of scoring and prediction. S, D ≥ 1; every entry finite with
  /// magnitude at most 1e50.
  Matrix mean;      // [S, D]
  /// Posterior log variances log v [S, D], of the shape of mean; every entry finite with magnitude at most 2 ln 1e50.
  Matrix log_var;   // [S, D]
  /// Emission matrix B [S, T], indexed by value symbol: row s is the distribution of t when the second hop attends a
  /// position whose value is s.
  Matrix emission;  // [S, T] row-simplex
  /// The fixed gate variance σ² of both hops, finite and at least 1e-100 (default 0.3).
  double sigma2 = 0.3;
  /// The model's name, stored in model files (may be empty).
  std::string name;
  /// nullopt: AttentionOptimizerState::fresh(family, mean, log_var, seed 0); a supplied state must match.
  std::optional<AttentionOptimizerState> optimizer_state;
};

/// Statistics, in value() order: grad_mean [S,D], grad_log_var [S,D], emission_count [S,T], ll, n, plus
/// the attached optimizer state. Mass law: Σ emission_count = n.
class VariationalMultiHopAttentionAccumulator : public FlatAccumulator<VariationalMultiHopAttentionAccumulator> {
 public:
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "VariationalMultiHopAttentionAccumulator";
  /// The batch type that the E-step and initialize() read: chained attention's, whose observations this family shares.
  using batch_type = ChainedAttentionBatch;
  /// Zeroed statistics without an attached state, for S = n_symbols, D = embed_dim and T = n_targets, carrying an
  /// optional tying key (keyed tying, `docs/mechanisms.md#building-blocks`). mc is the number of Monte-Carlo noise
  /// tables that an E-step into these statistics draws (default 5, the estimator's default). @throws ValueError when a
  /// dimension or mc is not positive, or the statistics would exceed 2^48 entries.
  VariationalMultiHopAttentionAccumulator(int64_t n_symbols, int64_t embed_dim, int64_t n_targets, int64_t mc = 5,
                                          std::optional<std::string> keys = std::nullopt);

  /// The number of symbols S.
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  /// The embedding dimension D.
  [[nodiscard]] int64_t embed_dim() const noexcept { return D_; }
  /// The number of targets T.
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }
  /// The number of Monte-Carlo noise tables of each E-step into these statistics.
  [[nodiscard]] int64_t mc() const noexcept { return mc_; }

  /// Writable view of grad_mean [S, D] (field 0, `grad_m` in value() and the layout): the weighted gradient of the
  /// log-likelihood with respect to the means, through the query, key and value roles of both hops, averaged over the
  /// mc noise tables.
  [[nodiscard]] MatrixMap grad_mean() { return {field(0), S_, D_}; }
  /// Writable view of grad_log_var [S, D] (field 1, `grad_logv` in value() and the layout): the reparameterised
  /// gradient with respect to the log variances, the average over k of G_k ⊙ ½ s ⊙ ε_k.
  [[nodiscard]] MatrixMap grad_log_var() { return {field(1), S_, D_}; }
  /// Writable view of emission_count [S, T] (field 2): Σ w r_j / mc at (v_j, t), with the emitting-position
  /// responsibilities r of every noise table.
  [[nodiscard]] MatrixMap emission_count() { return {field(2), S_, T_}; }
  /// Writable reference to ll (field 3): Σ w log p / mc over the rows and noise tables of the E-step (initialize()
  /// leaves it unchanged).
  [[nodiscard]] double& ll() { return *field(3); }
  /// Writable reference to n (field 4): the total weight Σ w of the accumulated rows.
  [[nodiscard]] double& n() { return *field(4); }
  /// Read-only view of grad_mean [S, D] (field 0).
  [[nodiscard]] ConstMatrixMap grad_mean() const { return {field(0), S_, D_}; }
  /// Read-only view of grad_log_var [S, D] (field 1).
  [[nodiscard]] ConstMatrixMap grad_log_var() const { return {field(1), S_, D_}; }
  /// Read-only view of emission_count [S, T] (field 2).
  [[nodiscard]] ConstMatrixMap emission_count() const { return {field(2), S_, T_}; }
  /// The value of ll (field 3).
  [[nodiscard]] double ll() const { return *field(3); }
  /// The value of n (field 4).
  [[nodiscard]] double n() const { return *field(4); }

  /// The state of the model whose E-step produced these statistics; null after initialize() or set_zero().
  [[nodiscard]] const std::shared_ptr<const AttentionOptimizerState>& optimizer_state() const noexcept {
    return state_.get();
  }
  /// Attaches state (null detaches it). The E-step attaches its model's state, and estimate() takes its Adam step from
  /// the attached one.
  void set_optimizer_state(std::shared_ptr<const AttentionOptimizerState> state) { state_.set(std::move(state)); }

  /// Finite entries, counts ≥ 0, Σ emission_count = n. @throws ValueError when a check fails.
  void validate(std::string_view where) const;
  /// validate() on a rank of a sharded M-step (ResponsibilityAttentionAccumulator::validate_owned): split's entries
  /// of this rank checked, the mass law with the emission total (split's run) summed over ranks. Collective.
  void validate_owned(std::string_view where, const StatsSplit& split, const Communicator& comm) const;
  /// seq_initialize: r ~ Dirichlet(1_N) per row in row order over the final-hop positions, scaled by w_n and added to
  /// emission_count[v_nj, t_n]; n += Σ w; gradients, ll and the state untouched.
  void initialize(const ChainedAttentionBatch& batch, std::span<const double> w, Rng& rng);
  /// What rank r of a distributed fit runs (inference/optimize.hpp): the draws of initialize() over
  /// [rows_before other rows; batch; rows_after other rows], with only batch's rows accumulated. The other rows'
  /// draws never depend on their content, so they are made and dropped without the rows.
  void initialize_shard(const ChainedAttentionBatch& batch, std::span<const double> w, Rng& rng, Index rows_before,
                        Index rows_after);
  /// An encoder that declares these S and T (the context width stays free).
  [[nodiscard]] ChainedAttentionEncoder encoder() const;
  /// Zeroes the statistics and detaches the state.
  void set_zero();
  /// The attachment rule of FlatAccumulator (combine requires equal states). @throws ValueError before any change for
  /// statistics of different optimizer states.
  void merge_attachment(const VariationalMultiHopAttentionAccumulator& v, AttachmentMerge how) {
    state_.merge(v.state_, how, kWhere);
  }

 private:
  /// The mass law of validate(), given Σ emission_count.
  void check_mass_laws(std::string_view where, double emitted) const;
  int64_t S_, D_, T_, mc_;
  AttachedOptimizerState state_;
};

/// Posterior quantities of one row at one embedding table (tests and diagnostics).
struct VariationalMultiHopPosterior {
  /// log p of the row at the given table; −∞ when no value of the row emits its target.
  double log_p = 0.0;
  /// a1 [N]: the first hop's gate from the query (it does not see the target).
  Vector hop1;   // a1 [N] (gate)
  /// a2 [N, N]: row i is the second hop's gate from the value at position i.
  Matrix hop2;   // a2 [N, N] (gate)
  /// ρ [N, N]: the posterior over the pair (first-hop position i, emitting position j); all zeros when log_p = −∞.
  Matrix joint;  // ρ [N, N] (posterior over (i, j))
};

/// The immutable model. The constructor validates and precomputes log B.
class VariationalMultiHopAttention {
 public:
  /// The parameter struct that the constructor takes (the four roles: docs/design.md).
  using params_type = VariationalMultiHopAttentionParams;
  /// The validated batch that log_density() and the E-step read (chained attention's batch).
  using batch_type = ChainedAttentionBatch;
  /// The statistics that the E-step, accumulate(), fills.
  using accumulator_type = VariationalMultiHopAttentionAccumulator;
  /// The M-step that turns those statistics into the next model.
  using estimator_type = VariationalMultiHopAttentionEstimator;
  /// The encoder that validates raw arrays into a batch_type (chained attention's encoder).
  using encoder_type = ChainedAttentionEncoder;
  /// The `family` name of this family's model files and of its optimizer state.
  static constexpr const char* kFamily = "variational_multihop_attention";
  /// The name of this class in error messages (its Python name).
  static constexpr const char* kWhere = "VariationalMultiHopAttentionDistribution";

  /// @throws ValueError on invalid parameters or a mismatched optimizer state.
  explicit VariationalMultiHopAttention(VariationalMultiHopAttentionParams params);

  /// The parameters; optimizer_state is always present.
  [[nodiscard]] const VariationalMultiHopAttentionParams& params() const noexcept { return params_; }
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
  /// The fixed gate variance σ² of both hops.
  [[nodiscard]] double sigma2() const noexcept { return params_.sigma2; }
  /// The number of symbols S (the rows of mean).
  [[nodiscard]] int64_t n_symbols() const noexcept { return params_.mean.rows(); }
  /// The embedding dimension D (the columns of mean).
  [[nodiscard]] int64_t embed_dim() const noexcept { return params_.mean.cols(); }
  /// The number of targets T (the columns of emission).
  [[nodiscard]] int64_t n_targets() const noexcept { return params_.emission.cols(); }

  /// out[n] = log p(t_n | k_n, v_n, q_n, E = m) (exact; −∞ for impossible rows). @throws ValueError on invalid ids.
  void log_density(const ChainedAttentionBatch& batch, std::span<double> out) const;
  /// The Monte-Carlo E-step with acc.mc() noise tables, atomically; attaches this model's state. log_p_out receives
  /// the plug-in log densities. @throws ImpossibleEvidenceError (nothing changed) for rows with w_n > 0 whose target
  /// no value emits.
  void accumulate(const ChainedAttentionBatch& batch, std::span<const double> w,
                  VariationalMultiHopAttentionAccumulator& acc, std::span<double> log_p_out = {}) const;
  /// Σ_{i,j} a1_i a2_ij B[v_j, ·] at E = m: [n, T].
  [[nodiscard]] Matrix predict_proba(const IdMatrix& keys, const IdMatrix& values, const IdVector& queries) const;
  /// The same for the rows of a batch; the batch's targets are not used. O(N²·D) per row. @throws ValueError when an id
  /// is out of the model's range.
  [[nodiscard]] Matrix predict_proba(const ChainedAttentionBatch& batch) const;
  /// Gates, posterior and log p of one row at an arbitrary embedding table [S, D].
  [[nodiscard]] VariationalMultiHopPosterior posterior_at(const Matrix& table, const ChainedAttentionBatch& batch,
                                                          Index row) const;

  /// An accumulator with the estimator default mc = 5.
  [[nodiscard]] VariationalMultiHopAttentionAccumulator make_accumulator() const;
  /// Estimator with this model's dimensions, σ², seed = optimizer_state().seed and name; other options default.
  [[nodiscard]] VariationalMultiHopAttentionEstimator estimator() const;
  /// An encoder that declares this model's S and T (the context width stays free).
  [[nodiscard]] ChainedAttentionEncoder encoder() const;
  /// Plug-in sampler (uses m only).
  [[nodiscard]] VariationalMultiHopAttentionSampler sampler(uint64_t seed, int64_t context_length = 6) const;
  /// Draws a fresh embedding table from q for every event.
  [[nodiscard]] VariationalMultiHopAttentionSampler posterior_predictive_sampler(uint64_t seed,
                                                                                int64_t context_length = 6) const;

 private:
  void check_batch(const ChainedAttentionBatch& batch) const;

  VariationalMultiHopAttentionParams params_;
  std::shared_ptr<const AttentionOptimizerState> state_;
  Matrix log_emission_;  // [S, T]
  std::shared_ptr<MonteCarloCache> noise_;
};

/// Options of the M-step (`docs/mechanisms.md#variational-multi-hop-attention`); the single source of the defaults.
struct VariationalMultiHopAttentionEstimatorOptions {
  /// The fixed gate variance σ² of both hops of the returned models (finite, at least 1e-100; default 0.3).
  double sigma2 = 0.3;
  /// The Adam step size of the embedding update (finite, > 0; default 0.05).
  double lr = 0.05;
  /// The number of Monte-Carlo noise tables per E-step of the accumulators that make_accumulator() returns (positive;
  /// default 5).
  int64_t mc = 5;
  /// The final KL weight (finite, ≥ 0; default 0.1), reached after anneal_iters Adam steps.
  double prior_strength = 0.1;
  /// The number of Adam steps over which the KL weight rises linearly to prior_strength (positive; default 100).
  int64_t anneal_iters = 100;
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
};

/// The stateless M-step: initial embeddings m ~ N(0, 1), log v = log 0.3 (from Rng(derive_seed(seed, kInit, 0)))
/// when the statistics carry no state, otherwise one Adam ascent step with KL weight λ_τ; B = (emission_count + ε)
/// row-normalised.
class VariationalMultiHopAttentionEstimator {
 public:
  /// The model that estimate() returns.
  using distribution_type = VariationalMultiHopAttention;
  /// The statistics that estimate() reads.
  using accumulator_type = VariationalMultiHopAttentionAccumulator;
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "VariationalMultiHopAttentionEstimator";

  /// @throws ValueError on non-positive dimensions or invalid options.
  VariationalMultiHopAttentionEstimator(int64_t n_symbols, int64_t embed_dim, int64_t n_targets,
                                        VariationalMultiHopAttentionEstimatorOptions options = {});

  /// The options of the M-step.
  [[nodiscard]] const VariationalMultiHopAttentionEstimatorOptions& options() const noexcept { return options_; }
  /// The number of symbols S.
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  /// The embedding dimension D.
  [[nodiscard]] int64_t embed_dim() const noexcept { return D_; }
  /// The number of targets T.
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }
  /// λ_τ for Adam step τ ≥ 1.
  [[nodiscard]] double kl_weight(int64_t tau) const;

  /// Zeroed statistics of these dimensions with options().mc noise tables, carrying options().keys.
  [[nodiscard]] VariationalMultiHopAttentionAccumulator make_accumulator() const;
  /// An encoder that declares these S and T (the context width stays free).
  [[nodiscard]] ChainedAttentionEncoder encoder() const;
  /// The M-step of the class comment: the next model from acc, with these options' σ² and name.
  /// @throws ValueError on invalid statistics, a state of another family or geometry, or nobs ≠ n.
  [[nodiscard]] VariationalMultiHopAttention estimate(std::optional<double> nobs,
                                                      const VariationalMultiHopAttentionAccumulator& acc) const;
  /// The sharded M-step of a distributed fit (inference/sharded_mstep.hpp): each rank sums and estimates its symbols'
  /// rows of the emission, which are then gathered; the embeddings' Adam step (O(S·D)) runs whole on every rank.
  /// Returns, bit for bit, what estimate(nullopt, Σ acc) returns; acc is left partly summed. Collective.
  [[nodiscard]] VariationalMultiHopAttention estimate_sharded(VariationalMultiHopAttentionAccumulator& acc,
                                                              const Communicator& comm) const;

 private:
  void check_layout(const VariationalMultiHopAttentionAccumulator& acc) const;
  /// The M-step from summed statistics: emission rows [shard.begin, shard.end) estimated here, the rest gathered
  /// from the other ranks of comm; without comm, shard covers every symbol.
  [[nodiscard]] VariationalMultiHopAttention estimate_symbols(const VariationalMultiHopAttentionAccumulator& acc,
                                                              const SymbolShard& shard,
                                                              const Communicator* comm) const;
  int64_t S_, D_, T_;
  VariationalMultiHopAttentionEstimatorOptions options_;
};

/// Draws, per event in this order: (posterior-predictive only: the table m + s ⊙ ε); keys and values iid uniform
/// over [S] (context_length each); q uniform; z1 ~ a1; z2 ~ a2[z1]; t ~ B[v_{z2}].
class VariationalMultiHopAttentionSampler {
 public:
  /// @throws ValueError unless context_length ≥ 1.
  VariationalMultiHopAttentionSampler(VariationalMultiHopAttention model, uint64_t seed, int64_t context_length = 6,
                                      bool posterior_predictive = false);
  /// Draws one observation (see the class comment).
  [[nodiscard]] ChainedAttentionObservation sample();
  /// m consecutive sample() draws as a batch.
  /// @throws ValueError when m is negative.
  [[nodiscard]] ChainedAttentionBatch sample(Index m);

 private:
  VariationalMultiHopAttention model_;
  Rng rng_;
  int64_t context_length_;
  bool posterior_predictive_;
  Matrix table_;
};

/// The family's descriptor (family/spec.hpp), registered in src/family/registry.cpp.
[[nodiscard]] const FamilySpec& variational_multihop_attention_family();

}  // namespace attnmix

#include "attnmix/core/concepts.hpp"
static_assert(attnmix::Distribution<attnmix::VariationalMultiHopAttention>);
static_assert(attnmix::Estimator<attnmix::VariationalMultiHopAttentionEstimator>);
