// SPDX-License-Identifier: Apache-2.0
// `attnmix fit --checkpoint` and `--resume` end to end: a fit stopped after k iterations and resumed with the same
// command writes the model file of the uninterrupted fit byte for byte (every family, both loops, validation data,
// mixed precision, another thread count); checkpoints that are damaged, foreign or of another fit are refused with
// the file and the field named, and leave every file as it was.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/cli_fixture.hpp"

namespace attnmix {
namespace {

using testing::RunResult;
using testing::contains;
using testing::lines_of;
using testing::read_text;

class CliCheckpointTest : public testing::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    const RunResult r = run("sample --model '" + data("ra_model.json") + "' -n 1500 --seed 3");
    ASSERT_EQ(r.code, 0) << r.err;
    write("ra.jsonl", r.out);
    const RunResult v = run("sample --model '" + data("ra_model.json") + "' -n 300 --seed 4");
    ASSERT_EQ(v.code, 0) << v.err;
    write("valid.jsonl", v.out);
  }
  [[nodiscard]] static std::string data(const std::string& name) {
    return std::string(ATTNMIX_TEST_DATA_DIR) + "/" + name;
  }
  [[nodiscard]] std::string text(const std::string& name) const { return read_text(dir_ / name); }

  /// Runs `fit <fit> --max-its <its>` uninterrupted, then stopped after `stop` iterations with a checkpoint and
  /// resumed with `resume_extra` added; expects both model files (and, with `history`, the history lines without
  /// their seconds) to be the same.
  void expect_resume_matches(const std::string& fit, int its, int stop, const std::string& resume_extra = "",
                             bool history = false) {
    SCOPED_TRACE(fit + " stopped after " + std::to_string(stop));
    const std::string its_flag = " --max-its " + std::to_string(its);
    const std::string history_flag = history ? " --history full.jsonl" : "";
    RunResult r = run("fit " + fit + its_flag + " --out full.json" + history_flag);
    ASSERT_EQ(r.code, 0) << r.err;
    r = run("fit " + fit + " --max-its " + std::to_string(stop) + " --out part.json --checkpoint ck.json");
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_TRUE(contains(r.out, "checkpoint      ck.json (after iteration " + std::to_string(stop))) << r.out;
    r = run("fit " + fit + its_flag + " --out resumed.json --resume ck.json" + resume_extra +
            (history ? " --history resumed.jsonl" : ""));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(contains(r.out, "resumed from    ck.json (after iteration " + std::to_string(stop) + ")")) << r.out;
    EXPECT_FALSE(contains(r.out, "Iteration " + std::to_string(stop) + ":")) << r.out;
    EXPECT_EQ(text("full.json"), text("resumed.json"));
    if (history) {
      const auto without_seconds = [&](const std::string& name) {
        std::vector<nlohmann::json> lines;
        for (const std::string& line : lines_of(text(name))) {
          nlohmann::json parsed = nlohmann::json::parse(line);
          parsed.erase("seconds");
          lines.push_back(parsed);
        }
        return lines;
      };
      EXPECT_EQ(without_seconds("full.jsonl"), without_seconds("resumed.jsonl"));
    }
  }
};

TEST_F(CliCheckpointTest, ResumedFitsWriteTheUninterruptedModel) {
  for (const int stop : {1, 3, 6}) expect_resume_matches("--data ra.jsonl --delta none", 6, stop);
  // The default delta: the fit converges after the checkpoint.
  expect_resume_matches("--data ra.jsonl", 40, 4);
  // Another thread count, the classic loop with validation data (the history too), mixed precision.
  expect_resume_matches("--data ra.jsonl --delta none", 6, 2, " --threads 1");
  expect_resume_matches("--data ra.jsonl --valid valid.jsonl --classic", 6, 2, "", true);
  expect_resume_matches("--data ra.jsonl --delta none --precision mixed", 5, 2);
}

TEST_F(CliCheckpointTest, EveryFamilyResumesExactly) {
  // A Monte-Carlo objective: the noise and the Adam moments go on from the checkpoint's model.
  expect_resume_matches("--family vea --data '" + data("vea_small.jsonl") + "'", 6, 2);
  expect_resume_matches("--family vea --data '" + data("vea_small.jsonl") + "' --precision mixed", 5, 3);
  expect_resume_matches("--family vmha --data '" + data("ca_small.jsonl") + "'", 5, 2);
  expect_resume_matches("--family chained --data '" + data("ca_small.jsonl") + "' --delta none", 5, 2);
  expect_resume_matches("--family ra --text '" + data("README.md") + "' --context-length 3 --delta none", 4, 2);
  // Sparse tables: the resumed fit rebuilds the same cells from the same text.
  expect_resume_matches("--family ra-sparse --text '" + data("README.md") + "' --tokens words --context-length 3 "
                        "--estimate-sigma2 --delta none", 4, 2);
}

