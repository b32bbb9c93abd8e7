// SPDX-License-Identifier: Apache-2.0
// Model files (io/model_file.hpp): the document around a family's codec (found in the family registry), its text
// layout, strict parsing and atomic files (core/atomic_file.hpp).
#include "attnmix/io/model_file.hpp"


#include <algorithm>
#include <array>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "attnmix/core/atomic_file.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/io/input_file.hpp"

namespace attnmix {

using nlohmann::json;

// ----- documents
// ---------------------------------------------------------------------------------------------------

namespace {
/// Whether a family's params hold a table in the sparse-rows layout (core/json.hpp), as a member or as an element of
/// a member (chained attention's list of key tables); a component's model object is not looked into.
bool uses_sparse_tables(const json& params) {
  for (const auto& item : params.items()) {
    if (is_sparse_table(item.value())) return true;
    if (item.value().is_array())
      for (const json& element : item.value())
        if (is_sparse_table(element)) return true;
  }
  return false;
}
}  // namespace

json model_object_to_json(const AnyDistribution& model) {
  if (!model.has_value()) throw ValueError("model_to_json: the model is empty");
  const std::string family = model.family();
  const FamilySpec* spec = family_of_file(family);
  if (!spec)
    throw ValueError("model_to_json: family '" + family + "' has no model-file format (known: " +
                     file_families_text() + ")");
  const ModelCodec* codec = &spec->codec;
  json out = json::object();
  json params = codec->params_to_json(model);
  out["schema_version"] = uses_sparse_tables(params) ? kModelSchemaVersion : 1;
  out["family"] = family;
  out["params"] = std::move(params);
  const std::string name = codec->name_of(model);
  if (!name.empty()) out["name"] = name;
  if (codec->state_to_json) out["optimizer_state"] = codec->state_to_json(model);
  return out;
}

json model_to_json(const AnyDistribution& model) {
  json body = model_object_to_json(model);
  json out = json::object();
  out["format"] = kModelFormat;
  for (auto& item : body.items()) out[item.key()] = std::move(item.value());
  return out;
}

AnyDistribution model_object_from_json(const ModelJsonField& object, bool top_level) {
  constexpr std::array<std::string_view, 4> kTopRequired{"format", "schema_version", "family",
                                                         "params"};
  constexpr std::array<std::string_view, 2> kTopOptional{"name", "optimizer_state"};
  constexpr std::array<std::string_view, 2> kRequired{"family", "params"};
  constexpr std::array<std::string_view, 4> kOptional{"format", "schema_version", "name",
                                                      "optimizer_state"};
  if (top_level && object.value().is_object() && !object.has("format"))
    object.fail(
        "missing field 'format' (an attnmix model file starts with {\"format\": \"attnmix-model\", "
        "…})");
  if (top_level)
    object.expect_object(kTopRequired, kTopOptional);
  else
    object.expect_object(kRequired, kOptional);
  if (object.has("format")) {
    const ModelJsonField format = object["format"];
    if (format.as_string() != kModelFormat)
      format.fail(std::string("must be \"") + kModelFormat + "\" (got \"" + format.as_string() +
                  "\")");
  }
  if (object.has("schema_version")) {
    const ModelJsonField version = object["schema_version"];
    if (!version.value().is_number_integer() || version.as_int() < 1 || version.as_int() > kModelSchemaVersion)
      version.fail("this build reads schema_version 1 to " + std::to_string(kModelSchemaVersion) + " (got " +
                   version.value().dump() + ")");
  }
  const ModelJsonField family_field = object["family"];
  const std::string family = family_field.as_string();
  const FamilySpec* spec = family_of_file(family);
  if (!spec) family_field.fail("unknown family '" + family + "' (known: " + file_families_text() + ")");
  const ModelCodec* codec = &spec->codec;
  std::optional<ModelJsonField> state;
  if (object.has("optimizer_state")) {
    if (!codec->state_to_json)
      object.fail("unknown field 'optimizer_state' (family " + family + " has no optimizer state)");
    state = object["optimizer_state"];
  }
  const std::string name = object.has("name") ? object["name"].as_string() : std::string();
  return codec->from_json(object["params"], name, state ? &*state : nullptr);
}

AnyDistribution model_from_json(const json& doc, std::string_view source) {
  return model_object_from_json(ModelJsonField(doc, std::string(source), ""), /*top_level=*/true);
}

// ----- text layout
// -------------------------------------------------------------------------------------------------

namespace {

bool is_scalar_array(const json& v) {
  if (!v.is_array()) return false;
  for (const json& x : v)
    if (x.is_array() || x.is_object()) return false;
  return true;
}

/// The envelope fields first, in the order the format documents them; every other key
/// alphabetically.
std::vector<std::string> keys_in_order(const json& object) {
  constexpr std::array<std::string_view, 6> kEnvelope{"format", "schema_version", "family", "name",
                                                      "params", "optimizer_state"};
  std::vector<std::string> keys;
  for (std::string_view key : kEnvelope)
    if (object.contains(key)) keys.emplace_back(key);
  for (const auto& item : object.items())
    if (std::find(kEnvelope.begin(), kEnvelope.end(), item.key()) == kEnvelope.end())
      keys.push_back(item.key());
  return keys;
}

void write_value(std::ostringstream& os, const json& v, int indent) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  const std::string inner(static_cast<size_t>(indent + 2), ' ');
  if (v.is_object() && !v.empty()) {
    os << "{\n";
    size_t i = 0;
    for (const std::string& key : keys_in_order(v)) {
      os << inner << json(key).dump() << ": ";
      write_value(os, v.at(key), indent + 2);
      os << (++i < v.size() ? ",\n" : "\n");
    }
    os << pad << "}";
  } else if (v.is_array() && !v.empty() && !is_scalar_array(v)) {
    os << "[\n";
    for (size_t i = 0; i < v.size(); ++i) {
      os << inner;
      write_value(os, v[i], indent + 2);
      os << (i + 1 < v.size() ? ",\n" : "\n");
    }
    os << pad << "]";
  } else if (v.is_array()) {  // numbers on one line: one matrix row per line
    os << "[";
    for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i].dump();
    os << "]";
  } else {
    os << v.dump();
  }
}

}  // namespace

