// SPDX-License-Identifier: Apache-2.0
// Variational embedding attention's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/family/spec.hpp"
#include "variational_codec_impl.hpp"

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

}  // namespace

const FamilySpec& variational_embedding_attention_family() {
  static const FamilySpec spec{"variational", {"vea"}, Model::kFamily,
                               {&params_to_json, &name_of, &from_json, &state_to_json}};
  return spec;
}

}  // namespace attnmix
