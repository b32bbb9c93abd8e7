// SPDX-License-Identifier: Apache-2.0
/// @file distribution_contract.hpp
/// The shared distribution contract (docs/mechanisms.md#building-blocks, STYLE.md §11) as a typed GoogleTest suite.
/// Instantiate it once per family with a traits struct (Batch, Acc, Estimator: the family's):
///
///   using Distribution = X;
///   static constexpr uint64_t kSeed;          default test seed (ATTNMIX_TEST_SEED overrides)
///   static X make_model(Rng&);                a random valid model
///   static Batch make_batch(const X&, Index n, Rng&);   n random rows, possible under the model
///   static Batch row_alone(const Batch&, Index row);    that row encoded on its own (C-1)
///   static Estimator make_estimator(const X&);          the family's estimator for the model
///   static constexpr bool kExactEm;           EM provably never decreases the log-likelihood (false for
///                                             generalised-EM families such as chained attention,
///                                             docs/mechanisms.md#chained-attention)
///   static Acc other_layout_accumulator(const X&);      same family, another layout (C-5)
///   static double total_mass(const Acc&);     the mass estimate() checks nobs against (C-7)
///   static bool tamper(Acc&);                 break an internal mass law; false if none (C-7)
///   static std::optional<ImpossibleCase<X>> impossible_case(Rng&);  families with impossible evidence,
///                                             instantiated in ImpossibleEvidenceContractTest (C-6)
///   static std::vector<std::pair<Estimator, Acc>> large_support(Rng&);  T = 1e5; families with a
///                                             large discrete support, in LargeSupportContractTest (C-8)
///
/// Each test names its acceptance row. Tolerances: "rel x" is |a − b| ≤ x·(1 + |b|) per packed
/// entry (within a factor 2 of the acceptance tasks' x·max(1, |b|)); "exact" is == on every entry.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/reduce.hpp"
#include "testing/all_close.hpp"

