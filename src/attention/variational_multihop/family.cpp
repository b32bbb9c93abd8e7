// SPDX-License-Identifier: Apache-2.0
// Variational multi-hop attention's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/family/spec.hpp"
#include "../family_impl.hpp"
#include "../variational/family_impl.hpp"

namespace attnmix {

namespace {

using nlohmann::json;
using Model = VariationalMultiHopAttention;

// params: mean [S, D], log_var [S, D], emission [S, T], sigma2; optimizer_state beside them.
json params_to_json(const AnyDistribution& model) {
  const VariationalMultiHopAttentionParams& p = model.get_if<Model>()->params();
  return json{{"mean", table_to_json(p.mean)},
              {"log_var", table_to_json(p.log_var)},
              {"emission", table_to_json(p.emission)},
              {"sigma2", p.sigma2}};
}

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* state) {
  constexpr std::array<std::string_view, 4> kRequired{"mean", "log_var", "emission", "sigma2"};
  params.expect_object(kRequired, {});
  VariationalMultiHopAttentionParams p;
  p.mean = params["mean"].as_matrix();
  p.log_var = params["log_var"].as_matrix();
  p.emission = params["emission"].as_matrix();
  p.sigma2 = params["sigma2"].as_double();
  p.name = name;
  p.optimizer_state = detail::state_from_json(state);
  return detail::construct_variational(params, state, Model::kWhere,
                                       [&] { return AnyDistribution(Model(std::move(p))); });
}

// It reads chained attention's rows, of any context length N.
DataOf data_files_of(const AnyDistribution& model) {
  const auto& m = *model.get_if<Model>();
  return {&variational_multihop_attention_family(),
          {{"S", {m.n_symbols(), "the model"}}, {"T", {m.n_targets(), "the model"}}}};
}

AnyBatch sample(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> width) {
  const auto& vmha = *model.get_if<Model>();
  return AnyBatch(width ? vmha.sampler(seed, *width).sample(m) : vmha.sampler(seed).sample(m));
}

// Fits.
using Options = VariationalMultiHopAttentionEstimatorOptions;

const OptionTable<Options>& options() {
  static const auto table = detail::with_adam(detail::with_gate(OptionTable<Options>()))
                                .add("anneal_iters", &Options::anneal_iters,
                                     "Adam steps over which the KL weight rises linearly to {prior_strength}",
                                     OptionCheck::kPositive);
  return table;
}

// A multi-hop model fixes S, D and T, not the context length N (as chained attention).
Dims model_sizes(const AnyDistribution& model) {
  const auto& m = *model.get_if<Model>();
  return detail::sizes({{"S", m.n_symbols()}, {"D", m.embed_dim()}, {"T", m.n_targets()}});
}

// The seed of a fresh initialisation, or the saved model's noise seed: the fit continues its Adam trajectory.
AnyEstimator make_estimator(const EstimatorSettings& s, const AnyDistribution* init) {
  Options o = detail::estimator_options(options(), s, VariationalMultiHopAttentionEstimator::kWhere);
  o.seed = init ? init->get_if<Model>()->optimizer_state().seed : s.seed;
  return AnyEstimator(VariationalMultiHopAttentionEstimator(s.sizes.at("S").value, s.sizes.at("D").value,
                                                            s.sizes.at("T").value, std::move(o)));
}

EstimatorSettings accumulator_settings(const AnyAccumulator& accumulator) {
  const auto& a = *accumulator.get_if<VariationalMultiHopAttentionAccumulator>();
  return detail::accumulator_settings(detail::sizes({{"S", a.n_symbols()}, {"D", a.embed_dim()}, {"T", a.n_targets()}}),
                                      a.keys(), {{"mc", a.mc()}});
}

EstimatorSettings settings_of(const AnyEstimator& estimator) {
  const auto& e = *estimator.get_if<VariationalMultiHopAttentionEstimator>();
  return detail::estimator_settings(detail::sizes({{"S", e.n_symbols()}, {"D", e.embed_dim()}, {"T", e.n_targets()}}),
                                    options(), e.options(), e.options().seed);
}

std::string mechanism(const Dims& /*dims*/) { return "variational multi-hop attention (2 hops)"; }

}  // namespace

const FamilySpec& variational_multihop_attention_family() {
  const FamilySpec& chained = chained_attention_family();
  static const FamilySpec spec{.name = "variational-multihop",
                               .aliases = {"vmha"},
                               .title = "variational multi-hop attention",
                               .file_family = Model::kFamily,
                               .codec = {&params_to_json, &params_name<Model>, &from_json, &detail::state_to_json<Model>},
                               .schema = chained.schema,
                               .data_of = &data_files_of,
                               .encode = chained.encode,
                               .rows_of = chained.rows_of,
                               .sample = &sample,
                               .fit = {.sizes = {detail::kSymbols, detail::kOpenContext, detail::kEmbedding, detail::kTargets},
                                       .options = options().specs(),
                                       .stochastic = true,
                                       .model_sizes = &model_sizes,
                                       .model_options = &detail::stored_sigma2<Model>,
                                       .make_estimator = &make_estimator,
                                       .settings_of = &settings_of,
                                       .accumulator_settings = &accumulator_settings,
                                       .mechanism = &mechanism,
                                       .resume_note = &detail::adam_resume_note<Model>}};
  return spec;
}

}  // namespace attnmix
