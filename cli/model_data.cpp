// SPDX-License-Identifier: Apache-2.0
// Family dispatch between loaded models and data files (reading rows for a model, writing sampled
// rows).
#include "model_data.hpp"

#include <nlohmann/json.hpp>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/mixture.hpp"

namespace attnmix::cli {

RaDims ra_dims_of(const AnyDistribution& model) {
  if (const auto* ra = model.get_if<ResponsibilityAttention>()) {
    const std::string from = "the model";
    return RaDims{Dim{ra->n_symbols(), from}, Dim{ra->context_length(), from},
                  Dim{ra->query_dim(), from}, Dim{ra->n_targets(), from}};
  }
  if (const auto* mixture = model.get_if<Mixture>()) {
    std::optional<RaDims> dims;
    for (const AnyDistribution& component : mixture->components()) {
      const RaDims d = ra_dims_of(component);
      if (dims && (d.n_symbols->value != dims->n_symbols->value ||
                   d.context_length->value != dims->context_length->value ||
                   d.query_dim->value != dims->query_dim->value ||
                   d.n_targets->value != dims->n_targets->value))
        throw ValueError(
            "the mixture's components have different dimensions, so no data file fits all of them");
      dims = d;
    }
    return *dims;
  }
  throw ValueError("models of family '" + model.family() +
                   "' cannot read data files in this build");
}

ModelData read_model_data(const AnyDistribution& model, const std::string& data_path,
                          TargetPolicy policy) {
  const RaDims dims = ra_dims_of(model);
  ModelData data{read_ra_rows(data_path, dims, policy), AnyBatch()};
  data.batch = AnyBatch(encode_ra_rows(data.rows, dims));
  return data;
}

void write_jsonl(std::ostream& out, const AnyBatch& any) {
  const auto& batch = any.get<ResponsibilityAttentionBatch>("attnmix sample");
  for (Index row = 0; row < batch.n_rows(); ++row) {
    nlohmann::json object = nlohmann::json::object();
    object["context"] =
        std::vector<int64_t>(batch.context(row), batch.context(row) + batch.context_length());
    object["query"] = std::vector<double>(batch.query(row), batch.query(row) + batch.query_dim());
    object["target"] = batch.target(row);
    out << object.dump() << '\n';
  }
}

}  // namespace attnmix::cli
