// SPDX-License-Identifier: Apache-2.0
// Training, evaluation, sampling and checkpoints of the streaming language model; see
// include/attnmix/stream/language_model.hpp.
#include "attnmix/stream/language_model.hpp"

#include "attnmix/core/atomic_file.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/sizes.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/frequent_directions.hpp"
#include "attnmix/stream/fused_adamw.hpp"
#include "attnmix/stream/kv_quantization.hpp"
#include "attnmix/stream/linear_attention.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "attnmix/stream/option_table.hpp"
#include "attnmix/stream/tensor_sketch.hpp"
#include "model_options.hpp"

#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <zip.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <fstream>
#include <memory>
#include <type_traits>
#include <variant>
#include <numbers>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

namespace attnmix::stream {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr const char* kFormat = "attnmix-lm-checkpoint";
constexpr int kSchemaVersion = 1;

std::string str(int64_t v) { return std::to_string(v); }

void check_vocabulary(std::span<const int64_t> tokens, int64_t vocab, const char* where) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      throw ValueError(std::string(where) + ": token " + str(static_cast<int64_t>(i)) + " is " + str(tokens[i]) +
                       ", outside the vocabulary [0, " + str(vocab) + ")");
    }
  }
}

// ---- the kinds of mechanism ------------------------------------------------------------------------------------
// Training, evaluation and sampling are templates over a kind: the module, its carried state, how it is built and
// how its state is checkpointed. window and full share the spine; moment-closure adds a cluster bank per layer;
// linear replaces the cache by running sums.

struct SpineKind {
  using Module = SlidingWindowSpine;
  using Impl = SlidingWindowSpineImpl;
  using State = SlidingWindowState;
  static Module make(const ModelConfig& m) { return SlidingWindowSpine(spine_options(m)); }
  static constexpr bool kHasFarField = false;
};

struct MomentKind {
  using Module = MomentClosureAttention;
  using Impl = MomentClosureAttentionImpl;
  using State = MomentClosureState;
  static Module make(const ModelConfig& m) { return MomentClosureAttention(moment_options(m)); }
  static constexpr bool kHasFarField = true;
};

struct LinearKind {
  using Module = LinearAttentionSpine;
  using Impl = LinearAttentionSpineImpl;
  using State = LinearAttentionState;
  static Module make(const ModelConfig& m) { return LinearAttentionSpine(linear_options(m)); }
  static constexpr bool kHasFarField = false;
};

struct SketchKind {
  using Module = FrequentDirectionsSpine;
  using Impl = FrequentDirectionsSpineImpl;
  using State = FrequentDirectionsState;
  static Module make(const ModelConfig& m) { return FrequentDirectionsSpine(frequent_directions_options(m)); }
  static constexpr bool kHasFarField = false;
};

struct TensorSketchKind {
  using Module = TensorSketchSpine;
  using Impl = TensorSketchSpineImpl;
  using State = TensorSketchState;
  static Module make(const ModelConfig& m) { return TensorSketchSpine(tensor_sketch_options(m)); }
  static constexpr bool kHasFarField = false;
};

// Calls f(SpineKind{}), f(MomentKind{}), f(LinearKind{}), f(SketchKind{}) or f(TensorSketchKind{}); all must return
// the same type.
template <class F>
decltype(auto) with_kind(Mechanism mechanism, F&& f) {
  if (mechanism == Mechanism::kMomentClosure) return f(MomentKind{});
  if (mechanism == Mechanism::kLinear) return f(LinearKind{});
  if (mechanism == Mechanism::kFrequentDirections) return f(SketchKind{});
  if (mechanism == Mechanism::kTensorSketch) return f(TensorSketchKind{});
  return f(SpineKind{});
}

// Per-layer far-field statistics accumulated from the receipts of every step (moment-closure only).
/// Each layer's live clusters, mean over the streams.
std::vector<double> mean_live_clusters(const MomentClosureState& state) {
  std::vector<double> out;
  for (const auto& bank : state.banks) {
    const auto& n = bank.n_clusters;
    out.push_back(n.empty() ? 0.0
                            : static_cast<double>(std::accumulate(n.begin(), n.end(), int64_t{0})) /
                                  static_cast<double>(n.size()));
  }
  return out;
}

/// Each layer's bank mass Σ_c n_c, mean over the streams and heads.
std::vector<double> mean_bank_mass(const MomentClosureState& state) {
  std::vector<double> out;
  for (const auto& bank : state.banks)
    out.push_back(bank.count.defined() && bank.count.numel() > 0
                      ? bank.total_per_head().to(torch::kFloat64).mean().item<double>()
                      : 0.0);
  return out;
}

/// Each layer's far-field share of the last step's attention.
std::vector<double> far_shares(const std::vector<LayerReceipt>& receipts) {
  std::vector<double> out;
  for (const auto& layer : receipts) out.push_back(layer.far_attention_share);
  return out;
}

class FarFieldTally {
 public:
  void add(const std::vector<LayerReceipt>& receipts) {
    if (layers_.size() < receipts.size()) {
      layers_.resize(receipts.size());
      misfit_sums_.resize(receipts.size(), 0.0);
    }
    for (size_t l = 0; l < receipts.size(); ++l) {
      for (const StreamReceipt& r : receipts[l].streams) {
        if (r.expected_ingested_tokens_per_head == 0) continue;  // nothing was evicted this step
        auto& layer = layers_[l];
        layer.births += r.birthed ? 1 : 0;
        layer.merges += static_cast<int64_t>(r.merged.size());
        layer.ingestions += 1;
        misfit_sums_[l] += r.misfit_scalar;
      }
    }
  }

  // The statistics, with the final cluster counts of `state` (mean over its streams).
  std::vector<LayerClusterStats> finish(const MomentClosureState& state) {
    layers_.resize(state.banks.size());
    misfit_sums_.resize(state.banks.size(), 0.0);
    const std::vector<double> clusters = mean_live_clusters(state);
    for (size_t l = 0; l < layers_.size(); ++l) {
      layers_[l].clusters = clusters[l];
      layers_[l].mean_misfit =
          layers_[l].ingestions > 0 ? misfit_sums_[l] / static_cast<double>(layers_[l].ingestions) : 0.0;
    }
    return layers_;
  }

 private:
  std::vector<LayerClusterStats> layers_;
  std::vector<double> misfit_sums_;
};

// ---- checkpoint metadata (JSON inside the archive) ------------------------------------------------------------

/// Whether a checkpoint of a model with `mechanism` stores `option` (stream/option_table.hpp: Kept, only_for).
bool stored_for(const StreamOption<TrainOptions>& option, Mechanism mechanism) {
  return option.kept != Kept::kNo && (!option.only_for || *option.only_for == mechanism);
}

json to_json(const TrainOptions& options) {
  TrainOptions o = options;  // the table reaches its fields mutably
  json j = json::object();
  for (const auto& option : train_option_table()) {
    if (!stored_for(option, o.model.mechanism)) continue;
    std::visit(
        [&](const auto& field) {
          const auto& value = field(o);
          using T = std::remove_cvref_t<decltype(value)>;
          if constexpr (std::is_enum_v<T>) {
            j[std::string(option.name)] = NamedValues<T>::name(value);
          } else if constexpr (std::is_same_v<T, std::optional<double>>) {
            j[std::string(option.name)] = value ? json(*value) : json(nullptr);
          } else {
            j[std::string(option.name)] = value;
          }
        },
        option.field);
  }
  return j;
}

// One field of the stored options, with its name in the message when it is missing or of the wrong type.
template <class T>
T option_field(const json& options, const char* name) {
  if (!options.contains(name)) throw ValueError(std::string("options.") + name + " is missing");
  const json& v = options.at(name);
  const bool non_negative = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  const bool fits = std::is_same_v<T, std::string> ? v.is_string()
                    : std::is_same_v<T, double>    ? v.is_number()
                    : std::is_unsigned_v<T>        ? non_negative
                                                   : v.is_number_integer();
  if (!fits) {
    const char* kind = std::is_same_v<T, std::string> ? "a string"
                       : std::is_same_v<T, double>    ? "a number"
                       : std::is_unsigned_v<T>        ? "a non-negative integer"
                                                      : "an integer";
    throw ValueError(std::string("options.") + name + " must be " + kind + " (got " + v.dump() + ")");
  }
  return v.get<T>();
}

