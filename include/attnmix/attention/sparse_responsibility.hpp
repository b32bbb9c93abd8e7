// SPDX-License-Identifier: Apache-2.0
/// @file sparse_responsibility.hpp
/// Responsibility attention over symbol queries with sparse tables
/// (`docs/mechanisms.md#sparse-tables-real-vocabularies`): the model of responsibility.hpp for rows whose query is a
/// symbol q ∈ [0, D) (the one-hot e_q), storing only the cells of K and B that a data set can reach. It gives the
/// model the dense family gives on the same rows (to rounding), in memory that grows with the number of distinct pairs
/// instead of with S·D + S·T.
///
/// Notation as in responsibility.hpp: S context symbols, N positions, D query symbols, T targets.
///   key pattern    P_K ⊂ [S] × [D]  the (context symbol, query symbol) pairs K may hold; K[s, q] = 0 elsewhere
///   emission pattern P_B ⊂ [S] × [T]  the (context symbol, target) cells B lists; every other cell of row s is β_s
///   key_values      [|P_K|]   K at the pattern's pairs, in the pattern's order
///   emission_values [|P_B|]   B at the listed cells;  emission_default β [S];  row s: Σ listed + (T − k_s)·β_s = 1
/// The dense family's M-step keeps these shapes: a key entry that gets no mass is exactly 0, and a smoothed emission
/// row gives every unobserved target the same value ε / (row total + T·ε). So the patterns of a data set — the pairs
/// (c_i, q) and (c_i, t) of its rows (data_patterns) — hold every cell EM can change, and a fit on that data set with
/// these tables is the dense fit.
///   ℓ_i = log π_i − (1 − 2·K[c_i, q] + ‖K[c_i]‖²) / (2σ²) + gate_const + log B[c_i, t],  gate_const = −(D/2)·log(2πσ²)
/// Statistics (flat, in value() order): key_sum [|P_K|], key_mass [S], emission_count [|P_B|], position_count [N],
/// query_sq; they merge across threads and processes like every family's, as long as both sides hold the same
/// patterns (combine checks it).
/// Cost: O(N·log k) per row for log_density and the E-step (k: the largest number of pairs of a context symbol, found
/// by binary search), O(N·T) per row for predict_proba, O(|P_K| + |P_B| + S + N) for the M-step and for the memory
/// of a model or of its statistics.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

/// The cells of a rows × cols table that a sparse table lists: for each row, its columns in increasing order.
/// Immutable; tables share one pattern through std::shared_ptr.
class SparsePattern {
 public:
  /// The pattern of the given cells (cell k is (cell_rows[k], cell_cols[k]); any order, repeats allowed) of a
  /// rows × cols table. O(k log k). @throws ValueError for a non-positive size or a cell outside the table.
  [[nodiscard]] static SparsePattern of_cells(Index rows, Index cols, std::span<const int64_t> cell_rows,
                                              std::span<const int64_t> cell_cols);
  /// A pattern from its compressed rows: row r lists columns[row_begin[r] .. row_begin[r + 1]).
  /// @throws ValueError unless row_begin starts at 0, never decreases and ends at columns.size(), and every row's
  /// columns increase strictly within [0, cols).
  SparsePattern(Index rows, Index cols, std::vector<int64_t> row_begin, std::vector<int64_t> columns);

  [[nodiscard]] Index rows() const noexcept { return rows_; }  ///< the table's rows
  [[nodiscard]] Index cols() const noexcept { return cols_; }  ///< the table's columns
  /// The number of listed cells.
  [[nodiscard]] Index size() const noexcept { return static_cast<Index>(columns_.size()); }
  /// The first of row r's cells in the pattern's order (its cells are begin(r) ≤ k < end(r)).
  [[nodiscard]] Index begin(Index r) const noexcept { return row_begin_[static_cast<size_t>(r)]; }
  /// One past the last of row r's cells in the pattern's order.
  [[nodiscard]] Index end(Index r) const noexcept { return row_begin_[static_cast<size_t>(r) + 1]; }
  /// The column of cell k.
  [[nodiscard]] int64_t column(Index k) const noexcept { return columns_[static_cast<size_t>(k)]; }
  /// The index of cell (r, c), or −1 when the pattern does not list it. O(log k_r). No bounds check on r.
  [[nodiscard]] Index find(Index r, int64_t c) const noexcept;
  /// The compressed rows' offsets, [rows + 1]: row r's cells are begin(r) ≤ k < end(r).
  [[nodiscard]] const std::vector<int64_t>& row_begin() const noexcept { return row_begin_; }
  /// The cells' columns, [size()], row by row, increasing within a row.
  [[nodiscard]] const std::vector<int64_t>& columns() const noexcept { return columns_; }
  /// Whether both list the same cells of tables of the same shape.
  [[nodiscard]] bool operator==(const SparsePattern& other) const = default;

