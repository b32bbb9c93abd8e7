// SPDX-License-Identifier: Apache-2.0
// The optimizer state of the variational families, its JSON form, the Adam ascent step, the KL term and the
// Monte-Carlo noise tables (docs/mechanisms.md#variational-embedding-attention).
#include "attnmix/attention/optimizer_state.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/json.hpp"
#include "attnmix/core/rng.hpp"

namespace attnmix {

namespace {
constexpr std::array<const char*, 2> kFamilies{"variational_embedding_attention", "variational_multihop_attention"};
constexpr double kBeta1 = 0.9;
constexpr double kBeta2 = 0.999;
constexpr double kAdamEps = 1e-8;
constexpr double kLogVarMin = -8.0;
constexpr double kLogVarMax = 2.0;

bool bitwise_equal(const Matrix& a, const Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * static_cast<size_t>(a.size())) == 0;
}

/// The six arrays with their field names, in file order.
template <class State>
auto named_arrays(State& s) {
  return std::array<std::pair<const char*, decltype(&s.mean)>, 6>{{{"mean", &s.mean},
                                                                   {"log_var", &s.log_var},
                                                                   {"mean_first_moment", &s.mean_first_moment},
                                                                   {"mean_second_moment", &s.mean_second_moment},
                                                                   {"log_var_first_moment", &s.log_var_first_moment},
                                                                   {"log_var_second_moment", &s.log_var_second_moment}}};
}
}  // namespace

AttentionOptimizerState AttentionOptimizerState::fresh(std::string family, Matrix mean, Matrix log_var, uint64_t seed) {
  AttentionOptimizerState s;
  s.family = std::move(family);
  s.mean_first_moment = Matrix::Zero(mean.rows(), mean.cols());
  s.mean_second_moment = s.mean_first_moment;
  s.log_var_first_moment = Matrix::Zero(log_var.rows(), log_var.cols());
  s.log_var_second_moment = s.log_var_first_moment;
  s.mean = std::move(mean);
  s.log_var = std::move(log_var);
  s.seed = seed;
  return s;
}

void AttentionOptimizerState::validate(std::string_view where) const {
  const std::string w(where);
  if (std::find_if(kFamilies.begin(), kFamilies.end(), [&](const char* f) { return family == f; }) == kFamilies.end())
    throw ValueError(w + ": optimizer_state.family must be variational_embedding_attention or "
                         "variational_multihop_attention (got '" + family + "')");
  for (const auto& [name, array] : named_arrays(*this)) {
    if (array->size() == 0)
      throw ValueError(w + ": optimizer_state." + name + " must be a non-empty 2-D array");
    if (array->rows() != mean.rows() || array->cols() != mean.cols())
      throw ValueError(w + ": optimizer_state." + name + " must have the shape of mean (" +
                       std::to_string(mean.rows()) + "x" + std::to_string(mean.cols()) + ", got " +
                       std::to_string(array->rows()) + "x" + std::to_string(array->cols()) + ")");
    if (!array->allFinite()) throw ValueError(w + ": optimizer_state." + name + " must be finite");
  }
  if ((mean_second_moment.array() < 0.0).any() || (log_var_second_moment.array() < 0.0).any())
    throw ValueError(w + ": optimizer_state second moments must be >= 0");
  if (iteration < 0)
    throw ValueError(w + ": optimizer_state.iteration must be >= 0 (got " + std::to_string(iteration) + ")");
}

bool AttentionOptimizerState::operator==(const AttentionOptimizerState& o) const {
  return family == o.family && iteration == o.iteration && seed == o.seed && bitwise_equal(mean, o.mean) &&
         bitwise_equal(log_var, o.log_var) && bitwise_equal(mean_first_moment, o.mean_first_moment) &&
         bitwise_equal(mean_second_moment, o.mean_second_moment) &&
         bitwise_equal(log_var_first_moment, o.log_var_first_moment) &&
         bitwise_equal(log_var_second_moment, o.log_var_second_moment);
}

