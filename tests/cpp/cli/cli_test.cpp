// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the attnmix command-line tool (SPEC.md §1.10): the binary (ATTNMIX_CLI) runs
// in a fresh temporary directory per test; fixtures come from ATTNMIX_TEST_DATA_DIR (see
// tests/data/README.md).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/transitive_task.hpp"
#include "attnmix/core/json.hpp"

namespace attnmix {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int code = -1;
  std::string out;
  std::string err;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

/// Each test runs the CLI inside its own empty directory (removed afterwards).
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("attnmix_cli_test_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// Runs `attnmix <args>` in the test directory, capturing stdout and stderr.
  RunResult run(const std::string& args) const {
    const fs::path out = dir_ / ".stdout", err = dir_ / ".stderr";
    const std::string command = "cd '" + dir_.string() + "' && '" + std::string(ATTNMIX_CLI) +
                                "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "'";
    const int status = std::system(command.c_str());
    RunResult result;
    result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    result.out = read_text(out);
    result.err = read_text(err);
    fs::remove(out);
    fs::remove(err);
    return result;
  }
  [[nodiscard]] std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name) << text;
  }
  [[nodiscard]] static std::string data(const std::string& name) {
    return std::string(ATTNMIX_TEST_DATA_DIR) + "/" + name;
  }
  /// Samples n training rows from the fixture model into `name`.
  void sample_rows(const std::string& name, int n, int seed) const {
    const RunResult r = run("sample --model '" + data("ra_model.json") + "' -n " +
                            std::to_string(n) + " --seed " + std::to_string(seed));
    ASSERT_EQ(r.code, 0) << r.err;
    write(name, r.out);
  }
  /// Writes n rows of the transitive-lookup task (S = 30, 5 pairs, N = 10) as chained JSON Lines.
  void write_transitive(const std::string& name, Index n, uint64_t seed) const {
    const ChainedAttentionBatch batch = make_transitive_task(n, seed);
    std::ofstream out(dir_ / name);
    for (Index r = 0; r < batch.n_rows(); ++r) {
      nlohmann::json row;
      row["keys"] = std::vector<int64_t>(batch.keys(r), batch.keys(r) + batch.context_length());
      row["values"] =
          std::vector<int64_t>(batch.values(r), batch.values(r) + batch.context_length());
      row["query"] = batch.query(r);
      row["target"] = batch.target(r);
      out << row.dump() << '\n';
    }
  }
  [[nodiscard]] std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

// ----- usage
// ---------------------------------------------------------------------------------------------------------

TEST_F(CliTest, HelpExitsZeroForEveryCommand) {
  for (const char* command :
       {"", "fit ", "score ", "predict ", "sample ", "demo ", "assign-tree "}) {
    const RunResult r = run(std::string(command) + "--help");
    EXPECT_EQ(r.code, 0) << command << r.err;
    EXPECT_TRUE(contains(r.out, "Usage")) << command;
  }
}

TEST_F(CliTest, UsageErrorsExitOne) {
  EXPECT_EQ(run("fit --data x.jsonl --out m.json --no-such-flag").code, 1);
  EXPECT_EQ(run("").code, 1);                    // a subcommand is required
  EXPECT_EQ(run("frobnicate").code, 1);          // unknown subcommand
  EXPECT_EQ(run("fit --data x.jsonl").code, 1);  // --out missing
  EXPECT_EQ(run("fit --out m.json").code, 1);    // neither --data nor --text
  EXPECT_EQ(run("fit --data x --delta fast --out m.json").code, 1);
  EXPECT_EQ(run("sample --model m.json --seed 1").code, 1);  // -n missing
  for (const char* family : {"variational", "vea", "variational-multihop", "vmha"}) {
    const RunResult r = run(std::string("fit --family ") + family + " --data x.jsonl --out m.json");
    EXPECT_EQ(r.code, 1) << family;
    EXPECT_TRUE(contains(r.err, "not yet available in this build")) << r.err;
  }
  // Flags of one family are usage errors with the other.
  for (const char* args : {"--family ra --hops 2", "--family ca --query-dim 3",
                           "--family chained --estimate-sigma2", "--family ca --min-sigma2 0.1"}) {
    const RunResult r = run(std::string("fit ") + args + " --data x.jsonl --out m.json");
    EXPECT_EQ(r.code, 1) << args;
    EXPECT_TRUE(contains(r.err, "applies only to --family")) << args << ": " << r.err;
  }
  const RunResult text = run("fit --family ca --text x.txt --out m.json");
  EXPECT_EQ(text.code, 1);
  EXPECT_TRUE(contains(text.err, "--text applies only to --family responsibility")) << text.err;
  EXPECT_FALSE(fs::exists(path("m.json")));
}

// ----- the main path
// -----------------------------------------------------------------------------------------------