std::string format_model_json(const json& doc) {
  std::ostringstream os;
  write_value(os, doc, 0);
  os << "\n";
  return os.str();
}

// ----- parsing
// -----------------------------------------------------------------------------------------------------

namespace {

/// A char iterator over a text that records, in *consumed, how many characters the reader has taken: nlohmann's
/// parser gives its callback no positions, but it reads its input one character at a time, in order, so this tells
/// where an event happened (a key event comes right after the key's closing quote is read).
class CountingIterator {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator() = default;
  CountingIterator(const char* at, const char* begin, size_t* consumed) : at_(at), begin_(begin), consumed_(consumed) {}
  reference operator*() const { return *at_; }
  CountingIterator& operator++() {
    ++at_;
    *consumed_ = static_cast<size_t>(at_ - begin_);
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator& other) const { return at_ == other.at_; }

 private:
  const char* at_ = nullptr;
  const char* begin_ = nullptr;
  size_t* consumed_ = nullptr;
};

/// "line 3, column 7" of byte `offset` of `text` (both 1-based; columns count bytes, as nlohmann's messages do).
std::string position_text(const std::string& text, size_t offset) {
  size_t line = 1, line_start = 0;
  for (size_t k = 0; k < offset && k < text.size(); ++k)
    if (text[k] == '\n') {
      ++line;
      line_start = k + 1;
    }
  return "line " + std::to_string(line) + ", column " + std::to_string(offset - line_start + 1);
}

/// The offset of the opening quote of the JSON string whose closing quote is at `close`: the nearest quote before it
/// that is not escaped (preceded by an even number of backslashes).
size_t opening_quote(const std::string& text, size_t close) {
  for (size_t k = close; k-- > 0;) {
    if (text[k] != '"') continue;
    size_t backslashes = 0;
    while (backslashes < k && text[k - 1 - backslashes] == '\\') ++backslashes;
    if (backslashes % 2 == 0) return k;
  }
  return close;
}

}  // namespace

json parse_model_text(const std::string& text, std::string_view source) {
  const std::string src(source);
  // nlohmann's lexer takes a NUL byte for the end of its input, so `{…}\0garbage` would parse as `{…}`.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw ValueError(src + ": " + position_text(text, nul) + ": a NUL byte is not allowed in a model file");
  // JSON would keep the last of two equal keys in one object; a model file names each key once. One set of keys per
  // open object (a model file has few objects: the envelope, params, the optimizer state, mixture components).
  size_t consumed = 0;
  std::vector<std::set<std::string>> open_objects;
  const auto on_event = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == json::parse_event_t::key) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second)
        throw ValueError(src + ": " + position_text(text, opening_quote(text, consumed - 1)) + ": duplicate key " +
                         json(key).dump() + " (a key may appear only once in an object)");
    }
    return true;
  };
  try {
    return json::parse(CountingIterator(text.data(), text.data(), &consumed),
                       CountingIterator(text.data() + text.size(), text.data(), &consumed), on_event);
  } catch (const json::exception& e) {
    throw ValueError(src + ": not a valid JSON document: " + e.what());
  }
}

// ----- files
// -------------------------------------------------------------------------------------------------------

namespace {
/// A path with a NUL byte names a different file (the system reads it up to the NUL): ValueError, as Python's
/// open() raises.
void check_model_path(const std::string& path) {
  const size_t nul = path.find('\0');
  if (nul == std::string::npos) return;
  throw ValueError("model file path \"" + path.substr(0, nul) + "\\0...\": contains a NUL byte (at offset " +
                   std::to_string(nul) + "); a path cannot");
}
}  // namespace

void save_model(const AnyDistribution& model, const std::string& path) {
  check_model_path(path);
  // Serialise first: nothing touches the disk unless the whole document exists.
  write_file_atomically(path, format_model_json(model_to_json(model)), "the model");
}

AnyDistribution load_model(const std::string& path) {
  check_model_path(path);
  const std::string text = read_input_file(path, "the model file");
  json doc;
  try {
    doc = parse_model_text(text, path);
  } catch (const json::exception& e) {
    throw ValueError(path + ": not a valid JSON document: " + e.what());
  }
  return model_from_json(doc, path);
}

}  // namespace attnmix
