// SPDX-License-Identifier: Apache-2.0
/// @file responsibility.hpp
/// Responsibility attention (`docs/mechanisms.md#responsibility-attention`): one attention head as a latent-position
/// mixture with a generative gate, fitted by exact EM with closed-form, additive statistics.
///
/// Notation: S symbols, N positions, D query dimension, T targets; i ∈ [N]; s ∈ [S]; t ∈ [T].
///   key_means K       [S, D]   row s = mean query of symbol s
///   emission B        [S, T]   row-simplex, row s = p(t | attended symbol s)
///   position_prior π  [N]      simplex
///   σ²                         isotropic gate variance
/// Observation x = (c ∈ [S]^N, y ∈ R^D, t ∈ [T]). A symbol query q ∈ [0, D) stands for the one-hot y = e_q, without
/// the vector: its distances are ‖e_q − K[c_i]‖² = 1 − 2·K[c_i, q] + ‖K[c_i]‖² (the row norms precomputed), so a
/// batch of symbol queries costs O(N) per row whatever D is, and the n×D query matrix never exists.
///
///   ℓ_i = log π_i − ‖y − K[c_i]‖² / (2σ²) + gate_const + log B[c_i, t],  gate_const = −(D/2)·log(2πσ²)
///   log p(y, t | c) = LSE_i ℓ_i,   r_i = exp(ℓ_i − LSE_j ℓ_j)   (E-step responsibilities)
/// Prediction: a_i = softmax_i(log π_i − ‖y − K[c_i]‖²/(2σ²)),  p(t | c, y) = Σ_i a_i B[c_i, t].
/// Gradients (for encoders that produce the queries; B, π and σ² held fixed): g_i = (K[c_i] − y)/σ² is
/// ∂ℓ_i/∂y = −∂ℓ_i/∂K[c_i]. For an incoming gradient G [n] of log p, per row
///   ∂(G log p)/∂y = G Σ_i r_i g_i,   ∂(G log p)/∂K[s] = −G Σ_{i: c_i = s} r_i g_i;
/// for an incoming gradient G [n, T] of p(· | c, y), with u_i = Σ_t G_t B[c_i, t] and ū = Σ_j a_j u_j, per row
///   ∂(G·p)/∂y = Σ_i a_i (u_i − ū) g_i,   ∂(G·p)/∂K[s] = −Σ_{i: c_i = s} a_i (u_i − ū) g_i.
/// A symbol repeated in a context contributes once per position; key gradients are summed over the rows.
/// Cost: O(N·D) per row for log_density, the E-step and log_density_vjp; O(N·(D+T)) per row for predict_proba and
/// predict_proba_vjp; O(S·(D+T) + N) for the M-step. With symbol queries: O(N) per row for log_density and the E-step,
/// O(N·T) for predict_proba; the VJPs need real-valued queries.
/// Example: examples/responsibility_attention.cpp; examples/torch_em_encoder.py (an encoder trained through the VJPs).
/// Reference design: mixle; Brown et al. (1993) IBM alignment EM; Deng et al. (2018) latent alignment.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/precision.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/shared_rows.hpp"
#include "attnmix/core/types.hpp"
#include "attnmix/inference/sharded_mstep.hpp"

