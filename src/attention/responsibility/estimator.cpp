// SPDX-License-Identifier: Apache-2.0
// Responsibility-attention statistics and the closed-form M-step (docs/mechanisms.md#responsibility-attention).
#include <algorithm>
#include <cmath>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/stats/log_math.hpp"
#include "attnmix/stats/mass_law.hpp"
#include "attnmix/stats/simplex.hpp"

namespace attnmix {

namespace {

std::shared_ptr<const StatLayout> ra_layout(std::string_view where, int64_t S, int64_t N, int64_t D, int64_t T) {
  return std::make_shared<const StatLayout>(where, std::vector<FieldSpec>{
      {"key_sum", {S, D}, FieldKind::kReal},
      {"key_mass", {S}, FieldKind::kCount},
      {"emission_count", {S, T}, FieldKind::kCount},
      {"position_count", {N}, FieldKind::kCount},
      {"query_sq", {}, FieldKind::kCount},
  });
}

double span_sum(const double* p, Index n) { return accurate_sum({p, static_cast<size_t>(n)}); }
}  // namespace

ResponsibilityAttentionAccumulator::ResponsibilityAttentionAccumulator(int64_t n_symbols, int64_t context_length,
                                                                       int64_t query_dim, int64_t n_targets,
                                                                       std::optional<std::string> keys)
    : FlatAccumulator(ra_layout(kWhere, (check::positive_int(kWhere, "num_symbols", n_symbols), n_symbols),
                                (check::positive_int(kWhere, "context_length", context_length), context_length),
                                (check::positive_int(kWhere, "query_dim", query_dim), query_dim),
                                (check::positive_int(kWhere, "num_targets", n_targets), n_targets))),
      S_(n_symbols),
      N_(context_length),
      D_(query_dim),
      T_(n_targets) {
  set_keys(std::move(keys));
}

double ResponsibilityAttentionAccumulator::total_mass() const { return span_sum(field(3), N_); }

void ResponsibilityAttentionAccumulator::validate(std::string_view where) const {
  check_entries(where);
  check_mass_laws(where, span_sum(field(2), S_ * T_));
}

void ResponsibilityAttentionAccumulator::validate_owned(std::string_view where, const StatsSplit& split,
                                                        const Communicator& comm) const {
  detail::on_every_rank(&comm, [&] { check_entries(where, &split); });
  check_mass_laws(where, run_total(*this, split.runs.back(), comm));  // emission_count's run
}

void ResponsibilityAttentionAccumulator::check_mass_laws(std::string_view where, double emitted) const {
  const double mass = total_mass();  // position_count and key_mass are summed whole on a sharded M-step's ranks
  check_mass_law(where, "sum(position_count)", mass, "sum(key_mass)", span_sum(field(1), S_));
  check_mass_law(where, "sum(position_count)", mass, "sum(emission_count)", emitted);
}

void ResponsibilityAttentionAccumulator::initialize(const ResponsibilityAttentionBatch& batch,
                                                    std::span<const double> w, Rng& rng) {
  check::weights(kWhere, w, batch.n_rows());
  if (batch.n_rows() == 0) return;
  check::dimension(kWhere, "batch context length N", N_, batch.context_length());
  batch.check_query_dim(kWhere, D_);
  if (batch.max_symbol() >= S_ || batch.max_target() >= T_)
    throw ValueError(std::string(kWhere) + ": out-of-range ID in batch for S = " + std::to_string(S_) +
                     ", T = " + std::to_string(T_));
  std::vector<double> r(static_cast<size_t>(N_));
  MatrixMap ks = key_sum();
  VectorMap km = key_mass();
  MatrixMap em = emission_count();
  VectorMap pc = position_count();
  for (Index n = 0; n < batch.n_rows(); ++n) {
    rng.dirichlet_ones(r);  // every row, whatever w_n is (initialisation, docs/mechanisms.md#training)
    const double wn = w[n];
    if (wn == 0.0) continue;
    const int64_t* ctx = batch.context(n);
    const bool symbol = batch.has_symbol_queries();  // the one-hot e_q: one non-zero coordinate, ‖e_q‖² = 1
    const ConstVectorMap y(symbol ? nullptr : batch.query(n), symbol ? 0 : D_);
    double r_total = 0.0;
    for (Index i = 0; i < N_; ++i) {
      const double wr = wn * r[i];
      if (symbol)
        ks(ctx[i], batch.query_symbol(n)) += wr;
      else
        ks.row(ctx[i]) += wr * y.transpose();
      km[ctx[i]] += wr;
      em(ctx[i], batch.target(n)) += wr;
      pc[i] += wr;
      r_total += r[i];
    }
    query_sq() += wn * r_total * (symbol ? 1.0 : y.squaredNorm());
  }
}

void ResponsibilityAttentionAccumulator::initialize_shard(const ResponsibilityAttentionBatch& batch,
                                                          std::span<const double> w, Rng& rng, Index rows_before,
                                                          Index rows_after) {
  rng.discard_dirichlet_ones(rows_before, N_);
  initialize(batch, w, rng);
  rng.discard_dirichlet_ones(rows_after, N_);
}

ResponsibilityAttentionEncoder ResponsibilityAttentionAccumulator::encoder() const { return {S_, N_, D_, T_}; }

ResponsibilityAttentionEstimator::ResponsibilityAttentionEstimator(int64_t n_symbols, int64_t context_length,
                                                                   int64_t query_dim, int64_t n_targets,
                                                                   ResponsibilityAttentionEstimatorOptions options)
    : S_(n_symbols), N_(context_length), D_(query_dim), T_(n_targets), options_(std::move(options)) {
  check::positive_int(kWhere, "num_symbols", S_);
  check::positive_int(kWhere, "context_length", N_);
  check::positive_int(kWhere, "query_dim", D_);
  check::positive_int(kWhere, "num_targets", T_);
  static_cast<void>(ra_layout(kWhere, S_, N_, D_, T_));  // the statistics must have a size that can exist
  check::variance(kWhere, "sigma2", options_.sigma2);
  check::variance(kWhere, "min_sigma2", options_.min_sigma2);
  check::nonnegative_real(kWhere, "emission_smoothing", options_.emission_smoothing);
}

ResponsibilityAttentionAccumulator ResponsibilityAttentionEstimator::make_accumulator() const {
  return {S_, N_, D_, T_, options_.keys};
}

ResponsibilityAttentionEncoder ResponsibilityAttentionEstimator::encoder() const { return {S_, N_, D_, T_}; }

void ResponsibilityAttentionEstimator::check_layout(const ResponsibilityAttentionAccumulator& acc) const {
  if (acc.n_symbols() != S_ || acc.context_length() != N_ || acc.query_dim() != D_ || acc.n_targets() != T_)
    throw ValueError(std::string(kWhere) + ": statistics must have the layout [" +
                     make_accumulator().layout().describe() + "] (got [" + acc.layout().describe() + "])");
}

ResponsibilityAttention ResponsibilityAttentionEstimator::estimate(
    std::optional<double> nobs, const ResponsibilityAttentionAccumulator& acc) const {
  check_layout(acc);
  acc.validate(kWhere);
  if (nobs) check_mass_law(kWhere, "nobs", *nobs, "sum(position_count)", acc.total_mass());
  return estimate_symbols(acc, all_symbols(S_), nullptr);
}

ResponsibilityAttention ResponsibilityAttentionEstimator::estimate_sharded(ResponsibilityAttentionAccumulator& acc,
                                                                           const Communicator& comm) const {
  check_layout(acc);
  const SymbolShard shard = symbol_shard(comm, S_);
  const std::vector<FieldSpec>& fields = acc.layout().fields();
  const StatsSplit split{{table_run(fields[0].offset, D_, shard), table_run(fields[2].offset, T_, shard)},
                         comm.rank()};  // key_sum, emission_count
  sum_owned_statistics(acc, comm, split);
  acc.validate_owned(kWhere, split, comm);
  return estimate_symbols(acc, shard, &comm);
}

ResponsibilityAttention ResponsibilityAttentionEstimator::estimate_symbols(
    const ResponsibilityAttentionAccumulator& acc, const SymbolShard& shard, const Communicator* comm) const {
  ResponsibilityAttentionParams p;
  p.name = options_.name;
  const ConstMatrixMap key_sum = acc.key_sum();
  const ConstVectorMap key_mass = acc.key_mass();
  p.key_means.resize(S_, D_);
  for (Index s = shard.begin; s < shard.end; ++s)
    p.key_means.row(s) = key_sum.row(s) / std::max(key_mass[s], kResponsibilityKeyMassFloor);
  p.emission.resize(S_, T_);
  smoothed_row_normalise_rows(acc.emission_count(), options_.emission_smoothing, shard.begin, shard.end,
                              p.emission);  // docs/porting.md
  Matrix log_emission(S_, T_);
  Vector key_sq_norm(S_);
  ResponsibilityAttention::derive_symbol_tables(p, shard.begin, shard.end, log_emission, key_sq_norm);
  if (comm) {
    gather_rows(p.key_means.data(), D_, shard, *comm);
    gather_rows(p.emission.data(), T_, shard, *comm);
    gather_rows(log_emission.data(), T_, shard, *comm);
    gather_rows(key_sq_norm.data(), 1, shard, *comm);
  }

  const double mass = acc.total_mass();
  const ConstVectorMap positions = acc.position_count();
  if (mass > 0.0)
    p.position_prior = positions / mass;
  else
    p.position_prior = Vector::Constant(N_, 1.0 / static_cast<double>(N_));

  p.sigma2 = options_.sigma2;
  if (options_.estimate_sigma2) {
    const double m_tot = span_sum(key_mass.data(), S_);
    if (m_tot > 0.0) {
      Vector explained(S_);  // ‖key_sum_s‖² / m_s, summed in symbol order
      for (Index s = shard.begin; s < shard.end; ++s)
        explained[s] = key_sum.row(s).squaredNorm() / std::max(key_mass[s], kResponsibilityKeyMassFloor);
      if (comm) gather_rows(explained.data(), 1, shard, *comm);
      double total = 0.0;
      for (Index s = 0; s < S_; ++s) total += explained[s];
      const double scatter = acc.query_sq() - total;
      p.sigma2 = std::max(scatter / (static_cast<double>(D_) * m_tot), options_.min_sigma2);
    }
  }
  return {std::move(p), options_.precision, std::move(log_emission), std::move(key_sq_norm)};
}

ResponsibilityAttentionSampler::ResponsibilityAttentionSampler(ResponsibilityAttention model, uint64_t seed)
    : model_(std::move(model)), rng_(seed) {}

ResponsibilityAttentionObservation ResponsibilityAttentionSampler::sample() {
  const auto& p = model_.params();
  const int64_t S = model_.n_symbols();
  const int64_t N = model_.context_length();
  const int64_t D = model_.query_dim();
  ResponsibilityAttentionObservation obs;
  if (N <= S) {
    obs.context = rng_.sample_without_replacement(S, N);
  } else {
    obs.context.resize(static_cast<size_t>(N));
    for (int64_t& c : obs.context) c = static_cast<int64_t>(rng_.uniform_int(static_cast<uint64_t>(S)));
  }
  const int64_t z = rng_.categorical({p.position_prior.data(), static_cast<size_t>(N)});
  const int64_t s = obs.context[static_cast<size_t>(z)];
  const double sigma = std::sqrt(p.sigma2);
  obs.query.resize(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) obs.query[static_cast<size_t>(d)] = p.key_means(s, d) + sigma * rng_.normal();
  obs.target = rng_.categorical({p.emission.data() + s * model_.n_targets(), static_cast<size_t>(model_.n_targets())});
  return obs;
}

ResponsibilityAttentionBatch ResponsibilityAttentionSampler::sample(Index m) {
  if (m < 0) throw ValueError("ResponsibilityAttentionSampler: size must be >= 0");
  IdMatrix contexts(m, model_.context_length());
  Matrix queries(m, model_.query_dim());
  IdVector targets(m);
  for (Index k = 0; k < m; ++k) {
    ResponsibilityAttentionObservation obs = sample();
    contexts.row(k) = Eigen::Map<const IdVector>(obs.context.data(), model_.context_length()).transpose();
    queries.row(k) = Eigen::Map<const Vector>(obs.query.data(), model_.query_dim()).transpose();
    targets[k] = obs.target;
  }
  return model_.encoder().encode(std::move(contexts), std::move(queries), std::move(targets));
}

}  // namespace attnmix