TrainOptions options_from_json(const json& j) {
  if (!j.is_object()) throw ValueError("options must be an object");
  TrainOptions o;
  o.model.mechanism = parse_mechanism(option_field<std::string>(j, "mechanism"));  // decides what else is stored
  for (const auto& option : train_option_table()) {
    if (!stored_for(option, o.model.mechanism)) continue;
    const std::string name(option.name);
    std::visit(
        [&](const auto& field) {
          auto& value = field(o);
          using T = std::remove_cvref_t<decltype(value)>;
          if constexpr (std::is_same_v<T, std::optional<double>>) {
            if (j.contains(name) && !j.at(name).is_null()) value = option_field<double>(j, name.c_str());
          } else if (option.older_files_lack && !j.contains(name)) {
            return;  // a checkpoint written before the option existed: its default
          } else if constexpr (std::is_enum_v<T>) {
            value = NamedValues<T>::parse(option_field<std::string>(j, name.c_str()), "options");
          } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t> ||
                               std::is_same_v<T, double>) {
            value = option_field<T>(j, name.c_str());
          } else {
            throw std::logic_error("options." + name + ": a checkpoint stores no option of this type");
          }
        },
        option.field);
  }
  return o;
}

// ---- the training session: model, optimizer, carried state ---------------------------------------------------

template <class Kind>
struct Session {
  TrainOptions options;
  typename Kind::Module model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  typename Kind::State state;
  int64_t step = 0;
  uint64_t corpus_fingerprint = 0;
  int64_t corpus_tokens = 0;
};

// AdamW in one pass per parameter, equal to libtorch's to the bit (fused_adamw.hpp).
std::unique_ptr<torch::optim::AdamW> make_optimizer(torch::nn::Module& model, const TrainOptions& o) {
  return std::make_unique<FusedAdamW>(model.parameters(), torch::optim::AdamWOptions(o.lr).weight_decay(o.weight_decay));
}

double learning_rate(const TrainOptions& o, int64_t step) {
  if (o.schedule == Schedule::kConstant) {
    return o.lr;
  }
  const double progress = static_cast<double>(step) / static_cast<double>(std::max<int64_t>(o.steps, 1));
  const double floor = o.lr * o.min_lr_ratio;
  return floor + (o.lr - floor) * 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(progress, 1.0)));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

[[noreturn]] void bad_checkpoint(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": not a usable attnmix LM checkpoint: " + why);
}

// libtorch's readers throw c10::Error, and its TorchScript parser (a damaged code/ member of the archive)
// torch::jit::ErrorReport, which derives from std::exception alone: `f` runs with both reported as a bad checkpoint
// (`what` and the first line of libtorch's message), while attnmix's own errors (std::runtime_error, among them
// bad_checkpoint's, and std::invalid_argument) pass unchanged.
template <class F>
decltype(auto) reading_archive(const std::string& path, const std::string& what, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const std::runtime_error&) {
    throw;
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {
    std::string message = e.what();
    message.erase(0, message.find_first_not_of(" \n"));
    message = message.substr(0, message.find('\n'));
    bad_checkpoint(path, what + (message.empty() ? "" : " (" + message + ")"));
  }
}

// The AdamW moments, one record "p<i>" per parameter in named_parameters() order (absent before its first update).
// torch's own Optimizer::save keys them by tensor addresses, which change from run to run and make the file bytes
// (not the values) differ between a resumed and an uninterrupted run; this layout is the same whenever the values are.
std::string optimizer_key(const torch::Tensor& parameter) {
  return c10::guts::to_string(parameter.unsafeGetTensorImpl());
}

template <class Kind>
torch::serialize::OutputArchive save_optimizer_state(const Session<Kind>& s) {
  torch::serialize::OutputArchive archive;
  const auto parameters = s.model->parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto found = s.optimizer->state().find(optimizer_key(parameters[i]));
    if (found == s.optimizer->state().end()) continue;
    const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*found->second);
    torch::serialize::OutputArchive one;
    one.write("step", c10::IValue(adam.step()));
    one.write("exp_avg", adam.exp_avg());
    one.write("exp_avg_sq", adam.exp_avg_sq());
    archive.write("p" + std::to_string(i), one);
  }
  return archive;
}

// The carried state: pos, batch_size and the per-layer caches k<l>, v<l> (present once the layer has cached tokens);
// moment-closure adds every bank tensor of layer l (count<l>, mu_k<l>, mu_v<l>, sigma_kk<l>, sigma_vk<l>) and its
// live prefix n_clusters<l> (int64, one per stream).
void write_near_state(torch::serialize::OutputArchive& state, const SlidingWindowState& near) {
  state.write("pos", c10::IValue(near.pos));
  state.write("batch_size", c10::IValue(near.batch_size));
  for (size_t l = 0; l < near.cache_k.size(); ++l) {
    if (near.cache_k[l].defined()) {
      state.write("k" + std::to_string(l), near.cache_k[l]);
      state.write("v" + std::to_string(l), near.cache_v[l]);
    }
  }
}

void write_state(torch::serialize::OutputArchive& state, const SlidingWindowState& s) { write_near_state(state, s); }

void write_state(torch::serialize::OutputArchive& state, const MomentClosureState& s) {
  write_near_state(state, s.near);
  for (size_t l = 0; l < s.banks.size(); ++l) {
    const ClusterBank& bank = s.banks[l];
    const std::string n = std::to_string(l);
    state.write("count" + n, bank.count);
    state.write("mu_k" + n, bank.mu_k);
    state.write("mu_v" + n, bank.mu_v);
    state.write("sigma_kk" + n, bank.sigma_kk);
    state.write("sigma_vk" + n, bank.sigma_vk);
    state.write("n_clusters" + n, torch::tensor(bank.n_clusters, torch::kLong));
  }
  for (size_t l = 0; l < s.stores.size(); ++l) {  // moment closure + outliers
    const OutlierStore& store = s.stores[l];
    const std::string n = std::to_string(l);
    const std::vector<int64_t> slots{store.batch_size(), store.slots()};
    for (const auto& [name, q] : {std::pair<const char*, const QuantizedKv*>{"store_k", &store.k}, {"store_v", &store.v}}) {
      state.write(name + std::string("_codes") + n, q->codes);
      state.write(name + std::string("_low") + n, q->low);
      state.write(name + std::string("_scale") + n, q->scale);
    }
    state.write("store_owner" + n, torch::tensor(store.owner, torch::kLong).view(slots));
    state.write("store_residual" + n, torch::tensor(store.residual, torch::kDouble).view(slots));
  }
}

// linear: pos, batch_size and per layer the running sums sum_kv<l>, sum_k<l> (float64) and the shift row last_x<l>.
void write_state(torch::serialize::OutputArchive& state, const LinearAttentionState& s) {
  state.write("pos", c10::IValue(s.pos));
  state.write("batch_size", c10::IValue(s.batch_size));
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const std::string n = std::to_string(l);
    state.write("sum_kv" + n, s.layers[l].sum_kv);
    state.write("sum_k" + n, s.layers[l].sum_k);
    state.write("last_x" + n, s.layers[l].last_x);
  }
}

// The tensors of one frequent-directions layer's state, with the names of their records.
template <class Layer>
auto sketch_records(Layer& layer) {
  return std::array{std::pair{"window_k", &layer.window_k}, std::pair{"window_v", &layer.window_v},
                    std::pair{"sketch", &layer.sketch},     std::pair{"sum_k", &layer.sum_k},
                    std::pair{"mass", &layer.mass},         std::pair{"shrink_total", &layer.shrink_total},
                    std::pair{"last_x", &layer.last_x}};
}

