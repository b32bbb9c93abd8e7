// SPDX-License-Identifier: Apache-2.0
// Responsibility attention: validation, log density, the E-step and prediction
// (docs/mechanisms.md#responsibility-attention).
// Hot path (docs/PERFORMANCE.md): pass 1 computes, for a block of 16 rows, first every row's ℓ_i (N·D squared
// differences, eight positions at a time in 8-lane vectors), then r_i and log p, requesting the query and context
// lines of a few rows ahead; pass 2
// scatters w r_i into the statistics. Both passes run per batch (one chunk of parallel_accumulate), so impossible
// rows are detected before anything is added. The arithmetic of a row never depends on its neighbours, on buffer
// addresses or on the thread that runs it: reductions over lanes have one written-out order, exp runs on whole
// 8-lane vectors (exp_lanes) and log on whole Eigen packets (never Eigen's array loops, which switch between scalar
// and packet code by alignment), and the kernels specialised for D = 8, 16, 24, 32, 48, 64 perform the operations
// of the run-time-D kernel (checked bitwise). The mixed-precision pass 1 (docs/mixed_precision.md) is in
// mixed.cpp; pass 2 is float64 in either precision.
#include <Eigen/Core>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <type_traits>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"
#include "../e_step_checks_impl.hpp"
#include "../lanes_impl.hpp"
#include "../prefetch_impl.hpp"
#include "../target_log_proba_impl.hpp"
#include "mixed_impl.hpp"

namespace attnmix {

namespace {

using lanes::broadcast;
using lanes::exp_shifted;
using lanes::horizontal_sum;
using lanes::horizontal_sums;
using lanes::kLanes;
using lanes::Lanes;
using lanes::load;
using lanes::scratch;
using lanes::store;
using LaneMask = int64_t __attribute__((vector_size(kLanes * sizeof(int64_t))));

/// Lane-wise maximum / minimum that skip NaN lanes of x (NaN is detected separately).
inline Lanes lanes_max(Lanes acc, Lanes x) { return x > acc ? x : acc; }
inline Lanes lanes_min(Lanes acc, Lanes x) { return x < acc ? x : acc; }
/// The largest / smallest lane of a (no lane is NaN): three levels of halving, exact in any order.
inline double horizontal_max(Lanes a) {
  a = lanes_max(a, __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3));
  a = lanes_max(a, __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5));
  a = lanes_max(a, __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6));
  return a[0];
}
inline double horizontal_min(Lanes a) {
  a = lanes_min(a, __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3));
  a = lanes_min(a, __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5));
  a = lanes_min(a, __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6));
  return a[0];
}

// ---- Row kernels -----------------------------------------------------------------------------------------------

/// What the kernels read from the model.
struct Tables {
  const double* key_means;     // [S, D]
  const double* key_sq_norm;   // [S]: ‖K[s]‖²
  const double* log_emission;  // [S, T]
  const double* log_prior;     // [N]
  Index N, D, T;
  double inv_two_sigma2;
  double gate_const;
};

/// The query of one row as 8-lane blocks: kBlocks = D / 8 known at compile time (then D mod 8 = 0 and the blocks
/// stay in registers), or kBlocks = 0 for a run-time D (D / 8 blocks, then the D mod 8 tail entry by entry).
template <Index kBlocks>
struct Query {
  const double* y;
  Lanes blocks[kBlocks > 0 ? kBlocks : 1];
  Query(const double* row, Index /*D*/) : y(row) {
    if constexpr (kBlocks > 0)
      for (Index b = 0; b < kBlocks; ++b) blocks[b] = load(row + b * kLanes);
  }
  [[nodiscard]] Lanes block(Index b) const {
    if constexpr (kBlocks > 0) return blocks[b];
    else return load(y + b * kLanes);
  }
};

template <Index kBlocks>
inline Index full_blocks(Index D) {
  if constexpr (kBlocks > 0) return kBlocks;
  else return D / kLanes;
}

/// Lane-wise partial sums of (y − k)² over the full 8-wide blocks of d.
template <Index kBlocks>
inline Lanes squared_distance_lanes(const Query<kBlocks>& y, const double* __restrict k, Index D) {
  Lanes acc{};
  const Index blocks = full_blocks<kBlocks>(D);
  for (Index b = 0; b < blocks; ++b) {
    const Lanes diff = y.block(b) - load(k + b * kLanes);
    acc += diff * diff;
  }
  return acc;
}