namespace attnmix {

struct FamilySpec;

class ResponsibilityAttentionEncoder;
class ResponsibilityAttentionEstimator;
class ResponsibilityAttentionSampler;
struct ResponsibilityFloatTables;

/// The arrays of a responsibility-attention batch, one row per observation.
struct ResponsibilityAttentionArrays {
  IdMatrix contexts;               ///< [n, N] context ids
  Matrix queries;                  ///< [n, D] real-valued queries (empty with symbol queries)
  IdVector query_symbols;          ///< [n] symbol queries, each standing for the one-hot e_q (empty with real ones)
  bool symbol_queries = false;     ///< whether the queries are symbols
  Index symbol_query_dim = 0;      ///< D of symbol queries: declared, or 1 + the largest query symbol
  int64_t max_query_symbol = -1;   ///< the largest query symbol (−1 without rows or with real-valued queries)
  IdVector targets;                ///< [n] target ids
  int64_t max_symbol = -1;         ///< the largest context id (−1 without rows)
  int64_t max_target = -1;         ///< the largest target (−1 without rows)
};

/// An immutable, validated batch of RA observations: contexts [n, N] ids, queries [n, D] (real-valued, or one symbol
/// q ∈ [0, D) per row standing for the one-hot e_q), targets [n].
/// Slices share storage (O(1)); only the encoder (and the sampler, which draws valid rows) creates batches.
class ResponsibilityAttentionBatch : public SharedRows<ResponsibilityAttentionBatch, ResponsibilityAttentionArrays> {
 public:
  /// An empty batch: no rows, context length 0 and query dimension 0. Batches with rows come from
  /// ResponsibilityAttentionEncoder::encode() or from a sampler.
  ResponsibilityAttentionBatch() = default;
  /// The context length N, the width of every context row (0 for an empty default batch).
  [[nodiscard]] Index context_length() const noexcept { return arrays().contexts.cols(); }
  /// The query dimension D, the number of coordinates of every query (0 for an empty default batch). With symbol
  /// queries it is the declared D, or 1 + the largest query symbol when none was declared.
  [[nodiscard]] Index query_dim() const noexcept {
    return arrays().symbol_queries ? arrays().symbol_query_dim : arrays().queries.cols();
  }
  /// Whether each row's query is a symbol q (the one-hot e_q) rather than a real vector.
  [[nodiscard]] bool has_symbol_queries() const noexcept { return arrays().symbol_queries; }
  /// The largest query symbol in the underlying storage (−1 when empty or with real-valued queries), like max_symbol().
  [[nodiscard]] int64_t max_query_symbol() const noexcept { return arrays().max_query_symbol; }
  /// Largest context id and target in the underlying storage (−1 when empty): O(1) range checks.
  [[nodiscard]] int64_t max_symbol() const noexcept { return arrays().max_symbol; }
  /// The largest target id in the underlying storage, −1 when it is empty. Like max_symbol(), it covers every row of
  /// the shared storage, not only this slice, so a range check against it is conservative and O(1).
  [[nodiscard]] int64_t max_target() const noexcept { return arrays().max_target; }
  /// The N context ids of row `row` (0-based within this slice), contiguous; valid while any batch shares the storage.
  /// No bounds check: row must lie in [0, n_rows()).
  [[nodiscard]] const int64_t* context(Index row) const noexcept { return row_of(arrays().contexts, row); }
  /// The D query coordinates of row `row` (0-based within this slice), contiguous. Only for real-valued queries
  /// (!has_symbol_queries()). No bounds check: row must lie in [0, n_rows()).
  [[nodiscard]] const double* query(Index row) const noexcept { return row_of(arrays().queries, row); }
  /// The query symbol of row `row`, in [0, D). Only for symbol queries (has_symbol_queries()). No bounds check.
  [[nodiscard]] int64_t query_symbol(Index row) const noexcept { return entry_of(arrays().query_symbols, row); }
  /// The query symbols of rows [row, n_rows()) are contiguous from here (numpy views in the Python module).
  [[nodiscard]] const int64_t* query_symbol_data(Index row = 0) const noexcept {
    return row_of(arrays().query_symbols, row);
  }
  /// Checks that the queries fit a model of query dimension D: D columns, or every query symbol below D.
  /// @throws ValueError naming `where` otherwise.
  void check_query_dim(const char* where, Index D) const;
  /// The target id of row `row`, in [0, T). No bounds check: row must lie in [0, n_rows()).
  [[nodiscard]] int64_t target(Index row) const noexcept { return entry_of(arrays().targets, row); }
  /// The targets of rows [row, n_rows()) are contiguous from here (numpy views in the Python module).
  [[nodiscard]] const int64_t* target_data(Index row = 0) const noexcept { return row_of(arrays().targets, row); }
  /// Copies of the rows (for writers and bindings).
  [[nodiscard]] IdMatrix contexts() const { return copy_of(arrays().contexts); }
  /// A copy of this slice's queries, [n, D]; symbol queries are written out as their one-hot rows (O(n·D) memory).
  [[nodiscard]] Matrix queries() const;
  /// A copy of this slice's query symbols, [n] (empty with real-valued queries).
  [[nodiscard]] IdVector query_symbols() const { return copy_of(arrays().query_symbols); }
  /// A copy of this slice's targets, [n].
  [[nodiscard]] IdVector targets() const { return copy_of(arrays().targets); }

