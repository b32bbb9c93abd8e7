// SPDX-License-Identifier: Apache-2.0
/// @file text_corpus.hpp
/// Plain-text corpora for `attnmix fit --text` (docs/model-format.md): the file is split into characters
/// (UTF-8 code points; a byte that is not valid UTF-8 becomes a token of its own; newlines are
/// characters too) or, with
/// `--tokens words`, into whitespace-separated words. Tokens get ids in order of first appearance;
/// the vocabulary is not saved (the fit summary prints its size).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace attnmix::cli {

enum class TokenMode { kChars, kWords };

/// Token text ↔ id, ids in order of first appearance.
struct Vocabulary {
  std::vector<std::string> tokens;
  std::map<std::string, int64_t> ids;
  [[nodiscard]] int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

/// The token ids of a file, with the 1-based line each token starts on.
struct TokenizedText {
  std::vector<int64_t> ids;
  std::vector<int64_t> line_of_token;
};

/// Splits `path` into tokens. With grow = true unseen tokens join `vocab`; with grow = false
/// (validation text) an unseen token is a ValueError naming the file and line. @throws
/// std::runtime_error when the file can't be read.
[[nodiscard]] TokenizedText tokenize_text(const std::string& path, TokenMode mode,
                                          Vocabulary& vocab, bool grow);

/// "chars" → kChars, "words" → kWords.
[[nodiscard]] TokenMode parse_token_mode(const std::string& text);

}  // namespace attnmix::cli
