// SPDX-License-Identifier: Apache-2.0
// Text corpora → token ids (UTF-8 characters or whitespace-separated words) through a vocabulary: built in
// first-appearance order or read from a file; vocabulary files and query embeddings (text_corpus.hpp).
#include "text_corpus.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <string_view>

#include "attnmix/core/errors.hpp"
#include "attnmix/io/input_file.hpp"
#include "attnmix/io/npz.hpp"
#include "cli_support.hpp"

namespace attnmix::cli {

namespace {

/// Length of the UTF-8 sequence starting at text[i] (1 for ASCII and for any malformed byte).
size_t utf8_length(const std::string& text, size_t i) {
  const auto lead = static_cast<unsigned char>(text[i]);
  size_t length = 1;
  if ((lead & 0xE0U) == 0xC0U)
    length = 2;
  else if ((lead & 0xF0U) == 0xE0U)
    length = 3;
  else if ((lead & 0xF8U) == 0xF0U)
    length = 4;
  if (length == 1 || i + length > text.size()) return 1;
  for (size_t k = 1; k < length; ++k)
    if ((static_cast<unsigned char>(text[i + k]) & 0xC0U) != 0x80U) return 1;
  return length;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string printable(const std::string& token) {
  if (token == "\n") return "\\n";
  if (token == "\t") return "\\t";
  if (token == "\r") return "\\r";
  return token;
}

}  // namespace

TokenMode parse_token_mode(const std::string& text) {
  if (text == "chars") return TokenMode::kChars;
  if (text == "words") return TokenMode::kWords;
  throw ValueError("--tokens must be chars or words (got " + text + ")");
}

const char* token_mode_name(TokenMode mode) { return mode == TokenMode::kChars ? "chars" : "words"; }

const char* token_kind(TokenMode mode) { return mode == TokenMode::kChars ? "characters" : "words"; }

void check_text_length(const TokenizedText& text, const std::string& path, int64_t context, TokenMode mode) {
  if (static_cast<int64_t>(text.ids.size()) <= context)
    throw ValueError(path + ": has " + std::to_string(text.ids.size()) + " " + token_kind(mode) +
                     "; a context of N = " + std::to_string(context) + " needs at least " +
                     std::to_string(context + 1));
}

TokenizedText tokenize_text(const std::string& path, Vocabulary& vocab, bool grow,
                            const std::string& vocabulary_name) {
  const std::string text = read_input_file(path, "the text file");
  const auto unknown = vocab.ids.find(kUnknownToken);

  TokenizedText out;
  int64_t line = 1;
  const auto emit = [&](std::string token, int64_t token_line) {
    auto it = vocab.ids.find(token);
    if (it == vocab.ids.end() && !grow) {
      if (unknown == vocab.ids.end())
        throw ValueError(path + ": line " + std::to_string(token_line) + ": token '" + printable(token) +
                         "' is not in " + vocabulary_name + " (a vocabulary with an entry " + kUnknownToken +
                         " maps such tokens to it)");
      it = unknown;
      ++out.unknown;
    } else if (it == vocab.ids.end()) {
      it = vocab.ids.emplace(token, vocab.size()).first;
      vocab.tokens.push_back(std::move(token));
    }
    out.ids.push_back(it->second);
    out.line_of_token.push_back(token_line);
  };
  size_t i = 0;
  while (i < text.size()) {
    if (vocab.mode == TokenMode::kChars) {
      const size_t length = utf8_length(text, i);
      emit(text.substr(i, length), line);
      if (text[i] == '\n') ++line;
      i += length;
    } else if (is_space(text[i])) {
      if (text[i] == '\n') ++line;
      ++i;
    } else {
      size_t end = i;
      while (end < text.size() && !is_space(text[end])) ++end;
      emit(text.substr(i, end - i), line);
      i = end;
    }
  }
  return out;
}

namespace {

constexpr const char* kVocabularyFormat = "attnmix-vocabulary";

/// A token in a vocabulary document: a JSON string, or, for a token that is not valid UTF-8 (a stray byte of a text
/// split into characters, a word holding one), the array of its byte values, which a JSON string cannot hold.
std::string token_json(const std::string& token) {
  try {
    return nlohmann::json(token).dump();
  } catch (const nlohmann::json::type_error&) {  // invalid UTF-8
    nlohmann::json bytes = nlohmann::json::array();
    for (const char c : token) bytes.push_back(static_cast<unsigned char>(c));
    return bytes.dump();
  }
}

/// The token of an entry written by token_json. @throws ValueError naming `where` for anything else.
std::string token_of(const nlohmann::json& entry, const std::string& where) {
  if (entry.is_string()) return entry.get<std::string>();
  std::string token;
  if (entry.is_array() && !entry.empty())
    for (const nlohmann::json& byte : entry) {
      if (!byte.is_number_unsigned() || byte.get<uint64_t>() > 255) break;
      token.push_back(static_cast<char>(byte.get<uint64_t>()));
    }
  if (token.empty() || token.size() != entry.size())
    throw ValueError(where + ": must be a string, or the byte values (0 to 255) of a token that is not UTF-8 (got " +
                     entry.dump() + ")");
  return token;
}

/// Checks that `token` is one token of `mode` (a character: one UTF-8 sequence or one stray byte; a word: non-empty,
/// without white space) and not yet in vocab, then adds it. `where` locates it ("v.txt: line 3").
void add_entry(Vocabulary& vocab, std::string token, const std::string& where) {
  const bool one_char = !token.empty() && utf8_length(token, 0) == token.size();
  bool spaced = token.empty();
  for (char c : token) spaced = spaced || is_space(c);
  if (vocab.mode == TokenMode::kChars ? !one_char : spaced)
    throw ValueError(where + ": '" + printable(token) + "' is not one " +
                     (vocab.mode == TokenMode::kChars ? "character"
                                                      : "word (a word is non-empty, without white space)"));
  if (vocab.ids.count(token))
    throw ValueError(where + ": '" + printable(token) + "' is listed twice (entry " +
                     std::to_string(vocab.ids.at(token)) + " already holds it)");
  vocab.ids.emplace(token, vocab.size());
  vocab.tokens.push_back(std::move(token));
}

Vocabulary read_vocabulary_document(const std::string& path, const std::string& text, std::optional<TokenMode> mode) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(path + ": not a valid JSON document: " + e.what());
  }
  constexpr std::array<std::string_view, 4> kFields{"format", "tokens", "queries", "entries"};
  if (!doc.is_object()) throw ValueError(path + ": a vocabulary document is a JSON object");
  for (const auto& item : doc.items())
    if (std::find(kFields.begin(), kFields.end(), item.key()) == kFields.end())
      throw ValueError(path + ": unknown field '" + item.key() + "'");
  for (std::string_view field : kFields)
    if (!doc.contains(field)) throw ValueError(path + ": missing field '" + std::string(field) + "'");
  if (doc["format"] != kVocabularyFormat)
    throw ValueError(path + ": format: must be \"" + kVocabularyFormat + "\" (got " + doc["format"].dump() + ")");
  if (!doc["tokens"].is_string() || (doc["tokens"] != "chars" && doc["tokens"] != "words"))
    throw ValueError(path + ": tokens: must be \"chars\" or \"words\" (got " + doc["tokens"].dump() + ")");
  if (doc["queries"] != "symbols" && doc["queries"] != "embeddings")
    throw ValueError(path + ": queries: must be \"symbols\" or \"embeddings\" (got " + doc["queries"].dump() + ")");
  Vocabulary vocab;
  vocab.mode = parse_token_mode(doc["tokens"].get<std::string>());
  vocab.queries = doc["queries"].get<std::string>();
  if (mode && *mode != vocab.mode)
    throw ValueError(path + ": tokens: the vocabulary splits the text into " + token_mode_name(vocab.mode) +
                     ", not " + token_mode_name(*mode) + " (--tokens)");
  if (!doc["entries"].is_array() || doc["entries"].empty())
    throw ValueError(path + ": entries: must be a non-empty array of tokens");
  for (size_t k = 0; k < doc["entries"].size(); ++k) {
    const nlohmann::json& entry = doc["entries"][k];
    const std::string where = path + ": entries[" + std::to_string(k) + "]";
    add_entry(vocab, token_of(entry, where), where);
  }
  return vocab;
}

}  // namespace

