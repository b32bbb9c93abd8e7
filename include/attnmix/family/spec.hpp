// SPDX-License-Identifier: Apache-2.0
/// @file spec.hpp
/// A family's descriptor: what every adapter — model files, the `attnmix` program, the Python module — needs to
/// know about a family, so that none of them asks "which family is this" with a chain of casts. Each family
/// defines its descriptor beside its code (for example `attention/responsibility/family.cpp`) and is registered once,
/// by one line in the library's one list of families (`src/family/registry.cpp`).
///
///   name, aliases   how users name the family (`attnmix fit --family responsibility`, or `ra`)
///   title           how messages name it ("responsibility attention")
///   file_family     the "family" of its model files, equal to AnyDistribution::family()
///   codec           its model-file parameters (io/model_file.hpp writes the document around them)
///   schema          its data files (io/rows.hpp); data_of, encode, rows_of and sample connect them to its models
///   fit             what fitting it takes: its sizes, its option table (family/options.hpp) and its estimator
#pragma once

#include <nlohmann/json.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/core/json.hpp"
#include "attnmix/family/options.hpp"
#include "attnmix/inference/communicator.hpp"
#include "attnmix/io/rows.hpp"

namespace attnmix {

/// How a family's models are written to and read from model files: the "params" object (the validating
/// constructor's arguments under their Python names), the model's name beside it, and, for families that carry one,
/// the "optimizer_state" object.
struct ModelCodec {
  /// params of the model.
  nlohmann::json (*params_to_json)(const AnyDistribution& model) = nullptr;
  /// The model's name ("" when unnamed; then no "name" field is written).
  std::string (*name_of)(const AnyDistribution& model) = nullptr;
  /// Builds the model through its validating constructor from `params`, the name and the optional
  /// "optimizer_state" sibling of params (null when the object has none).
  AnyDistribution (*from_json)(const ModelJsonField& params, const std::string& name,
                               const ModelJsonField* optimizer_state) = nullptr;
  /// The "optimizer_state" written beside params, or null for families without one (a file of such a family that
  /// carries the field is rejected).
  nlohmann::json (*state_to_json)(const AnyDistribution& model) = nullptr;
};

/// ModelCodec::name_of of a family whose params carry the name.
template <class Model>
std::string params_name(const AnyDistribution& model) {
  return model.get_if<Model>()->params().name;
}

struct FamilySpec;

/// The data files a model reads: their schema, the sizes the model fixes (each "from the model") — the sizes it
/// leaves open (a chained model's context length N) come from the data — and how rows of the schema become the
/// model's batches and back. A leaf family's files are its own schema's; a mixture reads its components' files, a
/// composite its components' fields side by side.
struct DataOf {
  /// The files of a family that reads its own schema: family->schema, family->encode and family->rows_of.
  DataOf(const FamilySpec* family, Dims fixed);
  /// Files of a schema made for one model (a composite's): its fields, the sizes it fixes, rows → batch (encoder) and
  /// batch → rows (writer).
  DataOf(std::shared_ptr<const RowSchema> fields, Dims fixed, std::function<AnyBatch(Rows, const Dims&)> encoder,
         std::function<Rows(const AnyBatch&)> writer);

