// SPDX-License-Identifier: Apache-2.0
/// @file data_io.hpp
/// Responsibility-attention data files (SPEC.md §1.10): JSON Lines
/// {"context":[ids],"query":[reals],"target":id} or a NumPy .npz archive with context (n, N) int,
/// query (n, D) float, target (n,) int. The format is chosen by content (a zip archive starts with
/// "PK"), not by file name.
///
/// Validation follows SPEC.md §1.2, with messages naming the file, the line (JSONL, 1-based) or the
/// array index (npz, 0-based) and the field: a missing or unknown field, a ragged context (a width
/// other than line 1's or the declared N), bool ids, fractional, negative or out-of-range ids
/// (integral floats such as 2.0 are accepted), non-numeric or non-finite queries, a wrong D, and an
/// empty file. Errors are attnmix::ValueError (content) or std::runtime_error (the file cannot be
/// read). The parsing shared with the other families lives in data_fields.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/types.hpp"
#include "data_fields.hpp"

namespace attnmix::cli {

/// Dimensions the rows must respect; unset ones are taken from the data.
struct RaDims {
  std::optional<Dim> n_symbols;       // S: context ids must be < S
  std::optional<Dim> context_length;  // N
  std::optional<Dim> query_dim;       // D
  std::optional<Dim> n_targets;       // T: targets must be < T
};

/// Validated rows, not yet encoded; the RowOrigin part locates them in their file.
struct RaRows : RowOrigin {
  IdMatrix contexts;  // [n, N]
  Matrix queries;     // [n, D]
  IdVector targets;   // [n]; zeros when !has_targets
  bool has_targets = true;
  [[nodiscard]] Index n_rows() const { return contexts.rows(); }
};

/// Reads and validates a data file, or the stripe of its rows that `stripe` names. An empty shard
/// (stripe.shard) has the declared widths, or none (width 0) when they are not declared.
/// @throws ValueError / TypeError (content), std::runtime_error (I/O).
[[nodiscard]] RaRows read_ra_rows(const std::string& path, const RaDims& declared,
                                  TargetPolicy policy, const RowStripe& stripe = {});

/// Dimensions for a fit: declared values where given, otherwise N and D from the data and S, T from
/// the largest ids of all row sets (training and validation) of every process of comm (collective;
/// a distributed fit declares N and D: the first row set of a process may be empty).
[[nodiscard]] RaDims infer_ra_dims(const RaDims& declared,
                                   const std::vector<const RaRows*>& row_sets,
                                   const Communicator* comm = nullptr);

/// The encoded batch (rows already validated against dims). The row matrices move into the batch: pass
/// std::move(rows) when the rows are not needed afterwards, so that they are not copied.
[[nodiscard]] ResponsibilityAttentionBatch encode_ra_rows(RaRows rows, const RaDims& dims);

}  // namespace attnmix::cli
