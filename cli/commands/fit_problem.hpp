// SPDX-License-Identifier: Apache-2.0
/// @file fit_problem.hpp
/// `attnmix fit` in two halves: the generic EM run (fit.cpp: flags, optimize(), progress lines,
/// summary, atomic save) and one preparation function per family (fit_responsibility.cpp,
/// fit_chained.cpp) that reads the data, settles the dimensions and builds the estimator. A new
/// family adds one preparation function and one entry in fit.cpp's family table.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "attnmix/core/any.hpp"
#include "attnmix/inference/optimize.hpp"
#include "data_fields.hpp"

namespace attnmix::cli {

/// Every flag of `attnmix fit`, as parsed. Hyperparameters without a generic default are read
/// only when given (`given(option)`); otherwise the family's estimator options supply the default.
struct FitArgs {
  std::string family = "responsibility";
  std::string data, text, tokens = "chars", out, valid;
  int64_t context_length = 0, symbols = 0, query_dim = 0, targets = 0;
  int64_t hops = 2;  // L for --family chained: two hops solve transitive lookup (SPEC.md §3.1)
  double sigma2 = 0.0, emission_smoothing = 0.0, min_sigma2 = 0.0;
  bool estimate_sigma2 = false;
  OptimizeOptions optimize;  // the library's EM-loop defaults
  std::string delta;         // "none" or a number; initialised from optimize.delta
  bool classic = false;
  bool strict = false;
  CLI::Option* context_length_opt = nullptr;
  CLI::Option* symbols_opt = nullptr;
  CLI::Option* query_dim_opt = nullptr;
  CLI::Option* targets_opt = nullptr;
  CLI::Option* hops_opt = nullptr;
  CLI::Option* sigma2_opt = nullptr;
  CLI::Option* emission_smoothing_opt = nullptr;
  CLI::Option* min_sigma2_opt = nullptr;
  CLI::Option* estimate_sigma2_opt = nullptr;
  CLI::Option* text_opt = nullptr;
  CLI::Option* tokens_opt = nullptr;
};

/// Whether a flag was given on the command line.
[[nodiscard]] inline bool given(const CLI::Option* option) { return option->count() > 0; }

/// A declared dimension from a flag ("--symbols"), or nothing when the flag is absent.
[[nodiscard]] inline std::optional<Dim> flag_dim(const CLI::Option* option, int64_t value,
                                                 const char* flag) {
  if (!given(option)) return std::nullopt;
  return Dim{value, flag};
}

/// What the generic EM run needs from a family: the data, the estimator and how to describe both.
struct FitProblem {
  std::string mechanism;  // "responsibility attention", "chained attention (L = 2 hops)"
  AnyEstimator estimator;
  AnyBatch train;
  std::optional<AnyBatch> valid;
  std::string train_source;
  std::string valid_source;
  std::string dims_brief;    // "S=4, N=3, D=4, T=4" (the opening line)
  std::string dims_summary;  // "S=4 symbols, N=3 context positions, …" (the summary)
  std::string data_note;     // " (vocabulary: 7 distinct characters)" for text corpora
  RowOrigin train_origin;    // locates training rows for impossible-evidence messages
};

/// Responsibility attention from --data files or a --text corpus (fit_responsibility.cpp).
[[nodiscard]] FitProblem prepare_responsibility_fit(const FitArgs& args);

/// Chained attention from --data files (fit_chained.cpp).
[[nodiscard]] FitProblem prepare_chained_fit(const FitArgs& args);

}  // namespace attnmix::cli
