// SPDX-License-Identifier: Apache-2.0
// The CLI's promises about files (README "The command line", issue 18 §2): an output path that is
// one of the command's inputs (by device and inode: another spelling, a hard or a symbolic link) or
// not a regular file (a FIFO, a device node) is refused before anything is written; an input that
// is a FIFO is refused instead of blocking; a failed write to stdout is exit code 2 with a message;
// SIGINT/SIGTERM in the middle of writing a model remove the temporary file and keep the old
// model. The binary (ATTNMIX_CLI) runs in a fresh temporary directory per test.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli/interrupted_write.hpp"
#include "testing/cli_fixture.hpp"

namespace attnmix {
namespace {

namespace fs = std::filesystem;
using testing::RunResult;
using testing::contains;
using testing::read_text;

class CliFilesTest : public testing::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    write("rows.jsonl", read_text(data("ra_small.jsonl")));
    write("valid.jsonl", read_text(data("ra_small.jsonl")));
    write("model.json", read_text(data("ra_model.json")));
  }
  [[nodiscard]] static std::string data(const std::string& name) {
    return std::string(ATTNMIX_TEST_DATA_DIR) + "/" + name;
  }
  /// `attnmix <args>` with its stdout sent to `target` (the fixture captures stderr).
  [[nodiscard]] RunResult run_to(const std::string& args, const std::string& target) const {
    return shell("{ " + quoted(ATTNMIX_CLI) + " " + args + " >" + target + "; }");
  }
  /// A refused run: exit code 2, every fragment in the message, nothing on stdout.
  static void expect_refused(const RunResult& r, const std::vector<std::string>& fragments,
                             const std::string& what) {
    EXPECT_EQ(r.code, 2) << what << ": " << r.err;
    for (const std::string& f : fragments) EXPECT_TRUE(contains(r.err, f)) << what << ": " << r.err;
  }
  [[nodiscard]] std::vector<std::string> hidden_files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_))
      if (entry.path().filename().string().front() == '.') names.push_back(entry.path().filename().string());
    return names;
  }
};

// ---- --out is one of the inputs ----------------------------------------------------------------

TEST_F(CliFilesTest, OutThatIsAnInputIsRefusedWhateverItsName) {
  const std::string rows = read_text(path("rows.jsonl"));
  ASSERT_FALSE(rows.empty());
  ASSERT_EQ(::link(path("rows.jsonl").c_str(), path("hard.jsonl").c_str()), 0);
  fs::create_symlink("rows.jsonl", path("soft.jsonl"));
  fs::create_directories(path("sub"));
  for (const std::string& out :
       {std::string("rows.jsonl"), std::string("./rows.jsonl"), std::string("sub/../rows.jsonl"), path("rows.jsonl"),
        std::string("hard.jsonl"), std::string("soft.jsonl")}) {
    const RunResult r = run("fit --family ra --data rows.jsonl --max-its 1 --out " + out);
    expect_refused(r, {"--out " + out, "--data", "rows.jsonl", "would replace it"}, out);
    EXPECT_EQ(read_text(path("rows.jsonl")), rows) << out;
    EXPECT_TRUE(fs::is_symlink(path("soft.jsonl")));
  }
  // --data given through the link, --out by its own name: the same file.
  expect_refused(run("fit --family ra --data soft.jsonl --max-its 1 --out rows.jsonl"), {"--data", "soft.jsonl"},
                 "link as input");
  EXPECT_EQ(read_text(path("rows.jsonl")), rows);
}

