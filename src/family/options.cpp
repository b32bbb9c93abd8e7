// SPDX-License-Identifier: Apache-2.0
#include "attnmix/family/options.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

namespace attnmix {

std::string option_text(const OptionValue& value) {
  if (const auto* b = std::get_if<bool>(&value)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (const auto* s = std::get_if<std::string>(&value)) return *s;
  std::array<char, 64> buf{};
  std::snprintf(buf.data(), buf.size(), "%.17g", std::get<double>(value));
  return buf.data();
}

std::string choices_text(const OptionSpec& spec) {
  std::string out;
  for (size_t i = 0; i < spec.choices.size(); ++i) {
    out.append(i == 0 ? "" : i + 1 == spec.choices.size() ? " or " : ", ");
    out.append("'").append(spec.choices[i]).append("'");
  }
  return out;
}

std::string with_option_names(std::string_view help, std::string (*name_of)(std::string_view option)) {
  std::string out;
  for (size_t i = 0; i < help.size(); ++i) {
    const size_t close = help[i] == '{' ? help.find('}', i) : std::string_view::npos;
    if (close == std::string_view::npos) {
      out += help[i];
      continue;
    }
    out += name_of(help.substr(i + 1, close - i - 1));
    i = close;
  }
  return out;
}

std::string option_help(std::string_view help, std::string (*name_of)(std::string_view option)) {
  std::string out = with_option_names(help, name_of);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
  return out;
}

void check_option(const OptionSpec& spec, const OptionValue& value, std::string_view where) {
  const std::string name = std::string(where) + ": " + std::string(spec.name);
  if (value.index() != spec.fallback.index())
    throw ValueError(name + " has the wrong type (" + option_text(value) + ")");
  if (const auto* s = std::get_if<std::string>(&value)) {
    if (std::find(spec.choices.begin(), spec.choices.end(), *s) == spec.choices.end())
      throw ValueError(name + " must be " + choices_text(spec) + " (got '" + *s + "')");
    return;
  }
  double x = 0.0;
  if (const auto* i = std::get_if<int64_t>(&value)) x = static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&value)) x = *d;
  if (!std::isfinite(x)) throw ValueError(name + " must be finite (got " + option_text(value) + ")");
  if (spec.check == OptionCheck::kPositive && !(x > 0.0))
    throw ValueError(name + " must be positive (got " + option_text(value) + ")");
  if (spec.check == OptionCheck::kNonNegative && !(x >= 0.0))
    throw ValueError(name + " must be non-negative (got " + option_text(value) + ")");
  if (spec.check == OptionCheck::kUnitInterval && !(x >= 0.0 && x <= 1.0))
    throw ValueError(name + " must lie in [0, 1] (got " + option_text(value) + ")");
}

}  // namespace attnmix
