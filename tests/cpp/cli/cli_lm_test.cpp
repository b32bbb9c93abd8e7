// SPDX-License-Identifier: Apache-2.0
// `attnmix lm train|eval|generate|recall` end to end (docs/model-format.md, docs/mechanisms.md#streaming-language-model
// and #moment-closure-far-field): the binary (ATTNMIX_CLI) runs in a fresh temporary directory per test on a generated
// text. A tiny model (d_model 8, one layer, 2 streams of 16 bytes) keeps each run to a fraction of a second.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attnmix/core/rng.hpp"
#include "attnmix/stream/option_table.hpp"
#include "testing/cli_fixture.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;
using testing::contains;
using testing::read_text;

constexpr uint64_t kSeed = 99;
/// The model flags of every run: small enough to train in milliseconds.
const std::string kTiny =
    " --d-model 8 --n-layer 1 --n-head 2 --window 8 --batch 2 --chunk 16 --lr 0.01 --seed 2";

/// A number printed after `label` in `text` (NaN when absent).
double number_after(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  double value = std::nan("");
  if (at != std::string::npos) std::sscanf(text.c_str() + at + label.size(), "%lf", &value);
  return value;
}

/// Each test runs the CLI in its own directory (testing/cli_fixture.hpp; stderr is a file, so the progress bar
/// prints lines), with a small pseudo-English corpus text.txt.
class CliLmTest : public testing::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    write_corpus("text.txt", 3000, testing::test_seed(kSeed));
  }
  /// Pseudo-English: words from a small list, sentences ending in ". ".
  void write_corpus(const std::string& name, size_t n_bytes, uint64_t seed) const {
    static const std::vector<std::string> words{"a",       "stream", "of",     "bytes", "flows",
                                                "through", "the",    "window", "and",   "out"};
    Rng rng(seed);
    std::string text;
    while (text.size() < n_bytes) {
      const uint64_t length = 3 + rng.uniform_int(5);
      for (uint64_t w = 0; w < length; ++w)
        text += words[rng.uniform_int(words.size())] + (w + 1 == length ? ". " : " ");
    }
    text.resize(n_bytes);
    write(name, text);
  }
  [[nodiscard]] std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  /// `lm train --text text.txt` with the tiny model and `extra` flags.
  [[nodiscard]] RunResult train(const std::string& extra) const {
    return run("lm train --text text.txt" + kTiny + " " + extra);
  }
};

// ---- usage -------------------------------------------------------------------------------------

TEST_F(CliLmTest, HelpExitsZeroForEverySubcommand) {
  for (const char* command :
       {"lm ", "lm train ", "lm eval ", "lm generate ", "lm recall ", "lm memory-bench "}) {
    const RunResult r = run(std::string(command) + "--help");
    EXPECT_EQ(r.code, 0) << command << r.err;
    EXPECT_TRUE(contains(r.out, "Usage")) << command;
  }
  const RunResult train = run("lm train --help");
  for (const char* flag : {"--text",
                           "--mechanism",
                           "--window",
                           "--d-model",
                           "--n-layer",
                           "--n-head",
                           "--batch",
                           "--chunk",
                           "--steps",
                           "--detach-horizon",
                           "--lr",
                           "--schedule",
                           "--weight-decay",
                           "--clip",
                           "--seed",
                           "--threads",
                           "--holdout",
                           "--resume",
                           "--checkpoint-every",
                           "--out",
                           "moment-closure",
                           "--max-clusters",
                           "--birth-threshold",
                           "--merge-threshold"})
    EXPECT_TRUE(contains(train.out, flag)) << flag;
  const RunResult recall = run("lm recall --help");
  for (const char* flag : {"--mechanisms", "--keys", "--values", "--pairs", "--queries", "--gap",
                           "--window", "--chunk", "--max-clusters", "--steps", "--eval-sequences",
                           "--text", "--text-steps", "--text-chunk"})
    EXPECT_TRUE(contains(recall.out, flag)) << flag;
  EXPECT_TRUE(contains(run("--help").out, "lm"));
}

/// Every option of the library's tables that has a flag is one of its command's flags (stream/option_table.hpp).
TEST_F(CliLmTest, EveryTableOptionIsAFlag) {
  const auto expect_flags = [&](const std::string& command, const auto& table) {
    const RunResult help = run(command + " --help");
    for (const auto& option : table) {
      if (option.flag.empty()) continue;
      EXPECT_TRUE(contains(help.out, std::string(option.flag) + " ")) << command << ": " << option.flag;
    }
  };
  expect_flags("lm train", stream::train_option_table());
  expect_flags("lm generate", stream::generate_option_table());
  expect_flags("lm recall", stream::recall_option_table());
  expect_flags("lm memory-bench", stream::memory_bench_option_table());
}