 private:
  friend class ResponsibilityAttentionEncoder;
  ResponsibilityAttentionBatch(ResponsibilityAttentionArrays arrays, Index rows)
      : SharedRows(std::move(arrays), rows) {}
};

/// Validates raw arrays into a batch. Undeclared dimensions are taken from the data.
class ResponsibilityAttentionEncoder {
 public:
  /// The declared number of symbols S: context ids must lie in [0, S). When unset, ids are only checked to be ≥ 0, and
  /// the model checks the upper bound when it reads the batch.
  std::optional<int64_t> n_symbols;
  /// The declared context length N: contexts must have exactly N columns. When unset, N is the width of the contexts,
  /// which must be at least 1 when there are rows.
  std::optional<int64_t> context_length;
  /// The declared query dimension D: queries must have exactly D columns. When unset, D is the width of the queries,
  /// which must be at least 1 when there are rows.
  std::optional<int64_t> query_dim;
  /// The declared number of targets T: targets must lie in [0, T). When unset, targets are only checked to be ≥ 0.
  std::optional<int64_t> n_targets;

  /// @throws ValueError on shape mismatch, out-of-range ids, non-finite queries.
  [[nodiscard]] ResponsibilityAttentionBatch encode(IdMatrix contexts, Matrix queries, IdVector targets) const;
  /// Rows whose queries are symbols: query_symbols [n], each q in [0, D) standing for the one-hot e_q. D is the
  /// declared query_dim, else 1 + the largest query symbol. @throws ValueError on shape mismatch or out-of-range ids.
  [[nodiscard]] ResponsibilityAttentionBatch encode_symbols(IdMatrix contexts, IdVector query_symbols,
                                                            IdVector targets) const;
  /// Whether both encoders declare the same dimensions (member-wise comparison).
  [[nodiscard]] bool operator==(const ResponsibilityAttentionEncoder&) const = default;
};

/// Constructor arguments under their Python names (what model files store).
struct ResponsibilityAttentionParams {
  /// Key means K [S, D]: row s is the mean query that addresses symbol s. S, D ≥ 1; every entry finite with magnitude
  /// at most 1e50.
  Matrix key_means;       // [S, D]
  /// Emission matrix B [S, T]: row s is p(t | attended symbol s), a distribution. A zero entry is a structural zero.
  Matrix emission;        // [S, T] row-simplex
  /// Position prior π [N], a distribution over the context positions. A zero entry is a structural zero that no M-step
  /// revives.
  Vector position_prior;  // [N] simplex
  /// Isotropic gate variance σ², finite and at least 1e-100 (default 1).
  double sigma2 = 1.0;
  /// The model's name, stored in model files (may be empty).
  std::string name;
};

/// Statistics, in value() order: key_sum [S,D], key_mass [S], emission_count [S,T], position_count [N], query_sq.
class ResponsibilityAttentionAccumulator : public FlatAccumulator<ResponsibilityAttentionAccumulator> {
 public:
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "ResponsibilityAttentionAccumulator";
  /// The batch type that the E-step and initialize() read.
  using batch_type = ResponsibilityAttentionBatch;
  /// Zeroed statistics for S = n_symbols, N = context_length, D = query_dim and T = n_targets, carrying an optional
  /// tying key (keyed tying, `docs/mechanisms.md#building-blocks`). @throws ValueError when a dimension is not positive
  /// or the statistics would exceed 2^48 entries.
  ResponsibilityAttentionAccumulator(int64_t n_symbols, int64_t context_length, int64_t query_dim,
                                     int64_t n_targets, std::optional<std::string> keys = std::nullopt);

