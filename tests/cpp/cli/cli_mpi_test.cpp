// SPDX-License-Identifier: Apache-2.0
// `mpirun -np P attnmix fit ...` end to end (issue 6): the attnmix binary (ATTNMIX_CLI) runs under
// the MPI launcher (ATTNMIX_MPIEXEC, as root with --allow-run-as-root, oversubscribed) in a fresh
// temporary directory per test. The oracle of every distributed fit is the single-process fit of
// the same rows with the same seed: the two model files must agree to 1e-12 in every number (the
// order of floating-point additions is all that differs). Each rank runs inside a small shell
// wrapper that prints its exit code on stderr, so a test sees every process's code, not only
// mpirun's.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "attnmix/attention/transitive_task.hpp"
#include "attnmix/core/rng.hpp"
#include "testing/cli_fixture.hpp"

namespace attnmix {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;
using testing::contains;
using testing::lines_of;
using testing::read_text;
using namespace std::string_literals;

/// The tolerance of a distributed model against the single-process one: the sums over ranks
/// reassociate floating-point additions, nothing else.
constexpr double kModelTolerance = 1e-12;
constexpr const char* kExitTag = "attnmix-test-exit";

size_t count_of(const std::string& text, const std::string& fragment) {
  size_t n = 0;
  for (size_t at = text.find(fragment); at != std::string::npos; at = text.find(fragment, at + 1))
    ++n;
  return n;
}

/// The largest absolute difference between the numbers of two JSON values of the same structure
/// (+inf when the structures, keys, strings or lengths differ).
double max_difference(const nlohmann::json& a, const nlohmann::json& b) {
  constexpr double kMismatch = INFINITY;
  if (a.is_number() && b.is_number()) return std::fabs(a.get<double>() - b.get<double>());
  if (a.type() != b.type()) return kMismatch;
  if (a.is_array()) {
    if (a.size() != b.size()) return kMismatch;
    double worst = 0.0;
    for (size_t k = 0; k < a.size(); ++k) worst = std::max(worst, max_difference(a[k], b[k]));
    return worst;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return kMismatch;
    double worst = 0.0;
    for (const auto& item : a.items()) {
      if (!b.contains(item.key())) return kMismatch;
      worst = std::max(worst, max_difference(item.value(), b[item.key()]));
    }
    return worst;
  }
  return a == b ? 0.0 : kMismatch;
}

/// The progress lines of a fit's output without their timing ("(0.001 s)").
std::vector<std::string> progress_lines(const std::string& out) {
  std::vector<std::string> lines;
  for (const std::string& line : lines_of(out))
    if (line.rfind("Iteration ", 0) == 0) lines.push_back(line.substr(0, line.rfind(" (")));
  return lines;
}

/// The message after "attnmix: error: " or "attnmix: error (rank r of P): " (the whole text when
/// neither prefix is there).
std::string error_message(const std::string& err) {
  for (const std::string& line : lines_of(err)) {
    if (line.rfind("attnmix: error", 0) != 0) continue;
    const size_t colon =
        line.find("): ") != std::string::npos ? line.find("): ") + 3 : line.find(": ", 9) + 2;
    return line.substr(colon);
  }
  return err;
}

/// Each test runs attnmix and mpirun in its own directory (testing/cli_fixture.hpp).
class CliMpiTest : public testing::CliFixture {
 protected:
  /// `mpirun -np <ranks> attnmix <args>`. By default each rank runs in a wrapper that prints its
  /// exit code (collected into rank_codes, removed from err), and mpirun waits for every rank
  /// (orte_abort_on_non_zero_status 0: otherwise the first rank to exit non-zero has the others
  /// killed, and their codes are lost; mpirun then exits 0). plain: attnmix runs directly, as a
  /// user runs it, and code is mpirun's own exit code.
  RunResult mpirun(int ranks, const std::string& args, bool plain = false) const {
    std::string command = quoted(ATTNMIX_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " +
                          std::to_string(ranks) + " ";
    if (!plain)
      command +=
          std::string("--mca orte_abort_on_non_zero_status 0 sh -c '\"$0\" \"$@\"; echo \"") +
          kExitTag + " $OMPI_COMM_WORLD_RANK $?\" >&2' ";
    RunResult result = shell(command + quoted(ATTNMIX_CLI) + " " + args);
    std::string err;
    for (const std::string& line : lines_of(result.err)) {
      if (line.rfind(kExitTag, 0) == 0) {
        std::istringstream fields(line.substr(std::string(kExitTag).size()));
        int rank = -1, code = -1;
        fields >> rank >> code;
        result.rank_codes[rank] = code;
      } else {
        err += line + "\n";
      }
    }
    result.err = err;
    return result;
  }

  [[nodiscard]] static std::string data(const std::string& name) {
    return std::string(ATTNMIX_TEST_DATA_DIR) + "/" + name;
  }
  [[nodiscard]] nlohmann::json model(const std::string& name) const {
    return nlohmann::json::parse(read_text(dir_ / name));
  }
  /// The two model files, compared number by number.
  [[nodiscard]] double model_difference(const std::string& a, const std::string& b) const {
    return max_difference(model(a), model(b));
  }

  /// n responsibility-attention rows sampled from the fixture model (S = 4, N = 3, D = 4, T = 4).
  void sample_rows(const std::string& name, int n, int seed) const {
    const RunResult r = run("sample --model '" + data("ra_model.json") + "' -n " +
                            std::to_string(n) + " --seed " + std::to_string(seed));
    ASSERT_EQ(r.code, 0) << r.err;
    write(name, r.out);
  }
  /// n rows of the transitive-lookup task (S = 30, N = 10) as chained JSON Lines.
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
  /// n rows of a synonym task as variational JSON Lines (12 symbols, N = 4, T = 6).
  void write_synonyms(const std::string& name, int n, uint64_t seed) const {
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
      row["query"] = 2 * c + static_cast<int64_t>(rng.uniform_int(2));
      row["target"] = target_of[static_cast<size_t>(c)];
      out << row.dump() << '\n';
    }
  }
  /// Lines [begin, end) of a file (its data lines: the files written here have no blank lines).
  void write_lines(const std::string& name, const std::string& from, size_t begin,
                   size_t end) const {
    const std::vector<std::string> all = lines_of(read_text(dir_ / from));
    std::ofstream out(dir_ / name);
    for (size_t k = begin; k < end && k < all.size(); ++k) out << all[k] << '\n';
  }

