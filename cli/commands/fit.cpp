// SPDX-License-Identifier: Apache-2.0
// `attnmix fit`: reads training data (a data file or a text corpus), fits the chosen family by EM
// with the library's optimize(), prints the §1.7 progress lines with per-iteration seconds and a
// closing summary, and writes the model atomically only after a successful fit. Every default comes
// from the library's options structs.
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/core/json.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/progress.hpp"
#include "attnmix/inference/reduce.hpp"
#include "cli_support.hpp"
#include "commands/commands.hpp"
#include "data_io.hpp"
#include "text_corpus.hpp"

namespace attnmix::cli {

namespace {

/// Family names accepted by --family (SPEC.md §1.10), with their short aliases.
const std::vector<std::string> kFamilyNames{
    "responsibility", "ra", "chained", "ca", "variational", "vea", "variational-multihop", "vmha"};

struct FitArgs {
  std::string family = "responsibility";
  std::string data, text, tokens = "chars", out, valid;
  int64_t context_length = 0, symbols = 0, query_dim = 0, targets = 0;
  ResponsibilityAttentionEstimatorOptions estimator;  // the library's M-step defaults
  OptimizeOptions optimize;                           // the library's EM-loop defaults
  std::string delta;  // "none" or a number; initialised from optimize.delta
  bool classic = false;
  bool strict = false;
  CLI::Option* context_length_opt = nullptr;
  CLI::Option* symbols_opt = nullptr;
  CLI::Option* query_dim_opt = nullptr;
  CLI::Option* targets_opt = nullptr;
  CLI::Option* tokens_opt = nullptr;
};

std::string delta_text(const std::optional<double>& delta) {
  return delta ? format_double(*delta) : "none";
}

std::optional<double> parse_delta(const std::string& text) {
  if (text == "none") return std::nullopt;
  size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !std::isfinite(value))
    throw UsageError("--delta must be a number or 'none' (got '" + text + "')");
  return value;
}

/// Training (and validation) data ready for optimize(), with what the summary needs to say about
/// it.
struct FitInput {
  AnyBatch train;
  std::optional<AnyBatch> valid;
  RaDims dims;
  std::string train_source;
  std::string valid_source;
  std::optional<int64_t> vocabulary_size;  // text corpora only
  std::string token_kind;                  // "characters" / "words"
  RaRows train_rows;                       // locates rows for impossible-evidence messages
};

std::optional<Dim> flag_dim(const CLI::Option* option, int64_t value, const char* flag) {
  if (option->count() == 0) return std::nullopt;
  return Dim{value, flag};
}

FitInput read_data_files(const FitArgs& args) {
  RaDims declared{flag_dim(args.symbols_opt, args.symbols, "--symbols"),
                  flag_dim(args.context_length_opt, args.context_length, "--context-length"),
                  flag_dim(args.query_dim_opt, args.query_dim, "--query-dim"),
                  flag_dim(args.targets_opt, args.targets, "--targets")};
  FitInput input;
  input.train_rows = read_ra_rows(args.data, declared, TargetPolicy::kRequired);
  input.train_source = args.data;
  std::optional<RaRows> valid_rows;
  if (!args.valid.empty()) {
    RaDims valid_declared = declared;  // the validation rows must have the training rows' N and D
    if (!valid_declared.context_length)
      valid_declared.context_length =
          Dim{input.train_rows.contexts.cols(), "the training data " + args.data};
    if (!valid_declared.query_dim)
      valid_declared.query_dim =
          Dim{input.train_rows.queries.cols(), "the training data " + args.data};
    valid_rows = read_ra_rows(args.valid, valid_declared, TargetPolicy::kRequired);
    input.valid_source = args.valid;
  }
  std::vector<const RaRows*> sets{&input.train_rows};
  if (valid_rows) sets.push_back(&*valid_rows);
  input.dims = infer_ra_dims(declared, sets);
  input.train = AnyBatch(encode_ra_rows(input.train_rows, input.dims));
  if (valid_rows) input.valid = AnyBatch(encode_ra_rows(*valid_rows, input.dims));
  return input;
}

FitInput read_text_corpus(const FitArgs& args) {
  if (args.context_length_opt->count() == 0)
    throw UsageError(
        "--text needs --context-length N: how many tokens (the current one included) each "
        "prediction attends over");
  const TokenMode mode = parse_token_mode(args.tokens);
  FitInput input;
  input.token_kind = mode == TokenMode::kChars ? "characters" : "words";
  Vocabulary vocab;
  const TokenizedText train = tokenize_text(args.text, mode, vocab, /*grow=*/true);
  std::optional<TokenizedText> valid;
  if (!args.valid.empty()) valid = tokenize_text(args.valid, mode, vocab, /*grow=*/false);
  const int64_t V = vocab.size();
  const int64_t N = args.context_length;
  const auto check_length = [&](const TokenizedText& t, const std::string& path) {
    if (static_cast<int64_t>(t.ids.size()) <= N)
      throw ValueError(path + ": has " + std::to_string(t.ids.size()) + " " + input.token_kind +
                       "; a context of N = " + std::to_string(N) + " needs at least " +
                       std::to_string(N + 1));
  };
  check_length(train, args.text);
  if (valid) check_length(*valid, args.valid);
  int64_t S = V;
  if (args.symbols_opt->count()) {
    if (args.symbols < V)
      throw ValueError(args.text + ": has " + std::to_string(V) + " distinct " + input.token_kind +
                       " but --symbols is " + std::to_string(args.symbols));
    S = args.symbols;
  }
  if (args.query_dim_opt->count() && args.query_dim != S)
    throw ValueError("--query-dim " + std::to_string(args.query_dim) +
                     " does not fit a text corpus: its queries are "
                     "one-hot codes of the current token, so D = S = " +
                     std::to_string(S));
  int64_t T = S;
  if (args.targets_opt->count()) {
    if (args.targets < V)
      throw ValueError(args.text + ": has " + std::to_string(V) + " distinct " + input.token_kind +
                       " (every one can be a target) but --targets is " +
                       std::to_string(args.targets));
    T = args.targets;
  }
  const std::string from = "the text";
  input.dims = RaDims{Dim{S, from}, Dim{N, "--context-length"}, Dim{S, from}, Dim{T, from}};
  input.vocabulary_size = V;
  input.train = AnyBatch(sequence_to_triples(train.ids, N, S));
  if (valid) input.valid = AnyBatch(sequence_to_triples(valid->ids, N, S));
  input.train_source = args.text;
  input.valid_source = args.valid;
  // Triple r predicts token r + N: locate it by that token's line.
  input.train_rows.source = args.text;
  for (size_t r = 0; r + static_cast<size_t>(N) < train.ids.size(); ++r)
    input.train_rows.line_of_row.push_back(train.line_of_token[r + static_cast<size_t>(N)]);
  return input;
}

void print_progress(const IterationReport& report) {
  std::string line = format_progress_line(report);
  if (!line.empty() && line.back() == '\n') line.pop_back();
  std::cout << line << " (" << format_seconds(report.seconds) << " s)\n" << std::flush;
}

int run_fit(const FitArgs& args) {
  if (args.family != "responsibility" && args.family != "ra")
    throw UsageError("--family " + args.family +
                     ": this mechanism is not yet available in this build "
                     "(available: responsibility, alias ra)");
  if (args.data.empty() == args.text.empty())
    throw UsageError("give exactly one of --data FILE or --text FILE");
  if (args.tokens_opt->count() && args.text.empty())
    throw UsageError("--tokens applies only to --text corpora");
  OptimizeOptions options = args.optimize;
  options.delta = parse_delta(args.delta);
  options.reuse_estep_ll = !args.classic;
  options.on_iteration = print_progress;
  check_output_path(args.out);

  FitInput input = args.text.empty() ? read_data_files(args) : read_text_corpus(args);
  const RaDims& d = input.dims;
  const AnyEstimator estimator(
      ResponsibilityAttentionEstimator(d.n_symbols->value, d.context_length->value,
                                       d.query_dim->value, d.n_targets->value, args.estimator));
  const Index n_rows = input.train.n_rows();
  std::cout << "Fitting responsibility attention by EM to " << n_rows << " rows of "
            << input.train_source << " (S=" << d.n_symbols->value
            << ", N=" << d.context_length->value << ", D=" << d.query_dim->value
            << ", T=" << d.n_targets->value << ")\n"
            << std::flush;
  const auto start = std::chrono::steady_clock::now();
  std::optional<OptimizeResult<AnyDistribution>> fit;
  try {
    fit = optimize(input.train, estimator, options, std::nullopt,
                   input.valid ? &*input.valid : nullptr);
  } catch (const ImpossibleEvidenceError& e) {
    rethrow_with_lines(e, input.train_rows);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double total = score(fit->model, input.train, options.parallel());
  const bool converged = fit->status == OptimizeStatus::kConverged;

  // The closing summary.
  std::cout << "\nSummary\n";
  std::cout << "  data            " << n_rows << " rows from " << input.train_source;
  if (input.vocabulary_size)
    std::cout << " (vocabulary: " << *input.vocabulary_size << " distinct " << input.token_kind
              << ")";
  std::cout << "\n  dimensions      S=" << d.n_symbols->value
            << " symbols, N=" << d.context_length->value
            << " context positions, D=" << d.query_dim->value
            << " query dims, T=" << d.n_targets->value << " targets\n";
  std::cout << "  iterations      " << fit->n_iterations << " run; ";
  if (converged) {
    const auto& s = fit->scores;
    std::cout << "converged (the log-likelihood changed by "
              << format_short(s[s.size() - 1] - s[s.size() - 2], 3) << " < --delta "
              << delta_text(options.delta) << ")\n";
  } else if (!options.delta) {
    std::cout << "all --max-its iterations run (--delta none: no convergence test)\n";
  } else {
    std::cout << "NOT converged within --max-its " << options.max_its
              << " (raise --max-its to go on)\n";
  }
  std::cout << "  best model      ";
  if (fit->n_iterations == 0)
    std::cout << "the initial model (--max-its 0)\n";
  else
    std::cout << (fit->best_iteration > fit->n_iterations
                      ? "the model after the last iteration"
                      : "iteration " + std::to_string(fit->best_iteration))
              << " (the fit keeps the best-scoring model)\n";
  std::cout << "  log-likelihood  " << format_short(total / static_cast<double>(n_rows))
            << " per row (total " << format_short(total, 10) << ")\n";
  if (input.valid) {
    const double valid_total = score(fit->model, *input.valid, options.parallel());
    std::cout << "  validation      "
              << format_short(valid_total / static_cast<double>(input.valid->n_rows()))
              << " per row on " << input.valid->n_rows() << " rows of " << input.valid_source
              << "\n";
  }
  std::cout << "  time            " << format_seconds(seconds) << " s\n";
  if (args.strict && !converged) {
    std::cout << "  model           NOT written (--strict and the fit did not converge); "
              << args.out << " is unchanged\n";
    return kExitNotConverged;
  }
  save_model(fit->model, args.out);
  std::cout << "  model written   " << args.out << "\n";
  return kExitOk;
}

}  // namespace

void add_fit_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<FitArgs>();
  args->delta = delta_text(args->optimize.delta);
  CLI::App* cmd =
      app.add_subcommand("fit", "Fit a model to data by EM and save it as a JSON model file");
  cmd->footer(
      "Data: --data takes JSON Lines ({\"context\":[ids],\"query\":[reals],\"target\":id} per "
      "line) or a NumPy .npz "
      "archive (context (n,N) int, query (n,D) float, target (n,) int); --text takes a plain-text "
      "corpus, split into "
      "UTF-8 characters (or words with --tokens words) and turned into next-token triples with "
      "one-hot queries.\n"
      "Output: one progress line per iteration on stdout, then a summary. The model is written "
      "only after a "
      "successful fit, atomically; a failed fit leaves --out untouched.\n"
      "Exit codes: 0 ok, 1 usage, 2 data/I/O error, 3 not converged with --strict (the model is "
      "then not written).");
  cmd->add_option("--family", args->family,
                  "Mechanism: responsibility (ra); chained (ca), variational (vea), "
                  "variational-multihop (vmha) "
                  "are not yet available in this build")
      ->check(CLI::IsMember(kFamilyNames))
      ->capture_default_str();
  cmd->add_option("--data", args->data, "Training data: JSON Lines or .npz")->type_name("FILE");
  cmd->add_option("--text", args->text, "Training text corpus (plain text)")->type_name("FILE");
  args->tokens_opt = cmd->add_option("--tokens", args->tokens,
                                     "How --text is split: chars (UTF-8 characters) or words")
                         ->check(CLI::IsMember({"chars", "words"}))
                         ->capture_default_str();
  cmd->add_option("--out", args->out, "Where to write the fitted model (JSON)")
      ->required()
      ->type_name("FILE");
  cmd->add_option("--valid", args->valid,
                  "Validation data (same kind as the training input), scored each iteration")
      ->type_name("FILE");
  args->context_length_opt =
      cmd->add_option("--context-length", args->context_length,
                      "N, context positions (default: from the data; required with --text)")
          ->check(CLI::PositiveNumber);
  args->symbols_opt =
      cmd->add_option("--symbols", args->symbols, "S, number of symbols (default: largest id + 1)")
          ->check(CLI::PositiveNumber);
  args->query_dim_opt =
      cmd->add_option("--query-dim", args->query_dim, "D, query dimension (default: from the data)")
          ->check(CLI::PositiveNumber);
  args->targets_opt = cmd->add_option("--targets", args->targets,
                                      "T, number of targets (default: largest target + 1)")
                          ->check(CLI::PositiveNumber);
  cmd->add_option("--sigma2", args->estimator.sigma2,
                  "Gate variance sigma^2 (fixed unless --estimate-sigma2)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--estimate-sigma2", args->estimator.estimate_sigma2,
                "Learn sigma^2 in the M-step");
  cmd->add_option("--min-sigma2", args->estimator.min_sigma2, "Floor for a learned sigma^2")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--emission-smoothing", args->estimator.emission_smoothing,
                  "Pseudo-count added to every emission count")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-its", args->optimize.max_its, "Maximum EM iterations")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--delta", args->delta,
                  "Stop when the log-likelihood improves by less than this (or decreases); 'none' "
                  "runs every iteration")
      ->capture_default_str();
  cmd->add_option("--init-p", args->optimize.init_p,
                  "Fraction of rows in the random initialisation (<= 0 means 0.1)")
      ->capture_default_str();
  cmd->add_option("--seed", args->optimize.seed, "Random seed of the initialisation")
      ->capture_default_str();
  cmd->add_option("--threads", args->optimize.n_threads, "Threads for the E-step (0 = all cores)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--print-iter", args->optimize.print_iter, "Print every k-th iteration")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--classic", args->classic,
                "Use the classic loop (score each new model separately)");
  cmd->add_flag("--strict", args->strict,
                "Exit with code 3 (and write nothing) if the fit does not converge");
  cmd->callback([args, &exit_code] { exit_code = run_fit(*args); });
}

}  // namespace attnmix::cli
