// SPDX-License-Identifier: Apache-2.0
// The optimizer state shared by the variational families (docs/mechanisms.md#variational-embedding-attention) against
// independent oracles.
//
// Oracles written here, from docs/mechanisms.md#variational-embedding-attention and not from the library's internals:
//   * scalar_adam_step: the Adam ascent of docs/mechanisms.md#variational-embedding-attention written entry by entry
//     (bias correction with 0.9^τ and 0.999^τ,
//     ε = 1e-8, the KL gradient −λ m and −λ ½(v − 1), then the clip of log v to [−8, 2]);
//   * central finite differences of the KL term;
//   * the noise tables drawn directly from Rng(derive_seed(seed, kMcNoise, τ)), N(0, 1) row-major, k in order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

using testing::ExpectAllClose;
constexpr const char* kVea = "variational_embedding_attention";
constexpr const char* kVmha = "variational_multihop_attention";

Matrix random_matrix(Index rows, Index cols, double scale, Rng& rng) {
  Matrix m(rows, cols);
  for (Index k = 0; k < m.size(); ++k) m.data()[k] = scale * rng.normal();
  return m;
}

/// Bitwise equality of two matrices (shape and every bit, so −0.0 ≠ 0.0 and NaN payloads count).
bool same_bits(const Matrix& a, const Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * static_cast<size_t>(a.size())) == 0;
}

void ExpectSameState(const AttentionOptimizerState& actual, const AttentionOptimizerState& expected) {
  EXPECT_EQ(actual.family, expected.family);
  EXPECT_EQ(actual.iteration, expected.iteration);
  EXPECT_EQ(actual.seed, expected.seed);
  EXPECT_TRUE(same_bits(actual.mean, expected.mean));
  EXPECT_TRUE(same_bits(actual.log_var, expected.log_var));
  EXPECT_TRUE(same_bits(actual.mean_first_moment, expected.mean_first_moment));
  EXPECT_TRUE(same_bits(actual.mean_second_moment, expected.mean_second_moment));
  EXPECT_TRUE(same_bits(actual.log_var_first_moment, expected.log_var_first_moment));
  EXPECT_TRUE(same_bits(actual.log_var_second_moment, expected.log_var_second_moment));
  EXPECT_TRUE(actual == expected);
}

/// A valid state with non-zero moments (second moments ≥ 0), iteration 7.
AttentionOptimizerState random_state(Index S, Index D, Rng& rng) {
  AttentionOptimizerState s = AttentionOptimizerState::fresh(kVea, random_matrix(S, D, 1.0, rng),
                                                             random_matrix(S, D, 0.5, rng), 12345);
  s.mean_first_moment = random_matrix(S, D, 0.3, rng);
  s.mean_second_moment = random_matrix(S, D, 0.3, rng).cwiseAbs2();
  s.log_var_first_moment = random_matrix(S, D, 0.3, rng);
  s.log_var_second_moment = random_matrix(S, D, 0.3, rng).cwiseAbs2();
  s.iteration = 7;
  return s;
}

/// Expects f to throw ValueError whose message contains every fragment.
template <class F>
void ExpectValueError(F&& f, const std::vector<std::string>& fragments, const std::string& context) {
  try {
    f();
    ADD_FAILURE() << context << ": no exception";
  } catch (const ValueError& e) {
    for (const std::string& fragment : fragments)
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
          << context << ": message '" << e.what() << "' lacks '" << fragment << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << context << ": wrong exception type: " << e.what();
  }
}

/// Oracle: one Adam ascent step of docs/mechanisms.md#variational-embedding-attention on one scalar, with the moments
/// it updates.
struct ScalarAdam {
  double theta, m1, m2;
};
ScalarAdam scalar_adam_step(ScalarAdam s, double g, double lr, int64_t tau) {
  s.m1 = 0.9 * s.m1 + 0.1 * g;
  s.m2 = 0.999 * s.m2 + 0.001 * g * g;
  const double m_hat = s.m1 / (1.0 - std::pow(0.9, static_cast<double>(tau)));
  const double v_hat = s.m2 / (1.0 - std::pow(0.999, static_cast<double>(tau)));
  s.theta = s.theta + lr * m_hat / (std::sqrt(v_hat) + 1e-8);
  return s;
}