// frequent-directions: pos, batch_size and per layer the window rows window_k<l>, window_v<l>, the sketch
// sketch<l>, the sums sum_k<l>, mass<l>, shrink_total<l> (float64) and the shift row last_x<l>; the sketch's
// filled rows and shrinks follow from pos (its schedule) and are not stored.
void write_state(torch::serialize::OutputArchive& state, const FrequentDirectionsState& s) {
  state.write("pos", c10::IValue(s.pos));
  state.write("batch_size", c10::IValue(s.batch_size));
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const std::string n = std::to_string(l);
    const auto& layer = s.layers[l];
    for (const auto& [name, t] : sketch_records(layer)) state.write(name + n, *t);
  }
}

// tensor-sketch: pos, batch_size and per layer window_k<l>, window_v<l>, the sums sum_kv<l>, sum_k<l>, the
// receipt misfit<l> (float64) and the shift row last_x<l>.
template <class Layer>
auto tensor_sketch_records(Layer& layer) {
  return std::array{std::pair{"window_k", &layer.window_k}, std::pair{"window_v", &layer.window_v},
                    std::pair{"sum_kv", &layer.sum_kv},     std::pair{"sum_k", &layer.sum_k},
                    std::pair{"misfit", &layer.misfit},     std::pair{"last_x", &layer.last_x}};
}

void write_state(torch::serialize::OutputArchive& state, const TensorSketchState& s) {
  state.write("pos", c10::IValue(s.pos));
  state.write("batch_size", c10::IValue(s.batch_size));
  for (size_t l = 0; l < s.layers.size(); ++l) {
    for (const auto& [name, t] : tensor_sketch_records(s.layers[l])) state.write(name + std::to_string(l), *t);
  }
}

template <class Kind>
void save_checkpoint(const std::string& path, const Session<Kind>& s) {
  torch::serialize::OutputArchive root;
  json meta = {{"format", kFormat},
               {"schema_version", kSchemaVersion},
               {"options", to_json(s.options)},
               {"step", s.step},
               {"corpus", {{"tokens", s.corpus_tokens}, {"fnv1a", s.corpus_fingerprint}}}};
  root.write("meta", c10::IValue(meta.dump()));
  torch::serialize::OutputArchive model;
  s.model->save(model);
  root.write("model", model);
  auto optimizer = save_optimizer_state(s);
  root.write("optimizer", optimizer);
  torch::serialize::OutputArchive state;
  write_state(state, s.state);
  root.write("state", state);
  std::ostringstream bytes;
  root.save_to(bytes);
  write_file_atomically(path, bytes.str(), "the checkpoint");
}

std::string read_whole_file(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw_io_error(path, "cannot open the checkpoint", EISDIR);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw_io_error(path, "cannot open the checkpoint", errno);
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Reads every member of the checkpoint's zip archive to its end, where libzip compares the CRC-32 of the data with
// the archive's: torch's own reader hands a damaged member over as it is (its miniz is built without the CRC checks),
// so a flipped bit in a tensor would load as a wrong weight. The archive must also be consistent (ZIP_CHECKCONS: the
// local and central headers agree) and name each member once. Costs one pass over the bytes, which are in memory.
void verify_checksums(const std::string& path, const std::string& bytes) {
  zip_error_t error;
  zip_error_init(&error);
  zip_source_t* source = zip_source_buffer_create(bytes.data(), bytes.size(), 0, &error);
  zip_t* archive = source ? zip_open_from_source(source, ZIP_RDONLY | ZIP_CHECKCONS, &error) : nullptr;
  if (!archive) {
    if (source) zip_source_free(source);
    const bool duplicate = zip_error_code_zip(&error) == ZIP_ER_EXISTS;
    const std::string reason = zip_error_strerror(&error);
    zip_error_fini(&error);
    if (duplicate) bad_checkpoint(path, "the archive names a member twice");
    bad_checkpoint(path, "the file is not a torch archive with a \"meta\" record (" + reason + ")");
  }
  zip_error_fini(&error);
  const std::unique_ptr<zip_t, decltype(&zip_discard)> guard(archive, &zip_discard);  // frees the source too
  std::set<std::string> names;
  std::string block(size_t{1} << 20, '\0');
  const zip_int64_t n_entries = zip_get_num_entries(archive, 0);
  for (zip_int64_t i = 0; i < n_entries; ++i) {
    const char* raw_name = zip_get_name(archive, static_cast<zip_uint64_t>(i), 0);
    const std::string name = raw_name ? raw_name : "#" + str(i);
    if (!names.insert(name).second) bad_checkpoint(path, "duplicate member '" + name + "'");
    zip_file_t* file = zip_fopen_index(archive, static_cast<zip_uint64_t>(i), 0);
    if (!file) bad_checkpoint(path, "member '" + name + "': " + zip_strerror(archive));
    const std::unique_ptr<zip_file_t, decltype(&zip_fclose)> file_guard(file, &zip_fclose);
    zip_int64_t got = 0;
    while ((got = zip_fread(file, block.data(), block.size())) > 0) {
    }
    if (got < 0) {
      zip_error_t* read_error = zip_file_get_error(file);
      if (zip_error_code_zip(read_error) == ZIP_ER_CRC) {
        bad_checkpoint(path, "member '" + name +
                                 "': CRC-32 mismatch (its data does not match the checksum stored in the archive; the "
                                 "file is corrupt)");
      }
      bad_checkpoint(path, "member '" + name + "': " + zip_error_strerror(read_error));
    }
  }
}

// A stored tensor is a view (offset, sizes, strides) of a storage whose length the archive's pickled record states
// and whose bytes are a separate member, and torch's reader checks neither the view against the stated length nor
// the stated length against the member it allocated: a tampered record made the first operation on the tensor read
// past the allocation (found by fuzz_checkpoint: a segmentation fault). Checked before any data is touched: the view
// against the stated length, and that against the allocation (torch's reader allocates each member with the CPU
// allocator, i.e. posix_memalign, whose block size malloc_usable_size reports).
void check_within_storage(const std::string& path, const std::string& what, const torch::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  int64_t last = t.storage_offset();  // the largest element offset the view reaches (any overflow: refused)
  bool ok = last >= 0 && t.has_storage();
  for (int64_t d = 0; ok && d < t.dim(); ++d) {
    int64_t reach = 0;
    ok = t.stride(d) >= 0 && !__builtin_mul_overflow(t.size(d) - 1, t.stride(d), &reach) &&
         !__builtin_add_overflow(last, reach, &last);
  }
  int64_t needed = 0;
  ok = ok && !__builtin_mul_overflow(last + 1, static_cast<int64_t>(t.element_size()), &needed) &&
       static_cast<int64_t>(t.storage().nbytes()) >= needed;
  if (ok) {
    const c10::DataPtr& data = t.storage().data_ptr();
    ok = data.get() != nullptr && data.get_deleter() == c10::GetCPUAllocator()->raw_deleter() &&
         malloc_usable_size(data.get()) >= static_cast<size_t>(needed);
  }
  if (!ok) bad_checkpoint(path, what + " does not lie inside its stored data (a damaged tensor record)");
}

// Every floating-point tensor a checkpoint restores must lie inside its stored data and be finite: a NaN or infinite
// weight would load and then make every loss NaN and every sample arbitrary ("what": "model parameter
// 'layers.0.attn.weight'").
void check_finite(const std::string& path, const std::string& what, const torch::Tensor& t) {
  check_within_storage(path, what, t);
  if (!t.defined() || !t.is_floating_point() || torch::isfinite(t).all().item<bool>()) return;
  const auto flat = t.reshape({-1});
  const int64_t first = torch::logical_not(torch::isfinite(flat)).nonzero().view({-1})[0].item<int64_t>();
  std::ostringstream value;
  value << flat[first].item<double>();
  bad_checkpoint(path, what + " has a non-finite value (" + value.str() + " at flat index " + str(first) + ")");
}

struct LoadedCheckpoint {
  json meta;
  torch::serialize::InputArchive root;
};

LoadedCheckpoint open_checkpoint(const std::string& path) {
  const std::string bytes = read_whole_file(path);
  verify_checksums(path, bytes);
  LoadedCheckpoint c;
  reading_archive(path, "the file is not a torch archive with a \"meta\" record", [&] {
    c.root.load_from(bytes.data(), bytes.size());
    c10::IValue meta;
    c.root.read("meta", meta);
    if (!meta.isString()) bad_checkpoint(path, "the meta record is not a string");
    try {
      c.meta = json::parse(meta.toStringRef());
    } catch (const json::exception& e) {
      bad_checkpoint(path, std::string("the meta record is not valid JSON (") + e.what() + ")");
    }
  });
  const auto field = [&](const char* name) -> const json* {
    return c.meta.is_object() && c.meta.contains(name) ? &c.meta.at(name) : nullptr;
  };
  const json* format = field("format");
  if (!format || !format->is_string() || format->get<std::string>() != kFormat) {
    bad_checkpoint(path, std::string("field format must be \"") + kFormat + "\"");
  }
  const json* version = field("schema_version");
  if (!version || !version->is_number_integer() || version->get<int64_t>() != kSchemaVersion) {
    bad_checkpoint(path, "field schema_version: unsupported (this build reads " + std::to_string(kSchemaVersion) + ")");
  }
  return c;
}

TrainOptions checkpoint_options(const std::string& path, const json& meta) {
  if (!meta.contains("options")) bad_checkpoint(path, "field options is missing");
  TrainOptions o;
  try {
    o = options_from_json(meta.at("options"));
  } catch (const std::invalid_argument& e) {
    bad_checkpoint(path, std::string("field ") + e.what());
  }
  try {
    validate(o);
  } catch (const std::invalid_argument& e) {
    bad_checkpoint(path, std::string("field options: ") + e.what());
  }
  return o;
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + str(sizes[i]);
  return text + "]";
}

// The tensors a checkpoint restores must have the shapes of the model its options describe: InputArchive::read
// replaces a parameter by the stored tensor whatever its shape, so a tampered archive would otherwise load and fail
// later, deep inside a forward pass.
void check_shape(const std::string& path, const std::string& what, const torch::Tensor& t,
                 c10::IntArrayRef expected, torch::ScalarType dtype = torch::kFloat) {
  if (!t.defined() || t.sizes() != expected) {
    bad_checkpoint(path, what + " has shape " + (t.defined() ? shape_text(t.sizes()) : std::string("(none)")) +
                             ", the model it describes needs " + shape_text(expected));
  }
  if (t.scalar_type() != dtype) {
    const char* name = dtype == torch::kDouble ? "float64"
                       : dtype == torch::kFloat ? "float32"
                       : dtype == torch::kChar  ? "int8"
                                                : "int64";
    bad_checkpoint(path, what + " must be " + name);
  }
}

template <class Kind>
void restore_model(const std::string& path, torch::serialize::InputArchive& root, Session<Kind>& s) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
  for (const auto& p : s.model->named_parameters()) expected.emplace_back(p.key(), p.value().sizes().vec());
  torch::serialize::InputArchive model;
  if (!root.try_read("model", model)) bad_checkpoint(path, "the archive has no \"model\" record");
  s.model->load(model);
  const auto loaded = s.model->named_parameters();
  for (const auto& [name, sizes] : expected) {
    check_shape(path, "parameter " + name, loaded[name], sizes);
    check_finite(path, "model parameter '" + name + "'", loaded[name]);
  }
  for (const auto& buffer : s.model->named_buffers()) {
    check_finite(path, "model buffer '" + buffer.key() + "'", buffer.value());
  }
}