/// ‖y − k‖²: the lane partial sums, the fixed horizontal sum, then the D mod 8 tail in order.
template <Index kBlocks>
inline double squared_distance(const Query<kBlocks>& y, const double* __restrict k, Index D) {
  double sum = horizontal_sum(squared_distance_lanes(y, k, D));
  if constexpr (kBlocks == 0)
    for (Index d = full_blocks<kBlocks>(D) * kLanes; d < D; ++d) {
      const double diff = y.y[d] - k[d];
      sum += diff * diff;
    }
  return sum;
}

/// ‖y‖² in the order of squared_distance.
template <Index kBlocks>
inline double squared_norm(const Query<kBlocks>& y, Index D) {
  Lanes acc{};
  const Index blocks = full_blocks<kBlocks>(D);
  for (Index b = 0; b < blocks; ++b) acc += y.block(b) * y.block(b);
  double sum = horizontal_sum(acc);
  if constexpr (kBlocks == 0)
    for (Index d = blocks * kLanes; d < D; ++d) sum += y.y[d] * y.y[d];
  return sum;
}

/// ℓ_i = log π_i − distance(c_i)/(2σ²) + log B[c_i, t] of positions [begin, N), one at a time, into out, folded into
/// max_l, min_l and nan (distance(s) = ‖y − K[s]‖²).
template <class Distance>
inline void log_joint_positions(const Tables& m, const int64_t* __restrict ctx, int64_t t, Index begin,
                                Distance distance, double* __restrict out, double& max_l, double& min_l, bool& nan) {
  for (Index i = begin; i < m.N; ++i) {
    const int64_t s = ctx[i];
    const double l = m.log_prior[i] - distance(s) * m.inv_two_sigma2 + m.log_emission[s * m.T + t];
    out[i] = l;
    max_l = l > max_l ? l : max_l;
    min_l = l < min_l ? l : min_l;
    nan |= l != l;
  }
}

/// ℓ_i = log π_i − ‖y − K[c_i]‖²/(2σ²) + log B[c_i, t] (without gate_const) into out[N]. Returns max_i ℓ_i, or NaN
/// when some ℓ_i is NaN; lowest receives min_i ℓ_i. Positions go eight at a time (their distances reduced together
/// by horizontal_sums), the N mod 8 rest one at a time; every ℓ_i gets the same operations either way.
template <Index kBlocks>
inline double log_joint_row(const Tables& m, const int64_t* __restrict ctx, const Query<kBlocks>& y, int64_t t,
                            double* __restrict out, double& lowest) {
  const Index N = m.N;
  const Index D = m.D;
  const Index T = m.T;
  const double* __restrict K = m.key_means;
  const double* __restrict log_B_t = m.log_emission + t;
  const Lanes inv = broadcast(m.inv_two_sigma2);
  Lanes max8 = broadcast(kNegInf);
  Lanes min8 = broadcast(kInf);
  LaneMask nan8{};
  Index i = 0;
  for (; i + kLanes <= N; i += kLanes) {
    const int64_t* c = ctx + i;
    Lanes partial[kLanes];
    for (Index j = 0; j < kLanes; ++j) partial[j] = squared_distance_lanes(y, K + c[j] * D, D);
    Lanes dist = horizontal_sums(partial);
    if constexpr (kBlocks == 0)
      for (Index d = full_blocks<kBlocks>(D) * kLanes; d < D; ++d) {
        const Lanes diff = broadcast(y.y[d]) - Lanes{K[c[0] * D + d], K[c[1] * D + d], K[c[2] * D + d],
                                                     K[c[3] * D + d], K[c[4] * D + d], K[c[5] * D + d],
                                                     K[c[6] * D + d], K[c[7] * D + d]};
        dist += diff * diff;
      }
    const Lanes log_B = {log_B_t[c[0] * T], log_B_t[c[1] * T], log_B_t[c[2] * T], log_B_t[c[3] * T],
                         log_B_t[c[4] * T], log_B_t[c[5] * T], log_B_t[c[6] * T], log_B_t[c[7] * T]};
    const Lanes l = load(m.log_prior + i) - dist * inv + log_B;
    store(out + i, l);
    max8 = lanes_max(max8, l);
    min8 = lanes_min(min8, l);
    nan8 |= l != l;
  }
  double max_l = horizontal_max(max8);
  double min_l = horizontal_min(min8);
  bool nan = false;
  for (int j = 0; j < kLanes; ++j) nan |= nan8[j] != 0;
  log_joint_positions(m, ctx, t, i, [&](int64_t s) { return squared_distance(y, K + s * D, D); }, out, max_l, min_l,
                      nan);
  lowest = min_l;
  return nan ? std::numeric_limits<double>::quiet_NaN() : max_l;
}

