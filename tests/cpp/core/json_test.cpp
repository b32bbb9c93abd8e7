// SPDX-License-Identifier: Apache-2.0
// Model files (SPEC.md §1.10, acceptance F-7): save → load is bit-identical and always validates;
// the writer is atomic; every documented content error names the file and the field.
#include "attnmix/core/json.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stats/mixture.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// A fresh, empty directory under the system temp directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            (std::string("attnmix_json_test_") + info->name() + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  [[nodiscard]] std::string file(const std::string& name) const { return (path_ / name).string(); }
  [[nodiscard]] std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(path_))
      names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  fs::path path_;
};

/// Random parameters with awkward doubles (many digits, tiny and huge magnitudes) so that round
/// trips are tested on values that need all 17 significant digits.
ResponsibilityAttentionParams random_params(Rng& rng, Index S, Index N, Index D, Index T,
                                            std::string name = {}) {
  ResponsibilityAttentionParams p;
  p.key_means.resize(S, D);
  for (Index k = 0; k < p.key_means.size(); ++k)
    p.key_means.data()[k] = rng.normal() * std::pow(10.0, rng.normal() * 3);
  p.key_means(0, 0) = std::numeric_limits<double>::denorm_min();
  if (D > 1) p.key_means(0, 1) = -0.0;
  p.emission.resize(S, T);
  for (Index s = 0; s < S; ++s) {
    for (Index t = 0; t < T; ++t) p.emission(s, t) = rng.exponential();
    p.emission.row(s) /= p.emission.row(s).sum();
  }
  p.position_prior = Vector::Constant(N, 1.0 / static_cast<double>(N));
  p.sigma2 = 0.1 + rng.uniform();
  p.name = std::move(name);
  return p;
}

bool bit_identical(const Matrix& a, const Matrix& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * static_cast<size_t>(a.size())) == 0;
}
bool bit_identical(const Vector& a, const Vector& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * static_cast<size_t>(a.size())) == 0;
}
void expect_ra_identical(const ResponsibilityAttention& a, const ResponsibilityAttention& b) {
  EXPECT_TRUE(bit_identical(a.params().key_means, b.params().key_means));
  EXPECT_TRUE(bit_identical(a.params().emission, b.params().emission));
  EXPECT_TRUE(bit_identical(a.params().position_prior, b.params().position_prior));
  EXPECT_EQ(std::memcmp(&a.params().sigma2, &b.params().sigma2, sizeof(double)), 0);
  EXPECT_EQ(a.params().name, b.params().name);
}

/// The document of a valid RA model, for the error cases to break.
json valid_ra_document() {
  Rng rng(testing::test_seed(11));
  return model_to_json(AnyDistribution(ResponsibilityAttention(random_params(rng, 4, 3, 2, 5))));
}

