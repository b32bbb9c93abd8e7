// SPDX-License-Identifier: Apache-2.0
// Integrity of LM checkpoints (src/stream/language_model.cpp, open_checkpoint and the restore functions): a
// checkpoint is a torch archive (a zip file of stored members) and torch's reader does not verify the CRC-32 of a
// member, so a flipped bit in a tensor used to load as a wrong weight; and a NaN or infinite weight loaded and made
// `lm eval` print "-nan nats per byte" and `lm generate` print arbitrary bytes with exit code 0. Both must be errors
// naming the file and the member or tensor, from the library (std::runtime_error) and from `attnmix lm` (exit 2).
// The damaged checkpoints are made here from a freshly trained tiny one: bytes changed inside a member, with or
// without the CRC-32 fields updated to match (a small walk of the zip's central directory).
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/language_model.hpp"
#include "testing/all_close.hpp"
#ifdef ATTNMIX_CLI
#include "testing/cli_fixture.hpp"
#endif

namespace attnmix::stream {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

uint32_t get16(const std::string& b, size_t at) {
  return static_cast<uint32_t>(static_cast<unsigned char>(b[at])) |
         static_cast<uint32_t>(static_cast<unsigned char>(b[at + 1])) << 8;
}
uint32_t get32(const std::string& b, size_t at) { return get16(b, at) | get16(b, at + 2) << 16; }
void set32(std::string& b, size_t at, uint32_t v) {
  for (int k = 0; k < 4; ++k) b[at + static_cast<size_t>(k)] = static_cast<char>((v >> (8 * k)) & 0xFF);
}

/// CRC-32 of the zip format, bit by bit (the test's own oracle).
uint32_t crc32_of(const char* data, size_t n) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    crc ^= static_cast<unsigned char>(data[i]);
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

/// One member of a zip archive: its name, where its data lies, and where its two CRC fields are.
struct Member {
  std::string name;
  size_t data = 0;  // offset of the data (stored members: the bytes themselves)
  size_t size = 0;
  uint32_t method = 0;
  size_t local_crc = 0;       // offset of the CRC-32 field in the local header (0 there under a data descriptor)
  size_t central_crc = 0;     // … in the central directory
  size_t descriptor_crc = 0;  // … in the data descriptor after the data (torch writes one), or 0 without one
};

/// The members listed by the central directory (no zip64: the tiny checkpoints are a few kB).
std::vector<Member> members_of(const std::string& zip) {
  const size_t end = zip.rfind(std::string("PK\x05\x06", 4));
  EXPECT_NE(end, std::string::npos) << "no end-of-central-directory record";
  if (end == std::string::npos) return {};
  const uint32_t n = get16(zip, end + 10);
  size_t at = get32(zip, end + 16);
  std::vector<Member> out;
  for (uint32_t i = 0; i < n; ++i) {
    Member m;
    m.method = get16(zip, at + 10);
    m.central_crc = at + 16;
    m.size = get32(zip, at + 20);
    const uint32_t name_len = get16(zip, at + 28), extra_len = get16(zip, at + 30), comment_len = get16(zip, at + 32);
    const size_t local = get32(zip, at + 42);
    m.name = zip.substr(at + 46, name_len);
    m.local_crc = local + 14;
    m.data = local + 30 + get16(zip, local + 26) + get16(zip, local + 28);
    if (get16(zip, local + 6) & 0x08) {  // general-purpose flag bit 3: a data descriptor, optionally signed
      const size_t after = m.data + m.size;
      m.descriptor_crc = zip.compare(after, 4, std::string("PK\x07\x08", 4)) == 0 ? after + 4 : after;
    }
    out.push_back(m);
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

/// The members holding tensor data (".../data/<n>"): float32 storages for the window mechanism.
std::vector<Member> tensor_members(const std::string& zip) {
  std::vector<Member> out;
  for (const Member& m : members_of(zip))
    if (m.name.find("/data/") != std::string::npos && m.name.find(".pkl") == std::string::npos) out.push_back(m);
  return out;
}

/// Updates the member's CRC fields to match its (changed) data.
void with_crc_fixed(std::string& zip, const Member& m) {
  const uint32_t crc = crc32_of(zip.data() + m.data, m.size);
  if (m.descriptor_crc) {
    set32(zip, m.descriptor_crc, crc);  // the local header's field stays 0, as the writer left it
  } else {
    set32(zip, m.local_crc, crc);
  }
  set32(zip, m.central_crc, crc);
}

/// Writes `value` over float k of the member's data (k = npos: over every float of it, since a tensor may view only
/// part of its storage, e.g. a cache narrowed to the window) and, with fix_crc, updates the CRC fields to match.
std::string with_float(std::string zip, const Member& m, size_t k, float value, bool fix_crc) {
  EXPECT_EQ(m.method, 0U) << m.name << " is not stored";
  const size_t first = k == std::string::npos ? 0 : k;
  const size_t last = k == std::string::npos ? m.size / 4 : k + 1;
  EXPECT_GE(m.size, 4 * last) << m.name;
  for (size_t j = first; j < last; ++j) std::memcpy(zip.data() + m.data + 4 * j, &value, sizeof value);
  if (fix_crc) with_crc_fixed(zip, m);
  return zip;
}

std::vector<int64_t> make_corpus(size_t n_bytes, uint64_t seed) {
  static const std::vector<std::string> words{"the", "model", "reads", "a", "stream", "of", "bytes", "and"};
  Rng rng(seed);
  std::string text;
  while (text.size() < n_bytes) {
    text += words[rng.uniform_int(words.size())];
    text += rng.uniform_int(6) == 0 ? ". " : " ";
  }
  text.resize(n_bytes);
  return byte_tokens(text);
}

TrainOptions tiny_options() {
  TrainOptions o;
  o.model.d_model = 8;
  o.model.n_layer = 1;
  o.model.n_head = 2;
  o.model.window = 8;
  o.batch = 2;
  o.chunk = 8;
  o.steps = 4;
  o.lr = 1e-2;
  o.seed = 3;
  return o;
}

/// Expects `f` to throw std::runtime_error with every fragment in its message.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    for (const auto& fragment : fragments)
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << fragment;
  }
}

class CheckpointIntegrityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("attnmix_ckpt_integrity_" + std::string(info->name()) + "_" +
                                        std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    corpus_ = make_corpus(1200, testing::test_seed(41));
    good_ = path("good.ckpt");
    train(tiny_options(), corpus_, "", good_);
    bytes_ = read_file(good_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  [[nodiscard]] std::string path(const std::string& name) const { return (dir_ / name).string(); }
  /// Every way the library opens a checkpoint: evaluate, generate, read_checkpoint_info and resuming.
  void expect_every_reader_fails(const std::string& file, const std::vector<std::string>& fragments) {
    std::vector<std::string> all{file, "not a usable attnmix LM checkpoint"};
    all.insert(all.end(), fragments.begin(), fragments.end());
    const std::vector<int64_t> prompt{116, 104, 101};
    GenerateOptions g;
    g.tokens = 5;
    TrainOptions more = tiny_options();
    more.steps = 6;
    SCOPED_TRACE(file);
    expect_error([&] { (void)evaluate(file, corpus_, 8, 1); }, all);
    expect_error([&] { (void)generate(file, prompt, g); }, all);
    expect_error([&] { (void)train(more, corpus_, file, ""); }, all);
  }

  fs::path dir_;
  std::vector<int64_t> corpus_;
  std::string good_;
  std::string bytes_;
};

TEST_F(CheckpointIntegrityTest, TheUndamagedCheckpointLoadsAndItsTensorsAreStoredMembers) {
  const std::vector<Member> tensors = tensor_members(bytes_);
  ASSERT_FALSE(tensors.empty());
  for (const Member& m : tensors) EXPECT_EQ(m.method, 0U) << m.name;
  const Evaluation e = evaluate(good_, corpus_, 8, 1);
  EXPECT_TRUE(std::isfinite(e.mean_cross_entropy));
  // Writing the same value back and recomputing the CRC gives a checkpoint that still loads (the writer is right).
  float first = 0.0f;
  std::memcpy(&first, bytes_.data() + tensors[0].data, sizeof first);
  write_file(path("same.ckpt"), with_float(bytes_, tensors[0], 0, first, true));
  EXPECT_EQ(evaluate(path("same.ckpt"), corpus_, 8, 1).mean_cross_entropy, e.mean_cross_entropy);
}

TEST_F(CheckpointIntegrityTest, AFlippedByteInAnyStoredMemberIsACrcMismatch) {
  // One flipped bit in the data of each member in turn (tensors, the pickled records, the meta text), CRC unchanged.
  const std::vector<Member> all = members_of(bytes_);
  ASSERT_GE(all.size(), 3U);
  int checked = 0;
  for (const Member& m : all) {
    if (m.size == 0 || m.method != 0) continue;
    std::string damaged = bytes_;
    const size_t at = m.data + m.size / 2;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x10);
    const std::string file = path("flipped" + std::to_string(checked++) + ".ckpt");
    write_file(file, damaged);
    expect_every_reader_fails(file, {"member '" + m.name + "'", "CRC-32 mismatch"});
    expect_error([&] { (void)read_checkpoint_info(file); }, {file, "CRC-32 mismatch"});
  }
  EXPECT_GE(checked, 3);
}

TEST_F(CheckpointIntegrityTest, ADamagedTorchScriptMemberIsABadCheckpoint) {
  // The archive's code/*.py members describe the module types; with a type name changed (and the CRC updated),
  // libtorch's TorchScript parser throws torch::jit::ErrorReport, which is not a c10::Error (found by fuzzing).
  std::string damaged = bytes_;
  int changed = 0;
  for (const Member& m : members_of(bytes_)) {
    if (m.method != 0 || m.name.find("/code/") == std::string::npos || m.name.rfind(".py") != m.name.size() - 3) {
      continue;
    }
    for (size_t at = damaged.find("Module", m.data); at != std::string::npos && at + 6 <= m.data + m.size;
         at = damaged.find("Module", at + 6)) {
      damaged[at] = 'X';
      ++changed;
    }
    with_crc_fixed(damaged, m);
  }
  ASSERT_GT(changed, 0);
  write_file(path("script.ckpt"), damaged);
  expect_every_reader_fails(path("script.ckpt"), {});
}

TEST_F(CheckpointIntegrityTest, NonFiniteWeightsAreRejectedNamingTheTensor) {
  // NaN, +inf and -inf in each tensor storage in turn (the model's parameters, the optimizer's moments, the carried
  // caches), with the CRC updated: a structurally sound checkpoint whose values are not.
  const std::vector<Member> tensors = tensor_members(bytes_);
  ASSERT_FALSE(tensors.empty());
  const float values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  int model_parameters = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::string file = path("nonfinite" + std::to_string(t) + ".ckpt");
    write_file(file, with_float(bytes_, tensors[t], std::string::npos, values[t % 3], true));
    // Resuming restores every tensor, so every storage is named; evaluation restores only the model.
    TrainOptions more = tiny_options();
    more.steps = 6;
    std::string message;
    try {
      (void)train(more, corpus_, file, "");
      ADD_FAILURE() << tensors[t].name << ": a non-finite value was accepted";
    } catch (const std::runtime_error& e) {
      message = e.what();
    }
    SCOPED_TRACE(tensors[t].name + ": " + message);
    EXPECT_NE(message.find(file + ": not a usable attnmix LM checkpoint: "), std::string::npos);
    EXPECT_NE(message.find("has a non-finite value"), std::string::npos);
    if (message.find("model parameter '") != std::string::npos) {
      ++model_parameters;
      expect_error([&] { (void)evaluate(file, corpus_, 8, 1); }, {file, "model parameter '", "has a non-finite value"});
      GenerateOptions g;
      g.tokens = 5;
      expect_error([&] { (void)generate(file, std::vector<int64_t>{116, 104}, g); },
                   {file, "model parameter '", "has a non-finite value"});
    }
  }
  EXPECT_GT(model_parameters, 0);
}