// pos, batch_size and the caches of the near field (the whole state of window and full).
// The state's pos (checked >= 0) after checking its batch_size against the options.
int64_t read_position(const std::string& path, torch::serialize::InputArchive& state, const TrainOptions& o) {
  c10::IValue pos;
  c10::IValue batch_size;
  state.read("pos", pos);
  state.read("batch_size", batch_size);
  if (batch_size.toInt() != o.batch) {
    bad_checkpoint(path, "state batch_size " + str(batch_size.toInt()) + " differs from options.batch " + str(o.batch));
  }
  if (pos.toInt() < 0) bad_checkpoint(path, "state pos must be >= 0 (got " + str(pos.toInt()) + ")");
  return pos.toInt();
}

void read_near_state(const std::string& path, torch::serialize::InputArchive& state, const TrainOptions& o,
                     SlidingWindowState& near) {
  near.pos = read_position(path, state, o);
  const int64_t head_dim = o.model.d_model / o.model.n_head;
  for (size_t l = 0; l < near.cache_k.size(); ++l) {
    torch::Tensor k;
    torch::Tensor v;
    if (state.try_read("k" + std::to_string(l), k)) {
      state.read("v" + std::to_string(l), v);
      const int64_t len = k.dim() == 4 ? k.size(1) : -1;
      const bool fits = len >= 1 && len <= near.pos &&
                        (o.model.mechanism == Mechanism::kFull || len <= o.model.window);
      check_shape(path, "state cache k" + std::to_string(l), k, {o.batch, fits ? len : 0, o.model.n_head, head_dim});
      check_shape(path, "state cache v" + std::to_string(l), v, k.sizes());
      check_finite(path, "state cache k" + std::to_string(l), k);
      check_finite(path, "state cache v" + std::to_string(l), v);
      near.cache_k[l] = k;
      near.cache_v[l] = v;
    }
  }
}

void read_state(const std::string& path, torch::serialize::InputArchive& state, Session<SpineKind>& s) {
  s.state = s.model->init_state(s.options.batch);
  read_near_state(path, state, s.options, s.state);
}

// linear: every layer's sums and shift row, with their shapes, dtypes and finite values; the sums of k features
// are sums of positive terms, so none may be negative.
void read_state(const std::string& path, torch::serialize::InputArchive& state, Session<LinearKind>& s) {
  const auto& o = s.options;
  s.state = s.model->init_state(o.batch);
  s.state.pos = read_position(path, state, o);
  const int64_t B = o.batch, H = o.model.n_head, d = o.model.d_model / o.model.n_head;
  for (size_t l = 0; l < s.state.layers.size(); ++l) {
    const std::string n = std::to_string(l);
    auto& layer = s.state.layers[l];
    const auto tensor = [&](const std::string& name, torch::Tensor& into, c10::IntArrayRef sizes,
                            torch::ScalarType dtype) {
      torch::Tensor read;  // undefined: try_read would otherwise write into `into`'s storage and dtype
      if (!state.try_read(name + n, read)) bad_checkpoint(path, "the state has no record " + name + n);
      check_shape(path, "state " + name + n, read, sizes, dtype);
      check_finite(path, "state " + name + n, read);
      into = read;
    };
    tensor("sum_kv", layer.sum_kv, {B, H, d, d}, torch::kDouble);
    tensor("sum_k", layer.sum_k, {B, H, d}, torch::kDouble);
    tensor("last_x", layer.last_x, {B, o.model.d_model}, torch::kFloat);
    if (layer.sum_k.lt(0).any().item<bool>()) {
      bad_checkpoint(path, "state sum_k" + n + " holds a negative value (a sum of positive features cannot)");
    }
  }
}

