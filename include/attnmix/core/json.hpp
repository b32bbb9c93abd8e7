// SPDX-License-Identifier: Apache-2.0
/// @file json.hpp
/// Model files (SPEC.md §1.10): a model is saved as one JSON document
///   {"format": "attnmix-model", "schema_version": 1, "family": "<family>", "name": "…" (optional),
///    "params": {…}, "optimizer_state": {…} (variational families)}
/// whose params are the validating constructor's arguments under their Python names; the
/// variational families (SPEC.md §4, §5) store their Adam state beside params
/// (optimizer_state_to_json). Loading always goes through that constructor, so a loaded model is a
/// validated model. Doubles are written in the shortest decimal form that reads back to the same
/// bits (at most 17 significant digits), so load(save(m)) is bit-identical.
///
/// Families register in one table (json.cpp, `kCodecs`): a family joins the model-file format by
/// adding one ModelCodec, i.e. one to_json/from_json pair written with ModelJsonField. Mixtures
/// store their components as model objects without the "format" field, so a mixture of any
/// registered family is saved without extra code. Format reference with an example:
/// docs/model-format.md.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

inline constexpr const char* kModelFormat = "attnmix-model";
inline constexpr int kModelSchemaVersion = 1;

/// The whole model document, "format" and "schema_version" included.
/// @throws ValueError when the model's family has no model-file format.
[[nodiscard]] nlohmann::json model_to_json(const AnyDistribution& model);

/// Rebuilds a model through its family's validating constructor. `source` (usually the file name)
/// starts every error message, followed by the field path: "model.json: params.emission row 3 must
/// sum to 1 within 1e-12 (…)".
/// @throws ValueError on a wrong format / schema_version / family, a missing or unknown field, a
/// non-numeric
///         entry, a ragged array, or parameters the constructor rejects.
[[nodiscard]] AnyDistribution model_from_json(const nlohmann::json& doc, std::string_view source);

/// Writes the model atomically: a temporary file in the same directory, fsync, then rename over
/// `path`. On any failure the temporary file is removed and an existing file at `path` is left
/// untouched.
/// @throws std::runtime_error (naming the path and the reason) on I/O failure; ValueError as
/// model_to_json.
void save_model(const AnyDistribution& model, const std::string& path);

/// Parses the text of a model file (what load_model reads) into a document. Stricter than JSON itself: a NUL byte
/// anywhere (JSON parsers stop at one, so what follows it would go unread) and a key that appears twice in one
/// object (JSON keeps the last silently) are errors.
/// @throws ValueError "<source>: line L, column C: …" for a NUL byte or a duplicate key (naming it), and
///         "<source>: not a valid JSON document: …" (with nlohmann's line and column) for malformed JSON.
[[nodiscard]] nlohmann::json parse_model_text(const std::string& text, std::string_view source);

/// Reads and validates a model file.
/// @throws std::runtime_error when the file cannot be read; ValueError (naming the file and the
/// field) on bad
///         content, including malformed JSON.
[[nodiscard]] AnyDistribution load_model(const std::string& path);

/// The text save_model writes: objects indented, one matrix row per line, numbers as nlohmann dumps
/// them.
[[nodiscard]] std::string format_model_json(const nlohmann::json& doc);

// ----- writing a family's codec
// ---------------------------------------------------------------------------------

/// A read-only view of one JSON value at a known path in a known source, with typed accessors whose
/// errors name both: "model.json: params.key_means: row 2 has 3 entries (row 0 has 4)". Every
/// accessor throws ValueError.
class ModelJsonField {
 public:
  ModelJsonField(const nlohmann::json& value, std::string source, std::string path);

  [[nodiscard]] const nlohmann::json& value() const noexcept { return *value_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The file (or other source) the value was read from.
  [[nodiscard]] const std::string& source() const noexcept { return source_; }
  /// "source: path: message" (or "source: message" at the root).
  [[nodiscard]] std::string where(std::string_view message) const;
  [[noreturn]] void fail(std::string_view message) const;

  /// This value must be an object whose keys are all in `required` or `optional`; every required
  /// key present.
  void expect_object(std::span<const std::string_view> required,
                     std::span<const std::string_view> optional) const;
  [[nodiscard]] bool has(std::string_view key) const;
  /// The member `key` (which must exist).
  [[nodiscard]] ModelJsonField operator[](std::string_view key) const;
  /// The elements of this array.
  [[nodiscard]] std::vector<ModelJsonField> elements() const;

  [[nodiscard]] double as_double() const;
  /// A JSON integer in int64's range; a float (1e15, 3.0) is rejected naming the field.
  [[nodiscard]] int64_t as_int() const;
  [[nodiscard]] std::string as_string() const;
  /// A 1-D array of numbers.
  [[nodiscard]] Vector as_vector() const;
  /// A 2-D array of numbers (a list of equally long rows).
  [[nodiscard]] Matrix as_matrix() const;

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
  [[noreturn]] void rethrow_constructor_error(std::string_view family_where,
                                              std::string_view message) const;
  const nlohmann::json* value_;
  std::string source_;
  std::string path_;
};

/// A matrix as a list of rows, a vector as a list (doubles in shortest round-trip form).
[[nodiscard]] nlohmann::json matrix_to_json(const Matrix& m);
[[nodiscard]] nlohmann::json vector_to_json(const Vector& v);

/// One family's entry in the model-file registry.
struct ModelCodec {
  /// The family name in files, equal to AnyDistribution::family() ("responsibility_attention",
  /// ...).
  const char* family;
  /// params of the model (the constructor's arguments under their Python names); the name goes
  /// beside them.
  nlohmann::json (*params_to_json)(const AnyDistribution& model);
  /// The model's name ("" when unnamed; then no "name" field is written).
  std::string (*name_of)(const AnyDistribution& model);
  /// Builds the model through its validating constructor from `params`, the optional name and the
  /// optional "optimizer_state" sibling of params (null when the object has none).
  AnyDistribution (*from_json)(const ModelJsonField& params, const std::string& name,
                               const ModelJsonField* optimizer_state);
  /// The "optimizer_state" written beside params, or null for families without one (a file of such
  /// a family that carries the field is rejected).
  nlohmann::json (*state_to_json)(const AnyDistribution& model) = nullptr;
};

/// The registered families, in registration order.
[[nodiscard]] std::span<const ModelCodec> model_codecs();

/// Serialises one model object without "format" (what a mixture stores per component).
[[nodiscard]] nlohmann::json model_object_to_json(const AnyDistribution& model);
/// Reads one model object; `top_level` requires "format" and "schema_version", otherwise they are
/// optional.
[[nodiscard]] AnyDistribution model_object_from_json(const ModelJsonField& object, bool top_level);

}  // namespace attnmix
