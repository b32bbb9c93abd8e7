// SPDX-License-Identifier: Apache-2.0
/// @file options.hpp
/// A family's hyperparameters as one table (family/spec.hpp): each entry names an option, says what it means, checks
/// its values and knows the member of the family's estimator options struct it sets, so that the struct stays the
/// one source of every default and every adapter — `attnmix fit`'s flags and help, Python's keywords — is generated
/// from the table.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "attnmix/core/errors.hpp"

namespace attnmix {

/// An option's value: a flag, an integer, a real or a named choice.
using OptionValue = std::variant<bool, int64_t, double, std::string>;
/// Option values by name (the options that were given; the others keep their defaults).
using OptionValues = std::map<std::string, OptionValue, std::less<>>;

/// What a numeric option's value must be besides a number: anything, > 0, ≥ 0, in [0, 1] or finite (check_option
/// enforces it; it takes every family option finite).
enum class OptionCheck { kAny, kPositive, kNonNegative, kUnitInterval, kFinite };

/// One hyperparameter: `sigma2` is the flag `--sigma2` and the keyword `sigma2=` (underscores become dashes in flags).
struct OptionSpec {
  std::string_view name = {};  ///< "sigma2": the keyword; the flag is the name with dashes
  /// "gate variance sigma^2, fixed unless {estimate_sigma2}": another option is named in braces, which each adapter
  /// writes its way (`--estimate-sigma2` in the CLI, `estimate_sigma2` in Python).
  std::string_view help = {};
  OptionValue fallback = {};                   ///< the default (its alternative is the option's type)
  OptionCheck check = OptionCheck::kAny;       ///< for numbers
  std::vector<std::string_view> choices = {};  ///< for named choices: the names
  bool from_model = false;                     ///< a model stores it: fitting from a saved model continues with its value
  bool shapes_statistics = false;              ///< the family's statistics depend on it too (their Monte-Carlo samples)
};

/// "1", "0.10000000000000001", "mixed", "true": a value as messages quote it (17 significant digits for reals).
[[nodiscard]] std::string option_text(const OptionValue& value);

/// "'float64' or 'mixed'": the choices of a named-choice option, for messages.
[[nodiscard]] std::string choices_text(const OptionSpec& spec);

/// "gate variance sigma^2, fixed unless --estimate-sigma2": a help text with every option named in braces written as
/// `name_of` gives it (the flag in the command line, the keyword in Python).
[[nodiscard]] std::string with_option_names(std::string_view help, std::string (*name_of)(std::string_view option));

/// "Gate variance sigma^2, fixed unless --estimate-sigma2": an option's help (OptionSpec::help) as with_option_names
/// writes it, with its first letter capitalised.
[[nodiscard]] std::string option_help(std::string_view help, std::string (*name_of)(std::string_view option));

/// Checks a value against its option (type, sign, choices). @throws ValueError naming `where` and the option.
void check_option(const OptionSpec& spec, const OptionValue& value, std::string_view where);

/// A family's option table over its estimator options struct `Options`.
template <class Options>
class OptionTable {
 public:
  /// A bool, integer or real member.
  template <class T>
  OptionTable add(std::string_view name, T Options::*member, std::string_view help,
                  OptionCheck check = OptionCheck::kAny, bool from_model = false, bool shapes_statistics = false) && {
    static_assert(std::is_same_v<T, bool> || std::is_same_v<T, int64_t> || std::is_same_v<T, double>);
    specs_.push_back({name, help, OptionValue(Options{}.*member), check, {}, from_model, shapes_statistics});
    setters_.push_back([member](Options& o, const OptionValue& v) { o.*member = std::get<T>(v); });
    getters_.push_back([member](const Options& o) { return OptionValue(o.*member); });
    return std::move(*this);
  }
  /// A member of an enumeration with named values (`name_of` and `parse` convert).
  template <class T>
  OptionTable add_choice(std::string_view name, T Options::*member, std::string_view help,
                         std::vector<std::string_view> choices, std::string_view (*name_of)(T) noexcept,
                         T (*parse)(std::string_view, std::string_view)) && {
    specs_.push_back({name, help, OptionValue(std::string(name_of(Options{}.*member))), OptionCheck::kAny,
                      std::move(choices), false, false});
    setters_.push_back([member, parse, name](Options& o, const OptionValue& v) {
      o.*member = parse(std::get<std::string>(v), name);
    });
    getters_.push_back([member, name_of](const Options& o) { return OptionValue(std::string(name_of(o.*member))); });
    return std::move(*this);
  }

  /// The options in the order they were added (the order of the help text and of the Python keywords).
  [[nodiscard]] const std::vector<OptionSpec>& specs() const noexcept { return specs_; }

  /// Every option's value in `options`.
  [[nodiscard]] OptionValues values(const Options& options) const {
    OptionValues out;
    for (size_t k = 0; k < specs_.size(); ++k) out[std::string(specs_[k].name)] = getters_[k](options);
    return out;
  }

  /// The options struct with `values` set (each checked) over its defaults.
  /// @throws ValueError for an unknown option or a bad value, naming `where`.
  [[nodiscard]] Options apply(const OptionValues& values, std::string_view where) const {
    Options out;
    for (const auto& [name, value] : values) {
      size_t k = 0;
      while (k < specs_.size() && specs_[k].name != name) ++k;
      if (k == specs_.size()) throw ValueError(std::string(where) + ": unknown option '" + name + "'");
      check_option(specs_[k], value, where);
      setters_[k](out, value);
    }
    return out;
  }

 private:
  std::vector<OptionSpec> specs_;
  std::vector<std::function<void(Options&, const OptionValue&)>> setters_;
  std::vector<std::function<OptionValue(const Options&)>> getters_;
};

}  // namespace attnmix
