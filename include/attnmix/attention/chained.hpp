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
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/shared_rows.hpp"
#include "attnmix/core/types.hpp"
#include "attnmix/inference/sharded_mstep.hpp"

namespace attnmix {

struct FamilySpec;

class ChainedAttentionEncoder;
class ChainedAttentionEstimator;
class ChainedAttentionSampler;

/// The arrays of a chained-attention batch, one row per observation.
struct ChainedAttentionArrays {
  IdMatrix keys;            ///< [n, N] key ids
  IdMatrix values;          ///< [n, N] value ids
  IdVector queries;         ///< [n] query ids
  IdVector targets;         ///< [n] target ids
  int64_t max_symbol = -1;  ///< the largest key, value or query id (−1 without rows)
  int64_t max_target = -1;  ///< the largest target (−1 without rows)
};

/// An immutable, validated batch: keys [n, N], values [n, N], queries [n], targets [n] (ids).
/// Slices share storage (O(1)); only the encoder creates batches.
class ChainedAttentionBatch : public SharedRows<ChainedAttentionBatch, ChainedAttentionArrays> {
 public:
  /// An empty batch: no rows and context width 0. Batches with rows come from ChainedAttentionEncoder::encode() or from
  /// a sampler.
  ChainedAttentionBatch() = default;
  /// The context width N shared by every row of this batch (0 for an empty default batch). N is free: one model scores
  /// batches of any width.
  [[nodiscard]] Index context_length() const noexcept { return arrays().keys.cols(); }
  /// Largest key, value or query id and largest target in the underlying storage (−1 when empty).
  [[nodiscard]] int64_t max_symbol() const noexcept { return arrays().max_symbol; }
  /// The largest target id in the underlying storage, −1 when it is empty. Like max_symbol(), it covers the whole
  /// shared storage, not only this slice.
  [[nodiscard]] int64_t max_target() const noexcept { return arrays().max_target; }
  /// The N key ids of row `row` (0-based within this slice), contiguous. No bounds check: row must lie in
  /// [0, n_rows()).
  [[nodiscard]] const int64_t* keys(Index row) const noexcept { return row_of(arrays().keys, row); }
  /// The N value ids of row `row`, contiguous and paired position by position with keys(row). No bounds check: row must
  /// lie in [0, n_rows()).
  [[nodiscard]] const int64_t* values(Index row) const noexcept { return row_of(arrays().values, row); }
  /// The query symbol of row `row`. No bounds check: row must lie in [0, n_rows()).
  [[nodiscard]] int64_t query(Index row) const noexcept { return entry_of(arrays().queries, row); }
  /// The target id of row `row`. No bounds check: row must lie in [0, n_rows()).
  [[nodiscard]] int64_t target(Index row) const noexcept { return entry_of(arrays().targets, row); }
  /// Copies of the rows (for writers and bindings).
  [[nodiscard]] IdMatrix keys() const { return copy_of(arrays().keys); }
  /// A copy of this slice's values, [n, N].
  [[nodiscard]] IdMatrix values() const { return copy_of(arrays().values); }
  /// A copy of this slice's queries, [n].
  [[nodiscard]] IdVector queries() const { return copy_of(arrays().queries); }
  /// A copy of this slice's targets, [n].
  [[nodiscard]] IdVector targets() const { return copy_of(arrays().targets); }

 private:
  friend class ChainedAttentionEncoder;
  ChainedAttentionBatch(ChainedAttentionArrays arrays, Index rows) : SharedRows(std::move(arrays), rows) {}
};

/// Validates raw arrays into a batch. Undeclared bounds are checked against the model later.
class ChainedAttentionEncoder {
 public:
  /// The declared number of symbols S: keys, values and queries must lie in [0, S). When unset, they are only checked
  /// to be ≥ 0, and the model checks the upper bound when it reads the batch.
  std::optional<int64_t> n_symbols;
  /// The declared number of targets T: targets must lie in [0, T). When unset, targets are only checked to be ≥ 0.
  std::optional<int64_t> n_targets;

