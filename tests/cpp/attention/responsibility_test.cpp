// SPDX-License-Identifier: Apache-2.0
// Responsibility attention: the unit acceptance rows and the formulas of docs/mechanisms.md#responsibility-attention
// against independent oracles.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "attnmix/attention/recall_task.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/stats/mixture.hpp"
#include "testing/all_close.hpp"
#include "testing/random_responsibility.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;

/// A random valid model with S symbols, N positions, D query dims, T targets.
ResponsibilityAttention random_model(Index S, Index N, Index D, Index T, Rng& rng, double sigma2 = 0.7) {
  return ResponsibilityAttention(testing::random_responsibility_params(S, N, D, T, rng, sigma2));
}

/// The reference impossible case of docs/mechanisms.md#responsibility-attention.
ResponsibilityAttention impossible_case_model() {
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Zero(2, 1);
  p.emission.resize(2, 2);
  p.emission << 0, 1, 1, 0;
  p.position_prior.resize(2);
  p.position_prior << 0, 1;
  return ResponsibilityAttention(std::move(p));
}

ResponsibilityAttentionBatch one_row(const std::vector<int64_t>& ctx, const std::vector<double>& y, int64_t t) {
  IdMatrix c(1, static_cast<Index>(ctx.size()));
  for (size_t i = 0; i < ctx.size(); ++i) c(0, static_cast<Index>(i)) = ctx[i];
  Matrix q(1, static_cast<Index>(y.size()));
  for (size_t d = 0; d < y.size(); ++d) q(0, static_cast<Index>(d)) = y[d];
  IdVector target(1);
  target << t;
  return ResponsibilityAttentionEncoder{}.encode(std::move(c), std::move(q), std::move(target));
}

/// Oracle: log p(y, t | c) written directly from the generative story (Σ_i π_i N(y; K[c_i], σ²I) B[c_i, t]).
double direct_log_density(const ResponsibilityAttention& m, const ResponsibilityAttentionBatch& b, Index row) {
  const auto& p = m.params();
  const Index D = m.query_dim();
  double total = 0.0;
  for (Index i = 0; i < m.context_length(); ++i) {
    const int64_t s = b.context(row)[i];
    double sq = 0.0;
    for (Index d = 0; d < D; ++d) sq += std::pow(b.query(row)[d] - p.key_means(s, d), 2);
    const double gauss = std::exp(-sq / (2 * p.sigma2)) / std::pow(2 * std::numbers::pi * p.sigma2, 0.5 * static_cast<double>(D));
    total += p.position_prior[i] * gauss * p.emission(s, b.target(row));
  }
  return std::log(total);
}

TEST(ResponsibilityAttentionTest, LogDensityMatchesGenerativeStory) {
  Rng rng(testing::test_seed(11));
  const ResponsibilityAttention model = random_model(7, 5, 3, 4, rng);
  const ResponsibilityAttentionBatch batch = model.sampler(3).sample(50);
  std::vector<double> log_p(50);
  model.log_density(batch, log_p);
  for (Index n = 0; n < 50; ++n) EXPECT_NEAR(log_p[n], direct_log_density(model, batch, n), 1e-10);
}

/// RA-1: encoder shapes (8,N), (8,D), (8,); the sampler gives 5 samples with context length N, query length D, int target.
TEST(ResponsibilityAttentionTest, EncoderAndSamplerShapes) {
  Rng rng(testing::test_seed(12));
  const ResponsibilityAttention model = random_model(16, 6, 16, 16, rng);
  auto sampler = model.sampler(1);
  const ResponsibilityAttentionBatch batch = sampler.sample(8);
  EXPECT_EQ(batch.contexts().rows(), 8);
  EXPECT_EQ(batch.contexts().cols(), 6);
  EXPECT_EQ(batch.queries().rows(), 8);
  EXPECT_EQ(batch.queries().cols(), 16);
  EXPECT_EQ(batch.targets().size(), 8);
  for (int k = 0; k < 5; ++k) {
    const ResponsibilityAttentionObservation obs = sampler.sample();
    EXPECT_EQ(obs.context.size(), 6u);
    EXPECT_EQ(obs.query.size(), 16u);
    EXPECT_GE(obs.target, 0);
    EXPECT_LT(obs.target, 16);
    // N ≤ S: drawn without replacement.
    std::vector<int64_t> sorted = obs.context;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  }
}

