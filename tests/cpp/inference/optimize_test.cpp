// SPDX-License-Identifier: Apache-2.0
// optimize(): the fused and classic loops against a scripted model sequence (F-2), the progress line (F-3),
// initialisation (F-4), determinism (F-6) and thread-count invariance of whole fits (F-1).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "attnmix/attention/recall_task.hpp"
#include "attnmix/core/accumulator.hpp"
#include "attnmix/inference/optimize.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

// A scripted family: model k scores scores[k]; its EM step yields model k + 1. One data row.
struct ScriptBatch {
  Index n = 1;
  [[nodiscard]] Index n_rows() const { return n; }
  [[nodiscard]] ScriptBatch slice(Index, Index count) const { return {count}; }
};

class ScriptAccumulator : public FlatAccumulator<ScriptAccumulator> {
 public:
  static constexpr const char* kWhere = "ScriptAccumulator";
  using batch_type = ScriptBatch;
  ScriptAccumulator()
      : FlatAccumulator(std::make_shared<const StatLayout>(
            kWhere,
            std::vector<FieldSpec>{{"next", {}, FieldKind::kCount}, {"weight", {}, FieldKind::kCount}})) {}
  void validate(std::string_view) const {}
  void initialize(const ScriptBatch&, std::span<const double> w, Rng&) {
    for (double wn : w) *field(1) += wn;
  }
};

struct ScriptModel {
  using batch_type = ScriptBatch;
  using accumulator_type = ScriptAccumulator;
  int index = 0;
  const std::vector<double>* scores = nullptr;
  void log_density(const ScriptBatch&, std::span<double> out) const { out[0] = scores->at(static_cast<size_t>(index)); }
  void accumulate(const ScriptBatch&, std::span<const double> w, ScriptAccumulator& acc,
                  std::span<double> log_p) const {
    *acc.field(0) += (index + 1) * w[0];
    if (!log_p.empty()) log_p[0] = scores->at(static_cast<size_t>(index));
  }
  [[nodiscard]] ScriptAccumulator make_accumulator() const { return {}; }
};

struct ScriptEstimator {
  using distribution_type = ScriptModel;
  using accumulator_type = ScriptAccumulator;
  const std::vector<double>* scores = nullptr;
  std::vector<std::optional<double>>* nobs_seen = nullptr;
  [[nodiscard]] ScriptAccumulator make_accumulator() const { return {}; }
  [[nodiscard]] ScriptModel estimate(std::optional<double> nobs, const ScriptAccumulator& acc) const {
    if (nobs_seen) nobs_seen->push_back(nobs);
    return {static_cast<int>(*acc.field(0)), scores};
  }
};

struct ScriptRun {
  OptimizeResult<ScriptModel> result;
  std::vector<IterationReport> reports;
};

ScriptRun run_script(const std::vector<double>& scores, int max_its, std::optional<double> delta,
                     bool fused = true) {
  OptimizeOptions options;
  options.max_its = max_its;
  options.delta = delta;
  options.reuse_estep_ll = fused;
  ScriptRun run{{}, {}};
  options.on_iteration = [&](const IterationReport& r) { run.reports.push_back(r); };
  run.result = optimize(ScriptBatch{}, ScriptEstimator{&scores, nullptr}, options);
  return run;
}

/// F-2: the fused loop returns the best-scoring iterate and stops on the first decrease when delta is set.
TEST(OptimizeTest, FusedLoopStopsOnFirstDecreaseAndReturnsBest) {
  const std::vector<double> scores{-10, -5, -3, -4, -1, -0.5};
  const ScriptRun run = run_script(scores, 10, 1e-9);
  EXPECT_EQ(run.result.model.index, 2);
  EXPECT_EQ(run.result.n_iterations, 4);
  EXPECT_EQ(run.result.status, OptimizeStatus::kConverged);
  ASSERT_EQ(run.reports.size(), 4u);
  EXPECT_EQ(run.reports[0].log_likelihood, -10);
  EXPECT_EQ(run.reports[0].delta_log_likelihood, std::numeric_limits<double>::infinity());
  EXPECT_EQ(run.reports[3].delta_log_likelihood, -1);
}