  /// @throws ValueError on shape mismatch or invalid ids; the message begins with `where`, the encoder's name as the
  /// caller knows it (variational multi-hop attention reads the same data).
  [[nodiscard]] ChainedAttentionBatch encode(IdMatrix keys, IdMatrix values, IdVector queries, IdVector targets,
                                             std::string_view where = "ChainedAttentionDataEncoder") const;
  /// Whether both encoders declare the same bounds (member-wise comparison).
  [[nodiscard]] bool operator==(const ChainedAttentionEncoder&) const = default;
};

/// Constructor arguments under their Python names (what model files store).
struct ChainedAttentionParams {
  /// The key tables K⁽ℓ⁾ [S, S] for ℓ = 0..L−1, L ≥ 1 (called `keys`, shape (L, S, S), in Python and in model files):
  /// row s of table ℓ is the key of symbol s at hop ℓ in the one-hot query space. S ≥ 1; every entry finite with
  /// magnitude at most 1e50, and the gate logits they give must be finite.
  std::vector<Matrix> key_tables;  // L tables [S, S]
  /// Emission matrix B [S, T], indexed by value symbol: row s is the distribution of t when the last hop attends a
  /// position whose value is s.
  Matrix emission;                 // [S, T] row-simplex
  /// The fixed gate variance σ², finite and at least 1e-100 (default 0.1). Smaller values make every hop sharper.
  double sigma2 = 0.1;
  /// The model's name, stored in model files (may be empty).
  std::string name;
};

/// Statistics, in value() order: key_num [L,S,S], key_mass [L,S], emission_count [S,T], ll, n.
class ChainedAttentionAccumulator : public FlatAccumulator<ChainedAttentionAccumulator> {
 public:
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "ChainedAttentionAccumulator";
  /// The batch type that the E-step and initialize() read.
  using batch_type = ChainedAttentionBatch;
  /// Zeroed statistics for L = n_hops, S = n_symbols and T = n_targets, carrying an optional tying key (keyed tying,
  /// `docs/mechanisms.md#building-blocks`). @throws ValueError when a dimension is not positive or the statistics would
  /// exceed 2^48 entries.
  ChainedAttentionAccumulator(int64_t n_hops, int64_t n_symbols, int64_t n_targets,
                              std::optional<std::string> keys = std::nullopt);

  /// The number of hops L.
  [[nodiscard]] int64_t n_hops() const noexcept { return L_; }
  /// The number of symbols S.
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  /// The number of targets T.
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }

  /// Writable view of key_num[hop] [S, S] (field 0): entry (s, u) is the expected mass of the one-hot query u arriving
  /// at a key with symbol s at that hop: Σ w γ_0(i) at (k_i, q) for hop 0, Σ w ξ_{hop−1}(i, j) at (k_j, v_i) for later
  /// hops. hop must lie in [0, L) (not checked).
  [[nodiscard]] MatrixMap key_num(Index hop) { return {field(0) + hop * S_ * S_, S_, S_}; }
  /// Writable view of key_mass [L, S] (field 1): entry (ℓ, s) holds Σ w γ_ℓ(j) over the positions j whose key is s.
  /// Every row sums to n.
  [[nodiscard]] MatrixMap key_mass() { return {field(1), L_, S_}; }
  /// Writable view of emission_count [S, T] (field 2): entry (s, t) holds Σ w γ_{L−1}(j) over the positions j whose
  /// value is s, in the rows whose target is t.
  [[nodiscard]] MatrixMap emission_count() { return {field(2), S_, T_}; }
  /// Writable reference to ll (field 3): Σ w log p over the rows of the E-step (initialize() leaves it unchanged).
  [[nodiscard]] double& ll() { return *field(3); }
  /// Writable reference to n (field 4): the total weight Σ w of the accumulated rows.
  [[nodiscard]] double& n() { return *field(4); }
  /// Read-only view of key_num[hop] [S, S] (field 0); hop must lie in [0, L) (not checked).
  [[nodiscard]] ConstMatrixMap key_num(Index hop) const { return {field(0) + hop * S_ * S_, S_, S_}; }
  /// Read-only view of key_mass [L, S] (field 1).
  [[nodiscard]] ConstMatrixMap key_mass() const { return {field(1), L_, S_}; }
  /// Read-only view of emission_count [S, T] (field 2).
  [[nodiscard]] ConstMatrixMap emission_count() const { return {field(2), S_, T_}; }
  /// The value of ll (field 3).
  [[nodiscard]] double ll() const { return *field(3); }
  /// The value of n (field 4).
  [[nodiscard]] double n() const { return *field(4); }

