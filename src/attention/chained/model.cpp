// SPDX-License-Identifier: Apache-2.0
// Chained attention: the model, exact forward–backward and the E-step (docs/mechanisms.md#chained-attention).
//
// Per row, with gate weights W_ℓ(i, j) = E⁽ℓ⁺¹⁾[v_i][k_j] = exp(G⁽ℓ⁺¹⁾[v_i][k_j] − max_s G⁽ℓ⁺¹⁾[v_i][s]) (the
// model's precomputed table), r_ℓ(i) = 1 / Σ_j W_ℓ(i, j), A_ℓ(i, j) = r_ℓ(i) W_ℓ(i, j) and f(j) = B[v_j, t]:
//   α_0 = softmax_j(G⁽⁰⁾[q][k_j]);  α_{ℓ+1}(j) = Σ_i (α_ℓ(i) r_ℓ(i)) W_ℓ(i, j);  p = Σ_j α_{L−1}(j) f(j)
//   β_{L−1} = f;  β_ℓ(i) = r_ℓ(i) Σ_j W_ℓ(i, j) β_{ℓ+1}(j);  γ_ℓ = α_ℓ β_ℓ / p
//   ξ_ℓ(i, j) = (α_ℓ(i) r_ℓ(i) / p) · W_ℓ(i, j) β_{ℓ+1}(j)      (formed row by row during the backward pass)
// Gathering the table instead of exponentiating the row's logits gives the row's softmax to rounding as long as no
// gathered weight underflowed (all ≥ 2^−1022: then the row-local exp(x_j − max_row) is normal too); a row i with an
// underflowed weight (its keys all far below u's best key) is exponentiated row-locally instead.
// Every α_ℓ is a probability vector (A_ℓ is row-stochastic), so the forward pass needs no rescaling. Entries that
// underflow below 1e-308 carry at most L·N·1e-308 of absolute error into p, so for p ≥ 1e-250 the probability-space
// result meets any relative tolerance above 1e-50; rows with p < 1e-250 (including p = 0) are recomputed in log
// space, where log p = −∞ exactly when f(j) = 0 for every j.
// Two layouts, both with fixed summation orders (results never depend on the chunking or the thread count):
// * E-step on contexts of N ≤ 32 (accumulate_block): eight rows at once, one per vector lane, all arithmetic
//   lane-wise; rows whose p < 1e-250 are redone one by one after the block.
// * Otherwise (log_density, posterior, predict_proba, long contexts): one row at a time, with W, α, β, γ and f rows
//   padded to P = N rounded up to 8 with zeros, 64-byte aligned, so axpys, dot products and ξ rows run on
//   eight-lane vectors.
// ξ is never stored in the E-step: each ξ_ℓ(i, ·) is formed in the backward pass and added straight into key_num.
// Cost per row: (L−1)·N² table gathers (no exponentials), O(L·N²) multiply-adds and (L−1)·N² + O(L·N) scalar
// scatter-adds into the statistics; scratch O(L·N²). The model holds the L·S² weights beside the L·S² logits.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "attnmix/attention/chained.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"
#include "../lanes_impl.hpp"

namespace attnmix {

namespace {

constexpr double kRescueBelow = 1e-250;  // rows with p below this are recomputed in log space

using lanes::broadcast;
using lanes::horizontal_sum;
using lanes::horizontal_sums;
using lanes::kLanes;
using lanes::Lanes;
using lanes::load;
using lanes::store;

/// Σ_j x[j] y[j] over P = k·8 padded entries: lane-wise products summed block by block, then horizontal_sum.
inline double dot(const double* x, const double* y, Index P) {
  Lanes total{};
  for (Index b = 0; b < P; b += kLanes) total += load(x + b) * load(y + b);
  return horizontal_sum(total);
}

/// Zero-initialised doubles on 64-byte boundaries (a padded row is whole cache lines).
class AlignedArray {
 public:
  explicit AlignedArray(Index n)
      : data_(static_cast<double*>(::operator new[](static_cast<size_t>(std::max<Index>(n, 1)) * sizeof(double),
                                                    std::align_val_t{64}))) {
    std::fill(data_.get(), data_.get() + std::max<Index>(n, 1), 0.0);
  }
  [[nodiscard]] double* get() const noexcept { return data_.get(); }

