// SPDX-License-Identifier: Apache-2.0
// Chained attention's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/attention/chained.hpp"
#include "attnmix/family/spec.hpp"
#include "../family_impl.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

// params: keys [L, S, S], emission [S, T], sigma2.
json params_to_json(const AnyDistribution& model) {
  const ChainedAttentionParams& p = model.get_if<ChainedAttention>()->params();
  json tables = json::array();
  for (const Matrix& K : p.key_tables) tables.push_back(table_to_json(K));
  return json{{"keys", std::move(tables)}, {"emission", table_to_json(p.emission)}, {"sigma2", p.sigma2}};
}

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

// Data files: {"keys": [ids < S] (N), "values": [ids < S] (N, paired with keys), "query": id < S, "target": id < T};
// variational multi-hop attention reads them too.
const RowSchema kRows{{{.name = "keys", .kind = DataKind::kIds, .width = "N", .bound = "S", .noun = "key"},
                       {.name = "values", .kind = DataKind::kIds, .width = "N", .bound = "S", .noun = "value",
                        .pairs_with = "keys"},
                       {.name = "query", .kind = DataKind::kIds, .bound = "S", .noun = "query"},
                       {.name = "target", .kind = DataKind::kIds, .bound = "T", .noun = "target", .target = true}}};

// A chained model reads contexts of any length N (only a file's own rows must agree).
DataOf data_files_of(const AnyDistribution& model) {
  const auto& m = *model.get_if<ChainedAttention>();
  return {&chained_attention_family(), {{"S", {m.n_symbols(), "the model"}}, {"T", {m.n_targets(), "the model"}}}};
}

AnyBatch encode(Rows rows, const Dims& dims) {
  ChainedAttentionEncoder encoder;
  encoder.n_symbols = dims.at("S").value;
  encoder.n_targets = dims.at("T").value;
  return AnyBatch(encoder.encode(std::move(rows.columns[0].ids), std::move(rows.columns[1].ids),
                                 id_vector(rows.columns[2]), id_vector(rows.columns[3])));
}

Rows rows_of(const AnyBatch& any) {
  const auto& batch = any.get<ChainedAttentionBatch>("chained attention rows");
  Rows rows;
  rows.columns = {{batch.keys(), {}}, {batch.values(), {}}, {batch.queries(), {}}, {batch.targets(), {}}};
  return rows;
}

AnyBatch sample(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> width) {
  const auto& ca = *model.get_if<ChainedAttention>();
  return AnyBatch(width ? ca.sampler(seed, *width).sample(m) : ca.sampler(seed).sample(m));
}

// Fits.
using Options = ChainedAttentionEstimatorOptions;

const OptionTable<Options>& options() {
  static const auto table = detail::with_gate(OptionTable<Options>());
  return table;
}

// A chained model fixes L, S and T, not the context length N.
Dims model_sizes(const AnyDistribution& model) {
  const auto& m = *model.get_if<ChainedAttention>();
  return detail::sizes({{"L", m.n_hops()}, {"S", m.n_symbols()}, {"T", m.n_targets()}});
}

AnyEstimator make_estimator(const EstimatorSettings& s, const AnyDistribution* /*init*/) {
  return AnyEstimator(ChainedAttentionEstimator(s.sizes.at("L").value, s.sizes.at("S").value, s.sizes.at("T").value,
                                                detail::estimator_options(options(), s, ChainedAttentionEstimator::kWhere)));
}

EstimatorSettings accumulator_settings(const AnyAccumulator& accumulator) {
  const auto& a = *accumulator.get_if<ChainedAttentionAccumulator>();
  return detail::accumulator_settings(detail::sizes({{"L", a.n_hops()}, {"S", a.n_symbols()}, {"T", a.n_targets()}}),
                                      a.keys());
}

EstimatorSettings settings_of(const AnyEstimator& estimator) {
  const auto& e = *estimator.get_if<ChainedAttentionEstimator>();
  return detail::estimator_settings(detail::sizes({{"L", e.n_hops()}, {"S", e.n_symbols()}, {"T", e.n_targets()}}),
                                    options(), e.options());
}

std::string mechanism(const Dims& dims) {
  const int64_t L = dims.at("L").value;
  return "chained attention (L = " + std::to_string(L) + (L == 1 ? " hop)" : " hops)");
}

}  // namespace

const FamilySpec& chained_attention_family() {
  static const FamilySpec spec{.name = "chained",
                               .aliases = {"ca"},
                               .title = "chained attention",
                               .file_family = ChainedAttention::kFamily,
                               .codec = {&params_to_json, &params_name<ChainedAttention>, &from_json},
                               .schema = &kRows,
                               .data_of = &data_files_of,
                               .encode = &encode,
                               .rows_of = &rows_of,
                               .sample = &sample,
                               .fit = {.sizes = {{.symbol = "L", .flag = "hops", .keyword = "n_hops", .noun = "hops",
                                                  .one = "hop", .help = "attention hops", .fallback = 2},
                                                 detail::kSymbols, detail::kOpenContext, detail::kTargets},
                                       .options = options().specs(),
                                       .model_sizes = &model_sizes,
                                       .model_options = &detail::stored_sigma2<ChainedAttention>,
                                       .make_estimator = &make_estimator,
                                       .settings_of = &settings_of,
                                       .accumulator_settings = &accumulator_settings,
                                       .mechanism = &mechanism}};
  return spec;
}

}  // namespace attnmix
