// SPDX-License-Identifier: Apache-2.0
// Model files (SPEC.md §1.10): the family registry, the field reader that names file and field in
// every error and the document layout. Files are written with write_file_atomically (core/atomic_file.hpp).
#include "attnmix/core/json.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/atomic_file.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/mixture.hpp"

namespace attnmix {

using nlohmann::json;

// ----- ModelJsonField
// ---------------------------------------------------------------------------------------------

namespace {

std::string type_name_of(const json& v) {
  if (v.is_boolean()) return "a bool";
  if (v.is_null()) return "null";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "a number";
}

std::string join_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

}  // namespace

ModelJsonField::ModelJsonField(const json& value, std::string source, std::string path)
    : value_(&value), source_(std::move(source)), path_(std::move(path)) {}

std::string ModelJsonField::where(std::string_view message) const {
  std::string out = source_;
  if (!path_.empty()) out += ": " + path_;
  out += ": ";
  out += message;
  return out;
}

void ModelJsonField::fail(std::string_view message) const { throw ValueError(where(message)); }

void ModelJsonField::expect_object(std::span<const std::string_view> required,
                                   std::span<const std::string_view> optional) const {
  if (!value_->is_object()) fail("must be a JSON object (got " + type_name_of(*value_) + ")");
  for (std::string_view key : required)
    if (!value_->contains(key)) fail("missing field '" + std::string(key) + "'");
  for (const auto& item : value_->items()) {
    bool known = false;
    for (std::string_view key : required) known = known || key == item.key();
    for (std::string_view key : optional) known = known || key == item.key();
    if (!known) {
      std::string expected;
      for (std::string_view key : required)
        expected += (expected.empty() ? "" : ", ") + std::string(key);
      for (std::string_view key : optional)
        expected += (expected.empty() ? "" : ", ") + std::string(key);
      fail("unknown field '" + item.key() + "' (expected " + expected + ")");
    }
  }
}

bool ModelJsonField::has(std::string_view key) const {
  return value_->is_object() && value_->contains(key);
}

ModelJsonField ModelJsonField::operator[](std::string_view key) const {
  if (!value_->is_object()) fail("must be a JSON object (got " + type_name_of(*value_) + ")");
  const auto it = value_->find(key);
  if (it == value_->end()) fail("missing field '" + std::string(key) + "'");
  return {*it, source_, join_path(path_, key)};
}

std::vector<ModelJsonField> ModelJsonField::elements() const {
  if (!value_->is_array()) fail("must be an array (got " + type_name_of(*value_) + ")");
  std::vector<ModelJsonField> out;
  out.reserve(value_->size());
  for (size_t i = 0; i < value_->size(); ++i)
    out.emplace_back((*value_)[i], source_, path_ + "[" + std::to_string(i) + "]");
  return out;
}

double ModelJsonField::as_double() const {
  if (!value_->is_number()) fail("must be a number (got " + type_name_of(*value_) + ")");
  const double x = value_->get<double>();
  if (!std::isfinite(x)) fail("must be finite");
  return x;
}

int64_t ModelJsonField::as_int() const {
  // An integer field is written as a JSON integer (save_model writes one): 1e15 or 3.0 is a float in JSON, and a
  // float would round every integer above 2^53, so it is rejected rather than converted.
  if (value_->is_number_unsigned() && value_->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail("must be an integer of at most " + std::to_string(INT64_MAX) + " (got " + value_->dump() + ")");
  if (value_->is_number_integer()) return value_->get<int64_t>();
  if (value_->is_number_float())
    fail("must be an integer, written without a fraction or an exponent (got " + value_->dump() + ")");
  fail("must be an integer (got " + type_name_of(*value_) + ")");
}

std::string ModelJsonField::as_string() const {
  if (!value_->is_string()) fail("must be a string (got " + type_name_of(*value_) + ")");
  return value_->get<std::string>();
}

Vector ModelJsonField::as_vector() const {
  if (!value_->is_array()) fail("must be an array of numbers (got " + type_name_of(*value_) + ")");
  Vector out(static_cast<Index>(value_->size()));
  for (size_t i = 0; i < value_->size(); ++i) {
    const json& x = (*value_)[i];
    if (!x.is_number())
      fail("entry " + std::to_string(i) + " must be a number (got " + type_name_of(x) + ")");
    out[static_cast<Index>(i)] = x.get<double>();
  }
  return out;
}

Matrix ModelJsonField::as_matrix() const {
  if (!value_->is_array())
    fail("must be a 2-D array of numbers (got " + type_name_of(*value_) + ")");
  const size_t rows = value_->size();
  size_t cols = 0;
  for (size_t r = 0; r < rows; ++r) {
    const json& row = (*value_)[r];
    if (!row.is_array())
      fail("row " + std::to_string(r) + " must be an array of numbers (got " + type_name_of(row) +
           ")");
    if (r == 0) cols = row.size();
    if (row.size() != cols)
      fail("row " + std::to_string(r) + " has " + std::to_string(row.size()) +
           " entries (row 0 has " + std::to_string(cols) + "); the array must be rectangular");
  }
  Matrix out(static_cast<Index>(rows), static_cast<Index>(cols));
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < cols; ++c) {
      const json& x = (*value_)[r][c];
      if (!x.is_number())
        fail("entry [" + std::to_string(r) + ", " + std::to_string(c) + "] must be a number (got " +
             type_name_of(x) + ")");
      out(static_cast<Index>(r), static_cast<Index>(c)) = x.get<double>();
    }
  return out;
}

void ModelJsonField::rethrow_constructor_error(std::string_view family_where,
                                               std::string_view message) const {
  const std::string prefix = std::string(family_where) + ": ";
  if (message.substr(0, prefix.size()) == prefix) {
    const std::string_view rest = message.substr(prefix.size());
    if (value_->is_object())
      for (const auto& item : value_->items()) {
        const std::string& key = item.key();
        if (rest.size() > key.size() && rest.substr(0, key.size()) == key &&
            rest[key.size()] == ' ')
          throw ValueError(source_ + ": " + join_path(path_, key) +
                           std::string(rest.substr(key.size())));
      }
    fail(rest);
  }
  fail(message);
}

// ----- the family registry
// -----------------------------------------------------------------------------------------

json matrix_to_json(const Matrix& m) {
  json rows = json::array();
  for (Index r = 0; r < m.rows(); ++r) {
    json row = json::array();
    for (Index c = 0; c < m.cols(); ++c) row.push_back(m(r, c));
    rows.push_back(std::move(row));
  }
  return rows;
}

json vector_to_json(const Vector& v) {
  json out = json::array();
  for (Index i = 0; i < v.size(); ++i) out.push_back(v[i]);
  return out;
}

namespace {

// responsibility_attention: key_means [S, D], emission [S, T], position_prior [N], sigma2.
json ra_params_to_json(const AnyDistribution& model) {
  const ResponsibilityAttentionParams& p = model.get_if<ResponsibilityAttention>()->params();
  return json{{"key_means", matrix_to_json(p.key_means)},
              {"emission", matrix_to_json(p.emission)},
              {"position_prior", vector_to_json(p.position_prior)},
              {"sigma2", p.sigma2}};
}
std::string ra_name_of(const AnyDistribution& model) {
  return model.get_if<ResponsibilityAttention>()->params().name;
}
AnyDistribution ra_from_json(const ModelJsonField& params, const std::string& name,
                             const ModelJsonField* /*optimizer_state*/) {
  constexpr std::array<std::string_view, 4> kRequired{"key_means", "emission", "position_prior",
                                                      "sigma2"};
  params.expect_object(kRequired, {});
  ResponsibilityAttentionParams p;
  p.key_means = params["key_means"].as_matrix();
  p.emission = params["emission"].as_matrix();
  p.position_prior = params["position_prior"].as_vector();
  p.sigma2 = params["sigma2"].as_double();
  p.name = name;
  return params.construct(ResponsibilityAttention::kWhere,
                          [&] { return AnyDistribution(ResponsibilityAttention(std::move(p))); });
}

// chained_attention: keys [L, S, S], emission [S, T], sigma2.
json ca_params_to_json(const AnyDistribution& model) {
  const ChainedAttentionParams& p = model.get_if<ChainedAttention>()->params();
  json tables = json::array();
  for (const Matrix& K : p.key_tables) tables.push_back(matrix_to_json(K));
  return json{{"keys", std::move(tables)}, {"emission", matrix_to_json(p.emission)}, {"sigma2", p.sigma2}};
}
std::string ca_name_of(const AnyDistribution& model) { return model.get_if<ChainedAttention>()->params().name; }
AnyDistribution ca_from_json(const ModelJsonField& params, const std::string& name,
                             const ModelJsonField* /*optimizer_state*/) {
  constexpr std::array<std::string_view, 3> kRequired{"keys", "emission", "sigma2"};
  params.expect_object(kRequired, {});
  ChainedAttentionParams p;
  const ModelJsonField keys = params["keys"];
  if (!keys.value().is_array()) keys.fail("must be a 3-D array (L, S, S)");
  for (const ModelJsonField& table : keys.elements()) p.key_tables.push_back(table.as_matrix());
  p.emission = params["emission"].as_matrix();
  p.sigma2 = params["sigma2"].as_double();
  p.name = name;
  return params.construct(ChainedAttention::kWhere, [&] { return AnyDistribution(ChainedAttention(std::move(p))); });
}

// mixture: w [K], components (model objects without "format").
json mixture_params_to_json(const AnyDistribution& model) {
  const Mixture& m = *model.get_if<Mixture>();
  json components = json::array();
  for (const AnyDistribution& c : m.components()) components.push_back(model_object_to_json(c));
  return json{{"w", vector_to_json(m.weights())}, {"components", std::move(components)}};
}
std::string mixture_name_of(const AnyDistribution& model) {
  return model.get_if<Mixture>()->name();
}
AnyDistribution mixture_from_json(const ModelJsonField& params, const std::string& name,
                                  const ModelJsonField* /*optimizer_state*/) {
  constexpr std::array<std::string_view, 2> kRequired{"w", "components"};
  params.expect_object(kRequired, {});
  Vector w = params["w"].as_vector();
  std::vector<AnyDistribution> components;
  for (const ModelJsonField& c : params["components"].elements())
    components.push_back(model_object_from_json(c, /*top_level=*/false));
  return params.construct(Mixture::kWhere, [&] {
    return AnyDistribution(Mixture(std::move(components), std::move(w), name));
  });
}

// The variational families (SPEC.md §4, §5) keep their Adam state beside params, as
// "optimizer_state" (optimizer_state_to_json). A file without it loads with a fresh state (the
// constructor's default); a state that does not belong to the params (another family or geometry,
// mean/log_var not bit-identical) is rejected by the constructor, and the message names the field.

/// Runs a variational constructor: errors about the optimizer state name the "optimizer_state"
/// field ("model.json: optimizer_state.mean and …"), the others the params member as construct()
/// does.
template <class F>
AnyDistribution construct_variational(const ModelJsonField& params, const ModelJsonField* state,
                                      std::string_view family_where, F&& make) {
  try {
    return make();
  } catch (const std::invalid_argument& e) {
    const std::string_view message = e.what();
    const std::string prefix = std::string(family_where) + ": ";
    if (state && message.substr(0, prefix.size()) == prefix &&
        message.substr(prefix.size()).rfind("optimizer_state", 0) == 0) {
      // state->path() ends in "optimizer_state"; the message goes on from that word.
      const std::string& path = state->path();
      const std::string parent =
          path.substr(0, path.size() - std::string("optimizer_state").size());
      throw ValueError(state->source() + ": " + parent +
                       std::string(message.substr(prefix.size())));
    }
    // Every other error: construct() names the params member (rethrowing the error being handled).
    return params.construct(family_where, [&]() -> AnyDistribution { throw; });
  }
}

std::optional<AttentionOptimizerState> state_from_json(const ModelJsonField* state) {
  if (!state) return std::nullopt;
  return optimizer_state_from_json(*state);
}

// variational_embedding_attention: mean [S, D], log_var [S, D], emission [S, T], position_prior
// [N], sigma2; optimizer_state beside params.
json vea_params_to_json(const AnyDistribution& model) {
  const VariationalEmbeddingAttentionParams& p =
      model.get_if<VariationalEmbeddingAttention>()->params();
  return json{{"mean", matrix_to_json(p.mean)},
              {"log_var", matrix_to_json(p.log_var)},
              {"emission", matrix_to_json(p.emission)},
              {"position_prior", vector_to_json(p.position_prior)},
              {"sigma2", p.sigma2}};
}
std::string vea_name_of(const AnyDistribution& model) {
  return model.get_if<VariationalEmbeddingAttention>()->params().name;
}
json vea_state_to_json(const AnyDistribution& model) {
  return optimizer_state_to_json(model.get_if<VariationalEmbeddingAttention>()->optimizer_state());
}
AnyDistribution vea_from_json(const ModelJsonField& params, const std::string& name,
                              const ModelJsonField* state) {
  constexpr std::array<std::string_view, 5> kRequired{"mean", "log_var", "emission",
                                                      "position_prior", "sigma2"};
  params.expect_object(kRequired, {});
  VariationalEmbeddingAttentionParams p;
  p.mean = params["mean"].as_matrix();
  p.log_var = params["log_var"].as_matrix();
  p.emission = params["emission"].as_matrix();
  p.position_prior = params["position_prior"].as_vector();
  p.sigma2 = params["sigma2"].as_double();
  p.name = name;
  p.optimizer_state = state_from_json(state);
  return construct_variational(params, state, VariationalEmbeddingAttention::kWhere, [&] {
    return AnyDistribution(VariationalEmbeddingAttention(std::move(p)));
  });
}

// variational_multihop_attention: mean [S, D], log_var [S, D], emission [S, T], sigma2;
// optimizer_state beside params.
json vmha_params_to_json(const AnyDistribution& model) {
  const VariationalMultiHopAttentionParams& p =
      model.get_if<VariationalMultiHopAttention>()->params();
  return json{{"mean", matrix_to_json(p.mean)},
              {"log_var", matrix_to_json(p.log_var)},
              {"emission", matrix_to_json(p.emission)},
              {"sigma2", p.sigma2}};
}
std::string vmha_name_of(const AnyDistribution& model) {
  return model.get_if<VariationalMultiHopAttention>()->params().name;
}
json vmha_state_to_json(const AnyDistribution& model) {
  return optimizer_state_to_json(model.get_if<VariationalMultiHopAttention>()->optimizer_state());
}
AnyDistribution vmha_from_json(const ModelJsonField& params, const std::string& name,
                               const ModelJsonField* state) {
  constexpr std::array<std::string_view, 4> kRequired{"mean", "log_var", "emission", "sigma2"};
  params.expect_object(kRequired, {});
  VariationalMultiHopAttentionParams p;
  p.mean = params["mean"].as_matrix();
  p.log_var = params["log_var"].as_matrix();
  p.emission = params["emission"].as_matrix();
  p.sigma2 = params["sigma2"].as_double();
  p.name = name;
  p.optimizer_state = state_from_json(state);
  return construct_variational(params, state, VariationalMultiHopAttention::kWhere, [&] {
    return AnyDistribution(VariationalMultiHopAttention(std::move(p)));
  });
}

// Adding a family: write its params_to_json / name_of / from_json (and state_to_json when it has
// state beside its parameters) and add one row here.
constexpr std::array<ModelCodec, 5> kCodecs{{
    {ResponsibilityAttention::kFamily, &ra_params_to_json, &ra_name_of, &ra_from_json, nullptr},
    {ChainedAttention::kFamily, &ca_params_to_json, &ca_name_of, &ca_from_json, nullptr},
    {VariationalEmbeddingAttention::kFamily, &vea_params_to_json, &vea_name_of, &vea_from_json,
     &vea_state_to_json},
    {VariationalMultiHopAttention::kFamily, &vmha_params_to_json, &vmha_name_of, &vmha_from_json,
     &vmha_state_to_json},
    {Mixture::kFamily, &mixture_params_to_json, &mixture_name_of, &mixture_from_json, nullptr},
}};

const ModelCodec* find_codec(std::string_view family) {
  for (const ModelCodec& c : kCodecs)
    if (family == c.family) return &c;
  return nullptr;
}

std::string known_families() {
  std::string out;
  for (const ModelCodec& c : kCodecs) out += (out.empty() ? "" : ", ") + std::string(c.family);
  return out;
}

}  // namespace

std::span<const ModelCodec> model_codecs() { return kCodecs; }

// ----- documents
// ---------------------------------------------------------------------------------------------------

json model_object_to_json(const AnyDistribution& model) {
  if (!model.has_value()) throw ValueError("model_to_json: the model is empty");
  const std::string family = model.family();
  const ModelCodec* codec = find_codec(family);
  if (!codec)
    throw ValueError("model_to_json: family '" + family +
                     "' has no model-file format (known: " + known_families() + ")");
  json out = json::object();
  out["schema_version"] = kModelSchemaVersion;
  out["family"] = family;
  out["params"] = codec->params_to_json(model);
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
    if (!version.value().is_number_integer() || version.as_int() != kModelSchemaVersion)
      version.fail("this build reads schema_version " + std::to_string(kModelSchemaVersion) +
                   " (got " + version.value().dump() + ")");
  }
  const ModelJsonField family_field = object["family"];
  const std::string family = family_field.as_string();
  const ModelCodec* codec = find_codec(family);
  if (!codec)
    family_field.fail("unknown family '" + family + "' (known: " + known_families() + ")");
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
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) throw_io_error(path, "cannot open the model file", errno);
  if (S_ISDIR(info.st_mode))
    throw_io_error(path, "cannot read the model file", EISDIR);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_io_error(path, "cannot open the model file", errno);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw_io_error(path, "cannot read the model file", errno);
  json doc;
  try {
    doc = parse_model_text(text.str(), path);
  } catch (const json::exception& e) {
    throw ValueError(path + ": not a valid JSON document: " + e.what());
  }
  return model_from_json(doc, path);
}

}  // namespace attnmix