// ----- fresh / validate --------------------------------------------------------------------------------------------

/// docs/mechanisms.md#variational-embedding-attention: fresh(family, mean, log_var, seed) keeps the arrays bit for bit,
/// has four zero moments of the same shape, iteration 0 and the given seed, and validates.
TEST(AttentionOptimizerStateTest, FreshHasZeroMomentsAndIterationZero) {
  Rng rng(testing::test_seed(31));
  const Matrix mean = random_matrix(4, 3, 1.0, rng);
  const Matrix log_var = random_matrix(4, 3, 0.5, rng);
  const AttentionOptimizerState s = AttentionOptimizerState::fresh(kVmha, mean, log_var, 99);
  EXPECT_EQ(s.family, kVmha);
  EXPECT_TRUE(same_bits(s.mean, mean));
  EXPECT_TRUE(same_bits(s.log_var, log_var));
  for (const Matrix* moment :
       {&s.mean_first_moment, &s.mean_second_moment, &s.log_var_first_moment, &s.log_var_second_moment}) {
    EXPECT_EQ(moment->rows(), 4);
    EXPECT_EQ(moment->cols(), 3);
    EXPECT_TRUE(moment->isZero(0.0));
  }
  EXPECT_EQ(s.iteration, 0);
  EXPECT_EQ(s.seed, 99u);
  EXPECT_NO_THROW(s.validate("test"));
  EXPECT_EQ(AttentionOptimizerState::kSchemaVersion, 1);
  EXPECT_STREQ(AttentionOptimizerState::kAlgorithm, "adam");
}

/// docs/mechanisms.md#variational-embedding-attention: validate() rejects (ValueError naming the field) an unknown
/// family, each of the six arrays with another shape, an empty array, a NaN or ±∞ entry in each array, a negative
/// second moment and a negative iteration; the where argument starts the message.
TEST(AttentionOptimizerStateTest, ValidateRejectsInvalidStates) {
  Rng rng(testing::test_seed(32));
  const AttentionOptimizerState good = random_state(3, 2, rng);
  EXPECT_NO_THROW(good.validate("here"));

  AttentionOptimizerState bad = good;
  bad.family = "responsibility_attention";
  ExpectValueError([&] { bad.validate("here"); }, {"here", "family"}, "unknown family");
  bad.family = "";
  ExpectValueError([&] { bad.validate("here"); }, {"family"}, "empty family");

  const std::vector<std::pair<std::string, Matrix AttentionOptimizerState::*>> arrays{
      {"mean", &AttentionOptimizerState::mean},
      {"log_var", &AttentionOptimizerState::log_var},
      {"mean_first_moment", &AttentionOptimizerState::mean_first_moment},
      {"mean_second_moment", &AttentionOptimizerState::mean_second_moment},
      {"log_var_first_moment", &AttentionOptimizerState::log_var_first_moment},
      {"log_var_second_moment", &AttentionOptimizerState::log_var_second_moment}};
  for (const auto& [name, member] : arrays) {
    bad = good;
    (bad.*member) = Matrix::Zero(3, 3);  // wrong width
    // A wrong mean shape makes every other array mismatch it; the message names one of the arrays.
    ExpectValueError([&] { bad.validate("here"); }, {"here", name == "mean" ? "" : name}, "shape of " + name);
    bad = good;
    (bad.*member) = Matrix::Zero(2, 2);
    ExpectValueError([&] { bad.validate("here"); }, {"here"}, "rows of " + name);
    for (const double x : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()}) {
      bad = good;
      (bad.*member)(1, 1) = x;
      ExpectValueError([&] { bad.validate("here"); }, {"here", name, "finite"}, "non-finite " + name);
    }
  }
  bad = good;
  bad.mean = Matrix(0, 0);
  bad.log_var = bad.mean;
  bad.mean_first_moment = bad.mean;
  bad.mean_second_moment = bad.mean;
  bad.log_var_first_moment = bad.mean;
  bad.log_var_second_moment = bad.mean;
  ExpectValueError([&] { bad.validate("here"); }, {"non-empty"}, "empty arrays");
  bad = good;
  bad.log_var_second_moment(0, 1) = -1e-3;
  ExpectValueError([&] { bad.validate("here"); }, {"second moment"}, "negative second moment");
  bad = good;
  bad.iteration = -1;
  ExpectValueError([&] { bad.validate("here"); }, {"here", "iteration"}, "negative iteration");
  bad.iteration = 0;
  EXPECT_NO_THROW(bad.validate("here"));
}

