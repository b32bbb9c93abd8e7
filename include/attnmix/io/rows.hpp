// SPDX-License-Identifier: Apache-2.0
/// @file rows.hpp
/// Data files read by a family's schema: JSON Lines (one object per line, a key per field) or a NumPy .npz archive
/// (an array per field, row r of every array is observation r), told apart by content (a zip archive starts with
/// "PK"). One reader serves every family: the schema names each field's kind (integer ids or real numbers), its
/// width (one value per row, or a row of a width every row shares, such as N), the size its ids must stay below
/// (S, T) and which field is the optional target. Every error names the file, the line (JSON Lines, 1-based) or
/// the array index (.npz, 0-based) and the field, in the words of io/fields.hpp, whatever the family: a missing or
/// unknown field, a ragged row, paired fields of different widths, bool, fractional, negative or out-of-range ids
/// (integral floats such as 2.0 are accepted), non-numeric or unbounded reals, an empty file.
///
/// A field of reals may accept symbols instead (DataField::symbols): one id q below its width per row, standing for
/// the one-hot row e_q (a JSON Lines integer, an .npz integer array of shape (n,)); every row of a file gives the
/// field the same way.
///
/// A process of a distributed fit reads one stripe of the rows (RowStripe); sizes a file does not declare come from
/// the data (infer_dims): widths from the first row, bounds as 1 + the largest id over every row set and process.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "attnmix/core/types.hpp"
#include "attnmix/inference/communicator.hpp"
#include "attnmix/io/fields.hpp"

namespace attnmix {

/// What a data field holds: integer ids (kIds; integral floats such as 2.0 are accepted and converted) or real
/// numbers (kReals; finite, magnitude at most 1e+50).
enum class DataKind { kIds, kReals };

/// One field of a family's observations: a JSON Lines key and the .npz array of the same name.
struct DataField {
  std::string_view name = {};        ///< "context"
  DataKind kind = DataKind::kIds;     ///< whether the field holds ids or reals
  std::string_view width = {};       ///< the size every row's width must equal ("N", "D"); "" for one value per row
  std::string_view bound = {};       ///< ids: the size every id must stay below ("S", "T")
  std::string_view noun = {};        ///< ids: how "the largest … id" names it ("key" for keys)
  std::string_view pairs_with = {};  ///< a field that must have the same width, position by position ("keys")
  bool symbols = false;              ///< reals with a width: rows may give one id below the width instead (one-hot)
  bool target = false;               ///< the field that rows may all go without (predict); at most one, the last

  /// Equal names, kinds, sizes and pairing.
  [[nodiscard]] bool operator==(const DataField&) const = default;
};

/// A family's data files: its fields, in file order.
struct RowSchema {
  /// The fields in file order, which is also the order of Rows::columns and of the keys write_json_lines writes; the
  /// target field, if any, is the last.
  std::vector<DataField> fields;

  /// The field called `name`. @throws ValueError (a schema without it is a programming error).
  [[nodiscard]] const DataField& field(std::string_view name) const;
  /// "context=..., query=..., target=...": the arguments of numpy.savez that make an archive of this schema.
  [[nodiscard]] std::string savez_arguments() const;
  /// The same fields in the same order.
  [[nodiscard]] bool operator==(const RowSchema&) const = default;
};

/// Sizes by symbol ("S", "N", …), each with where it came from; a size that is absent is taken from the data.
using Dims = std::map<std::string, Dim, std::less<>>;

/// One field's values over the rows: ids or reals, rows × width (width 1 for a one-value field).
struct Column {
  IdMatrix ids;  ///< the values of an ids field, rows × width, or a symbols field's ids, rows × 1; else empty (0 × 0)
  Matrix reals;  ///< the values of a reals field, rows × width; empty (0 × 0) for an ids field or given symbols
  /// Whether a DataField::symbols field holds symbols (in ids) rather than reals.
  [[nodiscard]] bool holds_symbols() const noexcept { return ids.rows() > 0 && reals.size() == 0; }
};

/// Validated rows of a data file, not yet encoded; the RowOrigin part locates them in their file.
struct Rows : RowOrigin {
  std::vector<Column> columns;  ///< one per schema field, in order; the target's is zeros when !has_targets
  /// Whether the rows carry the schema's target field: false when every row goes without it (TargetPolicy::kOptional)
  /// or the schema has no target field.
  bool has_targets = true;
  /// The number of rows: the row count of the first column (0 without columns).
  [[nodiscard]] Index n_rows() const;
};

/// Column k's ids as a vector (a one-value field: one id per row).
[[nodiscard]] IdVector id_vector(const Column& column);

/// Reads and validates a data file, or the stripe of its rows that `stripe` names, against the declared sizes.
/// An empty shard (stripe.shard) has the declared widths, or width 0 where they are not declared.
/// @throws ValueError (or TypeError) (content), std::runtime_error (I/O).
[[nodiscard]] Rows read_rows(const std::string& path, const RowSchema& schema, const Dims& declared,
                             TargetPolicy policy, const RowStripe& stripe = {});

/// The sizes of a fit: the declared ones, the widths of the first row set that are not declared, and every
/// undeclared bound as 1 + the largest id of its fields over all row sets of every process of comm (collective; at
/// least 1). The width of a DataField::symbols field is the larger of its real rows' width and 1 + its largest symbol
/// over every row set and process. Each size says where it came from ("the largest key, value or query id at
/// a.jsonl: line 3, field keys").
[[nodiscard]] Dims infer_dims(const RowSchema& schema, const Dims& declared, const std::vector<const Rows*>& row_sets,
                              const Communicator* comm = nullptr);

/// The widths of rows: each width size with the width of its first field in the rows (0 for a field given as
/// symbols, whose width the rows do not show). The same sizes, in the same order, for any rows of a schema.
[[nodiscard]] std::vector<std::pair<std::string_view, Index>> row_widths(const RowSchema& schema, const Rows& rows);

/// Gives rows without data the width `width` for every field whose width is `symbol`.
void set_empty_width(const RowSchema& schema, Rows& rows, std::string_view symbol, Index width);

/// Calls write(line) with every row of `rows` as one JSON Lines object in the schema's field order (ids as
/// integers, reals as shortest round-trip numbers; a one-value field unwrapped; the target only when has_targets).
void write_json_lines(const RowSchema& schema, const Rows& rows, const std::function<void(const std::string&)>& write);

}  // namespace attnmix