 private:
  Index rows_ = 0;
  Index cols_ = 0;
  std::vector<int64_t> row_begin_;
  std::vector<int64_t> columns_;
};

/// The key pattern [S, D] and the emission pattern [S, T] of a sparse model and of its statistics.
struct SparsePatterns {
  /// The (context symbol, query symbol) pairs: cells of the S × D key table.
  std::shared_ptr<const SparsePattern> keys;
  /// The (context symbol, target) pairs: cells of the S × T emission table.
  std::shared_ptr<const SparsePattern> emission;
  /// Whether both hold the same patterns (the same objects, or equal ones).
  [[nodiscard]] bool operator==(const SparsePatterns& other) const;
  /// @throws ValueError naming `where` unless both patterns are present with the same rows (one per context symbol).
  void check(const char* where) const;
};

/// The patterns of a data set: every (c_i, q) and (c_i, t) of the rows of batch (symbol queries), for tables of S
/// context symbols, D query symbols and T targets. O(n·N·log(n·N)).
/// @throws ValueError for real-valued queries or ids outside those sizes.
[[nodiscard]] SparsePatterns data_patterns(const ResponsibilityAttentionBatch& batch, Index S, Index D, Index T);

/// Constructor arguments under their Python names (what model files store).
struct SparseResponsibilityAttentionParams {
  /// The patterns of K [S, D] and B [S, T] (both with S rows; neither null).
  SparsePatterns patterns;
  /// K at the key pattern's pairs, in its order; K is 0 at every other cell. Finite, magnitude at most 1e50.
  Vector key_values;
  /// B at the emission pattern's cells, in its order: each in [0, 1].
  Vector emission_values;
  /// β [S]: B at every cell of row s that the pattern does not list, in [0, 1]; each row sums to 1 within 1e-12.
  Vector emission_default;
  /// Position prior π [N], a distribution.
  Vector position_prior;
  /// Isotropic gate variance σ², finite and at least 1e-100 (default 1).
  double sigma2 = 1.0;
  /// The model's name, stored in model files (may be empty).
  std::string name;
};

/// Statistics, in value() order: key_sum [|P_K|], key_mass [S], emission_count [|P_B|], position_count [N],
/// query_sq — those of ResponsibilityAttentionAccumulator at the patterns' cells (zero everywhere else).
class SparseResponsibilityAttentionAccumulator : public FlatAccumulator<SparseResponsibilityAttentionAccumulator> {
 public:
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "SparseResponsibilityAttentionAccumulator";
  /// The batch type that the E-step and initialize() read (rows with symbol queries).
  using batch_type = ResponsibilityAttentionBatch;
  /// Zeroed statistics over the patterns, for N context positions, carrying an optional tying key.
  /// @throws ValueError for null patterns, patterns of different row counts, or N < 1.
  SparseResponsibilityAttentionAccumulator(SparsePatterns patterns, int64_t context_length,
                                           std::optional<std::string> keys = std::nullopt);