  /// The number of symbols S.
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  /// The context length N.
  [[nodiscard]] int64_t context_length() const noexcept { return N_; }
  /// The query dimension D.
  [[nodiscard]] int64_t query_dim() const noexcept { return D_; }
  /// The number of targets T.
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }

  /// Writable view of key_sum [S, D] (field 0): row s holds Σ w_n r_ni y_n over the positions i where c_i = s.
  [[nodiscard]] MatrixMap key_sum() { return {field(0), S_, D_}; }
  /// Writable view of key_mass [S] (field 1): entry s holds Σ w_n r_ni over the positions i where c_i = s.
  [[nodiscard]] VectorMap key_mass() { return {field(1), S_}; }
  /// Writable view of emission_count [S, T] (field 2): entry (s, t) holds Σ w_n r_ni over the positions i where
  /// c_i = s, in the rows whose target is t.
  [[nodiscard]] MatrixMap emission_count() { return {field(2), S_, T_}; }
  /// Writable view of position_count [N] (field 3): entry i holds Σ_n w_n r_ni. Its total is the assigned mass M.
  [[nodiscard]] VectorMap position_count() { return {field(3), N_}; }
  /// Writable reference to query_sq (field 4): Σ_n w_n (Σ_i r_ni) ‖y_n‖², which the σ² update needs.
  [[nodiscard]] double& query_sq() { return *field(4); }
  /// Read-only view of key_sum [S, D] (field 0).
  [[nodiscard]] ConstMatrixMap key_sum() const { return {field(0), S_, D_}; }
  /// Read-only view of key_mass [S] (field 1).
  [[nodiscard]] ConstVectorMap key_mass() const { return {field(1), S_}; }
  /// Read-only view of emission_count [S, T] (field 2).
  [[nodiscard]] ConstMatrixMap emission_count() const { return {field(2), S_, T_}; }
  /// Read-only view of position_count [N] (field 3).
  [[nodiscard]] ConstVectorMap position_count() const { return {field(3), N_}; }
  /// The value of query_sq (field 4).
  [[nodiscard]] double query_sq() const { return *field(4); }

  /// Σ position_count: the assigned mass M.
  [[nodiscard]] double total_mass() const;
  /// Finite entries, counts ≥ 0, Σ key_mass = Σ emission_count = M. @throws ValueError when a check fails.
  void validate(std::string_view where) const;
  /// validate() on a rank of a sharded M-step (inference/sharded_mstep.hpp), whose statistics are summed in this
  /// rank's entries of split (its last run: emission_count's): those entries checked here (every rank failing if one
  /// does), the mass laws with the emission total summed over ranks. Collective.
  void validate_owned(std::string_view where, const StatsSplit& split, const Communicator& comm) const;
  /// seq_initialize: r_n ~ Dirichlet(1_N) from rng for every row (in row order), times w_n, accumulated.
  void initialize(const ResponsibilityAttentionBatch& batch, std::span<const double> w, Rng& rng);
  /// What rank r of a distributed fit runs (inference/optimize.hpp): the draws of initialize() over
  /// [rows_before other rows; batch; rows_after other rows], with only batch's rows accumulated. The other rows'
  /// draws never depend on their content, so they are made and dropped without the rows.
  void initialize_shard(const ResponsibilityAttentionBatch& batch, std::span<const double> w, Rng& rng,
                        Index rows_before, Index rows_after);
  /// The encoder matching these dimensions (acc_to_encoder).
  [[nodiscard]] ResponsibilityAttentionEncoder encoder() const;

 private:
  /// The mass laws of validate(), given Σ emission_count.
  void check_mass_laws(std::string_view where, double emitted) const;
  int64_t S_, N_, D_, T_;
};

