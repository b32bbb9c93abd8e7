// SPDX-License-Identifier: Apache-2.0
/// @file fit_problem.hpp
/// `attnmix fit` in two halves: the EM run (fit.cpp: flags, optimize(), progress lines, summary, atomic save) and
/// the problem it solves (fit_problem.cpp), prepared the same way for every family from its descriptor
/// (family/spec.hpp): the rows of --data (or the tokens of a --text corpus), the sizes, the options and the
/// estimator. The family flags — its sizes (--symbols, --hops, …) and its options (--sigma2, --lr, …) — are
/// generated from the descriptors (fit_flags.cpp).
///
/// --init MODEL.json starts EM from a saved model (optimize's prev_estimate) instead of the random initialisation.
/// The model must be of the family; every size it fixes and every option it stores (σ²) not given as a flag is taken
/// from it, and the flags given must agree with it; the data are read against those sizes.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/inference/communicator.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/io/fields.hpp"

namespace attnmix::cli {

/// A flag some families take (a size or an option): its parsed value, the option CLI11 fills and the families.
struct FamilyFlag {
  OptionValue value;  ///< the alternative of the flag's type; CLI11 parses into it
  CLI::Option* option = nullptr;
  std::vector<const FamilySpec*> families;
};

/// Every flag of `attnmix fit`, as parsed.
struct FitArgs {
  std::string family = "responsibility";
  std::string data, text, tokens = "chars", out, valid;
  std::string vocabulary;    // --vocabulary V (text fits; "" builds one from the text)
  std::string embeddings;    // --embeddings E.npy (text fits; "" gives symbol queries)
  std::string init;          // --init MODEL.json ("" when absent)
  std::string history;       // --history H.jsonl ("" when absent)
  std::string checkpoint;    // --checkpoint C.json ("" when absent)
  int checkpoint_every = 1;  // --checkpoint-every K
  std::string resume;        // --resume C.json ("" when absent)
  OptimizeOptions optimize;  // the library's EM-loop defaults
  std::string delta;         // "none" or a number; initialised from optimize.delta
  bool classic = false;
  bool strict = false;
  /// The processes of a distributed fit (main.cpp gives one under mpirun with more than one process; null: this
  /// process alone). Each reads its shard of --data and --valid.
  const Communicator* communicator = nullptr;
  /// The family flags by name ("symbols", "sigma2"): the sizes and options of the families, and --text, --tokens,
  /// --vocabulary and --embeddings, which only families that read text corpora take.
  std::map<std::string, FamilyFlag, std::less<>> flags;
  CLI::Option* delta_opt = nullptr;
  CLI::Option* seed_opt = nullptr;
  CLI::Option* init_p_opt = nullptr;
};

/// Whether a flag was given on the command line.
[[nodiscard]] inline bool given(const CLI::Option* option) { return option->count() > 0; }

/// The flag `name` of args, when it was given.
[[nodiscard]] const FamilyFlag* given_flag(const FitArgs& args, std::string_view name);

/// The model named by --init, loaded (and validated) before the data are read.
struct FitInit {
  std::string path;
  AnyDistribution model;
};

/// What the EM run needs from a family: the data, the estimator and how to describe both.
struct FitProblem {
  std::string mechanism;  // "responsibility attention", "chained attention (L = 2 hops)"
  AnyEstimator estimator;
  /// The --init model rebuilt in the fit's precision when that differs from the file's float64 (EM then starts from
  /// it); otherwise empty and EM starts from FitInit::model.
  std::optional<AnyDistribution> initial;
  AnyBatch train;
  std::optional<AnyBatch> valid;
  std::string train_source;
  std::string valid_source;
  std::string dims_brief;    // "S=4, N=3, D=4, T=4" (the opening line)
  std::string dims_summary;  // "S=4 symbols, N=3 context positions, …" (the summary)
  std::string data_note;     // " (vocabulary: 7 distinct characters)" for text corpora
  std::string vocabulary;    // a text fit's vocabulary document (text_corpus.hpp), written next to the model
  RowOrigin train_origin;    // locates training rows for impossible-evidence messages
  std::vector<int64_t> train_counts;  // training rows of each process (rank order; one entry alone)
  int64_t valid_total = 0;            // validation rows over every process
};

/// The fit of `family` that args ask for. @throws UsageError / ValueError (bad sizes, options, data).
[[nodiscard]] FitProblem prepare_fit(const FamilySpec& family, const FitArgs& args, const FitInit* init);

}  // namespace attnmix::cli
