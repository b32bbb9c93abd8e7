// SPDX-License-Identifier: Apache-2.0
/// @file fit_problem.hpp
/// `attnmix fit` in two halves: the generic EM run (fit.cpp: flags, optimize(), progress lines,
/// summary, atomic save) and one preparation function per family (fit_responsibility.cpp,
/// fit_chained.cpp, fit_variational.cpp) that reads the data, settles the dimensions and builds the
/// estimator. A new family adds one preparation function and one entry in fit.cpp's family table.
///
/// --init MODEL.json starts EM from a saved model (optimize's prev_estimate) instead of the random
/// initialisation. The preparation function then checks that the model is of its family, takes
/// every dimension and stored hyperparameter (σ², L) not given as a flag from the model, and
/// checks that the flags given agree with it; the data are read against those dimensions.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/inference/communicator.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/io/fields.hpp"
#include "attnmix/io/rows.hpp"

namespace attnmix::cli {

/// The embedding dimension D of a variational fit when neither --embed-dim nor --init gives one
/// (the library has no default: D is a constructor argument). 8 is the dimension of the synonym
/// task of SPEC.md §9.4.
inline constexpr int64_t kDefaultEmbedDim = 8;

/// Every flag of `attnmix fit`, as parsed. Hyperparameters without a generic default are read
/// only when given (`given(option)`); otherwise the family's estimator options supply the default.
struct FitArgs {
  std::string family = "responsibility";
  std::string data, text, tokens = "chars", out, valid;
  int64_t context_length = 0, symbols = 0, query_dim = 0, targets = 0;
  int64_t hops = 2;  // L for --family chained: two hops solve transitive lookup (SPEC.md §3.1)
  int64_t embed_dim = kDefaultEmbedDim;  // D for the variational families
  double sigma2 = 0.0, emission_smoothing = 0.0, min_sigma2 = 0.0;
  double lr = 0.0, prior_strength = 0.0;
  int64_t mc = 0, anneal_iters = 0;
  bool estimate_sigma2 = false;
  std::string precision = "float64";  // --precision: the E-step's arithmetic (core/precision.hpp)
  std::string init;          // --init MODEL.json ("" when absent)
  OptimizeOptions optimize;  // the library's EM-loop defaults
  std::string delta;         // "none" or a number; initialised from optimize.delta
  bool classic = false;
  bool strict = false;
  /// The processes of a distributed fit (main.cpp gives one under mpirun with more than one
  /// process; null: this process alone). Each reads its shard of --data and --valid.
  const Communicator* communicator = nullptr;
  CLI::Option* context_length_opt = nullptr;
  CLI::Option* symbols_opt = nullptr;
  CLI::Option* query_dim_opt = nullptr;
  CLI::Option* targets_opt = nullptr;
  CLI::Option* hops_opt = nullptr;
  CLI::Option* sigma2_opt = nullptr;
  CLI::Option* emission_smoothing_opt = nullptr;
  CLI::Option* min_sigma2_opt = nullptr;
  CLI::Option* estimate_sigma2_opt = nullptr;
  CLI::Option* precision_opt = nullptr;
  CLI::Option* text_opt = nullptr;
  CLI::Option* tokens_opt = nullptr;
  CLI::Option* embed_dim_opt = nullptr;
  CLI::Option* lr_opt = nullptr;
  CLI::Option* mc_opt = nullptr;
  CLI::Option* prior_strength_opt = nullptr;
  CLI::Option* anneal_iters_opt = nullptr;
  CLI::Option* delta_opt = nullptr;
  CLI::Option* seed_opt = nullptr;
  CLI::Option* init_p_opt = nullptr;
};

/// The model named by --init, loaded (and validated) before the data are read.
struct FitInit {
  std::string path;
  AnyDistribution model;
};

/// Whether a flag was given on the command line.
[[nodiscard]] inline bool given(const CLI::Option* option) { return option->count() > 0; }

/// A declared dimension from a flag ("--symbols"), or nothing when the flag is absent.
[[nodiscard]] inline std::optional<Dim> flag_dim(const CLI::Option* option, int64_t value,
                                                 const char* flag) {
  if (!given(option)) return std::nullopt;
  return Dim{value, flag};
}

/// The declared sizes of a fit: each (symbol, size) whose size is set.
[[nodiscard]] inline Dims declared_dims(std::initializer_list<std::pair<const char*, std::optional<Dim>>> sizes) {
  Dims dims;
  for (const auto& [symbol, size] : sizes)
    if (size) dims[symbol] = *size;
  return dims;
}


/// A dimension of a fit: without --init, the flag's value when given (else nothing: the data
/// decide); with --init, the model's value `model_value`, which a given flag must equal.
/// @throws ValueError ("--symbols 10 does not match the --init model a.json (S = 12)").
[[nodiscard]] std::optional<Dim> settle_dim(const CLI::Option* option, int64_t value,
                                            const char* flag, const char* symbol,
                                            const FitInit* init, int64_t model_value);

/// σ² of a fit: --sigma2 when given, else the --init model's σ² (`model_sigma2`), else `default_sigma2` (the
/// estimator's default). @throws ValueError when --sigma2 is given with --init and differs from the model's σ²
/// ("--sigma2 0.5 does not match the --init model a.json (sigma2 = 0.10000000000000001)").
[[nodiscard]] double settle_sigma2(const FitArgs& args, const FitInit* init, double model_sigma2,
                                   double default_sigma2);

/// The --init model as family M. @throws ValueError naming the file when it holds another family.
template <class M>
[[nodiscard]] const M& init_model_as(const FitInit& init, const std::string& family_flag) {
  if (const M* model = init.model.get_if<M>()) return *model;
  throw ValueError(init.path + ": --init holds a " + init.model.family() + " model, but --family " +
                   family_flag + " fits " + M::kFamily +
                   " models (start from a model of that family, or leave out --init)");
}

/// The estimator `build()` returns, as a handle. Its constructor checks that the statistics of these dimensions
/// can exist (at most 2^48 entries each); a ValueError it throws is rethrown with where each dimension came from,
/// so a huge id in the data or a huge flag is traced to its line or flag:
/// "ChainedAttentionEstimator: statistic key_num (…) must have at most 2^48 elements (S = 4611686018427387905 (from
/// the largest key, value or query id at ca.jsonl: line 3, field keys), T = 6 (from the largest target))".
template <class Build>
[[nodiscard]] AnyEstimator build_estimator(Build&& build,
                                           std::initializer_list<std::pair<const char*, const Dim*>> dims) {
  try {
    return AnyEstimator(build());
  } catch (const ValueError& e) {
    std::string origins;
    for (const auto& [symbol, dim] : dims)
      if (dim) origins += (origins.empty() ? " (" : ", ") + dim_text(symbol, *dim);
    throw ValueError(std::string(e.what()) + (origins.empty() ? "" : origins + ")"));
  }
}

/// What the generic EM run needs from a family: the data, the estimator and how to describe both.
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
  RowOrigin train_origin;    // locates training rows for impossible-evidence messages
  std::vector<int64_t> train_counts;  // training rows of each process (rank order; one entry alone)
  int64_t valid_total = 0;            // validation rows over every process
};


/// Responsibility attention from --data files or a --text corpus (fit_responsibility.cpp).
[[nodiscard]] FitProblem prepare_responsibility_fit(const FitArgs& args, const FitInit* init);

/// Chained attention from --data files (fit_chained.cpp).
[[nodiscard]] FitProblem prepare_chained_fit(const FitArgs& args, const FitInit* init);

/// Variational embedding attention from --data files (fit_variational.cpp).
[[nodiscard]] FitProblem prepare_variational_fit(const FitArgs& args, const FitInit* init);

/// Variational multi-hop attention from chained-attention --data files (fit_variational.cpp).
[[nodiscard]] FitProblem prepare_variational_multihop_fit(const FitArgs& args, const FitInit* init);

}  // namespace attnmix::cli
