// SPDX-License-Identifier: Apache-2.0
// JSON Lines reading with file:line:field error messages (nlohmann's parser callback tracks the
// current field).
#include "attnmix/io/jsonl.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

#include "attnmix/core/errors.hpp"

namespace attnmix {

using nlohmann::json;

std::string json_kind(const json& value) {
  switch (value.type()) {
    case json::value_t::boolean:
      return "a bool (" + value.dump() + ")";
    case json::value_t::null:
      return "null";
    case json::value_t::string:
      return "a string (" + value.dump() + ")";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "the number " + value.dump();
  }
}

namespace {

/// Where the parser is inside one line: the top-level key and, inside its array, the element index.
struct FieldTracker {
  std::string key;
  bool in_array = false;
  int64_t index =
      0;  // inside the array: the number of elements read so far = the index of the next one
  std::set<std::string> seen;
  std::string duplicate;

  [[nodiscard]] std::string field() const {
    if (key.empty()) return "";
    return in_array ? key + "[" + std::to_string(index) + "]" : key;
  }
  bool on_event(int depth, json::parse_event_t event, const json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      key = parsed.get<std::string>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
      in_array = false;
      index = 0;
    } else if (event == json::parse_event_t::array_start && depth == 1) {
      in_array = true;
    } else if (event == json::parse_event_t::value && depth == 2 && in_array) {
      ++index;
    }
    return true;
  }
};

/// nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 9: syntax error …"
/// without the bracketed id and the line (always 1 here): "column 9: syntax error …".
std::string describe_parse_error(const json::exception& e) {
  std::string text = e.what();
  const size_t column = text.find("column ");
  if (column != std::string::npos) return text.substr(column);
  const size_t bracket = text.find("] ");
  return bracket == std::string::npos ? text : text.substr(bracket + 2);
}

/// Reads the next line of a JSON Lines file (number: its 1-based line), without a trailing CR or a
/// leading UTF-8 byte-order mark on line 1. Returns false at the end of the file.
bool next_line(std::istream& in, std::string& line, int64_t& number) {
  if (!std::getline(in, line)) return false;
  ++number;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0)
    line.erase(0, 3);  // a UTF-8 byte-order mark
  return true;
}

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t") == std::string::npos;
}

std::ifstream open_data_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open the data file: " + std::strerror(errno));
  return in;
}

/// The data-line indices [begin, end) of the stripe, counting the file's data lines first when it
/// has more than one part or `count` is set (else begin = 0, end = INT64_MAX for a whole file).
std::pair<int64_t, int64_t> stripe_lines(const std::string& path, const RowStripe& stripe,
                                         bool count) {
  if (stripe.parts <= 1 && !count) return {0, INT64_MAX};
  std::ifstream in = open_data_file(path);
  std::string line;
  int64_t number = 0, data_lines = 0;
  while (next_line(in, line, number))
    if (!is_blank(line)) ++data_lines;
  if (in.bad())
    throw std::runtime_error(path + ": cannot read the data file: " + std::strerror(errno));
  return stripe.range(data_lines);
}

/// Parses one data line into an object. @throws ValueError naming the line and the field.
json parse_object(const std::string& path, int64_t number, const std::string& line) {
  const std::string where = path + ": line " + std::to_string(number);
  // nlohmann's lexer takes a NUL byte for the end of its input, so `{...}\0 junk` would parse as `{...}`: no line
  // may hold one (a NUL inside a JSON string must be written \u0000 anyway).
  if (const size_t nul = line.find('\0'); nul != std::string::npos)
    throw ValueError(where + ": column " + std::to_string(nul + 1) +
                     ": a NUL byte is not allowed in a JSON Lines file");
  FieldTracker tracker;
  json value;
  try {
    value = json::parse(line, [&](int depth, json::parse_event_t event, json& parsed) {
      return tracker.on_event(depth, event, parsed);
    });
  } catch (const json::out_of_range& e) {  // id 406: a number that overflows a double, e.g. 1e999
    const std::string field = tracker.field();
    const std::string what = e.what();
    const size_t quote = what.find('\'');
    const size_t end = quote == std::string::npos ? quote : what.find('\'', quote + 1);
    const std::string number_text = end == std::string::npos
                                        ? "a number"
                                        : "the number " + what.substr(quote + 1, end - quote - 1);
    throw ValueError(where + (field.empty() ? "" : ": " + field) + ": " + number_text +
                     " overflows a double (values must be finite)");
  } catch (const json::exception& e) {
    throw ValueError(where + ": malformed JSON at " + describe_parse_error(e));
  }
  if (!value.is_object())
    throw ValueError(where +
                     ": each line must be a JSON object like {\"context\": [...], ...} (got " +
                     json_kind(value) + ")");
  if (!tracker.duplicate.empty())
    throw ValueError(where + ": field '" + tracker.duplicate + "' appears more than once");
  return value;
}

}  // namespace

void for_each_json_line(const std::string& path, const RowStripe& stripe,
                        const std::function<void(int64_t, const json&)>& visit,
                        const std::function<void(int64_t)>& on_row_count) {
  const auto [begin, end] = stripe_lines(path, stripe, static_cast<bool>(on_row_count));
  if (on_row_count) on_row_count(end - begin);
  std::ifstream in = open_data_file(path);
  std::string line;
  int64_t number = 0;
  int64_t data_line = 0;  // the index of the next data line among the file's data lines
  while (data_line < end && next_line(in, line, number)) {
    if (is_blank(line)) continue;
    if (data_line++ < begin) continue;
    visit(number, parse_object(path, number, line));
  }
  if (in.bad())
    throw std::runtime_error(path + ": cannot read the data file: " + std::strerror(errno));
}

std::optional<std::pair<int64_t, json>> first_json_object(const std::string& path,
                                                          const RowStripe& stripe) noexcept {
  try {
    const auto [begin, end] = stripe_lines(path, stripe, false);
    std::ifstream in = open_data_file(path);
    std::string line;
    int64_t number = 0;
    int64_t data_line = 0;
    while (data_line < end && next_line(in, line, number)) {
      if (is_blank(line)) continue;
      if (data_line++ < begin) continue;
      return std::make_pair(number, parse_object(path, number, line));
    }
  } catch (...) {  // reading the stripe reports it
  }
  return std::nullopt;
}

}  // namespace attnmix