TEST_F(CliFilesTest, OutThatIsValidInitOrTextIsRefused) {
  const std::string valid = read_text(path("valid.jsonl")), model = read_text(path("model.json"));
  expect_refused(run("fit --family ra --data rows.jsonl --valid valid.jsonl --max-its 1 --out valid.jsonl"),
                 {"--out valid.jsonl", "--valid"}, "--valid");
  EXPECT_EQ(read_text(path("valid.jsonl")), valid);
  expect_refused(run("fit --family ra --data rows.jsonl --init model.json --max-its 1 --out ./model.json"),
                 {"--out ./model.json", "--init", "model.json"}, "--init");
  EXPECT_EQ(read_text(path("model.json")), model);
  write("corpus.txt", "abcabcabcabd\nabcabcab\n");
  expect_refused(run("fit --family ra --text corpus.txt --context-length 2 --max-its 1 --out corpus.txt"),
                 {"--out corpus.txt", "--text"}, "--text");
  EXPECT_EQ(read_text(path("corpus.txt")), "abcabcabcabd\nabcabcab\n");
  // A different path is fine, and the inputs are untouched.
  const RunResult ok = run("fit --family ra --data rows.jsonl --valid valid.jsonl --max-its 1 --out fit.json");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(read_text(path("valid.jsonl")), valid);
}

// ---- --out is not a regular file ---------------------------------------------------------------

TEST_F(CliFilesTest, OutOnAFifoOrADeviceIsRefusedAndTheNodeKept) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  std::vector<std::string> nodes{"fifo"};
  // A character device node of our own (the null device's numbers), never the system's /dev/null: as root, a
  // failure of this test must not replace it. Creating one needs root (CAP_MKNOD).
  if (::mknod(path("null").c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) nodes.emplace_back("null");
  for (const std::string& node : nodes) {
    expect_refused(run("fit --family ra --data rows.jsonl --max-its 1 --out " + node),
                   {node + ": cannot write the model there: it is not a regular file"}, node);
    expect_refused(run("assign-tree --out " + node), {node, "not a regular file"}, "assign-tree " + node);
    struct stat info {};
    ASSERT_EQ(::lstat(path(node).c_str(), &info), 0);
    EXPECT_TRUE(node == "fifo" ? S_ISFIFO(info.st_mode) : S_ISCHR(info.st_mode)) << node;
  }
  EXPECT_TRUE(hidden_files().empty());
}

TEST_F(CliFilesTest, OutThroughASymbolicLinkReplacesItsTargetAndKeepsTheLink) {
  fs::create_directories(path("store"));
  write("store/real.json", "old");
  fs::create_symlink("store/real.json", path("link.json"));
  const RunResult r = run("fit --family ra --data rows.jsonl --max-its 1 --out link.json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(path("link.json")));
  EXPECT_TRUE(contains(read_text(path("store/real.json")), "\"attnmix-model\""));
  const RunResult same = run("fit --family ra --data rows.jsonl --max-its 1 --out model_copy.json");
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_EQ(read_text(path("store/real.json")), read_text(path("model_copy.json")));  // byte-identical
  // A dangling link: its target is created.
  fs::create_symlink("store/new.json", path("dangling.json"));
  ASSERT_EQ(run("fit --family ra --data rows.jsonl --max-its 1 --out dangling.json").code, 0);
  EXPECT_TRUE(fs::is_symlink(path("dangling.json")));
  EXPECT_EQ(read_text(path("store/new.json")), read_text(path("model_copy.json")));
  EXPECT_TRUE(hidden_files().empty());
}

// ---- inputs that are not regular files ---------------------------------------------------------

TEST_F(CliFilesTest, InputFifosAreRefusedInsteadOfBlocking) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  // `timeout`: without the check, opening the FIFO waits for a writer forever.
  const std::string cli = "timeout 60 " + quoted(ATTNMIX_CLI) + " ";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"sample --model fifo -n 3 --seed 1", "fifo: cannot read the model file: it is not a regular file"},
      {"predict --model fifo --data rows.jsonl", "fifo: cannot read the model file: it is not a regular file"},
      {"score --model fifo --data rows.jsonl", "fifo: cannot read the model file: it is not a regular file"},
      {"score --model model.json --data fifo", "fifo: cannot read the data file: it is not a regular file"},
      {"fit --family ra --data rows.jsonl --init fifo --out m.json",
       "fifo: cannot read the model file: it is not a regular file"},
      {"fit --family ra --text fifo --context-length 2 --out m.json",
       "fifo: cannot read the text file: it is not a regular file"},
      {"fit --family ra --data rows.jsonl --valid fifo --out m.json",
       "fifo: cannot read the data file: it is not a regular file"},
  };
  for (const auto& [args, message] : cases) {
    const RunResult r = shell(cli + args);
    expect_refused(r, {message}, args);
  }
  EXPECT_FALSE(fs::exists(path("m.json")));
}