/// operator== compares every array bit for bit and every scalar field: a one-ulp change in any array, or another
/// iteration, seed or family, makes states differ.
TEST(AttentionOptimizerStateTest, EqualityIsBitwise) {
  Rng rng(testing::test_seed(33));
  const AttentionOptimizerState a = random_state(2, 3, rng);
  AttentionOptimizerState b = a;
  EXPECT_TRUE(a == b);
  for (Matrix AttentionOptimizerState::*member :
       {&AttentionOptimizerState::mean, &AttentionOptimizerState::log_var,
        &AttentionOptimizerState::mean_first_moment, &AttentionOptimizerState::mean_second_moment,
        &AttentionOptimizerState::log_var_first_moment, &AttentionOptimizerState::log_var_second_moment}) {
    b = a;
    double& x = (b.*member)(1, 2);
    x = std::nextafter(x, 1e300);
    EXPECT_FALSE(a == b);
  }
  b = a;
  b.iteration += 1;
  EXPECT_FALSE(a == b);
  b = a;
  b.seed += 1;
  EXPECT_FALSE(a == b);
  b = a;
  b.family = kVmha;
  EXPECT_FALSE(a == b);
}

// ----- JSON ----------------------------------------------------------------------------------------------------------

/// docs/mechanisms.md#variational-embedding-attention (VEA-7): to_json → from_json is bit-exact for awkward doubles
/// (1/3, 0.1, subnormals, ±1e300, −0.0), both as a JSON value and through its text; the document holds schema_version
/// 1, algorithm "adam", family, iteration and seed (a seed above 2⁶³ included), arrays as nested lists.
TEST(AttentionOptimizerStateTest, JsonRoundTripIsBitExact) {
  Rng rng(testing::test_seed(34));
  AttentionOptimizerState s = random_state(3, 4, rng);
  s.family = kVmha;
  s.mean(0, 0) = 1.0 / 3.0;
  s.mean(0, 1) = 0.1;
  s.mean(0, 2) = std::numeric_limits<double>::denorm_min();
  s.mean(0, 3) = -1e300;
  s.log_var(1, 1) = -0.0;
  s.log_var(2, 3) = std::nextafter(1.0, 2.0);
  s.mean_second_moment(2, 2) = 1e-310;  // subnormal
  s.iteration = 123456;
  s.seed = (uint64_t{1} << 63) + 12345;
  ASSERT_NO_THROW(s.validate("test"));

  const nlohmann::json doc = optimizer_state_to_json(s);
  EXPECT_EQ(doc.at("schema_version"), 1);
  EXPECT_EQ(doc.at("algorithm"), "adam");
  EXPECT_EQ(doc.at("family"), kVmha);
  EXPECT_EQ(doc.at("iteration"), 123456);
  EXPECT_EQ(doc.at("seed").get<uint64_t>(), s.seed);
  ASSERT_TRUE(doc.at("mean").is_array());
  ASSERT_EQ(doc.at("mean").size(), 3u);
  ASSERT_EQ(doc.at("mean")[0].size(), 4u);
  EXPECT_EQ(doc.at("mean")[0][1].get<double>(), 0.1);

  ExpectSameState(optimizer_state_from_json(doc, "doc"), s);
  ExpectSameState(optimizer_state_from_json(nlohmann::json::parse(doc.dump()), "text"), s);
  // A second trip gives the same text.
  EXPECT_EQ(optimizer_state_to_json(optimizer_state_from_json(doc, "doc")).dump(), doc.dump());
}

