// SPDX-License-Identifier: Apache-2.0
// The language-model facade (include/attnmix/stream/language_model.hpp): TBPTT training with
// checkpoints that resume bit for bit, held-out evaluation against a direct computation through the
// spine, sampling, held-out splits, option validation, and the rejection of bad checkpoints with
// the file named; for moment-closure also the checkpointed cluster banks and the per-layer cluster
// statistics. Tiny models (d_model 8, one layer) keep every test well under a second.
#include "attnmix/stream/language_model.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <numeric>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/frequent_directions.hpp"
#include "attnmix/stream/linear_attention.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "attnmix/stream/tensor_sketch.hpp"
#include "testing/all_close.hpp"

namespace attnmix::stream {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSeed = 20240611;

/// Byte tokens of a pseudo-English text: words from a small list, separated by spaces, sentences
/// ending in ". " (so there is something to learn from context).
std::vector<int64_t> make_corpus(size_t n_bytes, uint64_t seed) {
  static const std::vector<std::string> words{"the",   "model", "reads", "a",   "stream", "of",
                                              "bytes", "and",   "keeps", "its", "window", "state"};
  Rng rng(seed);
  std::string text;
  while (text.size() < n_bytes) {
    const uint64_t length = 3 + rng.uniform_int(5);
    for (uint64_t w = 0; w < length; ++w) {
      text += words[rng.uniform_int(words.size())];
      text += w + 1 == length ? ". " : " ";
    }
  }
  text.resize(n_bytes);
  return byte_tokens(text);
}

/// The tiny model every test trains.
TrainOptions tiny_options() {
  TrainOptions o;
  o.model.d_model = 8;
  o.model.n_layer = 1;
  o.model.n_head = 2;
  o.model.window = 8;
  o.batch = 2;
  o.chunk = 8;
  o.steps = 12;
  o.lr = 1e-2;
  o.seed = 3;
  return o;
}

/// The tiny model with a far field: a window of 4 under chunks of 8, so every step evicts tokens.
TrainOptions tiny_moment_options() {
  TrainOptions o = tiny_options();
  o.model.mechanism = Mechanism::kMomentClosure;
  o.model.window = 4;
  o.model.max_clusters = 3;
  return o;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

/// Each test gets its own empty directory.
class LanguageModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("attnmix_lm_test_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    seed_ = testing::test_seed(kSeed);
    corpus_ = make_corpus(1200, seed_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  [[nodiscard]] std::string path(const std::string& name) const { return (dir_ / name).string(); }

  /// A checkpoint of the tiny model after a few steps.
  std::string trained(const std::string& name, TrainOptions o = tiny_options()) {
    o.steps = 4;
    train(o, corpus_, "", path(name));
    return path(name);
  }

  /// The run of `o` saved at step 6 (a periodic checkpoint) and resumed from there to o.steps, written to
  /// resumed.ckpt.
  TrainSummary resumed_from_step6(TrainOptions o) {
    o.checkpoint_every = 6;
    int copies = 0;
    (void)train(o, corpus_, "", path("run.ckpt"), [&](const Progress& p) {
      if (p.step == 6) copies += fs::copy_file(path("run.ckpt"), path("step6.ckpt")) ? 1 : 0;
    });
    EXPECT_EQ(copies, 1);
    o.checkpoint_every = 0;
    return train(o, corpus_, path("step6.ckpt"), path("resumed.ckpt"));
  }

  fs::path dir_;
  uint64_t seed_ = kSeed;
  std::vector<int64_t> corpus_;
};

/// Expects `f` to throw E with every fragment in its message.
template <class E, class F>
void expect_throw_with(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const auto& fragment : fragments)
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << fragment;
  }
}

// ---- resume ------------------------------------------------------------------------------------

/// A constant-schedule run stopped at step 6 and resumed to step 12 gives the losses and the
/// checkpoint file (byte for byte) of the uninterrupted 12-step run.
TEST_F(LanguageModelTest, ResumeWithConstantScheduleIsBitwiseIdentical) {
  TrainOptions o = tiny_options();
  o.schedule = Schedule::kConstant;
  const auto whole = train(o, corpus_, "", path("whole.ckpt"));
  ASSERT_EQ(whole.losses.size(), 12U);
  o.steps = 6;
  const auto first = train(o, corpus_, "", path("part.ckpt"));
  o.steps = 12;
  const auto second = train(o, corpus_, path("part.ckpt"), path("resumed.ckpt"));
  EXPECT_EQ(second.first_step, 6);
  EXPECT_EQ(second.steps, 12);
  std::vector<double> losses = first.losses;
  losses.insert(losses.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(losses, whole.losses);  // exact: the same arithmetic in the same order
  EXPECT_EQ(read_bytes(path("resumed.ckpt")), read_bytes(path("whole.ckpt")));
  EXPECT_EQ(second.state_bytes, whole.state_bytes);
}

/// A cosine run with detach horizon 2 saves every 4 steps; the checkpoint of step 8, copied from
/// the progress callback, resumes to the same losses and final checkpoint as the run itself.
TEST_F(LanguageModelTest, ResumeFromPeriodicCheckpointWithCosineIsBitwiseIdentical) {
  TrainOptions o = tiny_options();
  o.schedule = Schedule::kCosine;
  o.detach_horizon = 2;
  o.checkpoint_every = 4;
  int copies = 0;
  const auto whole = train(o, corpus_, "", path("run.ckpt"), [&](const Progress& p) {
    if (p.step == 8) {
      fs::copy_file(path("run.ckpt"), path("step8.ckpt"));
      ++copies;
    }
  });
  ASSERT_EQ(copies, 1);
  EXPECT_EQ(read_checkpoint_info(path("step8.ckpt")).step, 8);
  o.checkpoint_every = 0;
  const auto resumed = train(o, corpus_, path("step8.ckpt"), path("resumed.ckpt"));
  ASSERT_EQ(resumed.losses.size(), 4U);
  EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 8, whole.losses.end()));
  EXPECT_EQ(read_bytes(path("resumed.ckpt")), read_bytes(path("run.ckpt")));
}

TEST_F(LanguageModelTest, ResumeOnAnotherCorpusIsRejected) {
  const std::string ckpt = trained("a.ckpt");
  const auto other = make_corpus(1200, seed_ + 1);
  TrainOptions o = tiny_options();
  expect_throw_with<std::runtime_error>([&] { train(o, other, ckpt, path("b.ckpt")); },
                                        {ckpt, "different corpus"});
  EXPECT_FALSE(fs::exists(path("b.ckpt")));
}

TEST_F(LanguageModelTest, ResumeBeyondStepsIsRejected) {
  const std::string ckpt = trained("a.ckpt");  // step 4
  TrainOptions o = tiny_options();
  o.steps = 3;
  expect_throw_with<ValueError>([&] { train(o, corpus_, ckpt, ""); }, {ckpt, "step 4"});
}

/// Resuming takes the architecture from the checkpoint, whatever the options say.
TEST_F(LanguageModelTest, ResumeUsesTheCheckpointsSettings) {
  const std::string ckpt = trained("a.ckpt");
  TrainOptions o = tiny_options();
  o.model.d_model = 16;
  o.steps = 6;
  const auto summary = train(o, corpus_, ckpt, path("b.ckpt"));
  EXPECT_EQ(summary.losses.size(), 2U);
  EXPECT_EQ(read_checkpoint_info(path("b.ckpt")).model.d_model, 8);
}