/// Σ_k x[k] over n entries in a fixed order (8-lane partial sums, horizontal sum, tail).
inline double ordered_sum(const double* x, Index n) {
  Lanes acc{};
  Index k = 0;
  for (; k + kLanes <= n; k += kLanes) acc += load(x + k);
  double sum = horizontal_sum(acc);
  for (; k < n; ++k) sum += x[k];
  return sum;
}

/// Rows of a pass-1 block: phase A computes every ℓ of the block, phase B their exponentials. Each phase's rows are
/// independent, so the processor overlaps their dependency chains (a row alone is bound by its chain's latency).
/// Every entry gets the same operations as row by row, so the block size changes no bits.
constexpr Index kPassOneBlock = 16;

/// ℓ_i of a row with a symbol query q (the one-hot e_q): ‖e_q − K[c_i]‖² = 1 − 2·K[c_i, q] + ‖K[c_i]‖², otherwise as
/// log_joint_row (same contract: out[N], returns the maximum or NaN, lowest receives the minimum).
inline double log_joint_symbol_row(const Tables& m, const int64_t* __restrict ctx, int64_t q, int64_t t,
                                   double* __restrict out, double& lowest) {
  double max_l = kNegInf;
  double min_l = kInf;
  bool nan = false;
  log_joint_positions(
      m, ctx, t, 0, [&](int64_t s) { return 1.0 - 2.0 * m.key_means[s * m.D + q] + m.key_sq_norm[s]; }, out, max_l,
      min_l, nan);
  lowest = min_l;
  return nan ? std::numeric_limits<double>::quiet_NaN() : max_l;
}

/// Pass 1 over the rows of batch: r[n, N] ← responsibilities (zeros for impossible rows), log_p[n] ← log p (−∞ for
/// impossible rows). log_joint(n, out, lowest) computes row n's ℓ (log_joint_row's contract). Returns the number of
/// impossible rows. Shared by log_density and the E-step, so both give the same bits.
/// @throws ValueError when some ℓ_i is NaN or +∞.
template <class LogJoint>
Index responsibilities(const Tables& m, const ResponsibilityAttentionBatch& batch, double* __restrict r,
                       double* __restrict log_p, const char* where, LogJoint log_joint) {
  const Index N = m.N;
  const Index n_rows = batch.n_rows();
  double* __restrict e = scratch<0>(static_cast<size_t>((N + 1) * kPassOneBlock + n_rows));  // [block, N]
  double* __restrict lowest = e + N * kPassOneBlock;                                            // [block]
  double* __restrict max_of_row = lowest + kPassOneBlock;                                      // [n_rows]
  Index n_impossible = 0;
  for (Index begin = 0; begin < n_rows; begin += kPassOneBlock) {
    const Index end = std::min(begin + kPassOneBlock, n_rows);
    for (Index n = begin; n < end; ++n) {  // phase A: ℓ, its maximum and minimum
      const double max_l = log_joint(n, r + n * N, lowest[n - begin]);
      if (std::isnan(max_l) || max_l == kInf)
        throw ValueError(std::string(where) + ": log weight of row " + std::to_string(n) + " is NaN or +inf");
      max_of_row[n] = max_l;
    }
    for (Index n = begin; n < end; ++n) {  // phase B: r_i = exp(ℓ_i − max) / Σ_j exp(ℓ_j − max)
      double* r_row = r + n * N;
      const double max_l = max_of_row[n];
      if (max_l == kNegInf) {
        std::fill(r_row, r_row + N, 0.0);
        log_p[n] = 1.0;  // a placeholder for the logs below
        ++n_impossible;
        continue;
      }
      double* e_row = e + (n - begin) * N;
      exp_shifted(r_row, max_l, lowest[n - begin], e_row, N);
      const double total = ordered_sum(e_row, N);
      const double inv_total = 1.0 / total;
      for (Index i = 0; i < N; ++i) r_row[i] = e_row[i] * inv_total;
      log_p[n] = total;
    }
  }
  lanes::log_p_from_sums(log_p, max_of_row, n_rows, m.gate_const);
  return n_impossible;
}