TEST_F(CliLmTest, UsageErrorsExitOne) {
  EXPECT_EQ(run("lm").code, 1);  // a subcommand is required
  EXPECT_EQ(run("lm frobnicate").code, 1);
  const RunResult mechanism = train("--mechanism mixture");
  EXPECT_EQ(mechanism.code, 1);
  EXPECT_TRUE(contains(mechanism.err, "--mechanism")) << mechanism.err;
  EXPECT_EQ(train("--schedule linear").code, 1);
  EXPECT_EQ(run("lm train --text text.txt --d-model 0").code, 1);
  EXPECT_EQ(train("--steps -3").code, 1);
  EXPECT_EQ(train("--holdout 1").code, 1);
  EXPECT_EQ(train("--checkpoint-every 5").code, 1);           // needs --out
  const RunResult eval_every = train("--holdout 0 --eval-every 2");  // needs a held-out part
  EXPECT_EQ(eval_every.code, 1);
  EXPECT_TRUE(contains(eval_every.err, "--eval-every needs a held-out part")) << eval_every.err;
  EXPECT_EQ(run("lm eval --text text.txt").code, 1);          // --checkpoint missing
  EXPECT_EQ(run("lm generate --checkpoint m.ckpt").code, 1);  // --prompt missing
  EXPECT_EQ(run("lm generate --checkpoint m.ckpt --prompt ''").code, 1);
  EXPECT_TRUE(listing().size() == 1) << "only text.txt";
}

// ---- train, eval, generate ----------------------------------------------------------------------

TEST_F(CliLmTest, TrainEvalGenerateEndToEnd) {
  const RunResult r = train("--steps 20 --out m.ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  // Progress on stderr, one line every 5 % (stderr is not a terminal): step, tokens/s, loss, ETA.
  EXPECT_TRUE(contains(r.err, "step 1/20")) << r.err;
  EXPECT_TRUE(contains(r.err, "step 20/20  100%")) << r.err;
  EXPECT_TRUE(contains(r.err, "tokens/s")) << r.err;
  EXPECT_TRUE(contains(r.err, "loss ")) << r.err;
  EXPECT_TRUE(contains(r.err, "ETA ")) << r.err;
  EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 21);
  // The summary on stdout.
  for (const char* f :
       {"Training a byte-level language model", "2700 for training", "the last 300 held out",
        "Summary", "steps 1-20 (20 steps", "nats per byte (mean of the first 10 and the last 10",
        "bits per byte on 299", "bytes carried for 2 streams", "checkpoint    m.ckpt (step 20"})
    EXPECT_TRUE(contains(r.out, f)) << f << "\n" << r.out;
  const double heldout_bits = number_after(r.out, "nats = ");
  EXPECT_GT(heldout_bits, 0.0);
  EXPECT_LT(heldout_bits, 9.0);
  ASSERT_TRUE(fs::exists(path("m.ckpt")));

  // eval --holdout 0.1 scores exactly the part train held out.
  const RunResult e = run("lm eval --checkpoint m.ckpt --text text.txt --holdout 0.1");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "predicted      299 bytes")) << e.out;
  EXPECT_NEAR(number_after(e.out, "bits per byte  "), heldout_bits, 1e-3 * heldout_bits);
  const RunResult whole = run("lm eval --checkpoint m.ckpt --text text.txt --chunk 5");
  ASSERT_EQ(whole.code, 0) << whole.err;
  EXPECT_TRUE(contains(whole.out, "predicted      2999 bytes")) << whole.out;

  // generate: the prompt and 30 sampled bytes, the same for the same seed.
  const RunResult g1 =
      run("lm generate --checkpoint m.ckpt --prompt 'the window' --tokens 30 --seed 4");
  ASSERT_EQ(g1.code, 0) << g1.err;
  EXPECT_EQ(g1.out.size(), std::string("the window").size() + 30 + 1);
  EXPECT_EQ(g1.out.rfind("the window", 0), 0U);
  const RunResult g2 =
      run("lm generate --checkpoint m.ckpt --prompt 'the window' --tokens 30 --seed 4");
  EXPECT_EQ(g1.out, g2.out);
  const RunResult g3 =
      run("lm generate --checkpoint m.ckpt --prompt 'the window' --tokens 30 --seed 5");
  EXPECT_NE(g1.out, g3.out);
  const RunResult greedy =
      run("lm generate --checkpoint m.ckpt --prompt 'the window' --tokens 10 --top-k 1 "
          "--temperature 0.5");
  EXPECT_EQ(greedy.code, 0) << greedy.err;
}

TEST_F(CliLmTest, FullAttentionAndNoHoldout) {
  const RunResult r = train("--mechanism full --steps 3 --holdout 0 --out m.ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "full causal attention")) << r.out;
  EXPECT_TRUE(contains(r.out, "held out      none")) << r.out;
  EXPECT_TRUE(contains(r.out, "3000 for training")) << r.out;
  const RunResult e = run("lm eval --checkpoint m.ckpt --text text.txt");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "full causal attention")) << e.out;
}