// ---- bad checkpoints ---------------------------------------------------------------------------

/// Missing, garbage, JSON and empty files: every entry point names the file.
TEST_F(LanguageModelTest, UnreadableCheckpointsAreRejectedNamingTheFile) {
  write_bytes(path("garbage.ckpt"), std::string("\x00\x01garbage\xff", 10));
  write_bytes(path("json.ckpt"), R"({"format": "attnmix-lm-checkpoint", "schema_version": 1})");
  write_bytes(path("empty.ckpt"), "");
  fs::create_directories(path("dir.ckpt"));
  const auto tokens = make_corpus(40, seed_);
  for (const char* name : {"missing.ckpt", "garbage.ckpt", "json.ckpt", "empty.ckpt", "dir.ckpt"}) {
    const std::string p = path(name);
    SCOPED_TRACE(name);
    expect_throw_with<std::runtime_error>([&] { (void)read_checkpoint_info(p); }, {p});
    expect_throw_with<std::runtime_error>([&] { (void)evaluate(p, tokens, 8, 1); }, {p});
    expect_throw_with<std::runtime_error>([&] { (void)generate(p, tokens, GenerateOptions{}); },
                                          {p});
    expect_throw_with<std::runtime_error>([&] { train(tiny_options(), corpus_, p, ""); }, {p});
  }
}

/// Archives in the torch format whose contents do not fit: a foreign meta record, an unsupported
/// version, a step outside the run, options that fail validation, and parameters whose shapes
/// differ from the model the meta record describes.
TEST_F(LanguageModelTest, TamperedCheckpointsAreRejectedNamingTheProblem) {
  const TrainOptions o = tiny_options();
  const std::string good = trained("good.ckpt");
  nlohmann::json meta = {{"format", "attnmix-lm-checkpoint"},
                         {"schema_version", 1},
                         {"step", 4},
                         {"corpus", {{"tokens", 1200}, {"fnv1a", 1}}},
                         {"options", {}}};
  {
    const auto info = read_checkpoint_info(good);
    meta["options"] = {{"mechanism", "window"},
                       {"vocab", 256},
                       {"d_model", 16},
                       {"n_layer", 1},
                       {"n_head", 2},
                       {"window", 8},
                       {"batch", 2},
                       {"chunk", 8},
                       {"steps", 4},
                       {"detach_horizon", 1},
                       {"lr", 0.01},
                       {"min_lr_ratio", 0.1},
                       {"schedule", "cosine"},
                       {"weight_decay", 0},
                       {"clip", 1.0},
                       {"seed", 3}};
    EXPECT_EQ(info.model.d_model, 8);
  }
  // Writes an archive with this meta record and the parameters of a d_model-8 spine.
  const auto write_archive = [&](const std::string& name, const nlohmann::json& m) {
    torch::serialize::OutputArchive root;
    root.write("meta", c10::IValue(m.dump()));
    SpineOptions spine;
    spine.d_model = 8;
    spine.n_layer = 1;
    spine.window = 8;
    SlidingWindowSpine model(spine);
    torch::serialize::OutputArchive params;
    model->save(params);
    root.write("model", params);
    root.save_to(path(name));
    return path(name);
  };
  const auto expect_bad = [&](const std::string& p, const std::string& why) {
    SCOPED_TRACE(why);
    expect_throw_with<std::runtime_error>([&] { (void)evaluate(p, corpus_, 8, 1); },
                                          {p, "not a usable attnmix LM checkpoint", why});
  };
  auto m = meta;
  expect_bad(write_archive("shape.ckpt", m), "has shape");  // meta says d_model 16
  m["options"]["d_model"] = 8;
  EXPECT_NO_THROW((void)evaluate(write_archive("fits.ckpt", m), corpus_, 8, 1));
  m["format"] = "something-else";
  expect_bad(write_archive("format.ckpt", m), "format");
  m = meta;
  m["options"]["d_model"] = 8;
  m["schema_version"] = 99;
  expect_bad(write_archive("version.ckpt", m), "schema_version");
  m["schema_version"] = 1;
  m["step"] = 5;  // beyond options.steps = 4
  expect_bad(write_archive("step.ckpt", m), "step");
  m["step"] = 4;
  m["options"]["n_head"] = 3;  // 8 % 3 != 0
  expect_bad(write_archive("options.ckpt", m), "n_head");
  m["options"]["n_head"] = 2;
  m["options"].erase("lr");
  expect_bad(write_archive("missing.ckpt", m), "options.lr is missing");
  m["options"]["lr"] = "fast";
  expect_bad(write_archive("type.ckpt", m), "options.lr must be a number");
  // Resuming needs the optimizer and state records, which these archives lack.
  m["options"]["lr"] = 0.01;
  const std::string no_state = write_archive("nostate.ckpt", m);
  expect_throw_with<std::runtime_error>([&] { train(o, corpus_, no_state, ""); },
                                        {no_state, "no \"optimizer\" record"});
  (void)o;
}

// ---- evaluation --------------------------------------------------------------------------------

/// With full attention the chunk size changes nothing but rounding (docs/mechanisms.md#streaming-language-model, E1-4);
/// the window mechanism keeps the last `window` keys, so the same holds for it.
TEST_F(LanguageModelTest, EvaluateDoesNotDependOnTheChunkSize) {
  constexpr double kRel = 1e-5;  // float32 reassociation across chunkings
  for (const Mechanism mechanism : {Mechanism::kFull, Mechanism::kWindow}) {
    TrainOptions o = tiny_options();
    o.model.mechanism = mechanism;
    const std::string ckpt = trained("m.ckpt", o);
    const auto tokens = make_corpus(150, seed_ + 7);
    const Evaluation a = evaluate(ckpt, tokens, 7, 1);
    const Evaluation b = evaluate(ckpt, tokens, 50, 1);
    const Evaluation c = evaluate(ckpt, tokens, 1000, 1);
    EXPECT_EQ(a.tokens, 149);
    EXPECT_NEAR(a.mean_cross_entropy, b.mean_cross_entropy, kRel * b.mean_cross_entropy);
    EXPECT_NEAR(c.mean_cross_entropy, b.mean_cross_entropy, kRel * b.mean_cross_entropy);
    EXPECT_NEAR(a.bits_per_token, a.mean_cross_entropy / std::log(2.0), 1e-12);
    if (mechanism == Mechanism::kWindow) {
      EXPECT_EQ(a.state_bytes, b.state_bytes);  // bounded
    }
    fs::remove(ckpt);
  }
}

