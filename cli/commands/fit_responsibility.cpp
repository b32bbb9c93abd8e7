// SPDX-License-Identifier: Apache-2.0
// `attnmix fit --family responsibility`: reads RA data files (--data, --valid) or a text corpus
// (--text), settles S, N, D, T and builds the estimator from the library's options with the flags
// that were given.
#include <string>
#include <utility>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/family/spec.hpp"
#include "cli_support.hpp"
#include "commands/fit_data.hpp"
#include "commands/fit_problem.hpp"
#include "text_corpus.hpp"

namespace attnmix::cli {

namespace {

/// Data and dimensions of a responsibility fit, before the estimator is built: the rows of --data files (encoded
/// once the estimator exists) or the batches of a --text corpus.
struct RaInput {
  FitProblem problem;
  Dims dims;
  std::optional<FitRows> rows;
};

/// The dimensions the flags and the --init model declare (init_model: the --init model, or null).
Dims declared_dims(const FitArgs& args, const FitInit* init, const ResponsibilityAttention* init_model) {
  const auto model_dim = [&](int64_t (ResponsibilityAttention::*dim)() const) {
    return init_model ? (init_model->*dim)() : 0;
  };
  return cli::declared_dims(
      {{"S", settle_dim(args.symbols_opt, args.symbols, "--symbols", "S", init,
                        model_dim(&ResponsibilityAttention::n_symbols))},
       {"N", settle_dim(args.context_length_opt, args.context_length, "--context-length", "N", init,
                        model_dim(&ResponsibilityAttention::context_length))},
       {"D", settle_dim(args.query_dim_opt, args.query_dim, "--query-dim", "D", init,
                        model_dim(&ResponsibilityAttention::query_dim))},
       {"T", settle_dim(args.targets_opt, args.targets, "--targets", "T", init,
                        model_dim(&ResponsibilityAttention::n_targets))}});
}

RaInput read_data_files(const FitArgs& args, const Dims& declared) {
  RaInput input;
  input.rows = read_fit_rows(args, declared, *responsibility_attention_family().schema);
  input.dims = input.rows->dims;
  return input;
}

RaInput read_text_corpus(const FitArgs& args, const Dims& declared) {
  const auto given_dim = [&](const char* symbol) -> std::optional<Dim> {
    const auto it = declared.find(symbol);
    return it == declared.end() ? std::nullopt : std::optional<Dim>(it->second);
  };
  const std::optional<Dim> n_symbols = given_dim("S"), context_length = given_dim("N"), query_dim = given_dim("D"),
                           n_targets = given_dim("T");
  if (!context_length)
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
  const int64_t N = context_length->value;
  const auto check_length = [&](const TokenizedText& t, const std::string& path) {
    if (static_cast<int64_t>(t.ids.size()) <= N)
      throw ValueError(path + ": has " + std::to_string(t.ids.size()) + " " + token_kind +
                       "; a context of N = " + std::to_string(N) + " needs at least " +
                       std::to_string(N + 1));
  };
  check_length(train, args.text);
  if (valid) check_length(*valid, args.valid);
  int64_t S = V;
  if (n_symbols) {
    if (n_symbols->value < V)
      throw ValueError(args.text + ": has " + std::to_string(V) + " distinct " + token_kind +
                       " but " + dim_text("S", *n_symbols));
    S = n_symbols->value;
  }
  if (query_dim && query_dim->value != S)
    throw ValueError(dim_text("D", *query_dim) +
                     " does not fit a text corpus: its queries are one-hot codes of the current "
                     "token, so D = S = " +
                     std::to_string(S));
  int64_t T = S;
  if (n_targets) {
    if (n_targets->value < V)
      throw ValueError(args.text + ": has " + std::to_string(V) + " distinct " + token_kind +
                       " (every one can be a target) but " + dim_text("T", *n_targets));
    T = n_targets->value;
  }
  const std::string from = "the text";
  RaInput input;
  input.dims = Dims{{"S", Dim{S, from}}, {"N", *context_length}, {"D", Dim{S, from}}, {"T", Dim{T, from}}};
  input.problem.data_note =
      " (vocabulary: " + std::to_string(V) + " distinct " + token_kind + ")";
  input.problem.train = AnyBatch(sequence_to_triples(train.ids, N, S));
  if (valid) input.problem.valid = AnyBatch(sequence_to_triples(valid->ids, N, S));
  input.problem.train_source = args.text;
  input.problem.valid_source = args.valid;
  input.problem.train_counts = {input.problem.train.n_rows()};
  if (input.problem.valid) input.problem.valid_total = input.problem.valid->n_rows();
  // Triple r predicts token r + N: locate it by that token's line.
  input.problem.train_origin.source = args.text;
  for (size_t r = 0; r + static_cast<size_t>(N) < train.ids.size(); ++r)
    input.problem.train_origin.line_of_row.push_back(
        train.line_of_token[r + static_cast<size_t>(N)]);
  return input;
}

}  // namespace

FitProblem prepare_responsibility_fit(const FitArgs& args, const FitInit* init) {
  if (given(args.tokens_opt) && args.text.empty())
    throw UsageError("--tokens applies only to --text corpora");
  const ResponsibilityAttention* init_model =
      init ? &init_model_as<ResponsibilityAttention>(*init, args.family) : nullptr;
  const Dims declared = declared_dims(args, init, init_model);
  RaInput input =
      args.text.empty() ? read_data_files(args, declared) : read_text_corpus(args, declared);
  ResponsibilityAttentionEstimatorOptions options;  // the library's M-step defaults
  options.sigma2 = settle_sigma2(args, init, init_model ? init_model->sigma2() : 0.0, options.sigma2);
  if (given(args.emission_smoothing_opt)) options.emission_smoothing = args.emission_smoothing;
  if (given(args.min_sigma2_opt)) options.min_sigma2 = args.min_sigma2;
  options.estimate_sigma2 = args.estimate_sigma2;
  options.precision = parse_precision(args.precision, "--precision");
  const Dims& d = input.dims;
  const auto S = d.at("S").value, N = d.at("N").value, D = d.at("D").value, T = d.at("T").value;
  FitProblem& problem = input.problem;
  problem.mechanism = "responsibility attention";
  if (init_model && options.precision != init_model->precision())
    problem.initial = AnyDistribution(ResponsibilityAttention(init_model->params(), options.precision));
  problem.estimator = build_estimator([&] { return ResponsibilityAttentionEstimator(S, N, D, T, options); },
                                      {{"S", &d.at("S")}, {"N", &d.at("N")}, {"D", &d.at("D")}, {"T", &d.at("T")}});
  if (input.rows) take_fit_rows(problem, std::move(*input.rows), args, responsibility_attention_family().encode);
  problem.dims_brief = "S=" + std::to_string(S) + ", N=" + std::to_string(N) +
                       ", D=" + std::to_string(D) + ", T=" + std::to_string(T);
  problem.dims_summary = "S=" + std::to_string(S) + " symbols, N=" + std::to_string(N) +
                         " context positions, D=" + std::to_string(D) +
                         " query dims, T=" + std::to_string(T) + " targets";
  return std::move(problem);
}

}  // namespace attnmix::cli
