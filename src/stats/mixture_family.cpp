// SPDX-License-Identifier: Apache-2.0
// The mixture's family descriptor (family/spec.hpp): its components are stored as model objects without "format",
// so a mixture of any registered family is saved without extra code.
#include <array>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/family/spec.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/stats/mixture.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

// params: w [K], components (model objects).
json params_to_json(const AnyDistribution& model) {
  const Mixture& m = *model.get_if<Mixture>();
  json components = json::array();
  for (const AnyDistribution& c : m.components()) components.push_back(model_object_to_json(c));
  return json{{"w", vector_to_json(m.weights())}, {"components", std::move(components)}};
}

std::string name_of(const AnyDistribution& model) { return model.get_if<Mixture>()->name(); }

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* /*state*/) {
  constexpr std::array<std::string_view, 2> kRequired{"w", "components"};
  params.expect_object(kRequired, {});
  Vector w = params["w"].as_vector();
  std::vector<AnyDistribution> components;
  for (const ModelJsonField& c : params["components"].elements())
    components.push_back(model_object_from_json(c, /*top_level=*/false));
  return params.construct(Mixture::kWhere,
                          [&] { return AnyDistribution(Mixture(std::move(components), std::move(w), name)); });
}

}  // namespace

const FamilySpec& mixture_family() {
  static const FamilySpec spec{"mixture", {}, Mixture::kFamily, {&params_to_json, &name_of, &from_json}};
  return spec;
}

}  // namespace attnmix