// ---- standard output ---------------------------------------------------------------------------

TEST_F(CliFilesTest, WriteErrorsOnStdoutExitTwoWithAMessage) {
  const std::string model = "--model model.json";
  const std::vector<std::string> commands{
      "sample " + model + " -n 20000 --seed 1",  // more than a buffer: fails in the middle
      "sample " + model + " -n 3 --seed 1",      // fails at the final flush
      "predict " + model + " --data rows.jsonl",
      "predict " + model + " --data rows.jsonl --proba",
      "score " + model + " --data rows.jsonl",
      "score " + model + " --data rows.jsonl --per-row",
      "fit --family ra --data rows.jsonl --max-its 2 --out fit.json",
      "fit --help",
  };
  for (const std::string& args : commands) {
    const RunResult r = run_to(args, "/dev/full");
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "cannot write to standard output: No space left on device")) << args << ": " << r.err;
    // Said once.
    EXPECT_EQ(r.err.find("cannot write"), r.err.rfind("cannot write")) << args << ": " << r.err;
  }
  // The fit stopped at its first line: no model.
  EXPECT_FALSE(fs::exists(path("fit.json")));
  // To a file, the same command writes every line.
  const RunResult ok = run("sample " + model + " -n 20000 --seed 1");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(testing::lines_of(ok.out).size(), 20000U);
}

TEST_F(CliFilesTest, WriteErrorsOnStderrAreNotOk) {
  // predict prints its accuracy on stderr: losing it is not success.
  const RunResult r = shell("{ " + quoted(ATTNMIX_CLI) + " predict --model model.json --data rows.jsonl 2>/dev/full; }");
  EXPECT_EQ(r.code, 2);
  EXPECT_FALSE(r.out.empty());
}

// ---- interrupted writes ------------------------------------------------------------------------

/// A model of about 50 MB (S = T = 1500 responsibility attention; --max-its 0 writes the initial model), so that
/// its write lasts long enough to be caught.
class CliInterruptTest : public CliFilesTest {
 protected:
  [[nodiscard]] std::vector<std::string> big_fit() const {
    return {ATTNMIX_CLI, "fit",  "--family",  "ra",   "--data", "rows.jsonl", "--symbols", "1500",
            "--targets", "1500", "--max-its", "0",    "--out",  "big.json",   "--threads", "1"};
  }
  /// Interrupts the big fit's write with `signal_number`; expects the old model intact.
  void expect_interrupted(int signal_number, bool temporary_removed) {
    const std::string old_model = read_text(path("model.json"));
    const testing::Interruption i = testing::interrupt_write(
        dir_, big_fit(), "big.json", signal_number, [&] { write("big.json", old_model); });
    ASSERT_TRUE(i.caught) << "never caught the model's write in progress";
    ASSERT_TRUE(WIFSIGNALED(i.status)) << "status " << i.status;
    EXPECT_EQ(WTERMSIG(i.status), signal_number);
    EXPECT_EQ(read_text(path("big.json")), old_model);
    if (temporary_removed) {
      EXPECT_EQ(hidden_files(), std::vector<std::string>{});
    } else if (const auto temp = testing::temporary_file_of(dir_, "big.json")) {
      fs::remove(*temp);
    }
  }
};

TEST_F(CliInterruptTest, SigtermInTheMiddleOfAWriteRemovesTheTemporaryFile) { expect_interrupted(SIGTERM, true); }

TEST_F(CliInterruptTest, SigintInTheMiddleOfAWriteRemovesTheTemporaryFile) { expect_interrupted(SIGINT, true); }

TEST_F(CliInterruptTest, SigkillInTheMiddleOfAWriteKeepsTheOldModel) {
  // Nothing can clean up after SIGKILL: the temporary file may stay, the old model must.
  expect_interrupted(SIGKILL, false);
}

}  // namespace
}  // namespace attnmix
