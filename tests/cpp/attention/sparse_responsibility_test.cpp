// SPDX-License-Identifier: Apache-2.0
// Responsibility attention with sparse tables against the dense family on the same symbol rows, the independent
// formulation: a sparse model and its dense expansion give the same log p, responsibilities, predictions and E-step
// statistics (at the patterns' cells; zero elsewhere), initialisations and whole EM fits agree to 1e-12 (σ² learned
// or not), the sparse fit is bitwise thread-count invariant, model files round-trip bit for bit, and pairs outside
// the patterns, real-valued queries, invalid tables and statistics of other patterns are refused with nothing changed.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/sparse_responsibility.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/io/model_file.hpp"
#include "testing/all_close.hpp"
#include "testing/mixed_precision_checks.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;

ResponsibilityAttentionBatch random_rows(Index n, Index S, Index N, Index D, Index T, Rng& rng) {
  IdMatrix contexts(n, N);
  IdVector queries(n);
  IdVector targets(n);
  const auto draw = [&](Index k) { return static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(k))); };
  for (Index row = 0; row < n; ++row) {
    for (Index i = 0; i < N; ++i) contexts(row, i) = draw(S);
    queries[row] = draw(D);
    targets[row] = draw(T);
  }
  return ResponsibilityAttentionEncoder{S, N, D, T}.encode_symbols(contexts, queries, targets);
}

/// A random sparse model over the rows' patterns: K normal at the key cells, each emission row's listed cells and
/// default drawn positive and normalised.
SparseResponsibilityAttention random_sparse(const ResponsibilityAttentionBatch& rows, Index S, Index N, Index D,
                                            Index T, Rng& rng) {
  SparseResponsibilityAttentionParams p;
  p.patterns = data_patterns(rows, S, D, T);
  p.key_values.resize(p.patterns.keys->size());
  for (double& k : p.key_values) k = 0.6 * rng.normal();
  const SparsePattern& cells = *p.patterns.emission;
  p.emission_values.resize(cells.size());
  p.emission_default.resize(S);
  for (Index s = 0; s < S; ++s) {
    const Index listed = cells.end(s) - cells.begin(s);
    double total = 0.0;
    for (Index k = cells.begin(s); k < cells.end(s); ++k) total += (p.emission_values[k] = 0.1 + rng.uniform());
    p.emission_default[s] = listed < T ? 0.01 * rng.uniform() : 0.0;
    total += static_cast<double>(T - listed) * p.emission_default[s];
    for (Index k = cells.begin(s); k < cells.end(s); ++k) p.emission_values[k] /= total;
    p.emission_default[s] /= total;
  }
  p.position_prior = Vector::Constant(N, 1.0 / static_cast<double>(N));
  p.position_prior[0] *= 1.5;
  p.position_prior /= p.position_prior.sum();
  p.sigma2 = 0.45;
  return SparseResponsibilityAttention(std::move(p));
}

/// The dense model the sparse one stands for.
ResponsibilityAttention dense_of(const SparseResponsibilityAttention& m) {
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Zero(m.n_symbols(), m.query_dim());
  p.emission.resize(m.n_symbols(), m.n_targets());
  for (Index s = 0; s < m.n_symbols(); ++s) {
    for (Index q = 0; q < m.query_dim(); ++q) p.key_means(s, q) = m.key_mean(s, q);
    for (Index t = 0; t < m.n_targets(); ++t) p.emission(s, t) = m.emission(s, t);
  }
  p.position_prior = m.params().position_prior;
  p.sigma2 = m.sigma2();
  return ResponsibilityAttention(std::move(p));
}

/// A sparse model's parameters as dense tables, to compare with a dense fit.
void expect_same_model(const SparseResponsibilityAttention& sparse, const ResponsibilityAttention& dense, double tol) {
  const ResponsibilityAttention expanded = dense_of(sparse);
  ExpectAllClose(expanded.params().key_means, dense.params().key_means, tol, tol);
  ExpectAllClose(expanded.params().emission, dense.params().emission, tol, tol);
  ExpectAllClose(expanded.params().position_prior, dense.params().position_prior, tol, tol);
  EXPECT_NEAR(sparse.sigma2(), dense.sigma2(), tol * dense.sigma2());
}