TEST_F(CliTest, SampleFitScorePredictRoundTrip) {
  sample_rows("train.jsonl", 300, 1);
  const std::vector<std::string> rows = lines_of(read_text(path("train.jsonl")));
  ASSERT_EQ(rows.size(), 300U);
  const nlohmann::json first = nlohmann::json::parse(rows[0]);
  EXPECT_EQ(first["context"].size(), 3U);
  EXPECT_EQ(first["query"].size(), 4U);
  EXPECT_TRUE(first["target"].is_number_integer());

  const RunResult fit =
      run("fit --family ra --data train.jsonl --out model.json --max-its 5 --threads 2");
  ASSERT_EQ(fit.code, 0) << fit.err;
  const std::vector<std::string> out = lines_of(fit.out);
  int progress = 0;
  for (const std::string& line : out)
    if (line.rfind("Iteration ", 0) == 0) {
      ++progress;
      EXPECT_TRUE(contains(line, "ln[p_mat(Data|Model)]=")) << line;
      EXPECT_EQ(line.substr(line.size() - 3), " s)") << line;
    }
  EXPECT_EQ(progress, 5);
  EXPECT_TRUE(contains(fit.out, "300 rows")) << fit.out;
  EXPECT_TRUE(contains(fit.out, "S=4")) << fit.out;
  EXPECT_TRUE(contains(fit.out, "model written   model.json")) << fit.out;
  const AnyDistribution model = load_model(path("model.json"));
  ASSERT_NE(model.get_if<ResponsibilityAttention>(), nullptr);
  EXPECT_EQ(model.get_if<ResponsibilityAttention>()->context_length(), 3);

  sample_rows("test.jsonl", 100, 2);
  const RunResult score = run("score --model model.json --data test.jsonl");
  ASSERT_EQ(score.code, 0) << score.err;
  double total = 0.0, mean = 0.0;
  int n = 0;
  ASSERT_EQ(std::sscanf(score.out.c_str(), "rows=%d total=%lf mean=%lf", &n, &total, &mean), 3)
      << score.out;
  EXPECT_EQ(n, 100);
  EXPECT_TRUE(std::isfinite(total));
  EXPECT_DOUBLE_EQ(mean, total / 100.0);

  const RunResult per_row = run("score --model model.json --data test.jsonl --per-row");
  ASSERT_EQ(per_row.code, 0) << per_row.err;
  const std::vector<std::string> values = lines_of(per_row.out);
  ASSERT_EQ(values.size(), 100U);
  double sum = 0.0;
  for (const std::string& v : values) sum += std::stod(v);
  EXPECT_NEAR(sum, total, 1e-9 * std::fabs(total));
  EXPECT_EQ(per_row.err, score.out);  // the summary moves to stderr

  const RunResult predict = run("predict --model model.json --data test.jsonl");
  ASSERT_EQ(predict.code, 0) << predict.err;
  const std::vector<std::string> predictions = lines_of(predict.out);
  ASSERT_EQ(predictions.size(), 100U);
  for (const std::string& line : predictions) {
    int t = -1;
    double p = -1.0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%d\t%lf", &t, &p), 2) << line;
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 4);
    EXPECT_GE(p, 0.25);  // the argmax of 4 probabilities
    EXPECT_LE(p, 1.0);
  }
  double accuracy = -1.0;
  ASSERT_EQ(std::sscanf(predict.err.c_str(), "accuracy=%lf", &accuracy), 1) << predict.err;
  EXPECT_GT(accuracy, 0.3);  // chance is 0.25; the fixture model is far more predictable

  const RunResult proba = run("predict --model model.json --data test.jsonl --proba");
  ASSERT_EQ(proba.code, 0) << proba.err;
  for (const std::string& line : lines_of(proba.out)) {
    std::istringstream in(line);
    double p = 0.0, row_sum = 0.0;
    int count = 0;
    while (in >> p) {
      row_sum += p;
      ++count;
    }
    EXPECT_EQ(count, 4);
    EXPECT_NEAR(row_sum, 1.0, 1e-9);
  }
}

TEST_F(CliTest, SampleIsDeterministicGivenTheSeed) {
  const std::string model = "--model '" + data("ra_model.json") + "'";
  const RunResult a = run("sample " + model + " -n 7 --seed 5");
  const RunResult b = run("sample " + model + " --n 7 --seed 5");
  const RunResult c = run("sample " + model + " -n 7 --seed 6 --context-length 3");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(lines_of(a.out).size(), 7U);
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  const RunResult wrong_n = run("sample " + model + " -n 7 --seed 5 --context-length 4");
  EXPECT_EQ(wrong_n.code, 1);
  EXPECT_TRUE(contains(wrong_n.err, "N = 3")) << wrong_n.err;
}

TEST_F(CliTest, ValidationDataAddsTheValidationField) {
  sample_rows("train.jsonl", 120, 3);
  sample_rows("valid.jsonl", 40, 4);
  const RunResult fit =
      run("fit --data train.jsonl --valid valid.jsonl --out model.json --max-its 3 --classic");
  ASSERT_EQ(fit.code, 0) << fit.err;
  EXPECT_TRUE(contains(fit.out, "ln[p_mat(Valid Data|Model)]=")) << fit.out;
  EXPECT_TRUE(contains(fit.out, "on 40 rows of valid.jsonl")) << fit.out;
}

TEST_F(CliTest, StrictExitsThreeWhenNotConvergedAndWritesNothing) {
  sample_rows("train.jsonl", 100, 5);
  const RunResult strict = run("fit --data train.jsonl --out model.json --max-its 1 --strict");
  EXPECT_EQ(strict.code, 3) << strict.err;
  EXPECT_FALSE(fs::exists(path("model.json")));
  const RunResult lenient = run("fit --data train.jsonl --out model.json --max-its 1");
  EXPECT_EQ(lenient.code, 0) << lenient.err;
  EXPECT_TRUE(contains(lenient.out, "NOT converged")) << lenient.out;
  EXPECT_TRUE(fs::exists(path("model.json")));
}

// ----- bad inputs
// --------------------------------------------------------------------------------------------------

