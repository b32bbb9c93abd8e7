// SPDX-License-Identifier: Apache-2.0
// Responsibility attention's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/family/spec.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

// params: key_means [S, D], emission [S, T], position_prior [N], sigma2.
json params_to_json(const AnyDistribution& model) {
  const ResponsibilityAttentionParams& p = model.get_if<ResponsibilityAttention>()->params();
  return json{{"key_means", matrix_to_json(p.key_means)},
              {"emission", matrix_to_json(p.emission)},
              {"position_prior", vector_to_json(p.position_prior)},
              {"sigma2", p.sigma2}};
}

std::string name_of(const AnyDistribution& model) { return model.get_if<ResponsibilityAttention>()->params().name; }

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* /*state*/) {
  constexpr std::array<std::string_view, 4> kRequired{"key_means", "emission", "position_prior", "sigma2"};
  params.expect_object(kRequired, {});
  ResponsibilityAttentionParams p;
  p.key_means = params["key_means"].as_matrix();
  p.emission = params["emission"].as_matrix();
  p.position_prior = params["position_prior"].as_vector();
  p.sigma2 = params["sigma2"].as_double();
  p.name = name;
  return params.construct(ResponsibilityAttention::kWhere,
                          [&] { return AnyDistribution(ResponsibilityAttention(std::move(p))); });
}

}  // namespace

const FamilySpec& responsibility_attention_family() {
  static const FamilySpec spec{"responsibility", {"ra"}, ResponsibilityAttention::kFamily,
                               {&params_to_json, &name_of, &from_json}};
  return spec;
}

}  // namespace attnmix