/// evaluate() equals the cross-entropy computed directly: the checkpoint's parameters loaded into
/// a SlidingWindowSpine, one advance() over the whole text, log-softmax at every next byte.
TEST_F(LanguageModelTest, EvaluateMatchesADirectComputationThroughTheSpine) {
  const std::string ckpt = trained("m.ckpt");
  const auto tokens = make_corpus(100, seed_ + 3);
  const Evaluation e = evaluate(ckpt, tokens, 16, 1);

  SpineOptions spine;
  spine.d_model = 8;
  spine.n_layer = 1;
  spine.n_head = 2;
  spine.window = 8;
  SlidingWindowSpine model(spine);
  torch::serialize::InputArchive root;
  root.load_from(ckpt);
  torch::serialize::InputArchive params;
  root.read("model", params);
  model->load(params);
  torch::NoGradGuard no_grad;
  const auto n = static_cast<int64_t>(tokens.size());
  const auto ids = torch::tensor(tokens, torch::kLong).reshape({1, n});
  const auto out = model->advance(model->init_state(1), ids.narrow(1, 0, n - 1));
  const auto log_p = torch::log_softmax(out.logits.to(torch::kDouble), -1);
  double total = 0.0;
  for (int64_t i = 0; i + 1 < n; ++i)
    total -= log_p[0][i][tokens[static_cast<size_t>(i + 1)]].item<double>();
  EXPECT_NEAR(e.mean_cross_entropy, total / static_cast<double>(n - 1),
              1e-5 * e.mean_cross_entropy);
}

/// train()'s held-out evaluation is evaluate() of the checkpoint it wrote.
TEST_F(LanguageModelTest, TrainEvaluatesTheHeldOutTokens) {
  const auto [train_part, heldout] = split_heldout(corpus_, 0.1);
  TrainOptions o = tiny_options();
  o.steps = 3;
  const auto summary = train(o, train_part, "", path("m.ckpt"), {}, heldout);
  ASSERT_TRUE(summary.heldout.has_value());
  const Evaluation e = evaluate(path("m.ckpt"), heldout, o.chunk, 1);
  EXPECT_EQ(summary.heldout->tokens, static_cast<int64_t>(heldout.size()) - 1);
  EXPECT_DOUBLE_EQ(summary.heldout->mean_cross_entropy, e.mean_cross_entropy);
  EXPECT_FALSE(train(o, train_part, "", "").heldout.has_value());
  const std::vector<int64_t> one{65};
  EXPECT_THROW(train(o, train_part, "", "", {}, one), ValueError);
}

/// eval_every scores the held-out tokens at every K-th step but the last, each score is evaluate() of the checkpoint
/// a run stopped at that step writes, and the training itself (losses, far field) is bit for bit the same.
TEST_F(LanguageModelTest, EvalEveryScoresTheHeldOutTokensWithoutChangingTheTraining) {
  const auto [train_part, heldout] = split_heldout(corpus_, 0.1);
  TrainOptions o = tiny_moment_options();
  o.schedule = Schedule::kConstant;  // so that a shorter run trains the same first steps
  o.steps = 6;
  std::vector<Progress> plain, scored;
  const auto a = train(o, train_part, "", "", [&](const Progress& p) { plain.push_back(p); }, heldout);
  o.eval_every = 2;
  const auto b = train(o, train_part, "", "", [&](const Progress& p) { scored.push_back(p); }, heldout);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_DOUBLE_EQ(a.heldout->mean_cross_entropy, b.heldout->mean_cross_entropy);
  ASSERT_EQ(plain.size(), 6U);
  ASSERT_EQ(scored.size(), 6U);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_FALSE(plain[i].heldout_bits_per_byte.has_value());
    EXPECT_EQ(scored[i].heldout_bits_per_byte.has_value(), i == 1 || i == 3) << "step " << i + 1;
    EXPECT_EQ(plain[i].far_share, scored[i].far_share);
    EXPECT_EQ(plain[i].bank_mass, scored[i].bank_mass);
  }
  for (const int64_t step : {2, 4}) {
    o.steps = step;
    o.eval_every = 0;
    train(o, train_part, "", path("s.ckpt"));
    const Evaluation e = evaluate(path("s.ckpt"), heldout, o.chunk, 1);
    EXPECT_DOUBLE_EQ(*scored[static_cast<size_t>(step - 1)].heldout_bits_per_byte, e.bits_per_token);
  }
}

// ---- training ----------------------------------------------------------------------------------

TEST_F(LanguageModelTest, TrainReportsEveryStepAndLowersTheLoss) {
  TrainOptions o = tiny_options();
  o.steps = 30;
  o.lr = 3e-2;
  std::vector<int64_t> steps;
  const auto summary = train(o, corpus_, "", "", [&](const Progress& p) {
    steps.push_back(p.step);
    EXPECT_EQ(p.steps, 30);
    EXPECT_GE(p.eta_seconds, 0.0);
    EXPECT_TRUE(std::isfinite(p.loss));
  });
  ASSERT_EQ(steps.size(), 30U);
  EXPECT_EQ(steps.front(), 1);
  EXPECT_EQ(steps.back(), 30);
  EXPECT_EQ(summary.tokens, 30 * o.batch * o.chunk);
  EXPECT_GT(summary.parameters, 0);
  EXPECT_GT(summary.state_bytes, 0);
  double first = 0.0, last = 0.0;
  for (int i = 0; i < 5; ++i) {
    first += summary.losses[static_cast<size_t>(i)];
    last += summary.losses[summary.losses.size() - 1 - static_cast<size_t>(i)];
  }
  EXPECT_LT(last, first);
}

TEST_F(LanguageModelTest, TrainRejectsBadCorpora) {
  TrainOptions o = tiny_options();
  // batch 2 streams of one chunk of 8 plus one need 18 tokens.
  expect_throw_with<ValueError>([&] { train(o, make_corpus(17, seed_), "", ""); },
                                {"too short", "needs 18"});
  EXPECT_NO_THROW(train(o, make_corpus(18, seed_), "", ""));
  auto bad = corpus_;
  bad[5] = 300;
  expect_throw_with<ValueError>([&] { train(o, bad, "", ""); }, {"token 5", "300", "vocabulary"});
}

/// A failed run (bad options, bad resume, bad corpus) leaves an existing output file untouched.
TEST_F(LanguageModelTest, FailedRunsLeaveTheOutputUntouched) {
  write_bytes(path("out.ckpt"), "precious");
  write_bytes(path("garbage.ckpt"), "garbage");
  TrainOptions bad = tiny_options();
  bad.model.d_model = 30;
  bad.model.n_head = 4;
  EXPECT_THROW(train(bad, corpus_, "", path("out.ckpt")), ValueError);
  EXPECT_THROW(train(tiny_options(), corpus_, path("garbage.ckpt"), path("out.ckpt")),
               std::runtime_error);
  EXPECT_THROW(train(tiny_options(), make_corpus(10, seed_), "", path("out.ckpt")), ValueError);
  EXPECT_EQ(read_bytes(path("out.ckpt")), "precious");
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir_)) ++files;
  EXPECT_EQ(files, 2U);  // no temporary file left behind
}

TEST_F(LanguageModelTest, CheckpointInfoDescribesTheRun) {
  TrainOptions o = tiny_options();
  o.model.mechanism = Mechanism::kFull;
  o.schedule = Schedule::kConstant;
  const std::string ckpt = trained("m.ckpt", o);
  const CheckpointInfo info = read_checkpoint_info(ckpt);
  EXPECT_EQ(info.step, 4);
  EXPECT_EQ(info.model.mechanism, Mechanism::kFull);
  EXPECT_EQ(info.model.d_model, 8);
  EXPECT_EQ(info.options.batch, 2);
  EXPECT_EQ(info.options.schedule, Schedule::kConstant);
  EXPECT_EQ(info.options.lr, 1e-2);
  EXPECT_EQ(info.options.seed, 3U);
  EXPECT_EQ(info.corpus_tokens, static_cast<int64_t>(corpus_.size()));
  EXPECT_EQ(info.corpus_fingerprint, corpus_fingerprint(corpus_));
  EXPECT_NE(corpus_fingerprint(corpus_), corpus_fingerprint(make_corpus(1200, seed_ + 1)));
}

