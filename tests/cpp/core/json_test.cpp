// SPDX-License-Identifier: Apache-2.0
// Model files (docs/model-format.md, acceptance F-7): save → load is bit-identical and always validates;
// the writer is atomic; every documented content error names the file and the field.
#include "attnmix/io/model_file.hpp"

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

#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/family/spec.hpp"
#include "attnmix/stats/categorical.hpp"
#include "attnmix/stats/composite.hpp"
#include "attnmix/stats/gaussian.hpp"
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

/// The classical leaves and the composite have model files too: a composite of a categorical and a diagonal Gaussian
/// (awkward doubles, names), inside a mixture, round-trips bit for bit, and each object names its family.
TEST(ModelJsonTest, CategoricalGaussianAndCompositeRoundTripIsBitIdentical) {
  Rng rng(testing::test_seed(3));
  const auto composite = [&](const std::string& name) {
    Vector p(3), mu(2), sigma2(2);
    for (Index k = 0; k < 3; ++k) p[k] = 0.1 + rng.uniform();
    p /= p.sum();
    for (Index d = 0; d < 2; ++d) {
      mu[d] = rng.normal() * 1e3;
      sigma2[d] = 1e-3 + rng.uniform();
    }
    return AnyDistribution(Composite({AnyDistribution(Categorical({p, "colour"})),
                                      AnyDistribution(DiagonalGaussian({mu, sigma2, ""}))},
                                     name));
  };
  Vector w(2);
  w << 0.3, 0.7;
  const AnyDistribution mixture(Mixture({composite("a"), composite("")}, w, "two"));
  const TempDir dir;
  save_model(mixture, dir.file("m.json"));
  const AnyDistribution loaded = load_model(dir.file("m.json"));
  EXPECT_EQ(model_to_json(loaded), model_to_json(mixture));
  const auto& parts = loaded.get_if<Mixture>()->components();
  const auto& original = mixture.get_if<Mixture>()->components();
  for (size_t k = 0; k < 2; ++k) {
    const auto& fields = parts[k].get_if<Composite>()->components();
    const auto& expected = original[k].get_if<Composite>()->components();
    EXPECT_TRUE(bit_identical(fields[0].get_if<Categorical>()->params().p,
                              expected[0].get_if<Categorical>()->params().p));
    EXPECT_EQ(fields[0].get_if<Categorical>()->params().name, "colour");
    EXPECT_TRUE(bit_identical(fields[1].get_if<DiagonalGaussian>()->params().mu,
                              expected[1].get_if<DiagonalGaussian>()->params().mu));
    EXPECT_TRUE(bit_identical(fields[1].get_if<DiagonalGaussian>()->params().sigma2,
                              expected[1].get_if<DiagonalGaussian>()->params().sigma2));
  }
  EXPECT_EQ(parts[0].get_if<Composite>()->name(), "a");
  const json doc = model_to_json(mixture);
  EXPECT_EQ(doc["params"]["components"][0]["family"], "composite");
  EXPECT_EQ(doc["params"]["components"][0]["params"]["components"][1]["family"], "diagonal_gaussian");
  // Loading validates through the constructors.
  json bad = doc;
  bad["params"]["components"][1]["params"]["components"][0]["params"]["p"][0] = 5.0;
  expect_load_error(bad, {"model.json: params.components[1].params.components[0].params", "p"});
  bad = doc;
  bad["params"]["components"][0]["params"]["components"][1]["params"]["sigma2"][1] = -1.0;
  expect_load_error(bad, {"params.components[0].params.components[1].params", "sigma2"});
}

