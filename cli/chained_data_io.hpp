// SPDX-License-Identifier: Apache-2.0
/// @file chained_data_io.hpp
/// Chained-attention data files (SPEC.md §1.10): JSON Lines
/// {"keys":[ids],"values":[ids],"query":id,"target":id} or a NumPy .npz archive with keys (n, N)
/// int, values (n, N) int, query (n,) int, target (n,) int. The format is chosen by content, as for
/// every family (data_fields.hpp).
///
/// Validation follows SPEC.md §1.2 with messages naming the file, the line (JSONL) or array index
/// (npz) and the field: a missing or unknown field, keys and values of different widths, a width
/// other than line 1's (or the declared N), bool, fractional, negative or out-of-range ids
/// (integral floats such as 2.0 are accepted), and an empty file.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/core/types.hpp"
#include "data_fields.hpp"

namespace attnmix::cli {

/// Dimensions the rows must respect; unset ones are taken from the data.
struct CaDims {
  std::optional<Dim> n_symbols;       // S: keys, values and queries must be < S
  std::optional<Dim> context_length;  // N: the width of keys and values
  std::optional<Dim> n_targets;       // T: targets must be < T
};

/// Validated rows, not yet encoded; the RowOrigin part locates them in their file.
struct CaRows : RowOrigin {
  IdMatrix keys;      // [n, N]
  IdMatrix values;    // [n, N]
  IdVector queries;   // [n]
  IdVector targets;   // [n]; zeros when !has_targets
  bool has_targets = true;
  [[nodiscard]] Index n_rows() const { return keys.rows(); }
};

/// Reads and validates a data file, or the stripe of its rows that `stripe` names. An empty shard
/// (stripe.shard) has the declared width N, or width 0 when N is not declared.
/// @throws ValueError / TypeError (content), std::runtime_error (I/O).
[[nodiscard]] CaRows read_ca_rows(const std::string& path, const CaDims& declared,
                                  TargetPolicy policy, const RowStripe& stripe = {});

/// Dimensions for a fit: declared values where given, otherwise N from the data, S = 1 + the
/// largest key, value or query and T = 1 + the largest target over all row sets of every process of
/// comm (collective; a distributed fit declares N).
[[nodiscard]] CaDims infer_ca_dims(const CaDims& declared,
                                   const std::vector<const CaRows*>& row_sets,
                                   const Communicator* comm = nullptr);

/// The encoded batch (rows already validated against dims). The row matrices move into the batch: pass
/// std::move(rows) when the rows are not needed afterwards, so that they are not copied.
[[nodiscard]] ChainedAttentionBatch encode_ca_rows(CaRows rows, const CaDims& dims);

}  // namespace attnmix::cli