AttentionOptimizerState resolve_optimizer_state(std::string_view where, std::string_view family, const Matrix& mean,
                                                const Matrix& log_var,
                                                std::optional<AttentionOptimizerState> supplied) {
  const std::string w(where);
  check::bounded_reals(where, "mean", {mean.data(), static_cast<size_t>(mean.size())});
  check::log_variances(where, "log_var", {log_var.data(), static_cast<size_t>(log_var.size())});
  if (log_var.rows() != mean.rows() || log_var.cols() != mean.cols())
    throw ValueError(w + ": log_var must have the shape of mean (" + std::to_string(mean.rows()) + "x" +
                     std::to_string(mean.cols()) + ", got " + std::to_string(log_var.rows()) + "x" +
                     std::to_string(log_var.cols()) + ")");
  if (!supplied) return AttentionOptimizerState::fresh(std::string(family), mean, log_var, 0);
  supplied->validate(where);
  if (supplied->family != family)
    throw ValueError(w + ": optimizer_state belongs to family '" + supplied->family + "', not " + std::string(family));
  if (!bitwise_equal(supplied->mean, mean) || !bitwise_equal(supplied->log_var, log_var))
    throw ValueError(w + ": optimizer_state.mean and optimizer_state.log_var must equal mean and log_var bit for bit");
  return std::move(*supplied);
}

nlohmann::json optimizer_state_to_json(const AttentionOptimizerState& state) {
  nlohmann::json doc{{"schema_version", AttentionOptimizerState::kSchemaVersion},
                     {"algorithm", AttentionOptimizerState::kAlgorithm},
                     {"family", state.family}};
  for (const auto& [name, array] : named_arrays(state)) doc[name] = matrix_to_json(*array);
  doc["iteration"] = state.iteration;
  doc["seed"] = state.seed;
  return doc;
}

AttentionOptimizerState optimizer_state_from_json(const ModelJsonField& field) {
  static constexpr std::array<std::string_view, 11> kRequired{
      "schema_version",     "algorithm",           "family",       "mean", "log_var", "mean_first_moment",
      "mean_second_moment", "log_var_first_moment", "log_var_second_moment", "iteration", "seed"};
  field.expect_object(kRequired, {});
  if (field["schema_version"].as_int() != AttentionOptimizerState::kSchemaVersion)
    field["schema_version"].fail("unsupported optimizer state schema_version (this build reads 1)");
  if (field["algorithm"].as_string() != AttentionOptimizerState::kAlgorithm)
    field["algorithm"].fail("unsupported optimizer algorithm '" + field["algorithm"].as_string() +
                            "' (this build reads 'adam')");
  AttentionOptimizerState s;
  s.family = field["family"].as_string();
  for (const auto& [name, array] : named_arrays(s)) *array = field[name].as_matrix();
  s.iteration = field["iteration"].as_int();
  const ModelJsonField seed = field["seed"];
  if (seed.value().is_number_unsigned()) {
    s.seed = seed.value().get<uint64_t>();
  } else {
    const int64_t v = seed.as_int();
    if (v < 0) seed.fail("must be a non-negative integer");
    s.seed = static_cast<uint64_t>(v);
  }
  try {
    s.validate(AttentionOptimizerState::kWhere);
  } catch (const ValueError& e) {
    // "AttentionOptimizerState: optimizer_state.family must be …" → "<source>: <this field's path>.family must be …"
    std::string message = e.what();
    const std::string prefix = std::string(AttentionOptimizerState::kWhere) + ": optimizer_state";
    if (message.starts_with(prefix) && !field.path().empty())
      message = field.path() + message.substr(prefix.size());
    else if (message.starts_with(prefix))
      message = message.substr(prefix.size() - std::string("optimizer_state").size());
    throw ValueError(field.source() + ": " + message);
  }
  return s;
}

