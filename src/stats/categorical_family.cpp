// SPDX-License-Identifier: Apache-2.0
// The categorical distribution's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/family/spec.hpp"
#include "attnmix/stats/categorical.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

// params: p [K].
json params_to_json(const AnyDistribution& model) {
  return json{{"p", vector_to_json(model.get_if<Categorical>()->params().p)}};
}

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* /*state*/) {
  constexpr std::array<std::string_view, 1> kRequired{"p"};
  params.expect_object(kRequired, {});
  CategoricalParams p{params["p"].as_vector(), name};
  return params.construct(Categorical::kWhere, [&] { return AnyDistribution(Categorical(std::move(p))); });
}

}  // namespace

const FamilySpec& categorical_family() {
  static const FamilySpec spec{.name = "categorical",
                               .title = "categorical distribution",
                               .file_family = Categorical::kFamily,
                               .codec = {&params_to_json, &params_name<Categorical>, &from_json}};
  return spec;
}

}  // namespace attnmix