  /// Fits `args` alone (single.json) and with each number of ranks (dist<P>.json); expects every
  /// rank to succeed, one copy of the progress lines and summary, equal progress lines and a model
  /// within kModelTolerance of the single-process one.
  void expect_same_fit(const std::string& args, std::vector<int> rank_counts,
                       const std::string& rows_text) const {
    const RunResult single = run("fit " + args + " --out single.json");
    ASSERT_EQ(single.code, 0) << single.err;
    const std::vector<std::string> single_progress = progress_lines(single.out);
    ASSERT_FALSE(single_progress.empty()) << single.out;
    for (int ranks : rank_counts) {
      const std::string out = "dist" + std::to_string(ranks) + ".json";
      const RunResult dist = mpirun(ranks, "fit " + args + " --out " + out);
      ASSERT_EQ(dist.code, 0) << ranks << " ranks:\n" << dist.out << dist.err;
      ASSERT_EQ(dist.rank_codes.size(), static_cast<size_t>(ranks)) << dist.err;
      for (const auto& [rank, code] : dist.rank_codes) EXPECT_EQ(code, 0) << "rank " << rank;
      EXPECT_LT(model_difference("single.json", out), kModelTolerance) << ranks << " ranks";
      // Rank 0 alone reports: one copy of each progress line, of the summary and of the model line.
      EXPECT_EQ(progress_lines(dist.out), single_progress) << dist.out;
      EXPECT_EQ(count_of(dist.out, "Summary"), 1u) << dist.out;
      EXPECT_EQ(count_of(dist.out, "Fitting "), 1u) << dist.out;
      EXPECT_EQ(count_of(dist.out, "model written"), 1u) << dist.out;
      EXPECT_TRUE(contains(dist.out, " on " + std::to_string(ranks) + " processes")) << dist.out;
      EXPECT_TRUE(contains(dist.out, "  data            " + rows_text)) << dist.out;
      EXPECT_TRUE(contains(dist.out, "  processes       " + std::to_string(ranks) + " processes"))
          << dist.out;
      EXPECT_TRUE(dist.err.empty()) << dist.err;
    }
  }
};

// ----- equal to the single-process fit
// ------------------------------------------------------------

/// Responsibility attention: 2 and 3 ranks (stripes of 150/150 and 100/100/100 rows), with two
/// threads in each rank, fit the model of one process.
TEST_F(CliMpiTest, ResponsibilityFitEqualsSingleProcess) {
  sample_rows("train.jsonl", 300, 1);
  expect_same_fit("--data train.jsonl --max-its 6 --delta none --seed 5 --init-p 0.3 --threads 2",
                  {2, 3}, "300 rows from train.jsonl");
  EXPECT_TRUE(contains(read_text(dir_ / "dist3.json"), "responsibility_attention"));
}

/// --sharded-mstep writes the model file of the allreduce path byte for byte (2 and 3 ranks; responsibility attention
/// with σ² estimated, dense and sparse tables, the sparse symbols' pairs split unevenly; chained attention's per-hop
/// key tables; the variational families, their Adam state included), says so in the summary, and is refused with a
/// usage error for a family without a sharded M-step.
TEST_F(CliMpiTest, ShardedMStepWritesTheSameModel) {
  sample_rows("train.jsonl", 300, 1);
  Rng rng(4);
  {
    std::ofstream out(dir_ / "words.jsonl");
    for (int r = 0; r < 200; ++r) {
      std::vector<int64_t> context;
      for (int i = 0; i < 3; ++i) context.push_back(static_cast<int64_t>(rng.uniform_int(30)));
      const auto query = static_cast<int64_t>(rng.uniform_int(r % 2 == 0 ? 30 : 5));  // pairs crowd low symbols
      out << nlohmann::json{{"context", context}, {"query", query}, {"target", context[rng.uniform_int(3)]}}.dump()
          << '\n';
    }
  }
  write_transitive("chain.jsonl", 240, 3);
  for (const std::string& fit : {"fit --data train.jsonl --estimate-sigma2"s,
                                "fit --family ra-sparse --data words.jsonl --estimate-sigma2"s,
                                "fit --family ca --data chain.jsonl"s,
                                "fit --family vea --data words.jsonl --mc 2"s,
                                "fit --family vmha --data chain.jsonl --mc 2"s}) {
    for (int ranks : {2, 3}) {
      SCOPED_TRACE(fit + ", " + std::to_string(ranks) + " ranks");
      const std::string options = " --max-its 4 --delta none --seed 5 --threads 2";
      RunResult r = mpirun(ranks, fit + options + " --out reduced.json");
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_FALSE(contains(r.out, "M-step          sharded")) << r.out;
      r = mpirun(ranks, fit + options + " --sharded-mstep --out sharded.json");
      ASSERT_EQ(r.code, 0) << r.err;
      EXPECT_TRUE(contains(r.out, "M-step          sharded over " + std::to_string(ranks) + " processes")) << r.out;
      EXPECT_EQ(read_text(dir_ / "reduced.json"), read_text(dir_ / "sharded.json"));
    }
  }
  {
    std::ofstream out(dir_ / "values.jsonl");
    for (int r = 0; r < 20; ++r) out << nlohmann::json{{"value", r % 3}}.dump() << '\n';
  }
  const RunResult categorical =
      mpirun(2, "fit --family categorical --data values.jsonl --max-its 1 --sharded-mstep --out c.json", true);
  EXPECT_EQ(categorical.code, 1) << categorical.out << categorical.err;  // a usage error
  EXPECT_TRUE(contains(categorical.err, "--sharded-mstep: ")) << categorical.out << categorical.err;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "c.json"));
}