/// F-2: delta = None runs every iteration, then scores the final model.
TEST(OptimizeTest, NoDeltaRunsAllIterationsAndScoresFinalModel) {
  const std::vector<double> scores{-10, -5, -3, -4, -1, -2};
  const ScriptRun run = run_script(scores, 5, std::nullopt);
  EXPECT_EQ(run.result.n_iterations, 5);
  EXPECT_EQ(run.result.model.index, 4);  // −1 beats the final model's −2
  EXPECT_EQ(run.result.status, OptimizeStatus::kMaxIterations);
  const std::vector<double> rising{-10, -5, -3, -2, -1, -0.5};
  EXPECT_EQ(run_script(rising, 5, std::nullopt).result.model.index, 5);  // the final model wins
}

/// F-2: ties go to the later iterate; max_its = 0 returns the initial model unscored.
TEST(OptimizeTest, TiesGoToLaterIterateAndZeroIterationsReturnsInitial) {
  const std::vector<double> scores{-1, -1, -5};
  EXPECT_EQ(run_script(scores, 2, std::nullopt).result.model.index, 1);
  const ScriptRun none = run_script(scores, 0, 1e-9);
  EXPECT_EQ(none.result.model.index, 0);
  EXPECT_TRUE(none.reports.empty());
  EXPECT_TRUE(none.result.scores.empty());
}

/// F-2: a small increase below delta converges; the classic loop rejects a decreasing step.
TEST(OptimizeTest, ConvergesBelowDeltaAndClassicLoopRejectsDecrease) {
  const std::vector<double> scores{-10, -9, -9 + 1e-12, -8};
  const ScriptRun fused = run_script(scores, 10, 1e-9);
  EXPECT_EQ(fused.result.n_iterations, 3);
  EXPECT_EQ(fused.result.model.index, 2);

  const std::vector<double> classic_scores{-10, -5, -7, -1};
  const ScriptRun classic = run_script(classic_scores, 10, 1e-9, false);
  // Iteration 1: −5 accepted; iteration 2: −7 < −5 rejected, dll = −2 < delta stops.
  EXPECT_EQ(classic.result.model.index, 1);
  EXPECT_EQ(classic.result.n_iterations, 2);
  ASSERT_EQ(classic.reports.size(), 2u);
  EXPECT_EQ(classic.reports[0].log_likelihood, -5);
  EXPECT_EQ(classic.reports[0].delta_log_likelihood, 5);
}

/// print_iter: only every k-th line (and the converged line) is reported.
TEST(OptimizeTest, PrintIterThinsReports) {
  const std::vector<double> scores{-10, -9, -8, -7, -6, -5, -5.5};
  OptimizeOptions options;
  options.max_its = 10;
  options.print_iter = 2;
  std::vector<int> lines;
  options.on_iteration = [&](const IterationReport& r) { lines.push_back(r.iteration); };
  (void)optimize(ScriptBatch{}, ScriptEstimator{&scores, nullptr}, options);
  EXPECT_EQ(lines, (std::vector<int>{2, 4, 6, 7}));  // 7 is the converged line
}

/// F-3: the progress line byte for byte, with inf on line 1 and the validation field.
TEST(OptimizeTest, ProgressLineFormat) {
  IterationReport r;
  r.iteration = 1;
  r.log_likelihood = -1234.5;
  r.delta_log_likelihood = std::numeric_limits<double>::infinity();
  EXPECT_EQ(format_progress_line(r),
            "Iteration 1: ln[p_mat(Data|Model)]=-1.234500e+03, "
            "ln[p_mat(Data|Model)]-ln[p_mat(Data|PrevModel)]=inf\n");
  r.iteration = 12;
  r.delta_log_likelihood = 4.07e-10;
  r.valid_log_likelihood = -17.25;
  EXPECT_EQ(format_progress_line(r),
            "Iteration 12: ln[p_mat(Data|Model)]=-1.234500e+03, "
            "ln[p_mat(Data|Model)]-ln[p_mat(Data|PrevModel)]=4.070000e-10, "
            "ln[p_mat(Valid Data|Model)]=-1.725000e+01\n");
}