/// A vector–Jacobian product of a batch function of the queries Y [n, D] and the key means K [S, D]: for the
/// incoming gradient G of the function's output and L = ⟨G, f(Y, K)⟩, the exact ∂L/∂Y and ∂L/∂K.
struct ResponsibilityAttentionVjp {
  /// ∂L/∂Y [n, D]: row n is the gradient with respect to the query y_n.
  Matrix queries;    // [n, D]: row n = ∂L/∂y_n
  /// ∂L/∂K [S, D]: row s is the gradient with respect to K[s], summed over all rows and positions that hold symbol s
  /// (zero for a symbol that never occurs).
  Matrix key_means;  // [S, D]: row s = ∂L/∂K[s]
};

/// The immutable model. The constructor validates and precomputes log tables.
class ResponsibilityAttention {
 public:
  /// The parameter struct that the constructor takes (the four roles: docs/design.md).
  using params_type = ResponsibilityAttentionParams;
  /// The validated batch that log_density() and the E-step read.
  using batch_type = ResponsibilityAttentionBatch;
  /// The statistics that the E-step, accumulate(), fills.
  using accumulator_type = ResponsibilityAttentionAccumulator;
  /// The M-step that turns those statistics into the next model.
  using estimator_type = ResponsibilityAttentionEstimator;
  /// The encoder that validates raw arrays into a batch_type.
  using encoder_type = ResponsibilityAttentionEncoder;
  /// The `family` name of this family's model files.
  static constexpr const char* kFamily = "responsibility_attention";
  /// The name of this class in error messages (its Python name).
  static constexpr const char* kWhere = "ResponsibilityAttentionDistribution";

  /// precision: the arithmetic of log_density, the E-step and log_density_vjp (core/precision.hpp; mixed builds
  /// float copies of K, log B and log π, O(S·(D + T) + N)). predict_proba and its VJP are float64 in either, and so
  /// are batches of symbol queries (their gate has no D loop for float vectors to shorten).
  /// @throws ValueError on invalid parameters.
  explicit ResponsibilityAttention(ResponsibilityAttentionParams params, Precision precision = Precision::kFloat64);

  /// The parameters, as validated by the constructor.
  [[nodiscard]] const ResponsibilityAttentionParams& params() const noexcept { return params_; }
  /// The number of symbols S (the rows of key_means).
  [[nodiscard]] int64_t n_symbols() const noexcept { return params_.key_means.rows(); }
  /// The query dimension D (the columns of key_means).
  [[nodiscard]] int64_t query_dim() const noexcept { return params_.key_means.cols(); }
  /// The number of targets T (the columns of emission).
  [[nodiscard]] int64_t n_targets() const noexcept { return params_.emission.cols(); }
  /// The context length N (the length of position_prior).
  [[nodiscard]] int64_t context_length() const noexcept { return params_.position_prior.size(); }
  /// The gate variance σ².
  [[nodiscard]] double sigma2() const noexcept { return params_.sigma2; }
  /// The arithmetic of log_density, the E-step and log_density_vjp (core/precision.hpp).
  [[nodiscard]] Precision precision() const noexcept { return precision_; }
  /// The Gaussian normalising constant −(D/2)·log(2πσ²), included in every ℓ_i so that log_density is a proper density
  /// over y.
  [[nodiscard]] double gate_const() const noexcept { return gate_const_; }
  /// log π [N], precomputed by the constructor (−∞ where π_i = 0).
  [[nodiscard]] const Vector& log_position_prior() const noexcept { return log_prior_; }