/// docs/mechanisms.md#variational-embedding-attention: from_json validates everything: an unknown schema_version or
/// algorithm raises ValueError naming that field; so do a missing or unknown field, an unknown family, ragged or
/// mismatched arrays, a non-finite entry, a negative iteration and a negative seed. The message starts with the source
/// name.
TEST(AttentionOptimizerStateTest, FromJsonRejectsUnknownVersionAlgorithmAndInvalidFields) {
  Rng rng(testing::test_seed(35));
  const nlohmann::json good = optimizer_state_to_json(random_state(2, 2, rng));
  ASSERT_NO_THROW((void)optimizer_state_from_json(good, "state.json"));

  const auto expect_error = [&](const nlohmann::json& doc, const std::vector<std::string>& fragments,
                                const std::string& context) {
    ExpectValueError([&] { (void)optimizer_state_from_json(doc, "state.json"); }, fragments, context);
  };
  nlohmann::json doc = good;
  doc["schema_version"] = 2;
  expect_error(doc, {"state.json", "schema_version"}, "schema_version 2");
  doc["schema_version"] = 0;
  expect_error(doc, {"schema_version"}, "schema_version 0");
  doc["schema_version"] = "1";
  expect_error(doc, {"schema_version"}, "schema_version as a string");
  doc = good;
  doc["algorithm"] = "sgd";
  expect_error(doc, {"state.json", "algorithm"}, "algorithm sgd");
  doc["algorithm"] = "Adam";
  expect_error(doc, {"algorithm"}, "algorithm Adam");
  doc = good;
  doc.erase("log_var_second_moment");
  expect_error(doc, {"log_var_second_moment"}, "missing field");
  doc = good;
  doc["learning_rate"] = 0.1;
  expect_error(doc, {"learning_rate"}, "unknown field");
  doc = good;
  doc["family"] = "chained_attention";
  expect_error(doc, {"family"}, "unknown family");
  doc = good;
  doc["mean"] = nlohmann::json::parse("[[1.0, 2.0], [3.0]]");
  expect_error(doc, {"mean"}, "ragged mean");
  doc = good;
  doc["log_var_first_moment"] = nlohmann::json::parse("[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]");
  expect_error(doc, {"log_var_first_moment"}, "mismatched shape");
  doc = good;
  doc["mean"][0][0] = std::numeric_limits<double>::quiet_NaN();
  expect_error(doc, {"mean"}, "NaN mean");
  doc = good;
  doc["mean_first_moment"][1][0] = "x";
  expect_error(doc, {"mean_first_moment"}, "non-numeric entry");
  doc = good;
  doc["iteration"] = -3;
  expect_error(doc, {"iteration"}, "negative iteration");
  doc = good;
  doc["seed"] = -1;
  expect_error(doc, {"seed"}, "negative seed");
}

// ----- Adam ascent ---------------------------------------------------------------------------------------------------

