// SPDX-License-Identifier: Apache-2.0
// `attnmix fit`'s problem for any family (fit_problem.hpp): sizes from the flags, the --init model and the data;
// options from the flags over the family's defaults (the model's for the options it stores); the rows of --data
// files (fit_data.hpp) or the tokens of a --text corpus; the estimator.
#include "commands/fit_problem.hpp"

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "cli_support.hpp"
#include "commands/fit_data.hpp"
#include "text_corpus.hpp"

namespace attnmix::cli {

const FamilyFlag* given_flag(const FitArgs& args, std::string_view name) {
  const auto it = args.flags.find(name);
  return it != args.flags.end() && given(it->second.option) ? &it->second : nullptr;
}

namespace {

/// "sigma2" → "sigma2", "prior_strength" → "prior-strength": an option's flag.
std::string flag_name(std::string_view option) {
  std::string out(option);
  for (char& c : out)
    if (c == '_') c = '-';
  return out;
}

/// The sizes the flags and the --init model declare. Without --init a size is its flag's value when given; with
/// --init, every size the model fixes is the model's, and a flag given for it must equal it. Sizes the data do not
/// give (a fallback) default to it.
/// @throws ValueError ("--symbols 10 does not match the --init model a.json (S = 12)").
Dims declared_sizes(const FitSpec& fit, const FitArgs& args, const FitInit* init) {
  const Dims fixed = init ? fit.model_sizes(init->model) : Dims{};
  Dims declared;
  for (const SizeSpec& size : fit.sizes) {
    const std::string symbol(size.symbol), flag = "--" + std::string(size.flag);
    const FamilyFlag* given = given_flag(args, size.flag);
    const int64_t value = given ? std::get<int64_t>(given->value) : 0;
    if (const auto model = fixed.find(symbol); model != fixed.end()) {
      if (given && value != model->second.value)
        throw ValueError(flag + " " + std::to_string(value) + " does not match the --init model " + init->path +
                         " (" + symbol + " = " + std::to_string(model->second.value) + ")");
      declared[symbol] = Dim{model->second.value, "the --init model " + init->path};
    } else if (given) {
      declared[symbol] = Dim{value, flag};
    } else if (size.fallback) {
      declared[symbol] = Dim{*size.fallback, "the default"};
    }
  }
  return declared;
}

/// The options given as flags; with --init, the options the model stores are the model's, and a flag given for one
/// must equal it. @throws ValueError ("--sigma2 0.5 does not match the --init model a.json (sigma2 = 0.1…); leave
/// --sigma2 out to continue with the model's").
OptionValues declared_options(const FitSpec& fit, const FitArgs& args, const FitInit* init) {
  const OptionValues stored = init && fit.model_options ? fit.model_options(init->model) : OptionValues{};
  OptionValues values;
  for (const OptionSpec& spec : fit.options) {
    const std::string name(spec.name), flag = "--" + flag_name(spec.name);
    const FamilyFlag* given = given_flag(args, flag_name(spec.name));
    if (const auto model = stored.find(name); model != stored.end()) {
      if (given && given->value != model->second)
        throw ValueError(flag + " " + option_text(given->value) + " does not match the --init model " + init->path +
                         " (" + name + " = " + option_text(model->second) + "); leave " + flag +
                         " out to continue with the model's");
      values[name] = model->second;
    } else if (given) {
      values[name] = given->value;
    }
  }
  return values;
}

/// The rows of a --text corpus (and of --valid, a text too), and the sizes the family gives them: tokens through the
/// --vocabulary (else the one next to the --init model, so that its symbols keep their ids, else one built from the
/// text), queries from the --embeddings (or the tokens' symbols).
void read_text_corpus(const FamilySpec& family, const FitArgs& args, Dims& dims, FitProblem& problem) {
  const auto N = dims.find("N");
  if (N == dims.end())
    throw UsageError(
        "--text needs --context-length N: how many tokens (the current one included) each prediction attends over");
  const TokenMode mode = parse_token_mode(args.tokens);
  std::string vocabulary_path = args.vocabulary;
  if (vocabulary_path.empty() && !args.init.empty() && std::filesystem::exists(vocabulary_path_of(args.init)))
    vocabulary_path = vocabulary_path_of(args.init);
  if (!args.embeddings.empty() && vocabulary_path.empty())
    throw UsageError("--embeddings needs --vocabulary FILE: the token of each row of the table (one per line)");
  const bool fixed = !vocabulary_path.empty();
  Vocabulary vocab;  // built from the text in its order of first appearance, unless a vocabulary file fixes it
  vocab.mode = mode;
  if (fixed) vocab = read_vocabulary(vocabulary_path, given_flag(args, "tokens") ? std::optional(mode) : std::nullopt);
  const std::string vocabulary_name = fixed ? "the vocabulary " + vocabulary_path : "the training text's vocabulary";
  const TokenizedText train = tokenize_text(args.text, vocab, /*grow=*/!fixed, vocabulary_name);
  std::optional<TokenizedText> valid;
  if (!args.valid.empty()) valid = tokenize_text(args.valid, vocab, /*grow=*/false, vocabulary_name);
  const int64_t context = N->second.value;
  check_text_length(train, args.text, context, vocab.mode);
  if (valid) check_text_length(*valid, args.valid, context, vocab.mode);
  std::optional<Matrix> embeddings;
  if (!args.embeddings.empty()) embeddings = read_embeddings(args.embeddings, vocab, vocabulary_path);
  dims = family.fit.text.dims(vocab.size(), dims, args.text, token_kind(vocab.mode),
                              embeddings ? embeddings->cols() : 0);
  problem.data_note = " (vocabulary: " + std::to_string(vocab.size()) + " " + (fixed ? "" : "distinct ") +
                      token_kind(vocab.mode) + (fixed ? " from " + vocabulary_path : "") +
                      (train.unknown > 0 ? ", " + std::to_string(train.unknown) + " unknown as " + kUnknownToken : "") +
                      ")";
  const Matrix* table = embeddings ? &*embeddings : nullptr;
  problem.train = family.fit.text.rows(train.ids, dims, table);
  if (valid) problem.valid = family.fit.text.rows(valid->ids, dims, table);
  vocab.queries = embeddings ? "embeddings" : "symbols";
  problem.vocabulary = vocabulary_text(vocab);
  problem.train_source = args.text;
  problem.valid_source = args.valid;
  problem.train_counts = {problem.train.n_rows()};
  if (problem.valid) problem.valid_total = problem.valid->n_rows();
  // Row r predicts token r + N: locate it by that token's line.
  problem.train_origin.source = args.text;
  for (size_t r = 0; r + static_cast<size_t>(context) < train.ids.size(); ++r)
    problem.train_origin.line_of_row.push_back(train.line_of_token[r + static_cast<size_t>(context)]);
}

/// The family's estimator for these sizes and options. Its constructor checks that the statistics of these sizes
/// can exist (at most 2^48 entries each); a ValueError it throws is rethrown with where each size came from, so a
/// huge id in the data or a huge flag is traced to its line or flag: "ChainedAttentionEstimator: statistic key_num
/// (…) must have at most 2^48 elements (S = 4611686018427387905 (from the largest key, value or query id at
/// ca.jsonl: line 3, field keys), T = 6 (from the largest target))".
AnyEstimator build_estimator(const FamilySpec& family, const Dims& dims, const OptionValues& options,
                             const FitArgs& args, const FitInit* init, const AnyBatch* rows) {
  try {
    return family.fit.make_estimator({.sizes = dims,
                                      .options = options,
                                      .seed = args.optimize.seed,
                                      .rows = rows,
                                      .communicator = args.communicator},
                                     init ? &init->model : nullptr);
  } catch (const ValueError& e) {
    std::string origins;
    for (const SizeSpec& size : family.fit.sizes)
      if (const auto it = dims.find(size.symbol); it != dims.end() && !size.fallback)
        origins += (origins.empty() ? " (" : ", ") + dim_text(std::string(size.symbol).c_str(), it->second);
    throw ValueError(std::string(e.what()) + (origins.empty() ? "" : origins + ")"));
  }
}

}  // namespace

FitProblem prepare_fit(const FamilySpec& family, const FitArgs& args, const FitInit* init) {
  const FitSpec& fit = family.fit;
  for (const char* flag : {"tokens", "vocabulary", "embeddings"})
    if (given_flag(args, flag) && args.text.empty())
      throw UsageError("--" + std::string(flag) + " applies only to --text corpora");
  if (init && &spec_of(init->model) != &family)
    throw ValueError(init->path + ": --init holds a " + init->model.family() + " model, but --family " + args.family +
                     " fits " + std::string(family.file_family) +
                     " models (start from a model of that family, or leave out --init)");
  FitProblem problem;
  Dims dims = declared_sizes(fit, args, init);
  const OptionValues options = declared_options(fit, args, init);
  std::optional<FitRows> rows;
  if (args.text.empty()) {
    rows = read_fit_rows(args, dims, *family.schema);
    dims = rows->dims;
  } else {
    read_text_corpus(family, args, dims, problem);
  }
  problem.mechanism = fit.mechanism ? fit.mechanism(dims) : std::string(family.title);
  if (init && fit.initial) problem.initial = fit.initial(init->model, options);
  // Built before the rows are encoded: sizes too large for the model fail here, before anything is sized. A family
  // whose statistics take their shape from the rows (sparse tables) has its estimator built from them.
  if (!fit.shaped_by_data) problem.estimator = build_estimator(family, dims, options, args, init, nullptr);
  if (rows) take_fit_rows(problem, std::move(*rows), args, family.encode);
  if (fit.shaped_by_data) problem.estimator = build_estimator(family, dims, options, args, init, &problem.train);
  for (const SizeSpec& size : fit.sizes) {
    const int64_t value = dims.at(std::string(size.symbol)).value;
    const std::string text = std::string(size.symbol) + "=" + std::to_string(value);
    problem.dims_brief += (problem.dims_brief.empty() ? "" : ", ") + text;
    problem.dims_summary += (problem.dims_summary.empty() ? "" : ", ") + text + " " +
                            std::string(value == 1 && !size.one.empty() ? size.one : size.noun);
  }
  return problem;
}

}  // namespace attnmix::cli
