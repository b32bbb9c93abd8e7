// SPDX-License-Identifier: Apache-2.0
// The diagonal Gaussian's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/family/spec.hpp"
#include "attnmix/stats/gaussian.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

// params: mu [D], sigma2 [D].
json params_to_json(const AnyDistribution& model) {
  const DiagonalGaussianParams& p = model.get_if<DiagonalGaussian>()->params();
  return json{{"mu", vector_to_json(p.mu)}, {"sigma2", vector_to_json(p.sigma2)}};
}

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* /*state*/) {
  constexpr std::array<std::string_view, 2> kRequired{"mu", "sigma2"};
  params.expect_object(kRequired, {});
  DiagonalGaussianParams p{params["mu"].as_vector(), params["sigma2"].as_vector(), name};
  return params.construct(DiagonalGaussian::kWhere,
                          [&] { return AnyDistribution(DiagonalGaussian(std::move(p))); });
}

}  // namespace

const FamilySpec& diagonal_gaussian_family() {
  static const FamilySpec spec{.name = "gaussian",
                               .title = "diagonal Gaussian",
                               .file_family = DiagonalGaussian::kFamily,
                               .codec = {&params_to_json, &params_name<DiagonalGaussian>, &from_json}};
  return spec;
}

}  // namespace attnmix