/// The dense statistics at the sparse ones' cells, and zero at every other cell.
void expect_same_statistics(const SparseResponsibilityAttentionAccumulator& sparse,
                            const ResponsibilityAttentionAccumulator& dense) {
  const SparsePatterns& cells = sparse.patterns();
  Matrix key_sum = Matrix::Zero(dense.n_symbols(), dense.query_dim());
  Matrix emission = Matrix::Zero(dense.n_symbols(), dense.n_targets());
  for (Index s = 0; s < dense.n_symbols(); ++s) {
    for (Index k = cells.keys->begin(s); k < cells.keys->end(s); ++k)
      key_sum(s, cells.keys->column(k)) = sparse.key_sum()[static_cast<size_t>(k)];
    for (Index k = cells.emission->begin(s); k < cells.emission->end(s); ++k)
      emission(s, cells.emission->column(k)) = sparse.emission_count()[static_cast<size_t>(k)];
  }
  ExpectAllClose(key_sum, Matrix(dense.key_sum()), 1e-12, 1e-12);
  ExpectAllClose(emission, Matrix(dense.emission_count()), 1e-12, 1e-12);
  ExpectAllClose(Vector(Eigen::Map<const Vector>(sparse.key_mass().data(), dense.n_symbols())),
                 Vector(dense.key_mass()), 1e-12, 1e-12);
  ExpectAllClose(Vector(Eigen::Map<const Vector>(sparse.position_count().data(), dense.context_length())),
                 Vector(dense.position_count()), 1e-12, 1e-12);
  EXPECT_NEAR(sparse.query_sq(), dense.query_sq(), 1e-12 * dense.query_sq());
}

/// log p, r, p(t | c, q) and the E-step's statistics of a sparse model equal its dense expansion's, for D = S (text)
/// and D ≠ S, on rows where repeated symbols, unlisted query pairs (scored held-out rows) and impossible-free rows mix.
TEST(SparseResponsibilityTest, SparseTablesGiveTheDenseResults) {
  Rng rng(testing::test_seed(1201));
  for (const auto& [S, D] : {std::pair<Index, Index>{9, 9}, {7, 12}, {40, 40}}) {
    const Index N = 5, T = 6, n = 400;
    const ResponsibilityAttentionBatch rows = random_rows(n, S, N, D, T, rng);
    const SparseResponsibilityAttention sparse = random_sparse(rows.slice(0, n / 2), S, N, D, T, rng);
    const ResponsibilityAttention dense = dense_of(sparse);
    const ResponsibilityAttention expanded = sparse.dense();  // the library's expansion, walking the patterns
    EXPECT_EQ(expanded.params().key_means, dense.params().key_means);
    EXPECT_EQ(expanded.params().emission, dense.params().emission);
    // The second half holds pairs the patterns (made from the first half) do not list: K = 0 and B = β there.
    std::vector<double> sparse_log_p(n), dense_log_p(n);
    sparse.log_density(rows, sparse_log_p);
    dense.log_density(rows, dense_log_p);
    for (Index row = 0; row < n; ++row)
      ASSERT_NEAR(sparse_log_p[row], dense_log_p[row], 1e-12 * (1 + std::abs(dense_log_p[row])));
    ExpectAllClose(sparse.responsibilities(rows), dense.responsibilities(rows), 1e-12, 1e-12);
    ExpectAllClose(sparse.predict_proba(rows), dense.predict_proba(rows), 1e-12, 1e-12);
    ExpectAllClose(sparse.target_log_proba(rows), dense.target_log_proba(rows), 1e-12, 1e-12);
    EXPECT_NEAR(sparse.gate_const(), dense.gate_const(), 1e-15);

    const ResponsibilityAttentionBatch seen = rows.slice(0, n / 2);
    std::vector<double> w(static_cast<size_t>(n / 2));
    for (double& x : w) x = rng.uniform();
    w[3] = 0.0;
    auto sparse_acc = sparse.make_accumulator();
    auto dense_acc = dense.make_accumulator();
    std::vector<double> from_e_step(static_cast<size_t>(n / 2));
    sparse.accumulate(seen, w, sparse_acc, from_e_step);
    dense.accumulate(seen, w, dense_acc);
    for (Index row = 0; row < n / 2; ++row) EXPECT_EQ(from_e_step[row], sparse_log_p[row]);
    expect_same_statistics(sparse_acc, dense_acc);
    sparse_acc.validate("test");
    // Statistics over equal patterns held by other objects (a fit started from a saved model) look their cells up
    // themselves, and get the same bits.
    const SparsePatterns& own = sparse.params().patterns;
    SparseResponsibilityAttentionAccumulator copied({std::make_shared<const SparsePattern>(*own.keys),
                                                     std::make_shared<const SparsePattern>(*own.emission)},
                                                    N);
    sparse.accumulate(seen, w, copied);
    EXPECT_EQ(std::vector<double>(copied.flat().begin(), copied.flat().end()),
              std::vector<double>(sparse_acc.flat().begin(), sparse_acc.flat().end()));
  }
}