/// Every bad data file gives exit code 2 and a message naming the file, the line and the field.
TEST_F(CliTest, BadDataFilesExitTwoNamingFileLineAndField) {
  const std::string good = R"({"context":[0,1,2],"query":[1,0,0,0],"target":1})"
                           "\n";
  struct Case {
    const char* name;
    std::string second_line;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases{
      {"malformed", R"({"context":[0,1,2],"query":[1,0,0,0])", {"line 2", "malformed JSON"}},
      {"missing_field", R"({"context":[0,1,2],"target":1})", {"line 2", "missing field 'query'"}},
      {"ragged",
       R"({"context":[0,1],"query":[1,0,0,0],"target":1})",
       {"line 2", "context", "expected N = 3"}},
      {"fractional",
       R"({"context":[0,1.5,2],"query":[1,0,0,0],"target":1})",
       {"line 2", "context[1]", "1.5"}},
      {"negative",
       R"({"context":[0,1,2],"query":[1,0,0,0],"target":-1})",
       {"line 2", "target", "out-of-range ID"}},
      {"bool_id",
       R"({"context":[0,true,2],"query":[1,0,0,0],"target":1})",
       {"line 2", "context[1]", "bool"}},
      {"nan_query",
       R"({"context":[0,1,2],"query":[1,"NaN",0,0],"target":1})",
       {"line 2", "query[1]", "NaN"}},
      {"huge_query",
       R"({"context":[0,1,2],"query":[1,0,1e999,0],"target":1})",
       {"line 2", "query[2]", "1e999"}},
      {"wrong_d",
       R"({"context":[0,1,2],"query":[1,0,0],"target":1})",
       {"line 2", "query", "expected D = 4"}},
      {"unknown_field",
       R"({"context":[0,1,2],"query":[1,0,0,0],"target":1,"weight":2})",
       {"line 2", "weight"}},
  };
  for (const Case& c : cases) {
    const std::string file = std::string(c.name) + ".jsonl";
    write(file, good + c.second_line + "\n");
    const RunResult r = run("fit --data " + file + " --out model.json --max-its 1");
    EXPECT_EQ(r.code, 2) << c.name << ": " << r.err;
    EXPECT_TRUE(contains(r.err, file)) << c.name << ": " << r.err;
    for (const std::string& f : c.fragments)
      EXPECT_TRUE(contains(r.err, f)) << c.name << ": " << r.err;
  }
  write("empty.jsonl", "");
  const RunResult empty = run("fit --data empty.jsonl --out model.json");
  EXPECT_EQ(empty.code, 2);
  EXPECT_TRUE(contains(empty.err, "empty.jsonl")) << empty.err;
  const RunResult missing = run("fit --data no_such_file.jsonl --out model.json");
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.err, "no_such_file.jsonl")) << missing.err;
  EXPECT_FALSE(fs::exists(path("model.json")));
}

/// Ids are checked against the model's dimensions in score and predict; integral floats are
/// accepted.
TEST_F(CliTest, ScoreAndPredictCheckIdsAgainstTheModel) {
  const std::string model = "--model '" + data("ra_model.json") + "'";
  write("ok.jsonl", R"({"context":[0,1,2.0],"query":[1,0,0,0],"target":3.0})"
                    "\n");
  EXPECT_EQ(run("score " + model + " --data ok.jsonl").code, 0);
  write("big_id.jsonl", R"({"context":[0,1,2],"query":[1,0,0,0],"target":1})"
                        "\n"
                        R"({"context":[0,1,4],"query":[1,0,0,0],"target":1})"
                        "\n");
  const RunResult r = run("score " + model + " --data big_id.jsonl");
  EXPECT_EQ(r.code, 2);
  for (const char* f : {"big_id.jsonl", "line 2", "context[2]", "out-of-range ID 4", "S = 4"})
    EXPECT_TRUE(contains(r.err, f)) << r.err;
  write("big_target.jsonl", R"({"context":[0,1,2],"query":[1,0,0,0],"target":4})"
                            "\n");
  const RunResult t = run("predict " + model + " --data big_target.jsonl");
  EXPECT_EQ(t.code, 2);
  EXPECT_TRUE(contains(t.err, "target")) << t.err;
  // Targets are optional for predict (then there is no accuracy), but required for score.
  write("no_target.jsonl", R"({"context":[0,1,2],"query":[1,0,0,0]})"
                           "\n");
  const RunResult p = run("predict " + model + " --data no_target.jsonl");
  EXPECT_EQ(p.code, 0) << p.err;
  EXPECT_EQ(lines_of(p.out).size(), 1U);
  EXPECT_FALSE(contains(p.err, "accuracy"));
  EXPECT_EQ(run("score " + model + " --data no_target.jsonl").code, 2);
}

TEST_F(CliTest, BadModelFilesExitTwoNamingTheField) {
  nlohmann::json doc = nlohmann::json::parse(read_text(data("ra_model.json")));
  doc["params"]["emission"][2][0] = 0.5;
  write("bad_model.json", doc.dump());
  write("rows.jsonl", R"({"context":[0,1,2],"query":[1,0,0,0],"target":1})"
                      "\n");
  const RunResult r = run("score --model bad_model.json --data rows.jsonl");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "bad_model.json: params.emission row 2")) << r.err;
  const RunResult missing = run("predict --model no_model.json --data rows.jsonl");
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.err, "no_model.json")) << missing.err;
}

