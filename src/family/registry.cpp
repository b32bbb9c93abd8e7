// SPDX-License-Identifier: Apache-2.0
// The library's one list of families (family/spec.hpp). Adding a family adds one line here.
#include <array>
#include <string>
#include <utility>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/sparse_responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/stats/categorical.hpp"
#include "attnmix/stats/composite.hpp"
#include "attnmix/stats/gaussian.hpp"
#include "attnmix/stats/mixture.hpp"

namespace attnmix {

std::span<const FamilySpec* const> families() {
  static const std::array<const FamilySpec*, 9> kFamilies{
      &responsibility_attention_family(),
      &chained_attention_family(),
      &variational_embedding_attention_family(),
      &variational_multihop_attention_family(),
      &sparse_responsibility_attention_family(),
      &mixture_family(),
      &categorical_family(),
      &diagonal_gaussian_family(),
      &composite_family(),
  };
  return kFamilies;
}

const FamilySpec* family_of_file(std::string_view file_family) {
  for (const FamilySpec* spec : families())
    if (spec->file_family == file_family) return spec;
  return nullptr;
}

const FamilySpec& spec_of(const AnyDistribution& model) {
  if (!model.has_value()) throw ValueError("attnmix: an empty model has no family");
  const std::string family = model.family();
  if (const FamilySpec* spec = family_of_file(family)) return *spec;
  throw ValueError("attnmix: family '" + family + "' is not registered (known: " + file_families_text() + ")");
}

DataOf::DataOf(const FamilySpec* family, Dims fixed)
    : schema(family->schema, [](const RowSchema*) {}),  // a family's schema is static: not owned
      dims(std::move(fixed)),
      encode(family->encode),
      rows_of(family->rows_of) {}

DataOf::DataOf(std::shared_ptr<const RowSchema> fields, Dims fixed, std::function<AnyBatch(Rows, const Dims&)> encoder,
               std::function<Rows(const AnyBatch&)> writer)
    : schema(std::move(fields)), dims(std::move(fixed)), encode(std::move(encoder)), rows_of(std::move(writer)) {}

DataOf data_of(const AnyDistribution& model) {
  const FamilySpec& spec = spec_of(model);
  if (!spec.data_of) throw ValueError("models of family '" + model.family() + "' cannot read data files in this build");
  return spec.data_of(model);
}

std::string file_families_text() {
  std::string out;
  for (const FamilySpec* spec : families()) out += (out.empty() ? "" : ", ") + std::string(spec->file_family);
  return out;
}

}  // namespace attnmix