// frequent-directions: every layer's records with the shapes and dtypes the options give (the window holds
// min(pos, window) tokens), finite values, non-negative feature sums, masses and shrinks, and sketch rows that are
// zero beyond the ones the schedule fills.
void read_state(const std::string& path, torch::serialize::InputArchive& state, Session<SketchKind>& s) {
  const auto& o = s.options;
  s.state = s.model->init_state(o.batch);
  s.state.pos = read_position(path, state, o);
  const int64_t B = o.batch, H = o.model.n_head, d = o.model.d_model / o.model.n_head;
  const int64_t held = std::min(s.state.pos, o.model.window);
  const auto [filled, shrinks] = s.model->schedule(s.state.pos);
  for (size_t l = 0; l < s.state.layers.size(); ++l) {
    const std::string n = std::to_string(l);
    auto& layer = s.state.layers[l];
    const std::map<std::string, std::pair<std::vector<int64_t>, torch::ScalarType>> expected = {
        {"window_k", {{B, H, held, d}, torch::kFloat}}, {"window_v", {{B, H, held, d}, torch::kFloat}},
        {"sketch", {{B, H, o.model.sketch_rows, 2 * d}, torch::kDouble}}, {"sum_k", {{B, H, d}, torch::kDouble}},
        {"mass", {{B, H}, torch::kDouble}}, {"shrink_total", {{B, H}, torch::kDouble}},
        {"last_x", {{B, o.model.d_model}, torch::kFloat}}};
    for (const auto& [name, into] : sketch_records(layer)) {
      torch::Tensor read;  // undefined: try_read would otherwise write into `into`'s storage and dtype
      const std::string record = name + n;
      if (!state.try_read(record, read)) bad_checkpoint(path, "the state has no record " + record);
      const auto& [sizes, dtype] = expected.at(name);
      check_shape(path, "state " + record, read, sizes, dtype);
      check_finite(path, "state " + record, read);
      *into = read;
    }
    for (const auto& [name, sum] : {std::pair{"sum_k", &layer.sum_k}, std::pair{"mass", &layer.mass},
                                    std::pair{"shrink_total", &layer.shrink_total}}) {
      if (sum->lt(0).any().item<bool>()) {
        bad_checkpoint(path, "state " + std::string(name) + n +
                                 " holds a negative value (a sum of non-negative terms cannot)");
      }
    }
    if (!layer.sketch.narrow(2, filled, o.model.sketch_rows - filled).eq(0).all().item<bool>()) {
      bad_checkpoint(path, "state sketch" + n + " has non-zero rows beyond the " + str(filled) + " that " +
                               str(s.state.pos - held) + " evicted tokens fill");
    }
    layer.filled = filled;
    layer.shrinks = shrinks;
  }
}

// tensor-sketch: every layer's records with the shapes and dtypes the options give, finite values and a
// non-negative misfit (the sketch's sums may be negative).
void read_state(const std::string& path, torch::serialize::InputArchive& state, Session<TensorSketchKind>& s) {
  const auto& o = s.options;
  s.state = s.model->init_state(o.batch);
  s.state.pos = read_position(path, state, o);
  const int64_t B = o.batch, H = o.model.n_head, d = o.model.d_model / o.model.n_head, D = o.model.sketch_dim;
  const int64_t held = std::min(s.state.pos, o.model.window);
  const std::map<std::string, std::pair<std::vector<int64_t>, torch::ScalarType>> expected = {
      {"window_k", {{B, H, held, d}, torch::kFloat}}, {"window_v", {{B, H, held, d}, torch::kFloat}},
      {"sum_kv", {{B, H, D, d}, torch::kDouble}},     {"sum_k", {{B, H, D}, torch::kDouble}},
      {"misfit", {{B, H}, torch::kDouble}},           {"last_x", {{B, o.model.d_model}, torch::kFloat}}};
  for (size_t l = 0; l < s.state.layers.size(); ++l) {
    auto& layer = s.state.layers[l];
    for (const auto& [name, into] : tensor_sketch_records(layer)) {
      const std::string record = name + std::to_string(l);
      torch::Tensor read;  // undefined: try_read would otherwise write into `into`'s storage and dtype
      if (!state.try_read(record, read)) bad_checkpoint(path, "the state has no record " + record);
      const auto& [sizes, dtype] = expected.at(name);
      check_shape(path, "state " + record, read, sizes, dtype);
      check_finite(path, "state " + record, read);
      *into = read;
    }
    if (layer.misfit.lt(0).any().item<bool>()) {
      bad_checkpoint(path, "state misfit" + std::to_string(l) + " holds a negative value (a relative error cannot)");
    }
  }
}

// One layer's outlier store (moment closure + outliers): int8 codes and float32 row scales of the store's shape,
// finite non-negative scales, an owner per slot that is free (−1) or a live cluster of its stream, at most
// capacity slots per cluster, finite non-negative residuals, and free slots that are all zero.
void read_outlier_store(const std::string& path, torch::serialize::InputArchive& state, size_t layer,
                        const ClusterBank& bank, OutlierStore& store) {
  const std::string n = std::to_string(layer);
  const int64_t B = store.batch_size(), S = store.slots(), H = store.k.codes.size(2), d = store.k.codes.size(3);
  const auto record = [&](const std::string& name, c10::IntArrayRef sizes, torch::ScalarType dtype) {
    torch::Tensor read;
    if (!state.try_read(name + n, read)) bad_checkpoint(path, "the state has no outlier-store record " + name + n);
    check_shape(path, "state " + name + n, read, sizes, dtype);
    check_within_storage(path, "state " + name + n, read);
    if (read.is_floating_point()) check_finite(path, "state " + name + n, read);
    return read.contiguous();
  };
  for (const auto& [name, q] : {std::pair<const char*, QuantizedKv*>{"store_k", &store.k}, {"store_v", &store.v}}) {
    q->codes = record(name + std::string("_codes"), {B, S, H, d}, torch::kChar);
    q->low = record(name + std::string("_low"), {B, S, H}, torch::kFloat);
    q->scale = record(name + std::string("_scale"), {B, S, H}, torch::kFloat);
  }
  const auto owner = record("store_owner", {B, S}, torch::kLong);
  const auto residual = record("store_residual", {B, S}, torch::kDouble);
  store.owner.assign(owner.data_ptr<int64_t>(), owner.data_ptr<int64_t>() + B * S);
  store.residual.assign(residual.data_ptr<double>(), residual.data_ptr<double>() + B * S);
  try {
    validate_outlier_store(store, bank, "state", "store_", n);
  } catch (const ValueError& e) {
    bad_checkpoint(path, e.what());
  }
}

// The near field, then every layer's bank: shapes, the bank invariants of validate_cluster_bank (a live prefix in
// [0, max_clusters] per stream, all-zero slots beyond it, finite values, non-negative counts and variances), and
// counts that represent every evicted position exactly once (the representation receipt of
// docs/mechanisms.md#moment-closure-far-field), so that a damaged bank is reported here, naming the record or the
// layer, rather than by the first step.
void read_state(const std::string& path, torch::serialize::InputArchive& state, Session<MomentKind>& s) {
  const auto& o = s.options;
  s.state = s.model->init_state(o.batch);
  read_near_state(path, state, o, s.state.near);
  const int64_t B = o.batch, H = o.model.n_head, C = o.model.max_clusters, d = o.model.d_model / o.model.n_head;
  for (size_t l = 0; l < s.state.banks.size(); ++l) {
    const std::string n = std::to_string(l);
    ClusterBank& bank = s.state.banks[l];
    const auto tensor = [&](const std::string& name, torch::Tensor& into, c10::IntArrayRef sizes) {
      if (!state.try_read(name + n, into)) bad_checkpoint(path, "the state has no cluster-bank record " + name + n);
      check_shape(path, "state " + name + n, into, sizes);
      check_finite(path, "state " + name + n, into);
    };
    tensor("count", bank.count, {B, H, C});
    tensor("mu_k", bank.mu_k, {B, H, C, d});
    tensor("mu_v", bank.mu_v, {B, H, C, d});
    tensor("sigma_kk", bank.sigma_kk, {B, H, C, d});
    tensor("sigma_vk", bank.sigma_vk, {B, H, C, d, d});
    torch::Tensor live;
    if (!state.try_read("n_clusters" + n, live)) bad_checkpoint(path, "the state has no record n_clusters" + n);
    if (live.scalar_type() != torch::kLong || live.sizes() != c10::IntArrayRef{B}) {
      bad_checkpoint(path, "state n_clusters" + n + " must be " + str(B) + " int64 values (one per stream)");
    }
    check_within_storage(path, "state n_clusters" + n, live);
    const auto live_cpu = live.contiguous();
    bank.n_clusters.assign(live_cpu.data_ptr<int64_t>(), live_cpu.data_ptr<int64_t>() + B);
    try {
      validate_cluster_bank(bank, "state cluster bank " + n);
    } catch (const ValueError& e) {
      bad_checkpoint(path, e.what());
    }
    const auto& cache = s.state.near.cache_k[l];
    const int64_t far = s.state.near.pos - (cache.defined() ? cache.size(1) : 0);
    // The tolerance of the mechanism's own check (allclose atol 1e-4, rtol 1e-5, plus the float32 rounding of
    // a total of that size), so that this check never rejects a state the first step would accept.
    const double tolerance = 1e-4 + (1e-5 + 8.0 * std::numeric_limits<float>::epsilon()) * static_cast<double>(far);
    const auto totals = bank.total_per_head().to(torch::kDouble);
    if ((totals - static_cast<double>(far)).abs().max().item<double>() > tolerance) {
      bad_checkpoint(path, "state count" + n + " does not hold the " + str(far) +
                               " evicted tokens of every stream and head (pos minus the cached tokens)");
    }
  }
  for (size_t l = 0; l < s.state.stores.size(); ++l) read_outlier_store(path, state, l, s.state.banks[l], s.state.stores[l]);
}

