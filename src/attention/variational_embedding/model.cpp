// SPDX-License-Identifier: Apache-2.0
// Variational embedding attention: validation, plug-in log density, the Monte-Carlo E-step and prediction
// (docs/mechanisms.md#variational-embedding-attention).
// Hot path (docs/PERFORMANCE.md): the noise tables E_k of the model's iteration are built once per model and sample
// count (MonteCarloCache) and shared by every chunk. For each k the rows of a chunk are processed in blocks of
// kRowBlock: first each row's N squared distances in 8-lane blocks, the gate by exp_shifted and the posterior in
// probability space (log space for rows with p < 1e-250), then, in row order, the gradient scattered into a
// per-thread table G that is folded into grad_mean and grad_log_var once per (chunk, k); the logs of the rows' p are
// taken after the rows, on whole packets (RowLogs). Cost per sample: n·N·D differences and as many multiply-adds,
// O(n·N) for the rest. A row's arithmetic never depends on its neighbours, its block or the thread. In mixed precision
// the gate comes from mixed.cpp (float copies of the tables); the posterior, the gradient
// scatter and the counts below are the same double code in either precision.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"
#include "../float_lanes_impl.hpp"
#include "../lanes_impl.hpp"
#include "../variational/common_impl.hpp"
#include "../variational/mixed_impl.hpp"