TEST_F(CliCheckpointTest, CheckpointsComeEveryKIterationsAndGoOnWithAHigherMaxIts) {
  RunResult r = run("fit --data ra.jsonl --delta none --max-its 5 --out a.json --checkpoint ck.json "
                    "--checkpoint-every 2");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json saved = nlohmann::json::parse(text("ck.json"));
  EXPECT_EQ(saved["format"], "attnmix-fit-checkpoint");
  EXPECT_EQ(saved["iteration"], 4);
  EXPECT_EQ(saved["scores"].size(), 4U);
  EXPECT_TRUE(contains(r.out, "checkpoint      ck.json (after iteration 4)\n")) << r.out;
  // After the last iteration, the summary says how to go on.
  r = run("fit --data ra.jsonl --delta none --max-its 4 --out a.json --checkpoint ck.json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "(after iteration 4; --resume it with a higher --max-its to go on)")) << r.out;
  r = run("fit --data ra.jsonl --delta none --max-its 4 --out b.json --resume ck.json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "iterations      4 run")) << r.out;
  EXPECT_EQ(text("a.json"), text("b.json"));
  // A fit that converges before the first checkpoint is due writes none.
  r = run("fit --data ra.jsonl --max-its 40 --out c.json --checkpoint none.json --checkpoint-every 39");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "checkpoint      none written")) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "none.json"));
}

TEST_F(CliCheckpointTest, BadCheckpointsExitTwoNamingTheFileAndTheFieldAndChangeNothing) {
  ASSERT_EQ(run("fit --data ra.jsonl --delta none --max-its 3 --out part.json --checkpoint ck.json").code, 0);
  const std::string good = text("ck.json");
  write("out.json", "keep");
  const auto expect_refused = [&](const std::string& flags, int code, const std::string& message) {
    SCOPED_TRACE(flags);
    const std::string before = text("ck.json");
    const RunResult r =
        run("fit --data ra.jsonl --delta none --max-its 6 --out out.json --checkpoint ck.json " + flags);
    EXPECT_EQ(r.code, code) << r.out;
    EXPECT_TRUE(contains(r.err, message)) << r.err;
    EXPECT_EQ(text("out.json"), "keep");
    EXPECT_EQ(text("ck.json"), before);
  };
  // Another fit's settings, and a --max-its below the checkpoint's iteration.
  RunResult r = run("fit --data ra.jsonl --delta none --sigma2 2 --max-its 6 --out out.json --resume ck.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "ck.json: the checkpoint was written by another fit: its options.sigma2 is \"1\", "
                              "this fit's \"2\"")) << r.err;
  r = run("fit --data valid.jsonl --delta none --max-its 6 --out out.json --resume ck.json");
  EXPECT_TRUE(contains(r.err, "its data is")) << r.err;
  r = run("fit --data ra.jsonl --delta none --max-its 2 --out out.json --resume ck.json");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "--resume ck.json holds the fit after iteration 3: give --max-its 3 or more")) << r.err;
  EXPECT_EQ(text("out.json"), "keep");
  // Damaged documents: each refused with its field; the model inside is checked as a model file is.
  write("other.json", text("part.json"));  // a model file, not a checkpoint
  expect_refused("--resume other.json", 2, "other.json: not a checkpoint of attnmix fit");
  write("cut.json", good.substr(0, good.size() / 2));
  expect_refused("--resume cut.json", 2, "cut.json: not a checkpoint of attnmix fit (not a valid JSON document");
  const auto damaged = [&](const std::string& name, const auto& change) {
    nlohmann::json doc = nlohmann::json::parse(good);
    change(doc);
    write(name, doc.dump());
  };
  damaged("scores.json", [](nlohmann::json& doc) { doc["scores"].erase(0); });
  expect_refused("--resume scores.json", 2, "scores.json: field \"scores\" holds 2 scores for 3 iterations");
  damaged("best.json", [](nlohmann::json& doc) { doc["best"] = "high"; });
  expect_refused("--resume best.json", 2, "best.json: field \"best\" must be a number");
  damaged("version.json", [](nlohmann::json& doc) { doc["version"] = 7; });
  expect_refused("--resume version.json", 2, "version.json: field \"version\" is 7");
  damaged("model.json", [](nlohmann::json& doc) { doc["model"]["params"]["sigma2"] = -1.0; });
  expect_refused("--resume model.json", 2, "model.json: field \"model\"");
  damaged("missing.json", [](nlohmann::json& doc) { doc.erase("previous"); });
  expect_refused("--resume missing.json", 2, "missing.json: field \"previous\" is missing");
  expect_refused("--resume absent.json", 2, "absent.json: cannot open the checkpoint");
  // The checkpoint must be its own file, and --checkpoint-every needs --checkpoint.
  r = run("fit --data ra.jsonl --out same.json --checkpoint same.json");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "--checkpoint same.json names the file --out writes")) << r.err;
  r = run("fit --data ra.jsonl --out x.json --checkpoint ra.jsonl");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "--checkpoint ra.jsonl is the file --data reads")) << r.err;
  r = run("fit --data ra.jsonl --out x.json --checkpoint-every 2");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(text("ck.json"), good);
}

}  // namespace
}  // namespace attnmix
