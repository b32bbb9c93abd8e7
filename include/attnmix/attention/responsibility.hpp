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
/// Observation x = (c ∈ [S]^N, y ∈ R^D, t ∈ [T]):
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
/// predict_proba_vjp; O(S·(D+T) + N) for the M-step.
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
#include "attnmix/core/types.hpp"

namespace attnmix {

struct FamilySpec;

class ResponsibilityAttentionEncoder;
class ResponsibilityAttentionEstimator;
class ResponsibilityAttentionSampler;
struct ResponsibilityFloatTables;

/// An immutable, validated batch of RA observations: contexts [n, N] ids, queries [n, D], targets [n].
/// Slices share storage (O(1)); only the encoder (and the sampler, which draws valid rows) creates batches.
class ResponsibilityAttentionBatch {
 public:
  ResponsibilityAttentionBatch();
  [[nodiscard]] Index n_rows() const noexcept { return count_; }
  [[nodiscard]] Index context_length() const noexcept { return storage_->contexts.cols(); }
  [[nodiscard]] Index query_dim() const noexcept { return storage_->queries.cols(); }
  /// Largest context id and target in the underlying storage (−1 when empty): O(1) range checks.
  [[nodiscard]] int64_t max_symbol() const noexcept { return storage_->max_symbol; }
  [[nodiscard]] int64_t max_target() const noexcept { return storage_->max_target; }
  [[nodiscard]] const int64_t* context(Index row) const noexcept {
    return storage_->contexts.data() + (begin_ + row) * storage_->contexts.cols();
  }
  [[nodiscard]] const double* query(Index row) const noexcept {
    return storage_->queries.data() + (begin_ + row) * storage_->queries.cols();
  }
  [[nodiscard]] int64_t target(Index row) const noexcept { return storage_->targets[begin_ + row]; }
  /// The targets of rows [row, n_rows()) are contiguous from here (numpy views in the Python module).
  [[nodiscard]] const int64_t* target_data(Index row = 0) const noexcept {
    return storage_->targets.data() + begin_ + row;
  }
  /// Rows [begin, begin + count) sharing this batch's storage.
  [[nodiscard]] ResponsibilityAttentionBatch slice(Index begin, Index count) const;
  /// Copies of the rows (for writers and bindings).
  [[nodiscard]] IdMatrix contexts() const;
  [[nodiscard]] Matrix queries() const;
  [[nodiscard]] IdVector targets() const;

 private:
  friend class ResponsibilityAttentionEncoder;
  struct Storage {
    IdMatrix contexts;
    Matrix queries;
    IdVector targets;
    int64_t max_symbol = -1;
    int64_t max_target = -1;
  };
  std::shared_ptr<const Storage> storage_;
  Index begin_ = 0;
  Index count_ = 0;
};

/// Validates raw arrays into a batch. Undeclared dimensions are taken from the data.
class ResponsibilityAttentionEncoder {
 public:
  std::optional<int64_t> n_symbols;
  std::optional<int64_t> context_length;
  std::optional<int64_t> query_dim;
  std::optional<int64_t> n_targets;

  /// @throws ValueError on shape mismatch, out-of-range ids, non-finite queries.
  [[nodiscard]] ResponsibilityAttentionBatch encode(IdMatrix contexts, Matrix queries, IdVector targets) const;
  [[nodiscard]] bool operator==(const ResponsibilityAttentionEncoder&) const = default;
};

/// Constructor arguments under their Python names (what model files store).
struct ResponsibilityAttentionParams {
  Matrix key_means;       // [S, D]
  Matrix emission;        // [S, T] row-simplex
  Vector position_prior;  // [N] simplex
  double sigma2 = 1.0;
  std::string name;
};

/// Statistics, in value() order: key_sum [S,D], key_mass [S], emission_count [S,T], position_count [N], query_sq.
class ResponsibilityAttentionAccumulator : public FlatAccumulator<ResponsibilityAttentionAccumulator> {
 public:
  static constexpr const char* kWhere = "ResponsibilityAttentionAccumulator";
  using batch_type = ResponsibilityAttentionBatch;
  ResponsibilityAttentionAccumulator(int64_t n_symbols, int64_t context_length, int64_t query_dim,
                                     int64_t n_targets, std::optional<std::string> keys = std::nullopt);

  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  [[nodiscard]] int64_t context_length() const noexcept { return N_; }
  [[nodiscard]] int64_t query_dim() const noexcept { return D_; }
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }

  [[nodiscard]] MatrixMap key_sum() { return {field(0), S_, D_}; }
  [[nodiscard]] VectorMap key_mass() { return {field(1), S_}; }
  [[nodiscard]] MatrixMap emission_count() { return {field(2), S_, T_}; }
  [[nodiscard]] VectorMap position_count() { return {field(3), N_}; }
  [[nodiscard]] double& query_sq() { return *field(4); }
  [[nodiscard]] ConstMatrixMap key_sum() const { return {field(0), S_, D_}; }
  [[nodiscard]] ConstVectorMap key_mass() const { return {field(1), S_}; }
  [[nodiscard]] ConstMatrixMap emission_count() const { return {field(2), S_, T_}; }
  [[nodiscard]] ConstVectorMap position_count() const { return {field(3), N_}; }
  [[nodiscard]] double query_sq() const { return *field(4); }

  /// Σ position_count: the assigned mass M.
  [[nodiscard]] double total_mass() const;
  /// Finite entries, counts ≥ 0, Σ key_mass = Σ emission_count = M. @throws ValueError.
  void validate(std::string_view where) const;
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
  int64_t S_, N_, D_, T_;
};

/// A vector–Jacobian product of a batch function of the queries Y [n, D] and the key means K [S, D]: for the
/// incoming gradient G of the function's output and L = ⟨G, f(Y, K)⟩, the exact ∂L/∂Y and ∂L/∂K.
struct ResponsibilityAttentionVjp {
  Matrix queries;    // [n, D]: row n = ∂L/∂y_n
  Matrix key_means;  // [S, D]: row s = ∂L/∂K[s]
};

/// The immutable model. The constructor validates and precomputes log tables.
class ResponsibilityAttention {
 public:
  using params_type = ResponsibilityAttentionParams;
  using batch_type = ResponsibilityAttentionBatch;
  using accumulator_type = ResponsibilityAttentionAccumulator;
  using estimator_type = ResponsibilityAttentionEstimator;
  using encoder_type = ResponsibilityAttentionEncoder;
  static constexpr const char* kFamily = "responsibility_attention";
  static constexpr const char* kWhere = "ResponsibilityAttentionDistribution";

  /// precision: the arithmetic of log_density, the E-step and log_density_vjp (core/precision.hpp; mixed builds
  /// float copies of K, log B and log π, O(S·(D + T) + N)). predict_proba and its VJP are float64 in either.
  /// @throws TypeError/ValueError on invalid parameters.
  explicit ResponsibilityAttention(ResponsibilityAttentionParams params, Precision precision = Precision::kFloat64);

  [[nodiscard]] const ResponsibilityAttentionParams& params() const noexcept { return params_; }
  [[nodiscard]] int64_t n_symbols() const noexcept { return params_.key_means.rows(); }
  [[nodiscard]] int64_t query_dim() const noexcept { return params_.key_means.cols(); }
  [[nodiscard]] int64_t n_targets() const noexcept { return params_.emission.cols(); }
  [[nodiscard]] int64_t context_length() const noexcept { return params_.position_prior.size(); }
  [[nodiscard]] double sigma2() const noexcept { return params_.sigma2; }
  [[nodiscard]] Precision precision() const noexcept { return precision_; }
  [[nodiscard]] double gate_const() const noexcept { return gate_const_; }
  [[nodiscard]] const Vector& log_position_prior() const noexcept { return log_prior_; }

  /// out[n] = log p(y_n, t_n | c_n) (exact; −∞ for impossible rows). @throws ValueError on a batch of other dims.
  void log_density(const ResponsibilityAttentionBatch& batch, std::span<double> out) const;
  /// The E-step: adds w_n r_n statistics of every row to acc, atomically. If log_p_out is non-empty it receives
  /// log_density. @throws ImpossibleEvidenceError (nothing changed) for rows with w_n > 0 and log p = −∞.
  void accumulate(const ResponsibilityAttentionBatch& batch, std::span<const double> w,
                  ResponsibilityAttentionAccumulator& acc, std::span<double> log_p_out = {}) const;
  /// p(t | c, y) [n, T] for contexts [n, N] and queries [n, D] (validated like the encoder).
  [[nodiscard]] Matrix predict_proba(const IdMatrix& contexts, const Matrix& queries) const;
  [[nodiscard]] Matrix predict_proba(const ResponsibilityAttentionBatch& batch) const;
  /// The E-step responsibilities r [n, N]: which position each row attends to, given its target (each row sums to 1;
  /// a row impossible under the model is all zeros). The same bits as the E-step's, in the model's precision.
  [[nodiscard]] Matrix responsibilities(const ResponsibilityAttentionBatch& batch) const;
  /// The vector–Jacobian product of log_density: L = Σ_n grad_log_p[n] log p(y_n, t_n | c_n). A row with
  /// log p = −∞ (impossible evidence, caused by zero entries of π or B, which do not depend on y or K) contributes
  /// zero to both gradients: its log density is the constant −∞ around its y and K.
  /// @throws ValueError on a batch of other dims, or grad_log_p not of length n or not finite.
  [[nodiscard]] ResponsibilityAttentionVjp log_density_vjp(const ResponsibilityAttentionBatch& batch,
                                                           std::span<const double> grad_log_p) const;
  /// The vector–Jacobian product of predict_proba: L = Σ_{n,t} grad_proba[n, t] p(t | c_n, y_n). The batch's targets
  /// are not used. @throws ValueError on a batch of other dims, or grad_proba not [n, T] or not finite.
  [[nodiscard]] ResponsibilityAttentionVjp predict_proba_vjp(const ResponsibilityAttentionBatch& batch,
                                                             const Matrix& grad_proba) const;
  /// The same for contexts [n, N] and queries [n, D] (validated like the encoder).
  [[nodiscard]] ResponsibilityAttentionVjp predict_proba_vjp(const IdMatrix& contexts, const Matrix& queries,
                                                             const Matrix& grad_proba) const;