TEST(ResponsibilityAttentionTest, SampleOfSizeEqualsConsecutiveDraws) {
  Rng rng(testing::test_seed(13));
  const ResponsibilityAttention model = random_model(5, 8, 2, 3, rng);  // N > S: with replacement
  const ResponsibilityAttentionBatch batch = model.sampler(9).sample(4);
  auto sampler = model.sampler(9);
  for (Index k = 0; k < 4; ++k) {
    const ResponsibilityAttentionObservation obs = sampler.sample();
    for (Index i = 0; i < 8; ++i) EXPECT_EQ(batch.context(k)[i], obs.context[static_cast<size_t>(i)]);
    for (Index d = 0; d < 2; ++d) EXPECT_EQ(batch.query(k)[d], obs.query[static_cast<size_t>(d)]);
    EXPECT_EQ(batch.target(k), obs.target);
  }
}

/// The sampler's attended-symbol targets follow B: goodness of fit on a model with a known emission.
TEST(ResponsibilityAttentionTest, SamplerTargetFrequenciesFollowModel) {
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Zero(1, 1);
  p.emission.resize(1, 3);
  p.emission << 0.2, 0.5, 0.3;
  p.position_prior = Vector::Ones(1);
  p.sigma2 = 4.0;
  const ResponsibilityAttention model(p);
  const Index n = 20000;
  const ResponsibilityAttentionBatch batch = model.sampler(5).sample(n);
  std::vector<double> freq(3, 0.0);
  double mean = 0.0, sq = 0.0;
  for (Index k = 0; k < n; ++k) {
    freq[static_cast<size_t>(batch.target(k))] += 1.0 / static_cast<double>(n);
    mean += batch.query(k)[0] / static_cast<double>(n);
    sq += batch.query(k)[0] * batch.query(k)[0] / static_cast<double>(n);
  }
  // 5 standard errors.
  for (size_t t = 0; t < 3; ++t) {
    const double pt = p.emission(0, static_cast<Index>(t));
    EXPECT_NEAR(freq[t], pt, 5 * std::sqrt(pt * (1 - pt) / n));
  }
  EXPECT_NEAR(mean, 0.0, 5 * std::sqrt(4.0 / n));
  EXPECT_NEAR(sq, 4.0, 5 * 4.0 * std::sqrt(2.0 / n));
}

/// Oracle for the E-step: statistics accumulated with responsibilities computed directly from the story.
TEST(ResponsibilityAttentionTest, StatisticsMatchDirectResponsibilities) {
  Rng rng(testing::test_seed(14));
  const Index S = 6, N = 4, D = 3, T = 5;
  const ResponsibilityAttention model = random_model(S, N, D, T, rng);
  // Contexts with repeated symbols exercise the scatter-add.
  IdMatrix ctx(3, N);
  ctx << 0, 0, 1, 2, 3, 4, 5, 3, 1, 1, 1, 1;
  Matrix y(3, D);
  for (Index k = 0; k < y.size(); ++k) y.data()[k] = rng.normal();
  IdVector t(3);
  t << 0, 4, 2;
  const auto batch = model.encoder().encode(ctx, y, t);
  const std::vector<double> w{1.0, 0.5, 2.0};
  auto acc = model.make_accumulator();
  model.accumulate(batch, w, acc);

  Matrix key_sum = Matrix::Zero(S, D), emission = Matrix::Zero(S, T);
  Vector key_mass = Vector::Zero(S), position = Vector::Zero(N);
  double query_sq = 0.0;
  const auto& p = model.params();
  for (Index n = 0; n < 3; ++n) {
    std::vector<double> joint(N);
    double total = 0.0;
    for (Index i = 0; i < N; ++i) {
      const int64_t s = ctx(n, i);
      const double sq = (y.row(n) - p.key_means.row(s)).squaredNorm();
      joint[i] = p.position_prior[i] * std::exp(-sq / (2 * p.sigma2)) * p.emission(s, t[n]);
      total += joint[i];
    }
    for (Index i = 0; i < N; ++i) {
      const double wr = w[n] * joint[i] / total;
      key_sum.row(ctx(n, i)) += wr * y.row(n);
      key_mass[ctx(n, i)] += wr;
      emission(ctx(n, i), t[n]) += wr;
      position[i] += wr;
      query_sq += wr * y.row(n).squaredNorm();
    }
  }
  ExpectAllClose(Matrix(acc.key_sum()), key_sum, 1e-12, 1e-14);
  ExpectAllClose(Matrix(acc.emission_count()), emission, 1e-12, 1e-14);
  ExpectAllClose(Matrix(acc.key_mass().transpose()), Matrix(key_mass.transpose()), 1e-12, 1e-14);
  ExpectAllClose(Matrix(acc.position_count().transpose()), Matrix(position.transpose()), 1e-12, 1e-14);
  EXPECT_NEAR(acc.query_sq(), query_sq, 1e-12 * query_sq);
}