/// Every registered family has a model-file codec and is found by its file name; spec_of names a model's family.
TEST(ModelJsonTest, EveryRegisteredFamilyIsFoundByItsFileName) {
  std::vector<std::string_view> names;
  for (const FamilySpec* spec : families()) {
    EXPECT_EQ(family_of_file(spec->file_family), spec);
    EXPECT_NE(spec->codec.from_json, nullptr);
    names.push_back(spec->name);
  }
  EXPECT_EQ(names, (std::vector<std::string_view>{"responsibility", "chained", "variational", "variational-multihop",
                                                  "sparse-responsibility", "mixture", "categorical", "gaussian",
                                                  "composite"}));
  EXPECT_EQ(family_of_file("banana"), nullptr);
  Rng rng(testing::test_seed(4));
  EXPECT_EQ(spec_of(AnyDistribution(ResponsibilityAttention(random_params(rng, 2, 2, 2, 2)))).name, "responsibility");
  EXPECT_THROW(static_cast<void>(spec_of(AnyDistribution())), ValueError);
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
  doc["schema_version"] = 3;
  expect_load_error(doc, {"model.json: schema_version", "schema_version 1 to 2", "got 3"});
  doc["schema_version"] = 0;
  expect_load_error(doc, {"model.json: schema_version", "got 0"});
}

/// A model like a text corpus's: S × S keys and S × T emission whose cells are mostly their row's default (zero keys,
/// the smoothed emission ε / (row total + T ε) of unseen targets), with awkward doubles among the rest.
ResponsibilityAttentionParams text_like_params(Rng& rng, Index S, Index T) {
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Zero(S, S);
  p.emission.resize(S, T);
  const double epsilon = 1e-6;
  for (Index s = 0; s < S; ++s) {
    Vector counts = Vector::Zero(T);
    for (int k = 0; k < 3; ++k) {
      p.key_means(s, static_cast<Index>(rng.uniform_int(static_cast<uint64_t>(S)))) = rng.normal();
      counts[static_cast<Index>(rng.uniform_int(static_cast<uint64_t>(T)))] += rng.exponential();
    }
    p.emission.row(s) = (counts.array() + epsilon) / (counts.sum() + static_cast<double>(T) * epsilon);
  }
  p.key_means(0, 1) = -0.0;  // not the default 0.0: written out
  p.key_means(1, 2) = std::numeric_limits<double>::denorm_min();
  p.position_prior = Vector::Constant(3, 1.0 / 3.0);
  return p;
}

/// Large tables whose cells are mostly their row's default go into the sparse-rows layout (schema version 2) and
/// read back bit for bit; a dense table of the same size, and a small mostly-zero one, stay lists of rows (version 1).
TEST(ModelJsonTest, MostlyDefaultTablesAreWrittenSparseAndReadBackBitForBit) {
  Rng rng(testing::test_seed(21));
  const ResponsibilityAttention text(text_like_params(rng, 80, 70));
  const json doc = model_to_json(AnyDistribution(text));
  EXPECT_EQ(doc["schema_version"], 2);
  for (const char* table : {"key_means", "emission"}) {
    ASSERT_TRUE(is_sparse_table(doc["params"][table])) << table;
    EXPECT_EQ(doc["params"][table]["layout"], "sparse_rows");
  }
  EXPECT_EQ(doc["params"]["key_means"]["columns"][0].size(), 4U);  // 3 draws (maybe repeated) and the −0.0
  const json& emission = doc["params"]["emission"];  // row 0: at most 3 observed targets, the rest its default
  EXPECT_LE(emission["columns"][0].size(), 3U);
  const auto& listed = emission["columns"][0];
  for (Index t = 0; t < 70; ++t) {
    if (std::find(listed.begin(), listed.end(), t) == listed.end()) {
      EXPECT_EQ(text.params().emission(0, t), emission["default"][0].get<double>());
    }
  }
  const AnyDistribution loaded = model_from_json(json::parse(format_model_json(doc)), "model.json");
  expect_ra_identical(*loaded.get_if<ResponsibilityAttention>(), text);
  EXPECT_LT(format_model_json(doc).size() * 5, format_model_json(json{{"k", matrix_to_json(text.params().key_means)},
                                                                         {"e", matrix_to_json(text.params().emission)}})
                                                     .size());

  const ResponsibilityAttention dense(random_params(rng, 80, 3, 80, 70));
  EXPECT_EQ(model_to_json(AnyDistribution(dense))["schema_version"], 1);
  EXPECT_TRUE(model_to_json(AnyDistribution(dense))["params"]["key_means"].is_array());
  ResponsibilityAttentionParams small = text_like_params(rng, 20, 20);  // 400 cells: readable lists of rows
  EXPECT_TRUE(table_to_json(small.key_means).is_array());
  EXPECT_TRUE(table_to_json(Matrix::Zero(64, 64)).is_object());
  EXPECT_TRUE(table_to_json(Matrix::Zero(64, 63)).is_array());  // 4032 cells, below the smallest sparse table
}