  [[nodiscard]] ResponsibilityAttentionAccumulator make_accumulator() const;
  /// Estimator with this model's dimensions, σ² fixed at this model's σ², its name and its precision.
  [[nodiscard]] ResponsibilityAttentionEstimator estimator() const;
  [[nodiscard]] ResponsibilityAttentionEncoder encoder() const;
  [[nodiscard]] ResponsibilityAttentionSampler sampler(uint64_t seed) const;

 private:
  void check_batch(const ResponsibilityAttentionBatch& batch) const;

  ResponsibilityAttentionParams params_;
  Vector log_prior_;     // [N]
  Matrix log_emission_;  // [S, T]
  double inv_two_sigma2_ = 0.0;
  double gate_const_ = 0.0;
  Precision precision_ = Precision::kFloat64;
  std::shared_ptr<const ResponsibilityFloatTables> float_tables_;  // mixed only
};

/// Options of the M-step (`docs/mechanisms.md#responsibility-attention`); the single source of the defaults.
struct ResponsibilityAttentionEstimatorOptions {
  double sigma2 = 1.0;
  bool estimate_sigma2 = false;
  double min_sigma2 = 1e-6;
  double emission_smoothing = 1e-6;
  std::string name;
  std::optional<std::string> keys;
  /// The precision of the models estimate() returns (their E-steps; core/precision.hpp).
  Precision precision = Precision::kFloat64;
};

/// The M-step: const and stateless.
class ResponsibilityAttentionEstimator {
 public:
  using distribution_type = ResponsibilityAttention;
  using accumulator_type = ResponsibilityAttentionAccumulator;
  static constexpr const char* kWhere = "ResponsibilityAttentionEstimator";

  /// @throws ValueError on non-positive dimensions or invalid options.
  ResponsibilityAttentionEstimator(int64_t n_symbols, int64_t context_length, int64_t query_dim, int64_t n_targets,
                                   ResponsibilityAttentionEstimatorOptions options = {});

  [[nodiscard]] const ResponsibilityAttentionEstimatorOptions& options() const noexcept { return options_; }
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  [[nodiscard]] int64_t context_length() const noexcept { return N_; }
  [[nodiscard]] int64_t query_dim() const noexcept { return D_; }
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }

  [[nodiscard]] ResponsibilityAttentionAccumulator make_accumulator() const;
  [[nodiscard]] ResponsibilityAttentionEncoder encoder() const;
  /// K = key_sum / max(key_mass, 1e-12); B = smoothed row-normalised counts; π = normalised position counts;
  /// σ² fixed or the pooled scatter (floored at min_sigma2). nobs, when given, must equal Σ position_count.
  /// @throws ValueError on invalid statistics.
  [[nodiscard]] ResponsibilityAttention estimate(std::optional<double> nobs,
                                                 const ResponsibilityAttentionAccumulator& acc) const;

 private:
  int64_t S_, N_, D_, T_;
  ResponsibilityAttentionEstimatorOptions options_;
};

/// One observation: context ids [N], query [D], target.
struct ResponsibilityAttentionObservation {
  std::vector<int64_t> context;
  std::vector<double> query;
  int64_t target = 0;
};

/// Draws, per observation: a context (without replacement when N ≤ S), z ~ π, y = K[c_z] + σ·N(0, I), t ~ B[c_z].
class ResponsibilityAttentionSampler {
 public:
  ResponsibilityAttentionSampler(ResponsibilityAttention model, uint64_t seed);
  [[nodiscard]] ResponsibilityAttentionObservation sample();
  /// m consecutive sample() draws as a batch.
  [[nodiscard]] ResponsibilityAttentionBatch sample(Index m);

 private:
  ResponsibilityAttention model_;
  Rng rng_;
};

/// Triples of a token sequence: for p ∈ [N−1, len−2], context tokens[p−N+1..p], query
/// embeddings[tokens[p]] (one-hot of length S without embeddings), target tokens[p+1]. S = max + 1 unless given.
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
