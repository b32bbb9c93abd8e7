// SPDX-License-Identifier: Apache-2.0
// Sparse responsibility-attention statistics and the closed-form M-step (sparse_responsibility.hpp).
#include <algorithm>
#include <string>
#include <vector>

#include "attnmix/attention/sparse_responsibility.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"
#include "attnmix/stats/mass_law.hpp"

namespace attnmix {

namespace {

/// The patterns (SparsePatterns::check) and N ≥ 1, checked.
SparsePatterns checked(const char* where, SparsePatterns patterns, int64_t N) {
  patterns.check(where);
  check::positive_int(where, "context_length", N);
  return patterns;
}

std::shared_ptr<const StatLayout> sparse_layout(const SparsePatterns& p, int64_t N) {
  return std::make_shared<const StatLayout>(SparseResponsibilityAttentionAccumulator::kWhere,
                                            std::vector<FieldSpec>{
                                                {"key_sum", {p.keys->size()}, FieldKind::kReal},
                                                {"key_mass", {p.keys->rows()}, FieldKind::kCount},
                                                {"emission_count", {p.emission->size()}, FieldKind::kCount},
                                                {"position_count", {N}, FieldKind::kCount},
                                                {"query_sq", {}, FieldKind::kCount},
                                            });
}
}  // namespace

SparseResponsibilityAttentionAccumulator::SparseResponsibilityAttentionAccumulator(SparsePatterns patterns,
                                                                                   int64_t context_length,
                                                                                   std::optional<std::string> keys)
    : FlatAccumulator(sparse_layout(checked(kWhere, patterns, context_length), context_length)),
      patterns_(std::move(patterns)),
      N_(context_length) {
  set_keys(std::move(keys));
}

std::span<double> SparseResponsibilityAttentionAccumulator::span(int f) {
  return {field(static_cast<size_t>(f)), static_cast<size_t>(layout().fields()[static_cast<size_t>(f)].size)};
}

std::span<const double> SparseResponsibilityAttentionAccumulator::span(int f) const {
  return {field(static_cast<size_t>(f)), static_cast<size_t>(layout().fields()[static_cast<size_t>(f)].size)};
}

double SparseResponsibilityAttentionAccumulator::total_mass() const { return accurate_sum(position_count()); }

ResponsibilityAttentionEncoder SparseResponsibilityAttentionAccumulator::encoder() const {
  return {n_symbols(), N_, query_dim(), n_targets()};
}

void SparseResponsibilityAttentionAccumulator::validate(std::string_view where) const {
  check_entries(where);
  check_mass_laws(where, accurate_sum(emission_count()));
}

void SparseResponsibilityAttentionAccumulator::check_mass_laws(std::string_view where, double emitted) const {
  const double mass = total_mass();  // position_count and key_mass are summed whole on a sharded M-step's ranks
  check_mass_law(where, "sum(position_count)", mass, "sum(key_mass)", accurate_sum(key_mass()));
  check_mass_law(where, "sum(position_count)", mass, "sum(emission_count)", emitted);
}

void SparseResponsibilityAttentionAccumulator::validate_owned(std::string_view where, const StatsSplit& split,
                                                              const Communicator& comm) const {
  detail::on_every_rank(&comm, [&] { check_entries(where, &split); });
  check_mass_laws(where, run_total(*this, split.runs.back(), comm));  // emission_count's run
}

void SparseResponsibilityAttentionAccumulator::merge_attachment(const SparseResponsibilityAttentionAccumulator& other,
                                                                AttachmentMerge /*how*/) const {
  if (!(patterns_ == other.patterns_))
    throw ValueError(std::string(kWhere) + ": statistics over other patterns (they count other cells)");
}

void SparseResponsibilityAttentionAccumulator::initialize(const ResponsibilityAttentionBatch& batch,
                                                          std::span<const double> w, Rng& rng) {
  check::weights(kWhere, w, batch.n_rows());
  if (batch.n_rows() == 0) return;
  if (!batch.has_symbol_queries())
    throw ValueError(std::string(kWhere) + ": sparse tables take symbol queries (one id per row), not query vectors");
  check::dimension(kWhere, "batch context length N", N_, batch.context_length());
  batch.check_query_dim(kWhere, query_dim());
  if (batch.max_symbol() >= n_symbols() || batch.max_target() >= n_targets())
    throw ValueError(std::string(kWhere) + ": out-of-range ID in batch for S = " + std::to_string(n_symbols()) +
                     ", T = " + std::to_string(n_targets()));
  // The cells of every row first, so that a pair outside the patterns changes nothing.
  const Index n_rows = batch.n_rows();
  std::vector<Index> key_cell(static_cast<size_t>(n_rows * N_));
  std::vector<Index> emission_cell(key_cell.size());
  for (Index n = 0; n < n_rows; ++n)
    for (Index i = 0; i < N_; ++i) {
      const auto k = static_cast<size_t>(n * N_ + i);
      const int64_t s = batch.context(n)[i];
      key_cell[k] = patterns_.keys->find(s, batch.query_symbol(n));
      emission_cell[k] = patterns_.emission->find(s, batch.target(n));
      if (w[static_cast<size_t>(n)] != 0.0 && (key_cell[k] < 0 || emission_cell[k] < 0))
        throw ValueError(std::string(kWhere) + ": row " + std::to_string(n) + " holds a pair of context symbol " +
                         std::to_string(s) + " that the patterns do not list");
    }
  std::vector<double> r(static_cast<size_t>(N_));
  for (Index n = 0; n < n_rows; ++n) {
    rng.dirichlet_ones(r);  // every row, whatever w_n is (the dense family's draws)
    const double wn = w[static_cast<size_t>(n)];
    if (wn == 0.0) continue;
    double r_total = 0.0;
    for (Index i = 0; i < N_; ++i) {
      const auto k = static_cast<size_t>(n * N_ + i);
      const double wr = wn * r[static_cast<size_t>(i)];
      key_sum()[static_cast<size_t>(key_cell[k])] += wr;
      key_mass()[static_cast<size_t>(batch.context(n)[i])] += wr;
      emission_count()[static_cast<size_t>(emission_cell[k])] += wr;
      position_count()[static_cast<size_t>(i)] += wr;
      r_total += r[static_cast<size_t>(i)];
    }
    query_sq() += wn * r_total;
  }
}

void SparseResponsibilityAttentionAccumulator::initialize_shard(const ResponsibilityAttentionBatch& batch,
                                                                std::span<const double> w, Rng& rng,
                                                                Index rows_before, Index rows_after) {
  rng.discard_dirichlet_ones(rows_before, N_);
  initialize(batch, w, rng);
  rng.discard_dirichlet_ones(rows_after, N_);
}

SparseResponsibilityAttentionEstimator::SparseResponsibilityAttentionEstimator(
    SparsePatterns patterns, int64_t context_length, SparseResponsibilityAttentionEstimatorOptions options)
    : patterns_(checked(kWhere, std::move(patterns), context_length)),
      N_(context_length),
      options_(std::move(options)) {
  check::variance(kWhere, "sigma2", options_.sigma2);
  check::variance(kWhere, "min_sigma2", options_.min_sigma2);
  check::nonnegative_real(kWhere, "emission_smoothing", options_.emission_smoothing);
}

SparseResponsibilityAttentionAccumulator SparseResponsibilityAttentionEstimator::make_accumulator() const {
  return {patterns_, N_, options_.keys};
}

ResponsibilityAttentionEncoder SparseResponsibilityAttentionEstimator::encoder() const {
  return {n_symbols(), N_, query_dim(), n_targets()};
}

void SparseResponsibilityAttentionEstimator::check_patterns(const SparseResponsibilityAttentionAccumulator& acc) const {
  if (!(acc.patterns() == patterns_) || acc.context_length() != N_)
    throw ValueError(std::string(kWhere) + ": statistics over other patterns or context length (expected [" +
                     make_accumulator().layout().describe() + "], got [" + acc.layout().describe() + "])");
}

SparseResponsibilityAttention SparseResponsibilityAttentionEstimator::estimate(
    std::optional<double> nobs, const SparseResponsibilityAttentionAccumulator& acc) const {
  check_patterns(acc);
  acc.validate(kWhere);
  if (nobs) check_mass_law(kWhere, "nobs", *nobs, "sum(position_count)", acc.total_mass());
  return estimate_symbols(acc, all_symbols(n_symbols()), nullptr);
}

namespace {
/// The run of a compressed field (key pairs or emission cells) at flat offset, split by shard's symbols.
StatsSplit::Run pattern_run(Index offset, const SymbolShard& shard, const SparsePattern& pattern) {
  return symbol_run(offset, shard, [&pattern](Index s) { return pattern.begin(s); });
}
}  // namespace

SparseResponsibilityAttention SparseResponsibilityAttentionEstimator::estimate_sharded(
    SparseResponsibilityAttentionAccumulator& acc, const Communicator& comm) const {
  check_patterns(acc);
  const SymbolShard shard = symbol_shard(comm, n_symbols());
  const std::vector<FieldSpec>& fields = acc.layout().fields();
  const StatsSplit split{{pattern_run(fields[0].offset, shard, *patterns_.keys),
                          pattern_run(fields[2].offset, shard, *patterns_.emission)},
                         comm.rank()};  // key_sum, emission_count
  sum_owned_statistics(acc, comm, split);
  acc.validate_owned(kWhere, split, comm);
  return estimate_symbols(acc, shard, &comm);
}

SparseResponsibilityAttention SparseResponsibilityAttentionEstimator::estimate_symbols(
    const SparseResponsibilityAttentionAccumulator& acc, const SymbolShard& shard, const Communicator* comm) const {
  const SparsePattern& keys = *patterns_.keys;
  const SparsePattern& cells = *patterns_.emission;
  const Index S = n_symbols();
  const auto T = static_cast<double>(n_targets());
  const double eps = options_.emission_smoothing;
  const auto gather = [&](Vector& values, const SparsePattern* pattern) {
    if (!comm) return;
    if (pattern) {
      const StatsSplit::Run run = pattern_run(0, shard, *pattern);
      comm->gather_blocks({values.data(), static_cast<size_t>(values.size())}, run.blocks);
    } else {
      gather_rows(values.data(), 1, shard, *comm);
    }
  };

  SparseResponsibilityAttentionParams p;
  p.patterns = patterns_;
  p.name = options_.name;
  const std::span<const double> key_sum = acc.key_sum();
  const std::span<const double> key_mass = acc.key_mass();
  p.key_values.resize(keys.size());
  for (Index s = shard.begin; s < shard.end; ++s)
    for (Index k = keys.begin(s); k < keys.end(s); ++k)
      p.key_values[k] =
          key_sum[static_cast<size_t>(k)] / std::max(key_mass[static_cast<size_t>(s)], kResponsibilityKeyMassFloor);
  gather(p.key_values, &keys);

  // Row s of B: (count + ε) / total at its listed cells and ε / total at the T − k_s others, total = Σ_t (count + ε).
  const std::span<const double> counts = acc.emission_count();
  p.emission_values.resize(cells.size());
  p.emission_default.resize(S);
  std::vector<double> row;
  for (Index s = shard.begin; s < shard.end; ++s) {
    row.assign(counts.begin() + cells.begin(s), counts.begin() + cells.end(s));
    for (double& c : row) c += eps;
    row.push_back(eps * (T - static_cast<double>(cells.end(s) - cells.begin(s))));
    const double total = accurate_sum(row);
    for (Index k = cells.begin(s); k < cells.end(s); ++k)
      p.emission_values[k] = total > 0.0 ? (counts[static_cast<size_t>(k)] + eps) / total : 1.0 / T;
    p.emission_default[s] = total > 0.0 ? eps / total : 1.0 / T;
  }
  gather(p.emission_values, &cells);
  gather(p.emission_default, nullptr);

  const double mass = acc.total_mass();
  const std::span<const double> positions = acc.position_count();
  p.position_prior.resize(N_);
  for (Index i = 0; i < N_; ++i)
    p.position_prior[i] = mass > 0.0 ? positions[static_cast<size_t>(i)] / mass : 1.0 / static_cast<double>(N_);

  p.sigma2 = options_.sigma2;
  if (options_.estimate_sigma2) {
    const double m_tot = accurate_sum(key_mass);
    if (m_tot > 0.0) {
      Vector explained(S);  // ‖key_sum_s‖² / m_s, summed in symbol order
      for (Index s = shard.begin; s < shard.end; ++s) {
        double sq = 0.0;
        for (Index k = keys.begin(s); k < keys.end(s); ++k) {
          const double x = key_sum[static_cast<size_t>(k)];
          sq += x * x;
        }
        explained[s] = sq / std::max(key_mass[static_cast<size_t>(s)], kResponsibilityKeyMassFloor);
      }
      gather(explained, nullptr);
      double total = 0.0;
      for (Index s = 0; s < S; ++s) total += explained[s];
      const double scatter = acc.query_sq() - total;
      p.sigma2 = std::max(scatter / (static_cast<double>(query_dim()) * m_tot), options_.min_sigma2);
    }
  }
  return SparseResponsibilityAttention(std::move(p));
}

}  // namespace attnmix