/// Every member of a sparse table is checked and named.
TEST(ModelJsonTest, SparseTableErrorsNameTheField) {
  Rng rng(testing::test_seed(22));
  const json valid = model_to_json(AnyDistribution(ResponsibilityAttention(text_like_params(rng, 70, 70))));
  const auto broken = [&](const auto& edit) {
    json doc = valid;
    edit(doc["params"]["key_means"]);
    return doc;
  };
  expect_load_error(broken([](json& t) { t["layout"] = "csr"; }),
                    {"model.json: params.key_means.layout", "must be \"sparse_rows\""});
  expect_load_error(broken([](json& t) { t["shape"] = {70}; }), {"params.key_means.shape", "[rows, columns]"});
  expect_load_error(broken([](json& t) { t["shape"] = {70, 0}; }), {"params.key_means.shape", "positive"});
  expect_load_error(broken([](json& t) { t["shape"] = {int64_t{1} << 20, int64_t{1} << 20}; }),
                    {"params.key_means.shape", "more than 134217728 cells"});
  expect_load_error(broken([](json& t) { t["shape"] = {70, 70 * 2000}; }),  // 9.8 million cells from ~280 numbers
                    {"params.key_means.shape", "at most 1024 cells per number"});
  expect_load_error(broken([](json& t) { t["default"].erase(0); }),
                    {"params.key_means.default", "one entry per row, 70"});
  expect_load_error(broken([](json& t) { t["values"][5].push_back(1.0); }),
                    {"params.key_means.values", "columns row 5"});
  expect_load_error(broken([](json& t) { t["columns"][0][0] = 70; }), {"params.key_means.columns", "below 70"});
  expect_load_error(broken([](json& t) {
                      t["columns"][0] = {3, 3};
                      t["values"][0] = {1.0, 2.0};
                    }),
                    {"params.key_means.columns", "increase"});
  expect_load_error(broken([](json& t) { t["extra"] = 1; }), {"params.key_means", "unknown field 'extra'"});
  expect_load_error(broken([](json& t) { t["values"][1] = {"x"}; }), {"params.key_means.values", "must be a number"});
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
  expect_load_error(doc, {"model.json: family", "unknown family 'banana'",
                          "variational_embedding_attention", "variational_multihop_attention"});
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
  expect_load_error(doc, {"model.json: params.sigma2", "must be a finite real >= 1e-100"});
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

// ----- variational families (docs/mechanisms.md#variational-embedding-attention and #variational-multi-hop-attention):
// the optimizer state beside params
// ---------------------------

/// A random matrix of awkward doubles (all 17 significant digits matter).
Matrix awkward_matrix(Rng& rng, Index rows, Index cols, double scale) {
  Matrix m(rows, cols);
  for (Index k = 0; k < m.size(); ++k)
    m.data()[k] = scale * rng.normal() * std::pow(10.0, rng.normal());
  return m;
}

/// A state after `iteration` Adam steps: random mean, log_var (in the clip range), moments (second
/// moments ≥ 0), a seed above 2^63 (it must survive as an unsigned integer).
AttentionOptimizerState random_state(Rng& rng, const std::string& family, Index S, Index D,
                                     int64_t iteration) {
  AttentionOptimizerState st;
  st.family = family;
  st.mean = awkward_matrix(rng, S, D, 1.0);
  st.log_var = Matrix(S, D);
  for (Index k = 0; k < st.log_var.size(); ++k) st.log_var.data()[k] = -8.0 + 10.0 * rng.uniform();
  st.mean_first_moment = awkward_matrix(rng, S, D, 0.1);
  st.mean_second_moment = awkward_matrix(rng, S, D, 0.01).cwiseAbs();
  st.log_var_first_moment = awkward_matrix(rng, S, D, 0.1);
  st.log_var_second_moment = awkward_matrix(rng, S, D, 0.01).cwiseAbs();
  st.mean_second_moment(0, 0) = std::numeric_limits<double>::denorm_min();
  st.mean_first_moment(0, 0) = -0.0;
  st.iteration = iteration;
  st.seed = (uint64_t{1} << 63) + rng.uniform_int(1000);
  return st;
}

Matrix random_emission(Rng& rng, Index S, Index T) {
  Matrix B(S, T);
  for (Index s = 0; s < S; ++s) {
    for (Index t = 0; t < T; ++t) B(s, t) = rng.exponential();
    B.row(s) /= B.row(s).sum();
  }
  return B;
}

VariationalEmbeddingAttention random_vea(Rng& rng, Index S, Index N, Index D, Index T,
                                         std::string name = {}) {
  VariationalEmbeddingAttentionParams p;
  p.optimizer_state = random_state(rng, VariationalEmbeddingAttention::kFamily, S, D, 37);
  p.mean = p.optimizer_state->mean;
  p.log_var = p.optimizer_state->log_var;
  p.emission = random_emission(rng, S, T);
  p.position_prior = Vector(N);
  for (Index i = 0; i < N; ++i) p.position_prior[i] = rng.exponential();
  p.position_prior /= p.position_prior.sum();
  p.sigma2 = 0.1 + rng.uniform();
  p.name = std::move(name);
  return VariationalEmbeddingAttention(std::move(p));
}

VariationalMultiHopAttention random_vmha(Rng& rng, Index S, Index D, Index T,
                                         std::string name = {}) {
  VariationalMultiHopAttentionParams p;
  p.optimizer_state = random_state(rng, VariationalMultiHopAttention::kFamily, S, D, 5);
  p.mean = p.optimizer_state->mean;
  p.log_var = p.optimizer_state->log_var;
  p.emission = random_emission(rng, S, T);
  p.sigma2 = 0.1 + rng.uniform();
  p.name = std::move(name);
  return VariationalMultiHopAttention(std::move(p));
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expect_vea_identical(const VariationalEmbeddingAttention& a,
                          const VariationalEmbeddingAttention& b) {
  EXPECT_TRUE(bit_identical(a.mean(), b.mean()));
  EXPECT_TRUE(bit_identical(a.log_var(), b.log_var()));
  EXPECT_TRUE(bit_identical(a.emission(), b.emission()));
  EXPECT_TRUE(bit_identical(a.position_prior(), b.position_prior()));
  EXPECT_TRUE(same_bits(a.sigma2(), b.sigma2()));
  EXPECT_EQ(a.params().name, b.params().name);
  // Every array bit for bit, iteration, seed and family (AttentionOptimizerState::operator==).
  EXPECT_TRUE(a.optimizer_state() == b.optimizer_state());
  EXPECT_EQ(b.optimizer_state().iteration, a.optimizer_state().iteration);
}

void expect_vmha_identical(const VariationalMultiHopAttention& a,
                           const VariationalMultiHopAttention& b) {
  EXPECT_TRUE(bit_identical(a.mean(), b.mean()));
  EXPECT_TRUE(bit_identical(a.log_var(), b.log_var()));
  EXPECT_TRUE(bit_identical(a.emission(), b.emission()));
  EXPECT_TRUE(same_bits(a.sigma2(), b.sigma2()));
  EXPECT_EQ(a.params().name, b.params().name);
  EXPECT_TRUE(a.optimizer_state() == b.optimizer_state());
}

json valid_vea_document() {
  Rng rng(testing::test_seed(21));
  return model_to_json(AnyDistribution(random_vea(rng, 5, 3, 2, 4)));
}

/// F-7, VEA-7: save → load of variational embedding attention is bit-identical, the Adam moments,
/// iteration and seed included.
TEST(ModelJsonTest, VariationalEmbeddingRoundTripIsBitIdentical) {
  Rng rng(testing::test_seed(22));
  const TempDir dir;
  for (int trial = 0; trial < 4; ++trial) {
    const VariationalEmbeddingAttention model =
        random_vea(rng, 6, 4, 3, 5, trial % 2 ? "tied" : "");
    save_model(AnyDistribution(model), dir.file("model.json"));
    const AnyDistribution loaded = load_model(dir.file("model.json"));
    ASSERT_EQ(loaded.family(), "variational_embedding_attention");
    ASSERT_NE(loaded.get_if<VariationalEmbeddingAttention>(), nullptr);
    expect_vea_identical(model, *loaded.get_if<VariationalEmbeddingAttention>());
    // The loaded model writes the same text (nothing is lost or reordered on the way).
    EXPECT_EQ(format_model_json(model_to_json(loaded)),
              format_model_json(model_to_json(AnyDistribution(model))));
  }
}

/// F-7 for variational multi-hop attention.
TEST(ModelJsonTest, VariationalMultiHopRoundTripIsBitIdentical) {
  Rng rng(testing::test_seed(23));
  const TempDir dir;
  for (int trial = 0; trial < 4; ++trial) {
    const VariationalMultiHopAttention model =
        random_vmha(rng, 7, 2, 3, trial % 2 ? "two hops" : "");
    save_model(AnyDistribution(model), dir.file("model.json"));
    const AnyDistribution loaded = load_model(dir.file("model.json"));
    ASSERT_EQ(loaded.family(), "variational_multihop_attention");
    ASSERT_NE(loaded.get_if<VariationalMultiHopAttention>(), nullptr);
    expect_vmha_identical(model, *loaded.get_if<VariationalMultiHopAttention>());
  }
}

/// Mixtures of variational components round-trip (each component keeps its own state).
TEST(ModelJsonTest, MixturesOfVariationalFamiliesRoundTrip) {
  Rng rng(testing::test_seed(24));
  const VariationalEmbeddingAttention a = random_vea(rng, 4, 3, 2, 3, "a");
  const VariationalEmbeddingAttention b = random_vea(rng, 4, 3, 2, 3);
  const VariationalMultiHopAttention c = random_vmha(rng, 4, 2, 3);
  const VariationalMultiHopAttention d = random_vmha(rng, 4, 2, 3, "d");
  const TempDir dir;
  save_model(AnyDistribution(Mixture({AnyDistribution(a), AnyDistribution(b)},
                                     Vector::Constant(2, 0.5), "vea")),
             dir.file("vea.json"));
  const AnyDistribution vea = load_model(dir.file("vea.json"));
  const Mixture* m = vea.get_if<Mixture>();
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->components().size(), 2U);
  expect_vea_identical(a, *m->components()[0].get_if<VariationalEmbeddingAttention>());
  expect_vea_identical(b, *m->components()[1].get_if<VariationalEmbeddingAttention>());
  save_model(
      AnyDistribution(Mixture({AnyDistribution(c), AnyDistribution(d)}, Vector::Constant(2, 0.5))),
      dir.file("vmha.json"));
  const AnyDistribution vmha = load_model(dir.file("vmha.json"));
  ASSERT_NE(vmha.get_if<Mixture>(), nullptr);
  expect_vmha_identical(
      c, *vmha.get_if<Mixture>()->components()[0].get_if<VariationalMultiHopAttention>());
  expect_vmha_identical(
      d, *vmha.get_if<Mixture>()->components()[1].get_if<VariationalMultiHopAttention>());
  const json doc = model_to_json(vmha);
  EXPECT_TRUE(doc["params"]["components"][1].contains("optimizer_state"));
  EXPECT_FALSE(doc["params"]["components"][1]["params"].contains("optimizer_state"));
}

/// docs/model-format.md: the optimizer state sits beside params, in the form optimizer_state_to_json
/// writes; params hold the constructor's arguments.
TEST(ModelJsonTest, VariationalDocumentsHaveDocumentedFields) {
  Rng rng(testing::test_seed(25));
  const VariationalEmbeddingAttention model = random_vea(rng, 5, 3, 2, 4);
  const json doc = model_to_json(AnyDistribution(model));
  EXPECT_EQ(doc["family"], "variational_embedding_attention");
  std::vector<std::string> params;
  for (const auto& item : doc["params"].items()) params.push_back(item.key());
  std::sort(params.begin(), params.end());
  EXPECT_EQ(params,
            (std::vector<std::string>{"emission", "log_var", "mean", "position_prior", "sigma2"}));
  ASSERT_TRUE(doc.contains("optimizer_state"));
  EXPECT_EQ(doc["optimizer_state"], optimizer_state_to_json(model.optimizer_state()));
  EXPECT_EQ(doc["optimizer_state"]["algorithm"], "adam");
  EXPECT_EQ(doc["optimizer_state"]["schema_version"], 1);
  EXPECT_EQ(doc["optimizer_state"]["iteration"], 37);
  EXPECT_EQ(doc["optimizer_state"]["seed"].get<uint64_t>(), model.optimizer_state().seed);
  EXPECT_EQ(doc["optimizer_state"]["mean_second_moment"].size(), 5U);
  // The text layout puts the state after params.
  const std::string text = format_model_json(doc);
  EXPECT_LT(text.find("\"params\""), text.find("\"optimizer_state\""));

  const json mh = model_to_json(AnyDistribution(random_vmha(rng, 4, 2, 3)));
  params.clear();
  for (const auto& item : mh["params"].items()) params.push_back(item.key());
  std::sort(params.begin(), params.end());
  EXPECT_EQ(params, (std::vector<std::string>{"emission", "log_var", "mean", "sigma2"}));
  EXPECT_EQ(mh["optimizer_state"]["family"], "variational_multihop_attention");
}

/// A file without optimizer_state loads with the constructor's fresh state (iteration 0, seed 0,
/// zero moments); a family without state rejects the field.
TEST(ModelJsonTest, OptimizerStateIsOptionalForVariationalAndUnknownElsewhere) {
  json doc = valid_vea_document();
  doc.erase("optimizer_state");
  const AnyDistribution loaded = model_from_json(doc, "model.json");
  const auto& state = loaded.get_if<VariationalEmbeddingAttention>()->optimizer_state();
  EXPECT_EQ(state.iteration, 0);
  EXPECT_EQ(state.seed, 0U);
  EXPECT_TRUE(state.mean_first_moment.isZero(0.0));
  EXPECT_TRUE(bit_identical(state.mean, loaded.get_if<VariationalEmbeddingAttention>()->mean()));

  json ra = valid_ra_document();
  ra["optimizer_state"] = valid_vea_document()["optimizer_state"];
  expect_load_error(ra,
                    {"model.json", "unknown field 'optimizer_state'", "responsibility_attention"});
}

/// A tampered optimizer state is rejected, naming the file and the field
/// (docs/mechanisms.md#variational-embedding-attention).
TEST(ModelJsonTest, TamperedOptimizerStateIsRejected) {
  json doc = valid_vea_document();
  // One ulp off in the state's mean: no longer the params' mean bit for bit.
  double& x = doc["optimizer_state"]["mean"][2][1].get_ref<double&>();
  x = std::nextafter(x, 1e9);
  expect_load_error(doc, {"model.json: optimizer_state.mean", "bit for bit"});
  doc = valid_vea_document();
  doc["params"]["log_var"][0][0] = doc["params"]["log_var"][0][0].get<double>() + 1e-3;
  expect_load_error(doc, {"model.json: optimizer_state", "log_var", "bit for bit"});
  doc = valid_vea_document();
  doc["optimizer_state"]["family"] = "variational_multihop_attention";
  expect_load_error(
      doc, {"model.json: optimizer_state belongs to family 'variational_multihop_attention'"});
  doc = valid_vea_document();
  doc["optimizer_state"]["family"] = "banana";
  expect_load_error(doc, {"model.json: optimizer_state", "family", "banana"});
  doc = valid_vea_document();
  doc["optimizer_state"]["algorithm"] = "sgd";
  expect_load_error(doc, {"model.json: optimizer_state.algorithm", "sgd"});
  doc = valid_vea_document();
  doc["optimizer_state"]["schema_version"] = 2;
  expect_load_error(doc, {"model.json: optimizer_state.schema_version", "schema_version"});
  doc = valid_vea_document();
  doc["optimizer_state"].erase("iteration");
  expect_load_error(doc, {"model.json: optimizer_state", "missing field 'iteration'"});
  doc = valid_vea_document();
  doc["optimizer_state"]["iteration"] = -1;
  expect_load_error(doc, {"model.json: optimizer_state", "iteration must be >= 0"});
  doc = valid_vea_document();
  doc["optimizer_state"]["seed"] = -3;
  expect_load_error(doc, {"model.json: optimizer_state.seed", "non-negative"});
  doc = valid_vea_document();
  doc["optimizer_state"]["log_var_second_moment"][1].push_back(0.5);
  expect_load_error(doc, {"model.json: optimizer_state.log_var_second_moment", "row 1"});
  doc = valid_vea_document();
  doc["optimizer_state"]["mean_second_moment"][0][0] = -1.0;
  expect_load_error(doc, {"model.json: optimizer_state", "second moments must be >= 0"});
  doc = valid_vea_document();
  doc["optimizer_state"]["momentum"] = 0.9;
  expect_load_error(doc, {"model.json: optimizer_state", "unknown field 'momentum'"});
  // Parameter errors still name the params member.
  doc = valid_vea_document();
  doc["params"]["emission"][1][0] = 2.0;
  expect_load_error(doc, {"model.json: params.emission", "row 1"});
  doc = valid_vea_document();
  doc["params"].erase("position_prior");
  expect_load_error(doc, {"model.json: params", "missing field 'position_prior'"});
}

/// Errors inside a mixture component name the component's path.
TEST(ModelJsonTest, VariationalComponentErrorsNameTheirPath) {
  Rng rng(testing::test_seed(26));
  const VariationalMultiHopAttention a = random_vmha(rng, 3, 2, 2);
  const json good = model_to_json(
      AnyDistribution(Mixture({AnyDistribution(a), AnyDistribution(a)}, Vector::Constant(2, 0.5))));
  json doc = good;
  doc["params"]["components"][1]["optimizer_state"]["family"] = "variational_embedding_attention";
  expect_load_error(doc, {"model.json: params.components[1].optimizer_state belongs to family"});
  doc = good;
  doc["params"]["components"][0]["optimizer_state"]["algorithm"] = "rmsprop";
  expect_load_error(doc, {"model.json: params.components[0].optimizer_state.algorithm", "rmsprop"});
  doc = good;
  doc["params"]["components"][0]["params"]["sigma2"] = 0.0;
  expect_load_error(doc, {"model.json: params.components[0].params.sigma2"});
}

// ----- parsing integrity: NUL bytes, duplicate keys, integers written as floats ----------------------------------

/// The ValueError message of load_model on a file holding `text` ("" and a failure when it loads).
std::string load_text_error(const TempDir& dir, const std::string& text) {
  const std::string path = dir.file("model.json");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  try {
    (void)load_model(path);
    ADD_FAILURE() << "accepted: " << text.substr(0, 200);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

/// "line L, column C" (1-based, bytes) of offset `at` in `text`.
std::string position_of(const std::string& text, size_t at) {
  const size_t line = static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(at), '\n'));
  const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t column = line_start == std::string::npos || at == 0 ? at + 1 : at - line_start;
  return "line " + std::to_string(line + 1) + ", column " + std::to_string(column);
}

TEST(ModelJsonTest, ANulByteAnywhereIsAnErrorNamingItsPosition) {
  const TempDir dir;
  Rng rng(testing::test_seed(31));
  const AnyDistribution model(ResponsibilityAttention(random_params(rng, 3, 2, 2, 3)));
  const std::string text = format_model_json(model_to_json(model));
  ASSERT_EQ(model_from_json(parse_model_text(text, "m.json"), "m.json").family(), model.family());
  // After the document (garbage behind a NUL was accepted), and in the middle of it, in place of a space.
  const std::string trailing = text + std::string("\0 junk {{{", 11);
  std::string message = load_text_error(dir, trailing);
  EXPECT_NE(message.find(dir.file("model.json") + ": " + position_of(trailing, text.size()) +
                         ": a NUL byte is not allowed in a model file"),
            std::string::npos)
      << message;
  std::string inner = text;
  const size_t space = inner.find(": ", inner.find("\"params\"")) + 1;
  inner[space] = '\0';
  message = load_text_error(dir, inner);
  EXPECT_NE(message.find(position_of(inner, space) + ": a NUL byte"), std::string::npos) << message;
  EXPECT_NE(message.find("line 5"), std::string::npos) << message;  // "params" is on line 5 of a saved file
}

TEST(ModelJsonTest, DuplicateKeysAreErrorsNamingTheKeyAndItsPosition) {
  const TempDir dir;
  Rng rng(testing::test_seed(32));
  const std::string text =
      format_model_json(model_to_json(AnyDistribution(ResponsibilityAttention(random_params(rng, 3, 2, 2, 3)))));
  // A second "sigma2" in params (the last would win: 5.0 here), a second "family" at the top level.
  std::string twice = text;
  const size_t sigma = twice.find("\"sigma2\"");
  ASSERT_NE(sigma, std::string::npos);
  twice.insert(sigma, "\"sigma2\": 5.0,\n    ");
  const size_t second = twice.find("\"sigma2\"", sigma + 1);
  std::string message = load_text_error(dir, twice);
  EXPECT_NE(message.find(dir.file("model.json") + ": " + position_of(twice, second) + ": duplicate key \"sigma2\""),
            std::string::npos)
      << message;
  twice = text;
  twice.insert(twice.find("\"params\""), "\"family\": \"responsibility_attention\", ");
  message = load_text_error(dir, twice);
  EXPECT_NE(message.find("duplicate key \"family\""), std::string::npos) << message;
  // An escaped quote inside the key: the position is that of the key's opening quote.
  const std::string escaped = "{\"a\\\"b\": 1,\n \"a\\\"b\": 2}";
  try {
    (void)parse_model_text(escaped, "x.json");
    ADD_FAILURE() << "duplicate escaped key accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("x.json: line 2, column 2: duplicate key \"a\\\"b\""), std::string::npos)
        << e.what();
  }
  // The same key in different objects is no duplicate (schema_version at the top and in the optimizer state).
  EXPECT_NO_THROW((void)parse_model_text("{\"a\": {\"a\": 1}, \"b\": [{\"a\": 1}, {\"a\": 2}]}", "x.json"));
  // Malformed JSON still names the file and nlohmann's position.
  try {
    (void)parse_model_text("{\"a\": 1,\n \"b\" 2}", "x.json");
    ADD_FAILURE() << "malformed JSON accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("x.json: not a valid JSON document"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
}

