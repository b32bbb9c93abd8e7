// SPDX-License-Identifier: Apache-2.0
// `attnmix fit`: parses the flags (the family flags generated from the family descriptors, fit_flags.hpp), prepares
// the chosen family's data and estimator (fit_problem.hpp), fits by EM with the library's optimize(), prints the
// docs/mechanisms.md#training progress lines with per-iteration seconds and a closing summary, and writes the model
// atomically only after a successful fit. Every default comes from the library's options structs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnmix/core/any.hpp"
#include "attnmix/core/atomic_file.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/progress.hpp"
#include "attnmix/inference/reduce.hpp"
#include "attnmix/stats/log_math.hpp"
#include "cli_support.hpp"
#include "commands/commands.hpp"
#include "commands/fit_checkpoint.hpp"
#include "commands/fit_flags.hpp"
#include "commands/fit_problem.hpp"
#include "number_checks.hpp"
#include "distributed.hpp"
#include "model_data.hpp"
#include "text_corpus.hpp"

namespace attnmix::cli {

namespace {

/// "the model in a.json", with the Adam step a variational model continues from.
std::string init_description(const FitInit& init) {
  const FamilySpec& family = spec_of(init.model);
  return "the model in " + init.path + (family.fit.resume_note ? family.fit.resume_note(init.model) : "");
}

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

void print_progress(std::ostream& out, const IterationReport& report) {
  std::string line = format_progress_line(report);
  if (!line.empty() && line.back() == '\n') line.pop_back();
  out << line << " (" << format_seconds(report.seconds) << " s)\n" << std::flush;
}

/// The next-token log loss −(1/n) Σ_n ln p(t_n | input_n) of a text fit's rows, in nats per token.
double next_token_loss(const AnyDistribution& model, const AnyBatch& rows) {
  const Vector log_p = model.target_log_proba(rows);
  return -pairwise_sum({log_p.data(), static_cast<size_t>(log_p.size())}) / static_cast<double>(log_p.size());
}

/// "1.657 nats per token (perplexity 5.245)": a log loss and its exponential.
std::string loss_text(double loss) {
  return format_short(loss, 4) + " nats per token (perplexity " + format_short(std::exp(loss), 4) + ")";
}

/// Where the progress lines and the summary go: stdout alone or on rank 0 of a distributed fit,
/// nowhere on the other processes (a stream without a buffer discards what it is given).
std::ostream& report_stream(bool root) {
  static std::ostream discard(nullptr);
  return root ? std::cout : discard;
}

/// Runs a step whose failures the library agrees on (optimize, global_score): when one process
/// fails, every process throws, the failing one its own error and the others RemoteRankError. The
/// processes then agree on the failing one's error with its impossible rows located in its file
/// (`origin`: "data.jsonl: line 57"), so every process reports the same message; alone, the error
/// is located and rethrown as before.
template <class F>
void run_located(const Communicator* comm, const RowOrigin* origin, F&& f) {
  try {
    f();
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    agree(comm, [&] {
      try {
        std::rethrow_exception(error);
      } catch (const ImpossibleEvidenceError& e) {
        if (!origin) throw;
        rethrow_with_lines(e, *origin);
      } catch (const RemoteRankError&) {  // another process failed: its own error is the report
      }
    });
    std::rethrow_exception(error);  // no process reported an error of its own
  }
}

/// "3 processes (rows per process: 100, 100, 100; each reads its stripe of data.jsonl)".
std::string processes_text(const FitArgs& args, const std::vector<int64_t>& counts) {
  std::string text = std::to_string(counts.size()) + " processes (rows per process: ";
  for (size_t r = 0; r < counts.size(); ++r) text += (r ? ", " : "") + std::to_string(counts[r]);
  text += has_rank_placeholder(args.data)
              ? "; each reads its own file, " + args.data + " with {rank} = its rank)"
              : "; each reads its stripe of " + args.data + ")";
  return text;
}

/// The files a fit reads, for the check that --out is none of them: with {rank} under mpirun, the
/// file of every process.
std::vector<InputFile> fit_inputs(const FitArgs& args, const Communicator* comm) {
  std::vector<InputFile> inputs;
  const auto add = [&](const char* flag, const std::string& pattern) {
    if (pattern.empty()) return;
    if (!comm || !has_rank_placeholder(pattern)) return inputs.push_back({flag, pattern});
    for (int r = 0; r < comm->size(); ++r) inputs.push_back({flag, rank_path(pattern, r)});
  };
  add("--data", args.data);
  add("--text", args.text);
  add("--vocabulary", args.vocabulary);
  add("--embeddings", args.embeddings);
  add("--valid", args.valid);
  add("--init", args.init);
  add("--resume", args.resume);
  return inputs;
}

/// Checks every file the fit writes (rank 0), before any data are read: each can be written, is no input, and no
/// two are the same file. The checkpoint may be the one --resume reads: the fit goes on writing to it.
void check_fit_outputs(const FitArgs& args, const Communicator* comm) {
  struct Output {
    std::string flag, path, what;
  };
  std::vector<Output> outputs{{"--out", args.out, "the model"}};
  if (!args.text.empty())
    outputs.push_back({"--out", vocabulary_path_of(args.out), "the vocabulary (next to the model)"});
  if (!args.history.empty()) outputs.push_back({"--history", args.history, "the history"});
  if (!args.checkpoint.empty()) outputs.push_back({"--checkpoint", args.checkpoint, "the checkpoint"});
  const auto same = [](const std::string& a, const std::string& b) {
    return std::filesystem::weakly_canonical(a) == std::filesystem::weakly_canonical(b);
  };
  for (size_t k = 0; k < outputs.size(); ++k) {
    for (size_t j = 0; j < k; ++j)
      if (same(outputs[k].path, outputs[j].path))
        throw UsageError(outputs[k].flag + " " + outputs[k].path + " names the file " + outputs[j].flag +
                         " writes: give each its own path");
    std::vector<InputFile> inputs = fit_inputs(args, comm);
    if (outputs[k].flag == "--checkpoint")
      std::erase_if(inputs, [](const InputFile& input) { return input.flag == "--resume"; });
    check_output_path(outputs[k].path, outputs[k].what, inputs, outputs[k].flag);
  }
}

/// One JSON object per reported iteration: iteration, log_likelihood, delta (null on the first line), seconds and,
/// with --valid, validation.
std::string history_jsonl(const std::vector<IterationReport>& history) {
  std::string text;
  for (const IterationReport& r : history) {
    nlohmann::ordered_json line{{"iteration", r.iteration},
                                {"log_likelihood", r.log_likelihood},
                                {"delta", std::isfinite(r.delta_log_likelihood)
                                              ? nlohmann::ordered_json(r.delta_log_likelihood)
                                              : nlohmann::ordered_json(nullptr)},
                                {"seconds", r.seconds}};
    if (r.valid_log_likelihood) line["validation"] = *r.valid_log_likelihood;
    text += line.dump() + "\n";
  }
  return text;
}

int run_fit(const FitArgs& args) {
  const Communicator* comm = args.communicator;
  const bool root = !comm || comm->rank() == 0;
  std::ostream& out = report_stream(root);
  const FamilySpec* family = nullptr;
  OptimizeOptions options = args.optimize;
  options.n_threads = capped_threads(options.n_threads);
  std::optional<FitInit> init;
  // The command line (the same on every process), the output path (rank 0 writes the model) and the
  // --init model, agreed on before any data are read.
  agree(comm, [&] {
    family = &choose_family(args);
    if (args.data.empty() == args.text.empty())
      throw UsageError("give exactly one of --data FILE or --text FILE");
    if (comm && !args.text.empty())
      throw UsageError("--text cannot be read by a distributed fit (" +
                       std::to_string(comm->size()) +
                       " processes under mpirun): give --data files (JSON Lines or .npz, one "
                       "stripe of the rows per process, or one file per process with {rank}), or "
                       "fit the text corpus as one process");
    if (!args.init.empty() && (given(args.seed_opt) || given(args.init_p_opt)))
      throw UsageError(std::string(given(args.seed_opt) ? "--seed" : "--init-p") +
                       " sets up the random initialisation, which --init replaces (a variational "
                       "model's Monte-Carlo noise seed is part of its optimizer state)");
    options.delta =
        family->fit.stochastic && !given(args.delta_opt) ? std::nullopt : parse_delta(args.delta);
    options.reuse_estep_ll = !args.classic;
    if (root) check_fit_outputs(args, comm);
    if (!args.init.empty()) {
      init = FitInit{args.init, read_saved_model(args.init)};
    }
  });
  // Every process reports (to nowhere but on rank 0): optimize() scores --valid for each report,
  // which is a collective.
  std::vector<IterationReport> history;
  options.on_iteration = [&out, &history](const IterationReport& report) {
    print_progress(out, report);
    history.push_back(report);
  };
  options.communicator = comm;

  std::optional<FitProblem> prepared;
  agree(comm, [&] { prepared.emplace(prepare_fit(*family, args, init ? &*init : nullptr)); });
  const FitProblem& input = *prepared;
  if (options.sharded_mstep && !input.estimator.has_sharded_mstep())
    throw UsageError("--sharded-mstep: " + input.mechanism +
                     " has no sharded M-step (the attention families have one: responsibility, dense or sparse, "
                     "chained, variational and variational multi-hop)");
  const nlohmann::ordered_json settings = fit_settings(args, options, *family, input);
  std::optional<FitCheckpoint> resumed;
  if (!args.resume.empty())
    agree(comm, [&] {
      resumed = read_checkpoint(args.resume, settings, *family, input);
      if (resumed->state.iteration > options.max_its)
        throw UsageError("--resume " + args.resume + " holds the fit after iteration " +
                         std::to_string(resumed->state.iteration) + ": give --max-its " +
                         std::to_string(resumed->state.iteration) + " or more");
      history = resumed->history;
    });
  const auto n_rows =
      std::accumulate(input.train_counts.begin(), input.train_counts.end(), int64_t{0});
  out << "Fitting " << input.mechanism << " by EM to " << n_rows << " rows of "
      << input.train_source;
  if (comm) out << " on " << comm->size() << " processes";
  out << " (" << input.dims_brief << ")";
  if (init) out << ", starting from " << init_description(*init);
  if (resumed) out << ", resuming after iteration " << resumed->state.iteration << " of " << args.resume;
  out << "\n" << std::flush;
  const auto start = std::chrono::steady_clock::now();
  std::optional<AnyDistribution> initial;
  if (input.initial) initial = input.initial;
  else if (init) initial = init->model;
  OptimizeCheckpoints<AnyDistribution> checkpoints;
  checkpoints.every = args.checkpoint_every;
  if (resumed) checkpoints.resume = &resumed->state;
  int last_checkpoint = 0;
  if (!args.checkpoint.empty())
    checkpoints.save = [&](const OptimizeState<AnyDistribution>& state) {
      agree(comm, [&] {
        if (root) write_file_atomically(args.checkpoint, checkpoint_text(state, history, settings), "the checkpoint");
      });
      last_checkpoint = state.iteration;
    };
  std::optional<OptimizeResult<AnyDistribution>> fit;
  run_located(comm, &input.train_origin, [&] {
    fit = optimize(input.train, input.estimator, options, std::move(initial),
                   input.valid ? &*input.valid : nullptr, &checkpoints);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double total = 0.0;
  run_located(comm, &input.train_origin,
              [&] { total = global_score(fit->model, input.train, options.parallel(), comm); });
  std::optional<double> valid_total;
  if (input.valid)
    run_located(comm, nullptr, [&] {
      valid_total = global_score(fit->model, *input.valid, options.parallel(), comm);
    });
  const bool converged = fit->status == OptimizeStatus::kConverged;

  // The closing summary.
  out << "\nSummary\n";
  out << "  data            " << n_rows << " rows from " << input.train_source << input.data_note
      << "\n";
  if (comm) out << "  processes       " << processes_text(args, input.train_counts) << "\n";
  if (comm && options.sharded_mstep)
    out << "  M-step          sharded over " << comm->size()
        << " processes (each estimated its share of the symbols)\n";
  out << "  dimensions      " << input.dims_summary << "\n";
  if (const FamilyFlag* precision = given_flag(args, "precision")) {
    const std::string& name = std::get<std::string>(precision->value);
    out << "  precision       " << name
        << (name == "mixed" ? " (float distances and exponentials, double sums and M-step)\n" : "\n");
  }
  if (init) out << "  started from    " << init_description(*init) << "\n";
  if (resumed)
    out << "  resumed from    " << args.resume << " (after iteration " << resumed->state.iteration << ")\n";
  out << "  iterations      " << fit->n_iterations << " run; ";
  if (converged) {
    const auto& s = fit->scores;
    out << "converged (the log-likelihood changed by "
        << format_short(s[s.size() - 1] - s[s.size() - 2], 3) << " < --delta "
        << delta_text(options.delta) << ")\n";
  } else if (!options.delta) {
    out << "all --max-its iterations run (--delta none: no convergence test)\n";
  } else {
    out << "NOT converged within --max-its " << options.max_its << " (raise --max-its to go on)\n";
  }
  out << "  best model      ";
  if (fit->n_iterations == 0)
    out << (init ? "the --init model (--max-its 0)\n" : "the initial model (--max-its 0)\n");
  else
    out << (fit->best_iteration > fit->n_iterations
                ? "the model after the last iteration"
                : "iteration " + std::to_string(fit->best_iteration))
        << " (the fit keeps the best-scoring model)\n";
  out << "  log-likelihood  " << format_short(total / static_cast<double>(n_rows))
      << " per row (total " << format_short(total, 10) << ")\n";
  if (valid_total) {
    out << "  validation      "
        << format_short(*valid_total / static_cast<double>(input.valid_total)) << " per row on "
        << input.valid_total << " rows of " << input.valid_source << "\n";
  }
  if (!args.text.empty()) {  // the joint log-likelihood above includes the query's density; this is the prediction
    out << "  next token      log loss " << loss_text(next_token_loss(fit->model, input.train))
        << " on the training rows\n";
    if (input.valid)
      out << "                  log loss " << loss_text(next_token_loss(fit->model, *input.valid))
          << " on the validation rows\n";
  }
  out << "  time            " << format_seconds(seconds) << " s\n";
  if (!args.checkpoint.empty()) {
    if (last_checkpoint > 0)
      out << "  checkpoint      " << args.checkpoint << " (after iteration " << last_checkpoint
          << (!converged && last_checkpoint == fit->n_iterations ? "; --resume it with a higher --max-its to go on"
                                                                  : "")
          << ")\n";
    else
      out << "  checkpoint      none written (the fit ended before one was due, every " << args.checkpoint_every
          << " iterations)\n";
  }
  if (args.strict && !converged) {  // the same on every process
    out << "  model           NOT written (--strict and the fit did not converge); " << args.out
        << " is unchanged\n";
    return kExitNotConverged;
  }
  // Rank 0 writes the model and the history (atomically); every process learns whether it could.
  agree(comm, [&] {
    if (root) save_model(fit->model, args.out);
    if (root && !input.vocabulary.empty())
      write_file_atomically(vocabulary_path_of(args.out), input.vocabulary, "the vocabulary");
    if (root && !args.history.empty()) write_file_atomically(args.history, history_jsonl(history), "the history");
  });
  out << "  model written   " << args.out << "\n";
  if (!input.vocabulary.empty())
    out << "  vocabulary      " << vocabulary_path_of(args.out) << " (read by score and predict --text)\n";
  if (!args.history.empty()) out << "  history written " << args.history << " (" << history.size() << " lines)\n";
  return kExitOk;
}

}  // namespace

void add_fit_command(CLI::App& app, int& exit_code, const Communicator* comm) {
  auto args = std::make_shared<FitArgs>();
  args->communicator = comm;
  args->delta = delta_text(args->optimize.delta);
  CLI::App* cmd = app.add_subcommand("fit", "Fit a model to data by EM and save it as a JSON model file");
  std::string stochastic, text;
  for (const FamilySpec* family : fitted_families()) {
    if (family->fit.stochastic) stochastic += (stochastic.empty() ? "" : ", ") + std::string(family->name);
    if (family->fit.text.rows) text += (text.empty() ? "" : ", ") + std::string(family->name);
  }
  cmd->footer(
      "Data: --data takes JSON Lines or a NumPy .npz archive with the fields of the family: " + data_formats_text() +
      ". A symbol id q stands for the one-hot row e_q (every row of a file gives it the same way; an undeclared D "
      "is 1 + the largest). --text (" + text +
      ") takes a plain-text corpus, split into UTF-8 characters (or words with --tokens words) and turned into "
      "next-token rows whose queries are the current token's symbol (or its row of --embeddings); the vocabulary "
      "it used is written next to the model (NAME.vocab.json), where score and predict --text find it.\n"
      "Families with a Monte-Carlo objective (" + stochastic +
      "): the embeddings are fitted by one Adam step per EM iteration, so --delta defaults to none (every --max-its "
      "iteration runs).\n"
      "--init M.json starts from a saved model of the same family instead of the random initialisation; the sizes "
      "the model fixes and the options it stores default to the model's (the help says 'with --init: the model's'), "
      "and a variational model continues its Adam trajectory (give its other options again: they are not stored in "
      "the model).\n"
      "Output: one progress line per iteration on stdout, then a summary (a --text fit's also gives the next-token "
      "log loss and perplexity of its training and --valid rows). The model is written only after a successful fit, "
      "atomically; a failed fit leaves --out untouched.\n"
      "Checkpoints: --checkpoint C.json writes the state of the fit (its iteration, the current and the best model, "
      "the scores and the progress lines) every --checkpoint-every iterations; after an interruption, the same "
      "command with --resume C.json goes on from there to the model the uninterrupted fit writes, bit for bit, on "
      "any number of threads (under mpirun, with as many processes). The checkpoint records the fit's settings "
      "(family, data, sizes, options, seed, loop) and a resumed fit must repeat them; --max-its may be raised to go "
      "on further.\n"
      "Exit codes: 0 ok, 1 usage, 2 data/I/O error, 3 not converged with --strict (the model is then not "
      "written).\n"
      "Distributed: mpirun -np P attnmix fit ... runs the same fit on P processes. Process r reads its stripe of the "
      "rows of --data and --valid (with L rows, rows [r*L/P, (r+1)*L/P)), or, when the path holds {rank} (--data "
      "part-{rank}.jsonl), its own file with {rank} replaced by r. The model equals the single-process fit of all "
      "the rows (up to rounding). Rank 0 prints the progress lines and the summary and writes the model; an error on "
      "any process stops every process with the same exit code and is printed once, by rank 0. --text is not "
      "distributed.");
  cmd->add_option("--data", args->data, "Training data: JSON Lines or .npz")->type_name("FILE");
  cmd->add_option("--out", args->out, "Where to write the fitted model (JSON)")->required()->type_name("FILE");
  cmd->add_option("--history", args->history,
                  "Also write one JSON line per reported iteration (iteration, log_likelihood, delta, seconds, "
                  "validation), for plots (attnmix.plot.fit_history); written with the model")
      ->type_name("FILE");
  cmd->add_option("--valid", args->valid,
                  "Validation data (same kind as the training input), scored each iteration")
      ->type_name("FILE");
  add_family_flags(cmd, *args);
  cmd->add_option("--max-its", args->optimize.max_its, "Maximum EM iterations")
      ->check(kNonNegative)
      ->capture_default_str();
  args->delta_opt =
      cmd->add_option("--delta", args->delta,
                      "Stop when the log-likelihood improves by less than this (or decreases); "
                      "'none' runs every iteration (the default of families with a Monte-Carlo objective)")
          ->capture_default_str();
  CLI::Option* checkpoint =
      cmd->add_option("--checkpoint", args->checkpoint,
                      "Write the state of the fit to this file (JSON, atomically) every --checkpoint-every "
                      "iterations, so that --resume can go on from it")
          ->type_name("FILE");
  cmd->add_option("--checkpoint-every", args->checkpoint_every, "Iterations between checkpoints")
      ->check(kPositive)
      ->needs(checkpoint)
      ->capture_default_str();
  cmd->add_option("--resume", args->resume,
                  "Go on with the fit whose --checkpoint wrote this file (the same command; --max-its may be "
                  "raised): the model is the one the uninterrupted fit writes")
      ->type_name("FILE");
  cmd->add_option("--init", args->init,
                  "Start EM from this saved model (same family and dimensions) instead of the "
                  "random initialisation")
      ->type_name("FILE");
  args->init_p_opt = cmd->add_option("--init-p", args->optimize.init_p,
                                     "Fraction of rows in the random initialisation (<= 0 means "
                                     "0.1)")
                         ->capture_default_str();
  args->seed_opt = cmd->add_option("--seed", args->optimize.seed,
                                   "Random seed of the initialisation (variational families: also "
                                   "of the Monte-Carlo noise)")
                       ->capture_default_str();
  cmd->add_option("--threads", args->optimize.n_threads, "Threads for the E-step (0 = all cores)")
      ->check(kNonNegative)
      ->capture_default_str();
  cmd->add_option("--print-iter", args->optimize.print_iter, "Print every k-th iteration")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_flag("--sharded-mstep", args->optimize.sharded_mstep,
                "Under mpirun: split the M-step over the processes, each estimating its share of the "
                "symbols (the same model, bit for bit; the attention families)");
  cmd->add_flag("--classic", args->classic,
                "Use the classic loop (score each new model separately)");
  cmd->add_flag("--strict", args->strict,
                "Exit with code 3 (and write nothing) if the fit does not converge");
  cmd->callback([args, &exit_code] { exit_code = run_fit(*args); });
}

}  // namespace attnmix::cli