TEST_F(CliLmTest, NoOutWritesNoFile) {
  const RunResult r = train("--steps 2");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "checkpoint    not written")) << r.out;
  EXPECT_EQ(listing(), std::vector<std::string>{"text.txt"});
}

/// Without --text, lm train reads the GPL-3 text that every Debian system carries.
TEST_F(CliLmTest, DefaultCorpusIsTheGpl) {
  if (!fs::exists("/usr/share/common-licenses/GPL-3")) GTEST_SKIP() << "no GPL-3 text here";
  const RunResult r = run("lm train --steps 1" + kTiny);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "/usr/share/common-licenses/GPL-3")) << r.out;
}

// ---- resume ------------------------------------------------------------------------------------

/// 6 steps, then --resume to 12, gives the checkpoint of an uninterrupted 12-step run byte for byte
/// (constant schedule; the cosine schedule is covered by the library tests).
TEST_F(CliLmTest, ResumeMatchesTheUninterruptedRun) {
  ASSERT_EQ(train("--schedule constant --steps 12 --out whole.ckpt").code, 0);
  ASSERT_EQ(train("--schedule constant --steps 6 --out part.ckpt").code, 0);
  const RunResult r =
      run("lm train --text text.txt --resume part.ckpt --steps 12 --out resumed.ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "Resuming part.ckpt at step 6 of 12")) << r.out;
  EXPECT_TRUE(contains(r.out, "steps 7-12 (6 steps")) << r.out;
  EXPECT_TRUE(contains(r.err, "step 7/12")) << r.err;
  EXPECT_EQ(read_text(path("resumed.ckpt")), read_text(path("whole.ckpt")));
  // The same command line plus --resume is accepted: repeated flags agree with the checkpoint.
  const RunResult same = train("--schedule constant --resume part.ckpt --steps 8 --out again.ckpt");
  EXPECT_EQ(same.code, 0) << same.err;
}

TEST_F(CliLmTest, ResumeRejectsConflictsAndFinishedRuns) {
  ASSERT_EQ(train("--steps 4 --out m.ckpt").code, 0);
  const RunResult differing =
      run("lm train --text text.txt --resume m.ckpt --steps 6 --d-model 16");
  EXPECT_EQ(differing.code, 2);
  EXPECT_TRUE(contains(differing.err, "--d-model 16 does not match the --resume checkpoint m.ckpt"))
      << differing.err;
  EXPECT_TRUE(contains(differing.err, "d_model = 8")) << differing.err;
  const RunResult finished = run("lm train --text text.txt --resume m.ckpt");
  EXPECT_EQ(finished.code, 2);
  EXPECT_TRUE(contains(finished.err, "--steps")) << finished.err;
  const RunResult holdout = run("lm train --text text.txt --resume m.ckpt --steps 6 --holdout 0.2");
  EXPECT_EQ(holdout.code, 2);
  EXPECT_TRUE(contains(holdout.err, "same --text and --holdout")) << holdout.err;
  write_corpus("other.txt", 3000, testing::test_seed(kSeed) + 1);
  const RunResult other = run("lm train --text other.txt --resume m.ckpt --steps 6");
  EXPECT_EQ(other.code, 2);
  EXPECT_TRUE(contains(other.err, "m.ckpt")) << other.err;
}

// ---- bad input ---------------------------------------------------------------------------------

TEST_F(CliLmTest, BadTextsExitTwoNamingTheFile) {
  const RunResult missing = run("lm train --text nowhere.txt" + kTiny);
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.err, "nowhere.txt: cannot read the text")) << missing.err;
  write("empty.txt", "");
  const RunResult empty = run("lm train --text empty.txt" + kTiny);
  EXPECT_EQ(empty.code, 2);
  EXPECT_TRUE(contains(empty.err, "empty.txt: the text is empty")) << empty.err;
  write("tiny.txt", "abc");
  const RunResult tiny = run("lm train --text tiny.txt" + kTiny);
  EXPECT_EQ(tiny.code, 2);
  EXPECT_TRUE(contains(tiny.err, "tiny.txt")) << tiny.err;
  EXPECT_TRUE(contains(tiny.err, "too short")) << tiny.err;
  // Long enough to split, too short for 2 streams of one 16-byte chunk plus one (34 bytes).
  write("short.txt", std::string(30, 'x'));
  const RunResult short_text = run("lm train --text short.txt" + kTiny);
  EXPECT_EQ(short_text.code, 2);
  for (const char* f : {"short.txt", "27 training bytes are too few", "at least 34"})
    EXPECT_TRUE(contains(short_text.err, f)) << f << "\n" << short_text.err;
  const RunResult directory = run("lm train --text ." + kTiny);
  EXPECT_EQ(directory.code, 2);
  EXPECT_TRUE(contains(directory.err, "it is a directory")) << directory.err;
}

