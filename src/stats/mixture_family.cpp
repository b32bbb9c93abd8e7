// SPDX-License-Identifier: Apache-2.0
// The mixture's family descriptor (family/spec.hpp): its components are stored as model objects without "format",
// so a mixture of any registered family is saved without extra code.
#include <algorithm>
#include <array>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/stats/mixture.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

bool same_values(const Dims& a, const Dims& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const auto& x, const auto& y) { return x.first == y.first && x.second.value == y.second.value; });
}

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

// A mixture reads its components' rows: they must all read the same data files with the same sizes.
DataOf data_files_of(const AnyDistribution& model) {
  std::optional<DataOf> data;
  for (const AnyDistribution& component : model.get_if<Mixture>()->components()) {
    DataOf d = attnmix::data_of(component);
    if (data && (d.family->schema != data->family->schema || !same_values(d.dims, data->dims)))
      throw ValueError(
          "the mixture's components have different families or dimensions, so no data file fits all of them");
    if (!data) data = std::move(d);
  }
  return *data;
}

}  // namespace

const FamilySpec& mixture_family() {
  static const FamilySpec spec{.name = "mixture",
                               .title = "mixture",
                               .file_family = Mixture::kFamily,
                               .codec = {&params_to_json, &name_of, &from_json},
                               .data_of = &data_files_of};
  return spec;
}

}  // namespace attnmix
