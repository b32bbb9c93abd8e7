// SPDX-License-Identifier: Apache-2.0
// The family flags of `attnmix fit`, generated from the family descriptors (fit_flags.hpp).
#include "commands/fit_flags.hpp"

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "cli_support.hpp"
#include "number_checks.hpp"

namespace attnmix::cli {

namespace {

/// The flags of text corpora, which only the families with TextSpec hooks take.
constexpr const char* kTextFlags[] = {"text", "tokens", "vocabulary", "embeddings"};

/// "prior_strength" → "prior-strength".
std::string flag_of(std::string_view option) {
  std::string out(option);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

/// "a", "a or b", "a, b or c".
std::string either(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return out;
}

std::string names_of(const std::vector<const FamilySpec*>& families, const char* separator) {
  std::string out;
  for (const FamilySpec* f : families) out += (out.empty() ? "" : separator) + std::string(f->name);
  return out;
}

/// What a flag says beyond its own help: the families that take it (when not all do) and each one's default.
struct FlagHelp {
  std::string help;
  std::vector<std::pair<const FamilySpec*, std::string>> defaults;  // "" where the family's default is the data
  bool from_model = false;

  std::string text(size_t fitted) const {
    std::vector<std::string> values;
    for (const auto& [family, value] : defaults) values.push_back(value);
    const bool same = std::all_of(values.begin(), values.end(), [&](const std::string& v) { return v == values[0]; });
    std::string scope = defaults.size() < fitted ? names_of(takers(), ", ") : "";
    std::string fallback;
    if (same && !values[0].empty()) {
      fallback = "default: " + values[0];
    } else if (same) {
      fallback = "default: from the data";
    } else {
      for (const auto& [family, value] : defaults)
        fallback += (fallback.empty() ? "default: " : ", ") + (value.empty() ? "from the data" : value) + " " +
                    std::string(family->name);
    }
    if (values[0] == "false") fallback.clear();  // a flag is off unless given
    if (from_model) fallback += (fallback.empty() ? "" : "; ") + std::string("with --init: the model's");
    const std::string inside = scope + (!scope.empty() && !fallback.empty() ? "; " : "") + fallback;
    return help + (inside.empty() ? "" : " (" + inside + ")");
  }
  std::vector<const FamilySpec*> takers() const {
    std::vector<const FamilySpec*> out;
    for (const auto& [family, value] : defaults) out.push_back(family);
    return out;
  }
};

/// A default as the help shows it (reals in at most 6 significant digits).
std::string default_text(const OptionValue& value) {
  if (const auto* d = std::get_if<double>(&value)) return format_short(*d);
  return option_text(value);
}

}  // namespace

std::vector<const FamilySpec*> fitted_families() {
  std::vector<const FamilySpec*> out;
  for (const FamilySpec* family : families())
    if (family->fit.make_estimator) out.push_back(family);
  return out;
}

void add_family_flags(CLI::App* cmd, FitArgs& args) {
  const std::vector<const FamilySpec*> fitted = fitted_families();
  std::vector<std::string> names, described;
  for (const FamilySpec* family : fitted) {
    names.emplace_back(family->name);
    for (std::string_view alias : family->aliases) names.emplace_back(alias);
    std::string text(family->name);
    for (std::string_view alias : family->aliases) text += " (" + std::string(alias) + ")";
    described.push_back(text);
  }
  cmd->add_option("--family", args.family, "Mechanism: " + either(described))
      ->check(CLI::IsMember(names))
      ->capture_default_str();

  // Every size and option, in the order the families list them; each flag's type comes from the first family that
  // has it (a size is a positive integer).
  std::vector<std::string> order;
  std::map<std::string, FlagHelp> helps;
  const auto take = [&](const std::string& flag, const FamilySpec* family, OptionValue type, std::string help,
                        std::string fallback, bool from_model) {
    auto [it, fresh] = args.flags.try_emplace(flag);
    if (fresh) {
      it->second.value = std::move(type);
      order.push_back(flag);
      helps[flag].help = std::move(help);
    }
    it->second.families.push_back(family);
    helps[flag].defaults.emplace_back(family, std::move(fallback));
    helps[flag].from_model = helps[flag].from_model || from_model;
  };
  for (const FamilySpec* family : fitted)
    for (const SizeSpec& size : family->fit.sizes)
      take(std::string(size.flag), family, OptionValue(int64_t{0}),
           std::string(size.symbol) + ", " + std::string(size.help),
           size.fallback ? std::to_string(*size.fallback) : "", /*from_model=*/false);
  for (const FamilySpec* family : fitted)
    for (const OptionSpec& option : family->fit.options)
      take(flag_of(option.name), family, option.fallback, option_help(option.help, flag_name),
           default_text(option.fallback), option.from_model);
  for (const FamilySpec* family : fitted)
    if (family->fit.text.rows)
      for (const char* flag : kTextFlags) take(flag, family, OptionValue(std::string()), "", "", false);

  std::vector<std::string> text_families;
  for (const FamilySpec* family : args.flags["text"].families) text_families.emplace_back(family->name);
  args.flags["text"].option =
      cmd->add_option("--text", args.text,
                      "Training text corpus (plain text; " + either(text_families) + "; needs --context-length)")
          ->type_name("FILE");
  args.flags["tokens"].option =
      cmd->add_option("--tokens", args.tokens,
                      "How --text is split: chars (UTF-8 characters) or words (a --vocabulary document says which)")
          ->check(CLI::IsMember({"chars", "words"}))
          ->capture_default_str();
  args.flags["vocabulary"].option =
      cmd->add_option("--vocabulary", args.vocabulary,
                      "The tokens of --text and their ids (one per line, or a vocabulary a fit wrote); tokens not in "
                      "it map to its <unk> entry (default: the --init model's, else built from the text)")
          ->type_name("FILE");
  args.flags["embeddings"].option =
      cmd->add_option("--embeddings", args.embeddings,
                      "Query embeddings of the --vocabulary tokens: a float (S, D) array, .npy or .npz (default: "
                      "each token's symbol, D = S)")
          ->type_name("FILE");
  for (const std::string& flag : order) {
    if (std::find(std::begin(kTextFlags), std::end(kTextFlags), flag) != std::end(kTextFlags)) continue;
    FamilyFlag& f = args.flags[flag];
    const std::string help = helps[flag].text(fitted.size()), name = "--" + flag;
    if (auto* b = std::get_if<bool>(&f.value)) {
      f.option = cmd->add_flag(name, *b, help);
    } else if (auto* i = std::get_if<int64_t>(&f.value)) {
      f.option = cmd->add_option(name, *i, help);
    } else if (auto* d = std::get_if<double>(&f.value)) {
      f.option = cmd->add_option(name, *d, help);
    } else {
      std::vector<std::string> choices;
      for (const FamilySpec* family : f.families)
        for (const OptionSpec& option : family->fit.options)
          if (flag_of(option.name) == flag)
            for (std::string_view c : option.choices)
              if (std::find(choices.begin(), choices.end(), c) == choices.end()) choices.emplace_back(c);
      f.option = cmd->add_option(name, std::get<std::string>(f.value), help)->check(CLI::IsMember(choices));
    }
    // Sizes are positive; options carry their own check.
    OptionCheck check = OptionCheck::kPositive;
    for (const FamilySpec* family : f.families)
      for (const OptionSpec& option : family->fit.options)
        if (flag_of(option.name) == flag) check = option.check;
    if (check == OptionCheck::kPositive && !std::holds_alternative<bool>(f.value) &&
        !std::holds_alternative<std::string>(f.value))
      f.option->check(kPositive);
    if (check == OptionCheck::kNonNegative) f.option->check(kNonNegative);
  }
}

const FamilySpec& choose_family(const FitArgs& args) {
  const FamilySpec* chosen = nullptr;
  for (const FamilySpec* family : fitted_families()) {
    if (family->name == args.family) chosen = family;
    for (std::string_view alias : family->aliases)
      if (alias == args.family) chosen = family;
  }
  if (chosen == nullptr) throw UsageError("--family " + args.family + ": unknown family");
  for (const auto& [flag, f] : args.flags) {
    if (!given(f.option) || std::find(f.families.begin(), f.families.end(), chosen) != f.families.end()) continue;
    throw UsageError(f.option->get_name() + " applies only to --family " + names_of(f.families, " or ") +
                     ", not to --family " + std::string(chosen->name));
  }
  return *chosen;
}

std::string data_formats_text() {
  std::vector<const RowSchema*> schemas;
  for (const FamilySpec* family : fitted_families())
    if (family->schema && std::find(schemas.begin(), schemas.end(), family->schema) == schemas.end())
      schemas.push_back(family->schema);
  std::string out;
  for (const RowSchema* schema : schemas) {
    std::vector<const FamilySpec*> readers;
    for (const FamilySpec* family : fitted_families())
      if (family->schema == schema) readers.push_back(family);
    std::string object, arrays;
    for (const DataField& f : schema->fields) {
      const bool ids = f.kind == DataKind::kIds;
      const std::string value = f.width.empty() ? (ids ? "id" : "real") : (ids ? "[ids]" : "[reals]");
      const std::string symbols = f.symbols ? " or a symbol id" : "";  // one id standing for its one-hot row
      object += (object.empty() ? "{" : ",") + ("\"" + std::string(f.name) + "\":") + value + symbols;
      arrays += (arrays.empty() ? "" : ", ") + std::string(f.name) + " " +
                (f.width.empty() ? "(n,)" : "(n," + std::string(f.width) + ")") + (ids ? " int" : " float") +
                (f.symbols ? " or (n,) int" : "");
    }
    out += (out.empty() ? "" : "; ") + names_of(readers, " and ") + " " + object + "} (arrays " + arrays + ")";
  }
  return out;
}

}  // namespace attnmix::cli
