// SPDX-License-Identifier: Apache-2.0
/// @file model_data.hpp
/// The bridge between a loaded model and data files: which rows a model reads, checked against the
/// model's own dimensions, and how its samples are written. Responsibility attention is the only
/// leaf family so far, alone or as the components of a mixture; later families add a branch here.
#pragma once

#include <ostream>
#include <string>

#include "attnmix/core/any.hpp"
#include "data_io.hpp"

namespace attnmix::cli {

/// Rows read for a model, and the same rows encoded as the model's batch.
struct ModelData {
  RaRows rows;
  AnyBatch batch;
};

/// The RA dimensions of a model (RA itself, or a mixture whose components are all RA with equal
/// dimensions).
/// @throws ValueError for other families.
[[nodiscard]] RaDims ra_dims_of(const AnyDistribution& model);

/// Reads `data_path` with the model's dimensions (ids out of the model's range are errors naming
/// file and line).
[[nodiscard]] ModelData read_model_data(const AnyDistribution& model, const std::string& data_path,
                                        TargetPolicy policy);

/// Writes every row of a sampled batch as one JSON Lines observation.
void write_jsonl(std::ostream& out, const AnyBatch& batch);

}  // namespace attnmix::cli