TEST_F(CliLmTest, InvalidSizesExitTwoNamingTheField) {
  const RunResult heads = run("lm train --text text.txt --d-model 30 --n-head 4 --out m.ckpt");
  EXPECT_EQ(heads.code, 2);
  EXPECT_TRUE(contains(heads.err, "d_model (30) must be divisible by n_head (4)")) << heads.err;
  const RunResult odd = run("lm train --text text.txt --d-model 6 --n-head 2");
  EXPECT_EQ(odd.code, 2);
  EXPECT_TRUE(contains(odd.err, "head_dim")) << odd.err;
  EXPECT_FALSE(fs::exists(path("m.ckpt")));
}

/// Every entry point names the bad file (the library tests cover each kind of damage).
TEST_F(CliLmTest, BadCheckpointsExitTwoNamingTheFile) {
  write("garbage.ckpt", "\x01\x02 not a checkpoint");
  write("json.ckpt", R"({"format": "attnmix-lm-checkpoint", "schema_version": 1})");
  for (const char* name : {"garbage.ckpt", "json.ckpt", "missing.ckpt"}) {
    const std::string n = name;
    const RunResult eval = run("lm eval --checkpoint " + n + " --text text.txt");
    EXPECT_EQ(eval.code, 2) << n;
    EXPECT_TRUE(contains(eval.err, n + ": ")) << eval.err;
  }
  const RunResult gen = run("lm generate --checkpoint garbage.ckpt --prompt hello");
  EXPECT_EQ(gen.code, 2);
  EXPECT_TRUE(contains(gen.err, "garbage.ckpt: not a usable attnmix LM checkpoint")) << gen.err;
  EXPECT_TRUE(gen.out.empty());
  const RunResult resume = train("--resume json.ckpt --steps 3 --out out.ckpt");
  EXPECT_EQ(resume.code, 2);
  EXPECT_TRUE(contains(resume.err, "json.ckpt: ")) << resume.err;
  EXPECT_FALSE(fs::exists(path("out.ckpt")));
}

/// A failed run never touches an existing --out and leaves no temporary file behind.
TEST_F(CliLmTest, FailedRunsLeaveAnExistingCheckpointUntouched) {
  write("m.ckpt", "precious");
  write("garbage.ckpt", "garbage");
  EXPECT_EQ(run("lm train --text text.txt --d-model 30 --n-head 4 --out m.ckpt").code, 2);
  EXPECT_EQ(train("--resume garbage.ckpt --out m.ckpt").code, 2);
  EXPECT_EQ(train("--mechanism mixture --out m.ckpt").code, 1);
  write("short.txt", std::string(30, 'x'));
  EXPECT_EQ(run("lm train --text short.txt --out m.ckpt").code, 2);
  EXPECT_EQ(read_text(path("m.ckpt")), "precious");
  EXPECT_EQ(listing(),
            (std::vector<std::string>{"garbage.ckpt", "m.ckpt", "short.txt", "text.txt"}));
  // An unwritable --out fails before training.
  const RunResult dir = train("--steps 2 --out nowhere/m.ckpt");
  EXPECT_EQ(dir.code, 2);
  EXPECT_TRUE(contains(dir.err, "nowhere/m.ckpt: cannot write the checkpoint")) << dir.err;
  EXPECT_FALSE(contains(dir.err, "step 1/")) << dir.err;
}

// ---- moment-closure and recall
// --------------------------------------------------------------------

/// The far field: train prints its settings and per-layer cluster statistics, eval prints them,
/// generate samples through it, and a resumed run equals the uninterrupted one byte for byte.
TEST_F(CliLmTest, MomentClosureTrainEvalResume) {
  const auto mca = [this](const std::string& extra) {
    return run(
        "lm train --text text.txt --d-model 8 --n-layer 1 --n-head 2 --batch 2 --chunk 16 "
        "--lr 0.01 --seed 2 --mechanism moment-closure --window 4 --max-clusters 3 "
        "--schedule constant " +
        extra);
  };
  const RunResult r = mca("--steps 8 --out whole.ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f :
       {"moment-closure attention: the last 4 tokens exactly and a far field of up to 3",
        "far field     per layer", "layer 0", " birth", " merge", "mean misfit",
        "over 16 ingestions"})
    EXPECT_TRUE(contains(r.out, f)) << f << "\n" << r.out;
  ASSERT_EQ(mca("--steps 4 --out part.ckpt").code, 0);
  const RunResult resumed = mca("--resume part.ckpt --steps 8 --out resumed.ckpt");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(read_text(path("resumed.ckpt")), read_text(path("whole.ckpt")));
  const RunResult conflict =
      run("lm train --text text.txt --resume part.ckpt --steps 8 --max-clusters 2");
  EXPECT_EQ(conflict.code, 2);
  EXPECT_TRUE(contains(conflict.err, "--max-clusters 2 does not match")) << conflict.err;
  EXPECT_TRUE(contains(conflict.err, "max_clusters = 3")) << conflict.err;

  const RunResult e = run("lm eval --checkpoint whole.ckpt --text text.txt --holdout 0.1");
  ASSERT_EQ(e.code, 0) << e.err;
  for (const char* f : {"moment-closure attention", "far field      per layer (at most 3 clusters",
                        "layer 0", " birth", " merge", "mean misfit", "ingestions"})
    EXPECT_TRUE(contains(e.out, f)) << f << "\n" << e.out;
  EXPECT_NEAR(number_after(e.out, "bits per byte  "), number_after(r.out, "nats = "),
              1e-3 * number_after(r.out, "nats = "));
  const RunResult g = run("lm generate --checkpoint whole.ckpt --prompt 'the' --tokens 12");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out.size(), 3U + 12U + 1U);
}

