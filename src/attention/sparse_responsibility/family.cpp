// SPDX-License-Identifier: Apache-2.0
// Sparse responsibility attention's family descriptor (family/spec.hpp).
#include <array>
#include <string_view>
#include <utility>

#include "attnmix/attention/sparse_responsibility.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/inference/optimize.hpp"
#include "../family_impl.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

/// A table over a pattern in the sparse-rows layout: the pattern's cells with their values, `defaults` elsewhere.
json pattern_table(const SparsePattern& pattern, const Vector& values, const Vector& defaults) {
  return sparse_rows_to_json({.rows = pattern.rows(),
                              .cols = pattern.cols(),
                              .defaults = defaults,
                              .row_begin = pattern.row_begin(),
                              .columns = pattern.columns(),
                              .values = values});
}

// params: key_means [S, D] (sparse rows, default 0), emission [S, T] (sparse rows, each row's default β_s),
// position_prior [N], sigma2. The listed cells are the patterns, whatever their values.
json params_to_json(const AnyDistribution& model) {
  const SparseResponsibilityAttentionParams& p = model.get_if<SparseResponsibilityAttention>()->params();
  return json{{"key_means", pattern_table(*p.patterns.keys, p.key_values, Vector::Zero(p.patterns.keys->rows()))},
              {"emission", pattern_table(*p.patterns.emission, p.emission_values, p.emission_default)},
              {"position_prior", vector_to_json(p.position_prior)},
              {"sigma2", p.sigma2}};
}

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* /*state*/) {
  constexpr std::array<std::string_view, 4> kRequired{"key_means", "emission", "position_prior", "sigma2"};
  params.expect_object(kRequired, {});
  SparseRows keys = params["key_means"].as_sparse_rows();
  for (Index s = 0; s < keys.rows; ++s)
    if (keys.defaults[s] != 0.0)
      params["key_means"]["default"].fail("must be 0 in every row (K is 0 off its pattern; row " +
                                          std::to_string(s) + " has " + std::to_string(keys.defaults[s]) + ")");
  SparseRows emission = params["emission"].as_sparse_rows();
  SparseResponsibilityAttentionParams p;
  p.key_values = std::move(keys.values);
  p.emission_values = std::move(emission.values);
  p.emission_default = std::move(emission.defaults);
  p.position_prior = params["position_prior"].as_vector();
  p.sigma2 = params["sigma2"].as_double();
  p.name = name;
  return params.construct(SparseResponsibilityAttention::kWhere, [&] {
    p.patterns = {std::make_shared<const SparsePattern>(keys.rows, keys.cols, std::move(keys.row_begin),
                                                        std::move(keys.columns)),
                  std::make_shared<const SparsePattern>(emission.rows, emission.cols, std::move(emission.row_begin),
                                                        std::move(emission.columns))};
    return AnyDistribution(SparseResponsibilityAttention(std::move(p)));
  });
}

// Data files: {"context": [ids < S] (N), "query": a symbol id < D, "target": id < T}.
const RowSchema kRows{{{.name = "context", .kind = DataKind::kIds, .width = "N", .bound = "S", .noun = "context"},
                       {.name = "query", .kind = DataKind::kIds, .bound = "D", .noun = "query"},
                       {.name = "target", .kind = DataKind::kIds, .bound = "T", .noun = "target", .target = true}}};

Dims sizes_of(int64_t S, int64_t N, int64_t D, int64_t T) {
  return detail::sizes({{"S", S}, {"N", N}, {"D", D}, {"T", T}});
}

DataOf data_files_of(const AnyDistribution& model) {
  const auto& m = *model.get_if<SparseResponsibilityAttention>();
  const std::string from = "the model";
  return {&sparse_responsibility_attention_family(),
          {{"S", {m.n_symbols(), from}}, {"N", {m.context_length(), from}}, {"D", {m.query_dim(), from}},
           {"T", {m.n_targets(), from}}}};
}

AnyBatch encode(Rows rows, const Dims& dims) {
  const ResponsibilityAttentionEncoder encoder{dims.at("S").value, dims.at("N").value, dims.at("D").value,
                                               dims.at("T").value};
  return AnyBatch(encoder.encode_symbols(std::move(rows.columns[0].ids), id_vector(rows.columns[1]),
                                         id_vector(rows.columns[2])));
}

Rows rows_of(const AnyBatch& any) {
  const auto& batch = any.get<ResponsibilityAttentionBatch>("sparse responsibility attention rows");
  Rows rows;
  rows.columns = {{batch.contexts(), {}}, {batch.query_symbols(), {}}, {batch.targets(), {}}};
  return rows;
}

// Fits.
using Options = SparseResponsibilityAttentionEstimatorOptions;