  /// Finite entries, counts ≥ 0, Σ key_mass[ℓ] = n for every hop, Σ emission_count = n.
  /// @throws ValueError when a check fails.
  void validate(std::string_view where) const;
  /// validate() on a rank of a sharded M-step (ResponsibilityAttentionAccumulator::validate_owned): split's entries
  /// of this rank checked, the mass laws with the emission total (split's last run) summed over ranks. Collective.
  void validate_owned(std::string_view where, const StatsSplit& split, const Communicator& comm) const;
  /// seq_initialize: γ_ℓ ~ Dirichlet(1_N) for every hop and row (hop-major), then
  /// ξ_ℓ ~ Dirichlet(1_{N²}) for ℓ = 0..L−2, accumulated with weights w; n += Σ w; ll untouched.
  void initialize(const ChainedAttentionBatch& batch, std::span<const double> w, Rng& rng);
  /// What rank r of a distributed fit runs (inference/optimize.hpp): the draws of initialize() over
  /// [rows_before other rows; batch; rows_after other rows], with only batch's rows accumulated. The other rows'
  /// draws never depend on their content, so they are made and dropped without the rows, hop by hop.
  void initialize_shard(const ChainedAttentionBatch& batch, std::span<const double> w, Rng& rng, Index rows_before,
                        Index rows_after);
  /// An encoder that declares these S and T (the context width stays free).
  [[nodiscard]] ChainedAttentionEncoder encoder() const;

 private:
  /// The mass laws of validate(), given Σ emission_count.
  void check_mass_laws(std::string_view where, double emitted) const;
  int64_t L_, S_, T_;
};

/// Posterior marginals of one row (tests and diagnostics): gamma [L, N], xi[ℓ] [N, N] for ℓ = 0..L−2.
struct ChainedAttentionPosterior {
  /// log p(t | k, v, q) of the row; −∞ for an impossible row, whose gamma and xi are then all zeros.
  double log_p = 0.0;
  /// γ [L, N]: γ_ℓ(i) is the posterior probability that hop ℓ attends position i (each row sums to 1).
  Matrix gamma;
  /// ξ_ℓ [N, N] for ℓ = 0..L−2 (empty when L = 1): ξ_ℓ(i, j) is the posterior probability that hop ℓ attends i and hop
  /// ℓ + 1 attends j.
  std::vector<Matrix> xi;
};

/// The immutable model. The constructor validates and precomputes the gate logit tables.
class ChainedAttention {
 public:
  /// The parameter struct that the constructor takes (the four roles: docs/design.md).
  using params_type = ChainedAttentionParams;
  /// The validated batch that log_density() and the E-step read.
  using batch_type = ChainedAttentionBatch;
  /// The statistics that the E-step, accumulate(), fills.
  using accumulator_type = ChainedAttentionAccumulator;
  /// The M-step that turns those statistics into the next model.
  using estimator_type = ChainedAttentionEstimator;
  /// The encoder that validates raw arrays into a batch_type.
  using encoder_type = ChainedAttentionEncoder;
  /// The `family` name of this family's model files.
  static constexpr const char* kFamily = "chained_attention";
  /// The name of this class in error messages (its Python name).
  static constexpr const char* kWhere = "ChainedAttentionDistribution";

  /// @throws ValueError on invalid parameters.
  explicit ChainedAttention(ChainedAttentionParams params);

  /// The parameters, as validated by the constructor.
  [[nodiscard]] const ChainedAttentionParams& params() const noexcept { return params_; }
  /// The number of hops L (the number of key tables).
  [[nodiscard]] int64_t n_hops() const noexcept { return static_cast<int64_t>(params_.key_tables.size()); }
  /// The number of symbols S (the rows of emission).
  [[nodiscard]] int64_t n_symbols() const noexcept { return params_.emission.rows(); }
  /// The number of targets T (the columns of emission).
  [[nodiscard]] int64_t n_targets() const noexcept { return params_.emission.cols(); }
  /// The fixed gate variance σ².
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
  /// p(t | k, v, q) [n, T] for the rows of a batch; the batch's targets are not used. O(L·N²) per row.
  /// @throws ValueError when an id is out of the model's range.
  [[nodiscard]] Matrix predict_proba(const ChainedAttentionBatch& batch) const;

  /// Zeroed statistics of this model's L, S and T, without a tying key.
  [[nodiscard]] ChainedAttentionAccumulator make_accumulator() const;
  /// Estimator with this model's dimensions, σ² and name.
  [[nodiscard]] ChainedAttentionEstimator estimator() const;
  /// An encoder that declares this model's S and T (the context width stays free).
  [[nodiscard]] ChainedAttentionEncoder encoder() const;
  /// A sampler of this model seeded with seed, drawing contexts of context_length positions (see
  /// ChainedAttentionSampler). @throws ValueError unless context_length ≥ 1.
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
  /// The emission matrix B [S, T].
  [[nodiscard]] const Matrix& emission() const noexcept { return params_.emission; }

 private:
  void check_batch(const ChainedAttentionBatch& batch) const;

  ChainedAttentionParams params_;
  Matrix gate_logits_;  // [L·S, S]: row (ℓ, u) holds the logits of query u against every key symbol
  Matrix gate_weights_;  // [L·S, S]: exp(row − row max) of gate_logits_
};