/// --cluster-rule budget: train says which rule it uses, a resumed run continues it byte for byte (the checkpoint
/// keeps the rule), the eval that reads the checkpoint agrees with train's held-out score, a conflicting rule on
/// resume is refused, an unknown rule and the flag on another mechanism are usage errors; the memory benchmark
/// names the rule.
TEST_F(CliLmTest, MomentClosureBudgetRule) {
  const auto mca = [this](const std::string& extra, const std::string& rule = "budget") {
    return run(
        "lm train --text text.txt --d-model 8 --n-layer 1 --n-head 2 --batch 2 --chunk 8 --lr 0.01 --seed 2 "
        "--mechanism moment-closure --window 4 --max-clusters 2 --schedule constant --cluster-rule " + rule + " " +
        extra);
  };
  const RunResult r = mca("--steps 6 --out whole.ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "budget rule: every evicted chunk founds a cluster")) << r.out;
  ASSERT_EQ(mca("--steps 3 --out part.ckpt").code, 0);
  ASSERT_EQ(run("lm train --text text.txt --resume part.ckpt --steps 6 --out resumed.ckpt").code, 0);
  EXPECT_EQ(read_text(path("resumed.ckpt")), read_text(path("whole.ckpt")));
  const RunResult conflict = run("lm train --text text.txt --resume part.ckpt --steps 6 --cluster-rule threshold");
  EXPECT_EQ(conflict.code, 2);
  EXPECT_TRUE(contains(conflict.err, "cluster_rule = budget")) << conflict.err;
  const RunResult e = run("lm eval --checkpoint whole.ckpt --text text.txt --holdout 0.1");
  ASSERT_EQ(e.code, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "budget rule")) << e.out;
  EXPECT_NEAR(number_after(e.out, "bits per byte  "), number_after(r.out, "nats = "),
              1e-3 * number_after(r.out, "nats = "));
  const RunResult threshold = mca("--steps 6 --out threshold.ckpt", "threshold");
  ASSERT_EQ(threshold.code, 0) << threshold.err;
  EXPECT_NE(read_text(path("threshold.ckpt")), read_text(path("whole.ckpt")));
  EXPECT_EQ(mca("--steps 2", "Budget").code, 1);
  const RunResult window = train("--cluster-rule budget");
  EXPECT_EQ(window.code, 1);
  EXPECT_TRUE(contains(window.err, "--cluster-rule applies only to --mechanism moment-closure")) << window.err;
  const RunResult bench = run(
      "lm memory-bench --tasks recall --gaps 4 --pairs 1 --mechanisms moment-closure --cluster-rule budget "
      "--steps 2 --batch 2 --eval-sequences 4 --d-model 8 --n-layer 1");
  ASSERT_EQ(bench.code, 0) << bench.err;
  EXPECT_TRUE(contains(bench.out, "budget rule")) << bench.out;
}