  std::shared_ptr<const RowSchema> schema;             ///< the files' fields
  Dims dims;                                           ///< the sizes the model fixes, each "from the model"
  std::function<AnyBatch(Rows, const Dims&)> encode;   ///< the batch of validated rows whose sizes are all in dims
  std::function<Rows(const AnyBatch&)> rows_of;        ///< the rows of one of the model's batches
};

/// A size of a family's data or model as a fit takes and reports it: "S=4 symbols", `--symbols 4`.
struct SizeSpec {
  std::string_view symbol = {};          ///< "S"
  std::string_view flag = {};            ///< "symbols": the flag --symbols
  std::string_view keyword = {};         ///< "num_symbols": the Python keyword
  std::string_view noun = {};            ///< "symbols"
  std::string_view one = {};             ///< the noun for a size of 1, where it differs ("hop")
  std::string_view help = {};            ///< "number of symbols"
  std::optional<int64_t> fallback = {};  ///< a size the data do not give: its default (2 hops)
  bool fixed_by_model = true;            ///< a model (and its estimator) fixes it; else each data set sets it (N of chained rows)
};

/// Everything an estimator is built from, and what it reports: its sizes (those fixed by the model), options, the
/// seed of a fresh initialisation (families with a Monte-Carlo objective), name and keys.
struct EstimatorSettings {
  Dims sizes = {};            ///< the sizes the model fixes ("S", "T", ...)
  OptionValues options = {};  ///< to make one: the given options (the others keep their defaults)
  uint64_t seed = 0;          ///< the seed of a fresh initialisation (Monte-Carlo families)
  std::string name = {};      ///< the model's name (empty: none)
  std::optional<std::string> keys = {};  ///< the statistics' key: accumulators with equal keys are merged
  /// To make the estimator of a family whose statistics take their shape from the data (FitSpec::shaped_by_data):
  /// the training rows of this process.
  const AnyBatch* rows = nullptr;
  /// With rows: the processes of a distributed fit, whose rows together give the shape (null: one process).
  const Communicator* communicator = nullptr;
};

/// A family that can be fitted to a plain-text corpus: the corpus's tokens become its rows.
struct TextSpec {
  /// The sizes of a fit to a corpus of `vocab` distinct tokens (`kind`: "characters" or "words") read from `source`,
  /// within the declared ones; `embedding_dim` is the width of the tokens' query embeddings (0: none, the queries are
  /// the tokens' symbols). @throws ValueError naming the size that cannot hold the corpus.
  Dims (*dims)(int64_t vocab, const Dims& declared, const std::string& source, std::string_view kind,
               Index embedding_dim) = nullptr;
  /// The rows of a token sequence (row r predicts token r + N); `embeddings` (null: none) holds row s's query.
  AnyBatch (*rows)(const std::vector<int64_t>& tokens, const Dims& dims, const Matrix* embeddings) = nullptr;
};

/// What fitting a family takes (null make_estimator: the family is not fitted by itself, as a mixture).
struct FitSpec {
  std::vector<SizeSpec> sizes = {};       ///< in the order messages list them
  std::vector<OptionSpec> options = {};   ///< the option table (family/options.hpp)
  bool stochastic = false;                ///< a Monte-Carlo objective: the score does not rise monotonically
  /// The statistics' shape comes from the training rows (the cells of sparse tables): make_estimator needs
  /// EstimatorSettings::rows.
  bool shaped_by_data = false;
  /// Every size a saved model fixes, each "from" nothing (the caller names the file).
  Dims (*model_sizes)(const AnyDistribution& model) = nullptr;
  /// The values a saved model holds of the options marked from_model (null: it holds none).
  OptionValues (*model_options)(const AnyDistribution& model) = nullptr;
  /// The estimator of these settings; `init` is the model a fit starts from, if any (a variational fit continues its
  /// noise seed). @throws ValueError for sizes or options the estimator refuses.
  AnyEstimator (*make_estimator)(const EstimatorSettings& settings, const AnyDistribution* init) = nullptr;
  /// The settings of one of the family's estimators, every option included.
  EstimatorSettings (*settings_of)(const AnyEstimator& estimator) = nullptr;
  /// The settings of one of the family's accumulators (the estimator of these settings makes alike ones): its
  /// sizes, the options that shape its statistics, and its keys.
  EstimatorSettings (*accumulator_settings)(const AnyAccumulator& accumulator) = nullptr;
  /// The model a fit from `init` starts with when the options change how it computes (its precision); else none.
  std::optional<AnyDistribution> (*initial)(const AnyDistribution& init, const OptionValues& options) = nullptr;
  /// "chained attention (L = 2 hops)": how a fit of these sizes names the model; null: the family's title.
  std::string (*mechanism)(const Dims& dims) = nullptr;
  /// " (its Adam trajectory goes on after step 3)": what a fit from this saved model continues; null: nothing.
  std::string (*resume_note)(const AnyDistribution& init) = nullptr;
  TextSpec text = {};  ///< fitting to a plain-text corpus (null members: the family cannot)
};

/// One family, registered once (docs/design.md): its names, model-file codec, data schema, the encoder and sampler of
/// its rows, and what fitting it takes. Every adapter (the command line, the Python module, model files) works from
/// this descriptor; none asks which family a model is.
struct FamilySpec {
  std::string_view name = {};                  ///< "responsibility"
  std::vector<std::string_view> aliases = {};  ///< "ra"
  std::string_view title = {};                 ///< "responsibility attention"
  std::string_view file_family = {};           ///< "responsibility_attention"
  ModelCodec codec = {};                       ///< reads and writes the family's model files
  /// The family's data files; null for a family that reads none of its own (a mixture reads its components').
  const RowSchema* schema = nullptr;
  /// The data files `model` reads. @throws ValueError when it reads none (null for such a family).
  DataOf (*data_of)(const AnyDistribution& model) = nullptr;
  /// The batch of validated rows whose sizes are all in `dims`.
  AnyBatch (*encode)(Rows rows, const Dims& dims) = nullptr;
  /// The rows of one of the family's batches (what `attnmix sample` writes).
  Rows (*rows_of)(const AnyBatch& batch) = nullptr;
  /// m observations from the model's sampler with `seed`; `width` is the sampled rows' context length where the
  /// family leaves it open (its schema's width that data_of does not fix), and must equal the model's otherwise.
  /// @throws ValueError for a width the model cannot use.
  AnyBatch (*sample)(const AnyDistribution& model, Index m, uint64_t seed, std::optional<int64_t> width) = nullptr;
  FitSpec fit = {};  ///< what fitting the family takes
};

/// The data files a model reads (spec_of(model).data_of). @throws ValueError for a family that reads none.
[[nodiscard]] DataOf data_of(const AnyDistribution& model);

/// Every registered family, in registration order.
[[nodiscard]] std::span<const FamilySpec* const> families();

/// The family whose model files say `file_family`, or null.
[[nodiscard]] const FamilySpec* family_of_file(std::string_view file_family);

/// The descriptor of a model's family. @throws ValueError for a model of an unregistered family.
[[nodiscard]] const FamilySpec& spec_of(const AnyDistribution& model);

/// "responsibility_attention, chained_attention, …": the registered file families, for messages.
[[nodiscard]] std::string file_families_text();

}  // namespace attnmix