// ---- generation --------------------------------------------------------------------------------

TEST_F(LanguageModelTest, GenerateIsDeterministicForASeed) {
  const std::string ckpt = trained("m.ckpt");
  const auto prompt = byte_tokens("the model ");
  GenerateOptions g;
  g.tokens = 40;
  g.temperature = 1.0;
  g.seed = 1;
  const auto a = generate(ckpt, prompt, g);
  const auto b = generate(ckpt, prompt, g);
  ASSERT_EQ(a.size(), 40U);
  EXPECT_EQ(a, b);
  for (const int64_t t : a) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 256);
  }
  g.seed = 2;
  EXPECT_NE(generate(ckpt, prompt, g), a);
  // top_k = 1 is greedy: the seed no longer matters.
  g.top_k = 1;
  const auto greedy = generate(ckpt, prompt, g);
  g.seed = 3;
  EXPECT_EQ(generate(ckpt, prompt, g), greedy);
  g.tokens = 0;
  EXPECT_TRUE(generate(ckpt, prompt, g).empty());
}

TEST_F(LanguageModelTest, GenerateRejectsBadOptions) {
  const std::string ckpt = trained("m.ckpt");
  const auto prompt = byte_tokens("ab");
  EXPECT_THROW((void)generate(ckpt, {}, GenerateOptions{}), ValueError);
  GenerateOptions g;
  g.temperature = 0.0;
  EXPECT_THROW((void)generate(ckpt, prompt, g), ValueError);
  g = {};
  g.top_k = -1;
  EXPECT_THROW((void)generate(ckpt, prompt, g), ValueError);
  g = {};
  g.threads = 0;
  EXPECT_THROW((void)generate(ckpt, prompt, g), ValueError);
  const std::vector<int64_t> out_of_vocabulary{1, 256};
  EXPECT_THROW((void)generate(ckpt, out_of_vocabulary, GenerateOptions{}), ValueError);
  EXPECT_THROW((void)evaluate(ckpt, prompt, 0, 1), ValueError);
  EXPECT_THROW((void)evaluate(ckpt, byte_tokens("a"), 8, 1), ValueError);
}

// ---- data and options --------------------------------------------------------------------------

TEST_F(LanguageModelTest, ByteTokensAreUnsignedBytes) {
  EXPECT_EQ(byte_tokens(std::string("A\xff\x00", 3)), (std::vector<int64_t>{65, 255, 0}));
  EXPECT_TRUE(byte_tokens("").empty());
}

TEST_F(LanguageModelTest, SplitHeldoutEdgeCases) {
  const std::vector<int64_t> twenty(20, 1);
  auto [train_part, heldout] = split_heldout(twenty, 0.1);  // ⌈2⌉ = 2 held out
  EXPECT_EQ(train_part.size(), 18U);
  EXPECT_EQ(heldout.size(), 2U);
  std::vector<int64_t> ordered(30);
  for (size_t i = 0; i < ordered.size(); ++i) ordered[i] = static_cast<int64_t>(i);
  auto [head, tail] = split_heldout(ordered, 0.25);  // ⌈7.5⌉ = 8: the last 8 tokens
  EXPECT_EQ(head.size(), 22U);
  EXPECT_EQ(tail.front(), 22);
  EXPECT_EQ(tail.back(), 29);
  const std::vector<int64_t> four(4, 1);
  EXPECT_EQ(split_heldout(four, 0.5).second.size(), 2U);
  EXPECT_THROW(split_heldout(std::vector<int64_t>(3, 1), 0.5), ValueError);    // 1 + 2
  EXPECT_THROW(split_heldout(std::vector<int64_t>(10, 1), 0.1), ValueError);   // 1 held out
  EXPECT_THROW(split_heldout(std::vector<int64_t>(10, 1), 0.95), ValueError);  // 0 left
  for (const double f : {0.0, 1.0, -0.1, 1.5, std::numeric_limits<double>::quiet_NaN()})
    EXPECT_THROW(split_heldout(twenty, f), ValueError) << f;
  EXPECT_THROW(split_heldout(std::vector<int64_t>{}, 0.5), ValueError);
}

// ---- moment-closure ----------------------------------------------------------------------------

/// The far field's banks are part of the checkpoint: a moment-closure run stopped at step 6 and
/// resumed to 12 (detach horizon 2, cosine) gives the losses and the checkpoint file of the
/// uninterrupted run.
TEST_F(LanguageModelTest, MomentClosureResumeIsBitwiseIdentical) {
  TrainOptions o = tiny_moment_options();
  o.detach_horizon = 2;
  o.model.merge_threshold = 1.5;
  const auto whole = train(o, corpus_, "", path("whole.ckpt"));
  ASSERT_EQ(whole.losses.size(), 12U);
  const auto resumed = resumed_from_step6(o);
  EXPECT_EQ(resumed.first_step, 6);
  EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 6, whole.losses.end()));
  EXPECT_EQ(read_bytes(path("resumed.ckpt")), read_bytes(path("whole.ckpt")));
  EXPECT_EQ(resumed.state_bytes, whole.state_bytes);
  // Per-layer statistics over the run: every (step, stream) evicts into the bank.
  ASSERT_EQ(whole.far_field.size(), 1U);
  const LayerClusterStats& f = whole.far_field[0];
  EXPECT_EQ(f.ingestions, 12 * o.batch);
  EXPECT_GE(f.births, o.batch);  // the first eviction of each stream founds a cluster
  EXPECT_GE(f.clusters, 1.0);
  EXPECT_LE(f.clusters, 3.0);
  EXPECT_TRUE(std::isfinite(f.mean_misfit));
  EXPECT_GE(f.mean_misfit, 0.0);
  EXPECT_EQ(resumed.far_field[0].ingestions, 6 * o.batch);
  // The far-field settings travel with the checkpoint.
  const CheckpointInfo info = read_checkpoint_info(path("resumed.ckpt"));
  EXPECT_EQ(info.model.mechanism, Mechanism::kMomentClosure);
  EXPECT_EQ(info.model.max_clusters, 3);
  EXPECT_EQ(info.model.birth_threshold, -2.0);
  ASSERT_TRUE(info.model.merge_threshold.has_value());
  EXPECT_EQ(*info.model.merge_threshold, 1.5);
}

/// Rewrites a checkpoint through `model` (a module of the checkpoint's architecture, which loads and re-saves the
/// parameters), passing every state tensor named in `keys` through `edit` (which may change it, or return false to
/// leave the record out).
void rewrite_checkpoint(const std::string& from, const std::string& to, torch::nn::Module& model,
                        const std::vector<std::string>& keys,
                        const std::function<bool(const std::string&, torch::Tensor&)>& edit) {
  torch::serialize::InputArchive in;
  in.load_from(from);
  c10::IValue meta;
  in.read("meta", meta);
  torch::serialize::InputArchive params;
  in.read("model", params);
  model.load(params);
  torch::serialize::InputArchive state_in;
  in.read("state", state_in);
  torch::serialize::OutputArchive out;
  out.write("meta", meta);
  torch::serialize::OutputArchive params_out;
  model.save(params_out);
  out.write("model", params_out);
  torch::serialize::OutputArchive optimizer;  // no moments: as before the first update
  out.write("optimizer", optimizer);
  torch::serialize::OutputArchive state;
  for (const char* key : {"pos", "batch_size"}) {
    c10::IValue v;
    state_in.read(key, v);
    state.write(key, v);
  }
  for (const std::string& key : keys) {
    torch::Tensor t;
    ASSERT_TRUE(state_in.try_read(key, t)) << key;
    if (edit(key, t)) state.write(key, t);
  }
  out.write("state", state);
  out.save_to(to);
}