/// docs/mechanisms.md#variational-embedding-attention: three adam_ascent steps from a fresh state equal the scalar Adam
/// oracle entry by entry (rel 1e-14:
/// the same formula, possibly with different rounding of the bias corrections): the data gradient minus λ m and
/// λ ½(v − 1), separate moment pairs for m and log v, bias correction with τ = 1, 2, 3, and the clip of log v to
/// [−8, 2] (entries placed just inside each bound with a gradient pushing them out are clipped exactly to the bound).
/// Iteration advances by exactly 1 per step; family and seed are kept.
TEST(AttentionOptimizerStateTest, AdamAscentMatchesScalarReference) {
  Rng rng(testing::test_seed(36));
  const Index S = 3, D = 4;
  const double lr = 0.05, lambda = 0.7;
  Matrix mean = random_matrix(S, D, 1.0, rng);
  Matrix log_var = random_matrix(S, D, 0.5, rng);
  log_var(0, 0) = 1.99;   // pushed up by a large positive gradient: clipped to 2
  log_var(0, 1) = -7.97;  // pushed down by a large negative gradient: clipped to −8
  AttentionOptimizerState state = AttentionOptimizerState::fresh(kVea, mean, log_var, 4242);

  std::vector<ScalarAdam> ref_mean(static_cast<size_t>(S * D)), ref_log_var(static_cast<size_t>(S * D));
  for (Index k = 0; k < S * D; ++k) {
    ref_mean[static_cast<size_t>(k)] = {mean.data()[k], 0.0, 0.0};
    ref_log_var[static_cast<size_t>(k)] = {log_var.data()[k], 0.0, 0.0};
  }
  bool clipped_high = false, clipped_low = false;
  for (int64_t tau = 1; tau <= 3; ++tau) {
    Matrix grad_mean = random_matrix(S, D, 2.0, rng);
    Matrix grad_log_var = random_matrix(S, D, 2.0, rng);
    grad_log_var(0, 0) = 50.0;
    grad_log_var(0, 1) = -50.0;
    state = adam_ascent(state, ConstMatrixMap(grad_mean.data(), S, D), ConstMatrixMap(grad_log_var.data(), S, D), lr,
                        lambda);
    EXPECT_EQ(state.iteration, tau);
    EXPECT_EQ(state.seed, 4242u);
    EXPECT_EQ(state.family, kVea);
    for (Index k = 0; k < S * D; ++k) {
      ScalarAdam& rm = ref_mean[static_cast<size_t>(k)];
      ScalarAdam& rv = ref_log_var[static_cast<size_t>(k)];
      const double g_m = grad_mean.data()[k] - lambda * rm.theta;
      const double g_lv = grad_log_var.data()[k] - lambda * 0.5 * (std::exp(rv.theta) - 1.0);
      rm = scalar_adam_step(rm, g_m, lr, tau);
      rv = scalar_adam_step(rv, g_lv, lr, tau);
      const double unclipped = rv.theta;
      rv.theta = std::min(2.0, std::max(-8.0, rv.theta));
      if (unclipped > 2.0) clipped_high = true;
      if (unclipped < -8.0) clipped_low = true;
    }
    Matrix exp_mean(S, D), exp_log_var(S, D), exp_m1(S, D), exp_m2(S, D), exp_v1(S, D), exp_v2(S, D);
    for (Index k = 0; k < S * D; ++k) {
      const ScalarAdam& rm = ref_mean[static_cast<size_t>(k)];
      const ScalarAdam& rv = ref_log_var[static_cast<size_t>(k)];
      exp_mean.data()[k] = rm.theta;
      exp_m1.data()[k] = rm.m1;
      exp_m2.data()[k] = rm.m2;
      exp_log_var.data()[k] = rv.theta;
      exp_v1.data()[k] = rv.m1;
      exp_v2.data()[k] = rv.m2;
    }
    SCOPED_TRACE("tau " + std::to_string(tau));
    ExpectAllClose(state.mean, exp_mean, 1e-14, 1e-15);
    ExpectAllClose(state.log_var, exp_log_var, 1e-14, 1e-15);
    ExpectAllClose(state.mean_first_moment, exp_m1, 1e-14, 1e-15);
    ExpectAllClose(state.mean_second_moment, exp_m2, 1e-14, 1e-15);
    ExpectAllClose(state.log_var_first_moment, exp_v1, 1e-14, 1e-15);
    ExpectAllClose(state.log_var_second_moment, exp_v2, 1e-14, 1e-15);
    EXPECT_EQ(state.log_var(0, 0), 2.0);
    EXPECT_EQ(state.log_var(0, 1), -8.0);
  }
  EXPECT_TRUE(clipped_high);
  EXPECT_TRUE(clipped_low);
}

