// SPDX-License-Identifier: Apache-2.0
/// @file option_table.hpp
/// The options of the streaming models as tables, one per options struct (TrainOptions, GenerateOptions,
/// RecallRunOptions, MemoryBenchOptions). An entry says everything about one option once: its keyword (Python's
/// keyword argument, the key a checkpoint stores it under), its command-line flag and help, its check, the field of
/// the struct that holds it, and what a checkpoint does with it. Every adapter is generated from the tables:
/// `attnmix lm`'s flags and help, the agreement a resumed run checks, Python's keyword arguments and their defaults,
/// the options a checkpoint stores. The structs stay the one source of every default. Torch-free.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "attnmix/family/options.hpp"
#include "attnmix/stream/cluster_rule.hpp"
#include "attnmix/stream/far_field.hpp"
#include "attnmix/stream/language_model.hpp"
#include "attnmix/stream/memory_benchmark.hpp"

namespace attnmix::stream {

/// The names of an enumeration's values, in the order help texts list them, and the conversions both ways:
/// kValues (every value), name(value) and parse(text, where) (@throws ValueError for other text; `where` names the
/// caller where the enumeration's own parser takes one).
template <class E>
struct NamedValues;

/// The mechanisms (parse_mechanism, mechanism_name).
template <>
struct NamedValues<Mechanism> {
  /// Every value, in the order help texts list them.
  static constexpr std::array kValues = {Mechanism::kWindow,        Mechanism::kMomentClosure,
                                         Mechanism::kLinear,        Mechanism::kFrequentDirections,
                                         Mechanism::kTensorSketch, Mechanism::kFull};
  /// The value's name.
  static std::string name(Mechanism m) { return mechanism_name(m); }
  /// The value named `text`. @throws ValueError for another text.
  static Mechanism parse(std::string_view text, std::string_view /*where*/) { return parse_mechanism(text); }
};

/// The learning-rate schedules (parse_schedule, schedule_name).
template <>
struct NamedValues<Schedule> {
  /// Every value, in the order help texts list them.
  static constexpr std::array kValues = {Schedule::kCosine, Schedule::kConstant};
  /// The value's name.
  static std::string name(Schedule s) { return schedule_name(s); }
  /// The value named `text`. @throws ValueError for another text.
  static Schedule parse(std::string_view text, std::string_view /*where*/) { return parse_schedule(text); }
};

/// The far field's cluster rules (parse_cluster_rule, cluster_rule_name).
template <>
struct NamedValues<ClusterRule> {
  /// Every value, in the order help texts list them.
  static constexpr std::array kValues = {ClusterRule::kThreshold, ClusterRule::kBudget};
  /// The value's name.
  static std::string name(ClusterRule r) { return cluster_rule_name(r); }
  /// The value named `text`. @throws ValueError for another text.
  static ClusterRule parse(std::string_view text, std::string_view where) {
    return parse_cluster_rule(std::string(text), std::string(where));
  }
};

/// The window caches (parse_window_cache, window_cache_name).
template <>
struct NamedValues<WindowCache> {
  /// Every value, in the order help texts list them.
  static constexpr std::array kValues = {WindowCache::kFloat32, WindowCache::kInt8};
  /// The value's name.
  static std::string name(WindowCache c) { return window_cache_name(c); }
  /// The value named `text`. @throws ValueError for another text.
  static WindowCache parse(std::string_view text, std::string_view /*where*/) { return parse_window_cache(text); }
};

/// Every name of E's values, in NamedValues' order.
template <class E>
std::vector<std::string> value_names() {
  std::vector<std::string> out;
  for (const E value : NamedValues<E>::kValues) out.push_back(NamedValues<E>::name(value));
  return out;
}

/// Where an option's value lives in `Options`: the field, reached from the struct. A reader that holds a const
/// struct reaches the fields of a copy. Cost of a table: one small function object per option.
template <class Options, class T>
using FieldOf = std::function<T&(Options&)>;

/// An option's field, by its type (every type the streaming options use).
template <class Options>
using OptionField =
    std::variant<FieldOf<Options, int64_t>, FieldOf<Options, int>, FieldOf<Options, uint64_t>,
                 FieldOf<Options, double>, FieldOf<Options, std::optional<double>>, FieldOf<Options, Mechanism>,
                 FieldOf<Options, Schedule>, FieldOf<Options, ClusterRule>, FieldOf<Options, WindowCache>,
                 FieldOf<Options, std::vector<std::string>>, FieldOf<Options, std::vector<int64_t>>,
                 FieldOf<Options, std::vector<uint64_t>>>;

/// The field `access` (a function Options& → field&) reaches, typed.
template <class Options, class Access>
OptionField<Options> field_of(Access access) {
  using T = std::remove_reference_t<std::invoke_result_t<Access, Options&>>;
  return FieldOf<Options, T>(std::move(access));
}

/// What a checkpoint does with an option (TrainOptions; the other tables keep nothing).
enum class Kept {
  kNo,      ///< not stored (threads, how often to save or score): a resumed run may set it anew
  kStored,  ///< stored, and a resumed run may change it (steps: the step to reach)
  kFixed,   ///< stored and fixed: a resumed run that gives it must give the stored value
};

/// One option of a streaming model or command. The check is the adapters' (a flag's value, a keyword's); the
/// library's validate() checks the whole struct again, with the cross-field rules.
template <class Options>
struct StreamOption {
  std::string_view name;  ///< "d_model": the keyword argument and the key a checkpoint stores it under
  std::string_view flag;  ///< "--d-model"; empty: not on the command line
  /// The help of the flag; another option named in braces ("{max_clusters}") is written as each adapter names it.
  std::string_view help;
  OptionField<Options> field;  ///< where the value lives in Options
  OptionCheck check = OptionCheck::kAny;  ///< for numbers (and the numbers of a list)
  Kept kept = Kept::kNo;  ///< what a checkpoint does with it
  /// The one mechanism whose models use the option (lm train refuses the flag for others; only its checkpoints
  /// store it); none: every mechanism's.
  std::optional<Mechanism> only_for = std::nullopt;
  const std::vector<std::string>* choices = nullptr;  ///< for a list of names: the names it may hold (none: any)
  bool older_files_lack = false;  ///< checkpoints written before the option existed lack it: it keeps its default
};

/// The options of one options struct, in the order the help lists them.
template <class Options>
using OptionTableOf = std::vector<StreamOption<Options>>;

/// The options of train() (TrainOptions): `attnmix lm train`, train_language_model().
const OptionTableOf<TrainOptions>& train_option_table();
/// The options of generate() (GenerateOptions): `attnmix lm generate`, generate_language_model().
const OptionTableOf<GenerateOptions>& generate_option_table();
/// The options of run_recall() (RecallRunOptions): `attnmix lm recall`, run_recall().
const OptionTableOf<RecallRunOptions>& recall_option_table();
/// The options of run_memory_benchmark() (MemoryBenchOptions): `attnmix lm memory-bench`,
/// run_memory_benchmark(); its model and training options are recall_option_table()'s, under `training`.
const OptionTableOf<MemoryBenchOptions>& memory_bench_option_table();

}  // namespace attnmix::stream