using StateEdit = std::function<bool(const std::string&, torch::Tensor&)>;

/// Damaged state records of a checkpoint: `good` rewritten through `model` (a module of its architecture) with its
/// state records `keys` passed through an edit, each to its own file; resuming it with `resume` must fail naming the
/// file and the record.
struct StateRecordEdits {
  std::string good;
  torch::nn::Module& model;
  std::vector<std::string> keys;
  TrainOptions resume;
  std::span<const int64_t> corpus;
  std::function<std::string(const std::string&)> path;

  std::string rewrite(const std::string& name, const StateEdit& edit) const {
    rewrite_checkpoint(good, path(name), model, keys, edit);
    return path(name);
  }
  /// The records passed through unchanged resume to resume.steps.
  size_t resumed_steps() const {
    return train(resume, corpus, rewrite("same.ckpt", [](const std::string&, torch::Tensor&) { return true; }), "")
        .losses.size();
  }
  void expect_bad(const std::string& name, const std::vector<std::string>& why, const StateEdit& edit) const {
    SCOPED_TRACE(name);
    const std::string file = rewrite(name, edit);
    std::vector<std::string> fragments{file, "not a usable attnmix LM checkpoint"};
    fragments.insert(fragments.end(), why.begin(), why.end());
    expect_throw_with<std::runtime_error>([&] { train(resume, corpus, file, ""); }, fragments);
  }
};

nlohmann::json stored_options(const std::string& checkpoint) {
  torch::serialize::InputArchive in;
  in.load_from(checkpoint);
  c10::IValue meta;
  in.read("meta", meta);
  return nlohmann::json::parse(meta.toStringRef()).at("options");
}

/// rewrite_checkpoint for a one-layer moment-closure checkpoint.
void rewrite_moment_checkpoint(
    const std::string& from, const std::string& to,
    const std::function<bool(const std::string&, torch::Tensor&)>& edit,
    const std::vector<std::string>& extra_keys = {}) {
  const auto options = stored_options(from);
  MomentClosureOptions m;
  m.d_model = options.at("d_model").get<int64_t>();
  m.n_layer = 1;
  m.n_head = options.at("n_head").get<int64_t>();
  m.window = options.at("window").get<int64_t>();
  m.max_clusters = options.at("max_clusters").get<int64_t>();
  MomentClosureAttention model(m);
  std::vector<std::string> keys{"k0", "v0", "count0", "mu_k0", "mu_v0", "sigma_kk0", "sigma_vk0", "n_clusters0"};
  keys.insert(keys.end(), extra_keys.begin(), extra_keys.end());
  rewrite_checkpoint(from, to, *model, keys, edit);
}

/// Damaged banks are reported when the checkpoint is loaded, naming the record or the layer.
TEST_F(LanguageModelTest, MomentClosureCheckpointBanksAreChecked) {
  TrainOptions o = tiny_moment_options();
  o.steps = 4;
  train(o, corpus_, "", path("good.ckpt"));
  o.steps = 6;
  rewrite_moment_checkpoint(path("good.ckpt"), path("same.ckpt"),
                            [](const std::string&, torch::Tensor&) { return true; });
  EXPECT_EQ(train(o, corpus_, path("same.ckpt"), "").losses.size(), 2U);
  const auto expect_bad = [&](const std::string& name, const std::vector<std::string>& why,
                              const std::function<bool(const std::string&, torch::Tensor&)>& edit) {
    SCOPED_TRACE(name);
    rewrite_moment_checkpoint(path("good.ckpt"), path(name), edit);
    std::vector<std::string> fragments{path(name), "not a usable attnmix LM checkpoint"};
    fragments.insert(fragments.end(), why.begin(), why.end());
    expect_throw_with<std::runtime_error>([&] { train(o, corpus_, path(name), ""); }, fragments);
  };
  expect_bad("missing.ckpt", {"count0"},
             [](const std::string& k, torch::Tensor&) { return k != "count0"; });
  expect_bad("shape.ckpt", {"sigma_vk0", "has shape"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "sigma_vk0") t = t.narrow(-1, 0, 1).contiguous();
    return true;
  });
  expect_bad("live.ckpt", {"cluster bank 0", "n_clusters must lie in [0, max_clusters 3] (got 4)"},
             [](const std::string& k, torch::Tensor& t) {
               if (k == "n_clusters0") t = torch::full_like(t, 4);
               return true;
             });
  expect_bad("count.ckpt", {"count0", "evicted tokens"},
             [](const std::string& k, torch::Tensor& t) {
               if (k == "count0") t = t * 2;
               return true;
             });
  expect_bad("beyond.ckpt", {"cluster bank 0", "the inactive slot 0 of stream 0"},
             [](const std::string& k, torch::Tensor& t) {
               if (k == "n_clusters0") t = torch::zeros_like(t);
               return true;
             });
  expect_bad("variance.ckpt", {"cluster bank 0", "sigma_kk must be >= 0"},
             [](const std::string& k, torch::Tensor& t) {
               if (k == "sigma_kk0") t = -t;
               return true;
             });
}

/// Moment closure with an outlier store resumes bit for bit; the store travels with the checkpoint and counts in
/// the state's bytes.
TEST_F(LanguageModelTest, MomentClosureOutliersResumeIsBitwiseIdentical) {
  TrainOptions o = tiny_moment_options();
  o.model.outlier_capacity = 2;
  o.detach_horizon = 2;
  const auto whole = train(o, corpus_, "", path("whole.ckpt"));
  const auto resumed = resumed_from_step6(o);
  EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 6, whole.losses.end()));
  EXPECT_EQ(read_bytes(path("resumed.ckpt")), read_bytes(path("whole.ckpt")));
  EXPECT_EQ(read_checkpoint_info(path("resumed.ckpt")).model.outlier_capacity, 2);
  o.model.outlier_capacity = 0;
  const auto plain = train(o, corpus_, "", "");
  // One layer, 2 streams: 3 clusters x 2 slots of int8 k and v (2 heads x 4) plus two float32 scales per row.
  EXPECT_EQ(whole.state_bytes - plain.state_bytes, 2 * 2 * (3 * 2 * 2 * 4 + 2 * 3 * 2 * 2 * 4));
  EXPECT_NE(whole.losses.back(), plain.losses.back());
}