/// Impossible evidence in a fit exits 2 and names the lines; scoring an impossible row gives -inf
/// (SPEC.md §2.5).
TEST_F(CliTest, ImpossibleEvidence) {
  write("impossible_model.json",
        R"({"format":"attnmix-model","schema_version":1,"family":"responsibility_attention",
    "params":{"key_means":[[0.0],[0.0]],"emission":[[0.0,1.0],[1.0,0.0]],"position_prior":[0.0,1.0],"sigma2":1.0}})");
  write("row.jsonl", R"({"context":[0,1],"query":[0.0],"target":1})"
                     "\n");
  const RunResult score = run("score --model impossible_model.json --data row.jsonl");
  EXPECT_EQ(score.code, 0) << score.err;
  EXPECT_EQ(score.out, "rows=1 total=-inf mean=-inf\n");

  sample_rows("train.jsonl", 300, 1);
  const RunResult fit =
      run("fit --data train.jsonl --out model.json --emission-smoothing 0 --init-p 0.01");
  EXPECT_EQ(fit.code, 2) << fit.out;
  EXPECT_TRUE(contains(fit.err, "train.jsonl: lines ")) << fit.err;
  EXPECT_TRUE(contains(fit.err, "impossible evidence")) << fit.err;
  EXPECT_FALSE(fs::exists(path("model.json")));
}

/// A failed fit leaves an existing model byte-identical, creates nothing new, and leaves no
/// temporary files.
TEST_F(CliTest, FailedFitNeverTouchesTheOutput) {
  const std::string original = read_text(data("ra_model.json"));
  write("model.json", original);
  write("bad.jsonl", R"({"context":[0,1,2],"query":[1,0,0,0],"target":1.5})"
                     "\n");
  sample_rows("train.jsonl", 50, 7);
  EXPECT_EQ(run("fit --data bad.jsonl --out model.json").code, 2);
  EXPECT_EQ(run("fit --data train.jsonl --out model.json --max-its 1 --strict").code, 3);
  EXPECT_EQ(read_text(path("model.json")), original);
  EXPECT_EQ(run("fit --data bad.jsonl --out new_model.json").code, 2);
  EXPECT_EQ(run("fit --data train.jsonl --out no_dir/new_model.json").code, 2);
  EXPECT_EQ(listing(), (std::vector<std::string>{"bad.jsonl", "model.json", "train.jsonl"}));
  // A successful fit replaces the model, atomically (no temporary file remains).
  EXPECT_EQ(run("fit --data train.jsonl --out model.json --max-its 2").code, 0);
  EXPECT_NE(read_text(path("model.json")), original);
  EXPECT_EQ(listing(), (std::vector<std::string>{"bad.jsonl", "model.json", "train.jsonl"}));
}

// ----- other inputs
// ------------------------------------------------------------------------------------------------

/// The same rows as JSONL, as a deflated int64/float64 .npz and as a stored int32/float32
/// Fortran-order .npz score identically; invalid .npz ids exit 2 naming the array element.
TEST_F(CliTest, NpzArchivesMatchJsonLines) {
  const std::string model = "--model '" + data("ra_model.json") + "'";
  const RunResult jsonl = run("score " + model + " --data '" + data("ra_small.jsonl") + "'");
  ASSERT_EQ(jsonl.code, 0) << jsonl.err;
  EXPECT_TRUE(contains(jsonl.out, "rows=6 ")) << jsonl.out;
  for (const char* archive : {"ra_small.npz", "ra_small_stored.npz"}) {
    const RunResult r = run("score " + model + " --data '" + data(archive) + "'");
    EXPECT_EQ(r.code, 0) << archive << r.err;
    EXPECT_EQ(r.out, jsonl.out) << archive;
  }
  const RunResult predict =
      run("predict " + model + " --data '" + data("ra_small_no_target.npz") + "'");
  EXPECT_EQ(predict.code, 0) << predict.err;
  EXPECT_EQ(lines_of(predict.out).size(), 6U);
  const RunResult bool_ids = run("score " + model + " --data '" + data("ra_bool_ids.npz") + "'");
  EXPECT_EQ(bool_ids.code, 2);
  EXPECT_TRUE(contains(bool_ids.err, "ra_bool_ids.npz: context")) << bool_ids.err;
  EXPECT_TRUE(contains(bool_ids.err, "bool")) << bool_ids.err;
  const RunResult fractional =
      run("score " + model + " --data '" + data("ra_fractional_ids.npz") + "'");
  EXPECT_EQ(fractional.code, 2);
  EXPECT_TRUE(contains(fractional.err, "ra_fractional_ids.npz: context[2, 1]")) << fractional.err;
  // A fit straight from an archive.
  const RunResult fit =
      run("fit --data '" + data("ra_small.npz") + "' --out model.json --max-its 2");
  EXPECT_EQ(fit.code, 0) << fit.err;
}

TEST_F(CliTest, TextCorporaFitByCharactersAndWords) {
  std::string text;
  for (int i = 0; i < 20; ++i) text += "abc abd äbc\n";
  write("corpus.txt", text);
  const RunResult chars =
      run("fit --text corpus.txt --context-length 2 --out chars.json --max-its 3");
  ASSERT_EQ(chars.code, 0) << chars.err;
  EXPECT_TRUE(contains(chars.out, "vocabulary: 7 distinct characters"))
      << chars.out;  // a b c d ä space newline
  const AnyDistribution model = load_model(path("chars.json"));
  EXPECT_EQ(model.get_if<ResponsibilityAttention>()->n_symbols(), 7);
  const RunResult words =
      run("fit --text corpus.txt --tokens words --context-length 2 --out words.json --max-its 3");
  ASSERT_EQ(words.code, 0) << words.err;
  EXPECT_TRUE(contains(words.out, "vocabulary: 3 distinct words")) << words.out;
  EXPECT_EQ(run("fit --text corpus.txt --out m.json").code,
            1);  // --context-length is required with --text
  write("short.txt", "ab");
  const RunResult short_text = run("fit --text short.txt --context-length 2 --out m.json");
  EXPECT_EQ(short_text.code, 2);
  EXPECT_TRUE(contains(short_text.err, "short.txt")) << short_text.err;
}

