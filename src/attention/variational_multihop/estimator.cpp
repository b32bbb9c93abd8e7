// SPDX-License-Identifier: Apache-2.0
// Variational multi-hop attention: statistics, the M-step with the annealed KL weight and the samplers
// (docs/mechanisms.md#variational-multi-hop-attention).
#include <algorithm>
#include <cmath>
#include <string>

#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/sizes.hpp"
#include "attnmix/stats/log_math.hpp"
#include "attnmix/stats/mass_law.hpp"
#include "../variational/common_impl.hpp"

namespace attnmix {

namespace {
std::shared_ptr<const StatLayout> vmha_layout(std::string_view where, int64_t S, int64_t D, int64_t T) {
  return std::make_shared<const StatLayout>(where, std::vector<FieldSpec>{
      {"grad_m", {S, D}, FieldKind::kReal},
      {"grad_logv", {S, D}, FieldKind::kReal},
      {"emission_count", {S, T}, FieldKind::kCount},
      {"ll", {}, FieldKind::kReal},
      {"n", {}, FieldKind::kCount},
  });
}
}  // namespace

// ---- accumulator ------------------------------------------------------------------------------------------------

VariationalMultiHopAttentionAccumulator::VariationalMultiHopAttentionAccumulator(int64_t n_symbols, int64_t embed_dim,
                                                                                 int64_t n_targets, int64_t mc,
                                                                                 std::optional<std::string> keys)
    : FlatAccumulator(vmha_layout(kWhere, (check::positive_int(kWhere, "num_symbols", n_symbols), n_symbols),
                                  (check::positive_int(kWhere, "embed_dim", embed_dim), embed_dim),
                                  (check::positive_int(kWhere, "num_targets", n_targets), n_targets))),
      S_(n_symbols),
      D_(embed_dim),
      T_(n_targets),
      mc_(mc) {
  check::positive_int(kWhere, "mc", mc);
  set_keys(std::move(keys));
}

void VariationalMultiHopAttentionAccumulator::validate(std::string_view where) const {
  check_entries(where);
  check_mass_laws(where, variational::span_sum(field(2), S_ * T_));
}

void VariationalMultiHopAttentionAccumulator::validate_owned(std::string_view where, const StatsSplit& split,
                                                             const Communicator& comm) const {
  detail::on_every_rank(&comm, [&] { check_entries(where, &split); });
  check_mass_laws(where, run_total(*this, split.runs.back(), comm));  // emission_count's run
}

void VariationalMultiHopAttentionAccumulator::check_mass_laws(std::string_view where, double emitted) const {
  check_mass_law(where, "n", n(), "sum(emission_count)", emitted);
}

void VariationalMultiHopAttentionAccumulator::set_zero() {
  FlatStats::set_zero();
  state_.reset();
}

void VariationalMultiHopAttentionAccumulator::initialize(const ChainedAttentionBatch& batch,
                                                         std::span<const double> w, Rng& rng) {
  const Index rows = batch.n_rows();
  check::weights(kWhere, w, rows);
  if (rows > 0 && (batch.max_symbol() >= S_ || batch.max_target() >= T_))
    throw ValueError(std::string(kWhere) + ": out-of-range ID in the initialisation batch");
  const Index N = rows > 0 ? batch.context_length() : 0;
  std::vector<double> r(static_cast<size_t>(N));
  MatrixMap emission = emission_count();
  double total = 0.0;
  for (Index row = 0; row < rows; ++row) {
    rng.dirichlet_ones(r);
    const double wn = w[static_cast<size_t>(row)];
    const int64_t* values = batch.values(row);
    const int64_t t = batch.target(row);
    for (Index j = 0; j < N; ++j) emission(values[j], t) += wn * r[static_cast<size_t>(j)];
    total += wn;
  }
  n() += total;
}

void VariationalMultiHopAttentionAccumulator::initialize_shard(const ChainedAttentionBatch& batch,
                                                               std::span<const double> w, Rng& rng,
                                                               Index rows_before, Index rows_after) {
  rng.discard_dirichlet_ones(rows_before, batch.context_length());
  initialize(batch, w, rng);
  rng.discard_dirichlet_ones(rows_after, batch.context_length());
}

ChainedAttentionEncoder VariationalMultiHopAttentionAccumulator::encoder() const { return {S_, T_}; }

// ---- estimator --------------------------------------------------------------------------------------------------

VariationalMultiHopAttentionEstimator::VariationalMultiHopAttentionEstimator(
    int64_t n_symbols, int64_t embed_dim, int64_t n_targets, VariationalMultiHopAttentionEstimatorOptions options)
    : S_(n_symbols), D_(embed_dim), T_(n_targets), options_(std::move(options)) {
  check::positive_int(kWhere, "num_symbols", S_);
  check::positive_int(kWhere, "embed_dim", D_);
  check::positive_int(kWhere, "num_targets", T_);
  check::positive_int(kWhere, "mc", options_.mc);
  check::positive_int(kWhere, "anneal_iters", options_.anneal_iters);
  static_cast<void>(vmha_layout(kWhere, S_, D_, T_));  // the statistics must have a size that can exist
  static_cast<void>(checked_product(kWhere, "the Monte-Carlo embedding tables (mc x num_symbols x embed_dim)",
                                    {options_.mc, S_, D_}));
  check::variance(kWhere, "sigma2", options_.sigma2);
  check::positive_real(kWhere, "lr", options_.lr);
  check::nonnegative_real(kWhere, "prior_strength", options_.prior_strength);
  check::nonnegative_real(kWhere, "emission_smoothing", options_.emission_smoothing);
}

double VariationalMultiHopAttentionEstimator::kl_weight(int64_t tau) const {
  const double ramp = static_cast<double>(tau) / static_cast<double>(std::max<int64_t>(1, options_.anneal_iters));
  return options_.prior_strength * std::min(1.0, ramp);
}

VariationalMultiHopAttentionAccumulator VariationalMultiHopAttentionEstimator::make_accumulator() const {
  return {S_, D_, T_, options_.mc, options_.keys};
}

ChainedAttentionEncoder VariationalMultiHopAttentionEstimator::encoder() const { return {S_, T_}; }

void VariationalMultiHopAttentionEstimator::check_layout(const VariationalMultiHopAttentionAccumulator& acc) const {
  if (acc.n_symbols() != S_ || acc.embed_dim() != D_ || acc.n_targets() != T_)
    throw ValueError(std::string(kWhere) + ": statistics must have the layout [" +
                     make_accumulator().layout().describe() + "] (got [" + acc.layout().describe() + "])");
}

VariationalMultiHopAttention VariationalMultiHopAttentionEstimator::estimate(
    std::optional<double> nobs, const VariationalMultiHopAttentionAccumulator& acc) const {
  check_layout(acc);
  acc.validate(kWhere);
  if (nobs) check_mass_law(kWhere, "nobs", *nobs, "n", acc.n());
  return estimate_symbols(acc, all_symbols(S_), nullptr);
}

VariationalMultiHopAttention VariationalMultiHopAttentionEstimator::estimate_sharded(
    VariationalMultiHopAttentionAccumulator& acc, const Communicator& comm) const {
  check_layout(acc);
  return variational::sharded_mstep(kWhere, acc, comm,
                                    [&](const SymbolShard& shard) { return estimate_symbols(acc, shard, &comm); });
}

VariationalMultiHopAttention VariationalMultiHopAttentionEstimator::estimate_symbols(
    const VariationalMultiHopAttentionAccumulator& acc, const SymbolShard& shard, const Communicator* comm) const {
  VariationalMultiHopAttentionParams p;
  constexpr double kInitialScale = 1.0;  // docs/mechanisms.md#variational-multi-hop-attention: m ~ N(0, 1)
  p.optimizer_state =
      variational::next_state(kWhere, VariationalMultiHopAttention::kFamily, acc.optimizer_state(), acc.grad_mean(),
                              acc.grad_log_var(), options_.seed, kInitialScale, options_.lr,
                              [this](int64_t tau) { return kl_weight(tau); });
  p.mean = p.optimizer_state->mean;
  p.log_var = p.optimizer_state->log_var;
  p.emission = smoothed_emission(acc.emission_count(), options_.emission_smoothing, shard, comm);
  p.sigma2 = options_.sigma2;
  p.name = options_.name;
  return VariationalMultiHopAttention(std::move(p));
}

// ---- model conveniences -----------------------------------------------------------------------------------------

VariationalMultiHopAttentionAccumulator VariationalMultiHopAttention::make_accumulator() const {
  return {n_symbols(), embed_dim(), n_targets(), VariationalMultiHopAttentionEstimatorOptions{}.mc};
}

VariationalMultiHopAttentionEstimator VariationalMultiHopAttention::estimator() const {
  VariationalMultiHopAttentionEstimatorOptions options;
  options.sigma2 = params_.sigma2;
  options.seed = state_->seed;
  options.name = params_.name;
  return {n_symbols(), embed_dim(), n_targets(), std::move(options)};
}

ChainedAttentionEncoder VariationalMultiHopAttention::encoder() const { return {n_symbols(), n_targets()}; }

VariationalMultiHopAttentionSampler VariationalMultiHopAttention::sampler(uint64_t seed,
                                                                          int64_t context_length) const {
  return {*this, seed, context_length, false};
}

VariationalMultiHopAttentionSampler VariationalMultiHopAttention::posterior_predictive_sampler(
    uint64_t seed, int64_t context_length) const {
  return {*this, seed, context_length, true};
}

// ---- sampler ----------------------------------------------------------------------------------------------------

VariationalMultiHopAttentionSampler::VariationalMultiHopAttentionSampler(VariationalMultiHopAttention model,
                                                                         uint64_t seed, int64_t context_length,
                                                                         bool posterior_predictive)
    : model_(std::move(model)),
      rng_(seed),
      context_length_(context_length),
      posterior_predictive_(posterior_predictive),
      table_(model_.mean()) {
  check::positive_int("VariationalMultiHopAttentionSampler", "context_length", context_length);
}

ChainedAttentionObservation VariationalMultiHopAttentionSampler::sample() {
  const int64_t S = model_.n_symbols();
  const Index D = model_.embed_dim();
  const auto N = static_cast<size_t>(context_length_);
  if (posterior_predictive_) variational::draw_table(model_.mean(), model_.log_var(), rng_, table_);
  const auto uniform_symbol = [&] { return static_cast<int64_t>(rng_.uniform_int(static_cast<uint64_t>(S))); };
  ChainedAttentionObservation obs;
  obs.keys.resize(N);
  obs.values.resize(N);
  for (int64_t& k : obs.keys) k = uniform_symbol();
  for (int64_t& v : obs.values) v = uniform_symbol();
  obs.query = uniform_symbol();
  const double inv_two_sigma2 = 0.5 / model_.sigma2();
  const auto gate_from = [&](int64_t symbol) {
    std::vector<double> logits(N);
    const double* e = table_.data() + symbol * D;
    for (size_t j = 0; j < N; ++j)
      logits[j] = -variational::squared_distance(e, table_.data() + obs.keys[j] * D, D) * inv_two_sigma2;
    return logits;
  };
  std::vector<double> gate = gate_from(obs.query);
  const auto z1 = static_cast<size_t>(variational::draw_softmax(gate, rng_));
  gate = gate_from(obs.values[z1]);
  const auto z2 = static_cast<size_t>(variational::draw_softmax(gate, rng_));
  const Matrix& B = model_.emission();
  obs.target = rng_.categorical({B.row(obs.values[z2]).data(), static_cast<size_t>(B.cols())});
  return obs;
}

ChainedAttentionBatch VariationalMultiHopAttentionSampler::sample(Index m) {
  if (m < 0) throw ValueError("VariationalMultiHopAttentionSampler: size must be >= 0 (got " + std::to_string(m) + ")");
  return encode_draws(model_.encoder(), static_cast<Index>(context_length_), m, [this] { return sample(); });
}

}  // namespace attnmix