  /// out[n] = log p(y_n, t_n | c_n) (exact; −∞ for impossible rows). @throws ValueError on a batch of other dims.
  void log_density(const ResponsibilityAttentionBatch& batch, std::span<double> out) const;
  /// The E-step: adds w_n r_n statistics of every row to acc, atomically. If log_p_out is non-empty it receives
  /// log_density. @throws ImpossibleEvidenceError (nothing changed) for rows with w_n > 0 and log p = −∞.
  void accumulate(const ResponsibilityAttentionBatch& batch, std::span<const double> w,
                  ResponsibilityAttentionAccumulator& acc, std::span<double> log_p_out = {}) const;
  /// p(t | c, y) [n, T] for contexts [n, N] and queries [n, D] (validated like the encoder).
  [[nodiscard]] Matrix predict_proba(const IdMatrix& contexts, const Matrix& queries) const;
  /// p(t | c, y) [n, T] for the rows of a batch; the batch's targets are not used. O(N·(D + T)) per row, in float64
  /// whatever the precision. @throws ValueError on a batch of other dimensions or with out-of-range ids.
  [[nodiscard]] Matrix predict_proba(const ResponsibilityAttentionBatch& batch) const;
  /// log p(t_n | c_n, y_n) = log Σ_i a_i B[c_i, t_n] of every row, for the batch's targets (−∞ where the target has
  /// probability 0): a column of predict_proba at O(N·D) per row (O(N) with symbol queries), in float64.
  /// @throws ValueError on a batch of other dimensions or with out-of-range ids.
  [[nodiscard]] Vector target_log_proba(const ResponsibilityAttentionBatch& batch) const;
  /// The E-step responsibilities r [n, N]: which position each row attends to, given its target (each row sums to 1;
  /// a row impossible under the model is all zeros). The same bits as the E-step's, in the model's precision.
  [[nodiscard]] Matrix responsibilities(const ResponsibilityAttentionBatch& batch) const;
  /// The vector–Jacobian product of log_density: L = Σ_n grad_log_p[n] log p(y_n, t_n | c_n). The batch's queries
  /// must be real-valued (symbol queries have no gradient; ValueError). A row with
  /// log p = −∞ (impossible evidence, caused by zero entries of π or B, which do not depend on y or K) contributes
  /// zero to both gradients: its log density is the constant −∞ around its y and K.
  /// @throws ValueError on a batch of other dims, or grad_log_p not of length n or not finite.
  [[nodiscard]] ResponsibilityAttentionVjp log_density_vjp(const ResponsibilityAttentionBatch& batch,
                                                           std::span<const double> grad_log_p) const;
  /// The vector–Jacobian product of predict_proba: L = Σ_{n,t} grad_proba[n, t] p(t | c_n, y_n). The batch's targets
  /// are not used; its queries must be real-valued. @throws ValueError on a batch of other dims or with symbol
  /// queries, or grad_proba not [n, T] or not finite.
  [[nodiscard]] ResponsibilityAttentionVjp predict_proba_vjp(const ResponsibilityAttentionBatch& batch,
                                                             const Matrix& grad_proba) const;
  /// The same for contexts [n, N] and queries [n, D] (validated like the encoder).
  [[nodiscard]] ResponsibilityAttentionVjp predict_proba_vjp(const IdMatrix& contexts, const Matrix& queries,
                                                             const Matrix& grad_proba) const;

  /// Zeroed statistics of this model's dimensions, without a tying key.
  [[nodiscard]] ResponsibilityAttentionAccumulator make_accumulator() const;
  /// Estimator with this model's dimensions, σ² fixed at this model's σ², its name and its precision.
  [[nodiscard]] ResponsibilityAttentionEstimator estimator() const;
  /// An encoder that declares this model's S, N, D and T, so that the batches it makes fit this model.
  [[nodiscard]] ResponsibilityAttentionEncoder encoder() const;
  /// A sampler of this model whose random stream is seeded with seed (see ResponsibilityAttentionSampler).
  [[nodiscard]] ResponsibilityAttentionSampler sampler(uint64_t seed) const;

