// SPDX-License-Identifier: Apache-2.0
// Responsibility attention's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/family/spec.hpp"
#include "../family_impl.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

// params: key_means [S, D], emission [S, T], position_prior [N], sigma2.
json params_to_json(const AnyDistribution& model) {
  const ResponsibilityAttentionParams& p = model.get_if<ResponsibilityAttention>()->params();
  return json{{"key_means", table_to_json(p.key_means)},
              {"emission", table_to_json(p.emission)},
              {"position_prior", vector_to_json(p.position_prior)},
              {"sigma2", p.sigma2}};
}

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

// Data files: {"context": [ids < S] (N), "query": [reals] (D) or a symbol id < D (its one-hot), "target": id < T}.
const RowSchema kRows{{{.name = "context", .kind = DataKind::kIds, .width = "N", .bound = "S", .noun = "context"},
                       {.name = "query", .kind = DataKind::kReals, .width = "D", .symbols = true},
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
  if (rows.n_rows() == 0)  // an empty shard: symbol queries fit whatever the other processes' rows give
    return AnyBatch(encoder.encode_symbols(IdMatrix(0, dims.at("N").value), IdVector(), IdVector()));
  if (rows.columns[1].holds_symbols())
    return AnyBatch(encoder.encode_symbols(std::move(rows.columns[0].ids), id_vector(rows.columns[1]),
                                           id_vector(rows.columns[2])));
  return AnyBatch(encoder.encode(std::move(rows.columns[0].ids), std::move(rows.columns[1].reals),
                                 id_vector(rows.columns[2])));
}

Rows rows_of(const AnyBatch& any) {
  const auto& batch = any.get<ResponsibilityAttentionBatch>("responsibility attention rows");
  Rows rows;
  Column queries = batch.has_symbol_queries() ? Column{batch.query_symbols(), {}} : Column{{}, batch.queries()};
  rows.columns = {{batch.contexts(), {}}, std::move(queries), {batch.targets(), {}}};
  return rows;
}

AnyBatch sample(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> width) {
  const auto& ra = *model.get_if<ResponsibilityAttention>();
  if (width && *width != ra.context_length())
    throw ValueError("responsibility attention has a fixed context length, N = " +
                     std::to_string(ra.context_length()) + " for this model (got " + std::to_string(*width) + ")");
  return AnyBatch(ra.sampler(seed).sample(m));
}

// Fits.
using Options = ResponsibilityAttentionEstimatorOptions;

const OptionTable<Options>& options() {
  static const auto table = detail::with_precision(
      detail::with_gate(OptionTable<Options>(), "gate variance sigma^2, fixed unless {estimate_sigma2}")
          .add("estimate_sigma2", &Options::estimate_sigma2, "learn sigma^2 in the M-step")
          .add("min_sigma2", &Options::min_sigma2, "floor for a learned sigma^2", OptionCheck::kPositive));
  return table;
}

Dims model_sizes(const AnyDistribution& model) {
  const auto& m = *model.get_if<ResponsibilityAttention>();
  return detail::sizes({{"S", m.n_symbols()}, {"N", m.context_length()}, {"D", m.query_dim()}, {"T", m.n_targets()}});
}

AnyEstimator make_estimator(const EstimatorSettings& s, const AnyDistribution* /*init*/) {
  return AnyEstimator(ResponsibilityAttentionEstimator(
      s.sizes.at("S").value, s.sizes.at("N").value, s.sizes.at("D").value, s.sizes.at("T").value,
      detail::estimator_options(options(), s, ResponsibilityAttentionEstimator::kWhere)));
}

EstimatorSettings accumulator_settings(const AnyAccumulator& accumulator) {
  const auto& a = *accumulator.get_if<ResponsibilityAttentionAccumulator>();
  return detail::accumulator_settings(
      detail::sizes({{"S", a.n_symbols()}, {"N", a.context_length()}, {"D", a.query_dim()}, {"T", a.n_targets()}}),
      a.keys());
}

EstimatorSettings settings_of(const AnyEstimator& estimator) {
  const auto& e = *estimator.get_if<ResponsibilityAttentionEstimator>();
  return detail::estimator_settings(
      detail::sizes({{"S", e.n_symbols()}, {"N", e.context_length()}, {"D", e.query_dim()}, {"T", e.n_targets()}}),
      options(), e.options());
}

std::optional<AnyDistribution> initial(const AnyDistribution& init, const OptionValues& values) {
  const auto& m = *init.get_if<ResponsibilityAttention>();
  const Precision precision = options().apply(values, ResponsibilityAttentionEstimator::kWhere).precision;
  if (precision == m.precision()) return std::nullopt;
  return AnyDistribution(ResponsibilityAttention(m.params(), precision));
}

// A text corpus: symbol queries of the current token (one-hot codes), so D = S, or its row of the embeddings, so D is
// their width; every token can be a target.
Dims text_dims(int64_t vocab, const Dims& declared, const std::string& source, std::string_view kind,
               Index embedding_dim) {
  const auto given = [&](const char* symbol) -> const Dim* {
    const auto it = declared.find(symbol);
    return it == declared.end() ? nullptr : &it->second;
  };
  const std::string V = std::to_string(vocab) + " distinct " + std::string(kind);
  int64_t S = vocab;
  if (const Dim* s = given("S")) {
    if (s->value < vocab) throw ValueError(source + ": has " + V + " but " + dim_text("S", *s));
    if (embedding_dim > 0 && s->value != vocab)
      throw ValueError(dim_text("S", *s) + " does not fit the embeddings: S is the number of tokens they embed, " +
                       std::to_string(vocab));
    S = s->value;
  }
  const int64_t D = embedding_dim > 0 ? embedding_dim : S;
  if (const Dim* d = given("D"); d && d->value != D)
    throw ValueError(dim_text("D", *d) + " does not fit a text corpus: its queries are " +
                     (embedding_dim > 0 ? "the embeddings' rows, of width "
                                        : "one-hot codes of the current token, so D = S = ") +
                     std::to_string(D));
  int64_t T = S;
  if (const Dim* t = given("T")) {
    if (t->value < vocab) throw ValueError(source + ": has " + V + " (every one can be a target) but " + dim_text("T", *t));
    T = t->value;
  }
  const std::string from = "the text";
  return {{"S", {S, from}}, {"N", declared.at("N")}, {"D", {D, embedding_dim > 0 ? "the embeddings" : from}},
          {"T", {T, from}}};
}

AnyBatch text_rows(const std::vector<int64_t>& tokens, const Dims& dims, const Matrix* embeddings) {
  return AnyBatch(sequence_to_triples(tokens, dims.at("N").value, dims.at("S").value, embeddings));
}

}  // namespace

const FamilySpec& responsibility_attention_family() {
  static const FamilySpec spec{.name = "responsibility",
                               .aliases = {"ra"},
                               .title = "responsibility attention",
                               .file_family = ResponsibilityAttention::kFamily,
                               .codec = {&params_to_json, &params_name<ResponsibilityAttention>, &from_json},
                               .schema = &kRows,
                               .data_of = &data_files_of,
                               .encode = &encode,
                               .rows_of = &rows_of,
                               .sample = &sample,
                               .fit = {.sizes = {detail::kSymbols, detail::kContext, {.symbol = "D", .flag = "query-dim", .keyword = "query_dim",
                                                  .noun = "query dims", .help = "query dimension"}, detail::kTargets},
                                       .options = options().specs(),
                                       .model_sizes = &model_sizes,
                                       .model_options = &detail::stored_sigma2<ResponsibilityAttention>,
                                       .make_estimator = &make_estimator,
                                       .settings_of = &settings_of,
                                       .accumulator_settings = &accumulator_settings,
                                       .initial = &initial,
                                       .text = {.dims = &text_dims, .rows = &text_rows}}};
  return spec;
}

}  // namespace attnmix
