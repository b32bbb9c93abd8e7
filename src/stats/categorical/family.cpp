// SPDX-License-Identifier: Apache-2.0
// The categorical distribution's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/family/spec.hpp"
#include "attnmix/stats/categorical.hpp"

#include "../../family/settings_impl.hpp"

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

// Data files: {"value": id < K}.
const RowSchema kRows{{{.name = "value", .kind = DataKind::kIds, .bound = "K", .noun = "value"}}};

DataOf data_files_of(const AnyDistribution& model) {
  return {&categorical_family(), {{"K", {model.get_if<Categorical>()->n_categories(), "the model"}}}};
}

AnyBatch encode(Rows rows, const Dims& dims) {
  return AnyBatch(CategoricalEncoder{dims.at("K").value}.encode(id_vector(rows.columns[0])));
}

Rows rows_of(const AnyBatch& any) {
  Rows rows;
  rows.columns = {{any.get<CategoricalBatch>("categorical rows").ids(), {}}};
  return rows;
}

AnyBatch sample(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> /*width*/) {
  return AnyBatch(model.get_if<Categorical>()->sampler(seed).sample(m));
}

// Fits.
using Options = CategoricalEstimatorOptions;

const OptionTable<Options>& options() {
  static const auto table = OptionTable<Options>().add(
      "smoothing", &Options::smoothing, "pseudo-count added to every category's count", OptionCheck::kNonNegative);
  return table;
}

Dims model_sizes(const AnyDistribution& model) {
  return detail::sizes({{"K", model.get_if<Categorical>()->n_categories()}});
}

AnyEstimator make_estimator(const EstimatorSettings& s, const AnyDistribution* /*init*/) {
  return AnyEstimator(
      CategoricalEstimator(s.sizes.at("K").value, detail::estimator_options(options(), s, CategoricalEstimator::kWhere)));
}

EstimatorSettings settings_of(const AnyEstimator& estimator) {
  const auto& e = *estimator.get_if<CategoricalEstimator>();
  return detail::estimator_settings(detail::sizes({{"K", e.n_categories()}}), options(), e.options());
}

EstimatorSettings accumulator_settings(const AnyAccumulator& accumulator) {
  const auto& a = *accumulator.get_if<CategoricalAccumulator>();
  return detail::accumulator_settings(detail::sizes({{"K", a.n_categories()}}), a.keys());
}

}  // namespace

const FamilySpec& categorical_family() {
  static const FamilySpec spec{
      .name = "categorical",
      .title = "categorical distribution",
      .file_family = Categorical::kFamily,
      .codec = {&params_to_json, &params_name<Categorical>, &from_json},
      .schema = &kRows,
      .data_of = &data_files_of,
      .encode = &encode,
      .rows_of = &rows_of,
      .sample = &sample,
      .fit = {.sizes = {{.symbol = "K", .flag = "categories", .keyword = "num_categories", .noun = "categories",
                         .one = "category", .help = "number of categories"}},
              .options = options().specs(),
              .model_sizes = &model_sizes,
              .make_estimator = &make_estimator,
              .settings_of = &settings_of,
              .accumulator_settings = &accumulator_settings}};
  return spec;
}

}  // namespace attnmix