 private:
  friend class ResponsibilityAttentionEstimator;
  /// The M-step's model: params as the estimator made them, with the tables derived from their rows, log B and
  /// ‖K[s]‖², which a sharded M-step computes rank by rank. K and B are valid by construction and not checked again
  /// (O(S·(D + T)) saved per iteration); π and σ² are.
  ResponsibilityAttention(ResponsibilityAttentionParams params, Precision precision, Matrix log_emission,
                          Vector key_sq_norm);
  /// Rows [begin, end) of the per-symbol tables, log B and ‖K[s]‖², into log_emission [S, T] and key_sq_norm [S]: one
  /// expression per row, so that every constructor and every rank of a sharded M-step gets the same bits.
  static void derive_symbol_tables(const ResponsibilityAttentionParams& params, Index begin, Index end,
                                   Matrix& log_emission, Vector& key_sq_norm);
  /// The tables of the constructors that depend only on N, σ² and π: log π, 1/(2σ²), the gate constant, and the
  /// float tables of mixed precision.
  void derive_gate_tables();
  void check_batch(const ResponsibilityAttentionBatch& batch) const;

  ResponsibilityAttentionParams params_;
  Vector log_prior_;     // [N]
  Matrix log_emission_;  // [S, T]
  Vector key_sq_norm_;   // [S]: ‖K[s]‖², the distances of symbol queries
  double inv_two_sigma2_ = 0.0;
  double gate_const_ = 0.0;
  Precision precision_ = Precision::kFloat64;
  std::shared_ptr<const ResponsibilityFloatTables> float_tables_;  // mixed only
};

/// The M-step's floor on a symbol's key mass: K[s] = key_sum[s] / max(key_mass[s], this), so a symbol that received no
/// responsibility gets the zero key (`docs/mechanisms.md#responsibility-attention`; dense and sparse tables alike).
inline constexpr double kResponsibilityKeyMassFloor = 1e-12;

/// Options of the M-step (`docs/mechanisms.md#responsibility-attention`); the single source of the defaults.
struct ResponsibilityAttentionEstimatorOptions {
  /// The gate variance σ² of the returned models (finite, at least 1e-100; default 1). With estimate_sigma2 it is used
  /// only when the statistics hold no key mass.
  double sigma2 = 1.0;
  /// Whether the M-step learns σ² as the pooled within-symbol scatter, floored at min_sigma2 (default false: σ² stays
  /// fixed).
  bool estimate_sigma2 = false;
  /// The floor of a learned σ² (finite, at least 1e-100; default 1e-6).
  double min_sigma2 = 1e-6;
  /// The pseudo-count ε added to every emission count before the rows are normalised (finite, ≥ 0; default 1e-6).
  double emission_smoothing = 1e-6;
  /// The name of the models that estimate() returns.
  std::string name;
  /// The tying key of the accumulators that make_accumulator() returns: sites with the same key pool their statistics
  /// after the E-step (`docs/mechanisms.md#building-blocks`).
  std::optional<std::string> keys;
  /// The precision of the models estimate() returns (their E-steps; core/precision.hpp).
  Precision precision = Precision::kFloat64;
};

/// The M-step: const and stateless.
class ResponsibilityAttentionEstimator {
 public:
  /// The model that estimate() returns.
  using distribution_type = ResponsibilityAttention;
  /// The statistics that estimate() reads.
  using accumulator_type = ResponsibilityAttentionAccumulator;
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "ResponsibilityAttentionEstimator";

  /// @throws ValueError on non-positive dimensions or invalid options.
  ResponsibilityAttentionEstimator(int64_t n_symbols, int64_t context_length, int64_t query_dim, int64_t n_targets,
                                   ResponsibilityAttentionEstimatorOptions options = {});