/// Options of the M-step (`docs/mechanisms.md#chained-attention`); the single source of the defaults.
struct ChainedAttentionEstimatorOptions {
  /// The fixed gate variance σ² of the returned models (finite, at least 1e-100; default 0.1).
  double sigma2 = 0.1;
  /// The pseudo-count ε added to every emission count before the rows are normalised (finite, ≥ 0; default 1e-4).
  double emission_smoothing = 1e-4;
  /// The name of the models that estimate() returns.
  std::string name;
  /// The tying key of the accumulators that make_accumulator() returns: sites with the same key pool their statistics
  /// after the E-step (`docs/mechanisms.md#building-blocks`).
  std::optional<std::string> keys;
};

/// The M-step: K⁽ℓ⁾[s] = key_num[ℓ][s] / max(key_mass[ℓ][s], 1e-9); B = (emission_count + ε) row-normalised.
class ChainedAttentionEstimator {
 public:
  /// The model that estimate() returns.
  using distribution_type = ChainedAttention;
  /// The statistics that estimate() reads.
  using accumulator_type = ChainedAttentionAccumulator;
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "ChainedAttentionEstimator";

  /// @throws ValueError on non-positive dimensions or invalid options.
  ChainedAttentionEstimator(int64_t n_hops, int64_t n_symbols, int64_t n_targets,
                            ChainedAttentionEstimatorOptions options = {});

  /// The options of the M-step.
  [[nodiscard]] const ChainedAttentionEstimatorOptions& options() const noexcept { return options_; }
  /// The number of hops L.
  [[nodiscard]] int64_t n_hops() const noexcept { return L_; }
  /// The number of symbols S.
  [[nodiscard]] int64_t n_symbols() const noexcept { return S_; }
  /// The number of targets T.
  [[nodiscard]] int64_t n_targets() const noexcept { return T_; }

  /// Zeroed statistics of these dimensions, carrying options().keys.
  [[nodiscard]] ChainedAttentionAccumulator make_accumulator() const;
  /// An encoder that declares these S and T.
  [[nodiscard]] ChainedAttentionEncoder encoder() const;
  /// The M-step of the class comment: the next model from acc, with these options' σ² and name.
  /// @throws ValueError on invalid statistics, or when nobs differs from n.
  [[nodiscard]] ChainedAttention estimate(std::optional<double> nobs, const ChainedAttentionAccumulator& acc) const;
  /// The sharded M-step of a distributed fit (inference/sharded_mstep.hpp; as responsibility attention's): each rank
  /// sums and estimates its symbols' rows of every hop's key table and of the emission, which are then gathered.
  /// Returns, bit for bit, what estimate(nullopt, Σ acc) returns; acc is left partly summed. Collective.
  [[nodiscard]] ChainedAttention estimate_sharded(ChainedAttentionAccumulator& acc, const Communicator& comm) const;

 private:
  void check_layout(const ChainedAttentionAccumulator& acc) const;
  /// The M-step from summed statistics: rows [shard.begin, shard.end) estimated here, the rest gathered from the
  /// other ranks of comm; without comm, shard covers every symbol.
  [[nodiscard]] ChainedAttention estimate_symbols(const ChainedAttentionAccumulator& acc, const SymbolShard& shard,
                                                  const Communicator* comm) const;
  int64_t L_, S_, T_;
  ChainedAttentionEstimatorOptions options_;
};

/// One observation.
struct ChainedAttentionObservation {
  /// The key ids [N], each in [0, S).
  std::vector<int64_t> keys;
  /// The value ids [N], paired with the keys, each in [0, S).
  std::vector<int64_t> values;
  /// The query symbol, in [0, S).
  int64_t query = 0;
  /// The target id, in [0, T).
  int64_t target = 0;
};

/// The batch of m observations from m successive draw() calls, each with N keys and values, encoded by `encoder`:
/// how the chained and variational multi-hop samplers batch their draws. O(m·N) beyond the draws.
[[nodiscard]] ChainedAttentionBatch encode_draws(const ChainedAttentionEncoder& encoder, Index N, Index m,
                                                 const std::function<ChainedAttentionObservation()>& draw);

/// Draws, per observation in this order: keys and values iid uniform over [S] (context_length each), q uniform,
/// the L hop positions from their gates, t ~ B[v_{z_{L−1}}].
class ChainedAttentionSampler {
 public:
  /// @throws ValueError unless context_length ≥ 1.
  ChainedAttentionSampler(ChainedAttention model, uint64_t seed, int64_t context_length = 6);
  /// Draws one observation (see the class comment).
  [[nodiscard]] ChainedAttentionObservation sample();
  /// m consecutive sample() draws as a batch.
  /// @throws ValueError when m is negative.
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
