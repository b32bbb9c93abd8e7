// SPDX-License-Identifier: Apache-2.0
// `attnmix lm` and files (issue 18 §2): --out that is the --text is refused (--out may be the --resume checkpoint:
// resuming in place is documented), --out on a FIFO is refused, a FIFO as --text, --resume or --checkpoint is refused
// instead of blocking, a huge --threads is capped, stdout write errors exit 2, and SIGTERM in the middle of writing a
// checkpoint removes the temporary file (the checkpoint is written by the plugin's own copy of the library). The
// binary (ATTNMIX_CLI) runs in a fresh temporary directory per test.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
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

const std::string kTiny =
    " --d-model 8 --n-layer 1 --n-head 2 --window 8 --batch 2 --chunk 16 --lr 0.01 --seed 2";

class CliLmFilesTest : public testing::CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    std::string text;
    for (int i = 0; text.size() < 3000; ++i) text += "a stream of bytes flows through the window " + std::to_string(i) + ". ";
    write("text.txt", text);
  }
  [[nodiscard]] std::vector<std::string> hidden_files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_))
      if (entry.path().filename().string().front() == '.') names.push_back(entry.path().filename().string());
    return names;
  }
};

TEST_F(CliLmFilesTest, OutThatIsTheTextIsRefused) {
  const std::string text = read_text(path("text.txt"));
  ASSERT_EQ(::link(path("text.txt").c_str(), path("hard.txt").c_str()), 0);
  for (const std::string& out : {std::string("text.txt"), std::string("./text.txt"), std::string("hard.txt")}) {
    const RunResult r = run("lm train --text text.txt --steps 2" + kTiny + " --out " + out);
    EXPECT_EQ(r.code, 2) << out << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "--out " + out + " is the file --text reads (text.txt)")) << r.err;
    EXPECT_EQ(read_text(path("text.txt")), text);
  }
  // Resuming in place (docs/lm.md) stays allowed: the checkpoint is read whole first, then replaced atomically.
  ASSERT_EQ(run("lm train --text text.txt --steps 2" + kTiny + " --out m.ckpt").code, 0);
  const RunResult resumed = run("lm train --text text.txt --steps 4" + kTiny + " --resume m.ckpt --out m.ckpt");
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.out, "checkpoint    m.ckpt (step 4")) << resumed.out;
}

TEST_F(CliLmFilesTest, FifosAreRefusedAsInputsAndOutputs) {
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  ASSERT_EQ(run("lm train --text text.txt --steps 2" + kTiny + " --out m.ckpt").code, 0);
  // `timeout`: without the check, opening the FIFO waits for a writer forever.
  const std::string cli = "timeout 60 " + quoted(ATTNMIX_CLI) + " ";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"lm train --text fifo --steps 2" + kTiny, "fifo: cannot read the text: it is not a regular file"},
      {"lm train --text text.txt --resume fifo --steps 4",
       "fifo: cannot read the checkpoint: it is not a regular file"},
      {"lm eval --checkpoint fifo --text text.txt", "fifo: cannot read the checkpoint: it is not a regular file"},
      {"lm eval --checkpoint m.ckpt --text fifo", "fifo: cannot read the text: it is not a regular file"},
      {"lm generate --checkpoint fifo --prompt ab", "fifo: cannot read the checkpoint: it is not a regular file"},
      {"lm train --text text.txt --steps 2" + kTiny + " --out fifo",
       "fifo: cannot write the checkpoint there: it is not a regular file"},
  };
  for (const auto& [args, message] : cases) {
    const RunResult r = shell(cli + args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_TRUE(contains(r.err, message)) << args << ": " << r.err;
  }
  struct stat info {};
  ASSERT_EQ(::lstat(path("fifo").c_str(), &info), 0);
  EXPECT_TRUE(S_ISFIFO(info.st_mode));
}

TEST_F(CliLmFilesTest, HugeThreadCountsAreCappedAtTheHardware) {
  const RunResult r =
      shell("timeout 120 " + quoted(ATTNMIX_CLI) + " lm train --text text.txt --steps 2" + kTiny + " --threads 100000");
  ASSERT_EQ(r.code, 0) << r.err;
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  EXPECT_FALSE(contains(r.out, "100000 threads")) << r.out;
  EXPECT_TRUE(contains(r.out, std::to_string(cores) + (cores == 1 ? " thread\n" : " threads\n"))) << r.out;
  const RunResult g = shell("timeout 120 " + quoted(ATTNMIX_CLI) + " lm train --text text.txt --steps 2" + kTiny +
                            " --out m.ckpt && timeout 120 " + quoted(ATTNMIX_CLI) +
                            " lm generate --checkpoint m.ckpt --prompt ab --tokens 4 --threads 100000");
  EXPECT_EQ(g.code, 0) << g.err;
}

TEST_F(CliLmFilesTest, WriteErrorsOnStdoutExitTwo) {
  ASSERT_EQ(run("lm train --text text.txt --steps 2" + kTiny + " --out m.ckpt").code, 0);
  for (const std::string args :
       {"lm generate --checkpoint m.ckpt --prompt ab --tokens 4", "lm eval --checkpoint m.ckpt --text text.txt"}) {
    const RunResult r = shell("{ " + quoted(ATTNMIX_CLI) + " " + args + " >/dev/full; }");
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_TRUE(contains(r.err, "cannot write to standard output: No space left on device")) << args << ": " << r.err;
  }
}

TEST_F(CliLmFilesTest, SigtermInTheMiddleOfACheckpointWriteRemovesTheTemporaryFile) {
  // About 40 MB of checkpoint (3 M parameters and their Adam moments), written after one step.
  const std::vector<std::string> args{ATTNMIX_CLI, "lm",      "train",     "--text", "text.txt", "--d-model", "256",
                                      "--n-layer", "4",       "--n-head",  "4",      "--batch",  "1",
                                      "--chunk",   "16",      "--steps",   "1",      "--holdout", "0",
                                      "--out",     "big.ckpt"};
  const testing::Interruption i =
      testing::interrupt_write(dir_, args, "big.ckpt", SIGTERM, [&] { write("big.ckpt", "old checkpoint"); });
  ASSERT_TRUE(i.caught) << "never caught the checkpoint's write in progress";
  ASSERT_TRUE(WIFSIGNALED(i.status)) << "status " << i.status;
  EXPECT_EQ(WTERMSIG(i.status), SIGTERM);
  EXPECT_EQ(read_text(path("big.ckpt")), "old checkpoint");
  EXPECT_EQ(hidden_files(), std::vector<std::string>{});
}

}  // namespace
}  // namespace attnmix