/// A distributed fit stopped after 3 iterations with --checkpoint (written once, by rank 0) and resumed on 2 ranks
/// writes the model of the uninterrupted 2-rank fit, byte for byte; a variational fit's noise goes on too.
TEST_F(CliMpiTest, ResumedFitEqualsTheUninterruptedFit) {
  sample_rows("train.jsonl", 300, 1);
  for (const std::string& fit : {"--data train.jsonl --delta none --seed 5"s,
                                 "--family vea --data '" + data("vea_small.jsonl") + "' --seed 2"}) {
    SCOPED_TRACE(fit);
    RunResult r = mpirun(2, "fit " + fit + " --max-its 6 --out full.json");
    ASSERT_EQ(r.code, 0) << r.err;
    r = mpirun(2, "fit " + fit + " --max-its 3 --out part.json --checkpoint ck.json");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(count_of(r.out, "checkpoint      ck.json (after iteration 3;"), 1U) << r.out;
    r = mpirun(2, "fit " + fit + " --max-its 6 --out resumed.json --resume ck.json");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(count_of(r.out, "resumed from    ck.json (after iteration 3)"), 1U) << r.out;
    EXPECT_EQ(read_text(dir_ / "full.json"), read_text(dir_ / "resumed.json"));
  }
}

/// Chained attention on the transitive-lookup task.
TEST_F(CliMpiTest, ChainedFitEqualsSingleProcess) {
  write_transitive("train.jsonl", 240, 3);
  expect_same_fit("--family ca --data train.jsonl --max-its 4 --delta none --seed 2 --threads 1",
                  {2, 3}, "240 rows from train.jsonl");
}