namespace attnmix::contract {

/// A model with impossible rows, the batch and the (ascending) rows whose log density is −∞.
template <class D>
struct ImpossibleCase {
  D model;
  typename D::batch_type batch;
  std::vector<int64_t> rows;
};

/// What every family must offer to optimize() and to the Any* handles (checked at compile time).
template <class D>
concept ContractDistribution = std::copyable<D> && std::copyable<typename D::accumulator_type> &&
    requires(const D& d, const typename D::batch_type& b, std::span<double> out,
             std::span<const double> w, typename D::accumulator_type& acc,
             const typename D::accumulator_type& cacc, std::span<double> buf,
             std::span<const double> cbuf) {
  { D::kFamily } -> std::convertible_to<const char*>;
  { D::kWhere } -> std::convertible_to<const char*>;
  { b.n_rows() } -> std::convertible_to<Index>;
  { b.slice(Index{0}, Index{0}) } -> std::same_as<typename D::batch_type>;
  { d.log_density(b, out) } -> std::same_as<void>;
  { d.accumulate(b, w, acc, out) } -> std::same_as<void>;
  { d.make_accumulator() } -> std::same_as<typename D::accumulator_type>;
  { d.estimator().estimate(std::optional<double>{}, cacc) } -> std::same_as<D>;
  { cacc.flat_size() } -> std::convertible_to<Index>;
  { cacc.pack(buf) } -> std::same_as<void>;
  { acc.unpack(cbuf) } -> std::same_as<void>;
  { acc.combine(cacc) } -> std::same_as<void>;
  { acc.from_value(cacc.value()) } -> std::same_as<void>;
  { acc.scale(1.0) } -> std::same_as<void>;
  { cacc == cacc } -> std::convertible_to<bool>;
};

/// A batch type no family accepts (C-5: a batch of another family through Any → TypeError).
struct ForeignBatch {
  Index n = 0;
  [[nodiscard]] Index n_rows() const { return n; }
  [[nodiscard]] ForeignBatch slice(Index /*begin*/, Index count) const { return {count}; }
};

/// An accumulator no family accepts (C-5).
class ForeignAccumulator : public FlatAccumulator<ForeignAccumulator> {
 public:
  static constexpr const char* kWhere = "ForeignAccumulator";
  using batch_type = ForeignBatch;
  ForeignAccumulator()
      : FlatAccumulator(std::make_shared<const StatLayout>(
            kWhere,
            std::vector<FieldSpec>{{"x", {}, FieldKind::kCount}})) {}
  void validate(std::string_view where) const { check_entries(where); }
  void initialize(const ForeignBatch& /*batch*/, std::span<const double> /*w*/, Rng& /*rng*/) {}
};

template <class Acc>
[[nodiscard]] std::vector<double> packed(const Acc& acc) {
  std::vector<double> out(static_cast<size_t>(acc.flat_size()));
  acc.pack(out);
  return out;
}

template <class D>
[[nodiscard]] typename D::accumulator_type accumulate_all(const D& model,
                                                          const typename D::batch_type& batch,
                                                          std::span<const double> w) {
  auto acc = model.make_accumulator();
  model.accumulate(batch, w, acc);
  return acc;
}

template <class D>
[[nodiscard]] std::vector<double> log_densities(const D& model,
                                                const typename D::batch_type& batch) {
  std::vector<double> out(static_cast<size_t>(batch.n_rows()));
  model.log_density(batch, out);
  return out;
}

/// Weights uniform on [0.25, 2).
[[nodiscard]] inline std::vector<double> random_weights(Rng& rng, Index n) {
  std::vector<double> w(static_cast<size_t>(n));
  for (double& v : w) v = 0.25 + 1.75 * rng.uniform();
  return w;
}

template <class B>
[[nodiscard]] AnyBatch to_any(const B& batch) {
  if constexpr (std::same_as<B, AnyBatch>)
    return batch;
  else
    return AnyBatch(batch);
}

/// rel 1e-12 per entry (see the file comment).
inline void ExpectRelClose(const std::vector<double>& actual, const std::vector<double>& expected,
                           double rel = 1e-12) {
  testing::ExpectAllClose(actual, expected, rel, rel);
}

/// f must throw ValueError whose message contains "cannot exceed" or "must equal" (docs/mechanisms.md#building-blocks).
template <class F>
void ExpectMassLawError(F&& f, std::string_view context) {
  try {
    f();
    ADD_FAILURE() << context << ": no exception";
  } catch (const ValueError& e) {
    const std::string what = e.what();
    EXPECT_TRUE(what.find("cannot exceed") != std::string::npos ||
                what.find("must equal") != std::string::npos)
        << context << ": " << what;
  } catch (const std::exception& e) {
    ADD_FAILURE() << context << ": wrong exception type: " << e.what();
  }
}

template <class Traits>
class DistributionContractTest : public ::testing::Test {
 protected:
  using D = typename Traits::Distribution;
  static_assert(ContractDistribution<D>);

