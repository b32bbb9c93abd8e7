// SPDX-License-Identifier: Apache-2.0
// The checkpoint document of `attnmix fit` (fit_checkpoint.hpp). Numbers keep their bits: nlohmann writes the
// shortest decimal that reads back to the same double, and the scores that are not finite are written as the strings
// "inf", "-inf" and "nan" (JSON has no such numbers).
#include "commands/fit_checkpoint.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "attnmix/core/errors.hpp"
#include "attnmix/io/input_file.hpp"
#include "attnmix/io/model_file.hpp"
#include "cli_support.hpp"

namespace attnmix::cli {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr const char* kFormat = "attnmix-fit-checkpoint";
constexpr int kVersion = 1;

ordered_json number_json(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf";
}

ordered_json optional_json(const std::optional<double>& x) { return x ? number_json(*x) : ordered_json(nullptr); }

/// "/data/a.jsonl" for "a.jsonl": a path as the settings record it, so that a fit resumed from another directory
/// compares the same files ("" stays "").
std::string path_setting(const std::string& path) {
  if (path.empty()) return path;
  std::error_code error;
  const std::filesystem::path canonical = std::filesystem::weakly_canonical(path, error);
  return error ? path : canonical.string();
}

/// Reads the fields of one checkpoint document; every error names the file and the field.
class Reader {
 public:
  Reader(std::string path, const json& doc) : path_(std::move(path)), doc_(doc) {}

  [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
    throw ValueError(path_ + ": field \"" + field + "\" " + problem + " (the checkpoint is damaged)");
  }

  const json& at(const json& object, const std::string& field) const {
    const auto it = object.find(field);
    if (it == object.end()) fail(field, "is missing");
    return *it;
  }

  double number(const json& value, const std::string& field) const {
    if (value.is_number()) return value.get<double>();
    if (value == "inf") return std::numeric_limits<double>::infinity();
    if (value == "-inf") return -std::numeric_limits<double>::infinity();
    if (value == "nan") return std::numeric_limits<double>::quiet_NaN();
    fail(field, "must be a number (or \"inf\", \"-inf\", \"nan\"), not " + value.dump());
  }

  std::optional<double> optional_number(const json& value, const std::string& field) const {
    if (value.is_null()) return std::nullopt;
    return number(value, field);
  }

  int integer(const json& value, const std::string& field, int lowest, int highest) const {
    if (!value.is_number_integer() || value.get<int64_t>() < lowest || value.get<int64_t>() > highest)
      fail(field, "must be an integer in [" + std::to_string(lowest) + ", " + std::to_string(highest) + "], not " +
                      value.dump());
    return value.get<int>();
  }

  const json& array(const json& value, const std::string& field) const {
    if (!value.is_array()) fail(field, "must be a list");
    return value;
  }

  AnyDistribution model(const std::string& field, const FamilySpec& family) const {
    AnyDistribution model = model_from_json(at(doc_, field), path_ + ": field \"" + field + "\"");
    if (&spec_of(model) != &family) fail(field, "holds a " + model.family() + " model, not a model of this fit");
    return model;
  }

  IterationReport report(const json& line, const std::string& field) const {
    if (!line.is_object()) fail(field, "must be an object");
    IterationReport r;
    r.iteration = integer(at(line, "iteration"), field + ".iteration", 1, std::numeric_limits<int>::max());
    r.log_likelihood = number(at(line, "log_likelihood"), field + ".log_likelihood");
    r.delta_log_likelihood = number(at(line, "delta"), field + ".delta");
    r.seconds = number(at(line, "seconds"), field + ".seconds");
    if (const auto it = line.find("validation"); it != line.end())
      r.valid_log_likelihood = number(*it, field + ".validation");
    return r;
  }

  const json& doc() const { return doc_; }

 private:
  std::string path_;
  const json& doc_;
};

/// "its data is /a/x.jsonl, this fit's /a/y.jsonl": the first setting in which the checkpoint differs, or "".
std::string first_difference(const json& saved, const ordered_json& wanted, const std::string& prefix = "") {
  for (const auto& [key, value] : wanted.items()) {
    const auto it = saved.find(key);
    const std::string name = prefix + key;
    if (it == saved.end()) return "it has no " + name;
    if (value.is_object() && it->is_object()) {
      if (std::string inner = first_difference(*it, value, name + "."); !inner.empty()) return inner;
      continue;
    }
    if (*it != json(value)) return "its " + name + " is " + it->dump() + ", this fit's " + value.dump();
  }
  return "";
}

}  // namespace

