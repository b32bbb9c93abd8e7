// SPDX-License-Identifier: Apache-2.0
/// @file jsonl.hpp
/// Reads JSON Lines files one object per line. Blank lines are skipped (line numbers still count
/// them); every error names the file, the 1-based line and, where it can, the field: "data.jsonl:
/// line 3: query[1]: the number 1e999 overflows a double". Duplicate keys within a line are
/// rejected (JSON would silently keep the last), and so is a NUL byte anywhere in a line ("line 3:
/// column 12: a NUL byte …"; JSON parsers stop at it). A process of a distributed fit reads one stripe of
/// the data lines (RowStripe): the file is read twice, once to count its data lines and once to
/// parse only the lines of the stripe (the others are not parsed, so their errors are another
/// process's to report).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "attnmix/io/fields.hpp"

namespace attnmix {

/// Calls visit(line_number, object) for every non-blank line of the stripe, in order. With
/// on_row_count, the file's data lines are counted first (one more pass when the file is read
/// whole) and on_row_count(rows) is called before the first visit with the number of lines the
/// stripe holds: no more are visited, even when the file grows in between.
/// @throws std::runtime_error when the file cannot be read; ValueError on malformed JSON or a
/// non-object line.
void for_each_json_line(
    const std::string& path, const RowStripe& stripe,
    const std::function<void(int64_t line, const nlohmann::json& object)>& visit,
    const std::function<void(int64_t rows)>& on_row_count = {});

/// The same for every non-blank line of the file.
inline void for_each_json_line(
    const std::string& path,
    const std::function<void(int64_t line, const nlohmann::json& object)>& visit) {
  for_each_json_line(path, RowStripe{}, visit);
}

/// The first data line of the stripe and its object, or nothing when the stripe is empty, the file
/// cannot be read or the line is not a well-formed JSON object (reading the stripe reports that).
/// Never throws: a distributed fit peeks at the first row of every process's stripe to agree on
/// the row widths before anyone reads.
[[nodiscard]] std::optional<std::pair<int64_t, nlohmann::json>> first_json_object(
    const std::string& path, const RowStripe& stripe) noexcept;

/// "a bool", "a string", "null", ... for messages.
[[nodiscard]] std::string json_kind(const nlohmann::json& value);

}  // namespace attnmix
