// SPDX-License-Identifier: Apache-2.0
// Family dispatch between loaded models and data files (reading rows for a model, drawing and
// writing sampled rows).
#include "model_data.hpp"

#include <nlohmann/json.hpp>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/mixture.hpp"
#include "cli_support.hpp"

namespace attnmix::cli {

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

/// The dimension values of dims in a fixed order, to compare the components of a mixture.
std::vector<int64_t> dim_values(const DataDims& dims) {
  return std::visit(
      Overloaded{[](const RaDims& d) {
                   return std::vector<int64_t>{0, d.n_symbols->value, d.context_length->value,
                                               d.query_dim->value, d.n_targets->value};
                 },
                 [](const CaDims& d) {
                   return std::vector<int64_t>{1, d.n_symbols->value, d.n_targets->value};
                 },
                 [](const VeaDims& d) {
                   return std::vector<int64_t>{2, d.n_symbols->value, d.context_length->value,
                                               d.n_targets->value};
                 }},
      dims);
}

/// The rows' origin and a copy of their targets beside the batch that encode(std::move(rows)) makes (the row
/// matrices move into the batch, so the rows are held once).
template <class Rows, class Encode>
ModelData model_data(Rows rows, const Encode& encode) {
  ModelData data;
  data.has_targets = rows.has_targets;
  data.targets = rows.targets;
  data.origin = std::move(static_cast<RowOrigin&>(rows));
  data.batch = AnyBatch(encode(std::move(rows)));
  return data;
}

}  // namespace

DataDims data_dims_of(const AnyDistribution& model) {
  const std::string from = "the model";
  if (const auto* ra = model.get_if<ResponsibilityAttention>())
    return RaDims{Dim{ra->n_symbols(), from}, Dim{ra->context_length(), from},
                  Dim{ra->query_dim(), from}, Dim{ra->n_targets(), from}};
  // A chained model reads contexts of any length N (only the file's own rows must agree).
  if (const auto* ca = model.get_if<ChainedAttention>())
    return CaDims{Dim{ca->n_symbols(), from}, std::nullopt, Dim{ca->n_targets(), from}};
  if (const auto* vea = model.get_if<VariationalEmbeddingAttention>())
    return VeaDims{Dim{vea->n_symbols(), from}, Dim{vea->context_length(), from},
                   Dim{vea->n_targets(), from}};
  // Variational multi-hop attention reads chained-attention rows of any length N.
  if (const auto* vmha = model.get_if<VariationalMultiHopAttention>())
    return CaDims{Dim{vmha->n_symbols(), from}, std::nullopt, Dim{vmha->n_targets(), from}};
  if (const auto* mixture = model.get_if<Mixture>()) {
    std::optional<DataDims> dims;
    for (const AnyDistribution& component : mixture->components()) {
      const DataDims d = data_dims_of(component);
      if (dims && dim_values(d) != dim_values(*dims))
        throw ValueError(
            "the mixture's components have different families or dimensions, so no data file fits "
            "all of them");
      dims = d;
    }
    return *dims;
  }
  throw ValueError("models of family '" + model.family() +
                   "' cannot read data files in this build");
}

ModelData read_model_data(const AnyDistribution& model, const std::string& data_path,
                          TargetPolicy policy) {
  return std::visit(
      Overloaded{[&](const RaDims& dims) {
                   return model_data(read_ra_rows(data_path, dims, policy),
                                     [&](RaRows rows) { return encode_ra_rows(std::move(rows), dims); });
                 },
                 [&](const CaDims& declared) {
                   CaRows rows = read_ca_rows(data_path, declared, policy);
                   const CaDims dims = infer_ca_dims(declared, {&rows});
                   return model_data(std::move(rows),
                                     [&](CaRows moved) { return encode_ca_rows(std::move(moved), dims); });
                 },
                 [&](const VeaDims& dims) {
                   return model_data(read_vea_rows(data_path, dims, policy),
                                     [&](VeaRows rows) { return encode_vea_rows(std::move(rows), dims); });
                 }},
      data_dims_of(model));
}

AnyBatch draw_samples(const AnyDistribution& model, Index m, uint64_t seed,
                      std::optional<int64_t> context_length) {
  if (const auto* ca = model.get_if<ChainedAttention>())
    return AnyBatch(context_length ? ca->sampler(seed, *context_length).sample(m)
                                   : ca->sampler(seed).sample(m));
  if (const auto* vmha = model.get_if<VariationalMultiHopAttention>())
    return AnyBatch(context_length ? vmha->sampler(seed, *context_length).sample(m)
                                   : vmha->sampler(seed).sample(m));
  std::optional<int64_t> fixed_n;  // the context length of a family with a fixed N
  std::string family;
  if (const auto* ra = model.get_if<ResponsibilityAttention>()) {
    fixed_n = ra->context_length();
    family = "responsibility attention";
  } else if (const auto* vea = model.get_if<VariationalEmbeddingAttention>()) {
    fixed_n = vea->context_length();
    family = "variational embedding attention";
  }
  if (fixed_n && context_length && *context_length != *fixed_n) {
    const std::string N = std::to_string(*fixed_n);
    throw UsageError("--context-length " + std::to_string(*context_length) +
                     " does not match the model: " + family + " has a fixed context length, N = " +
                     N + " for this model (omit --context-length or pass " + N + ")");
  }
  return model.sample(m, seed);
}

void write_jsonl(std::ostream& out, const AnyDistribution& model, const AnyBatch& any) {
  const auto ids = [](const int64_t* first, Index count) {
    return std::vector<int64_t>(first, first + count);
  };
  std::visit(Overloaded{[&](const CaDims&) {
                          const auto& batch = any.get<ChainedAttentionBatch>("attnmix sample");
                          for (Index row = 0; row < batch.n_rows(); ++row) {
                            nlohmann::ordered_json object = nlohmann::ordered_json::object();
                            object["keys"] = ids(batch.keys(row), batch.context_length());
                            object["values"] = ids(batch.values(row), batch.context_length());
                            object["query"] = batch.query(row);
                            object["target"] = batch.target(row);
                            out << object.dump() << '\n';
                          }
                        },
                        [&](const VeaDims&) {
                          const auto& batch =
                              any.get<VariationalEmbeddingAttentionBatch>("attnmix sample");
                          for (Index row = 0; row < batch.n_rows(); ++row) {
                            nlohmann::ordered_json object = nlohmann::ordered_json::object();
                            object["context"] = ids(batch.context(row), batch.context_length());
                            object["query"] = batch.query(row);
                            object["target"] = batch.target(row);
                            out << object.dump() << '\n';
                          }
                        },
                        [&](const RaDims&) {
                          const auto& batch =
                              any.get<ResponsibilityAttentionBatch>("attnmix sample");
                          for (Index row = 0; row < batch.n_rows(); ++row) {
                            nlohmann::ordered_json object = nlohmann::ordered_json::object();
                            object["context"] = ids(batch.context(row), batch.context_length());
                            object["query"] = std::vector<double>(
                                batch.query(row), batch.query(row) + batch.query_dim());
                            object["target"] = batch.target(row);
                            out << object.dump() << '\n';
                          }
                        }},
             data_dims_of(model));
}

}  // namespace attnmix::cli