/// Damaged outlier stores are reported when the checkpoint is loaded, naming the record.
TEST_F(LanguageModelTest, MomentClosureCheckpointStoresAreChecked) {
  TrainOptions o = tiny_moment_options();
  o.model.outlier_capacity = 2;
  o.steps = 4;
  train(o, corpus_, "", path("good.ckpt"));
  o.steps = 6;
  const std::vector<std::string> store_keys{"store_k_codes0", "store_k_low0", "store_k_scale0", "store_v_codes0",
                                            "store_v_low0",   "store_v_scale0", "store_owner0", "store_residual0"};
  rewrite_moment_checkpoint(path("good.ckpt"), path("same.ckpt"),
                            [](const std::string&, torch::Tensor&) { return true; }, store_keys);
  EXPECT_EQ(train(o, corpus_, path("same.ckpt"), "").losses.size(), 2U);
  const auto expect_bad = [&](const std::string& name, const std::vector<std::string>& why,
                              const std::function<bool(const std::string&, torch::Tensor&)>& edit) {
    SCOPED_TRACE(name);
    rewrite_moment_checkpoint(path("good.ckpt"), path(name), edit, store_keys);
    std::vector<std::string> fragments{path(name), "not a usable attnmix LM checkpoint"};
    fragments.insert(fragments.end(), why.begin(), why.end());
    expect_throw_with<std::runtime_error>([&] { train(o, corpus_, path(name), ""); }, fragments);
  };
  expect_bad("missing.ckpt", {"store_owner0"}, [](const std::string& k, torch::Tensor&) { return k != "store_owner0"; });
  expect_bad("dtype.ckpt", {"store_k_codes0", "int8"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "store_k_codes0") t = t.to(torch::kFloat);
    return true;
  });
  expect_bad("owner.ckpt", {"store_owner0", "names cluster 7"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "store_owner0") t = torch::full_like(t, 7);
    return true;
  });
  expect_bad("full.ckpt", {"store_owner0", "more than outlier_capacity 2"},
             [](const std::string& k, torch::Tensor& t) {
               if (k == "store_owner0") t = torch::zeros_like(t);
               return true;
             });
  expect_bad("scale.ckpt", {"store_v_scale0", "negative"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "store_v_scale0") t = -t - 1.0;
    return true;
  });
  expect_bad("free.ckpt", {"store_owner0", "free but not all zero"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "store_owner0") t = torch::full_like(t, -1);
    return true;
  });
}

/// evaluate() reports the far field per layer; sampling works through it; window checkpoints
/// report none.
TEST_F(LanguageModelTest, MomentClosureEvaluationReportsClusterStatistics) {
  const std::string ckpt = trained("m.ckpt", tiny_moment_options());
  const auto tokens = make_corpus(150, seed_ + 7);
  const Evaluation e = evaluate(ckpt, tokens, 8, 1);
  EXPECT_EQ(e.tokens, 149);
  EXPECT_TRUE(std::isfinite(e.mean_cross_entropy));
  ASSERT_EQ(e.far_field.size(), 1U);
  const LayerClusterStats& f = e.far_field[0];
  EXPECT_EQ(f.ingestions, 19);  // ⌈149 / 8⌉ chunks, each evicting past the window of 4
  EXPECT_GE(f.births, 1);
  EXPECT_LE(f.births, 19);
  EXPECT_GE(f.clusters, 1.0);
  EXPECT_LE(f.clusters, 3.0);
  EXPECT_GE(f.mean_misfit, 0.0);
  // The state is bounded: the chunk size does not change it.
  EXPECT_EQ(evaluate(ckpt, tokens, 5, 1).state_bytes, e.state_bytes);
  GenerateOptions g;
  g.tokens = 20;
  g.seed = 4;
  const auto a = generate(ckpt, byte_tokens("the model "), g);
  EXPECT_EQ(a.size(), 20U);
  EXPECT_EQ(generate(ckpt, byte_tokens("the model "), g), a);
  EXPECT_TRUE(evaluate(trained("w.ckpt"), tokens, 8, 1).far_field.empty());
}

// ---- linear attention ---------------------------------------------------------------------------

TrainOptions tiny_linear_options() {
  TrainOptions o = tiny_options();
  o.model.mechanism = Mechanism::kLinear;
  return o;
}

/// A linear-attention run stopped at step 6 (its running sums saved in float64) resumes to the losses and the
/// checkpoint bytes of the uninterrupted run.
TEST_F(LanguageModelTest, LinearResumeIsBitwiseIdentical) {
  TrainOptions o = tiny_linear_options();
  o.detach_horizon = 2;
  const auto whole = train(o, corpus_, "", path("whole.ckpt"));
  ASSERT_EQ(whole.losses.size(), 12U);
  EXPECT_LT(std::accumulate(whole.losses.end() - 3, whole.losses.end(), 0.0),
            std::accumulate(whole.losses.begin(), whole.losses.begin() + 3, 0.0));
  const auto resumed = resumed_from_step6(o);
  EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 6, whole.losses.end()));
  EXPECT_EQ(read_bytes(path("resumed.ckpt")), read_bytes(path("whole.ckpt")));
  EXPECT_EQ(read_checkpoint_info(path("resumed.ckpt")).model.mechanism, Mechanism::kLinear);
  // One layer: S (2 heads x 4 x 4) and Z (2 x 4) in float64 and the shift row (8 floats), per stream.
  EXPECT_EQ(whole.state_bytes, o.batch * ((2 * 4 * 4 + 2 * 4) * 8 + 8 * 4));
  EXPECT_TRUE(whole.far_field.empty());
}

/// Linear attention streams: the chunk size changes the result only by the float32 rounding of the products, and
/// the state's size is the same whatever the text's length.
TEST_F(LanguageModelTest, LinearEvaluationDoesNotDependOnTheChunkSize) {
  const std::string ckpt = trained("l.ckpt", tiny_linear_options());
  const auto tokens = make_corpus(150, seed_ + 7);
  const Evaluation a = evaluate(ckpt, tokens, 7, 1);
  const Evaluation b = evaluate(ckpt, tokens, 1000, 1);
  EXPECT_NEAR(a.mean_cross_entropy, b.mean_cross_entropy, 1e-6 * b.mean_cross_entropy);  // float32 products
  EXPECT_EQ(a.state_bytes, b.state_bytes);
  EXPECT_EQ(evaluate(ckpt, make_corpus(40, seed_), 7, 1).state_bytes, a.state_bytes);
  GenerateOptions g;
  g.tokens = 10;
  EXPECT_EQ(generate(ckpt, byte_tokens("the "), g), generate(ckpt, byte_tokens("the "), g));
}

/// Damaged running sums are reported when the checkpoint is loaded, naming the record.
TEST_F(LanguageModelTest, LinearCheckpointSumsAreChecked) {
  TrainOptions o = tiny_linear_options();
  o.steps = 4;
  train(o, corpus_, "", path("good.ckpt"));
  o.steps = 6;
  const auto options = stored_options(path("good.ckpt"));
  LinearAttentionOptions l;
  l.d_model = options.at("d_model").get<int64_t>();
  l.n_layer = 1;
  l.n_head = options.at("n_head").get<int64_t>();
  LinearAttentionSpine model(l);
  const StateRecordEdits edits{path("good.ckpt"), *model, {"sum_kv0", "sum_k0", "last_x0"}, o, corpus_,
                               [this](const std::string& name) { return path(name); }};
  EXPECT_EQ(edits.resumed_steps(), 2U);
  edits.expect_bad("missing.ckpt", {"sum_kv0"}, [](const std::string& k, torch::Tensor&) { return k != "sum_kv0"; });
  edits.expect_bad("dtype.ckpt", {"sum_k0", "float64"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "sum_k0") t = t.to(torch::kFloat);
    return true;
  });
  edits.expect_bad("shape.ckpt", {"last_x0", "has shape"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "last_x0") t = t.narrow(-1, 0, 2).contiguous();
    return true;
  });
  edits.expect_bad("negative.ckpt", {"sum_k0", "negative"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "sum_k0") t = -t - 1.0;
    return true;
  });
  edits.expect_bad("nan.ckpt", {"sum_kv0"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "sum_kv0") {
      t = t.contiguous().clone();
      t.view({-1})[0] = std::numeric_limits<double>::quiet_NaN();
    }
    return true;
  });
}