/// RA-2: combine(value) doubles key_mass.
TEST(ResponsibilityAttentionTest, CombineValueDoublesKeyMass) {
  Rng rng(testing::test_seed(15));
  const ResponsibilityAttention model = random_model(16, 6, 16, 16, rng);
  const auto batch = model.sampler(2).sample(8);
  auto acc = model.make_accumulator();
  model.accumulate(batch, std::vector<double>(8, 1.0), acc);
  const Vector before = acc.key_mass();
  acc.combine(acc.value());
  EXPECT_EQ(Vector(acc.key_mass()), Vector(2.0 * before));
}

/// RA-3: predict_proba has shape (8, T) and rows sum to 1; it equals Σ_i a_i B[c_i] computed directly.
TEST(ResponsibilityAttentionTest, PredictProbaRowsSumToOne) {
  Rng rng(testing::test_seed(16));
  const ResponsibilityAttention model = random_model(16, 6, 16, 16, rng);
  const auto batch = model.sampler(2).sample(8);
  const Matrix proba = model.predict_proba(batch.contexts(), batch.queries());
  ASSERT_EQ(proba.rows(), 8);
  ASSERT_EQ(proba.cols(), 16);
  for (Index n = 0; n < 8; ++n) {
    EXPECT_NEAR(proba.row(n).sum(), 1.0, 1e-9);
    // Oracle: p(t | c, y) = p(y, t | c) / Σ_t' p(y, t' | c).
    std::vector<double> joint(16);
    double total = 0.0;
    for (int64_t t = 0; t < 16; ++t) {
      IdMatrix c = batch.contexts().row(n);
      Matrix y = batch.queries().row(n);
      IdVector tt(1);
      tt << t;
      std::vector<double> lp(1);
      model.log_density(model.encoder().encode(c, y, tt), lp);
      joint[static_cast<size_t>(t)] = std::exp(lp[0]);
      total += joint[static_cast<size_t>(t)];
    }
    for (Index t = 0; t < 16; ++t) EXPECT_NEAR(proba(n, t), joint[static_cast<size_t>(t)] / total, 1e-12);
  }
}