std::string vocabulary_path_of(const std::string& model_path) {
  constexpr std::string_view kJson = ".json";
  const bool json = model_path.size() > kJson.size() && model_path.ends_with(kJson);
  return (json ? model_path.substr(0, model_path.size() - kJson.size()) : model_path) + ".vocab.json";
}

std::string vocabulary_text(const Vocabulary& vocab) {
  std::string out = std::string("{\"format\": \"") + kVocabularyFormat + "\", \"tokens\": \"" +
                    token_mode_name(vocab.mode) + "\", \"queries\": \"" + vocab.queries + "\", \"entries\": [\n";
  for (size_t k = 0; k < vocab.tokens.size(); ++k)
    out += token_json(vocab.tokens[k]) + (k + 1 < vocab.tokens.size() ? ",\n" : "\n");
  return out + "]}\n";
}

Vocabulary read_vocabulary(const std::string& path, std::optional<TokenMode> mode) {
  const std::string text = read_input_file(path, "the vocabulary");
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '{') return read_vocabulary_document(path, text, mode);
  Vocabulary vocab;
  vocab.mode = mode.value_or(TokenMode::kWords);
  size_t begin = 0;
  int64_t line = 1;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string token = text.substr(begin, end - begin);
    if (!token.empty() && token.back() == '\r') token.pop_back();
    add_entry(vocab, std::move(token), path + ": line " + std::to_string(line));
    begin = end + 1;
    ++line;
  }
  if (vocab.size() == 0) throw ValueError(path + ": the vocabulary is empty");
  return vocab;
}

Matrix read_embeddings(const std::string& path, const Vocabulary& vocab, const std::string& vocab_path) {
  const std::string bytes = read_input_file(path, "the embeddings");
  NpyArray table;
  std::string name = path;
  if (bytes.rfind("PK", 0) == 0) {
    std::map<std::string, NpyArray> arrays = read_npz(path);
    const auto named = arrays.find("embeddings");
    if (named == arrays.end() && arrays.size() != 1)
      throw ValueError(path + ": holds " + std::to_string(arrays.size()) +
                       " arrays; name the table 'embeddings' (numpy.savez(path, embeddings=E))");
    const auto chosen = named != arrays.end() ? named : arrays.begin();
    name = path + ": " + chosen->first;
    table = std::move(chosen->second);
  } else {
    table = parse_npy(bytes, path);
  }
  if (table.kind != NpyArray::Kind::kFloat || table.shape.size() != 2)
    throw ValueError(name + ": the embeddings must be a 2-D float array (S, D) (got " +
                     std::string(table.kind == NpyArray::Kind::kFloat ? "float" : "integer") + " shape " +
                     table.shape_text() + ")");
  if (table.shape[0] != vocab.size() || table.shape[1] < 1)
    throw ValueError(name + ": has shape " + table.shape_text() + " but " + vocab_path + " lists " +
                     std::to_string(vocab.size()) + " tokens: the embeddings need one row per token and D >= 1 "
                     "columns");
  Matrix out(table.shape[0], table.shape[1]);
  std::copy(table.reals.begin(), table.reals.end(), out.data());
  return out;
}

}  // namespace attnmix::cli
