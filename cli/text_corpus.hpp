// SPDX-License-Identifier: Apache-2.0
/// @file text_corpus.hpp
/// Plain-text corpora for `attnmix fit --text`, `score --text` and `predict --text` (docs/mechanisms.md, "Text"):
/// the file is split into characters (UTF-8 code points; a byte that is not valid UTF-8 becomes a token of its own;
/// newlines are characters too) or, with `--tokens words`, into whitespace-separated words, and the tokens become ids
/// through a vocabulary. A fit without --vocabulary reads the one next to its --init model, or builds one in order of
/// first appearance; every --text fit writes the vocabulary it used next to the model (vocabulary_path_of), and score
/// and predict read it there. A vocabulary file is that JSON document or a plain list of tokens, one per line (line
/// k: id k), such as embedding tables ship.
/// Unknown tokens (absent from a fixed vocabulary) map to its "<unk>" entry when it has one and are an error naming
/// the file, line and token otherwise.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attnmix/core/types.hpp"

namespace attnmix::cli {

enum class TokenMode { kChars, kWords };

/// The entry of a fixed vocabulary that tokens outside it map to.
inline constexpr const char* kUnknownToken = "<unk>";

/// Token text ↔ id, how the text was split and what the model's queries were.
struct Vocabulary {
  TokenMode mode = TokenMode::kChars;
  std::string queries;                 ///< "symbols" or "embeddings" (a fit's document), "" (a plain list)
  std::vector<std::string> tokens;     ///< tokens[id]
  std::map<std::string, int64_t> ids;  ///< the inverse of tokens
  [[nodiscard]] int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

/// The token ids of a file, with the 1-based line each token starts on.
struct TokenizedText {
  std::vector<int64_t> ids;
  std::vector<int64_t> line_of_token;
  int64_t unknown = 0;  ///< tokens mapped to "<unk>" (a fixed vocabulary's)
};

/// Splits `path` into tokens of vocab.mode. With grow = true unseen tokens join `vocab` (in order of first
/// appearance); with grow = false they map to vocab's "<unk>" entry, or are a ValueError naming the file, line and
/// token, and `vocabulary_name` ("the training text's vocabulary", "the vocabulary m.vocab.json").
/// @throws IoError when the file can't be read.
[[nodiscard]] TokenizedText tokenize_text(const std::string& path, Vocabulary& vocab, bool grow,
                                          const std::string& vocabulary_name = "the training text's vocabulary");

/// "chars" → kChars, "words" → kWords.
[[nodiscard]] TokenMode parse_token_mode(const std::string& text);
/// "chars" or "words".
[[nodiscard]] const char* token_mode_name(TokenMode mode);
/// "characters" or "words": what a text of this mode is made of, in messages.
[[nodiscard]] const char* token_kind(TokenMode mode);

/// Checks that the text at `path` has more tokens than the context N, which its first row needs.
/// @throws ValueError naming the file, its token count and N.
void check_text_length(const TokenizedText& text, const std::string& path, int64_t context, TokenMode mode);

/// Where a --text fit writes the vocabulary of the model at `model_path`: "lm.json" → "lm.vocab.json", any other
/// name + ".vocab.json".
[[nodiscard]] std::string vocabulary_path_of(const std::string& model_path);

/// The vocabulary document: {"format": "attnmix-vocabulary", "tokens": "chars"|"words", "queries":
/// "symbols"|"embeddings", "entries": [token of id 0, …]} (JSON strings, so a newline is written exactly; a token that
/// is not UTF-8 as the array of its byte values); "queries" says whether the model was fitted with --embeddings, which
/// scoring then needs again.
[[nodiscard]] std::string vocabulary_text(const Vocabulary& vocab);

/// Reads a vocabulary file: the document vocabulary_text writes (its "tokens" must agree with `mode` when given), or
/// a plain list of tokens, one per line (CR LF accepted), split as `mode` (words when not given). Every entry must be
/// a token of its mode (a word without white space, one character) and appear once.
/// @throws ValueError naming the file, line or field; IoError when it can't be read.
[[nodiscard]] Vocabulary read_vocabulary(const std::string& path, std::optional<TokenMode> mode);

/// The query embeddings of a vocabulary: a 2-D float array (S, D) in an .npy file, or the only array (or the array
/// "embeddings") of an .npz archive, with one row per entry of `vocab`. @throws ValueError naming the file, the array
/// and the shape; IoError when it can't be read.
[[nodiscard]] Matrix read_embeddings(const std::string& path, const Vocabulary& vocab, const std::string& vocab_path);

}  // namespace attnmix::cli
