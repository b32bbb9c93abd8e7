// SPDX-License-Identifier: Apache-2.0
/// @file lm_flags.hpp
/// The flags of `attnmix lm`, generated from the library's option tables (stream/option_table.hpp): each entry's flag,
/// help, check and default, bound to its field of the options struct the command fills.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "attnmix/stream/option_table.hpp"
#include "cli_support.hpp"
#include "number_checks.hpp"

namespace attnmix::cli {

/// Whether a field is a list (a flag of comma-separated values).
template <class T>
inline constexpr bool kIsList = false;
template <class T>
inline constexpr bool kIsList<std::vector<T>> = true;

/// The flag of the table entry `option`, bound to `value` (the entry's field, or a request's own of that type).
template <class T, class Options>
CLI::Option* add_option_flag(CLI::App* cmd, T& value, const stream::StreamOption<Options>& option) {
  const std::string flag(option.flag), help = with_option_names(option.help, flag_name);
  CLI::Option* out = nullptr;
  if constexpr (std::is_enum_v<T>) {
    using Names = stream::NamedValues<T>;
    out = cmd->add_option_function<std::string>(
                 flag, [&value, where = option.name](const std::string& text) { value = Names::parse(text, where); },
                 help)
              ->check(CLI::IsMember(stream::value_names<T>()))
              ->default_str(Names::name(value));
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    out = cmd->add_option_function<double>(flag, [&value](const double& x) { value = x; }, help)->type_name("FLOAT");
  } else {
    out = cmd->add_option(flag, value, help)->capture_default_str();
    if constexpr (kIsList<T>) out->delimiter(',');
  }
  if (option.choices != nullptr) out->check(CLI::IsMember(*option.choices));
  switch (option.check) {
    case OptionCheck::kPositive:
      out->check(kPositive);
      break;
    case OptionCheck::kNonNegative:
      out->check(kNonNegative);
      break;
    case OptionCheck::kUnitInterval:
      out->check(CLI::Range(0.0, 1.0));
      break;
    case OptionCheck::kFinite:
      out->check(kFinite);
      break;
    case OptionCheck::kAny:
      break;
  }
  return out;
}

/// A flag for every entry of `table` that has one, in the table's order, bound to its field in `options`.
template <class Options>
void add_table_flags(CLI::App* cmd, Options& options, const stream::OptionTableOf<Options>& table) {
  for (const stream::StreamOption<Options>& option : table)
    if (!option.flag.empty())
      std::visit([&](const auto& field) { add_option_flag(cmd, field(options), option); }, option.field);
}

}  // namespace attnmix::cli