TEST_F(CheckpointIntegrityTest, ANanParameterIsNamed) {
  // A checkpoint written through torch with one NaN in a named parameter: the message names that parameter.
  c10::IValue meta;
  torch::serialize::InputArchive in;
  in.load_from(good_);
  in.read("meta", meta);
  SpineOptions spine;
  spine.d_model = 8;
  spine.n_layer = 1;
  spine.n_head = 2;
  spine.window = 8;
  SlidingWindowSpine model(spine);
  torch::serialize::InputArchive params;
  in.read("model", params);
  model->load(params);
  const auto named = model->named_parameters();
  ASSERT_GT(named.size(), 1U);
  const std::string name = named.keys().back();
  {
    torch::NoGradGuard no_grad;
    named[name].view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
  }
  torch::serialize::OutputArchive root;
  root.write("meta", meta);
  torch::serialize::OutputArchive params_out;
  model->save(params_out);
  root.write("model", params_out);
  root.save_to(path("nan.ckpt"));
  expect_error([&] { (void)evaluate(path("nan.ckpt"), corpus_, 8, 1); },
               {path("nan.ckpt"), "model parameter '" + name + "' has a non-finite value (nan at flat index 0)"});
}

#ifdef ATTNMIX_CLI
/// `attnmix lm eval` and `lm generate` on the damaged checkpoints: exit code 2 and the message on stderr, nothing
/// on stdout (they printed "-nan nats per byte" and 0xFF bytes with exit code 0).
class CheckpointIntegrityCliTest : public testing::CliFixture {};