  const uint64_t seed_ = testing::test_seed(Traits::kSeed);
  const ::testing::ScopedTrace trace_{__FILE__, __LINE__, "test seed " + std::to_string(seed_)};
  Rng rng_{seed_};
};

TYPED_TEST_SUITE_P(DistributionContractTest);

/// C-6 runs only for families that have impossible evidence (traits with impossible_case).
template <class Traits>
class ImpossibleEvidenceContractTest : public DistributionContractTest<Traits> {};
TYPED_TEST_SUITE_P(ImpossibleEvidenceContractTest);

/// C-8 runs only for families with a large discrete support (traits with large_support).
template <class Traits>
class LargeSupportContractTest : public DistributionContractTest<Traits> {};
TYPED_TEST_SUITE_P(LargeSupportContractTest);

/// C-1: batch log_density equals per-row log_density of each row encoded alone (rel 1e-12); slices,
/// the E-step's log_p_out and the AnyDistribution handle agree exactly.
TYPED_TEST_P(DistributionContractTest, BatchLogDensityEqualsPerRowLogDensity) {
  const auto model = TypeParam::make_model(this->rng_);
  const auto batch = TypeParam::make_batch(model, 25, this->rng_);
  const std::vector<double> log_p = log_densities(model, batch);
  for (Index row = 0; row < batch.n_rows(); ++row) {
    const std::vector<double> alone = log_densities(model, TypeParam::row_alone(batch, row));
    ASSERT_EQ(alone.size(), 1u);
    ExpectRelClose(alone, {log_p[static_cast<size_t>(row)]});
    EXPECT_EQ(log_densities(model, batch.slice(row, 1))[0], log_p[static_cast<size_t>(row)])
        << "row " << row;
    EXPECT_TRUE(std::isfinite(log_p[static_cast<size_t>(row)])) << "row " << row;
  }
  auto acc = model.make_accumulator();
  std::vector<double> from_estep(static_cast<size_t>(batch.n_rows()));
  model.accumulate(batch, random_weights(this->rng_, batch.n_rows()), acc, from_estep);
  ExpectRelClose(from_estep, log_p);
  std::vector<double> via_any(log_p.size());
  AnyDistribution(model).log_density(to_any(batch), via_any);
  EXPECT_EQ(via_any, log_p);
}

/// C-2: merge = concatenation: acc(A ∪ B) equals acc(A).combine(acc(B)) (rel 1e-12 per packed
/// entry); the AnyAccumulator handle combines to the same bits.
TYPED_TEST_P(DistributionContractTest, MergeEqualsConcatenation) {
  const auto model = TypeParam::make_model(this->rng_);
  const Index n = 60, k = 23;
  const auto batch = TypeParam::make_batch(model, n, this->rng_);
  const std::vector<double> w = random_weights(this->rng_, n);
  const std::span<const double> ws(w);
  const auto whole = accumulate_all(model, batch, ws);
  auto a = accumulate_all(model, batch.slice(0, k), ws.first(static_cast<size_t>(k)));
  const auto b = accumulate_all(model, batch.slice(k, n - k), ws.subspan(static_cast<size_t>(k)));
  AnyAccumulator any_a(a);
  any_a.combine(AnyAccumulator(b));
  a.combine(b);
  ExpectRelClose(packed(a), packed(whole));
  EXPECT_EQ(packed(any_a), packed(a));
}

/// C-3: from_value(value()) and unpack(pack()) round-trip exactly.
TYPED_TEST_P(DistributionContractTest, ValueAndPackRoundTripExactly) {
  const auto model = TypeParam::make_model(this->rng_);
  const auto batch = TypeParam::make_batch(model, 30, this->rng_);
  const auto acc = accumulate_all(model, batch, random_weights(this->rng_, 30));
  auto copy = model.make_accumulator();
  copy.from_value(acc.value());
  EXPECT_EQ(packed(copy), packed(acc));
  EXPECT_TRUE(copy == acc);
  auto unpacked = model.make_accumulator();
  unpacked.unpack(packed(acc));
  EXPECT_EQ(packed(unpacked), packed(acc));
  EXPECT_TRUE(unpacked == acc);
  AnyAccumulator any(model.make_accumulator());
  any.unpack(packed(acc));
  EXPECT_EQ(packed(any), packed(acc));
  EXPECT_TRUE(any == AnyAccumulator(acc));
}

/// C-3: value() is a snapshot: later E-steps, scale, combine and from_value on the accumulator
/// (concrete or through AnyAccumulator) never change it.
TYPED_TEST_P(DistributionContractTest, ValueIsASnapshot) {
  const auto model = TypeParam::make_model(this->rng_);
  const auto batch = TypeParam::make_batch(model, 20, this->rng_);
  const std::vector<double> w = random_weights(this->rng_, 20);
  auto acc = accumulate_all(model, batch, w);
  const auto snapshot = acc.value();
  const std::vector<double> before = packed(snapshot);
  model.accumulate(batch, w, acc);
  acc.scale(3.0);
  acc.combine(snapshot);
  EXPECT_EQ(packed(snapshot), before);
  auto copy = acc;  // copies are deep too
  model.accumulate(batch, w, copy);
  EXPECT_NE(packed(copy), packed(acc));

  AnyAccumulator any(accumulate_all(model, batch, w));
  const AnyAccumulator any_snapshot = any.value();
  any.scale(2.0);
  any.combine(any_snapshot);
  EXPECT_EQ(packed(any_snapshot), before);
}

/// C-4: zero-weight rows (leading and trailing) contribute exactly nothing; all-zero weights leave
/// the identity.
TYPED_TEST_P(DistributionContractTest, ZeroWeightsContributeNothing) {
  const auto model = TypeParam::make_model(this->rng_);
  const Index n = 40, lead = 2, trail = 3;
  const auto batch = TypeParam::make_batch(model, lead + n + trail, this->rng_);
  std::vector<double> w(static_cast<size_t>(lead + n + trail), 0.0);
  const std::vector<double> core_w = random_weights(this->rng_, n);
  std::copy(core_w.begin(), core_w.end(), w.begin() + lead);
  const auto with_zeros = accumulate_all(model, batch, w);
  const auto core = accumulate_all(model, batch.slice(lead, n), core_w);
  EXPECT_EQ(packed(with_zeros), packed(core));
  const std::vector<double> zeros(w.size(), 0.0);
  EXPECT_EQ(packed(accumulate_all(model, batch, zeros)), packed(model.make_accumulator()));
}

/// C-4: weights × c give every packed entry × c (scale), and weight 2 equals accumulating the rows
/// twice (rel 1e-12).
TYPED_TEST_P(DistributionContractTest, ScaledWeightsScaleStatistics) {
  const auto model = TypeParam::make_model(this->rng_);
  const Index n = 50;
  const auto batch = TypeParam::make_batch(model, n, this->rng_);
  const std::vector<double> w = random_weights(this->rng_, n);
  const double c = 2.5;
  std::vector<double> wc(w), w2(w);
  for (size_t i = 0; i < w.size(); ++i) {
    wc[i] *= c;
    w2[i] *= 2.0;
  }
  auto scaled = accumulate_all(model, batch, w);
  scaled.scale(c);
  ExpectRelClose(packed(accumulate_all(model, batch, wc)), packed(scaled));
  auto twice = accumulate_all(model, batch, w);
  model.accumulate(batch, w, twice);
  ExpectRelClose(packed(accumulate_all(model, batch, w2)), packed(twice));
}

/// C-5: documented invalid inputs raise the documented types and change nothing: bad weights and
/// output lengths, unpack sizes and scale factors → ValueError; a layout mismatch in
/// combine/from_value → ValueError; another family's batch or statistics through the Any handles →
/// TypeError.
TYPED_TEST_P(DistributionContractTest, InvalidInputsRaiseDocumentedTypes) {
  const auto model = TypeParam::make_model(this->rng_);
  const Index n = 10;
  const auto batch = TypeParam::make_batch(model, n, this->rng_);
  std::vector<double> w = random_weights(this->rng_, n);
  auto acc = accumulate_all(model, batch, w);
  const std::vector<double> before = packed(acc);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();

  EXPECT_THROW(model.accumulate(batch, std::span<const double>(w).first(n - 1), acc), ValueError);
  for (const double bad : {-1.0, nan, inf}) {
    std::vector<double> wb = w;
    wb[3] = bad;
    EXPECT_THROW(model.accumulate(batch, wb, acc), ValueError) << "weight " << bad;
    EXPECT_THROW(parallel_accumulate(model, batch, wb, acc, {}, ParallelOptions{1, 4}), ValueError);
  }
  std::vector<double> short_out(static_cast<size_t>(n - 1));
  EXPECT_THROW(model.log_density(batch, short_out), ValueError);
  EXPECT_THROW(acc.unpack(std::vector<double>(before.size() + 1, 0.0)), ValueError);
  EXPECT_THROW(acc.scale(-1.0), ValueError);
  EXPECT_THROW(acc.scale(nan), ValueError);
  const auto other = TypeParam::other_layout_accumulator(model);
  EXPECT_THROW(acc.combine(other), ValueError);
  EXPECT_THROW(acc.from_value(other), ValueError);
  EXPECT_EQ(packed(acc), before);

  const AnyDistribution any(model);
  AnyAccumulator any_acc(acc);
  std::vector<double> out3(3);
  const std::vector<double> w3(3, 1.0);
  EXPECT_THROW(any.log_density(AnyBatch(ForeignBatch{3}), out3), TypeError);
  EXPECT_THROW(any.accumulate(AnyBatch(ForeignBatch{3}), w3, any_acc), TypeError);
  AnyAccumulator foreign{ForeignAccumulator()};
  EXPECT_THROW(any.accumulate(to_any(batch), w, foreign), TypeError);
  Rng shard_rng(0);  // a family without initialize_shard cannot be fitted distributed, and says so
  EXPECT_THROW(foreign.initialize_shard(AnyBatch(ForeignBatch{3}), w3, shard_rng, 2, 1), ValueError);
  EXPECT_THROW(any_acc.combine(foreign), TypeError);
  EXPECT_THROW(any_acc.from_value(foreign), TypeError);
  EXPECT_THROW((void)AnyEstimator(TypeParam::make_estimator(model)).estimate(std::nullopt, foreign),
               TypeError);
  EXPECT_EQ(packed(any_acc), before);
}

/// C-6: impossible evidence: −∞ density exactly at the impossible rows; the E-step (direct,
/// chunk-parallel and through AnyDistribution) raises ImpossibleEvidenceError listing exactly those
/// rows and leaves the statistics bit-identical; the same rows with zero weight are accepted.
TYPED_TEST_P(ImpossibleEvidenceContractTest, ImpossibleEvidenceIsAtomic) {
  const auto impossible = TypeParam::impossible_case(this->rng_);
  ASSERT_TRUE(impossible.has_value());
  const auto& model = impossible->model;
  const auto& batch = impossible->batch;
  const std::vector<int64_t>& rows = impossible->rows;
  const std::vector<double> log_p = log_densities(model, batch);
  std::vector<double> w(log_p.size(), 1.0);
  for (size_t n = 0; n < log_p.size(); ++n) {
    const bool is_impossible =
        std::find(rows.begin(), rows.end(), static_cast<int64_t>(n)) != rows.end();
    EXPECT_EQ(log_p[n] == -std::numeric_limits<double>::infinity(), is_impossible) << "row " << n;
    if (is_impossible) {
      w[n] = 0.0;
    } else {
      EXPECT_TRUE(std::isfinite(log_p[n])) << "row " << n;
    }
  }
  // Zero-weight impossible rows are accepted and leave finite statistics.
  auto acc = model.make_accumulator();
  ASSERT_NO_THROW(model.accumulate(batch, w, acc));
  const std::vector<double> before = packed(acc);
  for (double v : before) EXPECT_TRUE(std::isfinite(v));

  const std::vector<double> ones(log_p.size(), 1.0);
  const auto expect_rows = [&](auto&& e_step, const char* path) {
    try {
      e_step();
      ADD_FAILURE() << path << ": no ImpossibleEvidenceError";
    } catch (const ImpossibleEvidenceError& e) {
      EXPECT_EQ(e.rows(), rows) << path;
      EXPECT_NE(std::string(e.what()).find("impossible evidence"), std::string::npos)
          << path << ": " << e.what();
    }
  };
  expect_rows([&] { model.accumulate(batch, ones, acc); }, "accumulate");
  EXPECT_EQ(packed(acc), before);
  expect_rows(
      [&] {
        parallel_accumulate(model, batch, ones, acc, {}, ParallelOptions{2, 2});
      },
      "parallel");
  EXPECT_EQ(packed(acc), before);
  AnyAccumulator any_acc(acc);
  expect_rows([&] { AnyDistribution(model).accumulate(to_any(batch), ones, any_acc); }, "any");
  EXPECT_EQ(packed(any_acc), before);
}

/// C-7: mass-law violations raise ValueError ("cannot exceed" / "must equal"): nobs against the
/// statistics in estimate(), and a tampered internal mass law in unpack / combine / from_value /
/// estimate (nothing changes).
TYPED_TEST_P(DistributionContractTest, MassLawViolationsRaise) {
  const auto model = TypeParam::make_model(this->rng_);
  const auto batch = TypeParam::make_batch(model, 30, this->rng_);
  const auto acc = accumulate_all(model, batch, random_weights(this->rng_, 30));
  const auto estimator = TypeParam::make_estimator(model);
  const double mass = TypeParam::total_mass(acc);
  ASSERT_GT(mass, 2.0);
  EXPECT_NO_THROW((void)estimator.estimate(mass, acc));
  ExpectMassLawError([&] { (void)estimator.estimate(mass - 1.0, acc); }, "nobs below the mass");
  ExpectMassLawError([&] { (void)estimator.estimate(mass + 1.0, acc); }, "nobs above the mass");
  // Within tol_mass (≈ 7.6e-6 relative) the law holds.
  EXPECT_NO_THROW((void)estimator.estimate(mass * (1.0 + 1e-7), acc));

  auto tampered = acc;
  if (!TypeParam::tamper(tampered)) return;  // the family has no internal mass law
  auto target = accumulate_all(model, batch.slice(0, 5), random_weights(this->rng_, 5));
  const std::vector<double> before = packed(target);
  ExpectMassLawError([&] { target.unpack(packed(tampered)); }, "unpack");
  ExpectMassLawError([&] { target.combine(tampered); }, "combine");
  ExpectMassLawError([&] { target.from_value(tampered); }, "from_value");
  ExpectMassLawError([&] { (void)estimator.estimate(std::nullopt, tampered); }, "estimate");
  AnyAccumulator any_target(target);
  ExpectMassLawError([&] { any_target.combine(AnyAccumulator(tampered)); },
                     "AnyAccumulator::combine");
  EXPECT_EQ(packed(target), before);
  EXPECT_EQ(packed(any_target), before);
}

/// C-8: estimator output from random statistics with a support of 10⁵ (T or K) passes the
/// constructor's 1e-12 simplex checks, with and without smoothing.
TYPED_TEST_P(LargeSupportContractTest, EstimateFromLargeSupportPassesSimplexChecks) {
    for (const auto& [estimator, acc] : TypeParam::large_support(this->rng_)) {
      EXPECT_NO_THROW({
        const auto fitted = estimator.estimate(std::nullopt, acc);
        const typename TypeParam::Distribution rebuilt(fitted.params());
        (void)rebuilt;
      });
      EXPECT_NO_THROW((void)estimator.estimate(TypeParam::total_mass(acc), acc));
    }
}

/// F-1: E-step statistics, per-row log densities and scores are bitwise identical for 1, 2, 3 and 8
/// threads (chunk_rows = 64, 1000 rows).
TYPED_TEST_P(DistributionContractTest, ThreadCountInvariance) {
  const auto model = TypeParam::make_model(this->rng_);
  const Index n = 1000;
  const auto batch = TypeParam::make_batch(model, n, this->rng_);
  const std::vector<double> w = random_weights(this->rng_, n);
  std::vector<std::vector<double>> stats, log_ps;
  std::vector<double> scores;
  for (const int threads : {1, 2, 3, 8}) {
    const ParallelOptions options{threads, 64};
    auto acc = model.make_accumulator();
    std::vector<double> log_p(static_cast<size_t>(n));
    parallel_accumulate(model, batch, w, acc, log_p, options);
    stats.push_back(packed(acc));
    log_ps.push_back(log_p);
    scores.push_back(score(model, batch, options));
  }
  for (size_t t = 1; t < stats.size(); ++t) {
    EXPECT_EQ(stats[t], stats[0]) << "thread setting " << t;
    EXPECT_EQ(log_ps[t], log_ps[0]) << "thread setting " << t;
    EXPECT_EQ(scores[t], scores[0]) << "thread setting " << t;
  }
  // Chunking changes results only at rounding level.
  auto serial = accumulate_all(model, batch, w);
  ExpectRelClose(stats[0], packed(serial));
}

/// Samplers: sample(m) has m rows that are possible under the model, the same seed gives the same
/// rows, and the AnyDistribution handle samples the same shape.
TYPED_TEST_P(DistributionContractTest, SamplerShapes) {
  const auto model = TypeParam::make_model(this->rng_);
  if constexpr (requires { model.sampler(uint64_t{0}).sample(Index{1}); }) {
    const auto batch = model.sampler(this->seed_).sample(Index{17});
    ASSERT_EQ(batch.n_rows(), 17);
    for (double lp : log_densities(model, batch)) EXPECT_TRUE(std::isfinite(lp));
    const auto again = model.sampler(this->seed_).sample(Index{17});
    const std::vector<double> ones(17, 1.0);
    EXPECT_EQ(packed(accumulate_all(model, again, ones)),
              packed(accumulate_all(model, batch, ones)));
    EXPECT_EQ(model.sampler(this->seed_).sample(Index{0}).n_rows(), 0);
    EXPECT_THROW((void)model.sampler(this->seed_).sample(Index{-1}), ValueError);
    EXPECT_EQ(AnyDistribution(model).sample(5, this->seed_).n_rows(), 5);
  } else {
    EXPECT_THROW((void)AnyDistribution(model).sample(5, this->seed_), ValueError);
  }
}

/// EM (docs/mechanisms.md#training) never decreases the log-likelihood of an exact-EM family (delta = None, 10
/// iterations, within 1e-9·|ll|; not asserted for generalised-EM families); optimize through AnyEstimator
/// reports the same scores bit for bit.
TYPED_TEST_P(DistributionContractTest, EmLogLikelihoodNeverDecreases) {
  const auto model = TypeParam::make_model(this->rng_);
  const auto batch = TypeParam::make_batch(model, 300, this->rng_);
  const auto estimator = TypeParam::make_estimator(model);
  std::vector<double> lls, any_lls;
  OptimizeOptions options;
  options.max_its = 10;
  options.delta = std::nullopt;
  options.init_p =
      1.0;  // every row in the initial statistics: no row starts impossible without smoothing
  options.seed = this->seed_;
  options.on_iteration = [&](const IterationReport& r) { lls.push_back(r.log_likelihood); };
  const auto fit = optimize(batch, estimator, options);
  ASSERT_EQ(lls.size(), 10u);
  if constexpr (TypeParam::kExactEm) {
    for (size_t i = 1; i < lls.size(); ++i)
      EXPECT_GE(lls[i], lls[i - 1] - 1e-9 * std::fabs(lls[i - 1])) << "iteration " << i + 1;
    EXPECT_GE(score(fit.model, batch, {}), lls.back() - 1e-9 * std::fabs(lls.back()));
  }

  options.on_iteration = [&](const IterationReport& r) { any_lls.push_back(r.log_likelihood); };
  const auto any_fit = optimize(to_any(batch), AnyEstimator(estimator), options);
  EXPECT_EQ(any_lls, lls);
  EXPECT_EQ(any_fit.model.family(), std::string(TypeParam::Distribution::kFamily));
}

REGISTER_TYPED_TEST_SUITE_P(DistributionContractTest, BatchLogDensityEqualsPerRowLogDensity,
                            MergeEqualsConcatenation, ValueAndPackRoundTripExactly,
                            ValueIsASnapshot, ZeroWeightsContributeNothing,
                            ScaledWeightsScaleStatistics, InvalidInputsRaiseDocumentedTypes,
                            MassLawViolationsRaise, ThreadCountInvariance,
                            SamplerShapes, EmLogLikelihoodNeverDecreases);
REGISTER_TYPED_TEST_SUITE_P(ImpossibleEvidenceContractTest, ImpossibleEvidenceIsAtomic);
REGISTER_TYPED_TEST_SUITE_P(LargeSupportContractTest, EstimateFromLargeSupportPassesSimplexChecks);

}  // namespace attnmix::contract