/// log p(t_n | c_n, y_n) of the rows' own targets equals log p(y, t | c) − log Σ_t' p(y, t' | c) (the joint
/// enumerated over the targets), for real-valued and symbol queries, through AnyDistribution too; a target that no
/// context symbol emits gives −∞.
TEST(ResponsibilityAttentionTest, TargetLogProbaIsTheConditionalOfTheJoint) {
  Rng rng(testing::test_seed(161));
  const Index S = 6, N = 4, T = 5;
  for (const bool symbols : {false, true}) {
    const Index D = symbols ? S : 3;
    ResponsibilityAttention model = random_model(S, N, D, T, rng);
    ResponsibilityAttentionParams p = model.params();
    p.emission.row(2).setZero();
    p.emission(2, 1) = 1.0;  // symbol 2 emits target 1 only
    model = ResponsibilityAttention(std::move(p));
    const Index n = 12;
    IdMatrix contexts(n, N);
    IdVector queries(n), targets(n);
    Matrix real_queries(n, D);
    for (Index row = 0; row < n; ++row) {
      for (Index i = 0; i < N; ++i) contexts(row, i) = static_cast<int64_t>(rng.uniform_int(S));
      queries[row] = static_cast<int64_t>(rng.uniform_int(S));
      targets[row] = static_cast<int64_t>(rng.uniform_int(T));
      for (Index d = 0; d < D; ++d) real_queries(row, d) = symbols ? (d == queries[row] ? 1.0 : 0.0) : rng.normal();
    }
    contexts.row(0).setConstant(2);
    targets[0] = 3;  // only symbol 2 in the context, which never emits target 3
    const ResponsibilityAttentionEncoder encoder = model.encoder();
    const auto encode = [&](const IdVector& t) {
      return symbols ? encoder.encode_symbols(contexts, queries, t) : encoder.encode(contexts, real_queries, t);
    };
    const ResponsibilityAttentionBatch rows = encode(targets);
    const Vector log_p = model.target_log_proba(rows);
    std::vector<std::vector<double>> joint(static_cast<size_t>(T), std::vector<double>(static_cast<size_t>(n)));
    for (Index t = 0; t < T; ++t) model.log_density(encode(IdVector::Constant(n, t)), joint[static_cast<size_t>(t)]);
    for (Index row = 0; row < n; ++row) {
      double total = 0.0;
      for (Index t = 0; t < T; ++t) total += std::exp(joint[static_cast<size_t>(t)][static_cast<size_t>(row)]);
      const double expected =
          joint[static_cast<size_t>(targets[row])][static_cast<size_t>(row)] - std::log(total);
      if (row == 0)
        EXPECT_EQ(log_p[row], -std::numeric_limits<double>::infinity());
      else
        EXPECT_NEAR(log_p[row], expected, 1e-12 * (1.0 + std::abs(expected))) << "row " << row;
    }
    const Vector through_any = AnyDistribution(model).target_log_proba(AnyBatch(rows));
    EXPECT_EQ(through_any, log_p);
  }
}

/// RA-4: with estimate_sigma2 = false the estimator returns its sigma2 exactly.
TEST(ResponsibilityAttentionTest, FixedSigma2IsReturnedExactly) {
  Rng rng(testing::test_seed(17));
  const ResponsibilityAttention model = random_model(16, 6, 16, 16, rng);
  const auto batch = model.sampler(2).sample(100);
  ResponsibilityAttentionEstimatorOptions options;
  options.sigma2 = 0.42;
  const ResponsibilityAttentionEstimator est(16, 6, 16, 16, options);
  auto acc = est.make_accumulator();
  model.accumulate(batch, std::vector<double>(100, 1.0), acc);
  EXPECT_EQ(est.estimate(std::nullopt, acc).sigma2(), 0.42);
}

/// The M-step against its closed form, including the learned σ² and the 1e-12 key-mass floor.
TEST(ResponsibilityAttentionTest, EstimateMatchesClosedForm) {
  Rng rng(testing::test_seed(18));
  const Index S = 5, N = 3, D = 2, T = 4;
  const ResponsibilityAttention model = random_model(S, N, D, T, rng);
  IdMatrix ctx(40, N);
  for (Index k = 0; k < ctx.size(); ++k) ctx.data()[k] = static_cast<int64_t>(rng.uniform_int(S - 1));  // symbol 4 unused
  Matrix y(40, D);
  for (Index k = 0; k < y.size(); ++k) y.data()[k] = rng.normal();
  IdVector t(40);
  for (Index k = 0; k < 40; ++k) t[k] = static_cast<int64_t>(rng.uniform_int(T));
  auto acc = model.make_accumulator();
  model.accumulate(model.encoder().encode(ctx, y, t), std::vector<double>(40, 1.0), acc);

  ResponsibilityAttentionEstimatorOptions options;
  options.estimate_sigma2 = true;
  options.emission_smoothing = 0.25;
  const ResponsibilityAttention fit = ResponsibilityAttentionEstimator(S, N, D, T, options).estimate(40.0, acc);
  const auto& p = fit.params();
  for (Index s = 0; s < S; ++s) {
    const double mass = acc.key_mass()[s];
    for (Index d = 0; d < D; ++d)
      EXPECT_NEAR(p.key_means(s, d), mass > 0 ? acc.key_sum()(s, d) / mass : 0.0, 1e-12);
    const double row_total = acc.emission_count().row(s).sum() + 0.25 * T;
    for (Index c = 0; c < T; ++c) EXPECT_NEAR(p.emission(s, c), (acc.emission_count()(s, c) + 0.25) / row_total, 1e-13);
  }
  EXPECT_EQ(p.key_means.row(4), Eigen::RowVectorXd::Zero(D));
  for (Index i = 0; i < N; ++i) EXPECT_NEAR(p.position_prior[i], acc.position_count()[i] / 40.0, 1e-13);
  // σ² oracle: pooled within-symbol scatter Σ_n Σ_i r ||y − K[c_i]||² / (D Σ r).
  double scatter = acc.query_sq();
  for (Index s = 0; s < S; ++s)
    if (acc.key_mass()[s] > 0) scatter -= acc.key_sum().row(s).squaredNorm() / acc.key_mass()[s];
  EXPECT_NEAR(p.sigma2, scatter / (D * acc.key_mass().sum()), 1e-12);
}