/// docs/mechanisms.md#variational-embedding-attention: the bias correction uses τ = iteration + 1 of the carried state:
/// one step from a state at iteration 7 with non-zero moments equals the scalar oracle with τ = 8 (and differs from τ =
/// 1); the input state is unchanged.
TEST(AttentionOptimizerStateTest, AdamAscentBiasCorrectionUsesCarriedIteration) {
  Rng rng(testing::test_seed(37));
  const Index S = 2, D = 3;
  const AttentionOptimizerState state = random_state(S, D, rng);
  const AttentionOptimizerState copy = state;
  const Matrix grad_mean = random_matrix(S, D, 1.0, rng);
  const Matrix grad_log_var = random_matrix(S, D, 1.0, rng);
  const double lr = 0.08, lambda = 0.0;
  const AttentionOptimizerState next = adam_ascent(state, ConstMatrixMap(grad_mean.data(), S, D),
                                                   ConstMatrixMap(grad_log_var.data(), S, D), lr, lambda);
  ExpectSameState(state, copy);
  EXPECT_EQ(next.iteration, 8);
  Matrix exp_mean(S, D), exp_tau1(S, D);
  for (Index k = 0; k < S * D; ++k) {
    const ScalarAdam start{state.mean.data()[k], state.mean_first_moment.data()[k], state.mean_second_moment.data()[k]};
    exp_mean.data()[k] = scalar_adam_step(start, grad_mean.data()[k], lr, 8).theta;
    exp_tau1.data()[k] = scalar_adam_step(start, grad_mean.data()[k], lr, 1).theta;
  }
  ExpectAllClose(next.mean, exp_mean, 1e-14, 1e-15);
  EXPECT_GT((next.mean - exp_tau1).cwiseAbs().maxCoeff(), 1e-6);
}

// ----- KL ------------------------------------------------------------------------------------------------------------

/// docs/mechanisms.md#variational-embedding-attention: kl_to_standard_normal equals ½ Σ (v + m² − 1 − log v) (zero at m
/// = 0, log v = 0; ½(e − 1) at m = 1, log v = 1), and its central finite differences (h = 1e-5) equal the analytic
/// gradients ∂KL/∂m = m and ∂KL/∂log v = ½(v − 1) to 1e-6 relative (|fd − g| ≤ 1e-6·max(1, |g|)).
TEST(AttentionOptimizerStateTest, KlGradientMatchesFiniteDifferences) {
  EXPECT_EQ(kl_to_standard_normal(Matrix::Zero(3, 2), Matrix::Zero(3, 2)), 0.0);
  EXPECT_NEAR(kl_to_standard_normal(Matrix::Constant(1, 1, 1.0), Matrix::Constant(1, 1, 1.0)),
              0.5 * (std::exp(1.0) + 1.0 - 1.0 - 1.0), 1e-15);

  Rng rng(testing::test_seed(38));
  const Index S = 3, D = 4;
  const Matrix mean = random_matrix(S, D, 1.5, rng);
  const Matrix log_var = random_matrix(S, D, 1.0, rng);
  const double h = 1e-5;
  for (Index k = 0; k < S * D; ++k) {
    Matrix plus = mean, minus = mean;
    plus.data()[k] += h;
    minus.data()[k] -= h;
    const double fd_m = (kl_to_standard_normal(plus, log_var) - kl_to_standard_normal(minus, log_var)) / (2.0 * h);
    const double g_m = mean.data()[k];
    EXPECT_LE(std::fabs(fd_m - g_m), 1e-6 * std::max(1.0, std::fabs(g_m))) << "mean entry " << k;

    Matrix lv_plus = log_var, lv_minus = log_var;
    lv_plus.data()[k] += h;
    lv_minus.data()[k] -= h;
    const double fd_lv = (kl_to_standard_normal(mean, lv_plus) - kl_to_standard_normal(mean, lv_minus)) / (2.0 * h);
    const double g_lv = 0.5 * (std::exp(log_var.data()[k]) - 1.0);
    EXPECT_LE(std::fabs(fd_lv - g_lv), 1e-6 * std::max(1.0, std::fabs(g_lv))) << "log_var entry " << k;
  }
}

// ----- Monte-Carlo tables -------------------------------------------------------------------------------------------