const OptionTable<Options>& options() {
  static const auto table =
      detail::with_gate(OptionTable<Options>(), "gate variance sigma^2, fixed unless {estimate_sigma2}")
          .add("estimate_sigma2", &Options::estimate_sigma2, "learn sigma^2 in the M-step")
          .add("min_sigma2", &Options::min_sigma2, "floor for a learned sigma^2", OptionCheck::kPositive);
  return table;
}

Dims model_sizes(const AnyDistribution& model) {
  const auto& m = *model.get_if<SparseResponsibilityAttention>();
  return sizes_of(m.n_symbols(), m.context_length(), m.query_dim(), m.n_targets());
}

/// The patterns of the rows of every process of the fit: each process's cells, gathered in rank order. A process
/// that fails to make its own stops every process before the gather (optimize.hpp's on_every_rank).
SparsePatterns fit_patterns(const AnyBatch& rows, const Dims& dims, const Communicator* comm) {
  const Index S = dims.at("S").value;
  SparsePatterns local;
  detail::on_every_rank(comm, [&] {
    const auto& batch = rows.get<ResponsibilityAttentionBatch>("sparse responsibility attention rows");
    local = data_patterns(batch, S, dims.at("D").value, dims.at("T").value);
  });
  if (comm == nullptr || comm->size() == 1) return local;
  const auto everyone = [&](const SparsePattern& mine) {
    std::vector<int64_t> cell_rows, cell_cols(mine.columns());
    for (Index s = 0; s < S; ++s) cell_rows.insert(cell_rows.end(), mine.end(s) - mine.begin(s), s);
    const std::vector<int64_t> all_rows = comm->all_values(cell_rows);
    const std::vector<int64_t> all_cols = comm->all_values(cell_cols);
    return std::make_shared<const SparsePattern>(SparsePattern::of_cells(S, mine.cols(), all_rows, all_cols));
  };
  return {everyone(*local.keys), everyone(*local.emission)};
}

AnyEstimator make_estimator(const EstimatorSettings& s, const AnyDistribution* /*init*/) {
  if (s.rows == nullptr)
    throw ValueError(std::string(SparseResponsibilityAttentionEstimator::kWhere) +
                     ": sparse tables take their cells from the training rows, which were not given");
  return AnyEstimator(SparseResponsibilityAttentionEstimator(
      fit_patterns(*s.rows, s.sizes, s.communicator), s.sizes.at("N").value,
      detail::estimator_options(options(), s, SparseResponsibilityAttentionEstimator::kWhere)));
}

EstimatorSettings accumulator_settings(const AnyAccumulator& accumulator) {
  const auto& a = *accumulator.get_if<SparseResponsibilityAttentionAccumulator>();
  return detail::accumulator_settings(sizes_of(a.n_symbols(), a.context_length(), a.query_dim(), a.n_targets()),
                                      a.keys());
}

EstimatorSettings settings_of(const AnyEstimator& estimator) {
  const auto& e = *estimator.get_if<SparseResponsibilityAttentionEstimator>();
  return detail::estimator_settings(sizes_of(e.n_symbols(), e.context_length(), e.query_dim(), e.n_targets()),
                                    options(), e.options());
}

// A text corpus: the query of a row is its current token, so D = S; every token can be a target.
Dims text_dims(int64_t vocab, const Dims& declared, const std::string& source, std::string_view kind,
               Index embedding_dim) {
  if (embedding_dim > 0)
    throw ValueError("sparse tables take the tokens' symbols as queries, not --embeddings (use --family "
                     "responsibility for embedded queries)");
  return responsibility_attention_family().fit.text.dims(vocab, declared, source, kind, 0);
}

AnyBatch text_rows(const std::vector<int64_t>& tokens, const Dims& dims, const Matrix* /*embeddings*/) {
  return AnyBatch(sequence_to_triples(tokens, dims.at("N").value, dims.at("S").value, nullptr));
}

}  // namespace

const FamilySpec& sparse_responsibility_attention_family() {
  static const FamilySpec spec{
      .name = "sparse-responsibility",
      .aliases = {"ra-sparse"},
      .title = "responsibility attention with sparse tables",
      .file_family = SparseResponsibilityAttention::kFamily,
      .codec = {&params_to_json, &params_name<SparseResponsibilityAttention>, &from_json},
      .schema = &kRows,
      .data_of = &data_files_of,
      .encode = &encode,
      .rows_of = &rows_of,
      .fit = {.sizes = {detail::kSymbols, detail::kContext,
                        {.symbol = "D", .flag = "query-dim", .keyword = "query_dim", .noun = "query symbols",
                         .help = "query dimension"},
                        detail::kTargets},
              .options = options().specs(),
              .shaped_by_data = true,
              .model_sizes = &model_sizes,
              .model_options = &detail::stored_sigma2<SparseResponsibilityAttention>,
              .make_estimator = &make_estimator,
              .settings_of = &settings_of,
              .accumulator_settings = &accumulator_settings,
              .text = {.dims = &text_dims, .rows = &text_rows}}};
  return spec;
}

}  // namespace attnmix