double initial_nobs(double init_p, Index n_rows, uint64_t seed) {
  const std::vector<double> scores{0.0};
  std::vector<std::optional<double>> seen;
  OptimizeOptions options;
  options.max_its = 0;
  options.init_p = init_p;
  options.seed = seed;
  (void)optimize(ScriptBatch{n_rows}, ScriptEstimator{&scores, &seen}, options);
  EXPECT_EQ(seen.size(), 1u);
  return seen.at(0).value();
}

/// F-4: nobs = Σ Bernoulli(init_p) weights drawn from Rng(Rng(seed).uniform_int(2³¹−1)); init_p ≤ 0 acts as 0.1.
TEST(OptimizeTest, InitialisationWeightsAreBernoulliSubset) {
  const Index n = 5000;
  for (const double p : {0.1, 0.35, 1.0}) {
    Rng rng(77);
    Rng rng_w(rng.uniform_int((uint64_t{1} << 31) - 1));
    double expected = 0.0;
    for (Index k = 0; k < n; ++k) expected += rng_w.bernoulli(p) ? 1.0 : 0.0;
    EXPECT_EQ(initial_nobs(p, n, 77), expected) << "init_p " << p;
  }
  EXPECT_EQ(initial_nobs(0.0, n, 77), initial_nobs(0.1, n, 77));
  EXPECT_EQ(initial_nobs(-3.0, n, 77), initial_nobs(0.1, n, 77));
  EXPECT_EQ(initial_nobs(1.0, n, 77), static_cast<double>(n));
}

ResponsibilityAttention fit_recall(int n_threads, uint64_t seed) {
  const RecallTask task = make_recall_task(3000, 1, 8);
  ResponsibilityAttentionEstimatorOptions est;
  est.sigma2 = 0.5;
  est.estimate_sigma2 = true;
  OptimizeOptions options;
  options.max_its = 5;
  options.seed = seed;
  options.n_threads = n_threads;
  options.chunk_rows = 256;
  return optimize(task.train, ResponsibilityAttentionEstimator(16, 6, 16, 16, est), options).model;
}

bool bitwise_equal(const ResponsibilityAttention& a, const ResponsibilityAttention& b) {
  const auto& p = a.params();
  const auto& q = b.params();
  return p.key_means == q.key_means && p.emission == q.emission && p.position_prior == q.position_prior &&
         p.sigma2 == q.sigma2;
}

/// F-6: two fits with the same seed are bitwise identical; another seed differs.
TEST(OptimizeTest, SameSeedGivesBitwiseIdenticalModels) {
  EXPECT_TRUE(bitwise_equal(fit_recall(1, 4), fit_recall(1, 4)));
  EXPECT_FALSE(bitwise_equal(fit_recall(1, 4), fit_recall(1, 5)));
}

/// F-1: whole fits are bitwise identical for 1, 2, 3 and 8 threads.
TEST(OptimizeTest, FitsAreBitwiseIdenticalForAnyThreadCount) {
  const ResponsibilityAttention one = fit_recall(1, 4);
  for (int threads : {2, 3, 8}) EXPECT_TRUE(bitwise_equal(one, fit_recall(threads, 4))) << threads << " threads";
}

TEST(OptimizeTest, InvalidOptionsRaise) {
  const std::vector<double> scores{0.0};
  OptimizeOptions options;
  options.max_its = -1;
  EXPECT_THROW((void)optimize(ScriptBatch{}, ScriptEstimator{&scores, nullptr}, options), ValueError);
  options = {};
  options.print_iter = 0;
  EXPECT_THROW((void)optimize(ScriptBatch{}, ScriptEstimator{&scores, nullptr}, options), ValueError);
  options = {};
  options.chunk_rows = -1;  // 0 is the default: chosen from the statistics' size
  EXPECT_THROW((void)optimize(ScriptBatch{}, ScriptEstimator{&scores, nullptr}, options), ValueError);
}