template <class Kind>
void restore_training(const std::string& path, torch::serialize::InputArchive& root, Session<Kind>& s) {
  const auto& o = s.options;
  s.optimizer = make_optimizer(*s.model, o);
  torch::serialize::InputArchive optimizer;
  if (!root.try_read("optimizer", optimizer)) bad_checkpoint(path, "the archive has no \"optimizer\" record");
  const auto parameters = s.model->named_parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& p = parameters[i];
    torch::serialize::InputArchive one;
    if (!optimizer.try_read("p" + std::to_string(i), one)) continue;  // no update yet
    c10::IValue step;
    torch::Tensor exp_avg;
    torch::Tensor exp_avg_sq;
    one.read("step", step);
    one.read("exp_avg", exp_avg);
    one.read("exp_avg_sq", exp_avg_sq);
    if (step.toInt() < 1) bad_checkpoint(path, "optimizer step of " + p.key() + " must be >= 1");
    check_shape(path, "optimizer exp_avg of " + p.key(), exp_avg, p.value().sizes());
    check_shape(path, "optimizer exp_avg_sq of " + p.key(), exp_avg_sq, p.value().sizes());
    check_finite(path, "optimizer exp_avg of '" + p.key() + "'", exp_avg);
    check_finite(path, "optimizer exp_avg_sq of '" + p.key() + "'", exp_avg_sq);
    auto adam = std::make_unique<torch::optim::AdamWParamState>();
    adam->step(step.toInt());
    adam->exp_avg(exp_avg);
    adam->exp_avg_sq(exp_avg_sq);
    s.optimizer->state()[optimizer_key(p.value())] = std::move(adam);
  }
  torch::serialize::InputArchive state;
  if (!root.try_read("state", state)) bad_checkpoint(path, "the archive has no \"state\" record");
  read_state(path, state, s);
}

// Step and corpus of an opened checkpoint (options already read and validated).
template <class Kind>
void read_progress(const std::string& path, const json& meta, Session<Kind>& s) {
  try {
    s.step = meta.at("step").get<int64_t>();
    s.corpus_tokens = meta.at("corpus").at("tokens").get<int64_t>();
    s.corpus_fingerprint = meta.at("corpus").at("fnv1a").get<uint64_t>();
  } catch (const json::exception& e) {
    bad_checkpoint(path, std::string("meta: ") + e.what());
  }
  if (s.step < 0 || s.step > s.options.steps) {
    bad_checkpoint(path, "field step (" + str(s.step) + ") must lie in [0, options.steps = " + str(s.options.steps) +
                             "]");
  }
}

// Builds the model under the seed and restores parameters (and, with `with_training`, optimizer and state) from an
// opened checkpoint whose options (of this kind's mechanism) are `options`.
template <class Kind>
Session<Kind> load_session(const std::string& path, LoadedCheckpoint& c, const TrainOptions& options,
                           bool with_training) {
  Session<Kind> s;
  s.options = options;
  read_progress(path, c.meta, s);
  torch::manual_seed(s.options.seed);
  s.model = Kind::make(s.options.model);
  reading_archive(path, "its tensors do not match the model it describes", [&] {
    restore_model(path, c.root, s);
    if (with_training) restore_training(path, c.root, s);
  });
  return s;
}

// Streams tokens (one stream) through the model in chunks, without gradients: the mean next-token cross-entropy and,
// for moment-closure, what the far field did.
// The exact window of a state, where the mechanism keeps one (window, full, moment-closure); nullptr otherwise.
SlidingWindowState* exact_window(SlidingWindowState& s) { return &s; }
SlidingWindowState* exact_window(MomentClosureState& s) { return &s.near; }
template <class State>
SlidingWindowState* exact_window(State&) {
  return nullptr;
}

// WindowCache::kInt8: every cache of the window becomes the reconstruction of its int8 form; returns the bytes that
// form holds minus the bytes of the float caches it stands for (what the state's size changes by).
int64_t hold_window(SlidingWindowState& near, WindowCache cache) {
  if (cache == WindowCache::kFloat32) return 0;
  int64_t change = 0;
  for (size_t l = 0; l < near.cache_k.size(); ++l) {
    for (auto* kv : {&near.cache_k[l], &near.cache_v[l]}) {
      if (!kv->defined()) continue;
      const QuantizedKv q = quantize_kv_cache(*kv);
      change += q.bytes() - kv->numel() * static_cast<int64_t>(kv->element_size());
      *kv = dequantize_kv_cache(q, kv->scalar_type());
    }
  }
  return change;
}

template <class Kind>
void check_window_cache(Mechanism mechanism, WindowCache cache, const char* where) {
  typename Kind::State probe;
  if (cache == WindowCache::kInt8 && exact_window(probe) == nullptr) {
    throw ValueError(std::string(where) + ": window_cache int8 applies to the window, full and moment-closure " +
                     "mechanisms (those with a key-value cache); this checkpoint uses " + mechanism_name(mechanism));
  }
}

template <class Kind>
Evaluation evaluate_model(typename Kind::Module& model, std::span<const int64_t> tokens, int64_t chunk,
                          WindowCache window_cache = WindowCache::kFloat32) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const auto n = static_cast<int64_t>(tokens.size());
  const auto data = torch::from_blob(const_cast<int64_t*>(tokens.data()), {1, n}, torch::kLong);
  auto state = model->init_state(1);
  FarFieldTally tally;
  double total = 0.0;
  int64_t cache_bytes_change = 0;
  const auto start = Clock::now();
  for (int64_t offset = 0; offset < n - 1; offset += chunk) {
    const int64_t t = std::min(chunk, n - 1 - offset);
    auto step = model->advance(state, data.narrow(1, offset, t));
    state = std::move(step.state);
    if (auto* near = exact_window(state)) cache_bytes_change = hold_window(*near, window_cache);
    if constexpr (Kind::kHasFarField) tally.add(model->last_receipts());
    const auto targets = data.narrow(1, offset + 1, t).reshape({-1});
    total += torch::nn::functional::cross_entropy(
                 step.logits.reshape({-1, step.logits.size(-1)}), targets,
                 torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                 .template item<double>();
  }
  model->train(was_training);
  Evaluation e;
  e.tokens = n - 1;
  e.mean_cross_entropy = total / static_cast<double>(n - 1);
  e.bits_per_token = e.mean_cross_entropy / std::numbers::ln2;
  e.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  e.state_bytes = state.bytes() + cache_bytes_change;
  if constexpr (Kind::kHasFarField) e.far_field = tally.finish(state);
  return e;
}

