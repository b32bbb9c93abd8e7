// SPDX-License-Identifier: Apache-2.0
// Responsibility-attention acceptance rows of docs/mechanisms.md#responsibility-attention that fit models (label:
// slow), in both precisions (docs/mixed_precision.md): the mixed-precision E-step must pass every one of them too.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "attnmix/attention/recall_task.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/inference/optimize.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

class ResponsibilityAttentionAcceptanceTest : public ::testing::TestWithParam<Precision> {
 protected:
  /// The estimator options of the precision under test.
  [[nodiscard]] static ResponsibilityAttentionEstimatorOptions options_of_precision() {
    ResponsibilityAttentionEstimatorOptions options;
    options.precision = GetParam();
    return options;
  }
  [[nodiscard]] static ResponsibilityAttentionEstimator recall_estimator() {
    ResponsibilityAttentionEstimatorOptions options = options_of_precision();
    options.sigma2 = 0.5;
    return {16, 6, 16, 16, options};
  }
};

/// RA-5: EM recovers addressing: accuracy > 0.85; argmax_t B[s] = f(s) and argmax_d K[s] = s for every symbol.
TEST_P(ResponsibilityAttentionAcceptanceTest, EmRecoversAddressing) {
  const uint64_t seed = testing::test_seed(2);
  const RecallTask task = make_recall_task(4000, 1500, seed);
  OptimizeOptions options;
  options.max_its = 40;
  options.seed = seed;
  const auto fit = optimize(task.train, recall_estimator(), options);
  const ResponsibilityAttention& model = fit.model;
  const double acc = accuracy(model.predict_proba(task.test), task.test.targets());
  EXPECT_GT(acc, 0.85) << "seed " << seed;
  for (Index s = 0; s < 16; ++s) {
    Index best_t = 0, best_d = 0;
    model.params().emission.row(s).maxCoeff(&best_t);
    model.params().key_means.row(s).maxCoeff(&best_d);
    EXPECT_EQ(best_t, task.target_of_symbol[static_cast<size_t>(s)]) << "symbol " << s << " seed " << seed;
    EXPECT_EQ(best_d, s) << "symbol " << s << " seed " << seed;
  }
}

/// RA-6: beats the position-only baseline argmax_t Σ_i π_i B[c_i, t] by more than 3×.
TEST_P(ResponsibilityAttentionAcceptanceTest, BeatsPositionOnlyBaseline) {
  const uint64_t seed = testing::test_seed(3);
  const RecallTask task = make_recall_task(3000, 2000, seed);
  OptimizeOptions options;
  options.max_its = 30;
  options.seed = seed;
  const auto fit = optimize(task.train, recall_estimator(), options);
  const double acc = accuracy(fit.model.predict_proba(task.test), task.test.targets());
  const double baseline = accuracy(predict_position_only(fit.model, task.test), task.test.targets());
  EXPECT_GT(acc, 0.85) << "seed " << seed;
  EXPECT_GT(acc, 3.0 * baseline) << "baseline " << baseline << " seed " << seed;
}

/// RA-9: learned σ²: truth 0.7, keys 2·N(0,1), B = I, 6000 samples, initial 1.0, 40 its → |σ² − 0.7| < 0.07.
TEST_P(ResponsibilityAttentionAcceptanceTest, LearnsSigma2) {
  const uint64_t seed = testing::test_seed(4);
  const Index S = 16, N = 6, D = 16;
  Rng rng(seed);
  ResponsibilityAttentionParams truth;
  truth.key_means.resize(S, D);
  for (Index k = 0; k < truth.key_means.size(); ++k) truth.key_means.data()[k] = 2.0 * rng.normal();
  truth.emission = Matrix::Identity(S, S);
  truth.position_prior = Vector::Constant(N, 1.0 / static_cast<double>(N));
  truth.sigma2 = 0.7;
  const ResponsibilityAttentionBatch data = ResponsibilityAttention(truth).sampler(seed).sample(6000);
  ResponsibilityAttentionEstimatorOptions est = options_of_precision();
  est.sigma2 = 1.0;
  est.estimate_sigma2 = true;
  OptimizeOptions options;
  options.max_its = 40;
  options.seed = seed;
  const auto fit = optimize(data, ResponsibilityAttentionEstimator(S, N, D, S, est), options);
  EXPECT_LT(std::fabs(fit.model.sigma2() - 0.7), 0.07) << "sigma2 " << fit.model.sigma2() << " seed " << seed;
}

