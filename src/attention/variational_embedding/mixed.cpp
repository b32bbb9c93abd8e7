// SPDX-License-Identifier: Apache-2.0
// Variational embedding attention's gate in mixed precision (docs/mixed_precision.md): the float64 gate's layout
// (model.cpp) with 16-lane float vectors over float copies of the embedding tables. The posterior,
// every statistic and the M-step stay double. A row's arithmetic depends only on the row and the tables, so results
// are bitwise thread-count invariant.
#include <cmath>
#include <limits>

#include "../float_lanes_impl.hpp"
#include "../lanes_impl.hpp"
#include "../variational/mixed_impl.hpp"

namespace attnmix {

namespace {

namespace fl = float_lanes;
constexpr Index kLanes = fl::kLanes;
constexpr float kFloatNegInf = -std::numeric_limits<float>::infinity();

/// Half the float range: squared distances and logits of usable tables stay below it.
constexpr double kFloatHeadroom = 0.5 * static_cast<double>(std::numeric_limits<float>::max());
/// The largest 1/(2σ²) the float gate takes: it must be a finite float (0·∞ would be NaN); beyond it rows run in
/// float64.
constexpr double kMaxInvTwoSigma2 = 1e30;

bool coordinates_fit_float(const Matrix& table, Index padded_D) {
  const double largest = table.size() == 0 ? 0.0 : table.cwiseAbs().maxCoeff();
  const double bound = std::sqrt(kFloatHeadroom / (4.0 * static_cast<double>(padded_D)));
  return largest <= bound;  // false for NaN
}

template <Index kBlocks>
bool gate(const VariationalFloatTables& g, const FloatEmbeddingTable& E, const int64_t* __restrict c, int64_t q,
          double* __restrict s, double* __restrict a) {
  const Index N = g.N;
  const Index NP = fl::padded(N);
  const Index blocks = E.padded_dim() / kLanes;
  float* __restrict l = reinterpret_cast<float*>(lanes::scratch<6>(static_cast<size_t>(NP)));
  const fl::FloatQuery<kBlocks> y(E.row(q));
  fl::Lanes top16 = fl::broadcast(kFloatNegInf);
  for (Index i = 0; i < NP; i += kLanes) {
    fl::Lanes partial[kLanes];
    for (Index j = 0; j < kLanes; ++j)
      partial[j] = fl::squared_distance_lanes(y, E.row(i + j < N ? c[i + j] : 0), blocks);
    const fl::Lanes distance = fl::horizontal_sums(partial);
    const fl::Lanes log_pi = fl::load(g.log_pi.data() + i);  // −∞ on the padding lanes
    const fl::Lanes logit = log_pi == kFloatNegInf ? fl::broadcast(kFloatNegInf) : log_pi - distance * g.inv_two_sigma2;
    fl::store(l + i, logit);
    top16 = logit > top16 ? logit : top16;
  }
  const float top = fl::horizontal_max(top16);
  if (top == kFloatNegInf) return false;
  for (Index i = 0; i < NP; i += kLanes) {
    const fl::Lanes logit = fl::load(l + i);
    const fl::Lanes weight = fl::exp_lanes(logit - top);
    lanes::store(s + i, fl::widen(logit, 0));
    lanes::store(s + i + 8, fl::widen(logit, 1));
    lanes::store(a + i, fl::widen(weight, 0));
    lanes::store(a + i + 8, fl::widen(weight, 1));
  }
  return true;
}

}  // namespace

FloatEmbeddingTable::FloatEmbeddingTable(const Matrix& table) : padded_D_(fl::padded(table.cols())) {
  if (!coordinates_fit_float(table, padded_D_)) return;
  values_.resize(static_cast<size_t>(table.rows() * padded_D_));
  for (Index sym = 0; sym < table.rows(); ++sym)
    fl::round_padded(table.data() + sym * table.cols(), table.cols(), padded_D_, values_.data() + sym * padded_D_);
}

VariationalFloatTables::VariationalFloatTables(const Matrix& mean_table, const Vector& log_prior,
                                               double inv_two_sigma2_f64)
    : N(log_prior.size()),
      log_pi(static_cast<size_t>(fl::padded(log_prior.size())), kFloatNegInf),
      inv_two_sigma2(static_cast<float>(inv_two_sigma2_f64)),
      usable(inv_two_sigma2_f64 <= kMaxInvTwoSigma2),
      mean(mean_table) {
  for (Index i = 0; i < N; ++i) log_pi[static_cast<size_t>(i)] = static_cast<float>(log_prior[i]);
}

std::shared_ptr<const std::vector<FloatEmbeddingTable>> VariationalFloatTables::noise(const MonteCarloTables& tables,
                                                                                      int64_t mc) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = by_mc_[mc];
  if (!slot) {
    std::vector<FloatEmbeddingTable> copies;
    copies.reserve(tables.embeddings.size());
    for (const Matrix& table : tables.embeddings) copies.emplace_back(table);
    slot = std::make_shared<const std::vector<FloatEmbeddingTable>>(std::move(copies));
  }
  return slot;
}

bool mixed_gate(const VariationalFloatTables& g, const FloatEmbeddingTable& E, const int64_t* c, int64_t q, double* s,
                double* a) {
  if (!g.usable || !E.usable()) return false;
  switch (E.padded_dim() / kLanes) {
    case 1: return gate<1>(g, E, c, q, s, a);
    case 2: return gate<2>(g, E, c, q, s, a);
    case 3: return gate<3>(g, E, c, q, s, a);
    case 4: return gate<4>(g, E, c, q, s, a);
    default: return gate<0>(g, E, c, q, s, a);
  }
}

}  // namespace attnmix
