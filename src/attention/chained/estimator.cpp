// SPDX-License-Identifier: Apache-2.0
// Chained-attention statistics, the M-step and the sampler (docs/mechanisms.md#chained-attention).
#include <algorithm>
#include <cmath>

#include "attnmix/attention/chained.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/stats/log_math.hpp"
#include "attnmix/stats/mass_law.hpp"

namespace attnmix {

namespace {
constexpr double kKeyMassFloor = 1e-9;  // M-step denominator floor of docs/mechanisms.md#chained-attention

std::shared_ptr<const StatLayout> ca_layout(std::string_view where, int64_t L, int64_t S, int64_t T) {
  return std::make_shared<const StatLayout>(where, std::vector<FieldSpec>{
      {"key_num", {L, S, S}, FieldKind::kCount},
      {"key_mass", {L, S}, FieldKind::kCount},
      {"emission_count", {S, T}, FieldKind::kCount},
      {"ll", {}, FieldKind::kReal},
      {"n", {}, FieldKind::kCount},
  });
}

double span_sum(const double* p, Index n) { return accurate_sum({p, static_cast<size_t>(n)}); }
}  // namespace

ChainedAttentionAccumulator::ChainedAttentionAccumulator(int64_t n_hops, int64_t n_symbols, int64_t n_targets,
                                                         std::optional<std::string> keys)
    : FlatAccumulator(ca_layout(kWhere, (check::positive_int(kWhere, "n_hops", n_hops), n_hops),
                                (check::positive_int(kWhere, "num_symbols", n_symbols), n_symbols),
                                (check::positive_int(kWhere, "num_targets", n_targets), n_targets))),
      L_(n_hops),
      S_(n_symbols),
      T_(n_targets) {
  set_keys(std::move(keys));
}

void ChainedAttentionAccumulator::validate(std::string_view where) const {
  check_entries(where);
  check_mass_laws(where, span_sum(field(2), S_ * T_));
}

void ChainedAttentionAccumulator::validate_owned(std::string_view where, const StatsSplit& split,
                                                 const Communicator& comm) const {
  detail::on_every_rank(&comm, [&] { check_entries(where, &split); });
  check_mass_laws(where, run_total(*this, split.runs.back(), comm));  // emission_count's run
}

void ChainedAttentionAccumulator::check_mass_laws(std::string_view where, double emitted) const {
  const double total = n();  // n and key_mass are summed whole on a sharded M-step's ranks: every rank agrees
  for (Index hop = 0; hop < L_; ++hop)
    check_mass_law(where, "n", total, "sum(key_mass[" + std::to_string(hop) + "])",
                   span_sum(field(1) + hop * S_, S_));
  check_mass_law(where, "n", total, "sum(emission_count)", emitted);
}

ChainedAttentionEncoder ChainedAttentionAccumulator::encoder() const { return {S_, T_}; }

ChainedAttentionEstimator::ChainedAttentionEstimator(int64_t n_hops, int64_t n_symbols, int64_t n_targets,
                                                     ChainedAttentionEstimatorOptions options)
    : L_(n_hops), S_(n_symbols), T_(n_targets), options_(std::move(options)) {
  check::positive_int(kWhere, "n_hops", L_);
  check::positive_int(kWhere, "num_symbols", S_);
  check::positive_int(kWhere, "num_targets", T_);
  static_cast<void>(ca_layout(kWhere, L_, S_, T_));  // the statistics must have a size that can exist
  check::variance(kWhere, "sigma2", options_.sigma2);
  check::nonnegative_real(kWhere, "emission_smoothing", options_.emission_smoothing);
}

ChainedAttentionAccumulator ChainedAttentionEstimator::make_accumulator() const {
  return {L_, S_, T_, options_.keys};
}

ChainedAttentionEncoder ChainedAttentionEstimator::encoder() const { return {S_, T_}; }

void ChainedAttentionEstimator::check_layout(const ChainedAttentionAccumulator& acc) const {
  if (acc.n_hops() != L_ || acc.n_symbols() != S_ || acc.n_targets() != T_)
    throw ValueError(std::string(kWhere) + ": statistics must have the layout [" +
                     make_accumulator().layout().describe() + "] (got [" + acc.layout().describe() + "])");
}

ChainedAttention ChainedAttentionEstimator::estimate(std::optional<double> nobs,
                                                     const ChainedAttentionAccumulator& acc) const {
  check_layout(acc);
  acc.validate(kWhere);
  if (nobs) check_mass_law(kWhere, "nobs", *nobs, "n", acc.n());
  return estimate_symbols(acc, all_symbols(S_), nullptr);
}

ChainedAttention ChainedAttentionEstimator::estimate_sharded(ChainedAttentionAccumulator& acc,
                                                             const Communicator& comm) const {
  check_layout(acc);
  const SymbolShard shard = symbol_shard(comm, S_);
  StatsSplit split{{}, comm.rank()};
  const std::vector<FieldSpec>& fields = acc.layout().fields();
  for (Index hop = 0; hop < L_; ++hop)
    split.runs.push_back(table_run(fields[0].offset + hop * S_ * S_, S_, shard));  // key_num[hop]
  split.runs.push_back(table_run(fields[2].offset, T_, shard));                     // emission_count
  sum_owned_statistics(acc, comm, split);
  acc.validate_owned(kWhere, split, comm);
  return estimate_symbols(acc, shard, &comm);
}

ChainedAttention ChainedAttentionEstimator::estimate_symbols(const ChainedAttentionAccumulator& acc,
                                                             const SymbolShard& shard,
                                                             const Communicator* comm) const {
  ChainedAttentionParams p;
  p.name = options_.name;
  p.sigma2 = options_.sigma2;
  const ConstMatrixMap key_mass = acc.key_mass();
  for (Index hop = 0; hop < L_; ++hop) {
    const ConstMatrixMap key_num = acc.key_num(hop);
    Matrix K(S_, S_);
    for (Index s = shard.begin; s < shard.end; ++s)
      K.row(s) = key_num.row(s) / std::max(key_mass(hop, s), kKeyMassFloor);
    if (comm) gather_rows(K.data(), S_, shard, *comm);
    p.key_tables.push_back(std::move(K));
  }
  p.emission = smoothed_emission(acc.emission_count(), options_.emission_smoothing, shard, comm);
  return ChainedAttention(std::move(p));
}

ChainedAttentionEstimator ChainedAttention::estimator() const {
  ChainedAttentionEstimatorOptions options;
  options.sigma2 = params_.sigma2;
  options.name = params_.name;
  return {n_hops(), n_symbols(), n_targets(), std::move(options)};
}

ChainedAttentionSampler ChainedAttention::sampler(uint64_t seed, int64_t context_length) const {
  return {*this, seed, context_length};
}

ChainedAttentionSampler::ChainedAttentionSampler(ChainedAttention model, uint64_t seed, int64_t context_length)
    : model_(std::move(model)), rng_(seed), context_length_(context_length) {
  check::positive_int("ChainedAttentionSampler", "context_length", context_length);
}

ChainedAttentionObservation ChainedAttentionSampler::sample() {
  const int64_t S = model_.n_symbols();
  const auto N = static_cast<size_t>(context_length_);
  const auto uniform_symbol = [&] { return static_cast<int64_t>(rng_.uniform_int(static_cast<uint64_t>(S))); };
  ChainedAttentionObservation obs;
  obs.keys.resize(N);
  obs.values.resize(N);
  for (int64_t& k : obs.keys) k = uniform_symbol();
  for (int64_t& v : obs.values) v = uniform_symbol();
  obs.query = uniform_symbol();
  std::vector<double> gate(N);
  int64_t u = obs.query;
  int64_t position = 0;
  for (Index hop = 0; hop < model_.n_hops(); ++hop) {
    const double* logits = model_.gate_logits(hop, u);
    double top = kNegInf;
    for (size_t j = 0; j < N; ++j) top = std::max(top, logits[obs.keys[j]]);
    double total = 0.0;
    for (size_t j = 0; j < N; ++j) total += (gate[j] = std::exp(logits[obs.keys[j]] - top));
    for (double& g : gate) g /= total;
    position = rng_.categorical(gate);
    u = obs.values[static_cast<size_t>(position)];
  }
  const double* b = model_.emission().data() + u * model_.n_targets();
  obs.target = rng_.categorical({b, static_cast<size_t>(model_.n_targets())});
  return obs;
}

ChainedAttentionBatch ChainedAttentionSampler::sample(Index m) {
  if (m < 0) throw ValueError("ChainedAttentionSampler: size must be >= 0");
  return encode_draws(model_.encoder(), context_length_, m, [this] { return sample(); });
}

}  // namespace attnmix