/// Pass 2: the statistics of docs/mechanisms.md#responsibility-attention of every row with w_n > 0, in row order, for
/// either kind of query. keys_of(n) gives row n's key statistics: add(s, w r_i) adds position i's share to the key sum
/// of its symbol s, squared_norm() is ‖y_n‖²; key_mass, emission_count, position_count and query_sq are added here.
template <class KeysOf>
void scatter_rows(const Tables& m, const ResponsibilityAttentionBatch& batch, const double* __restrict w,
                  const double* __restrict r, ResponsibilityAttentionAccumulator& acc, KeysOf keys_of) {
  const Index N = m.N;
  const Index T = m.T;
  double* __restrict key_mass = acc.key_mass().data();
  double* __restrict emission = acc.emission_count().data();
  double* __restrict position = acc.position_count().data();
  double query_sq = 0.0;
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const double wn = w[n];
    if (wn == 0.0) continue;
    const int64_t* __restrict ctx = batch.context(n);
    const auto keys = keys_of(n);
    double* __restrict emission_t = emission + batch.target(n);
    const double* __restrict r_row = r + n * N;
    for (Index i = 0; i < N; ++i) {
      const double wr = wn * r_row[i];
      const int64_t s = ctx[i];
      keys.add(s, wr);
      key_mass[s] += wr;
      emission_t[s * T] += wr;
    }
    for (Index i = 0; i < N; ++i) position[i] += wn * r_row[i];
    query_sq += wn * ordered_sum(r_row, N) * keys.squared_norm();
  }
  acc.query_sq() += query_sq;
}

/// A real-valued query's key statistics: w r_i y added to its symbol's row of the 64-byte-aligned scratch (8-lane
/// read-modify-writes that straddle cache lines cost twice as much).
template <Index kBlocks>
struct ScratchKeys {
  Query<kBlocks> y;
  double* local;  // [S, stride]
  Index stride, D;
  void add(int64_t s, double wr) const {
    double* __restrict ks = local + s * stride;
    const Index blocks = full_blocks<kBlocks>(D);
    const Lanes wr8 = broadcast(wr);
    for (Index b = 0; b < blocks; ++b) store(ks + b * kLanes, load(ks + b * kLanes) + wr8 * y.block(b));
    if constexpr (kBlocks == 0)
      for (Index d = blocks * kLanes; d < D; ++d) ks[d] += wr * y.y[d];
  }
  [[nodiscard]] double squared_norm() const { return attnmix::squared_norm(y, D); }
};

/// A symbol query's key statistics: w r_i added to key_sum[s, q], the one-hot's only non-zero coordinate; ‖e_q‖² = 1.
struct SymbolKeys {
  double* key_sum;  // [S, D]
  Index D;
  int64_t q;
  void add(int64_t s, double wr) const { key_sum[s * D + q] += wr; }
  [[nodiscard]] static double squared_norm() { return 1.0; }
};

/// Pass 2 for real-valued queries: key_sum is summed in the scratch and its non-zero entries are then added to acc:
/// into a zeroed accumulator, as parallel_accumulate's partials are, that gives the bits of adding row by row;
/// untouched entries are left exactly as they were.
template <Index kBlocks>
void scatter(const Tables& m, const ResponsibilityAttentionBatch& batch, const double* __restrict w,
             const double* __restrict r, ResponsibilityAttentionAccumulator& acc) {
  const Index D = m.D;
  const Index S = acc.n_symbols();
  const Index stride = (D + kLanes - 1) / kLanes * kLanes;  // padded row of the scratch
  double* __restrict local = scratch<1>(static_cast<size_t>(S * stride));
  std::fill(local, local + S * stride, 0.0);
  scatter_rows(m, batch, w, r, acc, [&](Index n) {
    return ScratchKeys<kBlocks>{Query<kBlocks>(batch.query(n), D), local, stride, D};
  });
  double* __restrict key_sum = acc.key_sum().data();
  for (Index s = 0; s < S; ++s) {
    const double* __restrict src = local + s * stride;
    double* __restrict dst = key_sum + s * D;
    Index d = 0;
    for (; d + kLanes <= D; d += kLanes) {
      const Lanes v = load(src + d);
      store(dst + d, v != 0.0 ? load(dst + d) + v : load(dst + d));
    }
    for (; d < D; ++d)
      if (src[d] != 0.0) dst[d] += src[d];
  }
}

/// Pass 2 for symbol queries: key_sum[s, q] += w r_i added in row order straight into acc.
void scatter_symbols(const Tables& m, const ResponsibilityAttentionBatch& batch, const double* __restrict w,
                     const double* __restrict r, ResponsibilityAttentionAccumulator& acc) {
  double* key_sum = acc.key_sum().data();
  scatter_rows(m, batch, w, r, acc, [&](Index n) { return SymbolKeys{key_sum, m.D, batch.query_symbol(n)}; });
}

/// Calls f(std::integral_constant<Index, D / 8>) for the specialised D, f(std::integral_constant<Index, 0>) otherwise.
template <class F>
decltype(auto) dispatch_query_dim(Index D, F&& f) {
  switch (D) {
    case 8: return f(std::integral_constant<Index, 1>{});
    case 16: return f(std::integral_constant<Index, 2>{});
    case 24: return f(std::integral_constant<Index, 3>{});
    case 32: return f(std::integral_constant<Index, 4>{});
    case 48: return f(std::integral_constant<Index, 6>{});
    case 64: return f(std::integral_constant<Index, 8>{});
    default: return f(std::integral_constant<Index, 0>{});
  }
}