/// Variational embedding attention: the Monte-Carlo noise and the Adam state (stored in the model
/// file, compared too) are the same on every rank.
TEST_F(CliMpiTest, VariationalFitEqualsSingleProcess) {
  write_synonyms("train.jsonl", 200, 4);
  expect_same_fit(
      "--family vea --data train.jsonl --embed-dim 3 --mc 2 --max-its 4 --seed 9 "
      "--threads 1",
      {2, 3}, "200 rows from train.jsonl");
  EXPECT_TRUE(model("dist2.json").contains("optimizer_state"));
}

/// Variational multi-hop attention reads the chained rows the same way.
TEST_F(CliMpiTest, VariationalMultiHopFitEqualsSingleProcess) {
  write_transitive("train.jsonl", 90, 5);
  expect_same_fit(
      "--family vmha --data train.jsonl --embed-dim 2 --mc 1 --max-its 2 --seed 4 "
      "--threads 1",
      {3}, "90 rows from train.jsonl");
}

/// .npz archives are striped by row like JSON Lines (6 rows: 2 per rank with 3 ranks).
TEST_F(CliMpiTest, NpzStripesEqualSingleProcess) {
  expect_same_fit(
      "--data '" + data("ra_small.npz") + "' --max-its 3 --delta none --init-p 1 --threads 1", {3},
      "6 rows from ");
  expect_same_fit("--family ca --data '" + data("ca_small.npz") +
                      "' --max-its 3 --delta none --init-p 1 --threads 1",
                  {2}, "6 rows from ");
}

/// Symbol queries ("query": an id standing for its one-hot row): D is 1 + the largest symbol over every rank's
/// stripe (a collective), also when a rank holds no rows; the fit equals the single-process one.
TEST_F(CliMpiTest, SymbolQueryFitEqualsSingleProcess) {
  Rng rng(8);
  {
    std::ofstream out(dir_ / "symbols.jsonl");
    for (int r = 0; r < 240; ++r) {
      nlohmann::json row;
      std::vector<int64_t> context;
      for (int i = 0; i < 3; ++i) context.push_back(static_cast<int64_t>(rng.uniform_int(10)));
      row["context"] = context;
      row["query"] = r == 7 ? 11 : static_cast<int64_t>(rng.uniform_int(10));  // D = 12, from rank 0's stripe
      row["target"] = context[rng.uniform_int(3)];
      out << row.dump() << '\n';
    }
  }
  expect_same_fit("--data symbols.jsonl --max-its 4 --delta none --seed 3 --threads 1", {2, 3},
                  "240 rows from symbols.jsonl");
  EXPECT_EQ(model("dist3.json")["params"]["key_means"][0].size(), 12U);
  write_lines("two.jsonl", "symbols.jsonl", 0, 2);
  expect_same_fit("--data two.jsonl --max-its 2 --delta none --init-p 1 --threads 1", {3}, "2 rows from two.jsonl");
}

