// SPDX-License-Identifier: Apache-2.0
/// @file jsonl.hpp
/// Reads JSON Lines files one object per line. Blank lines are skipped (line numbers still count
/// them); every error names the file, the 1-based line and, where it can, the field: "data.jsonl:
/// line 3: query[1]: the number 1e999 overflows a double". Duplicate keys within a line are
/// rejected (JSON would silently keep the last).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace attnmix::cli {

/// Calls visit(line_number, object) for every non-blank line, in order.
/// @throws std::runtime_error when the file cannot be read; ValueError on malformed JSON or a
/// non-object line.
void for_each_json_line(
    const std::string& path,
    const std::function<void(int64_t line, const nlohmann::json& object)>& visit);

/// "a bool", "a string", "null", ... for messages.
[[nodiscard]] std::string json_kind(const nlohmann::json& value);

}  // namespace attnmix::cli