/// Pass 1 in the model's precision: the float tables when given (mixed), the float64 kernels otherwise; symbol
/// queries in float64 either way.
Index pass_one(const Tables& m, const ResponsibilityFloatTables* mixed, const ResponsibilityAttentionBatch& batch,
               double* __restrict r, double* __restrict log_p, const char* where) {
  if (batch.has_symbol_queries())
    return responsibilities(m, batch, r, log_p, where, [&](Index n, double* out, double& lowest) {
      return log_joint_symbol_row(m, batch.context(n), batch.query_symbol(n), batch.target(n), out, lowest);
    });
  if (mixed != nullptr) return mixed_responsibilities(*mixed, batch, r, log_p, where);
  return dispatch_query_dim(m.D, [&](auto blocks) {
    constexpr Index kBlocks = decltype(blocks)::value;
    return responsibilities(m, batch, r, log_p, where, [&](Index n, double* out, double& lowest) {
      prefetch_rows_ahead(batch, n);
      const Query<kBlocks> y(batch.query(n), m.D);
      return log_joint_row(m, batch.context(n), y, batch.target(n), out, lowest);
    });
  });
}

}  // namespace

ResponsibilityAttention::ResponsibilityAttention(ResponsibilityAttentionParams params, Precision precision)
    : params_(std::move(params)), precision_(precision) {
  const Matrix& K = params_.key_means;
  if (K.rows() == 0 || K.cols() == 0)
    throw ValueError(std::string(kWhere) + ": key_means must be a non-empty 2-D array (got " +
                     std::to_string(K.rows()) + "x" + std::to_string(K.cols()) + ")");
  check::bounded_reals(kWhere, "key_means", {K.data(), static_cast<size_t>(K.size())});
  check::row_simplex(kWhere, "emission", params_.emission, K.rows());
  if (params_.position_prior.size() == 0)
    throw ValueError("position_prior (length = context length N) is required.");
  check::simplex(kWhere, "position_prior",
                 {params_.position_prior.data(), static_cast<size_t>(params_.position_prior.size())});
  check::variance(kWhere, "sigma2", params_.sigma2);

  log_emission_.resize(K.rows(), params_.emission.cols());
  key_sq_norm_.resize(K.rows());
  derive_symbol_tables(params_, 0, K.rows(), log_emission_, key_sq_norm_);
  derive_gate_tables();
}

void ResponsibilityAttention::derive_symbol_tables(const ResponsibilityAttentionParams& params, Index begin,
                                                   Index end, Matrix& log_emission, Vector& key_sq_norm) {
  for (Index s = begin; s < end; ++s) {
    log_emission.row(s) = params.emission.row(s).array().log();
    key_sq_norm[s] = params.key_means.row(s).squaredNorm();
  }
}

ResponsibilityAttention::ResponsibilityAttention(ResponsibilityAttentionParams params, Precision precision,
                                                 Matrix log_emission, Vector key_sq_norm)
    : params_(std::move(params)),
      log_emission_(std::move(log_emission)),
      key_sq_norm_(std::move(key_sq_norm)),
      precision_(precision) {
  check::simplex(kWhere, "position_prior",
                 {params_.position_prior.data(), static_cast<size_t>(params_.position_prior.size())});
  check::variance(kWhere, "sigma2", params_.sigma2);  // the O(1) and O(N) checks; K and B are valid by construction
  derive_gate_tables();
}

void ResponsibilityAttention::derive_gate_tables() {
  log_prior_ = params_.position_prior.array().log();
  inv_two_sigma2_ = 1.0 / (2.0 * params_.sigma2);
  gate_const_ = -0.5 * static_cast<double>(query_dim()) * std::log(2.0 * std::numbers::pi * params_.sigma2);
  if (precision_ == Precision::kMixed)
    float_tables_ = std::make_shared<const ResponsibilityFloatTables>(params_, log_prior_, log_emission_,
                                                                      inv_two_sigma2_, gate_const_);
}

void ResponsibilityAttention::check_batch(const ResponsibilityAttentionBatch& batch) const {
  if (batch.n_rows() == 0) return;
  check::dimension(kWhere, "batch context length N", context_length(), batch.context_length());
  batch.check_query_dim(kWhere, query_dim());
  if (batch.max_symbol() >= n_symbols())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in context (" + std::to_string(batch.max_symbol()) +
                     " >= S = " + std::to_string(n_symbols()) + ")");
  if (batch.max_target() >= n_targets())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in target (" + std::to_string(batch.max_target()) +
                     " >= T = " + std::to_string(n_targets()) + ")");
}

