// SPDX-License-Identifier: Apache-2.0
// Variational embedding attention's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/family/spec.hpp"
#include "../family_impl.hpp"
#include "../variational/family_impl.hpp"

namespace attnmix {

namespace {

using nlohmann::json;
using Model = VariationalEmbeddingAttention;

// params: mean [S, D], log_var [S, D], emission [S, T], position_prior [N], sigma2; optimizer_state beside them.
json params_to_json(const AnyDistribution& model) {
  const VariationalEmbeddingAttentionParams& p = model.get_if<Model>()->params();
  return json{{"mean", table_to_json(p.mean)},
              {"log_var", table_to_json(p.log_var)},
              {"emission", table_to_json(p.emission)},
              {"position_prior", vector_to_json(p.position_prior)},
              {"sigma2", p.sigma2}};
}

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* state) {
  constexpr std::array<std::string_view, 5> kRequired{"mean", "log_var", "emission", "position_prior", "sigma2"};
  params.expect_object(kRequired, {});
  VariationalEmbeddingAttentionParams p;
  p.mean = params["mean"].as_matrix();
  p.log_var = params["log_var"].as_matrix();
  p.emission = params["emission"].as_matrix();
  p.position_prior = params["position_prior"].as_vector();
  p.sigma2 = params["sigma2"].as_double();
  p.name = name;
  p.optimizer_state = detail::state_from_json(state);
  return detail::construct_variational(params, state, Model::kWhere,
                                       [&] { return AnyDistribution(Model(std::move(p))); });
}

// Data files: {"context": [ids < S] (N), "query": id < S, "target": id < T}.
const RowSchema kRows{{{.name = "context", .kind = DataKind::kIds, .width = "N", .bound = "S", .noun = "context"},
                       {.name = "query", .kind = DataKind::kIds, .bound = "S", .noun = "query"},
                       {.name = "target", .kind = DataKind::kIds, .bound = "T", .noun = "target", .target = true}}};

DataOf data_files_of(const AnyDistribution& model) {
  const auto& m = *model.get_if<Model>();
  const std::string from = "the model";
  return {&variational_embedding_attention_family(),
          {{"S", {m.n_symbols(), from}}, {"N", {m.context_length(), from}}, {"T", {m.n_targets(), from}}}};
}

AnyBatch encode(Rows rows, const Dims& dims) {
  VariationalEmbeddingAttentionEncoder encoder;
  encoder.n_symbols = dims.at("S").value;
  encoder.context_length = dims.at("N").value;
  encoder.n_targets = dims.at("T").value;
  return AnyBatch(encoder.encode(std::move(rows.columns[0].ids), id_vector(rows.columns[1]),
                                 id_vector(rows.columns[2])));
}

Rows rows_of(const AnyBatch& any) {
  const auto& batch = any.get<VariationalEmbeddingAttentionBatch>("variational embedding attention rows");
  Rows rows;
  rows.columns = {{batch.contexts(), {}}, {batch.queries(), {}}, {batch.targets(), {}}};
  return rows;
}

AnyBatch sample(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> width) {
  const auto& vea = *model.get_if<Model>();
  if (width && *width != vea.context_length())
    throw ValueError("variational embedding attention has a fixed context length, N = " +
                     std::to_string(vea.context_length()) + " for this model (got " + std::to_string(*width) + ")");
  return AnyBatch(vea.sampler(seed).sample(m));
}

// Fits.
using Options = VariationalEmbeddingAttentionEstimatorOptions;

const OptionTable<Options>& options() {
  static const auto table = detail::with_precision(detail::with_adam(detail::with_gate(OptionTable<Options>())));
  return table;
}

Dims model_sizes(const AnyDistribution& model) {
  const auto& m = *model.get_if<Model>();
  return detail::sizes({{"S", m.n_symbols()}, {"N", m.context_length()}, {"D", m.embed_dim()}, {"T", m.n_targets()}});
}

// The seed of a fresh initialisation, or the saved model's noise seed: the fit continues its Adam trajectory.
AnyEstimator make_estimator(const EstimatorSettings& s, const AnyDistribution* init) {
  Options o = detail::estimator_options(options(), s, VariationalEmbeddingAttentionEstimator::kWhere);
  o.seed = init ? init->get_if<Model>()->optimizer_state().seed : s.seed;
  return AnyEstimator(VariationalEmbeddingAttentionEstimator(s.sizes.at("S").value, s.sizes.at("N").value,
                                                             s.sizes.at("D").value, s.sizes.at("T").value, std::move(o)));
}

EstimatorSettings accumulator_settings(const AnyAccumulator& accumulator) {
  const auto& a = *accumulator.get_if<VariationalEmbeddingAttentionAccumulator>();
  return detail::accumulator_settings(
      detail::sizes({{"S", a.n_symbols()}, {"N", a.context_length()}, {"D", a.embed_dim()}, {"T", a.n_targets()}}),
      a.keys(), {{"mc", a.mc()}});
}

EstimatorSettings settings_of(const AnyEstimator& estimator) {
  const auto& e = *estimator.get_if<VariationalEmbeddingAttentionEstimator>();
  return detail::estimator_settings(
      detail::sizes({{"S", e.n_symbols()}, {"N", e.context_length()}, {"D", e.embed_dim()}, {"T", e.n_targets()}}),
      options(), e.options(), e.options().seed);
}

std::optional<AnyDistribution> initial(const AnyDistribution& init, const OptionValues& values) {
  const auto& m = *init.get_if<Model>();
  const Precision precision = options().apply(values, VariationalEmbeddingAttentionEstimator::kWhere).precision;
  if (precision == m.precision()) return std::nullopt;
  return AnyDistribution(Model(m.params(), precision));
}

}  // namespace

const FamilySpec& variational_embedding_attention_family() {
  static const FamilySpec spec{.name = "variational",
                               .aliases = {"vea"},
                               .title = "variational embedding attention",
                               .file_family = Model::kFamily,
                               .codec = {&params_to_json, &params_name<Model>, &from_json, &detail::state_to_json<Model>},
                               .schema = &kRows,
                               .data_of = &data_files_of,
                               .encode = &encode,
                               .rows_of = &rows_of,
                               .sample = &sample,
                               .fit = {.sizes = {detail::kSymbols, detail::kContext, detail::kEmbedding, detail::kTargets},
                                       .options = options().specs(),
                                       .stochastic = true,
                                       .model_sizes = &model_sizes,
                                       .model_options = &detail::stored_sigma2<Model>,
                                       .make_estimator = &make_estimator,
                                       .settings_of = &settings_of,
                                       .accumulator_settings = &accumulator_settings,
                                       .initial = &initial,
                                       .resume_note = &detail::adam_resume_note<Model>}};
  return spec;
}

}  // namespace attnmix