/// WindowCache::kInt8 holds the window's cache as int8 between chunks: the loss moves by the rounding only, the state
/// shrinks by exactly the bytes of the int8 form (1 byte per number plus two float32 per token and head), sampling
/// stays deterministic, and mechanisms without a key-value cache refuse it.
TEST_F(LanguageModelTest, Int8WindowCacheAtInference) {
  const std::string ckpt = trained("w.ckpt");
  const auto tokens = make_corpus(150, seed_ + 7);
  const Evaluation exact = evaluate(ckpt, tokens, 8, 1);
  const Evaluation int8 = evaluate(ckpt, tokens, 8, 1, WindowCache::kInt8);
  EXPECT_NE(int8.mean_cross_entropy, exact.mean_cross_entropy);
  EXPECT_NEAR(int8.mean_cross_entropy, exact.mean_cross_entropy, 0.02 * exact.mean_cross_entropy);
  // One layer, k and v of the 8 cached tokens, 2 heads of 4: 4 bytes per number become 1, plus low and scale.
  const int64_t rows = 2 * 8 * 2;
  EXPECT_EQ(exact.state_bytes - int8.state_bytes, rows * 4 * 4 - rows * (4 + 8));
  const Evaluation chunk1 = evaluate(ckpt, tokens, 1, 1, WindowCache::kInt8);  // rounded after every token
  EXPECT_NEAR(chunk1.mean_cross_entropy, exact.mean_cross_entropy, 0.02 * exact.mean_cross_entropy);
  GenerateOptions g;
  g.tokens = 20;
  g.window_cache = WindowCache::kInt8;
  EXPECT_EQ(generate(ckpt, byte_tokens("the model "), g), generate(ckpt, byte_tokens("the model "), g));
  const std::string moment = trained("m.ckpt", tiny_moment_options());
  EXPECT_LT(evaluate(moment, tokens, 8, 1, WindowCache::kInt8).state_bytes, evaluate(moment, tokens, 8, 1).state_bytes);
  const std::string linear = trained("l.ckpt", tiny_linear_options());
  expect_throw_with<ValueError>([&] { evaluate(linear, tokens, 8, 1, WindowCache::kInt8); },
                                {"window_cache int8", "linear"});
  EXPECT_EQ(parse_window_cache("int8"), WindowCache::kInt8);
  EXPECT_EQ(window_cache_name(parse_window_cache("float32")), "float32");
  expect_throw_with<ValueError>([] { (void)parse_window_cache("int4"); }, {"int4"});
}

// ---- frequent directions ----------------------------------------------------------------------------

/// A window of 4 under chunks of 8 and a sketch of 4 rows: every step evicts tokens and the sketch shrinks.
TrainOptions tiny_sketch_options() {
  TrainOptions o = tiny_options();
  o.model.mechanism = Mechanism::kFrequentDirections;
  o.model.window = 4;
  o.model.sketch_rows = 4;
  return o;
}

/// A frequent-directions run stopped at step 6 (window rows, sketch and sums saved) resumes to the losses and the
/// checkpoint bytes of the uninterrupted run; the sketch's schedule is recovered from pos.
TEST_F(LanguageModelTest, FrequentDirectionsResumeIsBitwiseIdentical) {
  TrainOptions o = tiny_sketch_options();
  o.detach_horizon = 2;
  const auto whole = train(o, corpus_, "", path("whole.ckpt"));
  ASSERT_EQ(whole.losses.size(), 12U);
  EXPECT_LT(std::accumulate(whole.losses.end() - 3, whole.losses.end(), 0.0),
            std::accumulate(whole.losses.begin(), whole.losses.begin() + 3, 0.0));
  const auto resumed = resumed_from_step6(o);
  EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 6, whole.losses.end()));
  EXPECT_EQ(read_bytes(path("resumed.ckpt")), read_bytes(path("whole.ckpt")));
  const auto info = read_checkpoint_info(path("resumed.ckpt"));
  EXPECT_EQ(info.model.mechanism, Mechanism::kFrequentDirections);
  EXPECT_EQ(info.model.sketch_rows, 4);
  // One layer, 2 heads of 4: window 4 x (4 + 4) float32, sketch 4 x 8, Z 4, mass, shrink total float64, the
  // shift row (8 floats), per stream.
  EXPECT_EQ(whole.state_bytes, o.batch * (2 * (4 * 8 * 4 + (4 * 8 + 4 + 2) * 8) + 8 * 4));
  const Evaluation a = evaluate(path("whole.ckpt"), make_corpus(150, seed_ + 7), 7, 1);
  const Evaluation b = evaluate(path("whole.ckpt"), make_corpus(150, seed_ + 7), 1000, 1);
  EXPECT_NEAR(a.mean_cross_entropy, b.mean_cross_entropy, 1e-5 * b.mean_cross_entropy);  // float32 products
  EXPECT_EQ(a.state_bytes, b.state_bytes);
}

/// Damaged sketch records are reported when the checkpoint is loaded, naming the record.
TEST_F(LanguageModelTest, FrequentDirectionsCheckpointRecordsAreChecked) {
  TrainOptions o = tiny_sketch_options();
  o.steps = 4;
  train(o, corpus_, "", path("good.ckpt"));
  o.steps = 6;
  const std::vector<std::string> records{"window_k0", "window_v0", "sketch0", "sum_k0",
                                         "mass0",     "shrink_total0", "last_x0"};
  FrequentDirectionsOptions f;
  f.d_model = 8;
  f.n_layer = 1;
  f.n_head = 2;
  f.window = 4;
  f.sketch_rows = 4;
  FrequentDirectionsSpine model(f);
  const StateRecordEdits edits{path("good.ckpt"), *model, records, o, corpus_,
                               [this](const std::string& name) { return path(name); }};
  EXPECT_EQ(edits.resumed_steps(), 2U);
  edits.expect_bad("missing.ckpt", {"sketch0"}, [](const std::string& k, torch::Tensor&) { return k != "sketch0"; });
  edits.expect_bad("dtype.ckpt", {"mass0", "float64"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "mass0") t = t.to(torch::kFloat);
    return true;
  });
  edits.expect_bad("window.ckpt", {"window_v0", "has shape"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "window_v0") t = t.narrow(2, 0, 3).contiguous();
    return true;
  });
  edits.expect_bad("negative.ckpt", {"shrink_total0", "negative"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "shrink_total0") t = -t - 1.0;
    return true;
  });
  edits.expect_bad("rows.ckpt", {"sketch0", "non-zero rows"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "sketch0") t = t + 1.0;
    return true;
  });
  edits.expect_bad("nan.ckpt", {"sum_k0"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "sum_k0") {
      t = t.contiguous().clone();
      t.view({-1})[0] = std::numeric_limits<double>::quiet_NaN();
    }
    return true;
  });
}