/// Issue 18: data with no rows is an error (it used to return a model fitted to nothing), whichever loop, with or
/// without a previous estimate, even with max_its = 0, and from initialize_model itself.
TEST(OptimizeTest, DataWithoutRowsRaises) {
  const std::vector<double> scores{-1.0, -0.5, -0.25};
  const ScriptEstimator estimator{&scores, nullptr};
  const ScriptBatch empty{0};
  const auto expect_no_rows = [](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "no ValueError";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("optimize: the data has no rows"), std::string::npos) << e.what();
    }
  };
  for (const bool fused : {true, false}) {
    for (const int max_its : {0, 3}) {
      OptimizeOptions options;
      options.reuse_estep_ll = fused;
      options.max_its = max_its;
      expect_no_rows([&] { (void)optimize(empty, estimator, options); });
      expect_no_rows([&] { (void)optimize(empty, estimator, options, ScriptModel{0, &scores}); });
    }
  }
  Rng rng(3);
  expect_no_rows([&] { (void)initialize_model(empty, estimator, OptimizeOptions{}, rng); });
  // One row still fits.
  OptimizeOptions two;
  two.max_its = 2;
  EXPECT_EQ(optimize(ScriptBatch{1}, estimator, two).model.index, 2);
}

// ---- checkpoints: a run resumed from any saved state ends as the run that saved it --------------------------------

template <class D>
struct SavedRun {
  OptimizeResult<D> result;
  std::vector<OptimizeState<D>> states;
  std::vector<IterationReport> reports;
};

template <class E>
SavedRun<typename E::distribution_type> run_saving(const typename E::distribution_type::batch_type& batch,
                                                   const E& estimator, OptimizeOptions options,
                                                   const typename E::distribution_type::batch_type* valid,
                                                   const OptimizeState<typename E::distribution_type>* resume) {
  using D = typename E::distribution_type;
  std::vector<OptimizeState<D>> states;
  std::vector<IterationReport> reports;
  options.on_iteration = [&](const IterationReport& r) { reports.push_back(r); };
  OptimizeCheckpoints<D> checkpoints;
  checkpoints.save = [&](const OptimizeState<D>& state) { states.push_back(state); };
  checkpoints.resume = resume;
  OptimizeResult<D> result = optimize(batch, estimator, options, std::nullopt, valid, &checkpoints);
  return {std::move(result), std::move(states), std::move(reports)};
}

/// Every state saved by a scripted run (decreases, ties, both loops, with and without delta and validation data)
/// resumes to the same returned model, status, iteration counts, scores and remaining report lines.
TEST(OptimizeCheckpointTest, ResumingFromAnySavedStateEndsAsTheUninterruptedRun) {
  const std::vector<std::vector<double>> scripts{{-5.0, -4.0, -3.5, -3.5, -3.6, -3.0, -2.9, -2.9, -2.9},
                                                 {-9.0, -8.0, -8.5, -7.0, -6.0, -6.0, -5.0, -4.0, -3.0}};
  const ScriptBatch valid{1};
  for (const auto& scores : scripts)
    for (const bool fused : {true, false})
      for (const std::optional<double> delta : {std::optional<double>(1e-9), std::optional<double>()})
        for (const ScriptBatch* validation : {static_cast<const ScriptBatch*>(nullptr), &valid}) {
          OptimizeOptions options;
          options.max_its = 7;
          options.delta = delta;
          options.reuse_estep_ll = fused;
          const ScriptEstimator estimator{&scores, nullptr};
          const auto full = run_saving(ScriptBatch{}, estimator, options, validation, nullptr);
          ASSERT_FALSE(full.states.empty());
          for (const auto& state : full.states) {
            SCOPED_TRACE(::testing::Message() << "fused " << fused << ", delta " << delta.has_value()
                                              << ", valid " << (validation != nullptr) << ", resumed after "
                                              << state.iteration);
            const auto resumed = run_saving(ScriptBatch{}, estimator, options, validation, &state);
            EXPECT_EQ(resumed.result.model.index, full.result.model.index);
            EXPECT_EQ(resumed.result.status, full.result.status);
            EXPECT_EQ(resumed.result.n_iterations, full.result.n_iterations);
            EXPECT_EQ(resumed.result.best_iteration, full.result.best_iteration);
            EXPECT_EQ(resumed.result.scores, full.result.scores);
            ASSERT_EQ(resumed.reports.size(), full.reports.size() - static_cast<size_t>(state.iteration));
            for (size_t k = 0; k < resumed.reports.size(); ++k) {
              const IterationReport& a = resumed.reports[k];
              const IterationReport& b = full.reports[k + static_cast<size_t>(state.iteration)];
              EXPECT_EQ(a.iteration, b.iteration);
              EXPECT_EQ(a.log_likelihood, b.log_likelihood);
              EXPECT_EQ(a.delta_log_likelihood, b.delta_log_likelihood);
              EXPECT_EQ(a.valid_log_likelihood, b.valid_log_likelihood);
            }
          }
        }
}