  /// The options of the M-step.
  [[nodiscard]] const ResponsibilityAttentionEstimatorOptions& options() const noexcept { return options_; }
  /// The number of symbols S.
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  /// The context length N.
  [[nodiscard]] int64_t context_length() const noexcept { return N_; }
  /// The query dimension D.
  [[nodiscard]] int64_t query_dim() const noexcept { return D_; }
  /// The number of targets T.
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }

  /// Zeroed statistics of these dimensions, carrying options().keys.
  [[nodiscard]] ResponsibilityAttentionAccumulator make_accumulator() const;
  /// An encoder that declares these dimensions.
  [[nodiscard]] ResponsibilityAttentionEncoder encoder() const;
  /// K = key_sum / max(key_mass, 1e-12); B = smoothed row-normalised counts; π = normalised position counts;
  /// σ² fixed or the pooled scatter (floored at min_sigma2). nobs, when given, must equal Σ position_count.
  /// @throws ValueError on invalid statistics.
  [[nodiscard]] ResponsibilityAttention estimate(std::optional<double> nobs,
                                                 const ResponsibilityAttentionAccumulator& acc) const;
  /// The sharded M-step of a distributed fit (inference/sharded_mstep.hpp): acc holds this rank's E-step statistics;
  /// key_sum and emission_count are summed over the ranks of comm in this rank's symbols only, the rest whole, each
  /// rank estimates its symbols' K and B rows and σ² terms, and the rows are gathered. Returns, bit for bit, what
  /// estimate(nullopt, Σ acc) returns; acc is left partly summed. Collective. Cost per rank: O(S·(D + T)/P)
  /// estimation, the communication of one allreduce of the statistics and allgathers of K, B and log B.
  [[nodiscard]] ResponsibilityAttention estimate_sharded(ResponsibilityAttentionAccumulator& acc,
                                                         const Communicator& comm) const;

 private:
  void check_layout(const ResponsibilityAttentionAccumulator& acc) const;
  /// The M-step from summed statistics: rows [shard.begin, shard.end) estimated here, the rest gathered from the
  /// other ranks of comm; without comm, shard covers every symbol.
  [[nodiscard]] ResponsibilityAttention estimate_symbols(const ResponsibilityAttentionAccumulator& acc,
                                                         const SymbolShard& shard, const Communicator* comm) const;
  int64_t S_, N_, D_, T_;
  ResponsibilityAttentionEstimatorOptions options_;
};

/// One observation: context ids [N], query [D], target.
struct ResponsibilityAttentionObservation {
  /// The context symbol ids [N], each in [0, S).
  std::vector<int64_t> context;
  /// The query [D].
  std::vector<double> query;
  /// The target id, in [0, T).
  int64_t target = 0;
};

/// Draws, per observation: a context (without replacement when N ≤ S), z ~ π, y = K[c_z] + σ·N(0, I), t ~ B[c_z].
class ResponsibilityAttentionSampler {
 public:
  /// A sampler of model whose random stream is seeded with seed: the same seed gives the same draws.
  ResponsibilityAttentionSampler(ResponsibilityAttention model, uint64_t seed);
  /// Draws one observation (see the class comment).
  [[nodiscard]] ResponsibilityAttentionObservation sample();
  /// m consecutive sample() draws as a batch.
  /// @throws ValueError when m is negative.
  [[nodiscard]] ResponsibilityAttentionBatch sample(Index m);

 private:
  ResponsibilityAttention model_;
  Rng rng_;
};

/// Triples of a token sequence: for p ∈ [N−1, len−2], context tokens[p−N+1..p], query
/// embeddings[tokens[p]] (without embeddings the symbol tokens[p], with D = S: the one-hot of length S), target
/// tokens[p+1]. S = max + 1 unless given.
/// @throws ValueError on invalid ids or embeddings.
[[nodiscard]] ResponsibilityAttentionBatch sequence_to_triples(std::span<const int64_t> tokens,
                                                               int64_t context_length,
                                                               std::optional<int64_t> n_symbols = std::nullopt,
                                                               const Matrix* embeddings = nullptr);

/// The family's descriptor (family/spec.hpp), registered in src/family/registry.cpp.
[[nodiscard]] const FamilySpec& responsibility_attention_family();

}  // namespace attnmix

#include "attnmix/core/concepts.hpp"
static_assert(attnmix::Batch<attnmix::ResponsibilityAttentionBatch>);
static_assert(attnmix::Distribution<attnmix::ResponsibilityAttention>);
static_assert(attnmix::Estimator<attnmix::ResponsibilityAttentionEstimator>);
