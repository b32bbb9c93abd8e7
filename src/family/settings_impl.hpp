// SPDX-License-Identifier: Apache-2.0
// What every family descriptor's fit entry does alike (private): sizes by symbol, and the step from an option table
// to an estimator's options and back.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "attnmix/family/spec.hpp"

namespace attnmix::detail {

/// Sizes by symbol, none saying where it came from (the caller does).
inline Dims sizes(std::initializer_list<std::pair<const char*, int64_t>> values) {
  Dims out;
  for (const auto& [symbol, value] : values) out[symbol] = Dim{value, ""};
  return out;
}

/// An estimator's options from its settings: the table's values over the defaults, the name and the keys.
template <class Options>
Options estimator_options(const OptionTable<Options>& table, const EstimatorSettings& settings,
                          std::string_view where) {
  Options o = table.apply(settings.options, where);
  o.name = settings.name;
  o.keys = settings.keys;
  return o;
}

/// The settings an estimator of these sizes and options reports.
template <class Options>
EstimatorSettings estimator_settings(Dims sizes, const OptionTable<Options>& table, const Options& o,
                                     uint64_t seed = 0) {
  return {std::move(sizes), table.values(o), seed, o.name, o.keys};
}

/// The settings an accumulator reports: its sizes, the options that shape its statistics, and its keys.
inline EstimatorSettings accumulator_settings(Dims sizes, const std::optional<std::string>& keys,
                                              OptionValues options = {}) {
  return {std::move(sizes), std::move(options), 0, {}, keys};
}

}  // namespace attnmix::detail
