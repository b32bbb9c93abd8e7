// SPDX-License-Identifier: Apache-2.0
// Responsibility attention with symbol queries (a query id q standing for the one-hot e_q) against the same rows
// with the one-hot vectors written out, the independent formulation: log p, responsibilities, predictions, the
// E-step's statistics, initialisation and whole EM fits agree to rounding; the fits are bitwise thread-count
// invariant; out-of-range symbols and VJPs of symbol queries are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/inference/optimize.hpp"
#include "testing/all_close.hpp"
#include "testing/mixed_precision_checks.hpp"
#include "testing/random_responsibility.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;

/// The same random rows twice: with symbol queries and with their one-hot rows.
struct TwoForms {
  ResponsibilityAttentionBatch symbols;
  ResponsibilityAttentionBatch one_hot;
};

TwoForms random_rows(Index n, Index S, Index N, Index D, Index T, Rng& rng) {
  IdMatrix contexts(n, N);
  IdVector queries(n);
  IdVector targets(n);
  Matrix one_hot = Matrix::Zero(n, D);
  for (Index row = 0; row < n; ++row) {
    for (Index i = 0; i < N; ++i) contexts(row, i) = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(S)));
    queries[row] = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(D)));
    targets[row] = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(T)));
    one_hot(row, queries[row]) = 1.0;
  }
  const ResponsibilityAttentionEncoder encoder{S, N, D, T};
  return {encoder.encode_symbols(contexts, queries, targets), encoder.encode(contexts, one_hot, targets)};
}

Matrix flat_of(const ResponsibilityAttentionAccumulator& acc) {
  return ConstMatrixMap(acc.flat().data(), 1, acc.flat_size());
}

/// log p, r, p(t | c, y) and the E-step statistics of symbol queries equal the one-hot rows' to 1e-12, for D = S
/// (text) and D ≠ S, in either precision (symbol queries run in float64 in both; the one-hot rows here too).
TEST(ResponsibilitySymbolTest, SymbolQueriesGiveTheOneHotResults) {
  Rng rng(testing::test_seed(901));
  for (const auto& [S, D] : {std::pair<Index, Index>{9, 9}, {7, 12}, {40, 40}})
    for (const Precision precision : {Precision::kFloat64, Precision::kMixed}) {
      const Index N = 6, T = 5, n = 300;
      const ResponsibilityAttentionParams p = testing::random_responsibility_params(S, N, D, T, rng, 0.4);
      const ResponsibilityAttention exact(p);
      const ResponsibilityAttention model(p, precision);
      const TwoForms rows = random_rows(n, S, N, D, T, rng);
      ASSERT_TRUE(rows.symbols.has_symbol_queries());
      EXPECT_EQ(rows.symbols.query_dim(), D);
      EXPECT_EQ(rows.symbols.queries(), rows.one_hot.queries());

      std::vector<double> symbol_log_p(n), one_hot_log_p(n);
      model.log_density(rows.symbols, symbol_log_p);
      exact.log_density(rows.one_hot, one_hot_log_p);
      for (Index row = 0; row < n; ++row)
        ASSERT_NEAR(symbol_log_p[row], one_hot_log_p[row], 1e-12 * (1 + std::abs(one_hot_log_p[row])));
      ExpectAllClose(model.responsibilities(rows.symbols), exact.responsibilities(rows.one_hot), 1e-12, 1e-12);
      ExpectAllClose(model.predict_proba(rows.symbols), exact.predict_proba(rows.one_hot), 1e-12, 1e-12);

      std::vector<double> w(n);
      for (double& x : w) x = rng.uniform();
      auto symbol_acc = model.make_accumulator();
      auto one_hot_acc = exact.make_accumulator();
      std::vector<double> from_e_step(n);
      model.accumulate(rows.symbols, w, symbol_acc, from_e_step);
      exact.accumulate(rows.one_hot, w, one_hot_acc);
      EXPECT_EQ(from_e_step, symbol_log_p);  // one pass 1 for both
      ExpectAllClose(flat_of(symbol_acc), flat_of(one_hot_acc), 1e-12, 1e-12);
      symbol_acc.validate("test");
    }
}

/// The random initialisation draws the same responsibilities and adds the same statistics, bit for bit (the one-hot
/// rows add w r · 0 to every other coordinate).
TEST(ResponsibilitySymbolTest, InitialisationIsTheOneHotRowsBitForBit) {
  Rng rng(testing::test_seed(902));
  const TwoForms rows = random_rows(200, 11, 4, 11, 6, rng);
  std::vector<double> w(200, 1.0);
  ResponsibilityAttentionAccumulator symbol_acc(11, 4, 11, 6), one_hot_acc(11, 4, 11, 6);
  Rng a(7), b(7);
  symbol_acc.initialize(rows.symbols, w, a);
  one_hot_acc.initialize(rows.one_hot, w, b);
  EXPECT_EQ(flat_of(symbol_acc), flat_of(one_hot_acc));
}