namespace {
/// The target-blind gate of one row, a_i = softmax_i(log π_i − ‖y − K[c_i]‖²/(2σ²)), into a (N): what
/// predict_proba weighs the emission rows by (and what its gradient differentiates). distance(s) = ‖y − K[s]‖².
template <class Distance>
void gate_weights(const int64_t* ctx, const double* log_prior, Index N, double inv_two_sigma2, Distance distance,
                  double* a) {
  double max_l = kNegInf;
  for (Index i = 0; i < N; ++i) {
    a[i] = log_prior[i] - distance(ctx[i]) * inv_two_sigma2;
    max_l = a[i] > max_l ? a[i] : max_l;
  }
  double total = 0.0;
  for (Index i = 0; i < N; ++i) total += (a[i] = std::exp(a[i] - max_l));
  for (Index i = 0; i < N; ++i) a[i] /= total;
}

/// The gate of row n of batch (gate_weights) for the model's K, ‖K[s]‖², log π and 1/(2σ²), from its real-valued or
/// symbol query.
void row_gate(const ResponsibilityAttentionBatch& batch, Index n, const Matrix& K, const Vector& key_sq_norm,
              const Vector& log_prior, double inv_two_sigma2, double* a) {
  const Index D = K.cols();
  const int64_t* ctx = batch.context(n);
  if (batch.has_symbol_queries()) {
    const int64_t q = batch.query_symbol(n);
    gate_weights(ctx, log_prior.data(), log_prior.size(), inv_two_sigma2,
                 [&](int64_t s) { return 1.0 - 2.0 * K(s, q) + key_sq_norm[s]; }, a);
  } else {
    const Query<0> y(batch.query(n), D);
    gate_weights(ctx, log_prior.data(), log_prior.size(), inv_two_sigma2,
                 [&](int64_t s) { return squared_distance(y, K.data() + s * D, D); }, a);
  }
}

Tables tables_of(const ResponsibilityAttentionParams& p, const Vector& key_sq_norm, const Vector& log_prior,
                 const Matrix& log_emission, double inv_two_sigma2, double gate_const) {
  return {p.key_means.data(), key_sq_norm.data(), log_emission.data(), log_prior.data(), p.position_prior.size(),
          p.key_means.cols(), p.emission.cols(), inv_two_sigma2, gate_const};
}
}  // namespace

void ResponsibilityAttention::log_density(const ResponsibilityAttentionBatch& batch, std::span<double> out) const {
  check_batch(batch);
  check::dimension(kWhere, "log_density output length", batch.n_rows(), static_cast<Index>(out.size()));
  const Tables m = tables_of(params_, key_sq_norm_, log_prior_, log_emission_, inv_two_sigma2_, gate_const_);
  // Blocks of rows keep the responsibility scratch small; rows are independent, so blocking changes no bits.
  constexpr Index kBlockRows = 256;
  double* r = scratch<2>(static_cast<size_t>(kBlockRows * m.N));
  for (Index begin = 0; begin < batch.n_rows(); begin += kBlockRows) {
    const Index count = std::min(kBlockRows, batch.n_rows() - begin);
    pass_one(m, float_tables_.get(), batch.slice(begin, count), r, out.data() + begin, kWhere);
  }
}

Matrix ResponsibilityAttention::responsibilities(const ResponsibilityAttentionBatch& batch) const {
  check_batch(batch);
  const Tables m = tables_of(params_, key_sq_norm_, log_prior_, log_emission_, inv_two_sigma2_, gate_const_);
  Matrix r(batch.n_rows(), m.N);
  std::vector<double> log_p(static_cast<size_t>(batch.n_rows()));
  pass_one(m, float_tables_.get(), batch, r.data(), log_p.data(), kWhere);
  return r;
}

