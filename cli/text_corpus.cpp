// SPDX-License-Identifier: Apache-2.0
// Text corpora → token ids (UTF-8 characters or whitespace-separated words), vocabulary in
// first-appearance order.
#include "text_corpus.hpp"

#include <string>

#include "attnmix/core/errors.hpp"
#include "attnmix/io/input_file.hpp"
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

TokenizedText tokenize_text(const std::string& path, TokenMode mode, Vocabulary& vocab, bool grow) {
  const std::string text = read_input_file(path, "the text file");

  TokenizedText out;
  int64_t line = 1;
  const auto emit = [&](std::string token, int64_t token_line) {
    auto it = vocab.ids.find(token);
    if (it == vocab.ids.end()) {
      if (!grow)
        throw ValueError(path + ": line " + std::to_string(token_line) + ": token '" +
                         printable(token) + "' is not in the training text's vocabulary");
      it = vocab.ids.emplace(token, vocab.size()).first;
      vocab.tokens.push_back(std::move(token));
    }
    out.ids.push_back(it->second);
    out.line_of_token.push_back(token_line);
  };
  size_t i = 0;
  while (i < text.size()) {
    if (mode == TokenMode::kChars) {
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

}  // namespace attnmix::cli