/// Sparse tables: every process holds the patterns of all the rows (each stripe reaches other cells), so 2 and 3 ranks
/// fit the single-process model, with the same listed cells; also with an empty shard.
TEST_F(CliMpiTest, SparseTableFitEqualsSingleProcess) {
  Rng rng(9);
  {
    std::ofstream out(dir_ / "words.jsonl");
    for (int r = 0; r < 240; ++r) {
      nlohmann::json row;
      std::vector<int64_t> context;
      for (int i = 0; i < 3; ++i) context.push_back(static_cast<int64_t>(rng.uniform_int(40)));
      row["context"] = context;
      row["query"] = static_cast<int64_t>(rng.uniform_int(40));
      row["target"] = context[rng.uniform_int(3)];
      out << row.dump() << '\n';
    }
  }
  expect_same_fit("--family ra-sparse --data words.jsonl --max-its 4 --delta none --seed 3 --threads 1 "
                  "--estimate-sigma2",
                  {2, 3}, "240 rows from words.jsonl");
  EXPECT_EQ(model("dist3.json")["params"]["key_means"]["columns"],
            model("single.json")["params"]["key_means"]["columns"]);
  write_lines("two.jsonl", "words.jsonl", 0, 2);
  expect_same_fit("--family ra-sparse --data two.jsonl --max-its 2 --delta none --init-p 1 --threads 1", {3},
                  "2 rows from two.jsonl");
}

/// Uneven shards with an empty one: 3 ranks on 2 rows leave rank 0 without rows; its batch still
/// has the data set's widths (N = 3, D = 4) and the fit equals the single-process fit.
TEST_F(CliMpiTest, EmptyShardOfTwoRowFile) {
  sample_rows("all.jsonl", 40, 2);
  write_lines("two.jsonl", "all.jsonl", 0, 2);
  expect_same_fit("--data two.jsonl --max-its 3 --delta none --init-p 1 --threads 1", {3},
                  "2 rows from two.jsonl");
  const RunResult dist = mpirun(3, "fit --data two.jsonl --max-its 1 --init-p 1 --out m.json");
  EXPECT_TRUE(contains(dist.out, "rows per process: 0, 1, 1")) << dist.out;
}

/// `{rank}` names one file per process; the model equals the single-process fit of the files
/// concatenated in rank order, also with an empty file and with --valid files per process.
TEST_F(CliMpiTest, RankPlaceholderFilesEqualConcatenatedFile) {
  sample_rows("all.jsonl", 300, 3);
  sample_rows("valid.jsonl", 60, 4);
  write_lines("part-0.jsonl", "all.jsonl", 0, 0);  // empty
  write_lines("part-1.jsonl", "all.jsonl", 0, 110);
  write_lines("part-2.jsonl", "all.jsonl", 110, 300);
  write_lines("valid-0.jsonl", "valid.jsonl", 0, 25);
  write_lines("valid-1.jsonl", "valid.jsonl", 25, 25);  // empty
  write_lines("valid-2.jsonl", "valid.jsonl", 25, 60);
  const std::string flags = " --max-its 5 --delta none --seed 7 --init-p 0.2 --threads 1";
  const RunResult single =
      run("fit --data all.jsonl --valid valid.jsonl --out single.json" + flags);
  ASSERT_EQ(single.code, 0) << single.err;
  const RunResult dist = mpirun(
      3, "fit --data 'part-{rank}.jsonl' --valid 'valid-{rank}.jsonl' --out dist.json" + flags);
  ASSERT_EQ(dist.code, 0) << dist.out << dist.err;
  EXPECT_LT(model_difference("single.json", "dist.json"), kModelTolerance);
  EXPECT_EQ(progress_lines(dist.out), progress_lines(single.out)) << dist.out;
  EXPECT_TRUE(contains(dist.out, "rows per process: 0, 110, 190")) << dist.out;
  EXPECT_TRUE(contains(dist.out, "300 rows from part-{rank}.jsonl")) << dist.out;
  EXPECT_TRUE(contains(dist.out, "per row on 60 rows of valid-{rank}.jsonl")) << dist.out;
  // Two ranks, two non-empty files of different sizes.
  write_lines("half-0.jsonl", "all.jsonl", 0, 180);
  write_lines("half-1.jsonl", "all.jsonl", 180, 300);
  const RunResult two = mpirun(
      2, "fit --data 'half-{rank}.jsonl' --valid 'valid-{rank}.jsonl' --out two.json" + flags);
  ASSERT_EQ(two.code, 0) << two.out << two.err;
  // valid-0 and valid-1 hold only the first 25 validation rows: the model is fitted on the same
  // training rows (validation only reports), so it equals the single-process model all the same.
  EXPECT_LT(model_difference("single.json", "two.json"), kModelTolerance);
  EXPECT_TRUE(contains(two.out, "per row on 25 rows of valid-{rank}.jsonl")) << two.out;
}