namespace attnmix {

namespace {

using lanes::broadcast;
using lanes::horizontal_sum;
using lanes::horizontal_sums;
using lanes::kLanes;
using lanes::Lanes;
using lanes::load;
using lanes::store;
using lanes::scratch;

/// Rows whose posteriors are computed before their statistics are scattered (the per-row buffers stay in L1).
constexpr Index kRowBlock = 16;

/// Below this p a row is recomputed in log space (its probability-space quantities may have underflowed).
constexpr double kRescueBelow = 1e-250;

/// What the row kernel reads from the model.
struct Model {
  const double* emission;   // [S, T]
  const double* log_prior;  // [N]
  Index N, D, T;
  double inv_two_sigma2;
  const VariationalFloatTables* mixed;  // the float gate's tables in mixed precision, else null
};

/// One embedding table as the row kernel reads it: doubles, and in mixed precision their float copy for the gate.
struct GateTable {
  const double* E;                  // [S, D]
  const FloatEmbeddingTable* Ef;    // null in float64
};

/// The query's embedding row as 8-lane blocks: kBlocks = D / 8 known at compile time (the blocks stay in registers),
/// or kBlocks = 0 for a run-time D (D / 8 blocks loaded on use, then the D mod 8 tail entry by entry).
template <Index kBlocks>
struct QueryRow {
  const double* y;
  Index D;
  Lanes blocks[kBlocks > 0 ? kBlocks : 1];
  QueryRow(const double* row, Index dim) : y(row), D(dim) {
    if constexpr (kBlocks > 0)
      for (Index b = 0; b < kBlocks; ++b) blocks[b] = load(row + b * kLanes);
  }
  [[nodiscard]] Index n_blocks() const {
    if constexpr (kBlocks > 0) return kBlocks;
    else return D / kLanes;
  }
  [[nodiscard]] Lanes block(Index b) const {
    if constexpr (kBlocks > 0) return blocks[b];
    else return load(y + b * kLanes);
  }
  /// Lane partial sums of (y − x)² over the full blocks.
  [[nodiscard]] Lanes partial_squares(const double* __restrict x) const {
    Lanes acc{};
    for (Index b = 0; b < n_blocks(); ++b) {
      const Lanes d = block(b) - load(x + b * kLanes);
      acc += d * d;
    }
    return acc;
  }
  /// sum + Σ over the D mod 8 tail of (y − x)², in order.
  [[nodiscard]] double add_tail(double sum, const double* x) const {
    for (Index d = n_blocks() * kLanes; d < D; ++d) {
      const double v = y[d] - x[d];
      sum += v * v;
    }
    return sum;
  }
};

/// s_i = log π_i − ‖E[q] − E[c_i]‖²/(2σ²) for every position, eight positions at a time (one fixed summation tree
/// per distance: the lane partial sums, horizontal_sums, then the tail). Without a tail (D a multiple of 8) the
/// logits of a block are formed in one vector; the same operations per lane as the scalar form.
template <Index kBlocks>
void gate_logits(const Model& m, const double* E, const int64_t* c, const QueryRow<kBlocks>& y, double* s) {
  const Index N = m.N;
  const Index D = m.D;
  const auto logit = [&](Index i, double distance) {
    const double lp = m.log_prior[i];
    return lp == kNegInf ? kNegInf : lp - distance * m.inv_two_sigma2;
  };
  Index i = 0;
  for (; i + kLanes <= N; i += kLanes) {
    Lanes partial[kLanes];
    for (Index j = 0; j < kLanes; ++j) partial[j] = y.partial_squares(E + c[i + j] * D);
    if (D % kLanes == 0) {
      const Lanes lp = load(m.log_prior + i);
      const Lanes v = lp - horizontal_sums(partial) * m.inv_two_sigma2;
      store(s + i, lp == kNegInf ? broadcast(kNegInf) : v);
      continue;
    }
    alignas(64) double sums[kLanes];
    store(sums, horizontal_sums(partial));
    for (Index j = 0; j < kLanes; ++j) s[i + j] = logit(i + j, y.add_tail(sums[j], E + c[i + j] * D));
  }
  for (; i < N; ++i) s[i] = logit(i, y.add_tail(horizontal_sum(y.partial_squares(E + c[i] * D)), E + c[i] * D));
}

/// Positions rounded up to whole 16-lane blocks (two 8-lane double blocks, one float block of the mixed gate): the
/// per-row buffers s, a, r, b have this length, and their padding lanes hold s = −∞ and b = 0, so every padded lane
/// ends with r = 0 and contributes nothing.
inline Index padded(Index N) { return float_lanes::padded(N); }

/// What row_posterior returns: p, or log p when the row took the log-space path (p < kRescueBelow). The callers
/// take the logs of a run of rows at once (RowLogs).
struct RowProbability {
  double value;
  bool is_log;
};

/// The float64 gate of one row at table E: s ← the logits (padding −∞), a ← exp(s − max s) (padding 0); padded(N)
/// entries each.
template <Index kBlocks>
void exact_gate(const Model& m, const double* E, const int64_t* c, const QueryRow<kBlocks>& y, double* s, double* a) {
  const Index N = m.N;
  const Index NP = padded(N);
  gate_logits(m, E, c, y, s);
  // The largest logit (the exp shift) and the smallest of the N real ones (whether any exp needs std::exp).
  Lanes top_lanes = broadcast(kNegInf);
  Lanes low_lanes = broadcast(kInf);
  Index i = 0;
  for (; i + kLanes <= N; i += kLanes) {
    const Lanes v = load(s + i);
    top_lanes = v > top_lanes ? v : top_lanes;
    low_lanes = v < low_lanes ? v : low_lanes;
  }
  double top = kNegInf;
  double lowest = kInf;
  for (; i < N; ++i) {
    top = s[i] > top ? s[i] : top;
    lowest = s[i] < lowest ? s[i] : lowest;
  }
  for (Index j = N; j < NP; ++j) s[j] = kNegInf;
  for (Index j = 0; j < kLanes; ++j) {
    top = top_lanes[j] > top ? top_lanes[j] : top;
    lowest = low_lanes[j] < lowest ? low_lanes[j] : lowest;
  }
  lanes::exp_shifted(s, top, lowest, a, NP);
}

/// The gate a (target-blind) and posterior r of one row, from its unnormalised gate (s, a as exact_gate and
/// mixed_gate leave them) and its emission probabilities b_i = B[c_i, t] (zero padded); padded(N) entries each (s is
/// left holding the logits, or log a on the log-space path). Sums over positions are lane sums followed by the fixed
/// horizontal tree, so a row's result never depends on its neighbours.
RowProbability posterior(Index N, const double* b, double* s, double* a, double* r) {
  const Index NP = padded(N);
  Lanes z_lanes{};
  Lanes num_lanes{};
  for (Index k = 0; k < NP; k += kLanes) {
    const Lanes av = load(a + k);
    const Lanes rv = av * load(b + k);
    store(r + k, rv);
    z_lanes += av;
    num_lanes += rv;
  }
  const double z = horizontal_sum(z_lanes);
  const double num = horizontal_sum(num_lanes);
  const double inv_z = 1.0 / z;
  const double p = num * inv_z;
  if (p >= kRescueBelow) {
    const double inv_num = 1.0 / num;
    for (Index k = 0; k < NP; k += kLanes) {
      store(a + k, load(a + k) * inv_z);
      store(r + k, load(r + k) * inv_num);
    }
    return {p, false};
  }
  // Log space (rare): log a_i = s_i − LSE s, log p = LSE_i(log a_i + log b_i); r holds log a_i + log b_i first.
  const double lse = log_sum_exp({s, static_cast<size_t>(N)});
  double lp_top = kNegInf;
  for (Index k = 0; k < N; ++k) {
    s[k] -= lse;
    r[k] = s[k] + std::log(b[k]);
    lp_top = std::max(lp_top, r[k]);
  }
  for (Index k = 0; k < N; ++k) a[k] = s[k] == kNegInf ? 0.0 : std::exp(s[k]);
  std::fill(a + N, a + NP, 0.0);
  std::fill(r + N, r + NP, 0.0);
  if (lp_top == kNegInf) {
    std::fill(r, r + N, 0.0);
    return {kNegInf, true};
  }
  double acc = 0.0;
  for (Index k = 0; k < N; ++k) {
    r[k] = r[k] == kNegInf ? 0.0 : std::exp(r[k] - lp_top);
    acc += r[k];
  }
  for (Index k = 0; k < N; ++k) r[k] /= acc;
  return {lp_top + std::log(acc), true};
}

/// The gate and posterior of one row at `table` (see posterior): the float gate in mixed precision, falling back to
/// float64 for a row it cannot represent.
template <Index kBlocks>
RowProbability row_posterior(const Model& m, const GateTable& table, const int64_t* c, int64_t q, const double* b,
                             double* s, double* a, double* r) {
  if (table.Ef == nullptr || !mixed_gate(*m.mixed, *table.Ef, c, q, s, a))
    exact_gate(m, table.E, c, QueryRow<kBlocks>(table.E + q * m.D, m.D), s, a);
  return posterior(m.N, b, s, a, r);
}

/// log p of a run of rows: set() keeps p (or a log-space row's log p), finish() takes the logs of the whole run on
/// packets (lanes::log_in_place), which is cheaper than one std::log per row. Rows never set read log 1 = 0.
class RowLogs {
 public:
  RowLogs(double* out, Index n) : out_(out), n_(n) { std::fill(out, out + n, 1.0); }
  void set(Index row, RowProbability p) {
    if (p.is_log) rescued_.emplace_back(row, p.value);
    else out_[row] = p.value;
  }
  void finish() {
    lanes::log_in_place(out_, n_);
    for (const auto& [row, log_p] : rescued_) out_[row] = log_p;
    rescued_.clear();
  }

