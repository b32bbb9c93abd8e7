// SPDX-License-Identifier: Apache-2.0
// The composite's family descriptor (family/spec.hpp): one model object without "format" per field in model files, the
// components' fields side by side in data files.
#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/stats/composite.hpp"

namespace attnmix {

namespace {

using nlohmann::json;

// params: components (model objects, one per field).
json params_to_json(const AnyDistribution& model) {
  json components = json::array();
  for (const AnyDistribution& c : model.get_if<Composite>()->components())
    components.push_back(model_object_to_json(c));
  return json{{"components", std::move(components)}};
}

std::string name_of(const AnyDistribution& model) { return model.get_if<Composite>()->name(); }

AnyDistribution from_json(const ModelJsonField& params, const std::string& name, const ModelJsonField* /*state*/) {
  constexpr std::array<std::string_view, 1> kRequired{"components"};
  params.expect_object(kRequired, {});
  std::vector<AnyDistribution> components;
  for (const ModelJsonField& c : params["components"].elements())
    components.push_back(model_object_from_json(c, /*top_level=*/false));
  return params.construct(Composite::kWhere,
                          [&] { return AnyDistribution(Composite(std::move(components), name)); });
}

// Data files: the components' fields side by side, component f's field "x" as "f<f>_x" and its sizes likewise
// ("f0_K"), so that two components of one family do not collide; a component's target is an ordinary field here.

std::string prefix_of(size_t f) {
  std::string prefix = "f";  // appended, not "f" + ...: GCC 12 warns falsely (-Wrestrict) on that form
  prefix += std::to_string(f);
  prefix += '_';
  return prefix;
}

std::string prefixed(size_t f, std::string_view name) {
  return name.empty() ? std::string() : prefix_of(f) + std::string(name);
}

// A schema whose names it owns.
struct OwnedSchema {
  std::deque<std::string> names;  // stable addresses for the fields' views
  RowSchema schema;
  std::string_view name(std::string text) { return names.emplace_back(std::move(text)); }
};

// The components' files and how many columns each takes.
struct Parts {
  std::vector<DataOf> data;
  std::vector<size_t> first_column;  // component f's columns: [first_column[f], first_column[f + 1])
};

DataOf data_files_of(const AnyDistribution& model) {
  auto parts = std::make_shared<Parts>();
  auto owned = std::make_shared<OwnedSchema>();
  Dims dims;
  const auto& components = model.get_if<Composite>()->components();
  for (size_t f = 0; f < components.size(); ++f) {
    DataOf part = attnmix::data_of(components[f]);
    parts->first_column.push_back(owned->schema.fields.size());
    for (DataField field : part.schema->fields) {
      field.name = owned->name(prefixed(f, field.name));
      field.width = owned->name(prefixed(f, field.width));
      field.bound = owned->name(prefixed(f, field.bound));
      field.pairs_with = owned->name(prefixed(f, field.pairs_with));
      field.target = false;
      owned->schema.fields.push_back(field);
    }
    for (const auto& [symbol, dim] : part.dims) dims.emplace(prefixed(f, symbol), dim);
    parts->data.push_back(std::move(part));
  }
  parts->first_column.push_back(owned->schema.fields.size());
  auto encode = [parts](Rows rows, const Dims& all) {
    std::vector<AnyBatch> fields;
    for (size_t f = 0; f < parts->data.size(); ++f) {
      Rows part;
      static_cast<RowOrigin&>(part) = rows;
      for (size_t c = parts->first_column[f]; c < parts->first_column[f + 1]; ++c)
        part.columns.push_back(std::move(rows.columns[c]));
      const std::string prefix = prefix_of(f);
      Dims own;
      for (const auto& [symbol, dim] : all)
        if (symbol.starts_with(prefix)) own.emplace(symbol.substr(prefix.size()), dim);
      fields.push_back(parts->data[f].encode(std::move(part), own));
    }
    return AnyBatch(CompositeBatch(std::move(fields)));
  };
  auto rows_of = [parts](const AnyBatch& any) {
    const CompositeBatch& batch = any.get<CompositeBatch>("composite rows");
    Rows rows;
    for (size_t f = 0; f < parts->data.size(); ++f)
      for (Column& column : parts->data[f].rows_of(batch.field(static_cast<Index>(f))).columns)
        rows.columns.push_back(std::move(column));
    return rows;
  };
  return {std::shared_ptr<const RowSchema>(owned, &owned->schema), std::move(dims), std::move(encode),
          std::move(rows_of)};
}

// m observations with the seeds of the library's CompositeSampler (field f's is the f-th draw of Rng(seed)), each field
// drawn by its component's family, so that a mixture can be a field; each with its component's own defaults.
AnyBatch sample(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> width) {
  if (width)
    throw ValueError(std::string(Composite::kWhere) +
                     ": a composite draws each field with its component's default context length; it takes none");
  const auto& components = model.get_if<Composite>()->components();
  Rng rng(seed);
  const std::vector<uint64_t> seeds = composite_field_seeds(rng, components.size());
  std::vector<AnyBatch> fields;
  for (size_t f = 0; f < components.size(); ++f) {
    const FamilySpec& family = spec_of(components[f]);
    fields.push_back(family.sample ? family.sample(components[f], m, seeds[f], std::nullopt)
                                   : components[f].sample(m, seeds[f]));  // the library's error
  }
  return AnyBatch(CompositeBatch(std::move(fields)));
}

}  // namespace

const FamilySpec& composite_family() {
  static const FamilySpec spec{.name = "composite",
                               .title = "composite",
                               .file_family = Composite::kFamily,
                               .codec = {&params_to_json, &name_of, &from_json},
                               .data_of = &data_files_of,
                               .sample = &sample};
  return spec;
}

}  // namespace attnmix