// ---- tensor sketch --------------------------------------------------------------------------------

TrainOptions tiny_tensor_sketch_options() {
  TrainOptions o = tiny_options();
  o.model.mechanism = Mechanism::kTensorSketch;
  o.model.window = 4;
  o.model.sketch_dim = 8;
  o.model.sketch_degree = 2;
  return o;
}

/// A tensor-sketch run stopped at step 6 resumes to the losses and checkpoint bytes of the uninterrupted run, and its
/// damaged records are reported when the checkpoint is loaded.
TEST_F(LanguageModelTest, TensorSketchResumesBitwiseAndChecksItsRecords) {
  TrainOptions o = tiny_tensor_sketch_options();
  o.detach_horizon = 2;
  const auto whole = train(o, corpus_, "", path("whole.ckpt"));
  const auto resumed = resumed_from_step6(o);
  EXPECT_EQ(resumed.losses, std::vector<double>(whole.losses.begin() + 6, whole.losses.end()));
  EXPECT_EQ(read_bytes(path("resumed.ckpt")), read_bytes(path("whole.ckpt")));
  const auto info = read_checkpoint_info(path("resumed.ckpt"));
  EXPECT_EQ(info.model.mechanism, Mechanism::kTensorSketch);
  EXPECT_EQ(info.model.sketch_dim, 8);
  EXPECT_EQ(info.model.sketch_degree, 2);
  // One layer, 2 heads of 4: window 4 x (4 + 4) float32, S 8 x 4, Z 8, misfit float64, the shift row 8 floats.
  EXPECT_EQ(whole.state_bytes, o.batch * (2 * (4 * 8 * 4 + (8 * 4 + 8 + 1) * 8) + 8 * 4));

  TrainOptions more = tiny_tensor_sketch_options();
  more.steps = 14;
  TensorSketchOptions sizes;
  sizes.d_model = 8;
  sizes.n_layer = 1;
  sizes.n_head = 2;
  sizes.window = 4;
  sizes.sketch_dim = 8;
  TensorSketchSpine model(sizes);
  const StateRecordEdits edits{path("whole.ckpt"), *model,
                               {"window_k0", "window_v0", "sum_kv0", "sum_k0", "misfit0", "last_x0"}, more, corpus_,
                               [this](const std::string& name) { return path(name); }};
  EXPECT_EQ(edits.resumed_steps(), 2U);
  edits.expect_bad("missing.ckpt", {"sum_kv0"}, [](const std::string& k, torch::Tensor&) { return k != "sum_kv0"; });
  edits.expect_bad("shape.ckpt", {"sum_k0", "has shape"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "sum_k0") t = t.narrow(-1, 0, 3).contiguous();
    return true;
  });
  edits.expect_bad("negative.ckpt", {"misfit0", "negative"}, [](const std::string& k, torch::Tensor& t) {
    if (k == "misfit0") t = -t - 1.0;
    return true;
  });
}

TEST_F(LanguageModelTest, ValidateNamesTheField) {
  EXPECT_NO_THROW(validate(TrainOptions{}));
  const auto expect_field = [](const std::string& field, auto change) {
    TrainOptions o;
    change(o);
    expect_throw_with<ValueError>([&] { validate(o); }, {field});
  };
  expect_field("d_model", [](TrainOptions& o) {
    o.model.d_model = 30;
    o.model.n_head = 4;
  });
  expect_field("head_dim", [](TrainOptions& o) {
    o.model.d_model = 6;
    o.model.n_head = 2;
  });
  expect_field("d_model", [](TrainOptions& o) { o.model.d_model = 0; });
  expect_field("n_layer", [](TrainOptions& o) { o.model.n_layer = 0; });
  expect_field("n_head", [](TrainOptions& o) { o.model.n_head = -1; });
  expect_field("window", [](TrainOptions& o) { o.model.window = 0; });
  expect_field("vocab", [](TrainOptions& o) { o.model.vocab = 0; });
  expect_field("batch", [](TrainOptions& o) { o.batch = 0; });
  expect_field("chunk", [](TrainOptions& o) { o.chunk = 0; });
  expect_field("steps", [](TrainOptions& o) { o.steps = 0; });
  expect_field("detach_horizon", [](TrainOptions& o) { o.detach_horizon = 0; });
  expect_field("threads", [](TrainOptions& o) { o.threads = 0; });
  expect_field("checkpoint_every", [](TrainOptions& o) { o.checkpoint_every = -1; });
  expect_field("eval_every", [](TrainOptions& o) { o.eval_every = -1; });
  expect_field("lr", [](TrainOptions& o) { o.lr = 0.0; });
  expect_field("lr", [](TrainOptions& o) { o.lr = std::numeric_limits<double>::infinity(); });
  expect_field("min_lr_ratio", [](TrainOptions& o) { o.min_lr_ratio = 1.5; });
  expect_field("weight_decay", [](TrainOptions& o) { o.weight_decay = -1.0; });
  expect_field("clip", [](TrainOptions& o) { o.clip = std::numeric_limits<double>::quiet_NaN(); });
  expect_field("max_clusters", [](TrainOptions& o) { o.model.max_clusters = 0; });
  expect_field("sketch_rows", [](TrainOptions& o) { o.model.sketch_rows = 5; });
  expect_field("sketch_dim", [](TrainOptions& o) { o.model.sketch_dim = 0; });
  expect_field("sketch_degree", [](TrainOptions& o) { o.model.sketch_degree = 0; });
  expect_field("birth_threshold", [](TrainOptions& o) {
    o.model.birth_threshold = std::numeric_limits<double>::infinity();
  });
  expect_field("merge_threshold", [](TrainOptions& o) {
    o.model.merge_threshold = std::numeric_limits<double>::quiet_NaN();
  });
  TrainOptions full;  // the window is ignored by full attention
  full.model.mechanism = Mechanism::kFull;
  full.model.window = 0;
  EXPECT_NO_THROW(validate(full));
  EXPECT_EQ(parse_mechanism("full"), Mechanism::kFull);
  EXPECT_EQ(mechanism_name(parse_mechanism("window")), "window");
  EXPECT_EQ(parse_mechanism("moment-closure"), Mechanism::kMomentClosure);
  EXPECT_EQ(mechanism_name(Mechanism::kMomentClosure), "moment-closure");
  EXPECT_EQ(mechanism_name(parse_mechanism("linear")), "linear");
  EXPECT_EQ(mechanism_name(parse_mechanism("frequent-directions")), "frequent-directions");
  EXPECT_EQ(mechanism_name(parse_mechanism("tensor-sketch")), "tensor-sketch");
  TrainOptions linear = full;  // and by linear attention
  linear.model.mechanism = Mechanism::kLinear;
  EXPECT_NO_THROW(validate(linear));
  EXPECT_EQ(parse_schedule("constant"), Schedule::kConstant);
  EXPECT_EQ(schedule_name(parse_schedule("cosine")), "cosine");
  expect_throw_with<ValueError>([] { (void)parse_mechanism("mixture"); }, {"mixture"});
  expect_throw_with<ValueError>([] { (void)parse_schedule("linear"); }, {"linear"});
}

}  // namespace
}  // namespace attnmix::stream