ordered_json fit_settings(const FitArgs& args, const OptimizeOptions& options, const FamilySpec& family,
                          const FitProblem& problem) {
  ordered_json family_options = ordered_json::object();
  for (const auto& [name, value] : family.fit.settings_of(problem.estimator).options)
    family_options[name] = option_text(value);
  int64_t rows = 0;
  for (const int64_t count : problem.train_counts) rows += count;
  return {{"family", family.file_family},
          {"data", path_setting(args.data)},
          {"text", path_setting(args.text)},
          {"tokens", args.text.empty() ? "" : args.tokens},
          {"vocabulary", path_setting(args.vocabulary)},
          {"embeddings", path_setting(args.embeddings)},
          {"valid", path_setting(args.valid)},
          {"init", path_setting(args.init)},
          {"rows", rows},
          {"sizes", problem.dims_brief},
          {"options", family_options},
          {"seed", options.seed},
          {"init_p", format_double(options.init_p)},
          {"delta", options.delta ? format_double(*options.delta) : "none"},
          {"loop", options.reuse_estep_ll ? "fused" : "classic"}};
}

std::string checkpoint_text(const OptimizeState<AnyDistribution>& state, const std::vector<IterationReport>& history,
                            const ordered_json& settings) {
  ordered_json scores = ordered_json::array();
  for (const double s : state.result.scores) scores.push_back(number_json(s));
  ordered_json lines = ordered_json::array();
  for (const IterationReport& r : history) {
    ordered_json line{{"iteration", r.iteration},
                      {"log_likelihood", number_json(r.log_likelihood)},
                      {"delta", number_json(r.delta_log_likelihood)},
                      {"seconds", number_json(r.seconds)}};
    if (r.valid_log_likelihood) line["validation"] = number_json(*r.valid_log_likelihood);
    lines.push_back(std::move(line));
  }
  const ordered_json doc{{"format", kFormat},
                         {"version", kVersion},
                         {"settings", settings},
                         {"iteration", state.iteration},
                         {"best_iteration", state.result.best_iteration},
                         {"scores", std::move(scores)},
                         {"best", optional_json(state.best)},
                         {"previous", optional_json(state.previous)},
                         {"history", std::move(lines)},
                         {"model", model_to_json(state.model)},
                         {"best_model", model_to_json(state.result.model)}};
  return doc.dump(1) + "\n";
}

FitCheckpoint read_checkpoint(const std::string& path, const ordered_json& settings, const FamilySpec& family,
                              const FitProblem& problem) {
  const std::string text = read_input_file(path, "the checkpoint");
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw ValueError(path + ": not a checkpoint of attnmix fit (not a valid JSON document: " + e.what() + ")");
  }
  if (!doc.is_object() || doc.value("format", json()) != kFormat)
    throw ValueError(path + ": not a checkpoint of attnmix fit (its \"format\" is not \"" + kFormat + "\")");
  const Reader read(path, doc);
  if (read.at(doc, "version") != kVersion)
    read.fail("version", "is " + doc["version"].dump() + "; this attnmix reads checkpoints of version " +
                             std::to_string(kVersion));
  if (const std::string difference = first_difference(read.at(doc, "settings"), settings); !difference.empty())
    throw ValueError(path + ": the checkpoint was written by another fit: " + difference +
                     " (resume with the command that wrote it; only --max-its may change)");

  FitCheckpoint out{{.iteration = read.integer(read.at(doc, "iteration"), "iteration", 1,
                                               std::numeric_limits<int>::max()),
                     .model = read.model("model", family),
                     .result = {read.model("best_model", family)}},
                    {}};
  OptimizeState<AnyDistribution>& state = out.state;
  const json& scores = read.array(read.at(doc, "scores"), "scores");
  if (scores.size() != static_cast<size_t>(state.iteration))
    read.fail("scores", "holds " + std::to_string(scores.size()) + " scores for " + std::to_string(state.iteration) +
                            " iterations");
  for (size_t k = 0; k < scores.size(); ++k)
    state.result.scores.push_back(read.number(scores[k], "scores[" + std::to_string(k) + "]"));
  state.result.n_iterations = state.iteration;
  state.result.best_iteration = read.integer(read.at(doc, "best_iteration"), "best_iteration", 0, state.iteration);
  state.best = read.optional_number(read.at(doc, "best"), "best");
  state.previous = read.optional_number(read.at(doc, "previous"), "previous");
  const json& lines = read.array(read.at(doc, "history"), "history");
  for (size_t k = 0; k < lines.size(); ++k)
    out.history.push_back(read.report(lines[k], "history[" + std::to_string(k) + "]"));
  // Model files hold no precision: the models come back in the fit's, as a fit from --init does.
  if (family.fit.initial) {
    const OptionValues options = family.fit.settings_of(problem.estimator).options;
    for (AnyDistribution* model : {&state.model, &state.result.model})
      if (std::optional<AnyDistribution> rebuilt = family.fit.initial(*model, options)) *model = std::move(*rebuilt);
  }
  return out;
}

}  // namespace attnmix::cli
