// SPDX-License-Identifier: Apache-2.0
/// @file optimizer_state.hpp
/// What the variational families share (`docs/mechanisms.md#variational-embedding-attention`): the Adam state carried
/// by the model, the Adam ascent step of the M-step, the KL term, the Monte-Carlo noise of one iteration and the
/// attachment that makes a statistics value carry the state it was computed under.
///
/// Embeddings: mean m [S, D], log variance log v [S, D]; q(e_s) = N(m_s, diag(v_s)); prior N(0, I).
///   KL(q ‖ p) = ½ Σ (v + m² − 1 − log v);   ∂KL/∂m = m;   ∂KL/∂log v = ½ (v − 1)
/// Adam ascent of iteration τ = iteration + 1 on g = data gradient − λ ∂KL (separate moments for m and log v):
///   μ1 ← 0.9 μ1 + 0.1 g;  μ2 ← 0.999 μ2 + 0.001 g²;  θ ← θ + lr (μ1/(1 − 0.9^τ)) / (√(μ2/(1 − 0.999^τ)) + 1e-8)
///   then log v ← clip(log v, −8, 2).
/// Noise of iteration τ: ε_k ~ N(0, 1)^{S×D} (row-major, k = 0..mc−1 in order) from Rng(derive_seed(seed, kMcNoise,
/// τ)); the perturbed tables are E_k = m + exp(½ log v) ⊙ ε_k. The draws for mc are a prefix of those for mc + 1.
/// Cost: O(S·D) per Adam step and per noise table.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

class ModelJsonField;

/// The optimizer state of one variational model: immutable once built, validated by validate().
struct AttentionOptimizerState {
  /// The schema_version of the JSON form that this build writes and reads.
  static constexpr int64_t kSchemaVersion = 1;
  /// The optimizer the state belongs to, written as `algorithm` in the JSON form.
  static constexpr const char* kAlgorithm = "adam";
  /// The name of this struct in error messages.
  static constexpr const char* kWhere = "AttentionOptimizerState";

  /// The family the state belongs to: variational_embedding_attention or variational_multihop_attention (the kFamily of
  /// its model).
  std::string family;  // "variational_embedding_attention" or "variational_multihop_attention"
  /// The posterior means m [S, D].
  Matrix mean;         // [S, D]
  /// The posterior log variances log v [S, D].
  Matrix log_var;      // [S, D]
  /// The Adam first moment μ1 of the mean [S, D] (zero in a fresh state).
  Matrix mean_first_moment, mean_second_moment;        // Adam moments of the mean
  /// The Adam first moment μ1 of the log variance [S, D] (zero in a fresh state).
  Matrix log_var_first_moment, log_var_second_moment;  // Adam moments of the log variance
  /// The number of Adam steps already applied (≥ 0). The E-step's noise tables come from derive_seed(seed, kMcNoise,
  /// iteration), and the next M-step is Adam step τ = iteration + 1.
  int64_t iteration = 0;                               // Adam steps already applied
  /// The seed of the Monte-Carlo noise; the estimator that drew the initial embeddings used the same seed.
  uint64_t seed = 0;                                   // the Monte-Carlo noise seed

  /// Zero moments, iteration 0.
  [[nodiscard]] static AttentionOptimizerState fresh(std::string family, Matrix mean, Matrix log_var,
                                                     uint64_t seed);
  /// Known family, six finite non-empty arrays of one shape, second moments ≥ 0, iteration ≥ 0. @throws ValueError
  /// naming the field.
  void validate(std::string_view where) const;
  /// Bitwise equality of every array and field.
  [[nodiscard]] bool operator==(const AttentionOptimizerState& other) const;
  /// @var AttentionOptimizerState::mean_second_moment
  /// The Adam second moment μ2 of the mean [S, D] (≥ 0; zero in a fresh state).
  /// @var AttentionOptimizerState::log_var_second_moment
  /// The Adam second moment μ2 of the log variance [S, D] (≥ 0; zero in a fresh state).
};