TEST_F(CheckpointIntegrityCliTest, DamagedCheckpointsExitTwoWithTheReason) {
  std::string text;
  for (const int64_t t : make_corpus(1500, 5)) text += static_cast<char>(t);
  write("text.txt", text);
  const auto trained = run("lm train --text text.txt --d-model 8 --n-layer 1 --n-head 2 --window 8 --batch 2 "
                           "--chunk 16 --lr 0.01 --seed 2 --steps 3 --out m.ckpt");
  ASSERT_EQ(trained.code, 0) << trained.err;
  const std::string bytes = read_file(path("m.ckpt"));
  const std::vector<Member> tensors = tensor_members(bytes);
  ASSERT_FALSE(tensors.empty());
  std::string flipped = bytes;
  flipped[tensors[0].data] = static_cast<char>(flipped[tensors[0].data] ^ 0x01);
  write("flipped.ckpt", flipped);
  // NaN in a storage of a model parameter (the one the library names as such), CRC updated.
  bool found = false;
  for (const Member& m : tensors) {
    write("nan.ckpt", with_float(bytes, m, 0, std::numeric_limits<float>::quiet_NaN(), true));
    try {
      (void)evaluate(path("nan.ckpt"), std::vector<int64_t>{116, 104, 101}, 8, 1);
    } catch (const std::runtime_error& e) {
      found = std::string(e.what()).find("model parameter '") != std::string::npos;
    }
    if (found) break;
  }
  ASSERT_TRUE(found) << "no tensor storage is reported as a model parameter";
  for (const auto& [file, why] : {std::pair<std::string, std::string>{"flipped.ckpt", "CRC-32 mismatch"},
                                  std::pair<std::string, std::string>{"nan.ckpt", "has a non-finite value"}}) {
    for (const std::string& command : {"lm eval --checkpoint " + file + " --text text.txt",
                                       "lm generate --checkpoint " + file + " --prompt 'the ' --tokens 5"}) {
      SCOPED_TRACE(command);
      const auto r = run(command);
      EXPECT_EQ(r.code, 2) << r.out << r.err;
      EXPECT_TRUE(testing::contains(r.err, file)) << r.err;
      EXPECT_TRUE(testing::contains(r.err, why)) << r.err;
      EXPECT_TRUE(r.out.empty()) << r.out;
    }
  }
}
#endif

}  // namespace
}  // namespace attnmix::stream