 private:
  struct Free {
    void operator()(double* p) const noexcept { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<double[], Free> data_;
};

/// One observation's ids.
struct Row {
  const int64_t* keys;
  const int64_t* values;
  int64_t query;
  int64_t target;
};

Row row_of(const ChainedAttentionBatch& batch, Index n) {
  return {batch.keys(n), batch.values(n), batch.query(n), batch.target(n)};
}

/// Scratch of one row's forward–backward, reused across rows. Padded rows have P entries, the last P − N zero.
/// trans holds W_ℓ (or, on the rescue path, log A_ℓ) for ℓ = 0..L−2, row i of hop ℓ at (ℓ·N + i)·P.
struct Workspace {
  Index L, N, P;
  AlignedArray trans, alpha, beta, gamma, f, row, colsum;
  AlignedArray inv_total;  // r_ℓ(i) [L−1, P] (1 beyond N)
  AlignedArray terms;      // [N, P]: W_ℓ(i, j) β_{ℓ+1}(j) of the current hop
  AlignedArray sums;       // [N, 8]: lane-wise partial sums of one row each
  std::vector<double> xi;         // ξ_ℓ [L−1, N, N] (posterior and rescue path only)
  std::vector<double> tmp;        // [N] (rescue path)
  std::vector<int64_t> key_row;   // k_j·S, the offset of key_num row k_j
  Workspace(Index hops, Index positions)
      : L(hops),
        N(positions),
        P((positions + kLanes - 1) / kLanes * kLanes),
        trans((hops - 1) * positions * P),
        alpha(hops * P),
        beta(hops * P),
        gamma(hops * P),
        f(P),
        row(P),
        colsum(std::max<Index>(hops - 1, 1) * P),
        inv_total(std::max<Index>(hops - 1, 1) * P),
        terms(positions * P),
        sums(positions * kLanes),
        xi(static_cast<size_t>((hops - 1) * positions * positions)),
        tmp(static_cast<size_t>(positions)),
        key_row(static_cast<size_t>(positions)) {}
  double* W(Index hop, Index i) const { return trans.get() + (hop * N + i) * P; }
  double* r(Index hop) const { return inv_total.get() + hop * P; }
  double* t(Index i) const { return terms.get() + i * P; }
  double* sum(Index i) const { return sums.get() + i * kLanes; }
  double* a(Index hop) const { return alpha.get() + hop * P; }
  double* b(Index hop) const { return beta.get() + hop * P; }
  double* g(Index hop) const { return gamma.get() + hop * P; }
  double* x(Index hop) { return xi.data() + hop * N * N; }
};

/// Lanes b..b+7 of table[keys[·]], zero beyond N, and whether any gathered entry (j < N) is below 2^−1022.
[[gnu::always_inline]] inline Lanes gather(const double* table, const int64_t* keys, Index b, Index N, bool& underflow) {
#if defined(__AVX512F__)
  const auto valid = static_cast<__mmask8>(N - b >= kLanes ? 0xFF : (1u << (N - b)) - 1u);
  const __m512i index = _mm512_maskz_loadu_epi64(valid, keys + b);
  const __m512d v = _mm512_mask_i64gather_pd(_mm512_setzero_pd(), valid, index, table, sizeof(double));
  underflow |= _mm512_mask_cmp_pd_mask(valid, v, _mm512_set1_pd(DBL_MIN), _CMP_LT_OQ) != 0;
  return reinterpret_cast<const Lanes&>(v);
#else
  Lanes v{};
  for (Index l = 0; l < kLanes && b + l < N; ++l) {
    v[l] = table[keys[b + l]];
    underflow |= v[l] < DBL_MIN;
  }
  return v;
#endif
}

/// W[j] ∝ softmax_j(G⁽ℓ⁾[u][k_j]) for j < N (entries N..P zero); returns the lane-wise partial sums of W (their
/// horizontal sum is the normaliser). W is gathered from the model's gate weights unless one of them underflowed,
/// in which case W[j] = exp(G⁽ℓ⁾[u][k_j] − max_j′ G⁽ℓ⁾[u][k_j′]).
[[gnu::always_inline]] inline Lanes gate_weights(const ChainedAttention& m, Index hop, int64_t u, const int64_t* keys,
                                                Index N, Index P, double* W) {
  const double* E = m.gate_weights(hop, u);
  bool underflow = false;
  Lanes total{};
  for (Index b = 0; b < P; b += kLanes) {
    const Lanes v = gather(E, keys, b, N, underflow);
    store(W + b, v);
    total += v;
  }
  if (underflow) {
    const double* logits = m.gate_logits(hop, u);
    double top = kNegInf;
    for (Index j = 0; j < N; ++j) top = std::max(top, logits[keys[j]]);
    for (Index j = 0; j < N; ++j) W[j] = std::exp(logits[keys[j]] - top);
    total = Lanes{};
    for (Index b = 0; b < P; b += kLanes) total += load(W + b);
  }
  return total;
}

/// out[j] = log-softmax_j(logits[keys[j]]).
void log_softmax_gather(const double* logits, const int64_t* keys, Index N, double* out) {
  double top = kNegInf;
  for (Index j = 0; j < N; ++j) {
    out[j] = logits[keys[j]];
    top = std::max(top, out[j]);
  }
  double total = 0.0;
  for (Index j = 0; j < N; ++j) total += std::exp(out[j] - top);
  const double shift = top + std::log(total);
  for (Index j = 0; j < N; ++j) out[j] -= shift;
}

/// LSE over x[0..n) (−∞ when every entry is −∞).
double lse(const double* x, Index n) {
  double top = kNegInf;
  for (Index k = 0; k < n; ++k) top = std::max(top, x[k]);
  if (top == kNegInf) return kNegInf;
  double total = 0.0;
  for (Index k = 0; k < n; ++k) total += std::exp(x[k] - top);
  return top + std::log(total);
}

/// Forward pass in probability space: α_ℓ for every hop, W_ℓ and r_ℓ for ℓ = 0..L−2.
void forward(const ChainedAttention& m, const Row& x, Workspace& ws) {
  const Index N = ws.N;
  const Index P = ws.P;
  double* a0 = ws.a(0);
  const Lanes r0 = broadcast(1.0 / horizontal_sum(gate_weights(m, 0, x.query, x.keys, N, P, a0)));
  for (Index b = 0; b < P; b += kLanes) store(a0 + b, load(a0 + b) * r0);
  for (Index hop = 0; hop + 1 < ws.L; ++hop) {
    const double* from = ws.a(hop);
    double* r = ws.r(hop);
    double* to = ws.a(hop + 1);
    for (Index i = 0; i < N; ++i) store(ws.sum(i), gate_weights(m, hop + 1, x.values[i], x.keys, N, P, ws.W(hop, i)));
    for (Index i = 0; i < N; i += kLanes)  // r_ℓ(i) = 1 / Σ_j W_ℓ(i, j); 1 beyond N
      store(r + i, 1.0 / horizontal_sums(ws.sum(i), std::min(kLanes, N - i), 1.0));
    for (Index b = 0; b < P; b += kLanes) {  // α_{ℓ+1} = Σ_i (α_ℓ(i) r_ℓ(i)) W_ℓ(i, ·), one block at a time
      Lanes total{};
      for (Index i = 0; i < N; ++i) total += broadcast(from[i] * r[i]) * load(ws.W(hop, i) + b);
      store(to + b, total);
    }
  }
}

/// Probability-space backward pass given forward() and p = Σ α_{L−1} f ≥ 1e-250: β and γ for every hop, and
/// visit_xi(ℓ, i, c, t) for every hop ℓ ≤ L−2 and position i with ξ_ℓ(i, j) = c · t[j] (t padded; c may be 0).
template <class VisitXi>
void backward(Workspace& ws, double p, VisitXi&& visit_xi) {
  const Index N = ws.N;
  const Index P = ws.P;
  const double inv_p = 1.0 / p;
  std::copy(ws.f.get(), ws.f.get() + P, ws.b(ws.L - 1));
  for (Index hop = ws.L - 2; hop >= 0; --hop) {
    const double* next = ws.b(hop + 1);
    const double* r = ws.r(hop);
    double* beta = ws.b(hop);
    for (Index i = 0; i < N; ++i) {  // t_i(j) = W_ℓ(i, j) β_{ℓ+1}(j)
      const double* Wi = ws.W(hop, i);
      double* ti = ws.t(i);
      Lanes total{};
      for (Index b = 0; b < P; b += kLanes) {
        const Lanes tb = load(Wi + b) * load(next + b);
        store(ti + b, tb);
        total += tb;
      }
      store(ws.sum(i), total);
    }
    for (Index i = 0; i < N; i += kLanes)  // β_ℓ(i) = r_ℓ(i) Σ_j t_i(j); zero beyond N
      store(beta + i, load(r + i) * horizontal_sums(ws.sum(i), std::min(kLanes, N - i), 0.0));
    const double* alpha = ws.a(hop);
    for (Index i = 0; i < N; ++i) visit_xi(hop, i, alpha[i] * r[i] * inv_p, static_cast<const double*>(ws.t(i)));
  }
  const Lanes scale = broadcast(inv_p);
  for (Index hop = 0; hop < ws.L; ++hop)
    for (Index b = 0; b < P; b += kLanes) store(ws.g(hop) + b, load(ws.a(hop) + b) * load(ws.b(hop) + b) * scale);
}

/// Log-space forward–backward (the rescue path): returns log p; fills γ and ξ when want_posterior and log p > −∞.
double forward_backward_log(const ChainedAttention& m, const Row& x, Workspace& ws, bool want_posterior) {
  const Index N = ws.N;
  const Index L = ws.L;
  const ConstMatrixMap B(m.emission().data(), m.n_symbols(), m.n_targets());
  std::vector<double>& tmp = ws.tmp;
  std::vector<double> log_f(static_cast<size_t>(N));
  for (Index j = 0; j < N; ++j) log_f[static_cast<size_t>(j)] = std::log(B(x.values[j], x.target));
  log_softmax_gather(m.gate_logits(0, x.query), x.keys, N, ws.a(0));
  for (Index hop = 0; hop + 1 < L; ++hop) {
    for (Index i = 0; i < N; ++i) log_softmax_gather(m.gate_logits(hop + 1, x.values[i]), x.keys, N, ws.W(hop, i));
    for (Index j = 0; j < N; ++j) {
      for (Index i = 0; i < N; ++i) tmp[static_cast<size_t>(i)] = ws.a(hop)[i] + ws.W(hop, i)[j];
      ws.a(hop + 1)[j] = lse(tmp.data(), N);
    }
  }
  for (Index j = 0; j < N; ++j) tmp[static_cast<size_t>(j)] = ws.a(L - 1)[j] + log_f[static_cast<size_t>(j)];
  const double log_p = lse(tmp.data(), N);
  if (!want_posterior || log_p == kNegInf) return log_p;

  std::copy(log_f.begin(), log_f.end(), ws.b(L - 1));
  for (Index hop = L - 2; hop >= 0; --hop) {
    for (Index i = 0; i < N; ++i) {
      for (Index j = 0; j < N; ++j) tmp[static_cast<size_t>(j)] = ws.W(hop, i)[j] + ws.b(hop + 1)[j];
      ws.b(hop)[i] = lse(tmp.data(), N);
    }
  }
  for (Index hop = 0; hop < L; ++hop)
    for (Index i = 0; i < N; ++i) ws.g(hop)[i] = std::exp(ws.a(hop)[i] + ws.b(hop)[i] - log_p);
  for (Index hop = 0; hop + 1 < L; ++hop)
    for (Index i = 0; i < N; ++i)
      for (Index j = 0; j < N; ++j)
        ws.x(hop)[i * N + j] = std::exp(ws.a(hop)[i] + ws.W(hop, i)[j] + ws.b(hop + 1)[j] - log_p);
  return log_p;
}

/// Forward pass and p = Σ_j α_{L−1}(j) f(j) (f filled, padded).
double forward_p(const ChainedAttention& m, const Row& x, Workspace& ws) {
  const ConstMatrixMap B(m.emission().data(), m.n_symbols(), m.n_targets());
  forward(m, x, ws);
  for (Index j = 0; j < ws.N; ++j) ws.f.get()[j] = B(x.values[j], x.target);
  return dot(ws.a(ws.L - 1), ws.f.get(), ws.P);
}

/// log p of one row. With want_posterior, also γ (in ws.g, stride P) and ξ (ws.xi) when log p > −∞.
double forward_backward(const ChainedAttention& m, const Row& x, Workspace& ws, bool want_posterior) {
  const double p = forward_p(m, x, ws);
  if (!(p >= kRescueBelow)) return forward_backward_log(m, x, ws, want_posterior);
  if (want_posterior) {
    const Index N = ws.N;
    backward(ws, p, [&](Index hop, Index i, double c, const double* t) {
      double* out = ws.x(hop) + i * N;
      for (Index j = 0; j < N; ++j) out[j] = c * t[j];
    });
  }
  return std::log(p);
}

/// True when B[v_j, t] = 0 for every position: log p = −∞ whatever the gates (docs/mechanisms.md#chained-attention).
bool impossible(const ChainedAttention& m, const Row& x, Index N) {
  const ConstMatrixMap B(m.emission().data(), m.n_symbols(), m.n_targets());
  for (Index j = 0; j < N; ++j)
    if (B(x.values[j], x.target) > 0.0) return false;
  return true;
}

/// Adds the hop-0 and emission statistics of one row from γ [L, gamma_stride] (docs/mechanisms.md#chained-attention).
void scatter_ends(const Row& x, double w, Index N, const double* gamma, Index gamma_stride,
                  ChainedAttentionAccumulator& acc) {
  const Index L = acc.n_hops();
  MatrixMap key_mass = acc.key_mass();
  MatrixMap key_num0 = acc.key_num(0);
  for (Index i = 0; i < N; ++i) {
    const double wg = w * gamma[i];
    key_num0(x.keys[i], x.query) += wg;
    key_mass(0, x.keys[i]) += wg;
  }
  MatrixMap emission = acc.emission_count();
  const double* last = gamma + (L - 1) * gamma_stride;
  for (Index j = 0; j < N; ++j) emission(x.values[j], x.target) += w * last[j];
}

/// Adds one row's weighted statistics (docs/mechanisms.md#chained-attention) from γ [L, gamma_stride] and ξ [L−1, N,
/// N].
void scatter(const Row& x, double w, Index N, const double* gamma, Index gamma_stride, const double* xi,
             ChainedAttentionAccumulator& acc) {
  scatter_ends(x, w, N, gamma, gamma_stride, acc);
  MatrixMap key_mass = acc.key_mass();
  for (Index hop = 1; hop < acc.n_hops(); ++hop) {
    MatrixMap key_num = acc.key_num(hop);
    const double* xi_hop = xi + (hop - 1) * N * N;
    for (Index i = 0; i < N; ++i) {
      const int64_t u = x.values[i];
      for (Index j = 0; j < N; ++j) {
        const double wx = w * xi_hop[i * N + j];
        key_num(x.keys[j], u) += wx;
        key_mass(hop, x.keys[j]) += wx;
      }
    }
  }
}

/// The E-step of one row with w > 0: log p, and its statistics added to acc. The probability-space path forms each
/// ξ row in the backward pass and adds it straight into key_num (no ξ matrix is stored); key_mass[ℓ][k_j] gets
/// Σ_i w ξ_{ℓ−1}(i, j) once per position.
double accumulate_row(const ChainedAttention& m, const Row& x, double w, Workspace& ws,
                      ChainedAttentionAccumulator& acc) {
  const Index N = ws.N;
  const Index P = ws.P;
  const double p = forward_p(m, x, ws);
  if (!(p >= kRescueBelow)) {
    const double log_p = forward_backward_log(m, x, ws, /*want_posterior=*/true);
    scatter(x, w, N, ws.gamma.get(), P, ws.xi.data(), acc);
    return log_p;
  }
  const Index S = acc.n_symbols();
  for (Index j = 0; j < N; ++j) ws.key_row[static_cast<size_t>(j)] = x.keys[j] * S;
  std::fill(ws.colsum.get(), ws.colsum.get() + (ws.L - 1) * P, 0.0);
  double* key_num = acc.key_num(0).data();  // [L, S, S] row-major: key_num[ℓ][s][u] at (ℓ·S + s)·S + u
  backward(ws, p, [&](Index hop, Index i, double c, const double* t) {
    const double wc = w * c;
    if (wc == 0.0) return;  // adding +0 changes nothing
    double* xi = ws.row.get();  // t is ws.row too: scaled in place
    double* colsum = ws.colsum.get() + hop * P;
    const Lanes scale = broadcast(wc);
    for (Index b = 0; b < P; b += kLanes) {
      const Lanes xb = load(t + b) * scale;  // w ξ_ℓ(i, j)
      store(xi + b, xb);
      store(colsum + b, load(colsum + b) + xb);
    }
    double* column = key_num + (hop + 1) * S * S + x.values[i];  // key_num[ℓ+1][·][v_i]
    const int64_t* rows = ws.key_row.data();
    for (Index j = 0; j < N; ++j) column[rows[j]] += xi[j];
  });
  MatrixMap key_mass = acc.key_mass();
  for (Index hop = 1; hop < ws.L; ++hop) {
    const double* colsum = ws.colsum.get() + (hop - 1) * P;
    for (Index j = 0; j < N; ++j) key_mass(hop, x.keys[j]) += colsum[j];
  }
  scatter_ends(x, w, N, ws.gamma.get(), P, acc);
  return std::log(p);
}

// ---- Eight rows at a time ----------------------------------------------------------------------------------------
// For short contexts (N ≤ kBlockMaxN) the E-step runs the same recursions on eight rows at once, one row per lane:
// every operation is lane-wise (no sums across lanes), so a row's numbers do not depend on the rows beside it, the
// N-term sums have no horizontal reductions, and eight independent dependency chains hide the latencies that
// dominate one short row. Scratch is O(L·N²·8) doubles. Rows whose p falls below 1e-250 go through
// accumulate_row (log space) after the block.

constexpr Index kBlockMaxN = 32;
using LaneIds = int64_t __attribute__((vector_size(kLanes * sizeof(int64_t))));

/// table[index[l]] in lane l.
[[gnu::always_inline]] inline Lanes gather_lanes(const double* table, LaneIds index) {
#if defined(__AVX512F__)
  const __m512d v = _mm512_i64gather_pd(reinterpret_cast<const __m512i&>(index), table, sizeof(double));
  return reinterpret_cast<const Lanes&>(v);
#else
  Lanes v;
  for (Index l = 0; l < kLanes; ++l) v[l] = table[index[l]];
  return v;
#endif
}

/// Scratch of one block; every entry is a vector of eight lanes (one per row).
struct BlockWorkspace {
  Index L, N;
  AlignedArray weight, inv_total, alpha, beta, f, xi, colsum;
  std::vector<LaneIds> keys, values;
  BlockWorkspace(Index hops, Index positions)
      : L(hops),
        N(positions),
        weight(std::max<Index>(hops - 1, 1) * positions * positions * kLanes),
        inv_total(std::max<Index>(hops - 1, 1) * positions * kLanes),
        alpha(hops * positions * kLanes),
        beta(hops * positions * kLanes),
        f(positions * kLanes),
        xi(positions * positions * kLanes),
        colsum(positions * kLanes),
        keys(static_cast<size_t>(positions)),
        values(static_cast<size_t>(positions)) {}
  double* W(Index hop, Index i, Index j) const { return weight.get() + ((hop * N + i) * N + j) * kLanes; }
  double* r(Index hop, Index i) const { return inv_total.get() + (hop * N + i) * kLanes; }
  double* a(Index hop, Index j) const { return alpha.get() + (hop * N + j) * kLanes; }
  double* b(Index hop, Index j) const { return beta.get() + (hop * N + j) * kLanes; }
  double* x(Index i, Index j) const { return xi.get() + (i * N + j) * kLanes; }
  double* c(Index j) const { return colsum.get() + j * kLanes; }
};

/// W[j] (lanes, j < N) ∝ the hop-ℓ gate of query ids u over the block's keys; returns 1 / Σ_j W[j] (lanes). A lane
/// with an underflowed gathered weight is recomputed row-locally, as in gate_weights().
Lanes block_gate(const ChainedAttention& m, Index hop, LaneIds u, const BlockWorkspace& bw, double* W) {
  const Index N = bw.N;
  const double* E = m.gate_weights(hop, 0);  // [S, S] row-major: E⁽ℓ⁾[u][s] at u·S + s
  const LaneIds row = u * m.n_symbols();
  LaneIds underflow{};
  Lanes total{};
  for (Index j = 0; j < N; ++j) {
    const Lanes v = gather_lanes(E, row + bw.keys[static_cast<size_t>(j)]);
    store(W + j * kLanes, v);
    underflow |= v < broadcast(DBL_MIN);
    total += v;
  }
  for (Index l = 0; l < kLanes; ++l) {
    if (underflow[l] == 0) continue;
    const double* logits = m.gate_logits(hop, u[l]);
    double top = kNegInf;
    for (Index j = 0; j < N; ++j) top = std::max(top, logits[bw.keys[static_cast<size_t>(j)][l]]);
    double lane_total = 0.0;
    for (Index j = 0; j < N; ++j)
      lane_total += (W[j * kLanes + l] = std::exp(logits[bw.keys[static_cast<size_t>(j)][l]] - top));
    total[l] = lane_total;
  }
  return 1.0 / total;
}

/// The E-step of count ≤ 8 rows with positive weight (rows[0..count)), in row order; log p to log_p_out if given.
void accumulate_block(const ChainedAttention& m, const ChainedAttentionBatch& batch, const Index* rows, Index count,
                      std::span<const double> w, std::span<double> log_p_out, Workspace& ws, BlockWorkspace& bw,
                      ChainedAttentionAccumulator& acc) {
  const Index N = bw.N;
  const Index L = bw.L;
  const Index S = m.n_symbols();
  Row x[kLanes];
  LaneIds query;
  LaneIds target;
  for (Index l = 0; l < kLanes; ++l) {  // spare lanes repeat the first row; their results are dropped
    x[l] = row_of(batch, rows[l < count ? l : 0]);
    query[l] = x[l].query;
    target[l] = x[l].target;
  }
  for (Index j = 0; j < N; ++j)
    for (Index l = 0; l < kLanes; ++l) {
      bw.keys[static_cast<size_t>(j)][l] = x[l].keys[j];
      bw.values[static_cast<size_t>(j)][l] = x[l].values[j];
    }

  // Forward: α_0, then α_{ℓ+1}(j) = Σ_i (α_ℓ(i) r_ℓ(i)) W_ℓ(i, j).
  const Lanes r0 = block_gate(m, 0, query, bw, bw.a(0, 0));
  for (Index j = 0; j < N; ++j) store(bw.a(0, j), load(bw.a(0, j)) * r0);
  for (Index hop = 0; hop + 1 < L; ++hop) {
    for (Index i = 0; i < N; ++i)
      store(bw.r(hop, i), block_gate(m, hop + 1, bw.values[static_cast<size_t>(i)], bw, bw.W(hop, i, 0)));
    for (Index j = 0; j < N; ++j) store(bw.a(hop + 1, j), Lanes{});
    for (Index i = 0; i < N; ++i) {
      const Lanes c = load(bw.a(hop, i)) * load(bw.r(hop, i));
      for (Index j = 0; j < N; ++j) store(bw.a(hop + 1, j), load(bw.a(hop + 1, j)) + c * load(bw.W(hop, i, j)));
    }
  }
  const LaneIds target_column = target;
  Lanes p{};
  for (Index j = 0; j < N; ++j) {
    const Lanes fj = gather_lanes(m.emission().data(), bw.values[static_cast<size_t>(j)] * m.n_targets() + target_column);
    store(bw.f.get() + j * kLanes, fj);
    p += load(bw.a(L - 1, j)) * fj;
  }
  Lanes weight{};  // w_n, or 0 in spare lanes and lanes left to the log-space rescue
  for (Index l = 0; l < count; ++l)
    if (p[l] >= kRescueBelow) weight[l] = w[static_cast<size_t>(rows[l])];
  const Lanes inv_p = weight != 0.0 ? 1.0 / p : Lanes{};

  // Backward with ξ formed row by row and scattered per hop (key_num[ℓ] are disjoint across hops).
  for (Index j = 0; j < N; ++j) store(bw.b(L - 1, j), load(bw.f.get() + j * kLanes));
  double* key_num = acc.key_num(0).data();
  MatrixMap key_mass = acc.key_mass();
  for (Index hop = L - 2; hop >= 0; --hop) {
    for (Index j = 0; j < N; ++j) store(bw.c(j), Lanes{});
    for (Index i = 0; i < N; ++i) {
      Lanes total{};
      for (Index j = 0; j < N; ++j) {
        const Lanes t = load(bw.W(hop, i, j)) * load(bw.b(hop + 1, j));  // W_ℓ(i, j) β_{ℓ+1}(j)
        store(bw.x(i, j), t);
        total += t;
      }
      const Lanes r = load(bw.r(hop, i));
      store(bw.b(hop, i), r * total);
      const Lanes c = weight * (load(bw.a(hop, i)) * r * inv_p);
      for (Index j = 0; j < N; ++j) {
        const Lanes xw = c * load(bw.x(i, j));  // w ξ_ℓ(i, j)
        store(bw.x(i, j), xw);
        store(bw.c(j), load(bw.c(j)) + xw);
      }
    }
    for (Index l = 0; l < count; ++l) {
      if (weight[l] == 0.0) continue;
      for (Index i = 0; i < N; ++i) {
        double* column = key_num + (hop + 1) * S * S + x[l].values[i];  // key_num[ℓ+1][·][v_i]
        for (Index j = 0; j < N; ++j) column[x[l].keys[j] * S] += bw.x(i, j)[l];
      }
      for (Index j = 0; j < N; ++j) key_mass(hop + 1, x[l].keys[j]) += bw.c(j)[l];
    }
  }

  // Hop 0, emission, ll and n of the probability-space lanes, in row order; then the rescued rows.
  MatrixMap key_num0 = acc.key_num(0);
  MatrixMap emission = acc.emission_count();
  for (Index l = 0; l < count; ++l) {
    if (weight[l] == 0.0) continue;
    const double wl = weight[l];
    for (Index i = 0; i < N; ++i) {
      const double wg = wl * (bw.a(0, i)[l] * bw.b(0, i)[l] * inv_p[l]);
      key_num0(x[l].keys[i], x[l].query) += wg;
      key_mass(0, x[l].keys[i]) += wg;
    }
    for (Index j = 0; j < N; ++j)
      emission(x[l].values[j], x[l].target) += wl * (bw.a(L - 1, j)[l] * bw.b(L - 1, j)[l] * inv_p[l]);
    const double log_p = std::log(p[l]);
    acc.ll() += wl * log_p;
    acc.n() += wl;
    if (!log_p_out.empty()) log_p_out[static_cast<size_t>(rows[l])] = log_p;
  }
  for (Index l = 0; l < count; ++l) {
    if (weight[l] != 0.0) continue;
    const double wl = w[static_cast<size_t>(rows[l])];
    const double log_p = accumulate_row(m, x[l], wl, ws, acc);
    acc.ll() += wl * log_p;
    acc.n() += wl;
    if (!log_p_out.empty()) log_p_out[static_cast<size_t>(rows[l])] = log_p;
  }
}

}  // namespace

void ChainedAttentionAccumulator::initialize(const ChainedAttentionBatch& batch, std::span<const double> w, Rng& rng) {
  initialize_shard(batch, w, rng, 0, 0);
}

void ChainedAttentionAccumulator::initialize_shard(const ChainedAttentionBatch& batch, std::span<const double> w,
                                                   Rng& rng, Index rows_before, Index rows_after) {
  check::weights(kWhere, w, batch.n_rows());
  const Index n_rows = batch.n_rows();
  if (n_rows > 0 && (batch.max_symbol() >= S_ || batch.max_target() >= T_))
    throw ValueError(std::string(kWhere) + ": out-of-range ID in batch for S = " + std::to_string(S_) +
                     ", T = " + std::to_string(T_));
  const Index N = batch.context_length();
  // Every draw is made for every row of [rows_before; batch; rows_after] whatever its weight, hop-major: segment k
  // holds γ_k of all rows (k < L, N entries per row), then segment L + ℓ holds ξ_ℓ of all rows (ℓ ≤ L − 2, N²
  // entries per row). Nothing is stored: one copy of the stream per segment is advanced (without logs) to the
  // batch's first row in that segment, and the batch's rows are then drawn row by row, every segment's copy in turn,
  // each row scattered just after its draws. The draws and the order of the additions are those of the hop-major
  // stream; rng ends where the last segment ends (the last copy, past the rows after the batch). Memory: one row's
  // draws and 2L − 1 stream states.
  const Index segments = L_ > 1 ? 2 * L_ - 1 : 1;
  const auto entries = [&](Index segment) { return segment < L_ ? N : N * N; };
  std::vector<Rng> cursors;
  cursors.reserve(static_cast<size_t>(segments));
  for (Index segment = 0; segment < segments; ++segment) {
    rng.discard_dirichlet_ones(rows_before, entries(segment));
    cursors.push_back(rng);
    if (segment + 1 < segments) rng.discard_dirichlet_ones(n_rows + rows_after, entries(segment));
  }
  std::vector<double> gamma(static_cast<size_t>(L_ * N));                         // one row's [hop, N]
  std::vector<double> xi(static_cast<size_t>((L_ > 1 ? L_ - 1 : 0) * N * N));  // one row's [hop, N, N]
  for (Index n = 0; n < n_rows; ++n) {
    for (Index hop = 0; hop < L_; ++hop)
      cursors[static_cast<size_t>(hop)].dirichlet_ones({gamma.data() + hop * N, static_cast<size_t>(N)});
    for (Index hop = 0; hop + 1 < L_; ++hop)
      cursors[static_cast<size_t>(L_ + hop)].dirichlet_ones({xi.data() + hop * N * N, static_cast<size_t>(N * N)});
    const double wn = w[static_cast<size_t>(n)];
    if (wn == 0.0) continue;
    scatter(row_of(batch, n), wn, N, gamma.data(), N, xi.data(), *this);
    this->n() += wn;
  }
  rng = cursors.back();
  rng.discard_dirichlet_ones(rows_after, entries(segments - 1));
}

ChainedAttention::ChainedAttention(ChainedAttentionParams params) : params_(std::move(params)) {
  const auto& tables = params_.key_tables;
  if (tables.empty())
    throw ValueError(std::string(kWhere) + ": keys must be a non-empty (L, S, S) array (got L = 0)");
  const Index S = tables.front().rows();
  for (size_t hop = 0; hop < tables.size(); ++hop) {
    const Matrix& K = tables[hop];
    if (K.rows() != S || K.cols() != S || S == 0)
      throw ValueError(std::string(kWhere) + ": keys must be an (L, S, S) array with S >= 1 (table " +
                       std::to_string(hop) + " is " + std::to_string(K.rows()) + "x" + std::to_string(K.cols()) +
                       ", expected " + std::to_string(S) + "x" + std::to_string(S) + ")");
    check::bounded_reals(kWhere, "keys", {K.data(), static_cast<size_t>(K.size())});
  }
  check::row_simplex(kWhere, "emission", params_.emission, S);
  check::variance(kWhere, "sigma2", params_.sigma2);

  const Index L = n_hops();
  const double inv_two_sigma2 = 1.0 / (2.0 * params_.sigma2);
  gate_logits_.resize(L * S, S);
  for (Index hop = 0; hop < L; ++hop) {
    const Matrix& K = tables[static_cast<size_t>(hop)];
    const Vector rho = K.rowwise().squaredNorm();
    for (Index u = 0; u < S; ++u)
      for (Index s = 0; s < S; ++s) gate_logits_(hop * S + u, s) = (2.0 * K(s, u) - rho[s]) * inv_two_sigma2;
  }
  // Finite logits make every gate a proper softmax, so log p = −∞ only for impossible evidence
  // (docs/mechanisms.md#chained-attention).
  if (!gate_logits_.allFinite())
    throw ValueError(std::string(kWhere) + ": keys and sigma2 must give finite gate logits (2 K[s,u] - ||K[s]||^2) / "
                     "(2 sigma2); the keys are too large for this sigma2");
  gate_weights_.resize(L * S, S);  // std::exp, not Eigen's packet exp (which clamps instead of underflowing to 0)
  for (Index row = 0; row < L * S; ++row) {
    const double top = gate_logits_.row(row).maxCoeff();
    for (Index s = 0; s < S; ++s) gate_weights_(row, s) = std::exp(gate_logits_(row, s) - top);
  }
}

void ChainedAttention::check_batch(const ChainedAttentionBatch& batch) const {
  if (batch.n_rows() == 0) return;
  if (batch.max_symbol() >= n_symbols())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in keys, values or query (" +
                     std::to_string(batch.max_symbol()) + " >= S = " + std::to_string(n_symbols()) + ")");
  if (batch.max_target() >= n_targets())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in target (" + std::to_string(batch.max_target()) +
                     " >= T = " + std::to_string(n_targets()) + ")");
}

void ChainedAttention::log_density(const ChainedAttentionBatch& batch, std::span<double> out) const {
  check_batch(batch);
  check::dimension(kWhere, "log-density output length", batch.n_rows(), static_cast<Index>(out.size()));
  if (batch.n_rows() == 0) return;
  Workspace ws(n_hops(), batch.context_length());
  for (Index n = 0; n < batch.n_rows(); ++n)
    out[static_cast<size_t>(n)] = forward_backward(*this, row_of(batch, n), ws, /*want_posterior=*/false);
}

void ChainedAttention::accumulate(const ChainedAttentionBatch& batch, std::span<const double> w,
                                  ChainedAttentionAccumulator& acc, std::span<double> log_p_out) const {
  check_batch(batch);
  check::weights(kWhere, w, batch.n_rows());
  if (acc.n_hops() != n_hops() || acc.n_symbols() != n_symbols() || acc.n_targets() != n_targets())
    throw ValueError(std::string(kWhere) + ": accumulator dimensions do not match the model");
  if (!log_p_out.empty())
    check::dimension(kWhere, "log-density output length", batch.n_rows(), static_cast<Index>(log_p_out.size()));
  const Index n_rows = batch.n_rows();
  if (n_rows == 0) return;
  const Index N = batch.context_length();

  // Pass 1: impossible rows (an O(N) test each) are reported before any statistic changes.
  std::vector<int64_t> rejected;
  for (Index n = 0; n < n_rows; ++n)
    if (w[static_cast<size_t>(n)] > 0.0 && impossible(*this, row_of(batch, n), N)) rejected.push_back(n);
  if (!rejected.empty()) throw ImpossibleEvidenceError(kWhere, std::move(rejected));

  // Pass 2: forward–backward and scatter; nothing here can fail. Short contexts run eight rows at a time.
  Workspace ws(n_hops(), N);
  if (N <= kBlockMaxN) {
    BlockWorkspace bw(n_hops(), N);
    Index pending[kLanes];
    Index count = 0;
    for (Index n = 0; n < n_rows; ++n) {
      if (w[static_cast<size_t>(n)] == 0.0) {
        if (!log_p_out.empty())
          log_p_out[static_cast<size_t>(n)] = forward_backward(*this, row_of(batch, n), ws, /*want_posterior=*/false);
        continue;
      }
      pending[count++] = n;
      if (count == kLanes) {
        accumulate_block(*this, batch, pending, count, w, log_p_out, ws, bw, acc);
        count = 0;
      }
    }
    if (count > 0) accumulate_block(*this, batch, pending, count, w, log_p_out, ws, bw, acc);
    return;
  }
  for (Index n = 0; n < n_rows; ++n) {
    const double wn = w[static_cast<size_t>(n)];
    if (wn == 0.0 && log_p_out.empty()) continue;
    const Row x = row_of(batch, n);
    const double log_p = wn == 0.0 ? forward_backward(*this, x, ws, /*want_posterior=*/false)
                                   : accumulate_row(*this, x, wn, ws, acc);
    if (!log_p_out.empty()) log_p_out[static_cast<size_t>(n)] = log_p;
    if (wn == 0.0) continue;
    acc.ll() += wn * log_p;
    acc.n() += wn;
  }
}

ChainedAttentionPosterior ChainedAttention::posterior(const ChainedAttentionBatch& batch, Index row) const {
  if (row < 0 || row >= batch.n_rows())
    throw ValueError(std::string(kWhere) + ": posterior row " + std::to_string(row) + " is out of range");
  check_batch(batch);
  const Index L = n_hops();
  const Index N = batch.context_length();
  Workspace ws(L, N);
  ChainedAttentionPosterior out;
  out.log_p = forward_backward(*this, row_of(batch, row), ws, /*want_posterior=*/true);
  out.gamma = Matrix::Zero(L, N);
  out.xi.assign(static_cast<size_t>(L - 1), Matrix::Zero(N, N));
  if (out.log_p == kNegInf) return out;
  for (Index hop = 0; hop < L; ++hop)
    for (Index i = 0; i < N; ++i) out.gamma(hop, i) = ws.g(hop)[i];
  for (Index hop = 0; hop + 1 < L; ++hop) out.xi[static_cast<size_t>(hop)] = ConstMatrixMap(ws.x(hop), N, N);
  return out;
}

Matrix ChainedAttention::predict_proba(const IdMatrix& keys, const IdMatrix& values, const IdVector& queries) const {
  return predict_proba(encoder().encode(keys, values, queries, IdVector::Zero(keys.rows())));
}

Matrix ChainedAttention::predict_proba(const ChainedAttentionBatch& batch) const {
  check_batch(batch);
  Matrix out = Matrix::Zero(batch.n_rows(), n_targets());
  if (batch.n_rows() == 0) return out;
  const Index N = batch.context_length();
  Workspace ws(n_hops(), N);
  for (Index n = 0; n < batch.n_rows(); ++n) {
    const Row x = row_of(batch, n);
    forward(*this, x, ws);
    const double* last = ws.a(n_hops() - 1);
    for (Index j = 0; j < N; ++j) out.row(n) += last[j] * params_.emission.row(x.values[j]);
  }
  return out;
}

ChainedAttentionAccumulator ChainedAttention::make_accumulator() const {
  return {n_hops(), n_symbols(), n_targets()};
}

ChainedAttentionEncoder ChainedAttention::encoder() const { return {n_symbols(), n_targets()}; }

}  // namespace attnmix