 private:
  double* out_;
  Index n_;
  std::vector<std::pair<Index, double>> rescued_;
};

/// One row's gradient, G[c_i] += k_i (E[q] − E[c_i]) and G[q] −= Σ_i k_i (E[q] − E[c_i]) with k_i = coef_i, in the
/// split form G[c_i] += k_i E[q], A[c_i] += k_i (the −A[s] E[s] part is applied once per table by the caller), and
/// G[q] += Σ_i k_i E[c_i] − (Σ_i k_i) E[q]: five vector operations per block and position instead of seven.
/// gq_tail: [D] scratch (zero on entry) for a run-time D.
template <Index kBlocks>
void scatter_gradient(const double* E, const int64_t* c, int64_t q, const QueryRow<kBlocks>& y, const double* coef,
                      Index N, double* G, double* A, double* gq_tail) {
  const Index D = y.D;
  const Index blocks = y.n_blocks();
  Lanes gq[kBlocks > 0 ? kBlocks : 1] = {};
  double coef_sum = 0.0;
  for (Index i = 0; i < N; ++i) {
    const double k = coef[i];
    if (k == 0.0) continue;
    coef_sum += k;
    A[c[i]] += k;
    const double* ec = E + c[i] * D;
    double* gc = G + c[i] * D;
    for (Index b = 0; b < blocks; ++b) {
      store(gc + b * kLanes, load(gc + b * kLanes) + k * y.block(b));
      if constexpr (kBlocks > 0) gq[b] += k * load(ec + b * kLanes);
      else store(gq_tail + b * kLanes, load(gq_tail + b * kLanes) + k * load(ec + b * kLanes));
    }
    for (Index d = blocks * kLanes; d < D; ++d) {
      gc[d] += k * y.y[d];
      gq_tail[d] += k * ec[d];
    }
  }
  double* gq_row = G + q * D;
  if constexpr (kBlocks > 0)
    for (Index b = 0; b < kBlocks; ++b)
      store(gq_row + b * kLanes, load(gq_row + b * kLanes) + (gq[b] - coef_sum * y.block(b)));
  for (Index d = kBlocks * kLanes; d < D; ++d) gq_row[d] += gq_tail[d] - coef_sum * y.y[d];
}

/// b[i] = B[c_i, t] for i < N, then zeros up to padded(N).
inline void gather_emission(const Model& m, const int64_t* c, int64_t t, double* b) {
  for (Index i = 0; i < m.N; ++i) b[i] = m.emission[c[i] * m.T + t];
  for (Index i = m.N; i < padded(m.N); ++i) b[i] = 0.0;
}

/// Calls f(std::integral_constant<Index, D / 8>) for the specialised D = 8, 16, 24, 32, 48, 64, else with 0.
template <class F>
void dispatch_blocks(Index D, F&& f) {
  switch (D) {
    case 8: f(std::integral_constant<Index, 1>{}); break;
    case 16: f(std::integral_constant<Index, 2>{}); break;
    case 24: f(std::integral_constant<Index, 3>{}); break;
    case 32: f(std::integral_constant<Index, 4>{}); break;
    case 48: f(std::integral_constant<Index, 6>{}); break;
    case 64: f(std::integral_constant<Index, 8>{}); break;
    default: f(std::integral_constant<Index, 0>{});
  }
}

/// The row kernel's view of a model (mixed: its float tables, or null in float64).
Model row_model(const VariationalEmbeddingAttentionParams& params, const Vector& log_prior,
                const VariationalFloatTables* mixed) {
  return {params.emission.data(), log_prior.data(), params.position_prior.size(), params.mean.cols(),
          params.emission.cols(), 0.5 / params.sigma2, mixed};
}

/// The plug-in table E = m (scoring).
GateTable plug_in_table(const Matrix& mean, const VariationalFloatTables* mixed) {
  return {mean.data(), mixed != nullptr ? &mixed->mean : nullptr};
}

}  // namespace

VariationalEmbeddingAttention::VariationalEmbeddingAttention(VariationalEmbeddingAttentionParams params,
                                                             Precision precision)
    : params_(std::move(params)), precision_(precision) {
  params_.optimizer_state = resolve_optimizer_state(kWhere, kFamily, params_.mean, params_.log_var,
                                                    std::move(params_.optimizer_state));
  check::row_simplex(kWhere, "emission", params_.emission, params_.mean.rows());
  check::simplex(kWhere, "position_prior",
                 {params_.position_prior.data(), static_cast<size_t>(params_.position_prior.size())});
  check::variance(kWhere, "sigma2", params_.sigma2);
  state_ = std::make_shared<const AttentionOptimizerState>(*params_.optimizer_state);
  log_prior_ = params_.position_prior.array().log().matrix();
  noise_ = std::make_shared<MonteCarloCache>();
  if (precision_ == Precision::kMixed)
    float_tables_ = std::make_shared<const VariationalFloatTables>(params_.mean, log_prior_, 0.5 / params_.sigma2);
}

void VariationalEmbeddingAttention::check_batch(const VariationalEmbeddingAttentionBatch& batch) const {
  if (batch.n_rows() == 0) return;
  check::dimension(kWhere, "context length N", context_length(), batch.context_length());
  if (batch.max_symbol() >= n_symbols())
    throw ValueError(std::string(kWhere) + ": out-of-range ID: context or query symbol " +
                     std::to_string(batch.max_symbol()) + " (the model has S = " + std::to_string(n_symbols()) +
                     " symbols)");
  if (batch.max_target() >= n_targets())
    throw ValueError(std::string(kWhere) + ": out-of-range ID: target " + std::to_string(batch.max_target()) +
                     " (the model has T = " + std::to_string(n_targets()) + " targets)");
}

void VariationalEmbeddingAttention::log_density(const VariationalEmbeddingAttentionBatch& batch,
                                                std::span<double> out) const {
  check_batch(batch);
  if (static_cast<Index>(out.size()) != batch.n_rows())
    throw ValueError(std::string(kWhere) + ": log_density output must have one entry per row");
  const Model m = row_model(params_, log_prior_, float_tables_.get());
  const Index NP = padded(m.N);
  double* s = scratch<0>(static_cast<size_t>(4 * NP));
  double* b = s + 3 * NP;
  const GateTable table = plug_in_table(params_.mean, float_tables_.get());
  RowLogs logs(out.data(), batch.n_rows());
  dispatch_blocks(m.D, [&](auto blocks) {
    for (Index row = 0; row < batch.n_rows(); ++row) {
      gather_emission(m, batch.context(row), batch.target(row), b);
      logs.set(row, row_posterior<blocks()>(m, table, batch.context(row), batch.query(row), b, s, s + NP, s + 2 * NP));
    }
  });
  logs.finish();
}

double VariationalEmbeddingAttention::log_density_at(const Matrix& table,
                                                     const VariationalEmbeddingAttentionBatch& batch,
                                                     Index row) const {
  check_batch(batch);
  if (table.rows() != n_symbols() || table.cols() != embed_dim())
    throw ValueError(std::string(kWhere) + ": the embedding table must have shape (S, D)");
  if (row < 0 || row >= batch.n_rows()) throw ValueError(std::string(kWhere) + ": row out of range");
  const Model m = row_model(params_, log_prior_, nullptr);
  const Index NP = padded(m.N);
  std::vector<double> s(static_cast<size_t>(4 * NP));
  gather_emission(m, batch.context(row), batch.target(row), s.data() + 3 * NP);
  double log_p = 0.0;
  RowLogs logs(&log_p, 1);
  logs.set(0, row_posterior<0>(m, {table.data(), nullptr}, batch.context(row), batch.query(row), s.data() + 3 * NP,
                               s.data(), s.data() + NP, s.data() + 2 * NP));
  logs.finish();
  return log_p;
}

void VariationalEmbeddingAttention::accumulate(const VariationalEmbeddingAttentionBatch& batch,
                                               std::span<const double> w,
                                               VariationalEmbeddingAttentionAccumulator& acc,
                                               std::span<double> log_p_out) const {
  check_batch(batch);
  const Index n = batch.n_rows();
  check::weights(kWhere, w, n);
  if (acc.n_symbols() != n_symbols() || acc.context_length() != context_length() || acc.embed_dim() != embed_dim() ||
      acc.n_targets() != n_targets())
    throw ValueError(std::string(kWhere) + ": the accumulator's dimensions (S, N, D, T) differ from the model's");
  if (acc.optimizer_state() && acc.optimizer_state() != state_ && !(*acc.optimizer_state() == *state_))
    throw ValueError(std::string(VariationalEmbeddingAttentionAccumulator::kWhere) +
                     ": cannot combine attention statistics from different optimizer states");
  if (!log_p_out.empty() && static_cast<Index>(log_p_out.size()) != n)
    throw ValueError(std::string(kWhere) + ": log-density output must have one entry per row");

  const Index N = context_length();
  const Index D = embed_dim();
  const Index S = n_symbols();
  const Index T = n_targets();
  // Impossible evidence first: a row with w > 0 needs a position with π_i > 0 and B[c_i, t] > 0. The rows'
  // emission probabilities b_i are gathered here once for every sample (the table is large, the reads random).
  const Model m = row_model(params_, log_prior_, float_tables_.get());
  const Index NP = padded(N);
  double* b_all = scratch<3>(static_cast<size_t>(n * NP));
  std::vector<int64_t> impossible;
  for (Index row = 0; row < n; ++row) {
    double* b = b_all + row * NP;
    gather_emission(m, batch.context(row), batch.target(row), b);
    if (!(w[static_cast<size_t>(row)] > 0.0)) continue;
    bool possible = false;
    for (Index i = 0; i < N && !possible; ++i) possible = params_.position_prior[i] > 0.0 && b[i] > 0.0;
    if (!possible) impossible.push_back(row);
  }
  if (!impossible.empty()) throw ImpossibleEvidenceError(kWhere, std::move(impossible));

  // Per row of a block: s, a, r (row_posterior's buffers), then one coef and gq for the statistics pass.
  double* rows_sar = scratch<0>(static_cast<size_t>(kRowBlock * 3 * NP + NP + D));
  double* coef = rows_sar + kRowBlock * 3 * NP;  // w (r_i − a_i) / σ²
  double* gq = coef + NP;                        // [D]: the query's gradient when D is not specialised
  const int64_t mc = acc.mc();
  const std::shared_ptr<const MonteCarloTables> tables = noise_->get(*state_, mc);
  const std::shared_ptr<const std::vector<FloatEmbeddingTable>> float_noise =
      float_tables_ ? float_tables_->noise(*tables, mc) : nullptr;
  // G and A are zero between samples: zeroed here once, then by the fold that reads them after each sample.
  double* G = scratch<1>(static_cast<size_t>(S * D));
  double* A = scratch<4>(static_cast<size_t>(S));  // Σ coef per symbol: G[s] −= A[s] E[s] (scatter_gradient)
  std::fill(G, G + S * D, 0.0);
  std::fill(A, A + S, 0.0);
  // w r_i / mc summed over the mc samples per (row, position), scattered into the counts once at the end: the
  // emission table is too large for the cache, so one random update per row and position instead of mc.
  double* r_sum = scratch<2>(static_cast<size_t>(n * NP));
  double* log_p_rows = scratch<5>(static_cast<size_t>(n));  // one sample's log p per row
  std::fill(r_sum, r_sum + n * NP, 0.0);
  const double inv_mc = 1.0 / static_cast<double>(mc);
  const double inv_sigma2 = 1.0 / params_.sigma2;
  double* emission_count = acc.emission_count().data();
  double* position_count = acc.position_count().data();
  double* grad_mean = acc.grad_mean().data();
  double* grad_log_var = acc.grad_log_var().data();
  double ll = 0.0;
  dispatch_blocks(D, [&](auto blocks) {
    if (!log_p_out.empty()) {
      RowLogs plug_in(log_p_out.data(), n);
      const GateTable table = plug_in_table(params_.mean, float_tables_.get());
      for (Index row = 0; row < n; ++row)
        plug_in.set(row, row_posterior<blocks()>(m, table, batch.context(row), batch.query(row), b_all + row * NP,
                                                 rows_sar, rows_sar + NP, rows_sar + 2 * NP));
      plug_in.finish();
    }
    for (int64_t k = 0; k < mc; ++k) {
      const double* E = tables->embeddings[static_cast<size_t>(k)].data();
      const GateTable table{E, float_noise ? &(*float_noise)[static_cast<size_t>(k)] : nullptr};
      RowLogs sample_logs(log_p_rows, n);
      for (Index start = 0; start < n; start += kRowBlock) {
        const Index end = std::min(n, start + kRowBlock);
        // The posteriors of a block of rows first: rows are independent, so the latency chains of neighbouring
        // rows (distances, max, exp, sums, division) overlap...
        for (Index row = start; row < end; ++row) {
          if (!(w[static_cast<size_t>(row)] > 0.0)) continue;
          double* sar = rows_sar + (row - start) * 3 * NP;
          sample_logs.set(row, row_posterior<blocks()>(m, table, batch.context(row), batch.query(row),
                                                       b_all + row * NP, sar, sar + NP, sar + 2 * NP));
        }
        // ...then their statistics, in row order.
        for (Index row = start; row < end; ++row) {
          const double wn = w[static_cast<size_t>(row)];
          if (!(wn > 0.0)) continue;
          const int64_t* c = batch.context(row);
          const int64_t q = batch.query(row);
          const QueryRow<blocks()> y(E + q * D, D);
          const double* a = rows_sar + (row - start) * 3 * NP + NP;
          const double* r = a + NP;
          double* rs = r_sum + row * NP;
          const double count_scale = wn * inv_mc;
          const double coef_scale = wn * inv_sigma2;
          for (Index i = 0; i < NP; i += kLanes) {
            const Lanes rv = load(r + i);
            store(rs + i, load(rs + i) + rv * count_scale);
            store(coef + i, (rv - load(a + i)) * coef_scale);
          }
          if constexpr (blocks() == 0) std::fill(gq, gq + D, 0.0);  // the run-time-D query gradient
          scatter_gradient(E, c, q, y, coef, N, G, A, gq);
        }
      }
      sample_logs.finish();
      for (Index row = 0; row < n; ++row) {
        const double wn = w[static_cast<size_t>(row)];
        if (wn > 0.0) ll += wn * log_p_rows[row] * inv_mc;
      }
      const double* factor = tables->log_var_factor[static_cast<size_t>(k)].data();
      for (Index sym = 0; sym < S; ++sym) {
        for (Index e = sym * D; e < (sym + 1) * D; ++e) {
          const double g = G[e] - A[sym] * E[e];
          grad_mean[e] += g * inv_mc;
          grad_log_var[e] += g * factor[e] * inv_mc;
          G[e] = 0.0;  // zero again for the next sample (or call): no separate pass over G
        }
        A[sym] = 0.0;
      }
    }
  });
  for (Index row = 0; row < n; ++row) {
    if (!(w[static_cast<size_t>(row)] > 0.0)) continue;
    const int64_t* c = batch.context(row);
    const int64_t t = batch.target(row);
    const double* rs = r_sum + row * NP;
    for (Index i = 0; i < N; ++i) {
      emission_count[c[i] * T + t] += rs[i];
      position_count[i] += rs[i];
    }
  }
  acc.ll() += ll;
  double total = 0.0;
  for (double wn : w) total += wn;
  acc.n() += total;
  acc.set_optimizer_state(state_);
}

Matrix VariationalEmbeddingAttention::predict_proba(const VariationalEmbeddingAttentionBatch& batch) const {
  check_batch(batch);
  const Index N = context_length();
  const Index T = n_targets();
  const Model m = row_model(params_, log_prior_, nullptr);
  Matrix out = Matrix::Zero(batch.n_rows(), T);
  std::vector<double> s(static_cast<size_t>(N)), a(static_cast<size_t>(N));
  const double* E = params_.mean.data();
  for (Index row = 0; row < batch.n_rows(); ++row) {
    const int64_t* c = batch.context(row);
    const double* eq = E + batch.query(row) * m.D;
    double top = kNegInf;
    for (Index i = 0; i < N; ++i) {
      const double lp = m.log_prior[i];
      s[static_cast<size_t>(i)] =
          lp == kNegInf ? kNegInf : lp - variational::squared_distance(eq, E + c[i] * m.D, m.D) * m.inv_two_sigma2;
      top = std::max(top, s[static_cast<size_t>(i)]);
    }
    double z = 0.0;
    for (Index i = 0; i < N; ++i) z += (a[static_cast<size_t>(i)] = std::exp(s[static_cast<size_t>(i)] - top));
    for (Index i = 0; i < N; ++i) out.row(row) += (a[static_cast<size_t>(i)] / z) * params_.emission.row(c[i]);
  }
  return out;
}

Matrix VariationalEmbeddingAttention::predict_proba(const IdMatrix& contexts, const IdVector& queries) const {
  IdVector targets = IdVector::Zero(queries.size());
  const VariationalEmbeddingAttentionBatch batch =
      VariationalEmbeddingAttentionEncoder{n_symbols(), context_length(), std::nullopt}.encode(contexts, queries,
                                                                                                targets);
  return predict_proba(batch);
}

}  // namespace attnmix
