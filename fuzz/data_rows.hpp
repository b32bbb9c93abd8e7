// SPDX-License-Identifier: Apache-2.0
/// @file data_rows.hpp
/// The data-file path of `attnmix fit`, `score` and `predict` for one family, on a file of fuzzed bytes: read and
/// validate the rows (JSON Lines or .npz, chosen by content as the CLI does), take the missing dimensions from
/// the data, and encode the batch. The mode byte of an input chooses the family, whether dimensions are
/// declared (as a model or --symbols/--context-length flags would), the target policy and the stripe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "chained_data_io.hpp"
#include "data_fields.hpp"
#include "data_io.hpp"
#include "variational_data_io.hpp"

namespace attnmix::fuzz {

/// What the mode byte of an input chooses. Bits 0-1: the family (0 responsibility, 1 chained, 2 variational
/// embedding, 3 the format layer alone: the target decides what that reads); bit 2: dimensions are declared;
/// bit 3: targets are optional (predict); bits 4-5: the stripe count (1-3, 0 also 1); bits 6-7: the part.
struct DataMode {
  int family = 0;
  bool declared = false;
  cli::TargetPolicy policy = cli::TargetPolicy::kRequired;
  cli::RowStripe stripe;

  explicit DataMode(uint8_t mode) {
    family = mode & 3;
    declared = (mode >> 2) & 1;
    policy = (mode >> 3) & 1 ? cli::TargetPolicy::kOptional : cli::TargetPolicy::kRequired;
    const int parts = std::max(1, (mode >> 4) & 3);
    stripe = cli::RowStripe{((mode >> 6) & 3) % parts, parts, parts > 1};
  }
};

/// Small declared dimensions, as a model of the tests' fixtures would give them.
inline std::optional<cli::Dim> declared_dim(bool declared, int64_t value) {
  if (!declared) return std::nullopt;
  return cli::Dim{value, "the fuzz target"};
}

/// Reads, infers and encodes the rows of `path` for mode.family 0-2 (as `attnmix fit` does before the model is
/// built). Only the CLI's rejections may escape (fuzz_support.hpp).
inline void read_and_encode(const DataMode& mode, const std::string& path) {
  switch (mode.family) {
    case 0: {
      const cli::RaDims declared{declared_dim(mode.declared, 8), declared_dim(mode.declared, 3),
                                 declared_dim(mode.declared, 2), declared_dim(mode.declared, 5)};
      cli::RaRows rows = cli::read_ra_rows(path, declared, mode.policy, mode.stripe);
      if (rows.n_rows() == 0) return;  // an empty shard: the fit counts rows over every process
      const cli::RaDims dims = cli::infer_ra_dims(declared, {&rows});
      (void)cli::encode_ra_rows(std::move(rows), dims);
      return;
    }
    case 1: {
      const cli::CaDims declared{declared_dim(mode.declared, 8), declared_dim(mode.declared, 3),
                                 declared_dim(mode.declared, 5)};
      cli::CaRows rows = cli::read_ca_rows(path, declared, mode.policy, mode.stripe);
      if (rows.n_rows() == 0) return;
      const cli::CaDims dims = cli::infer_ca_dims(declared, {&rows});
      (void)cli::encode_ca_rows(std::move(rows), dims);
      return;
    }
    default: {
      const cli::VeaDims declared{declared_dim(mode.declared, 8), declared_dim(mode.declared, 3),
                                  declared_dim(mode.declared, 5)};
      cli::VeaRows rows = cli::read_vea_rows(path, declared, mode.policy, mode.stripe);
      if (rows.n_rows() == 0) return;
      const cli::VeaDims dims = cli::infer_vea_dims(declared, {&rows});
      (void)cli::encode_vea_rows(std::move(rows), dims);
      return;
    }
  }
}

}  // namespace attnmix::fuzz
