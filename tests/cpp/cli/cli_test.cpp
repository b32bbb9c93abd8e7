// SPDX-License-Identifier: Apache-2.0
// End-to-end tests of the attnmix command-line tool (docs/model-format.md): the binary (ATTNMIX_CLI) runs
// in a fresh temporary directory per test; fixtures come from ATTNMIX_TEST_DATA_DIR (see
// tests/data/README.md).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/transitive_task.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/io/model_file.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/optimize.hpp"
#include "testing/cli_fixture.hpp"

namespace attnmix {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;
using testing::contains;
using testing::lines_of;
using testing::read_text;

/// Each test runs the CLI inside its own empty directory (testing/cli_fixture.hpp).
class CliTest : public testing::CliFixture {
 protected:
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
  /// Writes n rows of a synonym task as variational JSON Lines: 6 concepts, symbols 2c and 2c + 1
  /// name concept c; each context holds 4 distinct concepts written with random synonyms; the query
  /// names one of them with synonym `query_synonym`; the target is a fixed permutation of it.
  void write_synonyms(const std::string& name, int n, uint64_t seed, int64_t query_synonym) const {
    Rng rng(seed);
    const std::vector<int64_t> target_of{3, 1, 4, 0, 5, 2};
    std::ofstream out(dir_ / name);
    for (int r = 0; r < n; ++r) {
      const std::vector<int64_t> concepts = rng.sample_without_replacement(6, 4);
      std::vector<int64_t> context;
      for (int64_t c : concepts)
        context.push_back(2 * c + static_cast<int64_t>(rng.uniform_int(2)));
      const int64_t c = concepts[rng.uniform_int(4)];
      nlohmann::json row;
      row["context"] = context;
      row["query"] = 2 * c + query_synonym;
      row["target"] = target_of[static_cast<size_t>(c)];
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
  // Flags of one family are usage errors with the others.
  for (const char* args :
       {"--family ra --hops 2", "--family ca --query-dim 3", "--family chained --estimate-sigma2",
        "--family ca --min-sigma2 0.1", "--family ra --lr 0.1", "--family ca --embed-dim 4",
        "--family ra --mc 3", "--family ca --prior-strength 0.5", "--family vea --hops 2",
        "--family vea --query-dim 3", "--family vea --estimate-sigma2",
        "--family vea --anneal-iters 5", "--family vmha --query-dim 3",
        "--family vmha --min-sigma2 0.1", "--family vmha --hops 2",
        "--family variational --text x.txt", "--family ra --anneal-iters 5"}) {
    const RunResult r = run(std::string("fit ") + args + " --data x.jsonl --out m.json");
    EXPECT_EQ(r.code, 1) << args;
    EXPECT_TRUE(contains(r.err, "applies only to --family")) << args << ": " << r.err;
  }
  const RunResult shared = run("fit --family ca --lr 0.1 --data x.jsonl --out m.json");
  EXPECT_TRUE(contains(shared.err,
                       "--lr applies only to --family variational or "
                       "variational-multihop, not to --family chained"))
      << shared.err;
  const RunResult anneal = run("fit --family vea --anneal-iters 5 --data x.jsonl --out m.json");
  EXPECT_TRUE(contains(anneal.err,
                       "--anneal-iters applies only to --family variational-multihop, "
                       "not to --family variational"))
      << anneal.err;
  // Invalid values of the variational flags.
  for (const char* args : {"--mc 0", "--mc 1.5", "--lr 0", "--lr -1", "--embed-dim 0",
                           "--prior-strength -1", "--anneal-iters 0"}) {
    const RunResult r =
        run(std::string("fit --family vmha ") + args + " --data x.jsonl --out m.json");
    EXPECT_EQ(r.code, 1) << args << ": " << r.err;
  }
  // --init replaces the random initialisation, so its flags cannot come with it.
  for (const char* flag : {"--seed 3", "--init-p 0.5"}) {
    const RunResult r =
        run(std::string("fit --family vea --init a.json ") + flag + " --data x.jsonl --out m.json");
    EXPECT_EQ(r.code, 1) << flag;
    EXPECT_TRUE(contains(r.err, "which --init replaces")) << r.err;
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
  // The log loss predict reports, recomputed from the printed distributions and the rows' targets.
  const std::vector<std::string> test_rows = lines_of(read_text(path("test.jsonl")));
  const std::vector<std::string> distributions = lines_of(proba.out);
  ASSERT_EQ(distributions.size(), test_rows.size());
  double loss = 0.0;
  for (size_t row = 0; row < test_rows.size(); ++row) {
    std::istringstream in(distributions[row]);
    std::vector<double> p;
    for (double x = 0.0; in >> x;) p.push_back(x);
    ASSERT_EQ(p.size(), 4U);
    double row_sum = 0.0;
    for (double x : p) row_sum += x;
    EXPECT_NEAR(row_sum, 1.0, 1e-9);
    loss -= std::log(p.at(nlohmann::json::parse(test_rows[row]).at("target").get<size_t>()));
  }
  loss /= static_cast<double>(test_rows.size());
  const size_t at = predict.err.find("log_loss=");
  ASSERT_NE(at, std::string::npos) << predict.err;
  double log_loss = -1.0, perplexity = -1.0;
  ASSERT_EQ(std::sscanf(predict.err.c_str() + at, "log_loss=%lf perplexity=%lf", &log_loss, &perplexity), 2)
      << predict.err;
  EXPECT_NEAR(log_loss, loss, 1e-12 * loss);  // the printed probabilities carry 17 significant digits
  EXPECT_NEAR(perplexity, std::exp(loss), 1e-12 * std::exp(loss));
  EXPECT_LT(perplexity, 4.0);  // better than guessing among the 4 targets
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

/// --precision mixed fits the model float64 fits to float rounding (log-likelihood per row printed alike to about
/// five digits), says so in the summary, and applies to responsibility and variational attention only.
TEST_F(CliTest, MixedPrecisionFitsTheFloat64Model) {
  sample_rows("train.jsonl", 400, 6);
  const RunResult exact = run("fit --data train.jsonl --out exact.json --max-its 6 --delta none");
  ASSERT_EQ(exact.code, 0) << exact.err;
  const RunResult mixed =
      run("fit --data train.jsonl --out mixed.json --max-its 6 --delta none --precision mixed --threads 2");
  ASSERT_EQ(mixed.code, 0) << mixed.err;
  EXPECT_TRUE(contains(mixed.out, "precision       mixed (float distances")) << mixed.out;
  EXPECT_FALSE(contains(exact.out, "precision ")) << exact.out;
  const auto per_row = [](const std::string& out) {
    const size_t at = out.find("log-likelihood  ");
    return at == std::string::npos ? std::nan("") : std::stod(out.substr(at + 16));
  };
  EXPECT_NEAR(per_row(mixed.out), per_row(exact.out), 1e-4 * std::abs(per_row(exact.out))) << mixed.out;
  const AnyDistribution exact_model = load_model(path("exact.json"));
  const AnyDistribution mixed_model = load_model(path("mixed.json"));
  const auto* a = exact_model.get_if<ResponsibilityAttention>();
  const auto* b = mixed_model.get_if<ResponsibilityAttention>();
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_LT((a->params().key_means - b->params().key_means).cwiseAbs().maxCoeff(), 1e-4);

  const RunResult bad = run("fit --data train.jsonl --out m.json --precision float32");
  EXPECT_EQ(bad.code, 1) << bad.err;
  EXPECT_TRUE(contains(bad.err, "--precision")) << bad.err;
  write_transitive("chained.jsonl", 50, 3);
  const RunResult chained = run("fit --family ca --data chained.jsonl --out m.json --precision mixed");
  EXPECT_EQ(chained.code, 1) << chained.err;
  EXPECT_TRUE(contains(chained.err, "--precision")) << chained.err;
  EXPECT_FALSE(fs::exists(path("m.json")));
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
  // A pipe (what <(zcat rows.jsonl.gz) gives) and a device are refused before anything is read: the rows are read
  // more than once. stat does not open the pipe, so nothing blocks.
  ASSERT_EQ(mkfifo(path("pipe.jsonl").c_str(), 0600), 0);
  for (const std::string& source : {path("pipe.jsonl"), std::string("/dev/null")}) {
    const RunResult stream = run("fit --data '" + source + "' --out model.json");
    EXPECT_EQ(stream.code, 2) << source;
    EXPECT_TRUE(contains(stream.err, source + ": cannot read the data file: it is not a regular file")) << stream.err;
  }
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
/// (docs/mechanisms.md#responsibility-attention).
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

/// Impossible evidence (the reference case of docs/mechanisms.md#chained-attention) scores -inf; in a fit it exits 2
/// naming the lines; a failed chained fit never touches an existing model.
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

// ----- variational embedding attention
// ------------------------------------------------------------------------------

/// Parses "rows=N total=X mean=Y".
void parse_score(const std::string& text, int& n, double& total) {
  double mean = 0.0;
  ASSERT_EQ(std::sscanf(text.c_str(), "rows=%d total=%lf mean=%lf", &n, &total, &mean), 3) << text;
}

/// Every --proba line has `count` probabilities summing to 1.
void expect_proba_rows(const std::string& text, int count) {
  for (const std::string& line : lines_of(text)) {
    std::istringstream in(line);
    double p = 0.0, row_sum = 0.0;
    int seen = 0;
    while (in >> p) {
      row_sum += p;
      ++seen;
    }
    EXPECT_EQ(seen, count) << line;
    EXPECT_NEAR(row_sum, 1.0, 1e-9) << line;
  }
}

/// sample → fit → score → predict → sample → fit again with variational embedding attention; the
/// model file reads back bit-identically (loading and saving it again gives the same text).
TEST_F(CliTest, VariationalFitScorePredictSampleRoundTrip) {
  const std::string fixture = "--model '" + data("vea_model.json") + "'";
  const RunResult train = run("sample " + fixture + " -n 400 --seed 1");
  ASSERT_EQ(train.code, 0) << train.err;
  write("train.jsonl", train.out);
  const std::vector<std::string> rows = lines_of(train.out);
  ASSERT_EQ(rows.size(), 400U);
  const nlohmann::json first = nlohmann::json::parse(rows[0]);
  EXPECT_EQ(first["context"].size(), 3U);  // the fixture's N
  EXPECT_TRUE(first["query"].is_number_integer());
  EXPECT_TRUE(first["target"].is_number_integer());
  EXPECT_EQ(train.out, run("sample " + fixture + " -n 400 --seed 1").out);
  EXPECT_NE(train.out, run("sample " + fixture + " -n 400 --seed 2").out);

  const RunResult fit =
      run("fit --family variational --data train.jsonl --out model.json --max-its 15 --threads 2");
  ASSERT_EQ(fit.code, 0) << fit.err;
  int progress = 0;
  for (const std::string& line : lines_of(fit.out))
    if (line.rfind("Iteration ", 0) == 0) {
      ++progress;
      EXPECT_TRUE(contains(line, "ln[p_mat(Data|Model)]=")) << line;
      EXPECT_EQ(line.substr(line.size() - 3), " s)") << line;
    }
  EXPECT_EQ(progress, 15);  // --delta defaults to none: every iteration runs
  for (const char* f : {"Fitting variational embedding attention by EM to 400 rows of train.jsonl",
                        "(S=6, N=3, D=8, T=3)",
                        "S=6 symbols, N=3 context positions, D=8 embedding dims, T=3 targets",
                        "--delta none", "model written   model.json"})
    EXPECT_TRUE(contains(fit.out, f)) << f << "\n" << fit.out;
  const AnyDistribution model = load_model(path("model.json"));
  const auto* vea = model.get_if<VariationalEmbeddingAttention>();
  ASSERT_NE(vea, nullptr);
  EXPECT_EQ(vea->embed_dim(), 8);  // the CLI's default D
  EXPECT_EQ(vea->sigma2(), VariationalEmbeddingAttentionEstimatorOptions{}.sigma2);
  EXPECT_GE(vea->optimizer_state().iteration, 0);
  EXPECT_LE(vea->optimizer_state().iteration, 15);
  save_model(model, path("again.json"));
  EXPECT_EQ(read_text(path("again.json")), read_text(path("model.json")));

  const RunResult test = run("sample " + fixture + " -n 100 --seed 9");
  write("test.jsonl", test.out);
  const RunResult score = run("score --model model.json --data test.jsonl");
  ASSERT_EQ(score.code, 0) << score.err;
  int n = 0;
  double total = 0.0;
  parse_score(score.out, n, total);
  EXPECT_EQ(n, 100);
  EXPECT_TRUE(std::isfinite(total));
  const RunResult per_row = run("score --model model.json --data test.jsonl --per-row");
  ASSERT_EQ(per_row.code, 0) << per_row.err;
  double sum = 0.0;
  for (const std::string& v : lines_of(per_row.out)) sum += std::stod(v);
  EXPECT_EQ(lines_of(per_row.out).size(), 100U);
  EXPECT_NEAR(sum, total, 1e-9 * std::fabs(total));
  EXPECT_EQ(per_row.err, score.out);

  const RunResult predict = run("predict --model model.json --data test.jsonl");
  ASSERT_EQ(predict.code, 0) << predict.err;
  ASSERT_EQ(lines_of(predict.out).size(), 100U);
  for (const std::string& line : lines_of(predict.out)) {
    int t = -1;
    double p = -1.0;
    ASSERT_EQ(std::sscanf(line.c_str(), "%d\t%lf", &t, &p), 2) << line;
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 3);
    EXPECT_GE(p, 1.0 / 3.0);
  }
  double accuracy = -1.0;
  ASSERT_EQ(std::sscanf(predict.err.c_str(), "accuracy=%lf", &accuracy), 1) << predict.err;
  EXPECT_GE(accuracy, 0.0);
  const RunResult proba = run("predict --model model.json --data test.jsonl --proba");
  ASSERT_EQ(proba.code, 0) << proba.err;
  EXPECT_EQ(lines_of(proba.out).size(), 100U);
  expect_proba_rows(proba.out, 3);

  // sample: N is the model's (a different --context-length is a usage error).
  const RunResult sample = run("sample --model model.json -n 30 --seed 3");
  ASSERT_EQ(sample.code, 0) << sample.err;
  EXPECT_EQ(lines_of(sample.out).size(), 30U);
  EXPECT_EQ(sample.out, run("sample --model model.json -n 30 --seed 3 --context-length 3").out);
  const RunResult wrong_n = run("sample --model model.json -n 30 --seed 3 --context-length 4");
  EXPECT_EQ(wrong_n.code, 1);
  EXPECT_TRUE(contains(wrong_n.err, "N = 3")) << wrong_n.err;
  write("sampled.jsonl", sample.out);
  const RunResult refit =
      run("fit --family vea --data sampled.jsonl --valid test.jsonl --out "
          "refit.json --max-its 3 --symbols 6 --targets 3 --embed-dim 2 "
          "--lr 0.1 --mc 2 --prior-strength 0.5 --sigma2 0.25 "
          "--emission-smoothing 0.01 --seed 4");
  ASSERT_EQ(refit.code, 0) << refit.err;
  EXPECT_TRUE(contains(refit.out, "ln[p_mat(Valid Data|Model)]=")) << refit.out;
  EXPECT_TRUE(contains(refit.out, "on 100 rows of test.jsonl")) << refit.out;
  const AnyDistribution refitted = load_model(path("refit.json"));
  EXPECT_EQ(refitted.get_if<VariationalEmbeddingAttention>()->embed_dim(), 2);
  EXPECT_EQ(refitted.get_if<VariationalEmbeddingAttention>()->sigma2(), 0.25);
  EXPECT_EQ(refitted.get_if<VariationalEmbeddingAttention>()->optimizer_state().seed, 4U);
}

/// The same variational rows as JSONL, as a deflated int64 .npz and as a stored int32/float64 .npz
/// score identically; invalid archives exit 2 naming the array (element).
TEST_F(CliTest, VariationalNpzArchivesMatchJsonLines) {
  const std::string model = "--model '" + data("vea_model.json") + "'";
  const RunResult jsonl = run("score " + model + " --data '" + data("vea_small.jsonl") + "'");
  ASSERT_EQ(jsonl.code, 0) << jsonl.err;
  EXPECT_TRUE(contains(jsonl.out, "rows=6 ")) << jsonl.out;
  for (const char* archive : {"vea_small.npz", "vea_small_stored.npz"}) {
    const RunResult r = run("score " + model + " --data '" + data(archive) + "'");
    EXPECT_EQ(r.code, 0) << archive << r.err;
    EXPECT_EQ(r.out, jsonl.out) << archive;
  }
  const RunResult predict = run("predict " + model + " --data '" + data("vea_small.jsonl") + "'");
  ASSERT_EQ(predict.code, 0) << predict.err;
  EXPECT_TRUE(contains(predict.err, "accuracy=1 (6/6 rows)")) << predict.err;
  const RunResult no_target =
      run("predict " + model + " --data '" + data("vea_small_no_target.npz") + "'");
  EXPECT_EQ(no_target.code, 0) << no_target.err;
  EXPECT_EQ(lines_of(no_target.out), lines_of(predict.out));
  EXPECT_FALSE(contains(no_target.err, "accuracy"));
  EXPECT_EQ(run("score " + model + " --data '" + data("vea_small_no_target.npz") + "'").code, 2);
  const std::vector<std::pair<std::string, std::vector<std::string>>> archives{
      {"vea_bool_ids.npz", {"vea_bool_ids.npz: context", "bool"}},
      {"vea_fractional_ids.npz", {"vea_fractional_ids.npz: query[3]", "1.5"}},
      {"vea_vector_query.npz", {"vea_vector_query.npz: query", "1-D", "(6, 6)"}},
  };
  for (const auto& [archive, fragments] : archives) {
    const RunResult r =
        run("fit --family vea --data '" + data(archive) + "' --out model.json --max-its 1");
    EXPECT_EQ(r.code, 2) << archive;
    for (const std::string& f : fragments) EXPECT_TRUE(contains(r.err, f)) << r.err;
    EXPECT_EQ(run("score " + model + " --data '" + data(archive) + "'").code, 2) << archive;
  }
  const RunResult fit =
      run("fit --family vea --data '" + data("vea_small.npz") + "' --out model.json --max-its 2");
  EXPECT_EQ(fit.code, 0) << fit.err;
  EXPECT_TRUE(contains(fit.out, "S=6, N=3, D=8, T=3")) << fit.out;
  // Rows of another family's schema are refused with the reason.
  const RunResult ra_rows = run("score " + model + " --data '" + data("ra_small.jsonl") + "'");
  EXPECT_EQ(ra_rows.code, 2);
  EXPECT_TRUE(contains(ra_rows.err, "line 1: query: must be an integer id (got an array)"))
      << ra_rows.err;
}

/// Every bad variational data file exits 2 naming the file, the line and the field, and leaves no
/// model file; score and predict check ids against the model's S and T.
TEST_F(CliTest, VariationalBadDataFilesExitTwoNamingFileLineAndField) {
  const std::string good = R"({"context":[0,1,2],"query":3,"target":1})"
                           "\n";
  struct Case {
    const char* name;
    std::string second_line;
    std::vector<std::string> fragments;
    std::string flags;
  };
  const std::vector<Case> cases{
      {"bad_id", R"({"context":[0,"x",2],"query":3,"target":1})", {"context[1]", "integer id"}, ""},
      {"fractional", R"({"context":[0,1,2],"query":3.5,"target":1})", {"query", "3.5"}, ""},
      {"negative",
       R"({"context":[0,-1,2],"query":3,"target":1})",
       {"context[1]", "out-of-range ID -1"},
       ""},
      {"bool_id", R"({"context":[0,1,2],"query":3,"target":false})", {"target", "bool"}, ""},
      {"missing_query", R"({"context":[0,1,2],"target":1})", {"missing field 'query'"}, ""},
      {"missing_target", R"({"context":[0,1,2],"query":3})", {"missing field 'target'"}, ""},
      {"ragged",
       R"({"context":[0,1],"query":3,"target":1})",
       {"context has 2 entries", "expected N = 3 (from line 1)"},
       ""},
      {"empty_context",
       R"({"context":[],"query":3,"target":1})",
       {"context must be non-empty"},
       ""},
      {"vector_query",
       R"({"context":[0,1,2],"query":[0,0,0,1],"target":1})",
       {"query", "must be an integer id (got an array)"},
       ""},
      {"unknown_field",
       R"({"context":[0,1,2],"query":3,"target":1,"keys":[0]})",
       {"unknown field 'keys'", "expected context, query, target"},
       ""},
      {"symbol_range",
       R"({"context":[0,1,2],"query":7,"target":1})",
       {"query", "out-of-range ID 7", "S = 6 (from --symbols)"},
       " --symbols 6"},
      {"target_range",
       R"({"context":[0,1,2],"query":3,"target":4})",
       {"target", "out-of-range ID 4", "T = 3 (from --targets)"},
       " --targets 3"},
      {"context_length",
       R"({"context":[0,1,2],"query":3,"target":1})",
       {"context has 3 entries", "expected N = 4 (from --context-length)"},
       " --context-length 4"},
  };
  for (const Case& c : cases) {
    const std::string file = std::string(c.name) + ".jsonl";
    write(file, good + c.second_line + "\n");
    const RunResult r =
        run("fit --family vea --data " + file + " --out model.json --max-its 1" + c.flags);
    EXPECT_EQ(r.code, 2) << c.name << ": " << r.err;
    // The first line is already wrong for --context-length 4.
    const std::string line = c.flags == " --context-length 4" ? ": line 1: " : ": line 2: ";
    EXPECT_TRUE(contains(r.err, file + line)) << c.name << ": " << r.err;
    for (const std::string& f : c.fragments)
      EXPECT_TRUE(contains(r.err, f)) << c.name << ": " << r.err;
    EXPECT_FALSE(fs::exists(path("model.json"))) << c.name;
  }
  // Validation files, and score/predict against the model's dimensions.
  write("train.jsonl", good);
  write("valid.jsonl", good + R"({"context":[0,1,2,3],"query":3,"target":1})"
                              "\n");
  const RunResult valid =
      run("fit --family vea --data train.jsonl --valid valid.jsonl --out model.json");
  EXPECT_EQ(valid.code, 2);
  EXPECT_TRUE(contains(valid.err, "valid.jsonl: line 2: context has 4 entries")) << valid.err;
  const std::string model = "--model '" + data("vea_model.json") + "'";
  write("big.jsonl", good + R"({"context":[0,1,6],"query":3,"target":1})"
                            "\n");
  const RunResult big = run("score " + model + " --data big.jsonl");
  EXPECT_EQ(big.code, 2);
  for (const char* f :
       {"big.jsonl: line 2: context[2]", "out-of-range ID 6", "S = 6 (from the model)"})
    EXPECT_TRUE(contains(big.err, f)) << big.err;
  write("big_target.jsonl", R"({"context":[0,1,2],"query":3,"target":3})"
                            "\n");
  const RunResult t = run("predict " + model + " --data big_target.jsonl");
  EXPECT_EQ(t.code, 2);
  EXPECT_TRUE(contains(t.err, "big_target.jsonl: line 1: target: out-of-range ID 3")) << t.err;
  write("long.jsonl", R"({"context":[0,1,2,3],"query":3,"target":1})"
                      "\n");
  const RunResult wide = run("score " + model + " --data long.jsonl");
  EXPECT_EQ(wide.code, 2);
  EXPECT_TRUE(contains(wide.err, "expected N = 3 (from the model)")) << wide.err;
  EXPECT_FALSE(fs::exists(path("model.json")));
}

/// Impossible evidence under a variational model: scoring gives -inf, a fit from it exits 2 naming
/// the line, and an existing output stays untouched.
TEST_F(CliTest, VariationalImpossibleEvidence) {
  // Target 1 is impossible for every symbol: B[:, 1] = 0.
  const std::string state =
      R"("optimizer_state":{"schema_version":1,"algorithm":"adam","family":"variational_embedding_attention",)"
      R"("mean":[[0.5],[-0.5]],"log_var":[[-1.0],[-1.0]],"mean_first_moment":[[0.0],[0.0]],)"
      R"("mean_second_moment":[[0.0],[0.0]],"log_var_first_moment":[[0.0],[0.0]],)"
      R"("log_var_second_moment":[[0.0],[0.0]],"iteration":2,"seed":1})";
  write(
      "impossible.json",
      R"({"format":"attnmix-model","schema_version":1,"family":"variational_embedding_attention",)"
      R"("params":{"mean":[[0.5],[-0.5]],"log_var":[[-1.0],[-1.0]],"emission":[[1.0,0.0],[1.0,0.0]],)"
      R"("position_prior":[0.5,0.5],"sigma2":0.5},)" +
          state + "}");
  write("rows.jsonl", R"({"context":[0,1],"query":0,"target":0})"
                      "\n"
                      R"({"context":[0,1],"query":1,"target":1})"
                      "\n");
  const RunResult score = run("score --model impossible.json --data rows.jsonl --per-row");
  EXPECT_EQ(score.code, 0) << score.err;
  EXPECT_EQ(lines_of(score.out).back(), "-inf");
  write("model.json", "keep me");
  const RunResult fit =
      run("fit --family vea --init impossible.json --data rows.jsonl "
          "--out model.json --max-its 2 --emission-smoothing 0");
  EXPECT_EQ(fit.code, 2) << fit.out;
  EXPECT_TRUE(contains(fit.err, "rows.jsonl: line 2: impossible evidence")) << fit.err;
  EXPECT_EQ(read_text(path("model.json")), "keep me");
}

/// --precision mixed for variational embedding attention: the fit follows float64's to float rounding, and --init
/// continues it in mixed precision from its first step (30 + 30 iterations give the file of one 60-iteration run).
TEST_F(CliTest, VariationalMixedPrecisionFitsAndContinues) {
  write_synonyms("train.jsonl", 400, 5, 0);
  const std::string common = " --family vea --data train.jsonl --lr 0.02 --mc 4";
  const RunResult exact = run("fit --max-its 30 --seed 8 --out exact.json" + common);
  ASSERT_EQ(exact.code, 0) << exact.err;
  const RunResult a = run("fit --max-its 30 --seed 8 --out a.json --precision mixed" + common);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_TRUE(contains(a.out, "precision       mixed (float distances")) << a.out;
  const AnyDistribution exact_model = load_model(path("exact.json"));
  const AnyDistribution mixed_model = load_model(path("a.json"));
  const auto* e = exact_model.get_if<VariationalEmbeddingAttention>();
  const auto* m = mixed_model.get_if<VariationalEmbeddingAttention>();
  ASSERT_TRUE(e != nullptr && m != nullptr);
  EXPECT_LT((e->mean() - m->mean()).cwiseAbs().maxCoeff(), 1e-4);
  EXPECT_GT((e->mean() - m->mean()).cwiseAbs().maxCoeff(), 0.0);  // the gate really was float
  const RunResult c = run("fit --max-its 60 --seed 8 --out c.json --precision mixed" + common);
  ASSERT_EQ(c.code, 0) << c.err;
  const RunResult b = run("fit --init a.json --max-its 30 --out b.json --precision mixed" + common);
  ASSERT_EQ(b.code, 0) << b.err;
  for (const RunResult* r : {&a, &b, &c})
    ASSERT_TRUE(contains(r->out, "best model      the model after the last iteration")) << r->out;
  EXPECT_EQ(read_text(path("b.json")), read_text(path("c.json")));
}

/// --delta defaults to none for the variational families (a Monte-Carlo objective), but a given
/// --delta is honoured.
TEST_F(CliTest, VariationalDeltaDefaultsToNone) {
  write_synonyms("train.jsonl", 200, 3, 0);
  const RunResult all = run("fit --family vea --data train.jsonl --out a.json --max-its 6");
  ASSERT_EQ(all.code, 0) << all.err;
  EXPECT_TRUE(contains(all.out, "Iteration 6: ")) << all.out;
  EXPECT_TRUE(contains(all.out, "--delta none: no convergence test")) << all.out;
  const RunResult stop =
      run("fit --family vea --data train.jsonl --out b.json --max-its 6 --delta 1e9");
  ASSERT_EQ(stop.code, 0) << stop.err;
  EXPECT_TRUE(contains(stop.out, "Iteration 2: ")) << stop.out;
  EXPECT_FALSE(contains(stop.out, "Iteration 3: ")) << stop.out;
  EXPECT_TRUE(contains(stop.out, "converged")) << stop.out;
}

/// --init continues a variational model's Adam trajectory: 30 iterations, then 30 more from the
/// saved model, equal one run of 60 iterations bit for bit, and equal 30 library EM steps from the
/// saved model. The fit returns its best-scoring iterate, so the comparison is exact only when each
/// run's best iterate is its last: the data and step size are chosen so that the score keeps
/// rising, and the test checks that precondition first.
TEST_F(CliTest, InitContinuesTheAdamTrajectoryExactly) {
  write_synonyms("train.jsonl", 400, 5, 0);
  const std::string common = " --data train.jsonl --lr 0.02 --mc 4 --threads 2";
  const RunResult a = run("fit --family vea --max-its 30 --seed 8 --out a.json" + common);
  ASSERT_EQ(a.code, 0) << a.err;
  const RunResult c = run("fit --family vea --max-its 60 --seed 8 --out c.json" + common);
  ASSERT_EQ(c.code, 0) << c.err;
  const RunResult b = run("fit --family vea --init a.json --max-its 30 --out b.json" + common);
  ASSERT_EQ(b.code, 0) << b.err;
  // The precondition: each run returned its last iterate.
  for (const RunResult* r : {&a, &b, &c})
    ASSERT_TRUE(contains(r->out, "best model      the model after the last iteration")) << r->out;
  EXPECT_TRUE(contains(b.out,
                       "starting from the model in a.json (its Adam trajectory goes on after "
                       "step 30)"))
      << b.out;
  const AnyDistribution model_a = load_model(path("a.json"));
  const AnyDistribution model_b = load_model(path("b.json"));
  EXPECT_EQ(model_a.get_if<VariationalEmbeddingAttention>()->optimizer_state().iteration, 30);
  EXPECT_EQ(model_b.get_if<VariationalEmbeddingAttention>()->optimizer_state().iteration, 60);
  EXPECT_EQ(model_b.get_if<VariationalEmbeddingAttention>()->optimizer_state().seed, 8U);
  // Same parameters, moments, iteration and seed: the files are identical.
  EXPECT_EQ(read_text(path("b.json")), read_text(path("c.json")));

  // The library: 30 EM steps from a.json with the same estimator.
  std::vector<int64_t> contexts, queries, targets;
  for (const std::string& line : lines_of(read_text(path("train.jsonl")))) {
    const nlohmann::json row = nlohmann::json::parse(line);
    for (const auto& id : row["context"]) contexts.push_back(id.get<int64_t>());
    queries.push_back(row["query"].get<int64_t>());
    targets.push_back(row["target"].get<int64_t>());
  }
  const auto n = static_cast<Index>(queries.size());
  const VariationalEmbeddingAttentionEncoder encoder{12, 4, 6};
  const auto batch = encoder.encode(Eigen::Map<const IdMatrix>(contexts.data(), n, 4),
                                    Eigen::Map<const IdVector>(queries.data(), n),
                                    Eigen::Map<const IdVector>(targets.data(), n));
  VariationalEmbeddingAttentionEstimatorOptions options;
  options.lr = 0.02;
  options.mc = 4;
  options.seed = 8;
  const VariationalEmbeddingAttentionEstimator estimator(12, 4, 8, 6, options);
  VariationalEmbeddingAttention model = *model_a.get_if<VariationalEmbeddingAttention>();
  for (int i = 0; i < 30; ++i) model = em_step(model, batch, estimator, {}, ParallelOptions{});
  const auto& expected = *model_b.get_if<VariationalEmbeddingAttention>();
  EXPECT_TRUE(model.optimizer_state() == expected.optimizer_state());
  EXPECT_EQ(std::memcmp(model.emission().data(), expected.emission().data(),
                        sizeof(double) * static_cast<size_t>(model.emission().size())),
            0);
}

/// --init starts from the given model for every family: with --max-its 0 the model comes back
/// unchanged, and the stored hyperparameters (σ², L) are the model's unless given.
TEST_F(CliTest, InitStartsFromTheModelForEveryFamily) {
  struct Case {
    const char* family;
    const char* model;
    const char* rows;
  };
  for (const Case& c : {Case{"ra", "ra_model.json", "ra_small.jsonl"},
                        Case{"ca", "ca_model.json", "ca_small.jsonl"},
                        Case{"vea", "vea_model.json", "vea_small.jsonl"},
                        Case{"vmha", "vmha_model.json", "ca_small.npz"}}) {
    const RunResult r = run(std::string("fit --family ") + c.family + " --init '" + data(c.model) +
                            "' --data '" + data(c.rows) + "' --max-its 0 --out same.json");
    ASSERT_EQ(r.code, 0) << c.family << ": " << r.err;
    EXPECT_TRUE(contains(r.out, "started from    the model in")) << r.out;
    EXPECT_TRUE(contains(r.out, "best model      the --init model (--max-its 0)")) << r.out;
    EXPECT_EQ(read_text(path("same.json")),
              format_model_json(model_to_json(load_model(data(c.model)))))
        << c.family;
  }
  // The chained fixture has σ² = 0.25 and L = 2 (the defaults are 0.1 and 2): continuing keeps σ².
  const RunResult ca = run("fit --family ca --init '" + data("ca_model.json") + "' --data '" +
                           data("ca_small.jsonl") + "' --max-its 3 --out ca.json");
  ASSERT_EQ(ca.code, 0) << ca.err;
  EXPECT_EQ(load_model(path("ca.json")).get_if<ChainedAttention>()->sigma2(), 0.25);
  // A --sigma2 other than the model's contradicts it (CliSizesTest covers the message).
  const RunResult ca_sigma =
      run("fit --family ca --init '" + data("ca_model.json") + "' --data '" +
          data("ca_small.jsonl") + "' --max-its 3 --sigma2 0.5 --out ca2.json");
  EXPECT_EQ(ca_sigma.code, 2) << ca_sigma.err;
  EXPECT_FALSE(fs::exists(path("ca2.json")));
  // Continuing a fixture's trajectory: the iteration counter goes on from the file's.
  const RunResult vea = run("fit --family vea --init '" + data("vea_model.json") + "' --data '" +
                            data("vea_small.jsonl") + "' --max-its 4 --out vea.json");
  ASSERT_EQ(vea.code, 0) << vea.err;
  const AnyDistribution fitted_model = load_model(path("vea.json"));
  const auto* fitted = fitted_model.get_if<VariationalEmbeddingAttention>();
  ASSERT_NE(fitted, nullptr);
  EXPECT_GE(fitted->optimizer_state().iteration, 3);  // the fixture's state is at step 3
  EXPECT_EQ(fitted->optimizer_state().seed, 11U);
  EXPECT_EQ(fitted->embed_dim(), 2);
  const RunResult text = run("fit --init '" + data("ra_model.json") + "' --text '" +
                             data("ra_small.jsonl") + "' --max-its 1 --out text.json");
  EXPECT_EQ(text.code, 2);  // the corpus has more distinct characters than the model's S = 4
  EXPECT_TRUE(contains(text.err, "S = 4 (from the --init model")) << text.err;
}

/// A wrong --init model (family, dimensions, unreadable or tampered file) exits 2 naming the file,
/// and writes nothing.
TEST_F(CliTest, InitMismatchesExitTwoAndWriteNothing) {
  const std::string vea = data("vea_model.json");
  write("rows.jsonl", read_text(data("vea_small.jsonl")));
  struct Case {
    std::string args;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases{
      {"--family vmha --init '" + vea + "' --data '" + data("ca_small.jsonl") + "'",
       {"vea_model.json: --init holds a variational_embedding_attention model",
        "fits variational_multihop_attention models"}},
      {"--family ra --init '" + vea + "' --data '" + data("ra_small.jsonl") + "'",
       {"vea_model.json: --init holds a variational_embedding_attention model"}},
      {"--family vea --init '" + data("ca_model.json") + "' --data rows.jsonl",
       {"ca_model.json: --init holds a chained_attention model"}},
      {"--family vea --init '" + vea + "' --data rows.jsonl --symbols 8",
       {"--symbols 8 does not match the --init model", "(S = 6)"}},
      {"--family vea --init '" + vea + "' --data rows.jsonl --embed-dim 8",
       {"--embed-dim 8 does not match the --init model", "(D = 2)"}},
      {"--family vea --init '" + vea + "' --data '" + data("ra_small.jsonl") + "'",
       {"ra_small.jsonl: line 1: query: must be an integer id"}},
      {"--family ca --init '" + data("ca_model.json") + "' --hops 1 --data '" +
           data("ca_small.jsonl") + "'",
       {"--hops 1 does not match the --init model", "(L = 2)"}},
      {"--family vea --init no_such_model.json --data rows.jsonl", {"no_such_model.json"}},
      {"--family vea --init rows.jsonl --data rows.jsonl", {"rows.jsonl: not a valid JSON"}},
  };
  for (const Case& c : cases) {
    const RunResult r = run("fit " + c.args + " --out model.json --max-its 2");
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.err;
    for (const std::string& f : c.fragments)
      EXPECT_TRUE(contains(r.err, f)) << c.args << ": " << r.err;
    EXPECT_FALSE(fs::exists(path("model.json"))) << c.args;
  }
  // Rows beyond the --init model's S: the message says where S came from.
  write("wide.jsonl", R"({"context":[0,1,7],"query":3,"target":1})"
                      "\n");
  const RunResult wide =
      run("fit --family vea --init '" + vea + "' --data wide.jsonl --out model.json");
  EXPECT_EQ(wide.code, 2);
  for (const char* f :
       {"wide.jsonl: line 1: context[2]", "out-of-range ID 7", "S = 6 (from the --init model"})
    EXPECT_TRUE(contains(wide.err, f)) << wide.err;
  // A tampered state in the --init model names the field.
  nlohmann::json doc = nlohmann::json::parse(read_text(data("vea_model.json")));
  doc["optimizer_state"]["mean"][1][0] = 1.25;
  write("tampered.json", doc.dump());
  const RunResult tampered =
      run("fit --family vea --init tampered.json --data rows.jsonl --out model.json");
  EXPECT_EQ(tampered.code, 2);
  EXPECT_TRUE(contains(tampered.err, "tampered.json: optimizer_state.mean")) << tampered.err;
  EXPECT_FALSE(fs::exists(path("model.json")));
}

// ----- variational multi-hop attention
// ------------------------------------------------------------------------------

/// fit → score → predict → sample → fit again with variational multi-hop attention on chained
/// rows; the model file reads back bit-identically.
TEST_F(CliTest, VariationalMultiHopFitScorePredictSampleRoundTrip) {
  write_transitive("train.jsonl", 300, 21);
  write_transitive("test.jsonl", 100, 22);
  const RunResult fit =
      run("fit --family variational-multihop --data train.jsonl --out "
          "model.json --max-its 6 --mc 2 --anneal-iters 10 --threads 2");
  ASSERT_EQ(fit.code, 0) << fit.err;
  int progress = 0;
  for (const std::string& line : lines_of(fit.out))
    if (line.rfind("Iteration ", 0) == 0) ++progress;
  EXPECT_EQ(progress, 6);
  for (const char* f : {"Fitting variational multi-hop attention (2 hops) by EM to 300 rows",
                        "(S=30, N=10, D=8, T=30)", "--delta none", "model written   model.json"})
    EXPECT_TRUE(contains(fit.out, f)) << f << "\n" << fit.out;
  const AnyDistribution model = load_model(path("model.json"));
  const auto* vmha = model.get_if<VariationalMultiHopAttention>();
  ASSERT_NE(vmha, nullptr);
  EXPECT_EQ(vmha->n_symbols(), 30);
  EXPECT_EQ(vmha->sigma2(), VariationalMultiHopAttentionEstimatorOptions{}.sigma2);
  save_model(model, path("again.json"));
  EXPECT_EQ(read_text(path("again.json")), read_text(path("model.json")));

  const RunResult score = run("score --model model.json --data test.jsonl");
  ASSERT_EQ(score.code, 0) << score.err;
  int n = 0;
  double total = 0.0;
  parse_score(score.out, n, total);
  EXPECT_EQ(n, 100);
  EXPECT_TRUE(std::isfinite(total));
  const RunResult predict = run("predict --model model.json --data test.jsonl");
  ASSERT_EQ(predict.code, 0) << predict.err;
  EXPECT_EQ(lines_of(predict.out).size(), 100U);
  EXPECT_TRUE(contains(predict.err, "accuracy=")) << predict.err;
  const RunResult proba = run("predict --model model.json --data test.jsonl --proba");
  ASSERT_EQ(proba.code, 0) << proba.err;
  expect_proba_rows(proba.out, 30);

  // sample: --context-length sets N (default 6), the rows are chained-attention rows.
  const RunResult sample = run("sample --model model.json -n 25 --seed 5 --context-length 4");
  ASSERT_EQ(sample.code, 0) << sample.err;
  const std::vector<std::string> rows = lines_of(sample.out);
  ASSERT_EQ(rows.size(), 25U);
  const nlohmann::json first = nlohmann::json::parse(rows[0]);
  EXPECT_EQ(first["keys"].size(), 4U);
  EXPECT_EQ(first["values"].size(), 4U);
  EXPECT_TRUE(first["query"].is_number_integer());
  EXPECT_EQ(sample.out, run("sample --model model.json -n 25 --seed 5 --context-length 4").out);
  const RunResult default_n = run("sample --model model.json -n 2 --seed 5");
  EXPECT_EQ(nlohmann::json::parse(lines_of(default_n.out)[0])["keys"].size(), 6U);
  write("sampled.jsonl", sample.out);
  const RunResult refit =
      run("fit --family vmha --data sampled.jsonl --out refit.json "
          "--max-its 2 --symbols 30 --targets 30 --embed-dim 3 --lr 0.1 "
          "--prior-strength 0.2 --valid sampled.jsonl");
  ASSERT_EQ(refit.code, 0) << refit.err;
  EXPECT_TRUE(contains(refit.out, "ln[p_mat(Valid Data|Model)]=")) << refit.out;
  EXPECT_EQ(load_model(path("refit.json")).get_if<VariationalMultiHopAttention>()->embed_dim(), 3);
  // The fixture model scores the chained fixtures identically in every encoding.
  const std::string fixture = "--model '" + data("vmha_model.json") + "'";
  const RunResult jsonl = run("score " + fixture + " --data '" + data("ca_small.jsonl") + "'");
  ASSERT_EQ(jsonl.code, 0) << jsonl.err;
  for (const char* archive : {"ca_small.npz", "ca_small_stored.npz"})
    EXPECT_EQ(run("score " + fixture + " --data '" + data(archive) + "'").out, jsonl.out)
        << archive;
}

/// Bad chained rows fail a multi-hop fit the same way (file, line, field; no model file), and
/// score checks ids against the model.
TEST_F(CliTest, VariationalMultiHopBadDataFilesExitTwo) {
  const std::string good = R"({"keys":[0,1,2],"values":[3,4,5],"query":0,"target":1})"
                           "\n";
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases{
      {R"({"keys":[0,1],"values":[3,4],"query":0,"target":1})",
       {"keys has 2 entries", "expected N = 3 (from line 1)"}},
      {R"({"keys":[0,1,2],"query":0,"target":1})", {"missing field 'values'"}},
      {R"({"keys":[0,1,2],"values":[3,4,5.5],"query":0,"target":1})", {"values[2]", "5.5"}},
      {R"({"keys":[0,1,2],"values":[3,4,5],"query":true,"target":1})", {"query", "bool"}},
      {R"({"context":[0,1,2],"query":0,"target":1})", {"unknown field 'context'"}},
  };
  int k = 0;
  for (const auto& [second, fragments] : cases) {
    const std::string file = "bad" + std::to_string(k++) + ".jsonl";
    write(file, good + second + "\n");
    const RunResult r = run("fit --family vmha --data " + file + " --out model.json --max-its 1");
    EXPECT_EQ(r.code, 2) << file << ": " << r.err;
    EXPECT_TRUE(contains(r.err, file + ": line 2: ")) << r.err;
    for (const std::string& f : fragments) EXPECT_TRUE(contains(r.err, f)) << r.err;
    EXPECT_FALSE(fs::exists(path("model.json")));
  }
  write("big.jsonl", good + R"({"keys":[0,1,2],"values":[3,4,6],"query":0,"target":1})"
                            "\n");
  const RunResult big = run("score --model '" + data("vmha_model.json") + "' --data big.jsonl");
  EXPECT_EQ(big.code, 2);
  for (const char* f :
       {"big.jsonl: line 2: values[2]", "out-of-range ID 6", "S = 6 (from the model)"})
    EXPECT_TRUE(contains(big.err, f)) << big.err;
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
  // Variational embedding attention: tied embeddings transfer to held-out synonyms, untied
  // one-hot responsibility attention cannot (acceptance task VEA-2).
  double tied_train = -1.0, tied_test = -1.0, untied_train = -1.0, untied_test = -1.0;
  const size_t tied = r.out.find("tied embeddings  (VEA)");
  const size_t untied = r.out.find("untied one-hot   (RA)");
  ASSERT_NE(tied, std::string::npos) << r.out;
  ASSERT_NE(untied, std::string::npos) << r.out;
  ASSERT_EQ(
      std::sscanf(r.out.c_str() + tied, "tied embeddings  (VEA) %lf %lf", &tied_train, &tied_test),
      2);
  ASSERT_EQ(std::sscanf(r.out.c_str() + untied, "untied one-hot   (RA) %lf %lf", &untied_train,
                        &untied_test),
            2);
  EXPECT_GT(tied_test, 0.85);
  EXPECT_LT(untied_test, 0.5);
  EXPECT_GT(tied_test - untied_test, 0.3);
  EXPECT_GT(untied_train, 0.85);  // the untied model did learn the training queries
  int agree = -1;
  const size_t nn = r.out.find("Tied embeddings whose nearest neighbour is their synonym: ");
  ASSERT_NE(nn, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + nn,
                        "Tied embeddings whose nearest neighbour is their synonym: %d/12", &agree),
            1);
  EXPECT_GT(agree, 9);  // > 0.8 of the 12 symbols
  // Assignment-tree attention: frequencies, the spanning tree, dense against tree-sparse attention.
  EXPECT_TRUE(contains(r.out, "Assignment-tree attention")) << r.out;
  EXPECT_TRUE(contains(r.out, "key column sums            exactly 1")) << r.out;
  EXPECT_TRUE(contains(r.out, "spanning tree              30 edges = 16 + 15 - 1")) << r.out;
  EXPECT_TRUE(contains(r.out, "dense attention        MSE ")) << r.out;
  EXPECT_TRUE(contains(r.out, "tree-sparse attention  MSE ")) << r.out;
  EXPECT_TRUE(contains(r.out, "attnmix assign-tree")) << r.out;
}

// ----- assign-tree (docs/mechanisms.md#assignment-tree-attention)
// -------------------------------------------------------------------------------------

/// The keys of results.json in the order of docs/mechanisms.md#assignment-tree-attention.
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
    "prediction_3_frequencies",
    "prediction_3_tree_edges",
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
  // Prediction 3's matrices: one frequency row per query (each sample matches every key once, so every key's column
  // sums to 1), and the 30 tree edges in row-major order, each on a query-key pair of the matrix.
  ASSERT_EQ(doc["prediction_3_frequencies"].size(), 16u);
  for (size_t j = 0; j < 15; ++j) {
    double column = 0.0;
    for (const auto& row : doc["prediction_3_frequencies"]) column += row.at(j).get<double>();
    EXPECT_NEAR(column, 1.0, 1e-12) << "key " << j;
  }
  const auto& edges = doc["prediction_3_tree_edges"];
  ASSERT_EQ(edges.size(), 30u);
  for (size_t e = 0; e < edges.size(); ++e) {
    EXPECT_LT(edges[e][0].get<int>(), 16);
    EXPECT_LT(edges[e][1].get<int>(), 15);
    if (e > 0) {
      EXPECT_LT(edges[e - 1], edges[e]);
    }
  }
  // The document is printed first, without the matrices, which the next line points to.
  auto shown = doc;
  shown.erase("prediction_3_frequencies");
  shown.erase("prediction_3_tree_edges");
  EXPECT_EQ(r.out.rfind(shown.dump(2) + "\n(prediction 3's frequency matrix and spanning tree are in results.json", 0),
            0u)
      << r.out;
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
