// SPDX-License-Identifier: Apache-2.0
// `attnmix fit --family responsibility`: reads RA data files (--data, --valid) or a text corpus
// (--text), settles S, N, D, T and builds the estimator from the library's options with the flags
// that were given.
#include <string>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "cli_support.hpp"
#include "commands/fit_problem.hpp"
#include "data_io.hpp"
#include "text_corpus.hpp"

namespace attnmix::cli {

namespace {

/// Data and dimensions of a responsibility fit, before the estimator is built.
struct RaInput {
  FitProblem problem;
  RaDims dims;
};

RaInput read_data_files(const FitArgs& args) {
  RaDims declared{flag_dim(args.symbols_opt, args.symbols, "--symbols"),
                  flag_dim(args.context_length_opt, args.context_length, "--context-length"),
                  flag_dim(args.query_dim_opt, args.query_dim, "--query-dim"),
                  flag_dim(args.targets_opt, args.targets, "--targets")};
  RaInput input;
  RaRows train_rows = read_ra_rows(args.data, declared, TargetPolicy::kRequired);
  input.problem.train_source = args.data;
  std::optional<RaRows> valid_rows;
  if (!args.valid.empty()) {
    RaDims valid_declared = declared;  // the validation rows must have the training rows' N and D
    if (!valid_declared.context_length)
      valid_declared.context_length = Dim{train_rows.contexts.cols(), "the training data " + args.data};
    if (!valid_declared.query_dim)
      valid_declared.query_dim = Dim{train_rows.queries.cols(), "the training data " + args.data};
    valid_rows = read_ra_rows(args.valid, valid_declared, TargetPolicy::kRequired);
    input.problem.valid_source = args.valid;
  }
  std::vector<const RaRows*> sets{&train_rows};
  if (valid_rows) sets.push_back(&*valid_rows);
  input.dims = infer_ra_dims(declared, sets);
  input.problem.train = AnyBatch(encode_ra_rows(train_rows, input.dims));
  if (valid_rows) input.problem.valid = AnyBatch(encode_ra_rows(*valid_rows, input.dims));
  input.problem.train_origin = std::move(train_rows);
  return input;
}

RaInput read_text_corpus(const FitArgs& args) {
  if (!given(args.context_length_opt))
    throw UsageError(
        "--text needs --context-length N: how many tokens (the current one included) each "
        "prediction attends over");
  const TokenMode mode = parse_token_mode(args.tokens);
  const std::string token_kind = mode == TokenMode::kChars ? "characters" : "words";
  Vocabulary vocab;
  const TokenizedText train = tokenize_text(args.text, mode, vocab, /*grow=*/true);
  std::optional<TokenizedText> valid;
  if (!args.valid.empty()) valid = tokenize_text(args.valid, mode, vocab, /*grow=*/false);
  const int64_t V = vocab.size();
  const int64_t N = args.context_length;
  const auto check_length = [&](const TokenizedText& t, const std::string& path) {
    if (static_cast<int64_t>(t.ids.size()) <= N)
      throw ValueError(path + ": has " + std::to_string(t.ids.size()) + " " + token_kind +
                       "; a context of N = " + std::to_string(N) + " needs at least " +
                       std::to_string(N + 1));
  };
  check_length(train, args.text);
  if (valid) check_length(*valid, args.valid);
  int64_t S = V;
  if (given(args.symbols_opt)) {
    if (args.symbols < V)
      throw ValueError(args.text + ": has " + std::to_string(V) + " distinct " + token_kind +
                       " but --symbols is " + std::to_string(args.symbols));
    S = args.symbols;
  }
  if (given(args.query_dim_opt) && args.query_dim != S)
    throw ValueError("--query-dim " + std::to_string(args.query_dim) +
                     " does not fit a text corpus: its queries are one-hot codes of the current "
                     "token, so D = S = " +
                     std::to_string(S));
  int64_t T = S;
  if (given(args.targets_opt)) {
    if (args.targets < V)
      throw ValueError(args.text + ": has " + std::to_string(V) + " distinct " + token_kind +
                       " (every one can be a target) but --targets is " +
                       std::to_string(args.targets));
    T = args.targets;
  }
  const std::string from = "the text";
  RaInput input;
  input.dims = RaDims{Dim{S, from}, Dim{N, "--context-length"}, Dim{S, from}, Dim{T, from}};
  input.problem.data_note =
      " (vocabulary: " + std::to_string(V) + " distinct " + token_kind + ")";
  input.problem.train = AnyBatch(sequence_to_triples(train.ids, N, S));
  if (valid) input.problem.valid = AnyBatch(sequence_to_triples(valid->ids, N, S));
  input.problem.train_source = args.text;
  input.problem.valid_source = args.valid;
  // Triple r predicts token r + N: locate it by that token's line.
  input.problem.train_origin.source = args.text;
  for (size_t r = 0; r + static_cast<size_t>(N) < train.ids.size(); ++r)
    input.problem.train_origin.line_of_row.push_back(
        train.line_of_token[r + static_cast<size_t>(N)]);
  return input;
}

}  // namespace

FitProblem prepare_responsibility_fit(const FitArgs& args) {
  if (given(args.tokens_opt) && args.text.empty())
    throw UsageError("--tokens applies only to --text corpora");
  RaInput input = args.text.empty() ? read_data_files(args) : read_text_corpus(args);
  ResponsibilityAttentionEstimatorOptions options;  // the library's M-step defaults
  if (given(args.sigma2_opt)) options.sigma2 = args.sigma2;
  if (given(args.emission_smoothing_opt)) options.emission_smoothing = args.emission_smoothing;
  if (given(args.min_sigma2_opt)) options.min_sigma2 = args.min_sigma2;
  options.estimate_sigma2 = args.estimate_sigma2;
  const RaDims& d = input.dims;
  const auto S = d.n_symbols->value, N = d.context_length->value, D = d.query_dim->value,
             T = d.n_targets->value;
  FitProblem& problem = input.problem;
  problem.mechanism = "responsibility attention";
  problem.estimator = AnyEstimator(ResponsibilityAttentionEstimator(S, N, D, T, options));
  problem.dims_brief = "S=" + std::to_string(S) + ", N=" + std::to_string(N) +
                       ", D=" + std::to_string(D) + ", T=" + std::to_string(T);
  problem.dims_summary = "S=" + std::to_string(S) + " symbols, N=" + std::to_string(N) +
                         " context positions, D=" + std::to_string(D) +
                         " query dims, T=" + std::to_string(T) + " targets";
  return std::move(problem);
}

}  // namespace attnmix::cli