  /// The cells these statistics count.
  [[nodiscard]] const SparsePatterns& patterns() const noexcept { return patterns_; }
  [[nodiscard]] int64_t n_symbols() const noexcept { return patterns_.keys->rows(); }  ///< S
  [[nodiscard]] int64_t context_length() const noexcept { return N_; }                ///< N
  [[nodiscard]] int64_t query_dim() const noexcept { return patterns_.keys->cols(); }  ///< D
  [[nodiscard]] int64_t n_targets() const noexcept { return patterns_.emission->cols(); }  ///< T
  /// key_sum [|P_K|]: entry k holds Σ w_n r_ni over the positions with (c_i, q_n) the k-th key pair.
  [[nodiscard]] std::span<double> key_sum() { return span(0); }
  /// key_mass [S]: Σ w_n r_ni over the positions with c_i = s.
  [[nodiscard]] std::span<double> key_mass() { return span(1); }
  /// emission_count [|P_B|]: Σ w_n r_ni over the positions with (c_i, t_n) the k-th emission cell.
  [[nodiscard]] std::span<double> emission_count() { return span(2); }
  /// position_count [N]: Σ_n w_n r_ni; its total is the assigned mass M.
  [[nodiscard]] std::span<double> position_count() { return span(3); }
  /// query_sq: Σ_n w_n Σ_i r_ni (‖e_q‖² = 1).
  [[nodiscard]] double& query_sq() { return *field(4); }
  /// Read-only key_sum [|P_K|].
  [[nodiscard]] std::span<const double> key_sum() const { return span(0); }
  /// Read-only key_mass [S].
  [[nodiscard]] std::span<const double> key_mass() const { return span(1); }
  /// Read-only emission_count [|P_B|].
  [[nodiscard]] std::span<const double> emission_count() const { return span(2); }
  /// Read-only position_count [N].
  [[nodiscard]] std::span<const double> position_count() const { return span(3); }
  /// The value of query_sq.
  [[nodiscard]] double query_sq() const { return *field(4); }
  /// Σ position_count: the assigned mass M.
  [[nodiscard]] double total_mass() const;
  /// An encoder that declares S, N, D and T.
  [[nodiscard]] ResponsibilityAttentionEncoder encoder() const;
  /// Finite entries, counts ≥ 0, Σ key_mass = Σ emission_count = M. @throws ValueError when a check fails.
  void validate(std::string_view where) const;
  /// validate() on a rank of a sharded M-step (ResponsibilityAttentionAccumulator::validate_owned): split's entries
  /// of this rank checked, the mass laws with the emission total summed over ranks. Collective.
  void validate_owned(std::string_view where, const StatsSplit& split, const Communicator& comm) const;
  /// seq_initialize: the draws of ResponsibilityAttentionAccumulator::initialize (r_n ~ Dirichlet(1_N) for every
  /// row, in row order), accumulated at the patterns' cells. Atomic. @throws ValueError for real-valued queries, ids
  /// outside the sizes, or a pair outside the patterns.
  void initialize(const ResponsibilityAttentionBatch& batch, std::span<const double> w, Rng& rng);
  /// A distributed fit's initialisation (ResponsibilityAttentionAccumulator::initialize_shard).
  void initialize_shard(const ResponsibilityAttentionBatch& batch, std::span<const double> w, Rng& rng,
                        Index rows_before, Index rows_after);
  /// Statistics of other patterns are refused (FlatAccumulator's attachment hook): they index other cells.
  void merge_attachment(const SparseResponsibilityAttentionAccumulator& other, AttachmentMerge how) const;

 private:
  /// The mass laws of validate(), given Σ emission_count.
  void check_mass_laws(std::string_view where, double emitted) const;
  [[nodiscard]] std::span<double> span(int f);
  [[nodiscard]] std::span<const double> span(int f) const;
  SparsePatterns patterns_;
  int64_t N_;
};

/// Options of the M-step; the defaults are ResponsibilityAttentionEstimatorOptions's.
struct SparseResponsibilityAttentionEstimatorOptions {
  double sigma2 = 1.0;               ///< σ² of the returned models (used with estimate_sigma2 only without key mass)
  bool estimate_sigma2 = false;      ///< learn σ² as the pooled within-symbol scatter, floored at min_sigma2
  double min_sigma2 = 1e-6;          ///< the floor of a learned σ²
  double emission_smoothing = 1e-6;  ///< the pseudo-count ε added to every emission count, listed or not
  std::string name;                  ///< the name of the models estimate() returns
  std::optional<std::string> keys;   ///< the tying key of the accumulators make_accumulator() returns
};

class SparseResponsibilityAttentionEstimator;

/// The immutable model. The constructor validates and precomputes log tables and the rows' ‖K[s]‖².
class SparseResponsibilityAttention {
 public:
  /// The parameter struct that the constructor takes.
  using params_type = SparseResponsibilityAttentionParams;
  /// The batch that log_density() and the E-step read: rows with symbol queries.
  using batch_type = ResponsibilityAttentionBatch;
  /// The statistics that the E-step fills.
  using accumulator_type = SparseResponsibilityAttentionAccumulator;
  /// The M-step that turns those statistics into the next model.
  using estimator_type = SparseResponsibilityAttentionEstimator;
  /// The encoder that validates raw arrays into a batch_type (encode_symbols).
  using encoder_type = ResponsibilityAttentionEncoder;
  /// The `family` name of this family's model files.
  static constexpr const char* kFamily = "sparse_responsibility_attention";
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "SparseResponsibilityAttentionDistribution";

