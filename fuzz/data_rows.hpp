// SPDX-License-Identifier: Apache-2.0
/// @file data_rows.hpp
/// The data-file path of `attnmix fit`, `score` and `predict` for one family, on a file of fuzzed bytes: read and
/// validate the rows by the family's schema (io/rows.hpp; JSON Lines or .npz, chosen by content), take the missing
/// sizes from the data, and encode the batch with the family's encoder. The mode byte of an input chooses the
/// family, whether sizes are declared (as a model or --symbols/--context-length flags would), the target policy and
/// the stripe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/io/rows.hpp"

namespace attnmix::fuzz {

/// What the mode byte of an input chooses. Bits 0-1: the family (0 responsibility, 1 chained, 2 variational
/// embedding, 3 the format layer alone: the target decides what that reads); bit 2: sizes are declared;
/// bit 3: targets are optional (predict); bits 4-5: the stripe count (1-3, 0 also 1); bits 6-7: the part.
struct DataMode {
  int family = 0;
  bool declared = false;
  TargetPolicy policy = TargetPolicy::kRequired;
  RowStripe stripe;

  explicit DataMode(uint8_t mode) {
    family = mode & 3;
    declared = (mode >> 2) & 1;
    policy = (mode >> 3) & 1 ? TargetPolicy::kOptional : TargetPolicy::kRequired;
    const int parts = std::max(1, (mode >> 4) & 3);
    stripe = RowStripe{((mode >> 6) & 3) % parts, parts, parts > 1};
  }
};

/// Reads, infers and encodes the rows of `path` for mode.family 0-2 (as `attnmix fit` does before the model is
/// built), with small declared sizes (as a model of the tests' fixtures would give them) when mode.declared. Only
/// the reader's rejections may escape (fuzz_support.hpp).
inline void read_and_encode(const DataMode& mode, const std::string& path) {
  const FamilySpec& family = mode.family == 0   ? responsibility_attention_family()
                             : mode.family == 1 ? chained_attention_family()
                                                : variational_embedding_attention_family();
  Dims declared;
  if (mode.declared) {
    const std::pair<const char*, int64_t> sizes[] = {{"S", 8}, {"N", 3}, {"D", 2}, {"T", 5}};
    for (const auto& [symbol, value] : sizes) declared[symbol] = Dim{value, "the fuzz target"};
  }
  Rows rows = read_rows(path, *family.schema, declared, mode.policy, mode.stripe);
  if (rows.n_rows() == 0) return;  // an empty shard: the fit counts rows over every process
  const Dims dims = infer_dims(*family.schema, declared, {&rows});
  (void)family.encode(std::move(rows), dims);
}

}  // namespace attnmix::fuzz