/// Expects model_from_json(doc) to throw ValueError whose message contains every fragment.
void expect_load_error(const json& doc, std::initializer_list<std::string> fragments) {
  try {
    (void)model_from_json(doc, "model.json");
    ADD_FAILURE() << "no error for " << doc.dump();
  } catch (const ValueError& e) {
    for (const std::string& f : fragments)
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

/// F-7: save → load is bit-identical for responsibility attention (awkward doubles, a name).
TEST(ModelJsonTest, ResponsibilityAttentionRoundTripIsBitIdentical) {
  Rng rng(testing::test_seed(1));
  const TempDir dir;
  for (int trial = 0; trial < 5; ++trial) {
    const ResponsibilityAttention model(
        random_params(rng, 5, 4, 3, 6, trial % 2 ? "head \"A\"" : ""));
    save_model(AnyDistribution(model), dir.file("model.json"));
    const AnyDistribution loaded = load_model(dir.file("model.json"));
    ASSERT_EQ(loaded.family(), "responsibility_attention");
    ASSERT_NE(loaded.get_if<ResponsibilityAttention>(), nullptr);
    expect_ra_identical(model, *loaded.get_if<ResponsibilityAttention>());
  }
}

/// F-7: a mixture of two RA components round-trips bit-identically, weights and names included.
TEST(ModelJsonTest, MixtureRoundTripIsBitIdentical) {
  Rng rng(testing::test_seed(2));
  const ResponsibilityAttention a(random_params(rng, 4, 3, 2, 5, "first"));
  const ResponsibilityAttention b(random_params(rng, 4, 3, 2, 5));
  Vector w(2);
  w << 1.0 / 3.0, 2.0 / 3.0;
  const Mixture mixture({AnyDistribution(a), AnyDistribution(b)}, w, "pair");
  const TempDir dir;
  save_model(AnyDistribution(mixture), dir.file("mix.json"));
  const AnyDistribution loaded = load_model(dir.file("mix.json"));
  const Mixture* m = loaded.get_if<Mixture>();
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name(), "pair");
  EXPECT_TRUE(bit_identical(m->weights(), w));
  ASSERT_EQ(m->components().size(), 2U);
  expect_ra_identical(a, *m->components()[0].get_if<ResponsibilityAttention>());
  expect_ra_identical(b, *m->components()[1].get_if<ResponsibilityAttention>());
  // Components are model objects without "format".
  const json doc = model_to_json(AnyDistribution(mixture));
  EXPECT_FALSE(doc["params"]["components"][0].contains("format"));
  EXPECT_EQ(doc["params"]["components"][0]["family"], "responsibility_attention");
}

/// The document has the documented top-level layout.
TEST(ModelJsonTest, DocumentHasDocumentedFields) {
  const json doc = valid_ra_document();
  EXPECT_EQ(doc["format"], "attnmix-model");
  EXPECT_EQ(doc["schema_version"], 1);
  EXPECT_EQ(doc["family"], "responsibility_attention");
  EXPECT_EQ(doc["params"]["key_means"].size(), 4U);
  EXPECT_EQ(doc["params"]["emission"][0].size(), 5U);
  EXPECT_EQ(doc["params"]["position_prior"].size(), 3U);
  EXPECT_FALSE(doc.contains("name"));
}

/// Loading validates through the constructor: a non-simplex emission row is named with the file and
/// the field.
TEST(ModelJsonTest, NonSimplexEmissionIsRejected) {
  json doc = valid_ra_document();
  doc["params"]["emission"][3][0] = doc["params"]["emission"][3][0].get<double>() + 0.25;
  expect_load_error(doc, {"model.json: params.emission", "row 3", "must sum to 1"});
}

TEST(ModelJsonTest, WrongSchemaVersionIsRejected) {
  json doc = valid_ra_document();
  doc["schema_version"] = 2;
  expect_load_error(doc, {"model.json: schema_version", "schema_version 1", "got 2"});
}

TEST(ModelJsonTest, WrongFormatAndFamilyAreRejected) {
  json doc = valid_ra_document();
  doc["format"] = "something-else";
  expect_load_error(doc, {"model.json: format", "attnmix-model"});
  doc = valid_ra_document();
  doc.erase("format");
  expect_load_error(doc, {"model.json", "missing field 'format'"});
  doc = valid_ra_document();
  doc["family"] = "banana";
  expect_load_error(doc, {"model.json: family", "unknown family 'banana'"});
  doc["family"] = "variational_embedding_attention";
  expect_load_error(doc, {"model.json: family", "not available in this build"});
}

TEST(ModelJsonTest, MissingFieldIsNamed) {
  json doc = valid_ra_document();
  doc["params"].erase("position_prior");
  expect_load_error(doc, {"model.json: params", "missing field 'position_prior'"});
  doc = valid_ra_document();
  doc.erase("params");
  expect_load_error(doc, {"model.json", "missing field 'params'"});
}

TEST(ModelJsonTest, NonNumericRaggedAndUnknownEntriesAreNamed) {
  json doc = valid_ra_document();
  doc["params"]["key_means"][1][0] = "x";
  expect_load_error(doc, {"model.json: params.key_means", "entry [1, 0] must be a number"});
  doc = valid_ra_document();
  doc["params"]["key_means"][2].push_back(1.0);
  expect_load_error(doc, {"model.json: params.key_means", "row 2 has 3 entries", "rectangular"});
  doc = valid_ra_document();
  doc["params"]["sigma2"] = true;
  expect_load_error(doc, {"model.json: params.sigma2", "must be a number"});
  doc = valid_ra_document();
  doc["params"]["sigma2"] = -1.0;
  expect_load_error(doc, {"model.json: params.sigma2", "positive"});
  doc = valid_ra_document();
  doc["params"]["sigma"] = 1.0;
  expect_load_error(doc, {"model.json: params", "unknown field 'sigma'"});
}

TEST(ModelJsonTest, MixtureComponentErrorsNameTheirPath) {
  Rng rng(testing::test_seed(3));
  const ResponsibilityAttention a(random_params(rng, 3, 2, 2, 3));
  json doc = model_to_json(
      AnyDistribution(Mixture({AnyDistribution(a), AnyDistribution(a)}, Vector::Constant(2, 0.5))));
  doc["params"]["components"][1]["params"]["emission"][0][0] = 7.0;
  expect_load_error(doc, {"model.json: params.components[1].params.emission", "row 0"});
  doc = model_to_json(
      AnyDistribution(Mixture({AnyDistribution(a), AnyDistribution(a)}, Vector::Constant(2, 0.5))));
  doc["params"]["w"][0] = 0.9;
  expect_load_error(doc, {"model.json: params.w", "sum to 1"});
}

TEST(ModelJsonTest, FileErrorsNameThePath) {
  const TempDir dir;
  EXPECT_THROW((void)load_model(dir.file("missing.json")), std::runtime_error);
  std::ofstream(dir.file("broken.json")) << "{\"format\": ";
  try {
    (void)load_model(dir.file("broken.json"));
    ADD_FAILURE() << "malformed JSON accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("broken.json"), std::string::npos) << e.what();
  }
}

/// The writer leaves only the model file; a failed write leaves no temporary file and keeps the old
/// model.
TEST(ModelJsonTest, AtomicWriteLeavesNoTemporaryFiles) {
  Rng rng(testing::test_seed(4));
  const TempDir dir;
  const AnyDistribution model(ResponsibilityAttention(random_params(rng, 3, 2, 2, 3)));
  save_model(model, dir.file("model.json"));
  save_model(model, dir.file("model.json"));  // overwriting an existing model
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"model.json"});

  // A failing write (the target is a directory) throws, leaves no temporary file and keeps what was
  // there.
  std::filesystem::create_directory(dir.file("taken"));
  EXPECT_THROW(save_model(model, dir.file("taken")), std::runtime_error);
  EXPECT_THROW(save_model(model, dir.file("no/such/dir/model.json")), std::runtime_error);
  EXPECT_EQ(dir.listing(), (std::vector<std::string>{"model.json", "taken"}));
}

/// nlohmann's number output reads back to the same bits for every double (the 17-significant-digit
/// promise).
TEST(ModelJsonTest, DoublesRoundTripThroughText) {
  Rng rng(testing::test_seed(5));
  for (int i = 0; i < 20000; ++i) {
    double x = 0.0;
    const uint64_t bits = rng.next_u64();
    std::memcpy(&x, &bits, sizeof x);
    if (!std::isfinite(x)) continue;
    const double back = json::parse(json(x).dump()).get<double>();
    ASSERT_EQ(std::memcmp(&x, &back, sizeof x), 0) << json(x).dump();
  }
}

}  // namespace
}  // namespace attnmix
