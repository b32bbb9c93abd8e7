// SPDX-License-Identifier: Apache-2.0
// Option tables (include/attnmix/family/options.hpp): the help text each adapter renders from one source, the checks
// of a value against its option, and an OptionTable's round trip through an options struct.
#include "attnmix/family/options.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "attnmix/core/errors.hpp"

namespace attnmix {
namespace {

std::string as_flag(std::string_view name) {
  std::string flag = "--" + std::string(name);
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag;
}
std::string as_keyword(std::string_view name) { return std::string(name); }

TEST(OptionHelp, NamesEveryBracedOptionTheAdaptersWayAndCapitalises) {
  constexpr std::string_view help = "gate variance sigma^2, fixed unless {estimate_sigma2} (see {max_its})";
  EXPECT_EQ(option_help(help, as_flag), "Gate variance sigma^2, fixed unless --estimate-sigma2 (see --max-its)");
  EXPECT_EQ(option_help(help, as_keyword), "Gate variance sigma^2, fixed unless estimate_sigma2 (see max_its)");
  EXPECT_EQ(option_help("{seed} of the noise", as_keyword), "Seed of the noise");
  EXPECT_EQ(option_help("", as_flag), "");
  // An unclosed brace is text, not an option.
  EXPECT_EQ(option_help("a { b", as_flag), "A { b");
}

struct Knobs {
  double sigma2 = 1.0;
  int64_t its = 3;
  bool flag = false;
};

TEST(OptionCheck, RejectsWrongTypesSignsAndNonFiniteValuesNamingTheOption) {
  const OptionSpec positive{"sigma2", "", OptionValue(1.0), OptionCheck::kPositive};
  EXPECT_NO_THROW(check_option(positive, OptionValue(0.5), "fit"));
  for (const OptionValue& bad : {OptionValue(0.0), OptionValue(-1.0), OptionValue(int64_t{2}),
                                OptionValue(std::numeric_limits<double>::infinity())}) {
    try {
      check_option(positive, bad, "fit");
      ADD_FAILURE() << "accepted " << option_text(bad);
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("fit: sigma2"), std::string::npos) << e.what();
    }
  }
  const OptionSpec choice{"precision", "", OptionValue(std::string("float64")), OptionCheck::kAny,
                          {"float64", "mixed"}};
  EXPECT_EQ(choices_text(choice), "'float64' or 'mixed'");
  EXPECT_THROW(check_option(choice, OptionValue(std::string("half")), "fit"), ValueError);
}

TEST(OptionTable, SetsAndReadsBackEveryOptionOverTheDefaults) {
  const auto table = OptionTable<Knobs>()
                         .add("sigma2", &Knobs::sigma2, "variance", OptionCheck::kPositive)
                         .add("its", &Knobs::its, "iterations", OptionCheck::kNonNegative)
                         .add("flag", &Knobs::flag, "a switch");
  ASSERT_EQ(table.specs().size(), 3U);
  EXPECT_EQ(std::get<double>(table.specs()[0].fallback), 1.0);
  const Knobs set = table.apply({{"its", OptionValue(int64_t{7})}}, "test");
  EXPECT_EQ(set.its, 7);
  EXPECT_EQ(set.sigma2, 1.0);
  const OptionValues values = table.values(set);
  EXPECT_EQ(std::get<int64_t>(values.at("its")), 7);
  EXPECT_FALSE(std::get<bool>(values.at("flag")));
  EXPECT_THROW(static_cast<void>(table.apply({{"nope", OptionValue(1.0)}}, "test")), ValueError);
  EXPECT_THROW(static_cast<void>(table.apply({{"its", OptionValue(int64_t{-1})}}, "test")), ValueError);
}

}  // namespace
}  // namespace attnmix