/// docs/mechanisms.md#variational-embedding-attention: the tables of iteration τ are ε_k ~ N(0, 1)^{S×D} drawn
/// row-major, k in order, from Rng(derive_seed(seed, kMcNoise, τ)); E_k = m + exp(½ log v) ⊙ ε_k and the log-variance
/// factor is ½ exp(½ log v) ⊙ ε_k (rel 1e-15). The mc = 3 tables are the first 3 of mc = 5 bit for bit.
TEST(AttentionOptimizerStateTest, MonteCarloTablesFollowTheDocumentedStreamAndArePrefixes) {
  Rng rng(testing::test_seed(39));
  const Index S = 4, D = 3;
  const AttentionOptimizerState state = random_state(S, D, rng);
  const MonteCarloTables five = monte_carlo_tables(state, 5);
  const MonteCarloTables three = monte_carlo_tables(state, 3);
  ASSERT_EQ(five.noise.size(), 5u);
  ASSERT_EQ(five.embeddings.size(), 5u);
  ASSERT_EQ(five.log_var_factor.size(), 5u);
  ASSERT_EQ(three.noise.size(), 3u);
  Rng oracle(derive_seed(state.seed, SeedPurpose::kMcNoise, static_cast<uint64_t>(state.iteration)));
  const Matrix s_std = (0.5 * state.log_var.array()).exp().matrix();
  for (size_t k = 0; k < 5; ++k) {
    Matrix eps(S, D);
    for (Index e = 0; e < eps.size(); ++e) eps.data()[e] = oracle.normal();
    SCOPED_TRACE("table " + std::to_string(k));
    EXPECT_TRUE(same_bits(five.noise[k], eps));
    ExpectAllClose(five.embeddings[k], state.mean + s_std.cwiseProduct(eps), 1e-15, 1e-15);
    ExpectAllClose(five.log_var_factor[k], 0.5 * s_std.cwiseProduct(eps), 1e-15, 1e-15);
    if (k < 3) {
      EXPECT_TRUE(same_bits(three.noise[k], five.noise[k]));
      EXPECT_TRUE(same_bits(three.embeddings[k], five.embeddings[k]));
      EXPECT_TRUE(same_bits(three.log_var_factor[k], five.log_var_factor[k]));
    }
  }
  // The cache hands out the same tables.
  const MonteCarloCache cache;
  const auto cached = cache.get(state, 5);
  ASSERT_EQ(cached->noise.size(), 5u);
  for (size_t k = 0; k < 5; ++k) EXPECT_TRUE(same_bits(cached->embeddings[k], five.embeddings[k]));
  EXPECT_EQ(cache.get(state, 5).get(), cached.get());
}

/// docs/mechanisms.md#variational-embedding-attention / docs/porting.md: the noise depends on (seed, iteration) only:
/// other moments, means, log variances or family give the same ε; another seed or another iteration gives different ε.
TEST(AttentionOptimizerStateTest, MonteCarloNoiseDependsOnlyOnSeedAndIteration) {
  Rng rng(testing::test_seed(40));
  const Index S = 3, D = 2;
  const AttentionOptimizerState state = random_state(S, D, rng);
  const MonteCarloTables base = monte_carlo_tables(state, 2);

  AttentionOptimizerState other = random_state(S, D, rng);  // every array different
  other.seed = state.seed;
  other.iteration = state.iteration;
  other.family = kVmha;
  const MonteCarloTables same_noise = monte_carlo_tables(other, 2);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_TRUE(same_bits(same_noise.noise[k], base.noise[k]));
    EXPECT_FALSE(same_bits(same_noise.embeddings[k], base.embeddings[k]));
  }
  AttentionOptimizerState reseeded = state;
  reseeded.seed += 1;
  AttentionOptimizerState later = state;
  later.iteration += 1;
  for (const AttentionOptimizerState* changed : {&reseeded, &later}) {
    const MonteCarloTables t = monte_carlo_tables(*changed, 2);
    for (size_t k = 0; k < 2; ++k) EXPECT_FALSE(same_bits(t.noise[k], base.noise[k]));
  }
}

}  // namespace
}  // namespace attnmix