void ResponsibilityAttention::accumulate(const ResponsibilityAttentionBatch& batch, std::span<const double> w,
                                         ResponsibilityAttentionAccumulator& acc,
                                         std::span<double> log_p_out) const {
  check_batch(batch);
  check_e_step(kWhere, *this, batch.n_rows(), w, acc, log_p_out);
  const Index n_rows = batch.n_rows();
  const Tables m = tables_of(params_, key_sq_norm_, log_prior_, log_emission_, inv_two_sigma2_, gate_const_);

  // Pass 1: responsibilities of every row into r [n, N]; impossible rows collected before any statistic changes.
  double* r = scratch<2>(static_cast<size_t>(n_rows * (m.N + 1)));
  double* log_p = log_p_out.empty() ? r + n_rows * m.N : log_p_out.data();
  if (pass_one(m, float_tables_.get(), batch, r, log_p, kWhere) > 0) {
    std::vector<int64_t> impossible;
    for (Index n = 0; n < n_rows; ++n)
      if (log_p[n] == kNegInf && w[n] > 0.0) impossible.push_back(n);
    if (!impossible.empty()) throw ImpossibleEvidenceError(kWhere, std::move(impossible));
  }
  // Pass 2 (float64 in either precision): scatter-add (a symbol repeated in a context contributes once per position).
  if (batch.has_symbol_queries())
    scatter_symbols(m, batch, w.data(), r, acc);
  else
    dispatch_query_dim(m.D, [&](auto blocks) { scatter<decltype(blocks)::value>(m, batch, w.data(), r, acc); });
}

Matrix ResponsibilityAttention::predict_proba(const ResponsibilityAttentionBatch& batch) const {
  check_batch(batch);
  const Index N = context_length();
  const Index T = n_targets();
  Matrix out = Matrix::Zero(batch.n_rows(), T);
  std::vector<double> a(static_cast<size_t>(N));
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const int64_t* ctx = batch.context(n);
    row_gate(batch, n, params_.key_means, key_sq_norm_, log_prior_, inv_two_sigma2_, a.data());
    for (Index i = 0; i < N; ++i) out.row(n) += a[i] * params_.emission.row(ctx[i]);
  }
  return out;
}

Vector ResponsibilityAttention::target_log_proba(const ResponsibilityAttentionBatch& batch) const {
  check_batch(batch);
  return target_log_proba_of(
      batch, context_length(),
      [&](Index n, double* a) {
        row_gate(batch, n, params_.key_means, key_sq_norm_, log_prior_, inv_two_sigma2_, a);
      },
      [&](int64_t s, int64_t t) { return params_.emission(s, t); });
}

Matrix ResponsibilityAttention::predict_proba(const IdMatrix& contexts, const Matrix& queries) const {
  return predict_proba(
      encoder().encode(contexts, queries, IdVector::Zero(contexts.rows())));
}

namespace {
/// The VJPs differentiate with respect to real-valued queries. @throws ValueError for a batch of symbol queries.
void check_real_queries(const char* where, const char* what, const ResponsibilityAttentionBatch& batch) {
  if (batch.has_symbol_queries())
    throw ValueError(std::string(where) + ": " + what + " needs real-valued queries (symbol queries have no "
                     "gradient; give their one-hot rows instead)");
}

/// An incoming gradient of a VJP: every entry finite ("<where>: <name> must be finite (entry k is inf)").
void check_gradient(const char* where, const char* name, std::span<const double> g) {
  if (!g.empty()) check::finite_nonempty(where, name, g);
}

/// Row n of a VJP from the weights ω_i = ∂L/∂ℓ_i of its positions: ∂L/∂y_n += Σ_i ω_i g_i and
/// ∂L/∂K[c_i] −= ω_i g_i, with g_i = (K[c_i] − y)/σ² (one term per position, so a repeated symbol adds up).
void add_row_vjp(const double* K, const int64_t* ctx, const double* y, const double* omega, Index N, Index D,
                 double inv_sigma2, double* __restrict grad_y, Matrix& grad_K) {
  for (Index i = 0; i < N; ++i) {
    const double w = omega[i] * inv_sigma2;
    if (w == 0.0) continue;  // zero-weight positions (π_i = 0, B = 0, underflow) add nothing, never 0·∞
    const double* k = K + ctx[i] * D;
    double* __restrict gk = grad_K.data() + ctx[i] * D;
    for (Index d = 0; d < D; ++d) {
      const double wg = w * (k[d] - y[d]);
      grad_y[d] += wg;
      gk[d] -= wg;
    }
  }
}
}  // namespace