/// --outliers: train says what it keeps, a resumed run continues it byte for byte, a conflicting --outliers is
/// refused; recall compares moment closure with and without the store (text runs included).
TEST_F(CliLmTest, MomentClosureWithOutliers) {
  const auto mca = [this](const std::string& extra) {
    return run(
        "lm train --text text.txt --d-model 8 --n-layer 1 --n-head 2 --batch 2 --chunk 16 "
        "--lr 0.01 --seed 2 --mechanism moment-closure --window 4 --max-clusters 3 --outliers 2 "
        "--schedule constant " +
        extra);
  };
  const RunResult r = mca("--steps 6 --out whole.ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "plus the 2 worst-fitting evicted tokens per cluster kept exactly (int8)")) << r.out;
  ASSERT_EQ(mca("--steps 3 --out part.ckpt").code, 0);
  ASSERT_EQ(mca("--resume part.ckpt --steps 6 --out resumed.ckpt").code, 0);
  EXPECT_EQ(read_text(path("resumed.ckpt")), read_text(path("whole.ckpt")));
  const RunResult conflict = run("lm train --text text.txt --resume part.ckpt --steps 6 --outliers 3");
  EXPECT_EQ(conflict.code, 2);
  EXPECT_TRUE(contains(conflict.err, "outlier_capacity = 2")) << conflict.err;
  const RunResult window = train("--outliers 2");
  EXPECT_EQ(window.code, 1);
  EXPECT_TRUE(contains(window.err, "--outliers applies only to --mechanism moment-closure")) << window.err;
  EXPECT_EQ(train("--mechanism moment-closure --outliers -1").code, 1);

  const RunResult recall = run(
      "lm recall --mechanisms moment-closure,moment-closure+outliers --outliers 2 --steps 2 --batch 2 "
      "--eval-sequences 4 --d-model 8 --n-layer 1 --gap 20 --text text.txt --text-steps 2 --text-chunk 8");
  ASSERT_EQ(recall.code, 0) << recall.err;
  EXPECT_TRUE(contains(recall.out, "moment-closure+outliers")) << recall.out;
}

/// --window-cache int8 on lm eval and lm generate: the summary says so and the state shrinks; linear refuses it.
TEST_F(CliLmTest, Int8WindowCache) {
  ASSERT_EQ(train("--steps 2 --out w.ckpt").code, 0);
  const RunResult exact = run("lm eval --checkpoint w.ckpt --text text.txt");
  const RunResult int8 = run("lm eval --checkpoint w.ckpt --text text.txt --window-cache int8");
  ASSERT_EQ(int8.code, 0) << int8.err;
  EXPECT_TRUE(contains(int8.out, "the window's keys and values held as int8")) << int8.out;
  EXPECT_LT(number_after(int8.out, "state          "), number_after(exact.out, "state          "));
  EXPECT_EQ(run("lm generate --checkpoint w.ckpt --prompt 'the' --tokens 5 --window-cache int8").code, 0);
  EXPECT_EQ(run("lm eval --checkpoint w.ckpt --text text.txt --window-cache int4").code, 1);
  ASSERT_EQ(train("--mechanism linear --steps 2 --out l.ckpt").code, 0);
  const RunResult linear = run("lm eval --checkpoint l.ckpt --text text.txt --window-cache int8");
  EXPECT_EQ(linear.code, 2);
  EXPECT_TRUE(contains(linear.err, "window_cache int8 applies to the window, full and moment-closure")) << linear.err;
}

/// --mechanism frequent-directions: train says what it keeps, a resumed run continues it byte for byte, and
/// --sketch-rows is refused by other mechanisms and when odd.
TEST_F(CliLmTest, FrequentDirectionsTrainsAndResumes) {
  const auto fd = [this](const std::string& extra) {
    return run(
        "lm train --text text.txt --d-model 8 --n-layer 1 --n-head 2 --batch 2 --chunk 16 "
        "--lr 0.01 --seed 2 --mechanism frequent-directions --window 4 --sketch-rows 6 "
        "--schedule constant " +
        extra);
  };
  const RunResult r = fd("--steps 6 --out whole.ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "a Frequent Directions sketch of 6 rows per layer and head")) << r.out;
  ASSERT_EQ(fd("--steps 3 --out part.ckpt").code, 0);
  ASSERT_EQ(fd("--resume part.ckpt --steps 6 --out resumed.ckpt").code, 0);
  EXPECT_EQ(read_text(path("resumed.ckpt")), read_text(path("whole.ckpt")));
  const RunResult window = train("--sketch-rows 8");
  EXPECT_EQ(window.code, 1);
  EXPECT_TRUE(contains(window.err, "--sketch-rows applies only to --mechanism frequent-directions")) << window.err;
  const RunResult odd = train("--mechanism frequent-directions --sketch-rows 5");
  EXPECT_EQ(odd.code, 2);
  EXPECT_TRUE(contains(odd.err, "sketch_rows")) << odd.err;
}

/// --mechanism tensor-sketch: train says what it keeps, a resumed run continues it byte for byte, a conflicting
/// --sketch-dim is refused, and the sketch flags are refused by other mechanisms.
TEST_F(CliLmTest, TensorSketchTrainsAndResumes) {
  const auto ts = [this](const std::string& extra) {
    return run(
        "lm train --text text.txt --d-model 8 --n-layer 1 --n-head 2 --batch 2 --chunk 16 "
        "--lr 0.01 --seed 2 --mechanism tensor-sketch --window 4 --sketch-dim 8 --sketch-degree 2 "
        "--schedule constant " +
        extra);
  };
  const RunResult r = ts("--steps 6 --out whole.ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "a tensor sketch of width 8 per layer and head")) << r.out;
  ASSERT_EQ(ts("--steps 3 --out part.ckpt").code, 0);
  ASSERT_EQ(ts("--resume part.ckpt --steps 6 --out resumed.ckpt").code, 0);
  EXPECT_EQ(read_text(path("resumed.ckpt")), read_text(path("whole.ckpt")));
  const RunResult conflict = run("lm train --text text.txt --resume part.ckpt --steps 6 --sketch-dim 16");
  EXPECT_EQ(conflict.code, 2);
  EXPECT_TRUE(contains(conflict.err, "sketch_dim = 8")) << conflict.err;
  const RunResult window = train("--sketch-degree 3");
  EXPECT_EQ(window.code, 1);
  EXPECT_TRUE(contains(window.err, "--sketch-degree applies only to --mechanism tensor-sketch")) << window.err;
}

TEST_F(CliLmTest, MomentClosureFlagErrors) {
  EXPECT_EQ(train("--mechanism moment-closure --max-clusters 0").code, 1);
  EXPECT_EQ(train("--mechanism moment-closure --max-clusters x").code, 1);
  EXPECT_EQ(train("--mechanism moment-closure --birth-threshold nan").code, 1);
  const RunResult infinite = train("--mechanism moment-closure --merge-threshold inf");
  EXPECT_EQ(infinite.code, 1);
  EXPECT_TRUE(contains(infinite.err, "--merge-threshold")) << infinite.err;
  EXPECT_TRUE(contains(infinite.err, "finite")) << infinite.err;
  EXPECT_EQ(train("--mechanism moment-closure --merge-threshold abc").code, 1);
  const RunResult window = train("--max-clusters 3");  // the default mechanism is window
  EXPECT_EQ(window.code, 1);
  EXPECT_TRUE(contains(window.err, "--max-clusters applies only to --mechanism moment-closure"))
      << window.err;
  EXPECT_EQ(train("--mechanism full --birth-threshold -1").code, 1);
  ASSERT_EQ(train("--steps 2 --out w.ckpt").code, 0);
  const RunResult resume = train("--resume w.ckpt --steps 3 --merge-threshold 2");
  EXPECT_EQ(resume.code, 2);
  EXPECT_TRUE(contains(resume.err, "the --resume checkpoint w.ckpt uses window")) << resume.err;
  EXPECT_EQ(listing(), (std::vector<std::string>{"text.txt", "w.ckpt"}));
}

/// A tiny `lm recall`: the recall table and the text table, one row per mechanism.
TEST_F(CliLmTest, RecallRunsEveryMechanism) {
  const RunResult r = run(
      "lm recall --steps 2 --batch 4 --eval-sequences 8 --d-model 8 --n-layer 1 --text text.txt "
      "--text-steps 2 --text-chunk 8");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f :
       {"Associative recall beyond the window", "every pair has left it", "accuracy", "answer CE",
        "chance", "state bytes", "train s", "window ", "moment-closure ", "full ", "0.0625",
        "bits/byte", "moment-closure far field on the held-out text", "layer 0"})
    EXPECT_TRUE(contains(r.out, f)) << f << "\n" << r.out;
  EXPECT_TRUE(contains(r.err, "step 2/2")) << r.err;
  const RunResult only =
      run("lm recall --steps 1 --batch 2 --eval-sequences 2 --d-model 8 --n-layer 1 --text-steps 0 "
          "--mechanisms full");
  ASSERT_EQ(only.code, 0) << only.err;
  EXPECT_FALSE(contains(only.out, "bits/byte")) << only.out;
  EXPECT_FALSE(contains(only.out, "window    ")) << only.out;
  // Errors: usage (1) and task options that do not fit (2), before any training.
  EXPECT_EQ(run("lm recall --mechanisms window,mixture").code, 1);
  EXPECT_EQ(run("lm recall --steps 0").code, 1);
  EXPECT_EQ(run("lm recall --holdout 1").code, 1);
  const RunResult pairs = run("lm recall --pairs 20 --text-steps 0");
  EXPECT_EQ(pairs.code, 2);
  EXPECT_TRUE(contains(pairs.err, "pairs")) << pairs.err;
  EXPECT_FALSE(contains(pairs.err, "step 1/")) << pairs.err;
  const RunResult heads = run("lm recall --d-model 30 --n-head 4 --text text.txt");
  EXPECT_EQ(heads.code, 2);
  EXPECT_TRUE(contains(heads.err, "n_head")) << heads.err;
  EXPECT_EQ(run("lm recall --text nowhere.txt").code, 2);
}

/// A tiny `lm memory-bench` over every task and mechanism: one table row per case, progress per run, and the JSON
/// file with every run and case; bad options fail before anything trains or is written.
TEST_F(CliLmTest, MemoryBenchRunsEveryTaskAndWritesJson) {
  const RunResult r = run(
      "lm memory-bench --steps 1 --batch 2 --eval-sequences 2 --d-model 8 --n-layer 1 --gaps 20 --pairs 2 "
      "--mqar-lengths 16 --mqar-pairs 2 --passkey-lengths 160 --seeds 0,1 --json bench.json");
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* f : {"Memory benchmark", "recall", "gap 20, pairs 2", "mqar", "length 16, pairs 2", "passkey",
                        "length 160", "window ", "moment-closure ", "moment-closure+outliers ", "linear ",
                        "frequent-directions ", "tensor-sketch ", "full ", "state bytes", "share",
                        "wrote bench.json (42 runs, 21 cases)"})
    EXPECT_TRUE(contains(r.out, f)) << f << "\n" << r.out;
  EXPECT_TRUE(contains(r.err, "run 42/42: passkey (length 160), full, seed 1")) << r.err;
  const auto json = nlohmann::json::parse(read_text(path("bench.json")));
  ASSERT_EQ(json.at("runs").size(), 42U);
  ASSERT_EQ(json.at("cases").size(), 21U);
  for (const auto& c : json.at("cases")) {
    EXPECT_EQ(c.at("seeds"), 2);
    EXPECT_GE(c.at("accuracy").get<double>(), 0.0);
    EXPECT_LE(c.at("accuracy").get<double>(), 1.0);
    EXPECT_GT(c.at("state_bytes").get<int64_t>(), 0);
  }
  EXPECT_EQ(json.at("cases")[0].at("chance").get<double>(), 0.0625);
  EXPECT_EQ(json.at("cases")[20].at("chance").get<double>(), 0.1);
  // Errors: usage (1), and options that do not fit (2) before any training or any file.
  EXPECT_EQ(run("lm memory-bench --tasks recall,sorting").code, 1);
  EXPECT_EQ(run("lm memory-bench --mechanisms window,mixture").code, 1);
  const RunResult mqar = run("lm memory-bench --tasks mqar --mqar-lengths 30 --mqar-pairs 16 --json bad.json");
  EXPECT_EQ(mqar.code, 2);
  EXPECT_TRUE(contains(mqar.err, "mqar: length must be even and at least 4 x pairs")) << mqar.err;
  EXPECT_FALSE(contains(mqar.err, "run 1/")) << mqar.err;
  const RunResult passkey = run("lm memory-bench --tasks passkey --passkey-lengths 20");
  EXPECT_EQ(passkey.code, 2);
  EXPECT_TRUE(contains(passkey.err, "passkey: length must be at least")) << passkey.err;
  EXPECT_FALSE(fs::exists(path("bad.json")));
}

/// --json is rewritten after every run, so a sweep that stops keeps what it finished; --resume then trains only the
/// runs the file lacks and ends with the uninterrupted sweep's results (the runs are deterministic for a seed). A file
/// written with other settings, or that is not a sweep's JSON, is refused and left as it was; --resume needs --json.
TEST_F(CliLmTest, MemoryBenchResumesAStoppedSweep) {
  const std::string sweep =
      "lm memory-bench --tasks recall --gaps 4 --pairs 1,2 --mechanisms window,full --steps 3 --batch 2 "
      "--eval-sequences 4 --d-model 8 --n-layer 1 ";
  ASSERT_EQ(run(sweep + "--json whole.json").code, 0);
  auto stopped = nlohmann::json::parse(read_text(path("whole.json")));
  stopped["runs"].erase(stopped["runs"].begin() + 1, stopped["runs"].end());  // as if it stopped after one run
  stopped["cases"] = nlohmann::json::array();
  write("part.json", stopped.dump());
  const RunResult resumed = run(sweep + "--json part.json --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.out, "resuming 1 finished runs of part.json")) << resumed.out;
  EXPECT_FALSE(contains(resumed.err, "run 1/4")) << resumed.err;
  EXPECT_TRUE(contains(resumed.err, "run 2/4: recall (gap 4, pairs 1), full")) << resumed.err;
  const auto whole = nlohmann::json::parse(read_text(path("whole.json")));
  const auto part = nlohmann::json::parse(read_text(path("part.json")));
  ASSERT_EQ(part.at("runs").size(), 4U);
  for (size_t i = 0; i < 4; ++i)
    for (const char* field : {"mechanism", "setting", "accuracy", "cross_entropy", "first_loss", "last_loss"})
      EXPECT_EQ(part["runs"][i].at(field), whole["runs"][i].at(field)) << i << " " << field;
  EXPECT_EQ(part.at("cases").size(), whole.at("cases").size());

  const std::string before = read_text(path("part.json"));
  const RunResult other = run(sweep + "--lr 0.01 --json part.json --resume");
  EXPECT_EQ(other.code, 2);
  EXPECT_TRUE(contains(other.err, "--resume: written with other training settings")) << other.err;
  write("garbage.json", "not json");
  EXPECT_EQ(run(sweep + "--json garbage.json --resume").code, 2);
  EXPECT_EQ(read_text(path("part.json")), before);
  EXPECT_EQ(run(sweep + "--resume").code, 1);
}

/// --checkpoint-every writes the checkpoint during the run; the end result is the same file.
TEST_F(CliLmTest, PeriodicCheckpointsDoNotChangeTheResult) {
  ASSERT_EQ(train("--steps 8 --out a.ckpt").code, 0);
  ASSERT_EQ(train("--steps 8 --checkpoint-every 3 --out b.ckpt").code, 0);
  EXPECT_EQ(read_text(path("a.ckpt")), read_text(path("b.ckpt")));
}

}  // namespace
}  // namespace attnmix
