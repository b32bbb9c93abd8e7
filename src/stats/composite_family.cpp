// SPDX-License-Identifier: Apache-2.0
// The composite's family descriptor (family/spec.hpp): one model object without "format" per field.
#include <array>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/family/spec.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/stats/composite.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

// params: components (model objects, one per field).
json params_to_json(const AnyDistribution& model) {
  json components = json::array();
  for (const AnyDistribution& c : model.get_if<Composite>()->components())
    components.push_back(model_object_to_json(c));
  return json{{"components", std::move(components)}};
}

std::string name_of(const AnyDistribution& model) { return model.get_if<Composite>()->name(); }

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* /*state*/) {
  constexpr std::array<std::string_view, 1> kRequired{"components"};
  params.expect_object(kRequired, {});
  std::vector<AnyDistribution> components;
  for (const ModelJsonField& c : params["components"].elements())
    components.push_back(model_object_from_json(c, /*top_level=*/false));
  return params.construct(Composite::kWhere,
                          [&] { return AnyDistribution(Composite(std::move(components), name)); });
}

}  // namespace

const FamilySpec& composite_family() {
  static const FamilySpec spec{.name = "composite",
                               .title = "composite",
                               .file_family = Composite::kFamily,
                               .codec = {&params_to_json, &name_of, &from_json}};
  return spec;
}

}  // namespace attnmix