  /// @throws ValueError on invalid parameters.
  explicit SparseResponsibilityAttention(SparseResponsibilityAttentionParams params);

  /// The parameters, as validated by the constructor.
  [[nodiscard]] const SparseResponsibilityAttentionParams& params() const noexcept { return params_; }
  [[nodiscard]] int64_t n_symbols() const noexcept { return params_.patterns.keys->rows(); }       ///< S
  [[nodiscard]] int64_t query_dim() const noexcept { return params_.patterns.keys->cols(); }       ///< D
  [[nodiscard]] int64_t n_targets() const noexcept { return params_.patterns.emission->cols(); }  ///< T
  [[nodiscard]] int64_t context_length() const noexcept { return params_.position_prior.size(); } ///< N
  /// The gate variance σ².
  [[nodiscard]] double sigma2() const noexcept { return params_.sigma2; }
  [[nodiscard]] double gate_const() const noexcept { return gate_const_; }  ///< −(D/2)·log(2πσ²)
  /// K[s, q] (0 at a pair the key pattern does not list).
  [[nodiscard]] double key_mean(int64_t s, int64_t q) const noexcept;
  /// B[s, t] (β_s at a cell the emission pattern does not list).
  [[nodiscard]] double emission(int64_t s, int64_t t) const noexcept;

  /// out[n] = log p(e_q, t | c) (exact; −∞ for impossible rows). @throws ValueError for real-valued queries or ids
  /// outside the model's sizes.
  void log_density(const ResponsibilityAttentionBatch& batch, std::span<double> out) const;
  /// The E-step: adds the statistics of every row to acc, atomically; log_p_out (if non-empty) receives log_density.
  /// @throws ImpossibleEvidenceError (nothing changed) for rows with w_n > 0 and log p = −∞; ValueError for a pair of
  /// the batch outside acc's patterns (nothing changed).
  void accumulate(const ResponsibilityAttentionBatch& batch, std::span<const double> w,
                  SparseResponsibilityAttentionAccumulator& acc, std::span<double> log_p_out = {}) const;
  /// The E-step responsibilities r [n, N] (each row sums to 1; an impossible row is all zeros).
  [[nodiscard]] Matrix responsibilities(const ResponsibilityAttentionBatch& batch) const;
  /// p(t | c, q) [n, T]; the batch's targets are not used. O(N·T) per row.
  [[nodiscard]] Matrix predict_proba(const ResponsibilityAttentionBatch& batch) const;
  /// log p(t_n | c_n, q_n) of every row, for the batch's targets (−∞ where the target has probability 0): a column of
  /// predict_proba at O(N·(log |P_K| + log |P_B|)) per row.
  [[nodiscard]] Vector target_log_proba(const ResponsibilityAttentionBatch& batch) const;

  /// Zeroed statistics over this model's patterns, without a tying key.
  [[nodiscard]] SparseResponsibilityAttentionAccumulator make_accumulator() const;
  /// The estimator over this model's patterns, σ² fixed at this model's σ², and its name.
  [[nodiscard]] SparseResponsibilityAttentionEstimator estimator() const;
  /// An encoder that declares this model's S, N, D and T.
  [[nodiscard]] ResponsibilityAttentionEncoder encoder() const;
  /// The dense model with the same tables (K is 0 and row s of B is β_s off the patterns), σ², π and name: the same
  /// log p, responsibilities and predictions on one-hot queries. O(S·(D + T)) memory, for small vocabularies.
  [[nodiscard]] ResponsibilityAttention dense() const;

 private:
  void check_batch(const ResponsibilityAttentionBatch& batch) const;
  /// Row n's responsibilities into r [N] (zeros for an impossible row); returns its log p. When key_cell and
  /// emission_cell are given ([N] each), they receive each position's cell in this model's patterns (−1: unlisted).
  /// @throws ValueError when some ℓ_i is NaN or +∞.
  double posterior(const ResponsibilityAttentionBatch& batch, Index n, double* r, Index* key_cell = nullptr,
                   Index* emission_cell = nullptr) const;
  /// Row n's target-blind gate a_i = softmax_i(log π_i − ‖e_q − K[c_i]‖²/(2σ²)) into a [N].
  void gate(const ResponsibilityAttentionBatch& batch, Index n, double* a) const;
  SparseResponsibilityAttentionParams params_;
  Vector key_sq_norm_;        // [S]: ‖K[s]‖²
  Vector log_prior_;          // [N]
  Vector log_emission_;       // [|P_B|]
  Vector log_default_;        // [S]
  double inv_two_sigma2_ = 0.0;
  double gate_const_ = 0.0;
};

