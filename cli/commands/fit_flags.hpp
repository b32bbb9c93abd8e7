// SPDX-License-Identifier: Apache-2.0
/// @file fit_flags.hpp
/// The family flags of `attnmix fit`, generated from the family descriptors (family/spec.hpp): one flag per size
/// and per option that some fitted family has (`--symbols`, `--hops`, `--sigma2`, `--lr`, …), typed, checked and
/// explained by the families' tables, plus `--text` and `--tokens` for the families that read text corpora. A flag
/// given with a family that does not take it is a usage error naming the families that do.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "attnmix/family/spec.hpp"
#include "commands/fit_problem.hpp"

namespace attnmix::cli {

/// The registered families `attnmix fit` fits (those with an estimator), in registration order.
[[nodiscard]] std::vector<const FamilySpec*> fitted_families();

/// Adds --family, every size and option flag, --text and --tokens to `cmd`, parsing into `args`.
void add_family_flags(CLI::App* cmd, FitArgs& args);

/// The family --family names, after checking that no flag of another family was given. @throws UsageError.
[[nodiscard]] const FamilySpec& choose_family(const FitArgs& args);

/// The data-file formats of the fitted families, for the help: "responsibility {"context":[ids],…} (arrays …); …".
[[nodiscard]] std::string data_formats_text();

}  // namespace attnmix::cli