// ----- chained attention
// ------------------------------------------------------------------------------------------

/// fit → score → predict → sample → fit again on chained-attention JSON Lines: two hops learn the
/// transitive task, one hop cannot.
TEST_F(CliTest, ChainedFitScorePredictSampleRoundTrip) {
  write_transitive("train.jsonl", 1000, 11);
  write_transitive("test.jsonl", 300, 12);
  const RunResult fit = run(
      "fit --family chained --hops 2 --data train.jsonl --out model.json --max-its 12 "
      "--delta none --threads 2");
  ASSERT_EQ(fit.code, 0) << fit.err;
  int progress = 0;
  for (const std::string& line : lines_of(fit.out))
    if (line.rfind("Iteration ", 0) == 0) {
      ++progress;
      EXPECT_EQ(line.substr(line.size() - 3), " s)") << line;
    }
  EXPECT_EQ(progress, 12);
  for (const char* f : {"Fitting chained attention (L = 2 hops)", "1000 rows",
                        "L=2 hops, S=30 symbols, N=10 context positions, T=30 targets",
                        "--delta none", "model written   model.json"})
    EXPECT_TRUE(contains(fit.out, f)) << f << "\n" << fit.out;
  const AnyDistribution model = load_model(path("model.json"));
  const auto* ca = model.get_if<ChainedAttention>();
  ASSERT_NE(ca, nullptr);
  EXPECT_EQ(ca->n_hops(), 2);
  EXPECT_EQ(ca->sigma2(), ChainedAttentionEstimatorOptions{}.sigma2);  // the CA default, 0.1

  const RunResult score = run("score --model model.json --data test.jsonl");
  ASSERT_EQ(score.code, 0) << score.err;
  double total = 0.0, mean = 0.0;
  int n = 0;
  ASSERT_EQ(std::sscanf(score.out.c_str(), "rows=%d total=%lf mean=%lf", &n, &total, &mean), 3)
      << score.out;
  EXPECT_EQ(n, 300);
  EXPECT_TRUE(std::isfinite(total));
  const RunResult per_row = run("score --model model.json --data test.jsonl --per-row");
  ASSERT_EQ(per_row.code, 0) << per_row.err;
  ASSERT_EQ(lines_of(per_row.out).size(), 300U);
  EXPECT_EQ(per_row.err, score.out);

  const RunResult predict = run("predict --model model.json --data test.jsonl");
  ASSERT_EQ(predict.code, 0) << predict.err;
  ASSERT_EQ(lines_of(predict.out).size(), 300U);
  double two_hop = -1.0;
  ASSERT_EQ(std::sscanf(predict.err.c_str(), "accuracy=%lf", &two_hop), 1) << predict.err;
  EXPECT_GT(two_hop, 0.8);
  const RunResult proba = run("predict --model model.json --data test.jsonl --proba");
  ASSERT_EQ(proba.code, 0) << proba.err;
  for (const std::string& line : lines_of(proba.out)) {
    std::istringstream in(line);
    double p = 0.0, row_sum = 0.0;
    int count = 0;
    while (in >> p) {
      row_sum += p;
      ++count;
    }
    EXPECT_EQ(count, 30);
    EXPECT_NEAR(row_sum, 1.0, 1e-9);
  }

  ASSERT_EQ(run("fit --family ca --hops 1 --data train.jsonl --out one.json --max-its 12 "
                "--delta none")
                .code,
            0);
  const RunResult one = run("predict --model one.json --data test.jsonl");
  double one_hop = -1.0;
  ASSERT_EQ(std::sscanf(one.err.c_str(), "accuracy=%lf", &one_hop), 1) << one.err;
  EXPECT_LT(one_hop, 0.3);

  // sample: --context-length sets N (default 6); the output is data that fit reads back.
  const RunResult sample = run("sample --model model.json -n 40 --seed 3 --context-length 4");
  ASSERT_EQ(sample.code, 0) << sample.err;
  const std::vector<std::string> rows = lines_of(sample.out);
  ASSERT_EQ(rows.size(), 40U);
  const nlohmann::json first = nlohmann::json::parse(rows[0]);
  EXPECT_EQ(first["keys"].size(), 4U);
  EXPECT_EQ(first["values"].size(), 4U);
  EXPECT_TRUE(first["query"].is_number_integer());
  EXPECT_TRUE(first["target"].is_number_integer());
  EXPECT_EQ(sample.out, run("sample --model model.json -n 40 --seed 3 --context-length 4").out);
  const RunResult default_n = run("sample --model model.json -n 2 --seed 3");
  EXPECT_EQ(nlohmann::json::parse(lines_of(default_n.out)[0])["keys"].size(), 6U);
  write("sampled.jsonl", sample.out);
  const RunResult refit = run("fit --family ca --data sampled.jsonl --out refit.json --max-its 2 "
                              "--symbols 30 --targets 30 --valid sampled.jsonl");
  EXPECT_EQ(refit.code, 0) << refit.err;
  EXPECT_TRUE(contains(refit.out, "ln[p_mat(Valid Data|Model)]=")) << refit.out;
  EXPECT_EQ(run("score --model refit.json --data sampled.jsonl").code, 0);
}

