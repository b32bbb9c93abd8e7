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

// Data files: {"context": [ids < S] (N), "query": [reals] (D), "target": id < T}.
const RowSchema kRows{{{.name = "context", .kind = DataKind::kIds, .width = "N", .bound = "S", .noun = "context"},
                       {.name = "query", .kind = DataKind::kReals, .width = "D"},
                       {.name = "target", .kind = DataKind::kIds, .bound = "T", .noun = "target", .target = true}}};

DataOf data_files_of(const AnyDistribution& model) {
  const auto& m = *model.get_if<ResponsibilityAttention>();
  const std::string from = "the model";
  return {&responsibility_attention_family(),
          {{"S", {m.n_symbols(), from}}, {"N", {m.context_length(), from}}, {"D", {m.query_dim(), from}},
           {"T", {m.n_targets(), from}}}};
}

AnyBatch encode(Rows rows, const Dims& dims) {
  const ResponsibilityAttentionEncoder encoder{dims.at("S").value, dims.at("N").value, dims.at("D").value,
                                               dims.at("T").value};
  return AnyBatch(encoder.encode(std::move(rows.columns[0].ids), std::move(rows.columns[1].reals),
                                 id_vector(rows.columns[2])));
}

Rows rows_of(const AnyBatch& any) {
  const auto& batch = any.get<ResponsibilityAttentionBatch>("responsibility attention rows");
  Rows rows;
  rows.columns = {{batch.contexts(), {}}, {{}, batch.queries()}, {batch.targets(), {}}};
  return rows;
}

AnyBatch sample(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> width) {
  const auto& ra = *model.get_if<ResponsibilityAttention>();
  if (width && *width != ra.context_length())
    throw ValueError("responsibility attention has a fixed context length, N = " +
                     std::to_string(ra.context_length()) + " for this model (got " + std::to_string(*width) + ")");
  return AnyBatch(ra.sampler(seed).sample(m));
}

}  // namespace

const FamilySpec& responsibility_attention_family() {
  static const FamilySpec spec{.name = "responsibility",
                               .aliases = {"ra"},
                               .title = "responsibility attention",
                               .file_family = ResponsibilityAttention::kFamily,
                               .codec = {&params_to_json, &name_of, &from_json},
                               .schema = &kRows,
                               .data_of = &data_files_of,
                               .encode = &encode,
                               .rows_of = &rows_of,
                               .sample = &sample};
  return spec;
}

}  // namespace attnmix