/// The M-step: const and stateless.
class SparseResponsibilityAttentionEstimator {
 public:
  /// The model that estimate() returns.
  using distribution_type = SparseResponsibilityAttention;
  /// The statistics that estimate() reads.
  using accumulator_type = SparseResponsibilityAttentionAccumulator;
  /// The name of this class in error messages.
  static constexpr const char* kWhere = "SparseResponsibilityAttentionEstimator";

  /// @throws ValueError for null patterns, patterns of different row counts, N < 1 or invalid options.
  SparseResponsibilityAttentionEstimator(SparsePatterns patterns, int64_t context_length,
                                         SparseResponsibilityAttentionEstimatorOptions options = {});

  /// The options of the M-step.
  [[nodiscard]] const SparseResponsibilityAttentionEstimatorOptions& options() const noexcept { return options_; }
  /// The cells of the statistics and of the models it makes.
  [[nodiscard]] const SparsePatterns& patterns() const noexcept { return patterns_; }
  [[nodiscard]] int64_t n_symbols() const noexcept { return patterns_.keys->rows(); }       ///< S
  [[nodiscard]] int64_t context_length() const noexcept { return N_; }                    ///< N
  [[nodiscard]] int64_t query_dim() const noexcept { return patterns_.keys->cols(); }       ///< D
  [[nodiscard]] int64_t n_targets() const noexcept { return patterns_.emission->cols(); }  ///< T

  /// Zeroed statistics over the patterns, carrying options().keys.
  [[nodiscard]] SparseResponsibilityAttentionAccumulator make_accumulator() const;
  /// An encoder that declares S, N, D and T.
  [[nodiscard]] ResponsibilityAttentionEncoder encoder() const;
  /// The dense M-step at the patterns' cells: K = key_sum / max(key_mass, 1e-12) (0 off the pattern); row s of B is
  /// (count + ε) / (row total + T·ε) at its listed cells and β_s = ε / (row total + T·ε) elsewhere (uniform 1/T for
  /// a row without counts or ε); π = normalised position counts; σ² fixed or the pooled scatter.
  /// @throws ValueError on invalid statistics or statistics of other patterns.
  [[nodiscard]] SparseResponsibilityAttention estimate(std::optional<double> nobs,
                                                       const SparseResponsibilityAttentionAccumulator& acc) const;
  /// The sharded M-step of a distributed fit (inference/sharded_mstep.hpp; as the dense family's estimate_sharded):
  /// each rank sums and estimates the key pairs and emission cells of its symbols, which are then gathered. Returns,
  /// bit for bit, what estimate(nullopt, Σ acc) returns; acc is left partly summed. Collective.
  [[nodiscard]] SparseResponsibilityAttention estimate_sharded(SparseResponsibilityAttentionAccumulator& acc,
                                                               const Communicator& comm) const;

 private:
  void check_patterns(const SparseResponsibilityAttentionAccumulator& acc) const;
  /// The M-step from summed statistics: symbols [shard.begin, shard.end) estimated here, the rest gathered from the
  /// other ranks of comm; without comm, shard covers every symbol.
  [[nodiscard]] SparseResponsibilityAttention estimate_symbols(const SparseResponsibilityAttentionAccumulator& acc,
                                                               const SymbolShard& shard,
                                                               const Communicator* comm) const;
  SparsePatterns patterns_;
  int64_t N_;
  SparseResponsibilityAttentionEstimatorOptions options_;
};

/// This family's descriptor (family/spec.hpp).
[[nodiscard]] const FamilySpec& sparse_responsibility_attention_family();

static_assert(Batch<ResponsibilityAttentionBatch>);
static_assert(Accumulator<SparseResponsibilityAttentionAccumulator>);
static_assert(Distribution<SparseResponsibilityAttention>);
static_assert(Estimator<SparseResponsibilityAttentionEstimator>);

}  // namespace attnmix
