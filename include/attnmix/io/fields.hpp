// SPDX-License-Identifier: Apache-2.0
/// @file fields.hpp
/// The pieces of the data-file reader (io/rows.hpp): declared sizes and where they came from, where a row sits in
/// its file, the kind of file (chosen by content: a zip archive starts with "PK"), and strict exact-id parsing from
/// JSON values and .npz elements with messages that name the file, the line (JSONL, 1-based) or the array index
/// (npz, 0-based) and the field, so that every family reports the same problem in the same words.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/types.hpp"
#include "attnmix/inference/communicator.hpp"
#include "attnmix/io/npz.hpp"

namespace attnmix {

/// A declared dimension and where it came from ("the model", "--symbols", "line 1", "the training
/// data"), which messages quote: "context has 5 entries; expected N = 6 (from the model)".
struct Dim {
  int64_t value = 0;  ///< the size itself (S, N, D, T, …)
  std::string from;   ///< where it came from, as messages quote it after "from": "the model", "line 1"
};

/// Whether rows must carry a target (fit, score) or may omit it on every line (predict).
enum class TargetPolicy { kRequired, kOptional };

/// Where the rows of a data set came from, to point at a row in messages.
struct RowOrigin {
  std::string source;  ///< the file name
  bool is_npz = false;  ///< whether the rows came from an .npz archive (rows are then located by array index)
  std::vector<int64_t> line_of_row;  ///< JSONL: the 1-based line of each row
  int64_t first_row = 0;  ///< npz: the array index of row 0 (a stripe's offset in its file)
  /// "data.jsonl: line 7" or "data.npz: row 6".
  [[nodiscard]] std::string locate(Index row) const;
};

/// The rows of a data file that one process of a distributed fit reads (`attnmix fit` under mpirun,
/// `docs/mechanisms.md#training`): stripe `part` of `parts`. With L data rows (the non-blank lines of a JSON Lines
/// file, the first axis of the arrays of an .npz archive) it holds rows [part·L/parts,
/// (part+1)·L/parts) (integer division), so the stripes of parts 0, 1, … are consecutive and cover
/// the file. `shard`: the rows are one process's share of a data set, so an empty result is not an
/// error (the fit checks the count over every process). The default reads a whole file, which must
/// hold rows.
struct RowStripe {
  int part = 0;        ///< this process's stripe, in [0, parts) (its rank)
  int parts = 1;       ///< the number of stripes the rows are cut into (the number of processes), ≥ 1
  bool shard = false;  ///< whether the rows are one process's share, so that an empty stripe is not an error
  /// [begin, end) of the stripe among `rows` rows.
  [[nodiscard]] std::pair<int64_t, int64_t> range(int64_t rows) const {
    return {rows * part / parts, rows * (part + 1) / parts};
  }
};

/// Rethrows an impossible-evidence error as a ValueError naming the rows' file lines:
/// "data.jsonl: lines 3, 9: impossible evidence: …".
[[noreturn]] void rethrow_with_lines(const ImpossibleEvidenceError& error, const RowOrigin& origin);

/// The two kinds of data file: JSON Lines (kJsonLines) or a NumPy .npz archive (kNpz), told apart by content
/// (data_file_kind), never by the file's name.
enum class DataFileKind { kJsonLines, kNpz };

/// Opens `path` and tells JSON Lines from an .npz archive by its first bytes.
/// @throws std::runtime_error (missing, unreadable or a directory); ValueError for a bare .npy
/// array (`fields` lists the arrays an archive should hold, "keys=..., values=...", for the hint).
[[nodiscard]] DataFileKind data_file_kind(const std::string& path, std::string_view fields);

/// "N = 6 (from the model)".
[[nodiscard]] std::string dim_text(const char* symbol, const Dim& dim);

/// x with 17 significant digits, for quoting a bad value.
[[nodiscard]] std::string number_text(double x);

/// Range check of an exact id: ValueError "where: field: out-of-range ID v (must be in [0, S); S =
/// 16 (from …))", or "(ids must be >= 0)" for a negative id.
void check_id_range(int64_t id, const std::string& where, const std::string& field,
                    const char* symbol, const std::optional<Dim>& bound);

/// A real coordinate of a query: finite with magnitude at most check::kMaxMagnitude (1e+50), the bound within
/// which every distance the model computes stays finite. @throws ValueError naming where and the field.
[[nodiscard]] double bounded_real(double x, const std::string& where, const std::string& field);

/// A real that must be an exact integer id (integral floats such as 2.0 are accepted).
/// @throws ValueError for a non-finite, fractional or huge value.
[[nodiscard]] int64_t exact_real_id(double x, const std::string& where, const std::string& field);

/// A JSON value that must be an exact id in range. @throws TypeError (bool, string, …) or
/// ValueError (fractional, negative, out of range).
[[nodiscard]] int64_t json_id(const nlohmann::json& v, const std::string& where,
                              const std::string& field, const char* symbol,
                              const std::optional<Dim>& bound);

/// Element k of an npz id array, named `field` ("keys[2, 1]") in messages, checked against bound.
[[nodiscard]] int64_t npz_id(const NpyArray& a, size_t k, const std::string& path,
                             const std::string& field, const char* symbol,
                             const std::optional<Dim>& bound);

/// "context[2, 1]" (c ≥ 0) or "target[2]" (c < 0).
[[nodiscard]] std::string index_text(const char* name, int64_t r, int64_t c);

/// Checks the keys of one JSON Lines object: every key in `known` (else "unknown field 'x' (expected
/// …)"), every one of `required` present (else "missing field 'x'"). @throws ValueError when a check fails.
void check_json_fields(const nlohmann::json& object, const std::string& where,
                       const std::vector<std::string>& known, const std::vector<std::string>& required);

/// The same for the members of an .npz archive ("unknown array", "missing array").
void check_npz_arrays(const std::vector<std::string>& names, const std::string& path,
                      const std::vector<std::string>& known, const std::vector<std::string>& required);

/// Fixes a width dimension from the first row (`first_row` names it) when it is not declared, then
/// checks `width` against it: "where: keys has 4 entries; expected N = 5 (from line 1)".
/// @throws ValueError (also for an empty array).
void check_width(const char* what, const char* symbol, std::optional<Dim>& dim, size_t width,
                 const std::string& where, const std::string& first_row);

/// The largest `own` over the processes of a distributed fit (collective: every process calls it);
/// `own` itself without comm.
[[nodiscard]] inline int64_t max_over_ranks(const Communicator* comm, int64_t own) {
  if (!comm) return own;
  const std::vector<int64_t> all = comm->all_counts(own);
  return *std::max_element(all.begin(), all.end());
}

/// A dimension taken from the data as 1 + the largest id of some fields (S from the keys, values and queries, T
/// from the targets), remembering the first row that holds the largest id, so that a dimension too large for the
/// model can be traced to its row: Dim{S, "the largest key id at ca.jsonl: line 3, field keys"}. Ids are below
/// kMaxElements (check_id_range), so 1 + the largest never overflows.
class LargestId {
 public:
  /// Tracks no id yet. `what` names the ids in the dimension's origin ("the largest key, value or query id").
  explicit LargestId(std::string what) : what_(std::move(what)) {}
  /// Sees the ids of `field` in one row set (one row per matrix row; IdVector: one id per row).
  template <class Ids>
  void see(const Ids& ids, const RowOrigin& origin, const char* field) {
    if (ids.size() == 0 || ids.maxCoeff() <= largest_) return;
    largest_ = ids.maxCoeff();
    for (Index r = 0; r < ids.rows(); ++r)
      if (ids.row(r).maxCoeff() == largest_) {
        where_ = origin.locate(r) + ", field " + field;
        break;
      }
  }
  /// 1 + the largest id over every process of comm (collective; at least 1 when there are no ids). The row is
  /// named when this process holds it.
  [[nodiscard]] Dim dim(const Communicator* comm) const {
    const int64_t largest = max_over_ranks(comm, largest_);
    const bool here = largest == largest_ && !where_.empty();
    return Dim{std::max<int64_t>(largest, 0) + 1, what_ + (here ? " at " + where_ : "")};
  }

 private:
  std::string what_;
  int64_t largest_ = -1;
  std::string where_;
};

/// Tracks whether the lines of a JSON Lines file carry a target: every line or none (predict may
/// omit them; fit and score need them). @throws ValueError naming the line.
class TargetPresence {
 public:
  /// Nothing seen yet; policy says whether every line must carry a target.
  explicit TargetPresence(TargetPolicy policy) : policy_(policy) {}
  /// Records whether the line at `where` ("data.jsonl: line 3") carries a target. @throws ValueError "missing field
  /// 'target'" for a line without one under TargetPolicy::kRequired, and when this line differs from the first line
  /// seen (some lines with a target, some without).
  void see(bool has_target, const std::string& where);
  /// Whether the lines seen carry targets: the answer of the first line (true when no line has been seen).
  [[nodiscard]] bool has_targets() const { return seen_.value_or(true); }

 private:
  TargetPolicy policy_;
  std::optional<bool> seen_;
};

}  // namespace attnmix