ResponsibilityAttentionVjp ResponsibilityAttention::log_density_vjp(const ResponsibilityAttentionBatch& batch,
                                                                    std::span<const double> grad_log_p) const {
  check_batch(batch);
  check_real_queries(kWhere, "log_density_vjp", batch);
  check::dimension(kWhere, "log_density_vjp gradient length", batch.n_rows(),
                   static_cast<Index>(grad_log_p.size()));
  check_gradient(kWhere, "log_density_vjp gradient", grad_log_p);
  const Index n_rows = batch.n_rows();
  const Index N = context_length();
  const Index D = query_dim();
  ResponsibilityAttentionVjp out{Matrix::Zero(n_rows, D), Matrix::Zero(n_symbols(), D)};
  const Tables m = tables_of(params_, key_sq_norm_, log_prior_, log_emission_, inv_two_sigma2_, gate_const_);
  const double inv_sigma2 = 1.0 / params_.sigma2;
  // ∂ log p/∂ℓ_i = r_i: the responsibilities of pass 1 (the bits of log_density), in blocks of rows.
  constexpr Index kBlockRows = 256;
  double* r = scratch<2>(static_cast<size_t>(kBlockRows * (N + 1)));  // [rows, N] then log p [rows]
  double* log_p = r + kBlockRows * N;
  std::vector<double> omega(static_cast<size_t>(N));
  for (Index begin = 0; begin < n_rows; begin += kBlockRows) {
    const Index count = std::min(kBlockRows, n_rows - begin);
    pass_one(m, float_tables_.get(), batch.slice(begin, count), r, log_p, kWhere);
    for (Index row = 0; row < count; ++row) {
      const Index n = begin + row;
      const double g = grad_log_p[static_cast<size_t>(n)];
      if (g == 0.0 || log_p[row] == kNegInf) continue;  // impossible rows: r = 0, a constant −∞ log density
      for (Index i = 0; i < N; ++i) omega[static_cast<size_t>(i)] = g * r[row * N + i];
      add_row_vjp(params_.key_means.data(), batch.context(n), batch.query(n), omega.data(), N, D, inv_sigma2,
                  out.queries.data() + n * D, out.key_means);
    }
  }
  return out;
}

ResponsibilityAttentionVjp ResponsibilityAttention::predict_proba_vjp(const ResponsibilityAttentionBatch& batch,
                                                                      const Matrix& grad_proba) const {
  check_batch(batch);
  check_real_queries(kWhere, "predict_proba_vjp", batch);
  check::dimension(kWhere, "predict_proba_vjp gradient rows", batch.n_rows(), grad_proba.rows());
  check::dimension(kWhere, "predict_proba_vjp gradient columns (T)", n_targets(), grad_proba.cols());
  check_gradient(kWhere, "predict_proba_vjp gradient", {grad_proba.data(), static_cast<size_t>(grad_proba.size())});
  const Index N = context_length();
  const Index D = query_dim();
  const Index T = n_targets();
  const double* K = params_.key_means.data();
  const double inv_sigma2 = 1.0 / params_.sigma2;
  ResponsibilityAttentionVjp out{Matrix::Zero(batch.n_rows(), D), Matrix::Zero(n_symbols(), D)};
  std::vector<double> a(static_cast<size_t>(N));
  std::vector<double> u(static_cast<size_t>(N));
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const int64_t* ctx = batch.context(n);
    row_gate(batch, n, params_.key_means, key_sq_norm_, log_prior_, inv_two_sigma2_, a.data());
    // ∂L/∂(logit_i) = a_i (u_i − ū), u_i = Σ_t G_t B[c_i, t] (the softmax Jacobian applied to u).
    const double* G = grad_proba.data() + n * T;
    double u_bar = 0.0;
    for (Index i = 0; i < N; ++i) {
      const double* B = params_.emission.data() + ctx[i] * T;
      double ui = 0.0;
      for (Index t = 0; t < T; ++t) ui += G[t] * B[t];
      u[i] = ui;
      u_bar += a[i] * ui;
    }
    for (Index i = 0; i < N; ++i) a[i] *= u[i] - u_bar;
    add_row_vjp(K, ctx, batch.query(n), a.data(), N, D, inv_sigma2, out.queries.data() + n * D, out.key_means);
  }
  return out;
}

ResponsibilityAttentionVjp ResponsibilityAttention::predict_proba_vjp(const IdMatrix& contexts, const Matrix& queries,
                                                                      const Matrix& grad_proba) const {
  return predict_proba_vjp(encoder().encode(contexts, queries, IdVector::Zero(contexts.rows())), grad_proba);
}

ResponsibilityAttentionAccumulator ResponsibilityAttention::make_accumulator() const {
  return {n_symbols(), context_length(), query_dim(), n_targets()};
}

ResponsibilityAttentionEstimator ResponsibilityAttention::estimator() const {
  ResponsibilityAttentionEstimatorOptions options;
  options.sigma2 = params_.sigma2;
  options.name = params_.name;
  options.precision = precision_;
  return {n_symbols(), context_length(), query_dim(), n_targets(), options};
}

ResponsibilityAttentionEncoder ResponsibilityAttention::encoder() const {
  return {n_symbols(), context_length(), query_dim(), n_targets()};
}

ResponsibilityAttentionSampler ResponsibilityAttention::sampler(uint64_t seed) const { return {*this, seed}; }

}  // namespace attnmix
