// SPDX-License-Identifier: Apache-2.0
// Variational embedding attention: batches, the encoder, statistics, the M-step and the samplers
// (docs/mechanisms.md#variational-embedding-attention).
#include <algorithm>
#include <cmath>
#include <string>

#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/sizes.hpp"
#include "attnmix/stats/log_math.hpp"
#include "attnmix/stats/mass_law.hpp"
#include "../variational/common_impl.hpp"

namespace attnmix {

namespace {
constexpr const char* kEncoderWhere = "VariationalEmbeddingAttentionDataEncoder";

std::shared_ptr<const StatLayout> vea_layout(std::string_view where, int64_t S, int64_t N, int64_t D, int64_t T) {
  return std::make_shared<const StatLayout>(where, std::vector<FieldSpec>{
      {"grad_m", {S, D}, FieldKind::kReal},
      {"grad_logv", {S, D}, FieldKind::kReal},
      {"emission_count", {S, T}, FieldKind::kCount},
      {"position_count", {N}, FieldKind::kCount},
      {"ll", {}, FieldKind::kReal},
      {"n", {}, FieldKind::kCount},
  });
}
}  // namespace

// ---- batch and encoder -------------------------------------------------------------------------------------------

VariationalEmbeddingAttentionBatch VariationalEmbeddingAttentionEncoder::encode(IdMatrix contexts, IdVector queries,
                                                                                IdVector targets) const {
  const Index n = contexts.rows();
  if (queries.size() != n || targets.size() != n)
    throw ValueError(std::string(kEncoderWhere) + ": contexts, queries and targets must have the same number of rows (" +
                     std::to_string(n) + ", " + std::to_string(queries.size()) + ", " +
                     std::to_string(targets.size()) + ")");
  if (n > 0 && contexts.cols() <= 0)
    throw ValueError(std::string(kEncoderWhere) + ": contexts must have a positive width N");
  if (n > 0 && context_length) check::dimension(kEncoderWhere, "context length N", *context_length, contexts.cols());
  check::ids(kEncoderWhere, "context", variational::all_of(contexts), n_symbols);
  check::ids(kEncoderWhere, "query", variational::all_of(queries), n_symbols);
  check::ids(kEncoderWhere, "target", variational::all_of(targets), n_targets);
  VariationalEmbeddingAttentionArrays arrays;
  arrays.max_symbol = std::max(variational::max_or_minus_one(variational::all_of(contexts)),
                               variational::max_or_minus_one(variational::all_of(queries)));
  arrays.max_target = variational::max_or_minus_one(variational::all_of(targets));
  arrays.contexts = std::move(contexts);
  arrays.queries = std::move(queries);
  arrays.targets = std::move(targets);
  return {std::move(arrays), n};
}

// ---- accumulator ------------------------------------------------------------------------------------------------

VariationalEmbeddingAttentionAccumulator::VariationalEmbeddingAttentionAccumulator(int64_t n_symbols,
                                                                                   int64_t context_length,
                                                                                   int64_t embed_dim,
                                                                                   int64_t n_targets, int64_t mc,
                                                                                   std::optional<std::string> keys)
    : FlatAccumulator(vea_layout(kWhere, (check::positive_int(kWhere, "num_symbols", n_symbols), n_symbols),
                                 (check::positive_int(kWhere, "context_length", context_length), context_length),
                                 (check::positive_int(kWhere, "embed_dim", embed_dim), embed_dim),
                                 (check::positive_int(kWhere, "num_targets", n_targets), n_targets))),
      S_(n_symbols),
      N_(context_length),
      D_(embed_dim),
      T_(n_targets),
      mc_(mc) {
  check::positive_int(kWhere, "mc", mc);
  set_keys(std::move(keys));
}

void VariationalEmbeddingAttentionAccumulator::validate(std::string_view where) const {
  check_entries(where);
  check_mass_laws(where, variational::span_sum(field(2), S_ * T_));
}

void VariationalEmbeddingAttentionAccumulator::validate_owned(std::string_view where, const StatsSplit& split,
                                                              const Communicator& comm) const {
  detail::on_every_rank(&comm, [&] { check_entries(where, &split); });
  check_mass_laws(where, run_total(*this, split.runs.back(), comm));  // emission_count's run
}

void VariationalEmbeddingAttentionAccumulator::check_mass_laws(std::string_view where, double emitted) const {
  // n and position_count are summed whole on a sharded M-step's ranks: every rank agrees
  check_mass_law(where, "n", n(), "sum(position_count)", variational::span_sum(field(3), N_));
  check_mass_law(where, "n", n(), "sum(emission_count)", emitted);
}

void VariationalEmbeddingAttentionAccumulator::set_zero() {
  FlatStats::set_zero();
  state_.reset();
}

void VariationalEmbeddingAttentionAccumulator::initialize(const VariationalEmbeddingAttentionBatch& batch,
                                                          std::span<const double> w, Rng& rng) {
  const Index rows = batch.n_rows();
  check::weights(kWhere, w, rows);
  if (rows > 0) {
    check::dimension(kWhere, "context length N", N_, batch.context_length());
    if (batch.max_symbol() >= S_ || batch.max_target() >= T_)
      throw ValueError(std::string(kWhere) + ": out-of-range ID in the initialisation batch");
  }
  std::vector<double> a(static_cast<size_t>(N_));
  MatrixMap emission = emission_count();
  VectorMap position = position_count();
  double total = 0.0;
  for (Index row = 0; row < rows; ++row) {
    rng.dirichlet_ones(a);
    const double wn = w[static_cast<size_t>(row)];
    const int64_t* c = batch.context(row);
    const int64_t t = batch.target(row);
    for (Index i = 0; i < N_; ++i) {
      emission(c[i], t) += wn * a[static_cast<size_t>(i)];
      position[i] += wn * a[static_cast<size_t>(i)];
    }
    total += wn;
  }
  n() += total;
}

void VariationalEmbeddingAttentionAccumulator::initialize_shard(const VariationalEmbeddingAttentionBatch& batch,
                                                                std::span<const double> w, Rng& rng,
                                                                Index rows_before, Index rows_after) {
  rng.discard_dirichlet_ones(rows_before, N_);
  initialize(batch, w, rng);
  rng.discard_dirichlet_ones(rows_after, N_);
}

VariationalEmbeddingAttentionEncoder VariationalEmbeddingAttentionAccumulator::encoder() const { return {S_, N_, T_}; }

// ---- estimator --------------------------------------------------------------------------------------------------

VariationalEmbeddingAttentionEstimator::VariationalEmbeddingAttentionEstimator(
    int64_t n_symbols, int64_t context_length, int64_t embed_dim, int64_t n_targets,
    VariationalEmbeddingAttentionEstimatorOptions options)
    : S_(n_symbols), N_(context_length), D_(embed_dim), T_(n_targets), options_(std::move(options)) {
  check::positive_int(kWhere, "num_symbols", S_);
  check::positive_int(kWhere, "context_length", N_);
  check::positive_int(kWhere, "embed_dim", D_);
  check::positive_int(kWhere, "num_targets", T_);
  check::positive_int(kWhere, "mc", options_.mc);
  static_cast<void>(vea_layout(kWhere, S_, N_, D_, T_));  // the statistics must have a size that can exist
  static_cast<void>(checked_product(kWhere, "the Monte-Carlo embedding tables (mc x num_symbols x embed_dim)",
                                    {options_.mc, S_, D_}));
  check::variance(kWhere, "sigma2", options_.sigma2);
  check::positive_real(kWhere, "lr", options_.lr);
  check::nonnegative_real(kWhere, "prior_strength", options_.prior_strength);
  check::nonnegative_real(kWhere, "emission_smoothing", options_.emission_smoothing);
}

VariationalEmbeddingAttentionAccumulator VariationalEmbeddingAttentionEstimator::make_accumulator() const {
  return {S_, N_, D_, T_, options_.mc, options_.keys};
}

VariationalEmbeddingAttentionEncoder VariationalEmbeddingAttentionEstimator::encoder() const { return {S_, N_, T_}; }

void VariationalEmbeddingAttentionEstimator::check_layout(const VariationalEmbeddingAttentionAccumulator& acc) const {
  if (acc.n_symbols() != S_ || acc.context_length() != N_ || acc.embed_dim() != D_ || acc.n_targets() != T_)
    throw ValueError(std::string(kWhere) + ": statistics must have the layout [" +
                     make_accumulator().layout().describe() + "] (got [" + acc.layout().describe() + "])");
}

VariationalEmbeddingAttention VariationalEmbeddingAttentionEstimator::estimate(
    std::optional<double> nobs, const VariationalEmbeddingAttentionAccumulator& acc) const {
  check_layout(acc);
  acc.validate(kWhere);
  if (nobs) check_mass_law(kWhere, "nobs", *nobs, "n", acc.n());
  return estimate_symbols(acc, all_symbols(S_), nullptr);
}

VariationalEmbeddingAttention VariationalEmbeddingAttentionEstimator::estimate_sharded(
    VariationalEmbeddingAttentionAccumulator& acc, const Communicator& comm) const {
  check_layout(acc);
  return variational::sharded_mstep(kWhere, acc, comm,
                                    [&](const SymbolShard& shard) { return estimate_symbols(acc, shard, &comm); });
}

VariationalEmbeddingAttention VariationalEmbeddingAttentionEstimator::estimate_symbols(
    const VariationalEmbeddingAttentionAccumulator& acc, const SymbolShard& shard, const Communicator* comm) const {
  VariationalEmbeddingAttentionParams p;
  constexpr double kInitialScale = 0.1;  // docs/mechanisms.md#variational-embedding-attention: m = 0.1 · N(0, 1)
  const double lambda = options_.prior_strength;
  p.optimizer_state =
      variational::next_state(kWhere, VariationalEmbeddingAttention::kFamily, acc.optimizer_state(), acc.grad_mean(),
                              acc.grad_log_var(), options_.seed, kInitialScale, options_.lr,
                              [lambda](int64_t /*tau*/) { return lambda; });
  p.mean = p.optimizer_state->mean;
  p.log_var = p.optimizer_state->log_var;
  p.emission = smoothed_emission(acc.emission_count(), options_.emission_smoothing, shard, comm);
  const ConstVectorMap counts = acc.position_count();
  const double total = variational::span_sum(counts.data(), N_);
  p.position_prior = total > 0.0 ? Vector(counts / total) : Vector::Constant(N_, 1.0 / static_cast<double>(N_));
  p.sigma2 = options_.sigma2;
  p.name = options_.name;
  return VariationalEmbeddingAttention(std::move(p), options_.precision);
}

// ---- model conveniences -----------------------------------------------------------------------------------------

VariationalEmbeddingAttentionAccumulator VariationalEmbeddingAttention::make_accumulator() const {
  return {n_symbols(), context_length(), embed_dim(), n_targets(), VariationalEmbeddingAttentionEstimatorOptions{}.mc};
}

VariationalEmbeddingAttentionEstimator VariationalEmbeddingAttention::estimator() const {
  VariationalEmbeddingAttentionEstimatorOptions options;
  options.sigma2 = params_.sigma2;
  options.seed = state_->seed;
  options.name = params_.name;
  options.precision = precision_;
  return {n_symbols(), context_length(), embed_dim(), n_targets(), std::move(options)};
}

VariationalEmbeddingAttentionEncoder VariationalEmbeddingAttention::encoder() const {
  return {n_symbols(), context_length(), n_targets()};
}

VariationalEmbeddingAttentionSampler VariationalEmbeddingAttention::sampler(uint64_t seed) const {
  return {*this, seed, false};
}

VariationalEmbeddingAttentionSampler VariationalEmbeddingAttention::posterior_predictive_sampler(uint64_t seed) const {
  return {*this, seed, true};
}

// ---- sampler ----------------------------------------------------------------------------------------------------

VariationalEmbeddingAttentionSampler::VariationalEmbeddingAttentionSampler(VariationalEmbeddingAttention model,
                                                                           uint64_t seed, bool posterior_predictive)
    : model_(std::move(model)), rng_(seed), posterior_predictive_(posterior_predictive), table_(model_.mean()) {}

VariationalEmbeddingAttentionObservation VariationalEmbeddingAttentionSampler::sample() {
  const int64_t S = model_.n_symbols();
  const int64_t N = model_.context_length();
  if (posterior_predictive_) variational::draw_table(model_.mean(), model_.log_var(), rng_, table_);
  VariationalEmbeddingAttentionObservation obs;
  if (N <= S) {
    obs.context = rng_.sample_without_replacement(S, N);
  } else {
    obs.context.resize(static_cast<size_t>(N));
    for (int64_t& c : obs.context) c = static_cast<int64_t>(rng_.uniform_int(static_cast<uint64_t>(S)));
  }
  obs.query = static_cast<int64_t>(rng_.uniform_int(static_cast<uint64_t>(S)));
  std::vector<double> gate(static_cast<size_t>(N));
  const double inv_two_sigma2 = 0.5 / model_.sigma2();
  const Index D = model_.embed_dim();
  const double* eq = table_.data() + obs.query * D;
  for (int64_t i = 0; i < N; ++i) {
    const double prior = model_.position_prior()[i];
    const double* ec = table_.data() + obs.context[static_cast<size_t>(i)] * D;
    gate[static_cast<size_t>(i)] =
        prior > 0.0 ? std::log(prior) - variational::squared_distance(eq, ec, D) * inv_two_sigma2 : kNegInf;
  }
  const int64_t z = variational::draw_softmax(gate, rng_);
  const Matrix& B = model_.emission();
  const int64_t attended = obs.context[static_cast<size_t>(z)];
  obs.target = rng_.categorical({B.row(attended).data(), static_cast<size_t>(B.cols())});
  return obs;
}

VariationalEmbeddingAttentionBatch VariationalEmbeddingAttentionSampler::sample(Index m) {
  if (m < 0) throw ValueError("VariationalEmbeddingAttentionSampler: size must be >= 0 (got " + std::to_string(m) + ")");
  const int64_t N = model_.context_length();
  IdMatrix contexts(m, N);
  IdVector queries(m), targets(m);
  for (Index row = 0; row < m; ++row) {
    const VariationalEmbeddingAttentionObservation obs = sample();
    for (int64_t i = 0; i < N; ++i) contexts(row, i) = obs.context[static_cast<size_t>(i)];
    queries[row] = obs.query;
    targets[row] = obs.target;
  }
  return model_.encoder().encode(std::move(contexts), std::move(queries), std::move(targets));
}

}  // namespace attnmix
