// SPDX-License-Identifier: Apache-2.0
/// @file lm_plugin.hpp
/// The boundary between the attnmix executable and its language-model plugin.
///
/// Loading libtorch costs about a second of start-up (hundreds of shared libraries and their static
/// initialisers), which every attnmix command would pay if the executable linked it. So the
/// executable stays free of libtorch: it parses `attnmix lm ...` (lm.cpp) and, only when an lm
/// command or the demo's language-model section runs, loads the plugin attnmix-lm.so (built next to
/// it from lm_run.cpp and demo_lm.cpp, linked with attnmix::torch) and calls it through the table
/// below. Both sides are built from the same tree with the same compiler; the version and the
/// sizes in the table guard against a stale plugin. Errors cross as exceptions derived from
/// std::exception (ValueError, std::runtime_error), which main.cpp maps to exit code 2.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "attnmix/stream/far_field.hpp"
#include "attnmix/stream/language_model.hpp"
#include "attnmix/stream/memory_benchmark.hpp"

namespace attnmix::cli {

/// The text `lm train` reads when --text is absent: every Debian system has it (about 35 kB).
inline constexpr const char* kDefaultCorpus = "/usr/share/common-licenses/GPL-3";

/// The fraction of the text `lm train` holds out by default.
inline constexpr double kDefaultHoldout = 0.1;

/// `lm train`, after the command line has been checked.
struct LmTrainRequest {
  stream::TrainOptions options;          ///< the library's defaults with the flags applied
  std::string text;                  ///< --text (empty: the default corpus)
  double holdout = kDefaultHoldout;  ///< --holdout, in [0, 1)
  std::string resume;                ///< --resume (empty: a fresh run)
  std::string out;                   ///< --out (empty: no checkpoint)
  std::string history;               ///< --history (empty: none)
  std::vector<std::string> given;    ///< the flags given on the command line ("--d-model", ...)
};

/// `lm eval`.
struct LmEvalRequest {
  std::string checkpoint;
  std::string text;      ///< empty: the default corpus
  double holdout = 0.0;  ///< score only this final fraction (0: all)
  int64_t chunk = 0;     ///< 0: the checkpoint's training chunk
  int threads = 1;
  stream::WindowCache window_cache = stream::WindowCache::kFloat32;
};

/// `lm generate`.
struct LmGenerateRequest {
  std::string checkpoint;
  std::string prompt;  ///< not empty
  stream::GenerateOptions options;
};

/// `lm recall`: associative recall beyond the window (stream::run_recall) for each mechanism, then a
/// held-out bits-per-byte comparison of the same mechanisms on a text (docs/far-field.md).
struct LmRecallRequest {
  stream::RecallRunOptions options;         ///< the library's defaults with the flags applied
  std::vector<std::string> mechanisms;  ///< in the order to run (window, moment-closure, full)
  int64_t text_steps = 300;             ///< steps of each text run (0: no text comparison)
  int64_t text_chunk = 0;               ///< bytes per stream per step of the text runs (0: --chunk)
  double text_lr = 0.01;                ///< peak learning rate of the text runs (cosine decay)
  std::string text;                     ///< empty: the default corpus
  double holdout = kDefaultHoldout;     ///< in (0, 1)
};

/// `lm memory-bench`: the memory benchmark (stream::run_memory_benchmark) as a table and, with --json, a file.
struct LmMemoryBenchRequest {
  stream::MemoryBenchOptions options;  ///< the library's defaults with the flags applied
  std::string json;                ///< --json (empty: no file), rewritten after every run
  bool resume = false;             ///< --resume: reuse the finished runs of --json
};

/// The steps `lm recall` trains each mechanism for unless --steps says otherwise.
inline constexpr int64_t kDefaultRecallSteps = 400;

inline constexpr int kLmPluginVersion = 5;

/// What the plugin exports. Each command returns its exit code or throws.
struct LmPlugin {
  int version = kLmPluginVersion;
  size_t train_request_size = sizeof(LmTrainRequest);
  size_t eval_request_size = sizeof(LmEvalRequest);
  size_t generate_request_size = sizeof(LmGenerateRequest);
  size_t recall_request_size = sizeof(LmRecallRequest);
  size_t memory_bench_request_size = sizeof(LmMemoryBenchRequest);
  int (*train)(const LmTrainRequest&) = nullptr;
  int (*eval)(const LmEvalRequest&) = nullptr;
  int (*generate)(const LmGenerateRequest&) = nullptr;
  int (*recall)(const LmRecallRequest&) = nullptr;
  int (*memory_bench)(const LmMemoryBenchRequest&) = nullptr;
  void (*demo)(std::ostream&, std::string* history) = nullptr;  ///< the demo's section (demo_lm.cpp)
};

}  // namespace attnmix::cli

/// The plugin's one exported symbol.
extern "C" const attnmix::cli::LmPlugin* attnmix_lm_plugin();
