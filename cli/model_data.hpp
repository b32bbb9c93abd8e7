// SPDX-License-Identifier: Apache-2.0
/// @file model_data.hpp
/// The bridge between a loaded model and data files, and the one place the CLI dispatches on a
/// model's family: which rows a model reads (checked against the model's own dimensions), how its
/// samples are drawn, and how they are written. Leaf families are responsibility attention,
/// chained attention, variational embedding attention and variational multi-hop attention (which
/// reads chained-attention rows), alone or as the components of a mixture; a family with a new
/// data schema adds one alternative to DataDims and one branch to each function here.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <variant>

#include "attnmix/core/any.hpp"
#include "chained_data_io.hpp"
#include "data_io.hpp"
#include "variational_data_io.hpp"

namespace attnmix::cli {

/// The dimensions of the data a model reads; the alternative names the data schema (CaDims: the
/// keys/values rows of chained and variational multi-hop attention).
using DataDims = std::variant<RaDims, CaDims, VeaDims>;

/// The data dimensions of a model (a leaf, or a mixture whose components are all of one family
/// with equal dimensions). @throws ValueError for other families.
[[nodiscard]] DataDims data_dims_of(const AnyDistribution& model);

/// Rows read for a model: where they came from, their targets, and the encoded batch.
struct ModelData {
  RowOrigin origin;
  bool has_targets = true;
  IdVector targets;  // [n]; zeros when !has_targets
  AnyBatch batch;
};

/// Reads `data_path` with the model's dimensions (ids out of the model's range are errors naming
/// file, line and field).
[[nodiscard]] ModelData read_model_data(const AnyDistribution& model, const std::string& data_path,
                                        TargetPolicy policy);

/// m observations from the model's sampler. `context_length`: chained and variational multi-hop
/// attention draw contexts of that length (default: their samplers', 6); responsibility and
/// variational embedding attention have a fixed N, which it must equal. @throws UsageError on a
/// context length the model cannot use; ValueError for a family without a sampler.
[[nodiscard]] AnyBatch draw_samples(const AnyDistribution& model, Index m, uint64_t seed,
                                    std::optional<int64_t> context_length);

/// Writes every row of a batch drawn from `model` as one JSON Lines observation, in the data-file
/// format of the model's family.
void write_jsonl(std::ostream& out, const AnyDistribution& model, const AnyBatch& batch);

}  // namespace attnmix::cli