template <class Kind>
TrainSummary train_kind(Session<Kind>& s, std::span<const int64_t> tokens, const std::string& out,
                        const std::function<void(const Progress&)>& on_progress, std::span<const int64_t> heldout) {
  const auto& o = s.options;
  check_vocabulary(tokens, o.model.vocab, "lm train");
  check_vocabulary(heldout, o.model.vocab, "lm train (held-out tokens)");
  const int64_t stream_len = static_cast<int64_t>(tokens.size()) / o.batch;
  const int64_t chunks_per_pass = (stream_len - 1) / o.chunk;
  if (chunks_per_pass < 1) {
    throw ValueError("lm train: the corpus (" + str(static_cast<int64_t>(tokens.size())) + " tokens) is too short for " +
                     str(o.batch) + " streams of one chunk of " + str(o.chunk) + " tokens plus one (needs " +
                     str(o.batch * (o.chunk + 1)) + ")");
  }
  const auto data = torch::from_blob(const_cast<int64_t*>(tokens.data()), {o.batch, stream_len}, torch::kLong).clone();

  int64_t current_step = s.step;
  TbpttOptions tbptt;
  tbptt.detach_horizon = o.detach_horizon;
  const auto parameters = s.model->parameters();
  tbptt.before_update = [&](int64_t) {
    if (o.clip > 0.0) {
      torch::nn::utils::clip_grad_norm_(parameters, o.clip);
    }
    set_learning_rate(*s.optimizer, learning_rate(o, current_step));
  };
  TbpttRunner<typename Kind::Impl> runner(*s.model, *s.optimizer, tbptt);

  TrainSummary summary;
  summary.first_step = s.step;
  for (const auto& p : parameters) summary.parameters += p.numel();
  FarFieldTally tally;
  const auto start = Clock::now();
  double scoring_seconds = 0.0;  // the periodic held-out scoring, kept out of the training speed
  const int64_t tokens_per_step = o.batch * o.chunk;
  for (; s.step < o.steps; ++s.step) {
    current_step = s.step;
    const int64_t within_pass = s.step % chunks_per_pass;
    if (within_pass == 0) {
      s.state = s.model->init_state(o.batch);
    }
    const int64_t offset = within_pass * o.chunk;
    const double loss = runner.feed(s.state, data.narrow(1, offset, o.chunk), data.narrow(1, offset + 1, o.chunk));
    if (!std::isfinite(loss)) {
      throw std::runtime_error("lm train: the loss became " + std::to_string(loss) + " at step " + str(s.step + 1) +
                               " (the run diverged; lower lr or keep clip > 0); no checkpoint was written for it");
    }
    if constexpr (Kind::kHasFarField) tally.add(s.model->last_receipts());
    summary.losses.push_back(loss);
    summary.tokens += tokens_per_step;
    if (o.checkpoint_every > 0 && !out.empty() && (s.step + 1) % o.checkpoint_every == 0 &&
        (s.step + 1) % o.detach_horizon == 0 && s.step + 1 < o.steps) {
      ++s.step;
      save_checkpoint(out, s);
      --s.step;
    }
    if (on_progress) {
      Progress p;
      p.step = s.step + 1;
      p.steps = o.steps;
      p.loss = loss;
      if constexpr (Kind::kHasFarField) {
        p.clusters = mean_live_clusters(s.state);
        p.bank_mass = mean_bank_mass(s.state);
        p.far_share = far_shares(s.model->last_receipts());
      }
      if (o.eval_every > 0 && !heldout.empty() && (s.step + 1) % o.eval_every == 0 && s.step + 1 < o.steps) {
        const Evaluation scored = evaluate_model<Kind>(s.model, heldout, o.chunk);
        p.heldout_bits_per_byte = scored.bits_per_token;
        scoring_seconds += scored.seconds;
      }
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      p.elapsed_seconds = elapsed;
      const double training_seconds = elapsed - scoring_seconds;
      p.tokens_per_second = training_seconds > 0 ? static_cast<double>(summary.tokens) / training_seconds : 0.0;
      const auto done = static_cast<double>(s.step + 1 - summary.first_step);
      p.eta_seconds = elapsed / done * static_cast<double>(o.steps - s.step - 1);
      on_progress(p);
    }
  }
  runner.flush(s.state);
  summary.steps = s.step;
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count() - scoring_seconds;
  summary.state_bytes = s.state.bytes();
  if constexpr (Kind::kHasFarField) summary.far_field = tally.finish(s.state);
  if (!out.empty()) {
    save_checkpoint(out, s);
  }
  if (!heldout.empty()) {
    summary.heldout = evaluate_model<Kind>(s.model, heldout, o.chunk);
  }
  return summary;
}

template <class Kind>
std::vector<int64_t> generate_kind(typename Kind::Module& model, std::span<const int64_t> prompt,
                                   const GenerateOptions& g) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto state = model->init_state(1);
  auto step = model->advance(
      state, torch::from_blob(const_cast<int64_t*>(prompt.data()), {1, static_cast<int64_t>(prompt.size())},
                              torch::kLong));
  if (auto* near = exact_window(step.state)) hold_window(*near, g.window_cache);
  Rng rng(g.seed);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(g.tokens));
  for (int64_t i = 0; i < g.tokens; ++i) {
    auto logits = step.logits.select(1, step.logits.size(1) - 1).squeeze(0).to(torch::kDouble) / g.temperature;
    if (g.top_k > 0 && g.top_k < logits.size(0)) {
      const auto kth = std::get<0>(logits.topk(g.top_k)).min();
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
    }
    const auto probs = torch::softmax(logits, 0).contiguous();
    const double* p = probs.template data_ptr<double>();
    double u = rng.uniform();
    int64_t token = probs.size(0) - 1;
    for (int64_t v = 0; v < probs.size(0); ++v) {
      if (u < p[v]) {
        token = v;
        break;
      }
      u -= p[v];
    }
    out.push_back(token);
    step = model->advance(step.state, torch::full({1, 1}, token, torch::kLong));
    if (auto* near = exact_window(step.state)) hold_window(*near, g.window_cache);
  }
  return out;
}

}  // namespace

