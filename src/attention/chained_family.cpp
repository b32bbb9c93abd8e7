// SPDX-License-Identifier: Apache-2.0
// Chained attention's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/attention/chained.hpp"
#include "attnmix/family/spec.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

// params: keys [L, S, S], emission [S, T], sigma2.
json params_to_json(const AnyDistribution& model) {
  const ChainedAttentionParams& p = model.get_if<ChainedAttention>()->params();
  json tables = json::array();
  for (const Matrix& K : p.key_tables) tables.push_back(matrix_to_json(K));
  return json{{"keys", std::move(tables)}, {"emission", matrix_to_json(p.emission)}, {"sigma2", p.sigma2}};
}

std::string name_of(const AnyDistribution& model) { return model.get_if<ChainedAttention>()->params().name; }

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* /*state*/) {
  constexpr std::array<std::string_view, 3> kRequired{"keys", "emission", "sigma2"};
  params.expect_object(kRequired, {});
  ChainedAttentionParams p;
  const ModelJsonField keys = params["keys"];
  if (!keys.value().is_array()) keys.fail("must be a 3-D array (L, S, S)");
  for (const ModelJsonField& table : keys.elements()) p.key_tables.push_back(table.as_matrix());
  p.emission = params["emission"].as_matrix();
  p.sigma2 = params["sigma2"].as_double();
  p.name = name;
  return params.construct(ChainedAttention::kWhere, [&] { return AnyDistribution(ChainedAttention(std::move(p))); });
}

}  // namespace

const FamilySpec& chained_attention_family() {
  static const FamilySpec spec{"chained", {"ca"}, ChainedAttention::kFamily, {&params_to_json, &name_of, &from_json}};
  return spec;
}

}  // namespace attnmix