/// EM from the same start (the same Dirichlet draws) fits the dense model to 1e-12 after 15 iterations, with σ²
/// fixed and learned; the sparse fit is bitwise the same for 1, 2 and 3 threads.
TEST(SparseResponsibilityTest, EmFitsTheDenseModelAndIsThreadCountInvariant) {
  Rng rng(testing::test_seed(1202));
  const Index S = 30, N = 6, D = 30, T = 25;
  const ResponsibilityAttentionBatch rows = random_rows(2500, S, N, D, T, rng);
  for (const bool learn_sigma2 : {false, true}) {
    ResponsibilityAttentionEstimatorOptions dense_options;
    dense_options.estimate_sigma2 = learn_sigma2;
    SparseResponsibilityAttentionEstimatorOptions sparse_options;
    sparse_options.estimate_sigma2 = learn_sigma2;
    const ResponsibilityAttentionEstimator dense_est(S, N, D, T, dense_options);
    const SparseResponsibilityAttentionEstimator sparse_est(data_patterns(rows, S, D, T), N, sparse_options);
    OptimizeOptions o;
    o.max_its = 15;
    o.delta = std::nullopt;
    o.seed = 5;
    const auto sparse_fit = optimize(rows, sparse_est, o);
    const auto dense_fit = optimize(rows, dense_est, o);
    expect_same_model(sparse_fit.model, dense_fit.model, 1e-12);
    ASSERT_EQ(sparse_fit.scores.size(), dense_fit.scores.size());
    for (size_t k = 0; k < sparse_fit.scores.size(); ++k)
      EXPECT_NEAR(sparse_fit.scores[k], dense_fit.scores[k], 1e-9 * std::abs(dense_fit.scores[k]));

    const auto fits = testing::fits_for_thread_counts(rows, sparse_est, 4);
    for (const auto& fit : {fits[1], fits[2]}) {
      EXPECT_EQ(fit.params().key_values, fits[0].params().key_values);
      EXPECT_EQ(fit.params().emission_values, fits[0].params().emission_values);
      EXPECT_EQ(fit.params().emission_default, fits[0].params().emission_default);
      EXPECT_EQ(fit.params().sigma2, fits[0].params().sigma2);
    }
  }
}

/// The initial statistics are the dense family's at the patterns' cells (the same draws, row by row).
TEST(SparseResponsibilityTest, InitialisationDrawsTheDenseStatistics) {
  Rng rng(testing::test_seed(1203));
  const Index S = 11, N = 4, D = 8, T = 9;
  const ResponsibilityAttentionBatch rows = random_rows(300, S, N, D, T, rng);
  std::vector<double> w(300);
  for (double& x : w) x = rng.uniform() < 0.2 ? 0.0 : rng.uniform();
  SparseResponsibilityAttentionAccumulator sparse(data_patterns(rows, S, D, T), N);
  ResponsibilityAttentionAccumulator dense(S, N, D, T);
  Rng a(77), b(77);
  sparse.initialize(rows, w, a);
  dense.initialize(rows, w, b);
  expect_same_statistics(sparse, dense);
  EXPECT_EQ(a.next_u64(), b.next_u64());  // the same number of draws
}

/// A model file holds the patterns whatever their values (a key cell that is exactly 0 stays listed), and reads back
/// bit for bit; a key table whose default is not 0 is refused naming the field.
TEST(SparseResponsibilityTest, ModelFilesRoundTripBitForBit) {
  Rng rng(testing::test_seed(1204));
  const ResponsibilityAttentionBatch rows = random_rows(40, 12, 3, 10, 7, rng);  // rows with unlisted targets
  SparseResponsibilityAttentionParams p = random_sparse(rows, 12, 3, 10, 7, rng).params();
  p.key_values[0] = 0.0;
  p.name = "words";
  const SparseResponsibilityAttention model(p);
  const nlohmann::json doc = model_to_json(AnyDistribution(model));
  EXPECT_EQ(doc["family"], "sparse_responsibility_attention");
  EXPECT_EQ(doc["params"]["key_means"]["layout"], "sparse_rows");
  const AnyDistribution loaded = model_from_json(doc, "model.json");
  const auto& back = *loaded.get_if<SparseResponsibilityAttention>();
  EXPECT_TRUE(back.params().patterns == model.params().patterns);
  EXPECT_EQ(back.params().key_values, model.params().key_values);
  EXPECT_EQ(back.params().emission_values, model.params().emission_values);
  EXPECT_EQ(back.params().emission_default, model.params().emission_default);
  EXPECT_EQ(back.params().position_prior, model.params().position_prior);
  EXPECT_EQ(back.params().sigma2, model.params().sigma2);
  EXPECT_EQ(back.params().name, "words");
  EXPECT_LT(back.params().patterns.emission->size(), 12 * 7);  // some targets take their row's default

  nlohmann::json bad = doc;
  bad["params"]["key_means"]["default"][2] = 0.5;
  try {
    (void)model_from_json(bad, "model.json");
    FAIL() << "a non-zero key default was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("model.json: params.key_means.default"), std::string::npos) << e.what();
  }
  bad = doc;
  bad["params"]["emission"]["values"][0][0] = bad["params"]["emission"]["values"][0][0].get<double>() + 0.25;
  EXPECT_THROW((void)model_from_json(bad, "model.json"), ValueError);  // row 0 no longer sums to 1
}