/// The same chained rows as JSONL, as a deflated int64 .npz and as a stored int32/float64 .npz
/// score identically; a fit reads an archive directly.
TEST_F(CliTest, ChainedNpzArchivesMatchJsonLines) {
  const std::string model = "--model '" + data("ca_model.json") + "'";
  const RunResult jsonl = run("score " + model + " --data '" + data("ca_small.jsonl") + "'");
  ASSERT_EQ(jsonl.code, 0) << jsonl.err;
  EXPECT_TRUE(contains(jsonl.out, "rows=6 ")) << jsonl.out;
  for (const char* archive : {"ca_small.npz", "ca_small_stored.npz"}) {
    const RunResult r = run("score " + model + " --data '" + data(archive) + "'");
    EXPECT_EQ(r.code, 0) << archive << r.err;
    EXPECT_EQ(r.out, jsonl.out) << archive;
  }
  const RunResult predict = run("predict " + model + " --data '" + data("ca_small.jsonl") + "'");
  ASSERT_EQ(predict.code, 0) << predict.err;
  EXPECT_TRUE(contains(predict.err, "accuracy=1 (6/6 rows)")) << predict.err;
  const RunResult no_target =
      run("predict " + model + " --data '" + data("ca_small_no_target.npz") + "'");
  EXPECT_EQ(no_target.code, 0) << no_target.err;
  EXPECT_EQ(lines_of(no_target.out), lines_of(predict.out));
  EXPECT_FALSE(contains(no_target.err, "accuracy"));
  EXPECT_EQ(run("score " + model + " --data '" + data("ca_small_no_target.npz") + "'").code, 2);
  const RunResult fit = run("fit --family ca --data '" + data("ca_small.npz") +
                            "' --out model.json --max-its 2");
  EXPECT_EQ(fit.code, 0) << fit.err;
  EXPECT_TRUE(contains(fit.out, "S=6, N=4, T=6")) << fit.out;
  // A responsibility model cannot read chained rows, and the message says why.
  const RunResult wrong = run("score --model '" + data("ra_model.json") + "' --data '" +
                              data("ca_small.jsonl") + "'");
  EXPECT_EQ(wrong.code, 2);
  EXPECT_TRUE(contains(wrong.err, "unknown field 'keys'")) << wrong.err;
}

/// Every bad chained data file exits 2 naming the file, the line (or array index) and the field,
/// and leaves no model file.
TEST_F(CliTest, ChainedBadDataFilesExitTwoNamingFileLineAndField) {
  const std::string good = R"({"keys":[0,1,2],"values":[3,4,5],"query":0,"target":1})"
                           "\n";
  struct Case {
    const char* name;
    std::string second_line;
    std::vector<std::string> fragments;
    std::string flags;
  };
  const std::vector<Case> cases{
      {"bad_id", R"({"keys":[0,"x",2],"values":[3,4,5],"query":0,"target":1})",
       {"line 2", "keys[1]", "integer id"}, ""},
      {"fractional", R"({"keys":[0,1,2],"values":[3,4.5,5],"query":0,"target":1})",
       {"line 2", "values[1]", "4.5"}, ""},
      {"negative", R"({"keys":[0,1,2],"values":[3,4,5],"query":-1,"target":1})",
       {"line 2", "query", "out-of-range ID -1"}, ""},
      {"bool_id", R"({"keys":[0,1,2],"values":[3,4,5],"query":0,"target":true})",
       {"line 2", "target", "bool"}, ""},
      {"missing_field", R"({"keys":[0,1,2],"query":0,"target":1})",
       {"line 2", "missing field 'values'"}, ""},
      {"missing_target", R"({"keys":[0,1,2],"values":[3,4,5],"query":0})",
       {"line 2", "missing field 'target'"}, ""},
      {"ragged", R"({"keys":[0,1],"values":[3,4],"query":0,"target":1})",
       {"line 2", "keys has 2 entries", "expected N = 3 (from line 1)"}, ""},
      {"mismatched", R"({"keys":[0,1,2],"values":[3,4],"query":0,"target":1})",
       {"line 2", "values has 2 entries but keys has 3"}, ""},
      {"query_array", R"({"keys":[0,1,2],"values":[3,4,5],"query":[0],"target":1})",
       {"line 2", "query", "an array"}, ""},
      {"unknown_field", R"({"keys":[0,1,2],"values":[3,4,5],"query":0,"target":1,"context":[0]})",
       {"line 2", "unknown field 'context'", "expected keys, values, query, target"}, ""},
      {"target_range", R"({"keys":[0,1,2],"values":[3,4,5],"query":0,"target":7})",
       {"line 2", "target", "out-of-range ID 7", "T = 5 (from --targets)"}, " --targets 5"},
      {"symbol_range", R"({"keys":[0,1,9],"values":[3,4,5],"query":0,"target":1})",
       {"line 2", "keys[2]", "out-of-range ID 9", "S = 8 (from --symbols)"}, " --symbols 8"},
  };
  for (const Case& c : cases) {
    const std::string file = std::string(c.name) + ".jsonl";
    write(file, good + c.second_line + "\n");
    const RunResult r =
        run("fit --family ca --data " + file + " --out model.json --max-its 1" + c.flags);
    EXPECT_EQ(r.code, 2) << c.name << ": " << r.err;
    EXPECT_TRUE(contains(r.err, file + ": line 2: ")) << c.name << ": " << r.err;
    for (const std::string& f : c.fragments)
      EXPECT_TRUE(contains(r.err, f)) << c.name << ": " << r.err;
    EXPECT_FALSE(fs::exists(path("model.json"))) << c.name;
  }
  // The same checks in --valid files, and in score/predict against the model's S and T.
  write("train.jsonl", good);
  write("valid.jsonl", good + R"({"keys":[0,1,2,3],"values":[3,4,5,6],"query":0,"target":1})" "\n");
  const RunResult valid =
      run("fit --family ca --data train.jsonl --valid valid.jsonl --out model.json");
  EXPECT_EQ(valid.code, 2);
  EXPECT_TRUE(contains(valid.err, "valid.jsonl: line 2: keys has 4 entries")) << valid.err;
  write("big.jsonl", good + R"({"keys":[0,1,2],"values":[3,4,6],"query":0,"target":1})" "\n");
  const RunResult big = run("score --model '" + data("ca_model.json") + "' --data big.jsonl");
  EXPECT_EQ(big.code, 2);
  for (const char* f : {"big.jsonl: line 2: values[2]", "out-of-range ID 6", "S = 6 (from the model)"})
    EXPECT_TRUE(contains(big.err, f)) << big.err;
  // .npz archives: the array element or the mismatched shape is named.
  const std::vector<std::pair<std::string, std::vector<std::string>>> archives{
      {"ca_bool_ids.npz", {"ca_bool_ids.npz: values", "bool"}},
      {"ca_fractional_ids.npz", {"ca_fractional_ids.npz: keys[2, 1]", "1.5"}},
      {"ca_mismatched.npz", {"ca_mismatched.npz: values", "(6, 3)", "(6, 4)"}},
  };
  for (const auto& [archive, fragments] : archives) {
    const RunResult r =
        run("fit --family ca --data '" + data(archive) + "' --out model.json --max-its 1");
    EXPECT_EQ(r.code, 2) << archive;
    for (const std::string& f : fragments) EXPECT_TRUE(contains(r.err, f)) << r.err;
  }
  EXPECT_FALSE(fs::exists(path("model.json")));
}

