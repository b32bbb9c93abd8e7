// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the CLI on hostile sizes and numeric edges: a huge id, a huge dimension flag, a query far out of
// range, a subnormal σ² in a model file and a --sigma2 that contradicts the --init model. Each must end with exit 2
// and a message naming the file, line and field (or the flag), and leave no output file.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testing/cli_fixture.hpp"

namespace attnmix {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::read_text;
using testing::RunResult;

class CliSizesTest : public testing::CliFixture {
 protected:
  [[nodiscard]] static std::string data(const std::string& name) {
    return std::string(ATTNMIX_TEST_DATA_DIR) + "/" + name;
  }
  /// Runs `fit <args> --out model.json` and checks exit 2, every fragment in stderr and no model file.
  void expect_fit_refused(const std::string& args, const std::vector<std::string>& fragments) const {
    const RunResult r = run("fit " + args + " --out model.json --max-its 2");
    EXPECT_EQ(r.code, 2) << args << "\n" << r.err;
    for (const std::string& f : fragments) EXPECT_TRUE(contains(r.err, f)) << args << ": missing '" << f << "' in\n" << r.err;
    EXPECT_FALSE(fs::exists(path("model.json"))) << args;
  }
};

TEST_F(CliSizesTest, AHugeIdInTheDataIsRefusedAtItsLine) {
  // 2^62 cannot be an id (the symbol table would not fit in int64), whatever the family.
  write("ca.jsonl", R"({"keys":[0,1,2],"values":[1,2,0],"query":0,"target":1})"
                    "\n"
                    R"({"keys":[0,4611686018427387904,2],"values":[1,2,0],"query":0,"target":1})"
                    "\n");
  expect_fit_refused("--family ca --data ca.jsonl",
                     {"ca.jsonl: line 2", "keys[1]", "out-of-range ID 4611686018427387904", "2^48"});
  write("vea.jsonl", R"({"context":[0,1,2],"query":0,"target":9223372036854775807})"
                     "\n");
  expect_fit_refused("--family vea --data vea.jsonl", {"vea.jsonl: line 1", "target", "9223372036854775807"});
}

TEST_F(CliSizesTest, AnIdTooLargeForTheModelIsTracedToItsLineAndField) {
  // 2^30 is a valid id, but S = 2^30 + 1 makes the L x S x S key tables far larger than 2^48 entries.
  write("ca.jsonl", R"({"keys":[0,1,2],"values":[1,2,0],"query":0,"target":1})"
                    "\n"
                    R"({"keys":[0,1,2],"values":[1,1073741824,0],"query":0,"target":1})"
                    "\n");
  expect_fit_refused("--family ca --data ca.jsonl",
                     {"ChainedAttentionEstimator", "key_num", "at most 2^48 elements", "S = 1073741825",
                      "the largest key, value or query id at ca.jsonl: line 2, field values"});
}

TEST_F(CliSizesTest, AHugeDimensionFlagIsAClearError) {
  const std::string ca = "--data '" + data("ca_small.jsonl") + "'";
  expect_fit_refused("--family ca " + ca + " --symbols 4611686018427387905",
                     {"key_num", "at most 2^48 elements", "S = 4611686018427387905 (from --symbols)"});
  const std::string ra = "--data '" + data("ra_small.jsonl") + "'";
  expect_fit_refused("--family ra " + ra + " --targets 4611686018427387905",
                     {"emission_count", "at most 2^48 elements", "T = 4611686018427387905 (from --targets)"});
  expect_fit_refused("--family vea --data '" + data("vea_small.jsonl") + "' --mc 4611686018427387905",
                     {"mc x num_symbols x embed_dim", "at most 2^48 elements"});
}

TEST_F(CliSizesTest, AQueryBeyondTheMagnitudeBoundIsRefusedAtItsLine) {
  write("ra.jsonl", R"({"context":[0,1,2],"query":[1.0,0.0,0.0,0.0],"target":1})"
                    "\n"
                    R"({"context":[0,1,2],"query":[1.0,1e300,0.0,0.0],"target":1})"
                    "\n");
  expect_fit_refused("--family ra --data ra.jsonl", {"ra.jsonl: line 2", "query[1]", "magnitude at most 1e+50",
                                                      "1.0000000000000001e+300"});
  // predict and score refuse the row the same way instead of printing NaN.
  for (const char* command : {"predict", "score"}) {
    const RunResult r = run(std::string(command) + " --model '" + data("ra_model.json") + "' --data ra.jsonl");
    EXPECT_EQ(r.code, 2) << command << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "ra.jsonl: line 2")) << r.err;
    EXPECT_FALSE(contains(r.out, "nan")) << r.out;
  }
}

TEST_F(CliSizesTest, ASubnormalVarianceInAModelFileIsRefused) {
  for (const char* fixture : {"ra_model.json", "ca_model.json", "vea_model.json", "vmha_model.json"}) {
    nlohmann::json doc = nlohmann::json::parse(read_text(data(fixture)));
    doc["params"]["sigma2"] = 1e-320;
    write("tiny.json", doc.dump());
    const RunResult r = run("sample --model tiny.json -n 3 --seed 1");
    EXPECT_EQ(r.code, 2) << fixture << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "sigma2 must be a finite real >= 1e-100")) << fixture << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << fixture;
  }
}

TEST_F(CliSizesTest, ASigma2ThatContradictsTheInitModelIsAnError) {
  const std::string rows = "--data '" + data("ca_small.jsonl") + "'";
  expect_fit_refused("--family ca --init '" + data("ca_model.json") + "' " + rows + " --sigma2 0.5",
                     {"--sigma2 0.5 does not match the --init model", "ca_model.json", "(sigma2 = 0.25)"});
  expect_fit_refused("--family vea --init '" + data("vea_model.json") + "' --data '" + data("vea_small.jsonl") +
                         "' --sigma2 0.25",
                     {"--sigma2 0.25 does not match the --init model", "(sigma2 = 0.5)"});
  // The model's own value is accepted.
  const RunResult same = run("fit --family ca --init '" + data("ca_model.json") + "' " + rows +
                             " --sigma2 0.25 --max-its 2 --out model.json");
  EXPECT_EQ(same.code, 0) << same.err;
  EXPECT_TRUE(fs::exists(path("model.json")));
}

}  // namespace
}  // namespace attnmix
