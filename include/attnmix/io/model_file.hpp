// SPDX-License-Identifier: Apache-2.0
/// @file model_file.hpp
/// Model files: a model is saved as one JSON document
///   {"format": "attnmix-model", "schema_version": 1 or 2, "family": "<family>", "name": "…" (optional),
///    "params": {…}, "optimizer_state": {…} (variational families)}
/// Version 2 is a version-1 document whose params hold a table in the sparse-rows layout (core/json.hpp
/// table_to_json: large tables whose cells are mostly their row's default, as in a model of a text corpus); a model
/// without one is written as version 1, which earlier builds read.
/// whose params are the validating constructor's arguments under their Python names, written and read by the
/// family's codec, which this file finds through the family registry (family/spec.hpp). Loading always goes
/// through that constructor, so a loaded model is a validated model. Doubles are written in the shortest decimal
/// form that reads back to the same bits, so load(save(m)) is bit-identical. Mixtures and composites store their
/// components as model objects without "format". Format reference with an example: docs/model-format.md.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "attnmix/core/any.hpp"
#include "attnmix/core/json.hpp"

namespace attnmix {

/// The value of a model file's "format" field, which every model file starts with (`docs/model-format.md`).
inline constexpr const char* kModelFormat = "attnmix-model";
/// The newest "schema_version" this build writes and reads (it reads 1 and 2); a document of another version is
/// refused.
inline constexpr int kModelSchemaVersion = 2;

/// The whole model document, "format" and "schema_version" included.
/// @throws ValueError when the model handle is empty or its family has no model-file format (is not registered).
[[nodiscard]] nlohmann::json model_to_json(const AnyDistribution& model);

/// Rebuilds a model through its family's validating constructor. `source` (usually the file name) starts every
/// error message, followed by the field path: "model.json: params.emission row 3 must sum to 1 within 1e-12 (…)".
/// @throws ValueError on a wrong format / schema_version / family, a missing or unknown field, a non-numeric entry,
///         a ragged array, or parameters the constructor rejects.
[[nodiscard]] AnyDistribution model_from_json(const nlohmann::json& doc, std::string_view source);

/// Writes the model atomically: a temporary file in the same directory, fsync, then rename over `path`. On any
/// failure the temporary file is removed and an existing file at `path` is left untouched.
/// @throws std::runtime_error (naming the path and the reason) on I/O failure; ValueError as model_to_json.
void save_model(const AnyDistribution& model, const std::string& path);

/// Parses the text of a model file (what load_model reads) into a document. Stricter than JSON itself: a NUL byte
/// anywhere (JSON parsers stop at one, so what follows it would go unread) and a key that appears twice in one
/// object (JSON keeps the last silently) are errors.
/// @throws ValueError "<source>: line L, column C: …" for a NUL byte or a duplicate key (naming it), and
///         "<source>: not a valid JSON document: …" (with nlohmann's line and column) for malformed JSON.
[[nodiscard]] nlohmann::json parse_model_text(const std::string& text, std::string_view source);

/// Reads and validates a model file.
/// @throws std::runtime_error when the file cannot be read; ValueError (naming the file and the field) on bad
///         content, including malformed JSON.
[[nodiscard]] AnyDistribution load_model(const std::string& path);

/// The text save_model writes: objects indented, one matrix row per line, numbers as nlohmann dumps them.
[[nodiscard]] std::string format_model_json(const nlohmann::json& doc);

/// Serialises one model object without "format" (what a mixture stores per component).
[[nodiscard]] nlohmann::json model_object_to_json(const AnyDistribution& model);
/// Reads one model object; `top_level` requires "format" and "schema_version", otherwise they are optional.
[[nodiscard]] AnyDistribution model_object_from_json(const ModelJsonField& object, bool top_level);

}  // namespace attnmix
