// SPDX-License-Identifier: Apache-2.0
// `attnmix fit --family responsibility`: reads RA data files (--data, --valid) or a text corpus
// (--text), settles S, N, D, T and builds the estimator from the library's options with the flags
// that were given.
#include <string>
#include <utility>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "cli_support.hpp"
#include "commands/fit_data.hpp"
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

/// The dimensions the flags and the --init model declare (init_model: the --init model, or null).
RaDims declared_dims(const FitArgs& args, const FitInit* init,
                     const ResponsibilityAttention* init_model) {
  const auto model_dim = [&](int64_t (ResponsibilityAttention::*dim)() const) {
    return init_model ? (init_model->*dim)() : 0;
  };
  return RaDims{settle_dim(args.symbols_opt, args.symbols, "--symbols", "S", init,
                           model_dim(&ResponsibilityAttention::n_symbols)),
                settle_dim(args.context_length_opt, args.context_length, "--context-length", "N",
                           init, model_dim(&ResponsibilityAttention::context_length)),
                settle_dim(args.query_dim_opt, args.query_dim, "--query-dim", "D", init,
                           model_dim(&ResponsibilityAttention::query_dim)),
                settle_dim(args.targets_opt, args.targets, "--targets", "T", init,
                           model_dim(&ResponsibilityAttention::n_targets))};
}

/// Responsibility-attention rows: context (N) and query (D) widths.
const RowFormat<RaRows, RaDims>& ra_format() {
  static const RowFormat<RaRows, RaDims> format{
      &read_ra_rows,
      &infer_ra_dims,
      {{"context", "N", &RaDims::context_length, [](const RaRows& r) { return r.contexts.cols(); },
        [](RaRows& r, Index n) { r.contexts.resize(0, n); }},
       {"query", "D", &RaDims::query_dim, [](const RaRows& r) { return r.queries.cols(); },
        [](RaRows& r, Index d) { r.queries.resize(0, d); }}}};
  return format;
}

RaInput read_data_files(const FitArgs& args, const RaDims& declared) {
  RaInput input;
  FitRows<RaRows, RaDims> rows = read_fit_rows(args, declared, ra_format());
  input.problem.train_source = args.data;
  if (rows.valid) input.problem.valid_source = args.valid;
  input.dims = rows.dims;
  input.problem.train_counts = std::move(rows.train_counts);
  input.problem.valid_total = rows.valid_total;
  input.problem.train_origin = std::move(static_cast<RowOrigin&>(rows.train));
  // The row matrices move into the batches (no copy).
  input.problem.train = AnyBatch(encode_ra_rows(std::move(rows.train), input.dims));
  if (rows.valid) input.problem.valid = AnyBatch(encode_ra_rows(std::move(*rows.valid), input.dims));
  return input;
}

RaInput read_text_corpus(const FitArgs& args, const RaDims& declared) {
  if (!declared.context_length)
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
  const int64_t N = declared.context_length->value;
  const auto check_length = [&](const TokenizedText& t, const std::string& path) {
    if (static_cast<int64_t>(t.ids.size()) <= N)
      throw ValueError(path + ": has " + std::to_string(t.ids.size()) + " " + token_kind +
                       "; a context of N = " + std::to_string(N) + " needs at least " +
                       std::to_string(N + 1));
  };
  check_length(train, args.text);
  if (valid) check_length(*valid, args.valid);
  int64_t S = V;
  if (declared.n_symbols) {
    if (declared.n_symbols->value < V)
      throw ValueError(args.text + ": has " + std::to_string(V) + " distinct " + token_kind +
                       " but " + dim_text("S", *declared.n_symbols));
    S = declared.n_symbols->value;
  }
  if (declared.query_dim && declared.query_dim->value != S)
    throw ValueError(dim_text("D", *declared.query_dim) +
                     " does not fit a text corpus: its queries are one-hot codes of the current "
                     "token, so D = S = " +
                     std::to_string(S));
  int64_t T = S;
  if (declared.n_targets) {
    if (declared.n_targets->value < V)
      throw ValueError(args.text + ": has " + std::to_string(V) + " distinct " + token_kind +
                       " (every one can be a target) but " + dim_text("T", *declared.n_targets));
    T = declared.n_targets->value;
  }
  const std::string from = "the text";
  RaInput input;
  input.dims = RaDims{Dim{S, from}, *declared.context_length, Dim{S, from}, Dim{T, from}};
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
  const RaDims declared = declared_dims(args, init, init_model);
  RaInput input =
      args.text.empty() ? read_data_files(args, declared) : read_text_corpus(args, declared);
  ResponsibilityAttentionEstimatorOptions options;  // the library's M-step defaults
  options.sigma2 = settle_sigma2(args, init, init_model ? init_model->sigma2() : 0.0, options.sigma2);
  if (given(args.emission_smoothing_opt)) options.emission_smoothing = args.emission_smoothing;
  if (given(args.min_sigma2_opt)) options.min_sigma2 = args.min_sigma2;
  options.estimate_sigma2 = args.estimate_sigma2;
  options.precision = parse_precision(args.precision, "--precision");
  const RaDims& d = input.dims;
  const auto S = d.n_symbols->value, N = d.context_length->value, D = d.query_dim->value,
             T = d.n_targets->value;
  FitProblem& problem = input.problem;
  problem.mechanism = "responsibility attention";
  if (init_model && options.precision != init_model->precision())
    problem.initial = AnyDistribution(ResponsibilityAttention(init_model->params(), options.precision));
  problem.estimator = build_estimator([&] { return ResponsibilityAttentionEstimator(S, N, D, T, options); },
                                      {{"S", &*d.n_symbols}, {"N", &*d.context_length},
                                       {"D", &*d.query_dim}, {"T", &*d.n_targets}});
  problem.dims_brief = "S=" + std::to_string(S) + ", N=" + std::to_string(N) +
                       ", D=" + std::to_string(D) + ", T=" + std::to_string(T);
  problem.dims_summary = "S=" + std::to_string(S) + " symbols, N=" + std::to_string(N) +
                         " context positions, D=" + std::to_string(D) +
                         " query dims, T=" + std::to_string(T) + " targets";
  return std::move(problem);
}

}  // namespace attnmix::cli