void validate(const TrainOptions& o) {
  validate_spine_options(spine_options(o.model), "lm");
  const auto positive = [](const char* name, int64_t v) {
    if (v <= 0) throw ValueError(std::string("lm: ") + name + " must be a positive integer (got " + str(v) + ")");
  };
  positive("batch", o.batch);
  positive("chunk", o.chunk);
  positive("steps", o.steps);
  positive("detach_horizon", o.detach_horizon);
  positive("threads", o.threads);
  positive("max_clusters", o.model.max_clusters);
  if (o.model.outlier_capacity < 0) {
    throw ValueError("lm: outlier_capacity must be a non-negative integer (got " + str(o.model.outlier_capacity) +
                     ")");
  }
  // What one step holds must have a size that can exist.
  const ModelConfig& m = o.model;
  static_cast<void>(checked_product("lm", "the window cache (n_layer x batch x window x d_model)",
                                    {m.n_layer, o.batch, m.window, m.d_model}));
  static_cast<void>(checked_product("lm", "one step's activations (batch x chunk x 4 x d_model)",
                                    {o.batch, o.chunk, 4, m.d_model}));
  static_cast<void>(checked_product("lm", "one step's attention scores (batch x n_head x chunk x (chunk + window))",
                                    {o.batch, m.n_head, o.chunk, 2, std::max(o.chunk, m.window)}));
  static_cast<void>(checked_product("lm", "the far field (n_layer x batch x max_clusters x 2 x d_model x d_model)",
                                    {m.n_layer, o.batch, m.max_clusters, 2, m.d_model, m.d_model}));
  static_cast<void>(checked_product("lm", "the outlier stores (n_layer x batch x max_clusters x outlier_capacity x "
                                          "2 x d_model)",
                                    {m.n_layer, o.batch, m.max_clusters, std::max<int64_t>(m.outlier_capacity, 1), 2,
                                     m.d_model}));
  if (m.sketch_rows < 4 || m.sketch_rows % 2 != 0) {
    throw ValueError("lm: sketch_rows must be an even integer >= 4 (got " + str(m.sketch_rows) + ")");
  }
  static_cast<void>(checked_product("lm", "the sketches (n_layer x batch x sketch_rows x 2 x d_model)",
                                    {m.n_layer, o.batch, m.sketch_rows, 2, m.d_model}));
  positive("sketch_dim", m.sketch_dim);
  positive("sketch_degree", m.sketch_degree);
  static_cast<void>(checked_product("lm", "the tensor sketches (n_layer x batch x sketch_dim x (d_model + n_head))",
                                    {m.n_layer, o.batch, m.sketch_dim, m.d_model + m.n_head}));
  static_cast<void>(checked_product("lm", "one step's tensor sketches (batch x chunk x sketch_dim x n_head x 2)",
                                    {o.batch, o.chunk, m.sketch_dim, m.n_head, 2}));
  if (o.checkpoint_every < 0) throw ValueError("lm: checkpoint_every must be >= 0");
  if (o.eval_every < 0) throw ValueError("lm: eval_every must be >= 0");
  if (!(o.lr > 0.0) || !std::isfinite(o.lr)) throw ValueError("lm: lr must be a positive number");
  if (!(o.min_lr_ratio >= 0.0 && o.min_lr_ratio <= 1.0)) throw ValueError("lm: min_lr_ratio must lie in [0, 1]");
  if (!(o.weight_decay >= 0.0) || !std::isfinite(o.weight_decay)) throw ValueError("lm: weight_decay must be >= 0");
  if (!(o.clip >= 0.0) || !std::isfinite(o.clip)) throw ValueError("lm: clip must be >= 0 (0 turns clipping off)");
  if (!std::isfinite(o.model.birth_threshold)) throw ValueError("lm: birth_threshold must be a finite number");
  if (o.model.merge_threshold && !std::isfinite(*o.model.merge_threshold)) {
    throw ValueError("lm: merge_threshold must be a finite number when given");
  }
}
std::vector<int64_t> byte_tokens(std::string_view text) {
  std::vector<int64_t> out(text.size());
  std::transform(text.begin(), text.end(), out.begin(), [](char c) { return static_cast<int64_t>(static_cast<unsigned char>(c)); });
  return out;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> split_heldout(std::span<const int64_t> tokens, double fraction) {
  if (!(fraction > 0.0 && fraction < 1.0)) {
    throw ValueError("lm: the held-out fraction must lie in (0, 1)");
  }
  const auto n = static_cast<int64_t>(tokens.size());
  const auto held = static_cast<int64_t>(std::ceil(fraction * static_cast<double>(n)));
  if (held < 2 || n - held < 2) {
    throw ValueError("lm: the text is too short to split into training and held-out parts (" + str(n) + " tokens)");
  }
  return {{tokens.begin(), tokens.end() - held}, {tokens.end() - held, tokens.end()}};
}

uint64_t corpus_fingerprint(std::span<const int64_t> tokens) {
  uint64_t h = 1469598103934665603ULL;
  for (const int64_t t : tokens) {
    h ^= static_cast<uint64_t>(t);
    h *= 1099511628211ULL;
  }
  return h;
}

TrainSummary train(const TrainOptions& requested, std::span<const int64_t> tokens, const std::string& resume_from,
                   const std::string& out, const std::function<void(const Progress&)>& on_progress,
                   std::span<const int64_t> heldout) {
  validate(requested);
  if (!heldout.empty() && heldout.size() < 2) {
    throw ValueError("lm train: the held-out part needs at least 2 tokens (got " +
                     str(static_cast<int64_t>(heldout.size())) + ")");
  }
  at::set_num_threads(requested.threads);
  std::optional<LoadedCheckpoint> checkpoint;
  TrainOptions options = requested;
  if (!resume_from.empty()) {
    checkpoint.emplace(open_checkpoint(resume_from));
    options = checkpoint_options(resume_from, checkpoint->meta);
  }
  return with_kind(options.model.mechanism, [&](auto kind) {
    using Kind = decltype(kind);
    Session<Kind> s;
    if (!checkpoint) {
      s.options = requested;
      torch::manual_seed(s.options.seed);
      s.model = Kind::make(s.options.model);
      s.optimizer = make_optimizer(*s.model, s.options);
      s.corpus_tokens = static_cast<int64_t>(tokens.size());
      s.corpus_fingerprint = corpus_fingerprint(tokens);
    } else {
      s = load_session<Kind>(resume_from, *checkpoint, options, /*with_training=*/true);
      if (s.corpus_tokens != static_cast<int64_t>(tokens.size()) ||
          s.corpus_fingerprint != corpus_fingerprint(tokens)) {
        throw std::runtime_error(resume_from + ": the checkpoint was trained on a different corpus (" +
                                 str(s.corpus_tokens) + " tokens, fingerprint " +
                                 std::to_string(s.corpus_fingerprint) + "; these training tokens: " +
                                 str(static_cast<int64_t>(tokens.size())) + ", fingerprint " +
                                 std::to_string(corpus_fingerprint(tokens)) +
                                 "); resume with the same training tokens");
      }
      s.options.steps = requested.steps;
      if (s.step > s.options.steps) {
        throw ValueError("lm train: the checkpoint " + resume_from + " is at step " + str(s.step) +
                         ", beyond steps = " + str(requested.steps));
      }
    }
    s.options.threads = requested.threads;
    s.options.checkpoint_every = requested.checkpoint_every;
    s.options.eval_every = requested.eval_every;
    return train_kind(s, tokens, out, on_progress, heldout);
  });
}

Evaluation evaluate(const std::string& checkpoint, std::span<const int64_t> tokens, int64_t chunk, int threads,
                    WindowCache window_cache) {
  if (chunk <= 0) throw ValueError("lm eval: chunk must be a positive integer");
  if (threads <= 0) throw ValueError("lm eval: threads must be a positive integer");
  if (tokens.size() < 2) throw ValueError("lm eval: the text needs at least 2 tokens");
  at::set_num_threads(threads);
  auto c = open_checkpoint(checkpoint);
  const TrainOptions options = checkpoint_options(checkpoint, c.meta);
  return with_kind(options.model.mechanism, [&](auto kind) {
    using Kind = decltype(kind);
    check_window_cache<Kind>(options.model.mechanism, window_cache, "lm eval");
    auto s = load_session<Kind>(checkpoint, c, options, /*with_training=*/false);
    check_vocabulary(tokens, s.options.model.vocab, "lm eval");
    return evaluate_model<Kind>(s.model, tokens, chunk, window_cache);
  });
}

std::vector<int64_t> generate(const std::string& checkpoint, std::span<const int64_t> prompt,
                              const GenerateOptions& g) {
  if (prompt.empty()) throw ValueError("lm generate: the prompt must not be empty");
  if (g.tokens < 0) throw ValueError("lm generate: the number of tokens must be >= 0");
  if (!(g.temperature > 0.0) || !std::isfinite(g.temperature)) throw ValueError("lm generate: temperature must be > 0");
  if (g.top_k < 0) throw ValueError("lm generate: top_k must be >= 0");
  if (g.threads <= 0) throw ValueError("lm generate: threads must be a positive integer");
  at::set_num_threads(g.threads);
  auto c = open_checkpoint(checkpoint);
  const TrainOptions options = checkpoint_options(checkpoint, c.meta);
  return with_kind(options.model.mechanism, [&](auto kind) {
    using Kind = decltype(kind);
    check_window_cache<Kind>(options.model.mechanism, g.window_cache, "lm generate");
    auto s = load_session<Kind>(checkpoint, c, options, /*with_training=*/false);
    check_vocabulary(prompt, s.options.model.vocab, "lm generate");
    return generate_kind<Kind>(s.model, prompt, g);
  });
}

CheckpointInfo read_checkpoint_info(const std::string& checkpoint) {
  auto c = open_checkpoint(checkpoint);
  CheckpointInfo info;
  info.options = checkpoint_options(checkpoint, c.meta);
  info.model = info.options.model;
  try {
    info.step = c.meta.at("step").get<int64_t>();
    info.corpus_tokens = c.meta.at("corpus").at("tokens").get<int64_t>();
    info.corpus_fingerprint = c.meta.at("corpus").at("fnv1a").get<uint64_t>();
  } catch (const json::exception& e) {
    bad_checkpoint(checkpoint, std::string("meta: ") + e.what());
  }
  if (info.step < 0 || info.step > info.options.steps) {
    bad_checkpoint(checkpoint, "field step (" + str(info.step) + ") must lie in [0, options.steps = " +
                                   str(info.options.steps) + "]");
  }
  return info;
}

}  // namespace attnmix::stream