/// A responsibility-attention fit resumed after each iteration, on another number of threads, gives the bits of the
/// uninterrupted fit; states are saved every `every` iterations, the last iteration included.
TEST(OptimizeCheckpointTest, ResumedFitsAreBitwiseTheUninterruptedFit) {
  const RecallTask task = make_recall_task(3000, 1, 8);
  ResponsibilityAttentionEstimatorOptions est;
  est.sigma2 = 0.5;
  est.estimate_sigma2 = true;
  const ResponsibilityAttentionEstimator estimator(16, 6, 16, 16, est);
  OptimizeOptions options;
  options.max_its = 6;
  options.delta = std::nullopt;
  options.seed = 4;
  options.chunk_rows = 256;
  options.n_threads = 1;
  const auto full = run_saving(task.train, estimator, options, nullptr, nullptr);
  ASSERT_EQ(full.states.size(), 6U);
  options.n_threads = 3;
  for (const auto& state : full.states) {
    const auto resumed = run_saving(task.train, estimator, options, nullptr, &state);
    EXPECT_TRUE(bitwise_equal(resumed.result.model, full.result.model)) << "after " << state.iteration;
    EXPECT_EQ(resumed.result.scores, full.result.scores);
    EXPECT_EQ(resumed.result.best_iteration, full.result.best_iteration);
  }
  // Every second iteration: states after iterations 2, 4 and 6.
  OptimizeCheckpoints<ResponsibilityAttention> every_two;
  std::vector<int> saved;
  every_two.save = [&](const OptimizeState<ResponsibilityAttention>& state) { saved.push_back(state.iteration); };
  every_two.every = 2;
  (void)optimize(task.train, estimator, options, std::nullopt, nullptr, &every_two);
  EXPECT_EQ(saved, (std::vector<int>{2, 4, 6}));
}

TEST(OptimizeCheckpointTest, BadSettingsRaise) {
  const std::vector<double> scores{-3.0, -2.0, -1.0, -0.5, -0.25, -0.125, -0.1};
  const ScriptEstimator estimator{&scores, nullptr};
  OptimizeOptions options;
  options.max_its = 3;
  OptimizeCheckpoints<ScriptModel> checkpoints;
  checkpoints.every = 0;
  EXPECT_THROW((void)optimize(ScriptBatch{}, estimator, options, std::nullopt, nullptr, &checkpoints), ValueError);
  const auto full = run_saving(ScriptBatch{}, estimator, options, nullptr, nullptr);
  checkpoints.every = 1;
  checkpoints.resume = &full.states.back();  // after iteration 3
  options.max_its = 2;
  EXPECT_THROW((void)optimize(ScriptBatch{}, estimator, options, std::nullopt, nullptr, &checkpoints), ValueError);
  options.max_its = 5;  // a later run may go on further
  const OptimizeResult<ScriptModel> longer = optimize(ScriptBatch{}, estimator, options, std::nullopt, nullptr,
                                                      &checkpoints);
  EXPECT_EQ(longer.n_iterations, 5);
  EXPECT_EQ(longer.scores, (std::vector<double>{-3.0, -2.0, -1.0, -0.5, -0.25}));
}

}  // namespace
}  // namespace attnmix