TEST(ModelJsonTest, IntegerFieldsWrittenAsFloatsAreRejectedNamingTheField) {
  const TempDir dir;
  const json good = valid_vea_document();
  for (const char* value : {"1e15", "3.0", "1E2", "18446744073709551615"}) {
    SCOPED_TRACE(value);
    json doc = good;
    doc["optimizer_state"]["iteration"] = 7;
    std::string text = format_model_json(doc);
    const std::string field = "\"iteration\": 7";
    const size_t at = text.find(field);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, field.size(), std::string("\"iteration\": ") + value);
    const std::string message = load_text_error(dir, text);
    EXPECT_NE(message.find(dir.file("model.json") + ": optimizer_state.iteration: must be an integer"),
              std::string::npos)
        << message;
  }
  json doc = good;
  doc["optimizer_state"]["seed"] = 2.0;
  expect_load_error(doc, {"model.json: optimizer_state.seed: must be an integer", "2.0"});
  doc = good;
  doc["optimizer_state"]["schema_version"] = 1.0;
  expect_load_error(doc, {"model.json: optimizer_state.schema_version: must be an integer"});
  doc = good;
  doc["optimizer_state"]["iteration"] = 12;  // a JSON integer loads
  EXPECT_EQ(model_from_json(doc, "model.json").get_if<VariationalEmbeddingAttention>()->optimizer_state().iteration,
            12);
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