/// --valid is striped like --data; the validation score in every progress line and in the summary
/// is the single-process one, and with --classic it picks the same model.
TEST_F(CliMpiTest, ValidationDataUnderMpi) {
  sample_rows("train.jsonl", 200, 5);
  sample_rows("valid.jsonl", 50, 6);
  expect_same_fit(
      "--data train.jsonl --valid valid.jsonl --max-its 4 --delta none --seed 1 "
      "--threads 1",
      {2, 3}, "200 rows from train.jsonl");
  const RunResult single =
      run("fit --data train.jsonl --valid valid.jsonl --max-its 4 --seed 1 "
          "--classic --threads 1 --out classic.json");
  ASSERT_EQ(single.code, 0) << single.err;
  const RunResult dist = mpirun(3,
                                "fit --data train.jsonl --valid valid.jsonl --max-its 4 "
                                "--seed 1 --classic --threads 1 --out dist_classic.json");
  ASSERT_EQ(dist.code, 0) << dist.err;
  EXPECT_LT(model_difference("classic.json", "dist_classic.json"), kModelTolerance);
  const std::vector<std::string> lines = progress_lines(dist.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_TRUE(contains(lines.front(), "ln[p_mat(Valid Data|Model)]=")) << lines.front();
  EXPECT_EQ(lines, progress_lines(single.out));
  const auto summary_line = [](const std::string& out) {
    for (const std::string& line : lines_of(out))
      if (line.rfind("  validation", 0) == 0) return line;
    return std::string();
  };
  EXPECT_FALSE(summary_line(single.out).empty());
  EXPECT_EQ(summary_line(dist.out), summary_line(single.out));
}

// ----- failures ----------------------------------------------------------------------------------

/// A bad row in one rank's stripe fails every rank with the same exit code; the error names the
/// file, the line in the whole file and the field, exactly as a single process does, is printed
/// once, and no model file is written.
TEST_F(CliMpiTest, BadRowInOneStripeFailsEveryRank) {
  struct Case {
    int bad_row;  // data index: with 3 ranks, stripes [0, 10), [10, 20), [20, 30)
    std::string row;
    std::string flags;
    std::string fragment;
  };
  const std::vector<Case> cases{
      {25, R"({"context":[1,9,3],"query":[0,0,0,0],"target":1})", "--symbols 4",
       "context[1]: out-of-range ID 9"},
      {15, R"({"context":[1,2,3],"target":1})", "", "missing field 'query'"},
      {20, R"({"context":[1,2,3,0],"query":[0,0,0,0],"target":1})", "",
       "context has 4 entries; expected N = 3 (from line 1)"},  // rank 2's first row
      {12, R"({"context":[1,2,3],"query":[0,0,0,0],"target":true})", "", "target"},
      {29, R"({"context":[1,2,3],"query":[0,0,"x",0],"target":1})", "", "query[2]"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> lines;
    for (int k = 0; k < 30; ++k)
      lines.push_back(k == c.bad_row ? c.row
                                     : R"({"context":[1,2,3],"query":[0,0.5,0,1],"target":)" +
                                           std::to_string(k % 4) + "}");
    // Blank lines before data rows 2 and 13 (file lines 3 and 15): data row k sits on line k + 1,
    // k + 2 or k + 3.
    lines.insert(lines.begin() + 13, "");
    lines.insert(lines.begin() + 2, "  ");
    std::string text;
    for (const std::string& line : lines) text += line + "\n";
    write("rows.jsonl", text);
    const int line = c.bad_row + 1 + (c.bad_row >= 2 ? 1 : 0) + (c.bad_row >= 13 ? 1 : 0);
    const std::string where = "rows.jsonl: line " + std::to_string(line) + ": ";

    const RunResult single = run("fit --data rows.jsonl --out m.json " + c.flags);
    ASSERT_EQ(single.code, 2) << c.row << single.out;
    const std::string message = error_message(single.err);
    EXPECT_EQ(message.rfind(where, 0), 0u) << message;
    EXPECT_TRUE(contains(message, c.fragment)) << message;
    for (int ranks : {2, 3}) {
      const RunResult dist = mpirun(ranks, "fit --data rows.jsonl --out m.json " + c.flags);
      ASSERT_EQ(dist.rank_codes.size(), static_cast<size_t>(ranks)) << dist.err;
      for (const auto& [rank, code] : dist.rank_codes)
        EXPECT_EQ(code, 2) << c.row << ": rank " << rank;
      EXPECT_EQ(error_message(dist.err), message) << ranks << " ranks: " << dist.err;
      EXPECT_EQ(count_of(dist.err, "attnmix: error"), 1u) << dist.err;
      // The failing rank is named: the stripe holding the row.
      const int rank = c.bad_row * ranks / 30;
      EXPECT_TRUE(contains(dist.err,
                           "(rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ")"))
          << dist.err;
      EXPECT_FALSE(fs::exists(path("m.json"))) << c.row;
      EXPECT_TRUE(dist.out.empty()) << dist.out;  // the data are read before the opening line
    }
    if (&c != &cases.front()) continue;
    // As a user runs it: mpirun itself exits with the code, and the message comes once.
    const RunResult plain = mpirun(3, "fit --data rows.jsonl --out m.json " + c.flags, true);
    EXPECT_EQ(plain.code, 2) << plain.err;
    EXPECT_EQ(error_message(plain.err), message) << plain.err;
    EXPECT_EQ(count_of(plain.err, "attnmix: error"), 1u) << plain.err;
  }
}

/// Impossible evidence on one rank only (the --init model gives target 0 probability zero; one row,
/// in rank 2's stripe, has target 0): every rank exits 2, and the message names the row's line in
/// the whole file, as the single-process fit does.
TEST_F(CliMpiTest, ImpossibleEvidenceOnOneRankNamesGlobalLine) {
  write("init.json",
        R"({"format":"attnmix-model","schema_version":1,"family":"responsibility_attention",
    "params":{"key_means":[[0,0,0,0],[0,0,0,0],[0,0,0,0],[0,0,0,0]],
    "emission":[[0,0.5,0.25,0.25],[0,0.5,0.25,0.25],[0,0.5,0.25,0.25],[0,0.5,0.25,0.25]],
    "position_prior":[0.25,0.25,0.5],"sigma2":1.0}})");
  std::string text;
  for (int k = 0; k < 30; ++k) {
    if (k == 4) text += "\n";  // a blank line: the row of data index k sits on line k + 2 after it
    text += R"({"context":[1,2,3],"query":[0,0.5,0,1],"target":)" +
            std::to_string(k == 26 ? 0 : 1 + k % 3) + "}\n";
  }
  write("rows.jsonl", text);
  const std::string args =
      "fit --data rows.jsonl --init init.json --emission-smoothing 0 --out m.json";
  const RunResult single = run(args);
  ASSERT_EQ(single.code, 2) << single.out;
  const std::string message = error_message(single.err);
  EXPECT_EQ(message.rfind("rows.jsonl: line 28: impossible evidence", 0), 0u) << message;
  const RunResult dist = mpirun(3, args);
  ASSERT_EQ(dist.rank_codes.size(), 3u) << dist.err;
  for (const auto& [rank, code] : dist.rank_codes) EXPECT_EQ(code, 2) << "rank " << rank;
  EXPECT_EQ(error_message(dist.err), message) << dist.err;
  EXPECT_TRUE(contains(dist.err, "(rank 2 of 3)")) << dist.err;
  EXPECT_EQ(count_of(dist.err, "attnmix: error"), 1u) << dist.err;
  EXPECT_FALSE(fs::exists(path("m.json")));

  // .npz rows are named by their index in the archive: with target 2 impossible, rows 2 (rank 1's
  // stripe [2, 4)) and 5 (rank 2's) fail; rank 1 reports its row by its index in the file.
  write("init2.json",
        R"({"format":"attnmix-model","schema_version":1,"family":"responsibility_attention",
    "params":{"key_means":[[0,0,0,0],[0,0,0,0],[0,0,0,0],[0,0,0,0]],
    "emission":[[0.5,0.25,0,0.25],[0.5,0.25,0,0.25],[0.5,0.25,0,0.25],[0.5,0.25,0,0.25]],
    "position_prior":[0.25,0.25,0.5],"sigma2":1.0}})");
  const std::string npz_args = "fit --data '" + data("ra_small.npz") +
                               "' --init init2.json --emission-smoothing 0 --out m.json";
  const RunResult npz_single = run(npz_args);
  EXPECT_TRUE(contains(npz_single.err, "ra_small.npz: rows 2, 5: impossible evidence"))
      << npz_single.err;
  const RunResult npz = mpirun(3, npz_args);
  ASSERT_EQ(npz.rank_codes.size(), 3u) << npz.err;
  for (const auto& [rank, code] : npz.rank_codes) EXPECT_EQ(code, 2) << "rank " << rank;
  EXPECT_TRUE(contains(npz.err,
                       "(rank 1 of 3): "s + data("ra_small.npz") + ": rows 2: impossible evidence"))
      << npz.err;
}

/// An empty data set, a missing {rank} file and an unwritable --out (checked by rank 0, which
/// writes the model) fail every rank alike.
TEST_F(CliMpiTest, OtherFailuresAreAgreed) {
  fs::copy_file(data("ra_small.npz"), path("p-0.npz"));
  write("empty.jsonl", "\n\n");
  const auto expect_all = [&](const RunResult& r, int ranks, int code, const std::string& what) {
    ASSERT_EQ(r.rank_codes.size(), static_cast<size_t>(ranks)) << r.err;
    for (const auto& [rank, c] : r.rank_codes) EXPECT_EQ(c, code) << what << ": rank " << rank;
    EXPECT_TRUE(contains(r.err, what)) << r.err;
  };
  const RunResult empty = mpirun(3, "fit --data empty.jsonl --out m.json");
  expect_all(empty, 3, 2, "empty.jsonl: contains no observations (the file is empty)");
  EXPECT_EQ(count_of(empty.err, "attnmix: error"), 1u) << empty.err;
  const RunResult missing =
      mpirun(2, "fit --data 'p-{rank}.npz' --out m.json");  // p-1.npz is absent
  expect_all(missing, 2, 2, "p-1.npz: cannot open");
  EXPECT_TRUE(contains(missing.err, "(rank 1 of 2)")) << missing.err;
  // A bad element of an .npz archive is named by its index in the file (row 2: rank 1's stripe).
  const std::string fractional = "fit --data '" + data("ra_fractional_ids.npz") + "' --out m.json";
  const std::string npz_message = error_message(run(fractional).err);
  EXPECT_TRUE(contains(npz_message, "ra_fractional_ids.npz: context[2, 1]: ids must be integers"))
      << npz_message;
  const RunResult npz = mpirun(3, fractional);
  expect_all(npz, 3, 2, "(rank 1 of 3): " + npz_message);
  const RunResult out_dir =
      mpirun(2, "fit --data '" + data("ra_small.jsonl") + "' --out no/m.json");
  expect_all(out_dir, 2, 2, "no/m.json: cannot write the model");
  EXPECT_FALSE(fs::exists(path("m.json")));
}

// ----- the command line under mpirun
// --------------------------------------------------------------

/// Only `fit` runs distributed: other subcommands, --text and bad flags are usage errors (exit 1 on
/// every rank), printed once; --help prints once.
TEST_F(CliMpiTest, UsageUnderMpirun) {
  const auto expect_usage = [&](const std::string& args, const std::string& what) {
    const RunResult r = mpirun(2, args);
    ASSERT_EQ(r.rank_codes.size(), 2u) << args << r.err;
    for (const auto& [rank, code] : r.rank_codes) EXPECT_EQ(code, 1) << args << ": rank " << rank;
    EXPECT_TRUE(contains(r.err, what)) << args << ": " << r.err;
    EXPECT_EQ(count_of(r.err, what), 1u) << args << ": " << r.err;
  };
  expect_usage(
      "score --model '" + data("ra_model.json") + "' --data '" + data("ra_small.jsonl") + "'",
      "only `attnmix fit` runs distributed");
  expect_usage("demo", "only `attnmix fit` runs distributed");
  write("corpus.txt", "abcabcabc\n");
  expect_usage("fit --text corpus.txt --context-length 2 --out m.json",
               "--text cannot be read by a distributed fit");
  expect_usage("fit --data x.jsonl --out m.json --no-such-flag", "--no-such-flag");
  const RunResult help = mpirun(2, "fit --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_EQ(count_of(help.out, "Usage"), 1u) << help.out;
}

}  // namespace
}  // namespace attnmix
