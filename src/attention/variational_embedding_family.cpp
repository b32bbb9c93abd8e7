// SPDX-License-Identifier: Apache-2.0
// Variational embedding attention's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/core/precision.hpp"
#include "attnmix/family/spec.hpp"
#include "sizes_impl.hpp"
#include "variational_family_impl.hpp"

namespace attnmix {

namespace {

using nlohmann::json;
using Model = VariationalEmbeddingAttention;

// params: mean [S, D], log_var [S, D], emission [S, T], position_prior [N], sigma2; optimizer_state beside them.
json params_to_json(const AnyDistribution& model) {
  const VariationalEmbeddingAttentionParams& p = model.get_if<Model>()->params();
  return json{{"mean", matrix_to_json(p.mean)},
              {"log_var", matrix_to_json(p.log_var)},
              {"emission", matrix_to_json(p.emission)},
              {"position_prior", vector_to_json(p.position_prior)},
              {"sigma2", p.sigma2}};
}

std::string name_of(const AnyDistribution& model) { return model.get_if<Model>()->params().name; }

json state_to_json(const AnyDistribution& model) {
  return optimizer_state_to_json(model.get_if<Model>()->optimizer_state());
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
  static const auto table =
      OptionTable<Options>()
          .add("sigma2", &Options::sigma2, "gate variance sigma^2", OptionCheck::kPositive, /*from_model=*/true)
          .add("emission_smoothing", &Options::emission_smoothing, "pseudo-count added to every emission count",
               OptionCheck::kNonNegative)
          .add("lr", &Options::lr, "Adam step size of the embedding update", OptionCheck::kPositive)
          .add("mc", &Options::mc, "Monte-Carlo samples of the embeddings per E-step", OptionCheck::kPositive)
          .add("prior_strength", &Options::prior_strength, "weight of the KL term to the N(0, I) embedding prior",
               OptionCheck::kNonNegative)
          .add_choice("precision", &Options::precision,
                      "arithmetic of the E-step: float64, or mixed (distances, gate logits and their exponentials in "
                      "float, every sum and the M-step in double; the log-likelihood agrees with float64 to about 8 "
                      "digits; docs/mixed_precision.md)",
                      {"float64", "mixed"}, &precision_name, &parse_precision);
  return table;
}

Dims model_sizes(const AnyDistribution& model) {
  const auto& m = *model.get_if<Model>();
  return {{"S", {m.n_symbols(), ""}}, {"N", {m.context_length(), ""}}, {"D", {m.embed_dim(), ""}},
          {"T", {m.n_targets(), ""}}};
}

OptionValues model_options(const AnyDistribution& model) { return {{"sigma2", model.get_if<Model>()->sigma2()}}; }

// The seed of a fresh initialisation, or the saved model's noise seed: the fit continues its Adam trajectory.
AnyEstimator make_estimator(const EstimatorSettings& s, const AnyDistribution* init) {
  Options o = options().apply(s.options, VariationalEmbeddingAttentionEstimator::kWhere);
  o.seed = init ? init->get_if<Model>()->optimizer_state().seed : s.seed;
  o.name = s.name;
  o.keys = s.keys;
  return AnyEstimator(VariationalEmbeddingAttentionEstimator(s.sizes.at("S").value, s.sizes.at("N").value,
                                                             s.sizes.at("D").value, s.sizes.at("T").value, std::move(o)));
}

EstimatorSettings settings_of(const AnyEstimator& estimator) {
  const auto& e = *estimator.get_if<VariationalEmbeddingAttentionEstimator>();
  return {{{"S", {e.n_symbols(), ""}}, {"N", {e.context_length(), ""}}, {"D", {e.embed_dim(), ""}},
           {"T", {e.n_targets(), ""}}},
          options().values(e.options()), e.options().seed, e.options().name, e.options().keys};
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
                               .codec = {&params_to_json, &name_of, &from_json, &state_to_json},
                               .schema = &kRows,
                               .data_of = &data_files_of,
                               .encode = &encode,
                               .rows_of = &rows_of,
                               .sample = &sample,
                               .fit = {.sizes = {detail::kSymbols, detail::kContext, detail::kEmbedding, detail::kTargets},
                                       .options = options().specs(),
                                       .stochastic = true,
                                       .model_sizes = &model_sizes,
                                       .model_options = &model_options,
                                       .make_estimator = &make_estimator,
                                       .settings_of = &settings_of,
                                       .initial = &initial,
                                       .resume_note = &detail::adam_resume_note<Model>}};
  return spec;
}

}  // namespace attnmix