/// A row with a pair the statistics' patterns do not list, a real-valued query, invalid tables and statistics of
/// other patterns are refused; the refused E-step and initialisation change nothing.
TEST(SparseResponsibilityTest, RefusesWhatTheTablesCannotHold) {
  Rng rng(testing::test_seed(1205));
  const Index S = 6, N = 3, D = 6, T = 4;
  const ResponsibilityAttentionBatch rows = random_rows(50, S, N, D, T, rng);
  const SparseResponsibilityAttention model = random_sparse(rows.slice(0, 10), S, N, D, T, rng);
  auto acc = model.make_accumulator();
  model.accumulate(rows.slice(0, 10), std::vector<double>(10, 1.0), acc);
  const auto before = acc;
  EXPECT_THROW(model.accumulate(rows, std::vector<double>(50, 1.0), acc), ValueError);
  EXPECT_TRUE(acc == before);
  Rng init(3);
  EXPECT_THROW(acc.initialize(rows, std::vector<double>(50, 1.0), init), ValueError);
  EXPECT_TRUE(acc == before);

  const ResponsibilityAttentionBatch real =
      ResponsibilityAttentionEncoder{}.encode(IdMatrix::Zero(2, N), Matrix::Ones(2, D), IdVector::Zero(2));
  std::vector<double> log_p(2);
  EXPECT_THROW(model.log_density(real, log_p), ValueError);

  SparseResponsibilityAttentionParams p = model.params();
  p.emission_default[0] += 0.1;
  EXPECT_THROW(SparseResponsibilityAttention{p}, ValueError);
  p = model.params();
  p.key_values.resize(p.key_values.size() + 1);
  EXPECT_THROW(SparseResponsibilityAttention{p}, ValueError);

  // Statistics of other patterns: other sizes (refused by the layout), or the same sizes over other cells (the
  // emission pattern's rows mirrored).
  const SparseResponsibilityAttentionAccumulator other(data_patterns(rows, S, D, T), N);
  ASSERT_NE(other.flat_size(), acc.flat_size());
  EXPECT_THROW(acc.combine(other), ValueError);
  const SparsePattern& cells = *model.params().patterns.emission;
  std::vector<int64_t> mirrored_rows, mirrored_cols;
  for (Index s = 0; s < S; ++s)
    for (Index k = cells.begin(s); k < cells.end(s); ++k) {
      mirrored_rows.push_back(S - 1 - s);
      mirrored_cols.push_back(cells.column(k));
    }
  const SparseResponsibilityAttentionAccumulator mirrored(
      {model.params().patterns.keys,
       std::make_shared<const SparsePattern>(SparsePattern::of_cells(S, T, mirrored_rows, mirrored_cols))},
      N);
  ASSERT_EQ(mirrored.flat_size(), acc.flat_size());
  EXPECT_THROW(acc.combine(mirrored), ValueError);
  EXPECT_TRUE(acc == before);
}

/// Patterns: cells sorted and deduplicated per row, found by binary search, and invalid cells refused.
TEST(SparseResponsibilityTest, PatternsListEachCellOnce) {
  const std::vector<int64_t> rows{2, 0, 2, 2, 0}, cols{5, 1, 0, 5, 1};
  const SparsePattern p = SparsePattern::of_cells(3, 6, rows, cols);
  EXPECT_EQ(p.size(), 3);
  EXPECT_EQ(p.row_begin(), (std::vector<int64_t>{0, 1, 1, 3}));
  EXPECT_EQ(p.columns(), (std::vector<int64_t>{1, 0, 5}));
  EXPECT_EQ(p.find(2, 5), 2);
  EXPECT_EQ(p.find(2, 4), -1);
  EXPECT_EQ(p.find(1, 1), -1);
  EXPECT_THROW((void)SparsePattern::of_cells(3, 6, std::vector<int64_t>{3}, std::vector<int64_t>{0}), ValueError);
  EXPECT_THROW((void)SparsePattern::of_cells(3, 6, std::vector<int64_t>{0}, std::vector<int64_t>{6}), ValueError);
  EXPECT_THROW((void)SparsePattern(2, 3, {0, 2, 1}, {0, 1}), ValueError);       // row_begin decreases
  EXPECT_THROW((void)SparsePattern(2, 3, {0, 2, 2}, {1, 1}), ValueError);       // a repeated column
}

}  // namespace
}  // namespace attnmix