/// Impossible evidence (SPEC.md §3.4's reference case) scores -inf; in a fit it exits 2 naming the
/// lines; a failed chained fit never touches an existing model.
TEST_F(CliTest, ChainedImpossibleEvidenceAndFailedFits) {
  write("impossible_model.json",
        R"({"format":"attnmix-model","schema_version":1,"family":"chained_attention",
    "params":{"keys":[[[1.0,0.0],[0.0,1.0]]],"emission":[[1.0,0.0],[1.0,0.0]],"sigma2":0.1}})");
  write("row.jsonl", R"({"keys":[0,1],"values":[0,1],"query":0,"target":1})"
                     "\n");
  const RunResult score = run("score --model impossible_model.json --data row.jsonl");
  EXPECT_EQ(score.code, 0) << score.err;
  EXPECT_EQ(score.out, "rows=1 total=-inf mean=-inf\n");

  write_transitive("train.jsonl", 300, 5);
  const RunResult fit = run(
      "fit --family ca --data train.jsonl --out model.json --emission-smoothing 0 --init-p 0.01");
  EXPECT_EQ(fit.code, 2) << fit.out;
  EXPECT_TRUE(contains(fit.err, "train.jsonl: lines ")) << fit.err;
  EXPECT_TRUE(contains(fit.err, "impossible evidence")) << fit.err;
  EXPECT_FALSE(fs::exists(path("model.json")));

  const std::string original = read_text(data("ca_model.json"));
  write("model.json", original);
  write("bad.jsonl", R"({"keys":[0,1],"values":[0,1],"query":0.5,"target":1})"
                     "\n");
  EXPECT_EQ(run("fit --family ca --data bad.jsonl --out model.json").code, 2);
  EXPECT_EQ(run("fit --family ca --data train.jsonl --out model.json --emission-smoothing 0 "
                "--init-p 0.01")
                .code,
            2);
  EXPECT_EQ(run("fit --family ca --data train.jsonl --out model.json --max-its 1 --strict").code,
            3);
  EXPECT_EQ(read_text(path("model.json")), original);
  EXPECT_EQ(listing(), (std::vector<std::string>{"bad.jsonl", "impossible_model.json",
                                                 "model.json", "row.jsonl", "train.jsonl"}));
}