/// docs/porting.md: with zero smoothing a never-attended symbol's emission row becomes uniform.
TEST(ResponsibilityAttentionTest, ZeroTotalEmissionRowIsUniform) {
  ResponsibilityAttentionEstimatorOptions options;
  options.emission_smoothing = 0.0;
  const ResponsibilityAttentionEstimator est(3, 2, 1, 4, options);
  auto acc = est.make_accumulator();
  const ResponsibilityAttention fit = est.estimate(std::nullopt, acc);
  EXPECT_EQ(fit.params().emission.row(1), Eigen::RowVectorXd::Constant(4, 0.25));
  EXPECT_EQ(fit.params().position_prior, Vector::Constant(2, 0.5));
}

std::vector<double> manual_em_log_likelihoods(const ResponsibilityAttentionBatch& data,
                                              const ResponsibilityAttentionEstimator& est, int iterations) {
  OptimizeOptions options;
  options.seed = 7;
  ResponsibilityAttention model = initialize_model(data, est, options);
  std::vector<double> lls;
  std::vector<double> log_p(static_cast<size_t>(data.n_rows()));
  for (int it = 0; it < iterations; ++it) {
    model = em_step(model, data, est, log_p, options.parallel());
    lls.push_back(pairwise_sum(log_p));
  }
  return lls;
}

TEST(RecallTaskTest, RejectsNegativeRowCountsAndDrawsEmptyParts) {
  EXPECT_THROW((void)make_recall_task(-1, 1, 3), ValueError);
  EXPECT_THROW((void)make_recall_task(1, -1, 3), ValueError);
  const RecallTask task = make_recall_task(0, 5, 3);
  EXPECT_EQ(task.train.n_rows(), 0);
  EXPECT_EQ(task.test.n_rows(), 5);
}

/// RA-7: EM is monotone on 1500 observations over 15 manual iterations.
TEST(ResponsibilityAttentionTest, EmIsMonotone) {
  const RecallTask task = make_recall_task(1500, 1, testing::test_seed(19));
  ResponsibilityAttentionEstimatorOptions options;
  options.sigma2 = 0.5;
  const auto lls = manual_em_log_likelihoods(task.train, {16, 6, 16, 16, options}, 15);
  for (size_t k = 1; k < lls.size(); ++k) EXPECT_GE(lls[k], lls[k - 1] - 1e-3) << "iteration " << k;
}

/// RA-10: σ²-learning EM is monotone over 12 iterations.
TEST(ResponsibilityAttentionTest, Sigma2LearningEmIsMonotone) {
  const RecallTask task = make_recall_task(1500, 1, testing::test_seed(20));
  ResponsibilityAttentionEstimatorOptions options;
  options.estimate_sigma2 = true;
  const auto lls = manual_em_log_likelihoods(task.train, {16, 6, 16, 16, options}, 12);
  for (size_t k = 1; k < lls.size(); ++k) EXPECT_GE(lls[k], lls[k - 1] - 1e-3) << "iteration " << k;
}

/// RA-8: fits inside a 2-component mixture for 10 iterations; finite LL; weights sum to 1.
TEST(ResponsibilityAttentionTest, FitsInsideTwoComponentMixture) {
  const RecallTask task = make_recall_task(1000, 1, testing::test_seed(21));
  ResponsibilityAttentionEstimatorOptions options;
  options.sigma2 = 0.5;
  const AnyEstimator component(ResponsibilityAttentionEstimator(16, 6, 16, 16, options));
  const MixtureEstimator est({component, component});
  OptimizeOptions opt;
  opt.max_its = 10;
  opt.seed = 3;
  std::vector<double> lls;
  opt.on_iteration = [&](const IterationReport& r) { lls.push_back(r.log_likelihood); };
  const auto fit = optimize(AnyBatch(task.train), est, opt);
  ASSERT_FALSE(lls.empty());
  for (double ll : lls) EXPECT_TRUE(std::isfinite(ll));
  EXPECT_NEAR(fit.model.weights().sum(), 1.0, 1e-6);
  EXPECT_EQ(fit.model.components().size(), 2u);
}