/// The state a variational model keeps: checks mean and log_var (non-empty, finite, one shape,
/// exp(log_var) finite and > 0), then returns the supplied state after checking that it belongs to `family` and holds
/// bit-identical mean and log_var, or AttentionOptimizerState::fresh(family, mean, log_var, 0) when none is supplied.
/// @throws ValueError naming `where` and the field.
[[nodiscard]] AttentionOptimizerState resolve_optimizer_state(std::string_view where, std::string_view family,
                                                              const Matrix& mean, const Matrix& log_var,
                                                              std::optional<AttentionOptimizerState> supplied);

/// {"schema_version": 1, "algorithm": "adam", "family", "mean", "log_var", the four moments, "iteration", "seed"}
/// with arrays as nested lists (doubles in shortest round-trip form).
[[nodiscard]] nlohmann::json optimizer_state_to_json(const AttentionOptimizerState& state);
/// Inverse of optimizer_state_to_json, through validate(). @throws ValueError naming `where` and the field, including
/// for an unknown schema_version or algorithm.
[[nodiscard]] AttentionOptimizerState optimizer_state_from_json(const nlohmann::json& doc, std::string_view where);
/// The same for a field of a model file (errors name the file and the field path).
[[nodiscard]] AttentionOptimizerState optimizer_state_from_json(const ModelJsonField& field);

/// ½ Σ (exp(log v) + m² − 1 − log v).
[[nodiscard]] double kl_to_standard_normal(const Matrix& mean, const Matrix& log_var);

/// The M-step's embedding update: one Adam ascent step from `state` on the data gradients minus prior_weight × the
/// KL gradient, then the log-variance clip. Returns the state with the new arrays and iteration + 1.
[[nodiscard]] AttentionOptimizerState adam_ascent(const AttentionOptimizerState& state, const ConstMatrixMap& grad_mean,
                                                  const ConstMatrixMap& grad_log_var, double lr, double prior_weight);

/// The Monte-Carlo tables of one iteration (see the file comment).
struct MonteCarloTables {
  /// The noise tables ε_k [S, D] for k = 0..mc−1: standard normal draws, row-major, in order of k.
  std::vector<Matrix> noise;       // ε_k [S, D]
  /// The perturbed tables E_k = m + s ⊙ ε_k [S, D], with s = exp(½ log v).
  std::vector<Matrix> embeddings;  // E_k = m + s ⊙ ε_k
  /// The factors ½ s ⊙ ε_k [S, D], which are ∂E_k/∂log v: the E-step adds G_k ⊙ this to grad_log_var.
  std::vector<Matrix> log_var_factor;  // ½ s ⊙ ε_k: ∂E_k/∂log v, so grad_log_var += G_k ⊙ this
};

/// Builds the tables of `state` for mc samples.
[[nodiscard]] MonteCarloTables monte_carlo_tables(const AttentionOptimizerState& state, int64_t mc);

/// Tables of one model, computed once per sample count and shared by every chunk and thread (thread-safe).
class MonteCarloCache {
 public:
  /// The tables of state for mc samples: built by monte_carlo_tables() on the first request for this mc, then shared by
  /// every later request. The cache keys on mc alone, so it must only ever be given one state (its model's).
  /// Thread-safe.
  [[nodiscard]] std::shared_ptr<const MonteCarloTables> get(const AttentionOptimizerState& state, int64_t mc) const;

 private:
  mutable std::mutex mutex_;
  mutable std::map<int64_t, std::shared_ptr<const MonteCarloTables>> by_mc_;
};

/// The optimizer state a statistics value was computed under: absent after initialize(), the model's
/// after an E-step. Statistics of different states never combine.
class AttachedOptimizerState {
 public:
  /// The attached state, or null when none is attached.
  [[nodiscard]] const std::shared_ptr<const AttentionOptimizerState>& get() const noexcept { return state_; }
  /// Attaches state (null detaches it).
  void set(std::shared_ptr<const AttentionOptimizerState> state) { state_ = std::move(state); }
  /// Detaches the state.
  void reset() noexcept { state_.reset(); }
  /// The FlatAccumulator attachment rule. @throws ValueError ("cannot combine attention statistics from different
  /// optimizer states") before any change.
  void merge(const AttachedOptimizerState& other, AttachmentMerge how, std::string_view where);

 private:
  std::shared_ptr<const AttentionOptimizerState> state_;
};

}  // namespace attnmix