TEST_F(CliTest, DemoFitsEachMechanismAndBeatsItsBaseline) {
  const RunResult r = run("demo");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "Iteration 1: ln[p_mat(Data|Model)]=")) << r.out;
  EXPECT_TRUE(contains(r.out, "keys recovered           16/16")) << r.out;
  EXPECT_TRUE(contains(r.out, "targets recovered        16/16")) << r.out;
  double acc = 0.0, baseline = 0.0;
  const size_t a = r.out.find("test accuracy");
  const size_t b = r.out.find("position-only baseline");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  ASSERT_EQ(std::sscanf(r.out.c_str() + a, "test accuracy %lf", &acc), 1);
  ASSERT_EQ(std::sscanf(r.out.c_str() + b, "position-only baseline %lf", &baseline), 1);
  EXPECT_GT(acc, 85.0);
  EXPECT_GT(acc, 3.0 * baseline);
  // Chained attention: two hops solve transitive lookup, one hop cannot.
  double one_hop = -1.0, two_hops = -1.0;
  const size_t one = r.out.find("one hop  (L = 1)");
  const size_t two = r.out.find("two hops (L = 2)");
  ASSERT_NE(one, std::string::npos) << r.out;
  ASSERT_NE(two, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + one, "one hop  (L = 1) %lf", &one_hop), 1);
  ASSERT_EQ(std::sscanf(r.out.c_str() + two, "two hops (L = 2) %lf", &two_hops), 1);
  EXPECT_GT(two_hops, 0.8);
  EXPECT_LT(one_hop, 0.2);
  EXPECT_TRUE(contains(r.out, "Why one hop fails")) << r.out;
  // Assignment-tree attention: frequencies, the spanning tree, dense against tree-sparse attention.
  EXPECT_TRUE(contains(r.out, "Assignment-tree attention")) << r.out;
  EXPECT_TRUE(contains(r.out, "key column sums            exactly 1")) << r.out;
  EXPECT_TRUE(contains(r.out, "spanning tree              30 edges = 16 + 15 - 1")) << r.out;
  EXPECT_TRUE(contains(r.out, "dense attention        MSE ")) << r.out;
  EXPECT_TRUE(contains(r.out, "tree-sparse attention  MSE ")) << r.out;
  EXPECT_TRUE(contains(r.out, "attnmix assign-tree")) << r.out;
}

// ----- assign-tree (SPEC.md §8.2)
// -------------------------------------------------------------------------------------

/// The keys of results.json in the order of SPEC.md §8.2 step 6.
const std::vector<std::string> kAssignTreeKeys = {
    "seed",
    "shape",
    "tau",
    "prediction_1_rmse_slope_predicted",
    "prediction_1_rmse_slope_observed",
    "prediction_1_rmse",
    "prediction_2_union_edges",
    "prediction_3_frequency_corr_alpha0",
    "prediction_3_frequency_corr_alpha1",
    "transport_max_row_marginal_error",
    "transport_max_key_marginal_error",
    "tree_edges_expected",
    "tree_edges_observed",
    "dense_retrieval_mse",
    "tree_sparse_retrieval_mse",
    "tree_edges_K16_mean",
    "raw_union_edges_K16_mean",
    "transport_max_key_marginal_error_expected",
    "prediction_3_tree_zero_frequency_edges",
    "retrieval_zero_frequency_tree_edges_total",
    "retrieval_repaired_query_rows_total",
    "retrieval_trials_with_repair",
};

TEST_F(CliTest, AssignTreeWritesResultsInSpecOrderAndPrintsVerdicts) {
  const RunResult r = run("assign-tree");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(listing(), std::vector<std::string>{"results.json"});  // no temporary file left
  const std::string text = read_text(path("results.json"));
  const auto doc = nlohmann::ordered_json::parse(text);
  std::vector<std::string> keys;
  for (const auto& item : doc.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, kAssignTreeKeys);
  EXPECT_EQ(doc["seed"], 1234);
  EXPECT_EQ(doc["shape"], nlohmann::json::parse("[16, 15]"));
  EXPECT_EQ(doc["tree_edges_observed"], 30);
  EXPECT_EQ(text, doc.dump(2) + "\n");  // 2-space indentation
  EXPECT_EQ(r.out.rfind(text, 0), 0u) << r.out;  // the document is printed first
  // A verdict for each prediction, and the retrieval numbers reported without one.
  for (const char* verdict :
       {"Prediction 1, Monte-Carlo error O(K^-1/2): holds", "Prediction 2, union occupancy: holds",
        "Prediction 3, the bias aligns attention with frequency: holds",
        "Transport check, T = freq / 16: holds", "key (column) marginals are exact",
        "Tree edges: holds", "Retrieval, dense vs tree-sparse attention (reported, no prediction)",
        "repaired query rows", "zero-frequency tree edges"})
    EXPECT_TRUE(contains(r.out, verdict)) << verdict << "\n" << r.out;
  EXPECT_FALSE(contains(r.out, "DOES NOT HOLD")) << r.out;
  EXPECT_TRUE(contains(r.err, "% done")) << r.err;  // progress on stderr

  // --out, --seed and --threads: the same seed gives the same document whatever the thread count.
  fs::create_directories(path("sub"));
  const RunResult again = run("assign-tree --out sub/r.json --seed 1234 --threads 1");
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(read_text(path("sub/r.json")), text);
}

TEST_F(CliTest, AssignTreeBadOutExitsTwoAndWritesNothing) {
  const RunResult missing = run("assign-tree --out no/such/dir/results.json");
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.err, "no/such/dir/results.json")) << missing.err;
  EXPECT_TRUE(contains(missing.err, "No such file or directory")) << missing.err;
  EXPECT_TRUE(missing.out.empty()) << missing.out;
  fs::create_directories(path("adir"));
  const RunResult directory = run("assign-tree --out adir");
  EXPECT_EQ(directory.code, 2);
  EXPECT_TRUE(contains(directory.err, "it is a directory")) << directory.err;
  EXPECT_EQ(listing(), std::vector<std::string>{"adir"});
  EXPECT_TRUE(fs::is_empty(path("adir")));
  EXPECT_EQ(run("assign-tree --threads -1").code, 1);
  EXPECT_EQ(run("assign-tree --seed many").code, 1);
  EXPECT_EQ(listing(), std::vector<std::string>{"adir"});
}

}  // namespace
}  // namespace attnmix