/// EM from the same start fits the one-hot rows' model (to 1e-10 after 15 iterations of rounding differences), with
/// σ² learned; and the symbol fit is bitwise the same for 1, 2 and 3 threads.
TEST(ResponsibilitySymbolTest, EmFitsTheOneHotModelAndIsThreadCountInvariant) {
  Rng rng(testing::test_seed(903));
  const TwoForms rows = random_rows(2500, 24, 8, 24, 24, rng);
  ResponsibilityAttentionEstimatorOptions options;
  options.estimate_sigma2 = true;
  const ResponsibilityAttentionEstimator est(24, 8, 24, 24, options);
  OptimizeOptions o;
  o.max_its = 15;
  o.delta = std::nullopt;
  o.seed = 5;
  const auto symbol_fit = optimize(rows.symbols, est, o);
  const auto one_hot_fit = optimize(rows.one_hot, est, o);
  ExpectAllClose(symbol_fit.model.params().key_means, one_hot_fit.model.params().key_means, 1e-10, 1e-10);
  ExpectAllClose(symbol_fit.model.params().emission, one_hot_fit.model.params().emission, 1e-10, 1e-10);
  ExpectAllClose(symbol_fit.model.params().position_prior, one_hot_fit.model.params().position_prior, 1e-10, 1e-10);
  EXPECT_NEAR(symbol_fit.model.sigma2(), one_hot_fit.model.sigma2(), 1e-10 * one_hot_fit.model.sigma2());
  ASSERT_EQ(symbol_fit.scores.size(), one_hot_fit.scores.size());
  for (size_t k = 0; k < symbol_fit.scores.size(); ++k)
    EXPECT_NEAR(symbol_fit.scores[k], one_hot_fit.scores[k], 1e-9 * std::abs(one_hot_fit.scores[k]));

  const auto fits = testing::fits_for_thread_counts(rows.symbols, est, 4);
  for (const auto& fit : {fits[1], fits[2]}) {
    EXPECT_EQ(fit.params().key_means, fits[0].params().key_means);
    EXPECT_EQ(fit.params().emission, fits[0].params().emission);
    EXPECT_EQ(fit.params().sigma2, fits[0].params().sigma2);
  }
}

/// The encoder infers D as 1 + the largest symbol, checks a declared D, and the model refuses symbols ≥ its D; the
/// VJPs, which differentiate real-valued queries, refuse symbol queries.
TEST(ResponsibilitySymbolTest, RangesAreCheckedAndVjpsRefuseSymbols) {
  IdMatrix contexts(2, 2);
  contexts << 0, 1, 1, 2;
  IdVector queries(2);
  queries << 4, 1;
  IdVector targets(2);
  targets << 0, 1;
  const auto inferred = ResponsibilityAttentionEncoder{}.encode_symbols(contexts, queries, targets);
  EXPECT_EQ(inferred.query_dim(), 5);
  EXPECT_EQ(inferred.max_query_symbol(), 4);
  EXPECT_EQ(inferred.query_symbols(), queries);
  ResponsibilityAttentionEncoder declared;
  declared.query_dim = 4;
  EXPECT_THROW((void)declared.encode_symbols(contexts, queries, targets), ValueError);
  EXPECT_THROW((void)ResponsibilityAttentionEncoder{}.encode_symbols(contexts, IdVector::Zero(3), targets), ValueError);
  IdVector negative = queries;
  negative[0] = -1;
  EXPECT_THROW((void)ResponsibilityAttentionEncoder{}.encode_symbols(contexts, negative, targets), ValueError);

  Rng rng(testing::test_seed(904));
  const ResponsibilityAttention narrow(testing::random_responsibility_params(3, 2, 4, 2, rng, 1.0));
  std::vector<double> log_p(2);
  EXPECT_THROW(narrow.log_density(inferred, log_p), ValueError);  // symbol 4 ≥ D = 4
  const ResponsibilityAttention wide(testing::random_responsibility_params(3, 2, 8, 2, rng, 1.0));
  wide.log_density(inferred, log_p);  // D = 8 > 4: the batch's own D (5) is only a lower bound
  EXPECT_TRUE(std::isfinite(log_p[0]) && std::isfinite(log_p[1]));
  EXPECT_THROW((void)wide.log_density_vjp(inferred, std::vector<double>{1.0, 1.0}), ValueError);
  EXPECT_THROW((void)wide.predict_proba_vjp(inferred, Matrix::Ones(2, 2)), ValueError);
}

}  // namespace
}  // namespace attnmix
