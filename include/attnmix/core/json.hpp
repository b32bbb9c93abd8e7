// SPDX-License-Identifier: Apache-2.0
/// @file json.hpp
/// Reading and writing the JSON of model files (io/model_file.hpp) without losing a bit or an error's location:
/// ModelJsonField, a read-only view of one value at a known path in a known source whose typed accessors name both
/// in every error, and the writers of matrices and vectors (doubles in the shortest decimal form that reads back to
/// the same bits, at most 17 significant digits). A family's model-file codec (family/spec.hpp) is written with
/// these.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnmix/core/types.hpp"

namespace attnmix {

/// A table in the sparse-rows layout: R × C cells, where row r lists the cells whose columns are the entries k of
/// columns with row_begin[r] ≤ k < row_begin[r + 1] (increasing), holding values[k], and every other cell of the row
/// holds defaults[r].
struct SparseRows {
  Index rows = 0;                  ///< R
  Index cols = 0;                  ///< C
  Vector defaults;                 ///< [R]
  std::vector<int64_t> row_begin;  ///< [R + 1], from 0 to the number of listed cells
  std::vector<int64_t> columns;    ///< the listed cells' columns, row by row
  Vector values;                   ///< the listed cells' values, in the order of columns
};

/// A read-only view of one JSON value at a known path in a known source, with typed accessors whose
/// errors name both: "model.json: params.key_means: row 2 has 3 entries (row 0 has 4)". Every
/// accessor throws ValueError.
class ModelJsonField {
 public:
  /// A view of value, which is not copied and must outlive this field and every field derived from it. source
  /// names the file in messages ("model.json"); path is the field path from the root ("params.key_means"), "" at
  /// the root.
  ModelJsonField(const nlohmann::json& value, std::string source, std::string path);

  /// The JSON value viewed.
  [[nodiscard]] const nlohmann::json& value() const noexcept { return *value_; }
  /// The field path from the document's root, such as "params.components[1].params.emission"; "" at the root.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The file (or other source) the value was read from.
  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  /// "source: path: message" (or "source: message" at the root).
  [[nodiscard]] std::string where(std::string_view message) const;
  /// Throws ValueError(where(message)).
  [[noreturn]] void fail(std::string_view message) const;

  /// This value must be an object whose keys are all in `required` or `optional`; every required
  /// key present.
  void expect_object(std::span<const std::string_view> required,
                     std::span<const std::string_view> optional) const;
  /// Whether this value is an object with a member `key` (false for a value that is not an object).
  [[nodiscard]] bool has(std::string_view key) const;
  /// The member `key` (which must exist).
  [[nodiscard]] ModelJsonField operator[](std::string_view key) const;
  /// The elements of this array.
  [[nodiscard]] std::vector<ModelJsonField> elements() const;

  /// A finite JSON number (an integer is accepted); any other value, or a number beyond the range of a double, is
  /// rejected naming the field.
  [[nodiscard]] double as_double() const;
  /// A JSON integer in int64's range; a float (1e15, 3.0) is rejected naming the field.
  [[nodiscard]] int64_t as_int() const;
  /// A JSON string.
  [[nodiscard]] std::string as_string() const;
  /// A 1-D array of numbers.
  [[nodiscard]] Vector as_vector() const;
  /// A 2-D array of numbers (a list of equally long rows), or a table in the sparse-rows layout (table_to_json).
  [[nodiscard]] Matrix as_matrix() const;
  /// A table in the sparse-rows layout (sparse_rows_to_json), every member checked: one default, column list and
  /// value list per row, each row's columns increasing within [0, C), as many values as columns, and at most
  /// kSparseCellsPerNumber cells per number the file holds (so that a small file never implies a huge table). It builds
  /// no dense table, so R × C may exceed kSparseTableMaxCells.
  [[nodiscard]] SparseRows as_sparse_rows() const;

  /// Runs a validating constructor; its TypeError/ValueError is rethrown as a ValueError naming
  /// this field. When the message starts with "<family_where>: <member> …" for a member of this
  /// object, the message becomes "source: path.<member> …".
  template <class F>
  [[nodiscard]] auto construct(std::string_view family_where, F&& make) const -> decltype(make()) {
    try {
      return make();
    } catch (const std::invalid_argument& e) {
      rethrow_constructor_error(family_where, e.what());
    }
  }

 private:
  /// as_sparse_rows(); with dense_limits, a table of more than kSparseTableMaxCells cells is refused too. Both limits
  /// are checked before the rows are read.
  [[nodiscard]] SparseRows sparse_rows(bool dense_limits) const;
  /// as_matrix() of an object: sparse_rows(true) made dense.
  [[nodiscard]] Matrix as_sparse_table() const;
  [[noreturn]] void rethrow_constructor_error(std::string_view family_where,
                                              std::string_view message) const;
  const nlohmann::json* value_;
  std::string source_;
  std::string path_;
};

/// A matrix as a list of rows, a vector as a list (doubles in shortest round-trip form).
[[nodiscard]] nlohmann::json matrix_to_json(const Matrix& m);

/// The fewest cells of a table that table_to_json writes in the sparse-rows layout (smaller tables stay readable).
inline constexpr Index kSparseTableMinCells = 4096;
/// The most cells a table in the sparse-rows layout may imply: 2^27, 1 GiB as float64. The loader builds the dense
/// table, so a larger one is refused, and table_to_json writes larger tables as lists of rows.
inline constexpr Index kSparseTableMaxCells = Index{1} << 27;
/// The most cells a table in the sparse-rows layout may imply per number it holds (its defaults and listed values),
/// so that a small file never makes the loader build a large table: a text model's tables imply a few hundred.
inline constexpr Index kSparseCellsPerNumber = 1024;

/// The sparse-rows layout of a table (see table_to_json). O(R + listed cells).
[[nodiscard]] nlohmann::json sparse_rows_to_json(const SparseRows& table);

/// A parameter table as matrix_to_json writes it, or, when it has kSparseTableMinCells to kSparseTableMaxCells cells
/// of which at most a quarter differ from their row's most frequent value (and at most kSparseCellsPerNumber per
/// number written), in the sparse-rows layout:
///   {"layout": "sparse_rows", "shape": [R, C], "default": [R values],
///    "columns": [R lists of increasing column indices], "values": [R lists of the values there]}
/// where every cell not listed holds its row's default. Both read back bit for bit through as_matrix(); the
/// sparse layout grows with the cells that differ from the defaults (the observed pairs of a text model), not R × C.
/// O(R·C·log C).
[[nodiscard]] nlohmann::json table_to_json(const Matrix& m);
/// Whether a JSON value is a table in the sparse-rows layout (what makes a model file schema version 2).
[[nodiscard]] bool is_sparse_table(const nlohmann::json& v);
/// A vector as a JSON array of its entries (doubles in shortest round-trip form), what ModelJsonField::as_vector
/// reads back bit for bit.
[[nodiscard]] nlohmann::json vector_to_json(const Vector& v);

}  // namespace attnmix