/// RA-12: Markov(1) text, V = 8, N = 4, σ² = 0.3, 6000 train, one-hot queries: accuracy beats the unigram
/// predictor by 0.03 and is within 0.04 of the bigram-optimal accuracy.
TEST_P(ResponsibilityAttentionAcceptanceTest, MarkovTextApproachesBigramOptimum) {
  const uint64_t seed = testing::test_seed(5);
  const int64_t V = 8, N = 4;
  Rng rng(seed);
  Matrix transition(V, V);  // rows: Dirichlet(1) next-token distributions
  for (Index v = 0; v < V; ++v) rng.dirichlet_ones({transition.data() + v * V, static_cast<size_t>(V)});
  const auto generate = [&](Index length) {
    std::vector<int64_t> tokens(static_cast<size_t>(length));
    tokens[0] = static_cast<int64_t>(rng.uniform_int(V));
    for (size_t k = 1; k < tokens.size(); ++k)
      tokens[k] = rng.categorical({transition.data() + tokens[k - 1] * V, static_cast<size_t>(V)});
    return tokens;
  };
  const std::vector<int64_t> train_tokens = generate(6000 + N);
  const std::vector<int64_t> test_tokens = generate(4000 + N);
  const auto train = sequence_to_triples(train_tokens, N, V);
  const auto test = sequence_to_triples(test_tokens, N, V);
  ResponsibilityAttentionEstimatorOptions est = options_of_precision();
  est.sigma2 = 0.3;
  OptimizeOptions options;
  options.max_its = 40;
  options.seed = seed;
  const auto fit = optimize(train, ResponsibilityAttentionEstimator(V, N, V, V, est), options);
  const double acc = accuracy(fit.model.predict_proba(test), test.targets());

  // Oracles: the true bigram argmax and the training unigram argmax.
  Index bigram_correct = 0;
  std::vector<double> unigram(static_cast<size_t>(V), 0.0);
  for (Index n = 0; n < train.n_rows(); ++n) unigram[static_cast<size_t>(train.target(n))] += 1.0;
  const int64_t unigram_best = std::max_element(unigram.begin(), unigram.end()) - unigram.begin();
  Index unigram_correct = 0;
  for (Index n = 0; n < test.n_rows(); ++n) {
    Index best = 0;
    transition.row(test.context(n)[N - 1]).maxCoeff(&best);
    bigram_correct += best == test.target(n);
    unigram_correct += unigram_best == test.target(n);
  }
  const double bigram = static_cast<double>(bigram_correct) / static_cast<double>(test.n_rows());
  const double unigram_acc = static_cast<double>(unigram_correct) / static_cast<double>(test.n_rows());
  EXPECT_GT(acc, unigram_acc + 0.03) << "unigram " << unigram_acc << " seed " << seed;
  EXPECT_LT(std::fabs(acc - bigram), 0.04) << "acc " << acc << " bigram " << bigram << " seed " << seed;
}

INSTANTIATE_TEST_SUITE_P(Precisions, ResponsibilityAttentionAcceptanceTest,
                         ::testing::Values(Precision::kFloat64, Precision::kMixed),
                         [](const ::testing::TestParamInfo<Precision>& param) {
                           return std::string(precision_name(param.param));
                         });

}  // namespace
}  // namespace attnmix