/// RA-11: sequence_to_triples: context [5,1,3], target 2, one-hot of 3; 4 triples; embedding queries.
TEST(ResponsibilityAttentionTest, SequenceToTriples) {
  const std::vector<int64_t> tokens{5, 1, 3, 2, 0, 4, 1};
  const auto batch = sequence_to_triples(tokens, 3);
  ASSERT_EQ(batch.n_rows(), 4);
  EXPECT_EQ(batch.query_dim(), 6);
  EXPECT_EQ(batch.context(0)[0], 5);
  EXPECT_EQ(batch.context(0)[1], 1);
  EXPECT_EQ(batch.context(0)[2], 3);
  EXPECT_EQ(batch.target(0), 2);
  ASSERT_TRUE(batch.has_symbol_queries());  // the one-hot of the current token, as its symbol
  EXPECT_EQ(batch.query_symbol(0), 3);
  for (Index d = 0; d < 6; ++d) EXPECT_EQ(batch.queries()(0, d), d == 3 ? 1.0 : 0.0);
  EXPECT_EQ(batch.target(3), 1);

  Matrix embeddings(6, 2);
  for (Index s = 0; s < 6; ++s) embeddings.row(s) << static_cast<double>(s), -static_cast<double>(s);
  const auto embedded = sequence_to_triples(tokens, 3, std::nullopt, &embeddings);
  EXPECT_EQ(embedded.query_dim(), 2);
  EXPECT_EQ(embedded.query(1)[0], 2.0);  // current token of triple 1 is tokens[3] = 2
  EXPECT_EQ(embedded.query(1)[1], -2.0);
  EXPECT_EQ(sequence_to_triples(std::vector<int64_t>{1, 2}, 3).n_rows(), 0);
  EXPECT_THROW((void)sequence_to_triples(tokens, 3, 5), ValueError);  // token 5 ≥ S
  EXPECT_THROW((void)sequence_to_triples(std::vector<int64_t>{1, -2, 3}, 1), ValueError);
  Matrix too_few(3, 2);
  too_few.setZero();
  EXPECT_THROW((void)sequence_to_triples(tokens, 3, std::nullopt, &too_few), ValueError);
}

