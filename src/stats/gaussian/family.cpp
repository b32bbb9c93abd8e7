// SPDX-License-Identifier: Apache-2.0
// The diagonal Gaussian's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/family/spec.hpp"
#include "attnmix/stats/gaussian.hpp"

#include "../../family/settings_impl.hpp"

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

// Data files: {"value": [reals] (D)}.
const RowSchema kRows{{{.name = "value", .kind = DataKind::kReals, .width = "D"}}};

DataOf data_files_of(const AnyDistribution& model) {
  return {&diagonal_gaussian_family(), {{"D", {model.get_if<DiagonalGaussian>()->dim(), "the model"}}}};
}

AnyBatch encode(Rows rows, const Dims& dims) {
  return AnyBatch(DiagonalGaussianEncoder{dims.at("D").value}.encode(std::move(rows.columns[0].reals)));
}

Rows rows_of(const AnyBatch& any) {
  Rows rows;
  rows.columns = {{{}, any.get<DiagonalGaussianBatch>("diagonal Gaussian rows").values()}};
  return rows;
}

AnyBatch sample(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> /*width*/) {
  return AnyBatch(model.get_if<DiagonalGaussian>()->sampler(seed).sample(m));
}

// Fits.
using Options = DiagonalGaussianEstimatorOptions;

const OptionTable<Options>& options() {
  static const auto table = OptionTable<Options>().add("min_sigma2", &Options::min_sigma2,
                                                       "floor of every variance", OptionCheck::kPositive);
  return table;
}

Dims model_sizes(const AnyDistribution& model) {
  return detail::sizes({{"D", model.get_if<DiagonalGaussian>()->dim()}});
}

AnyEstimator make_estimator(const EstimatorSettings& s, const AnyDistribution* /*init*/) {
  return AnyEstimator(DiagonalGaussianEstimator(
      s.sizes.at("D").value, detail::estimator_options(options(), s, DiagonalGaussianEstimator::kWhere)));
}

EstimatorSettings settings_of(const AnyEstimator& estimator) {
  const auto& e = *estimator.get_if<DiagonalGaussianEstimator>();
  return detail::estimator_settings(detail::sizes({{"D", e.dim()}}), options(), e.options());
}

EstimatorSettings accumulator_settings(const AnyAccumulator& accumulator) {
  const auto& a = *accumulator.get_if<DiagonalGaussianAccumulator>();
  return detail::accumulator_settings(detail::sizes({{"D", a.dim()}}), a.keys());
}

}  // namespace

const FamilySpec& diagonal_gaussian_family() {
  static const FamilySpec spec{
      .name = "gaussian",
      .title = "diagonal Gaussian",
      .file_family = DiagonalGaussian::kFamily,
      .codec = {&params_to_json, &params_name<DiagonalGaussian>, &from_json},
      .schema = &kRows,
      .data_of = &data_files_of,
      .encode = &encode,
      .rows_of = &rows_of,
      .sample = &sample,
      .fit = {.sizes = {{.symbol = "D", .flag = "dim", .keyword = "dim", .noun = "dimensions", .one = "dimension",
                         .help = "dimension of the values"}},
              .options = options().specs(),
              .model_sizes = &model_sizes,
              .make_estimator = &make_estimator,
              .settings_of = &settings_of,
              .accumulator_settings = &accumulator_settings}};
  return spec;
}

}  // namespace attnmix
