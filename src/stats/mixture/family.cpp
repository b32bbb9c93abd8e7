// SPDX-License-Identifier: Apache-2.0
// The mixture's family descriptor (family/spec.hpp): its components are stored as model objects without "format",
// so a mixture of any registered family is saved without extra code.
#include <algorithm>
#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/stats/mixture.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

bool same_values(const Dims& a, const Dims& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const auto& x, const auto& y) { return x.first == y.first && x.second.value == y.second.value; });
}

// params: w [K], components (model objects).
json params_to_json(const AnyDistribution& model) {
  const Mixture& m = *model.get_if<Mixture>();
  json components = json::array();
  for (const AnyDistribution& c : m.components()) components.push_back(model_object_to_json(c));
  return json{{"w", vector_to_json(m.weights())}, {"components", std::move(components)}};
}

std::string name_of(const AnyDistribution& model) { return model.get_if<Mixture>()->name(); }

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* /*state*/) {
  constexpr std::array<std::string_view, 2> kRequired{"w", "components"};
  params.expect_object(kRequired, {});
  Vector w = params["w"].as_vector();
  std::vector<AnyDistribution> components;
  for (const ModelJsonField& c : params["components"].elements())
    components.push_back(model_object_from_json(c, /*top_level=*/false));
  return params.construct(Mixture::kWhere,
                          [&] { return AnyDistribution(Mixture(std::move(components), std::move(w), name)); });
}

// A mixture reads its components' rows: they must all read the same data files with the same sizes.
DataOf data_files_of(const AnyDistribution& model) {
  std::optional<DataOf> data;
  for (const AnyDistribution& component : model.get_if<Mixture>()->components()) {
    DataOf d = attnmix::data_of(component);
    if (data && (*d.schema != *data->schema || !same_values(d.dims, data->dims)))
      throw ValueError(
          "the mixture's components have different families or dimensions, so no data file fits all of them");
    if (!data) data = std::move(d);
  }
  return *data;
}

// m rows: each row's component z ~ w from one stream, then component k draws its rows from its own stream and row i is
// the next row of component z_i. O(m) plus the components' sampling.
AnyBatch sample_mixture(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> width) {
  const Mixture& mixture = *model.get_if<Mixture>();
  const DataOf data = data_files_of(model);
  const auto& components = mixture.components();
  const auto K = static_cast<Index>(components.size());
  Rng rng(derive_seed(seed, SeedPurpose::kSampler, 0));
  const std::span<const double> w(mixture.weights().data(), static_cast<size_t>(K));
  std::vector<Index> z(static_cast<size_t>(m)), count(static_cast<size_t>(K), 0);
  for (Index& zi : z) ++count[static_cast<size_t>(zi = rng.categorical(w))];
  std::vector<Rows> drawn;
  for (Index k = 0; k < K; ++k) {
    const AnyDistribution& component = components[static_cast<size_t>(k)];
    const FamilySpec& family = spec_of(component);
    if (!family.sample) throw ValueError(std::string(Mixture::kWhere) + ": component " + std::to_string(k) +
                                         " (" + std::string(family.title) + ") has no sampler");
    const uint64_t stream = derive_seed(seed, SeedPurpose::kSampler, static_cast<uint64_t>(k) + 1);
    // A component that is itself a mixture draws rows of its components' family.
    const AnyBatch batch = family.sample(component, count[static_cast<size_t>(k)], stream, width);
    drawn.push_back(attnmix::data_of(component).rows_of(batch));
  }
  Rows rows = drawn.front();
  for (size_t f = 0; f < rows.columns.size(); ++f) {
    const auto width_of = [&](auto member) {
      Index most = 0;
      for (const Rows& d : drawn) most = std::max<Index>(most, (d.columns[f].*member).cols());
      return most;
    };
    const Index id_width = width_of(&Column::ids), real_width = width_of(&Column::reals);
    rows.columns[f].ids.resize(id_width ? m : 0, id_width);
    rows.columns[f].reals.resize(real_width ? m : 0, real_width);
  }
  std::vector<Index> next(static_cast<size_t>(K), 0);
  for (Index i = 0; i < m; ++i) {
    const auto k = static_cast<size_t>(z[static_cast<size_t>(i)]);
    for (size_t f = 0; f < rows.columns.size(); ++f) {
      const Column& from = drawn[k].columns[f];
      if (from.ids.cols()) rows.columns[f].ids.row(i) = from.ids.row(next[k]);
      if (from.reals.cols()) rows.columns[f].reals.row(i) = from.reals.row(next[k]);
    }
    ++next[k];
  }
  return data.encode(std::move(rows), data.dims);
}

}  // namespace

const FamilySpec& mixture_family() {
  static const FamilySpec spec{.name = "mixture",
                               .title = "mixture",
                               .file_family = Mixture::kFamily,
                               .codec = {&params_to_json, &name_of, &from_json},
                               .data_of = &data_files_of,
                               .sample = &sample_mixture};
  return spec;
}

}  // namespace attnmix