/// RA-13: invalid parameters and ids raise the documented errors.
TEST(ResponsibilityAttentionTest, InvalidInputsRaise) {
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Zero(2, 1);
  p.emission.resize(2, 2);
  p.emission << 0.5, 0.5, 1.1, -0.1;
  p.position_prior = Vector::Constant(2, 0.5);
  EXPECT_THROW(ResponsibilityAttention{p}, ValueError);  // non-simplex emission
  p.emission << 0.5, 0.5, 0.5, 0.5 + 1e-9;
  EXPECT_THROW(ResponsibilityAttention{p}, ValueError);  // off by more than 1e-12
  p.emission << 0.5, 0.5, 0.5, 0.5;
  p.position_prior = Vector();
  try {
    ResponsibilityAttention m(p);
    FAIL() << "missing position_prior accepted";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "position_prior (length = context length N) is required.");
  }
  p.position_prior = Vector::Constant(2, 0.5);
  p.sigma2 = 0.0;
  EXPECT_THROW(ResponsibilityAttention{p}, ValueError);
  p.sigma2 = 1.0;
  p.key_means(0, 0) = NAN;
  EXPECT_THROW(ResponsibilityAttention{p}, ValueError);
  p.key_means(0, 0) = 0.0;
  const ResponsibilityAttention model(p);

  const ResponsibilityAttentionEncoder enc = model.encoder();
  IdMatrix ctx(1, 2);
  ctx << 0, 2;  // out of range
  Matrix y = Matrix::Zero(1, 1);
  IdVector t = IdVector::Zero(1);
  try {
    (void)enc.encode(ctx, y, t);
    FAIL() << "out-of-range id accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("out-of-range ID"), std::string::npos) << e.what();
  }
  ctx << 0, -1;
  EXPECT_THROW((void)enc.encode(ctx, y, t), ValueError);
  ctx << 0, 1;
  t << 2;
  EXPECT_THROW((void)enc.encode(ctx, y, t), ValueError);
  t << 1;
  EXPECT_THROW((void)enc.encode(IdMatrix::Zero(1, 3), y, t), ValueError);  // wrong N
  EXPECT_THROW((void)enc.encode(ctx, Matrix::Zero(1, 2), t), ValueError);  // wrong D
  y(0, 0) = INFINITY;
  EXPECT_THROW((void)enc.encode(ctx, y, t), ValueError);
  EXPECT_THROW((void)check::exact_id("enc", "context", 1.5, 2), ValueError);  // fractional id
  EXPECT_EQ(check::exact_id("enc", "context", 1.0, 2), 1);                    // integral float accepted

  // A batch from an undeclared encoder with larger ids is rejected by the model.
  const auto wide = ResponsibilityAttentionEncoder{}.encode(IdMatrix::Constant(1, 2, 5), Matrix::Zero(1, 1), t);
  std::vector<double> out(1);
  EXPECT_THROW(model.log_density(wide, out), ValueError);

  EXPECT_THROW(ResponsibilityAttentionEstimator(0, 2, 1, 2), ValueError);
  ResponsibilityAttentionEstimatorOptions bad;
  bad.emission_smoothing = -1.0;
  EXPECT_THROW(ResponsibilityAttentionEstimator(2, 2, 1, 2, bad), ValueError);
  bad = {};
  bad.min_sigma2 = 0.0;
  EXPECT_THROW(ResponsibilityAttentionEstimator(2, 2, 1, 2, bad), ValueError);
}

/// RA-13 / docs/mechanisms.md#responsibility-attention reference case: −∞ density, ImpossibleEvidenceError listing the
/// row, accumulator unchanged.
TEST(ResponsibilityAttentionTest, ImpossibleEvidenceLeavesStatisticsUnchanged) {
  const ResponsibilityAttention model = impossible_case_model();
  const auto impossible = one_row({0, 1}, {0.0}, 1);
  std::vector<double> log_p(1);
  model.log_density(impossible, log_p);
  EXPECT_EQ(log_p[0], -INFINITY);

  auto acc = model.make_accumulator();
  model.accumulate(one_row({1, 1}, {0.3}, 0), std::vector<double>{1.0}, acc);  // something to protect
  const auto before = acc.value();
  try {
    model.accumulate(impossible, std::vector<double>{1.0}, acc);
    FAIL() << "impossible evidence accepted";
  } catch (const ImpossibleEvidenceError& e) {
    EXPECT_EQ(e.rows(), std::vector<int64_t>{0});
    EXPECT_NE(std::string(e.what()).find("encountered impossible evidence at rows [0]"), std::string::npos);
  }
  EXPECT_TRUE(acc == before);
  model.accumulate(impossible, std::vector<double>{0.0}, acc);  // zero weight: allowed, contributes nothing
  EXPECT_TRUE(acc == before);
}

}  // namespace
}  // namespace attnmix

namespace attnmix {
namespace {

/// docs/mechanisms.md#responsibility-attention: a zero-prior position can never be revived: after EM steps its prior is
/// exactly 0 (positions in the middle of a 16-wide context exercise the vectorised exp).
TEST(ResponsibilityAttentionTest, ZeroPriorPositionStaysExactlyZero) {
  Rng rng(testing::test_seed(22));
  ResponsibilityAttentionParams p = random_model(8, 16, 4, 3, rng).params();
  p.position_prior[9] = 0.0;
  p.position_prior[3] = 0.0;
  p.position_prior /= p.position_prior.sum();
  ResponsibilityAttention model(p);
  const auto batch = model.sampler(4).sample(300);
  const ResponsibilityAttentionEstimator est = model.estimator();
  std::vector<double> log_p(300);
  for (int it = 0; it < 3; ++it) {
    model = em_step(model, batch, est, log_p, ParallelOptions{1, 64});
    EXPECT_EQ(model.params().position_prior[9], 0.0);
    EXPECT_EQ(model.params().position_prior[3], 0.0);
  }
}

}  // namespace
}  // namespace attnmix