AttentionOptimizerState optimizer_state_from_json(const nlohmann::json& doc, std::string_view where) {
  return optimizer_state_from_json(ModelJsonField(doc, std::string(where), ""));
}

double kl_to_standard_normal(const Matrix& mean, const Matrix& log_var) {
  double total = 0.0;
  for (Index k = 0; k < mean.size(); ++k) {
    const double lv = log_var.data()[k];
    const double m = mean.data()[k];
    total += std::exp(lv) + m * m - 1.0 - lv;
  }
  return 0.5 * total;
}

AttentionOptimizerState adam_ascent(const AttentionOptimizerState& state, const ConstMatrixMap& grad_mean,
                                    const ConstMatrixMap& grad_log_var, double lr, double prior_weight) {
  AttentionOptimizerState next = state;
  next.iteration = state.iteration + 1;
  const double tau = static_cast<double>(next.iteration);
  const double correction1 = 1.0 - std::pow(kBeta1, tau);
  const double correction2 = 1.0 - std::pow(kBeta2, tau);
  const auto step = [&](double& theta, double g, double& m1, double& m2) {
    m1 = kBeta1 * m1 + (1.0 - kBeta1) * g;
    m2 = kBeta2 * m2 + (1.0 - kBeta2) * g * g;
    theta += lr * (m1 / correction1) / (std::sqrt(m2 / correction2) + kAdamEps);
  };
  for (Index k = 0; k < state.mean.size(); ++k) {
    const double m = state.mean.data()[k];
    const double lv = state.log_var.data()[k];
    const double g_m = grad_mean.data()[k] - prior_weight * m;
    const double g_lv = grad_log_var.data()[k] - prior_weight * 0.5 * (std::exp(lv) - 1.0);
    step(next.mean.data()[k], g_m, next.mean_first_moment.data()[k], next.mean_second_moment.data()[k]);
    step(next.log_var.data()[k], g_lv, next.log_var_first_moment.data()[k], next.log_var_second_moment.data()[k]);
    next.log_var.data()[k] = std::clamp(next.log_var.data()[k], kLogVarMin, kLogVarMax);
  }
  return next;
}

MonteCarloTables monte_carlo_tables(const AttentionOptimizerState& state, int64_t mc) {
  Rng rng(derive_seed(state.seed, SeedPurpose::kMcNoise, static_cast<uint64_t>(state.iteration)));
  const Matrix scale = (0.5 * state.log_var.array()).exp().matrix();
  MonteCarloTables t;
  for (int64_t k = 0; k < mc; ++k) {
    Matrix eps(state.mean.rows(), state.mean.cols());
    for (Index e = 0; e < eps.size(); ++e) eps.data()[e] = rng.normal();
    t.embeddings.push_back(state.mean + scale.cwiseProduct(eps));
    t.log_var_factor.push_back(0.5 * scale.cwiseProduct(eps));
    t.noise.push_back(std::move(eps));
  }
  return t;
}

std::shared_ptr<const MonteCarloTables> MonteCarloCache::get(const AttentionOptimizerState& state, int64_t mc) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  auto& slot = by_mc_[mc];
  if (!slot) slot = std::make_shared<const MonteCarloTables>(monte_carlo_tables(state, mc));
  return slot;
}

void AttachedOptimizerState::merge(const AttachedOptimizerState& other, AttachmentMerge how, std::string_view where) {
  if (how == AttachmentMerge::kReplace) {
    state_ = other.state_;
    return;
  }
  const bool same = state_ == other.state_ || (state_ && other.state_ && *state_ == *other.state_);
  if (same) return;
  if (how == AttachmentMerge::kAdopt && !state_) {
    state_ = other.state_;
    return;
  }
  if (how == AttachmentMerge::kAdopt && !other.state_) return;
  throw ValueError(std::string(where) + ": cannot combine attention statistics from different optimizer states");
}

}  // namespace attnmix
