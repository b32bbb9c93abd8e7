// SPDX-License-Identifier: Apache-2.0
// attnmix._stream (re-exported by python/attnmix/experimental/): the pure functions of
// docs/mechanisms.md#streaming-language-model and #moment-closure-far-field (RoPE, attention_law, the cluster-bank
// operations) on numpy arrays, and the streaming language models of stream/language_model.hpp and stream/far_field.hpp
// on token arrays.
//
// Arrays come in through the strict conversion layer (convert.hpp) and cross into libtorch as
// float64 tensors (a copy); results are copied out as float64 numpy arrays. ClusterBank wraps the
// C++ struct: banks returned by the functions are kept as they are, and one built from Python
// arrays is checked first (shapes, finiteness, a live prefix within max_clusters, non-negative
// counts and variances, all-zero inactive slots), since the library takes a bank's invariants for
// granted. The calls that compute run with the GIL released.
//
// The language-model options are keyword arguments named after the C++ fields (nested ones
// flattened: `vocab` is TrainOptions::model.vocab, `keys` is RecallRunOptions::task.keys); their
// defaults come from the C++ structs. Each field is one line of an option table below, and a field
// of a type the table does not know fails to compile.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/stream/far_field.hpp"
#include "attnmix/stream/language_model.hpp"
#include "attnmix/stream/progress_record.hpp"
#include "attnmix/stream/memory_bench_record.hpp"
#include "attnmix/stream/memory_benchmark.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "attnmix/stream/moment_propagation.hpp"
#include "attnmix/stream/option_table.hpp"
#include "attnmix/stream/rope.hpp"
#include "convert.hpp"
#include "stream_receipts.hpp"

namespace attnmix::python {

using namespace attnmix::stream;  // the streaming models this file exposes

namespace {

using namespace pybind11::literals;

// ---- arrays in and out --------------------------------------------------------------------------

/// A float64 CPU tensor holding a copy of the array.
torch::Tensor tensor_of(NdArray<double>& a) {
  const std::vector<int64_t> shape(a.shape.begin(), a.shape.end());
  if (a.values.empty()) return torch::zeros(shape, torch::kDouble);
  return torch::from_blob(a.values.data(), shape, torch::kDouble).clone();
}

/// A real array of any dimensionality as a float64 CPU tensor (a copy).
torch::Tensor real_tensor(py::handle obj, std::string_view where, std::string_view name) {
  NdArray<double> a = read_reals(obj, where, name);
  return tensor_of(a);
}

/// A float64 numpy copy of a tensor.
py::array_t<double> array_out(const torch::Tensor& t) {
  const auto c = t.detach().to(torch::kCPU, torch::kDouble).contiguous();
  const std::vector<Index> shape(c.sizes().begin(), c.sizes().end());
  return copy_reals(c.numel() > 0 ? c.data_ptr<double>() : nullptr, shape);
}

py::array_t<int64_t> ids_out(const std::vector<int64_t>& v) {
  return copy_ids(v.data(), {static_cast<Index>(v.size())});
}

/// A 1-D id array (tokens, positions) as a vector.
std::vector<int64_t> id_vector(py::handle obj, std::string_view where, std::string_view name) {
  const IdVector ids = ids_1d(obj, where, name);
  return {ids.data(), ids.data() + ids.size()};
}

/// Any integer (Python or numpy, not bool, not float) as int64; range checks are the library's.
int64_t integer(py::handle obj, std::string_view where, std::string_view name) {
  const std::string what = std::string(where) + ": " + std::string(name);
  const bool numpy_bool = py::isinstance(obj, py::module_::import("numpy").attr("bool_"));
  if (PyBool_Check(obj.ptr()) || numpy_bool)
    throw TypeError(what + " must be an integer, not bool");
  if (PyFloat_Check(obj.ptr()) || PyIndex_Check(obj.ptr()) == 0) {
    throw TypeError(what + " must be an integer (got " + type_name(obj) + ")");
  }
  const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0) throw ValueError(what + " is out of range (beyond 64 bits)");
  return static_cast<int64_t>(v);
}

/// A file path: str or os.PathLike.
std::string path_arg(py::handle obj, std::string_view where, std::string_view name) {
  const py::object path = py::module_::import("os").attr("fspath")(obj);
  if (!PyUnicode_Check(path.ptr())) {
    throw TypeError(std::string(where) + ": " + std::string(name) +
                    " must be a str or os.PathLike of str (got " + type_name(obj) + ")");
  }
  std::string text = path.cast<std::string>();
  // The system would read the path up to the NUL: another file.
  if (text.find('\0') != std::string::npos)
    throw ValueError(std::string(where) + ": " + std::string(name) +
                     " contains a NUL byte (a path cannot)");
  return text;
}

void require_callable(py::handle obj, std::string_view where, std::string_view name) {
  if (!obj.is_none() && PyCallable_Check(obj.ptr()) == 0) {
    throw TypeError(std::string(where) + ": " + std::string(name) +
                    " must be None or callable (got " + type_name(obj) + ")");
  }
}

// ---- ClusterBank from Python arrays -------------------------------------------------------------

constexpr std::string_view kBank = "ClusterBank";

// A bank from Python arrays: read as float64, then checked by the library (validate_cluster_bank).
ClusterBank make_bank(const py::object& count_obj, const py::object& mu_k_obj,
                      const py::object& mu_v_obj, const py::object& sigma_kk_obj,
                      const py::object& sigma_vk_obj, const py::object& n_clusters_obj,
                      const py::object& max_clusters_obj) {
  ClusterBank bank;
  bank.count = real_tensor(count_obj, kBank, "count");
  bank.mu_k = real_tensor(mu_k_obj, kBank, "mu_k");
  bank.mu_v = real_tensor(mu_v_obj, kBank, "mu_v");
  bank.sigma_kk = real_tensor(sigma_kk_obj, kBank, "sigma_kk");
  bank.sigma_vk = real_tensor(sigma_vk_obj, kBank, "sigma_vk");
  bank.n_clusters = id_vector(n_clusters_obj, kBank, "n_clusters");
  bank.max_clusters = max_clusters_obj.is_none()
                          ? (bank.count.dim() == 3 ? bank.count.size(2) : 0)
                          : positive_int(max_clusters_obj, kBank, "max_clusters");
  validate_cluster_bank(bank, std::string(kBank));
  return bank;
}

py::tuple bank_state(const ClusterBank& b) {
  return py::make_tuple(array_out(b.count), array_out(b.mu_k), array_out(b.mu_v),
                        array_out(b.sigma_kk), array_out(b.sigma_vk), ids_out(b.n_clusters),
                        b.max_clusters);
}

// ---- receipts -----------------------------------------------------------------------------------

py::object array_object(const torch::Tensor& t) { return array_out(t); }

py::tuple ingest_out(IngestResult&& result, bool ingest) {
  py::list receipts;
  for (const auto& r : result.receipts) receipts.append(receipt_out(r, ingest, &array_object));
  return py::make_tuple(std::move(result.bank), receipts);
}

BirthMergeOptions birth_merge_options(py::handle birth_threshold, py::handle merge_threshold,
                                      py::handle outlier_top_k, py::handle cluster_rule, std::string_view where) {
  BirthMergeOptions o;
  o.cluster_rule = cluster_rule_arg(cluster_rule, where);
  o.birth_threshold = real_number(birth_threshold, where, "birth_threshold");
  if (!merge_threshold.is_none())
    o.merge_threshold = real_number(merge_threshold, where, "merge_threshold");
  // docs/mechanisms.md#moment-closure-far-field lists a non-integer outlier_top_k (bool included) among the
  // ValueErrors.
  try {
    o.outlier_top_k = nonnegative_int(outlier_top_k, where, "outlier_top_k");
  } catch (const TypeError& e) {
    throw ValueError(e.what());
  }
  return o;
}

// birth_and_merge and ingest_cluster_batch: (bank, k, v, *, birth_threshold, merge_threshold, outlier_top_k) →
// (bank, receipts); `ingested` adds the ingestion fields to each receipt.
void bind_birth_merge(py::module_& m, const char* name,
                      IngestResult (*fn)(const ClusterBank&, const torch::Tensor&, const torch::Tensor&,
                                         const BirthMergeOptions&),
                      bool ingested, const char* doc) {
  m.def(
      name,
      [fn, name, ingested](const ClusterBank& bank, const py::object& k_obj, const py::object& v_obj,
                           const py::object& birth_threshold, const py::object& merge_threshold,
                           const py::object& outlier_top_k, const py::object& cluster_rule) {
        const std::string_view w = name;
        const auto o = birth_merge_options(birth_threshold, merge_threshold, outlier_top_k, cluster_rule, w);
        const auto k = real_tensor(k_obj, w, "k");
        const auto v = real_tensor(v_obj, w, "v");
        IngestResult result;
        {
          py::gil_scoped_release release;
          result = fn(bank, k, v, o);
        }
        return ingest_out(std::move(result), ingested);
      },
      py::arg("bank"), py::arg("k"), py::arg("v"), py::kw_only(), py::arg("birth_threshold"),
      py::arg("merge_threshold") = py::none(),
      py::arg("outlier_top_k") = BirthMergeOptions{}.outlier_top_k, py::arg("cluster_rule") = "threshold", doc);
}

// ---- attention_law ------------------------------------------------------------------------------

GaussianLaw make_law(py::handle mean, py::handle cov, std::string_view where) {
  GaussianLaw law{real_tensor(mean, where, "mean"), real_tensor(cov, where, "cov")};
  if (law.mean.dim() != 1 || law.cov.dim() != 2 || law.cov.size(0) != law.mean.size(0) ||
      law.cov.size(1) != law.mean.size(0)) {
    throw ValueError(std::string(where) + ": mean must be a vector (d) and cov a (d, d) matrix");
  }
  return law;
}

GaussianLaw law_arg(py::handle obj) {
  if (py::isinstance<GaussianLaw>(obj)) return obj.cast<GaussianLaw>();
  if (PySequence_Check(obj.ptr()) == 1 && !PyUnicode_Check(obj.ptr()) && py::len(obj) == 2) {
    const auto pair = py::reinterpret_borrow<py::sequence>(obj);
    return make_law(py::object(pair[0]), py::object(pair[1]), "attention_law");
  }
  throw TypeError("attention_law: law must be a GaussianLaw or a (mean, cov) pair (got " +
                  type_name(obj) + ")");
}

// ---- keyword option tables ----------------------------------------------------------------------

template <class T>
inline constexpr bool kUnsupportedOption = false;

template <class T>
T option_in(py::handle value, std::string_view where, std::string_view name) {
  if constexpr (std::is_same_v<T, int64_t>) {
    return integer(value, where, name);
  } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
    const int64_t v = integer(value, where, name);
    if (v < 0 || (std::is_same_v<T, int> && v > std::numeric_limits<int>::max())) {
      throw ValueError(std::string(where) + ": " + std::string(name) + " is out of range (got " +
                       std::to_string(v) + ")");
    }
    return static_cast<T>(v);
  } else if constexpr (std::is_same_v<T, double>) {
    return real_number(value, where, name);
  } else if constexpr (std::is_same_v<T, bool>) {
    return flag(value, where, name);
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    return value.is_none() ? T{} : T{real_number(value, where, name)};
  } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
    return value.is_none() ? T{} : T{integer(value, where, name)};
  } else if constexpr (std::is_same_v<T, std::vector<std::string>> || std::is_same_v<T, std::vector<int64_t>> ||
                       std::is_same_v<T, std::vector<uint64_t>>) {
    if (PyUnicode_Check(value.ptr()) || !PySequence_Check(value.ptr())) {
      throw TypeError(std::string(where) + ": " + std::string(name) + " must be a list (got " + type_name(value) +
                      ")");
    }
    T out;
    for (const py::handle item : py::reinterpret_borrow<py::sequence>(value)) {
      if constexpr (std::is_same_v<T, std::vector<std::string>>) {
        if (!PyUnicode_Check(item.ptr())) {
          throw TypeError(std::string(where) + ": " + std::string(name) + " must hold str (got " + type_name(item) +
                          ")");
        }
        out.push_back(item.cast<std::string>());
      } else {
        out.push_back(option_in<typename T::value_type>(item, where, name));
      }
    }
    return out;
  } else if constexpr (std::is_enum_v<T>) {
    if (!PyUnicode_Check(value.ptr())) {
      throw TypeError(std::string(where) + ": " + std::string(name) + " must be a str (got " +
                      type_name(value) + ")");
    }
    return stream::NamedValues<T>::parse(value.cast<std::string>(), where);
  } else {
    static_assert(kUnsupportedOption<T>,
                  "bind_stream.cpp: teach option_in/option_out this field type");
  }
}

template <class T>
py::object option_out(const T& value) {
  if constexpr (std::is_enum_v<T>) {
    return py::str(stream::NamedValues<T>::name(value));
  } else {
    return py::cast(value);  // numbers, bool, optional (None)
  }
}

/// Options with the keyword arguments applied over the C++ defaults; an unknown name → TypeError,
/// like Python.
template <class Options>
Options options_from(const py::kwargs& kwargs, const stream::OptionTableOf<Options>& table, std::string_view where) {
  Options o;
  for (const auto& [key, value] : kwargs) {
    const auto name = py::str(key).cast<std::string>();
    const auto option =
        std::find_if(table.begin(), table.end(), [&](const auto& entry) { return name == entry.name; });
    if (option == table.end()) {
      throw TypeError(std::string(where) + "() got an unexpected keyword argument '" + name + "'");
    }
    std::visit(
        [&](const auto& field) {
          auto& target = field(o);
          target = option_in<std::remove_reference_t<decltype(target)>>(value, where, option->name);
        },
        option->field);
  }
  return o;
}

template <class Options>
py::dict options_out(Options o, const stream::OptionTableOf<Options>& table) {  // a copy: fields are reached mutably
  py::dict out;
  for (const auto& option : table)
    out[py::str(std::string(option.name))] = std::visit([&](const auto& field) { return option_out(field(o)); },
                                                         option.field);
  return out;
}

/// `doc` with "{options}" replaced by the table's keywords, each with what it means, as a list.
template <class Options>
std::string options_doc(std::string_view doc, const stream::OptionTableOf<Options>& table) {
  const auto keyword = [](std::string_view option) { return std::string(option); };
  constexpr std::string_view kPlace = "{options}";
  const size_t at = doc.find(kPlace);
  std::string out(doc.substr(0, at));
  for (const auto& option : table) {
    if (&option != &table.front()) out += '\n';
    out.append("- ``").append(option.name).append("``: ").append(with_option_names(option.help, keyword));
    if (option.choices == nullptr) continue;
    out += " (each one of ";
    for (const std::string& choice : *option.choices) out.append(choice).append(", ");
    out.replace(out.size() - 2, 2, ")");
  }
  return out.append(doc.substr(at + kPlace.size()));
}

/// 'Literal["a", "b"]': a choice among names, as a Python annotation.
std::string literal(const std::vector<std::string>& names) {
  std::string out = "Literal[";
  for (const std::string& name : names) out.append("\"").append(name).append("\", ");
  out.replace(out.size() - 2, 2, "]");
  return out;
}

/// The Python annotation of an option of type T ("int", "float | None", 'Literal["cosine", "constant"]').
template <class T>
std::string annotation(const std::vector<std::string>* choices) {
  if constexpr (std::is_enum_v<T>) {
    return literal(stream::value_names<T>());
  } else if constexpr (std::is_same_v<T, double>) {
    return "float";
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    return "float | None";
  } else if constexpr (std::is_integral_v<T>) {
    return "int";
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return "list[" + (choices != nullptr ? literal(*choices) : std::string("str")) + "]";
  } else {
    return "list[int]";
  }
}

/// [{name, type, default}] of a table, for the stubs (scripts/generate_stubs.py).
template <class Options>
py::list table_out(const stream::OptionTableOf<Options>& table) {
  Options defaults;
  py::list out;
  for (const auto& option : table) {
    std::visit(
        [&](const auto& field) {
          using T = std::remove_reference_t<decltype(field(defaults))>;
          out.append(py::dict("name"_a = std::string(option.name), "type"_a = annotation<T>(option.choices),
                              "default"_a = option_out(field(defaults))));
        },
        option.field);
  }
  return out;
}

// ---- language-model results ---------------------------------------------------------------------

py::list far_field_out(const std::vector<stream::LayerClusterStats>& layers) {
  py::list out;
  for (const auto& s : layers) {
    out.append(py::dict("clusters"_a = s.clusters, "births"_a = s.births, "merges"_a = s.merges,
                        "ingestions"_a = s.ingestions, "mean_misfit"_a = s.mean_misfit));
  }
  return out;
}

py::dict evaluation_out(const stream::Evaluation& e) {
  return py::dict("tokens"_a = e.tokens, "mean_cross_entropy"_a = e.mean_cross_entropy,
                  "bits_per_token"_a = e.bits_per_token, "seconds"_a = e.seconds,
                  "state_bytes"_a = e.state_bytes, "far_field"_a = far_field_out(e.far_field));
}

py::dict summary_out(const stream::TrainSummary& s) {
  return py::dict(
      "first_step"_a = s.first_step, "steps"_a = s.steps, "losses"_a = py::cast(s.losses),
      "tokens"_a = s.tokens, "seconds"_a = s.seconds, "parameters"_a = s.parameters,
      "state_bytes"_a = s.state_bytes, "far_field"_a = far_field_out(s.far_field),
      "heldout"_a = s.heldout ? py::object(evaluation_out(*s.heldout)) : py::object(py::none()));
}

/// The progress record of the CLI's --history line, with the run's length and the time still to go.
py::object progress_out(const stream::Progress& p) {
  nlohmann::ordered_json record = stream::progress_record(p);
  record["steps"] = p.steps;
  record["eta_seconds"] = p.eta_seconds;
  return json_to_python(record);
}

// ---- docstrings ---------------------------------------------------------------------------------

constexpr const char* kMemoryBenchDoc =
    R"doc(The memory benchmark (stream/memory_benchmark.hpp): how much each mechanism remembers against the
distance to the evidence, the load on the memory and the state it carries.

For every task setting, mechanism and seed a fresh model trains and is scored at the answers of
eval_sequences fresh sequences; every mechanism of a seed starts from the same backbone parameters
and sees the same sequences. Tasks: "recall" (each of recall_pairs key-value pairs, each of
recall_gaps filler tokens, then every key asked), "mqar" (multi-query associative recall: mqar_pairs
pairs, queries spread over sequences of each of mqar_lengths tokens) and "passkey" (a 5-digit key at
a random depth in filler text of each of passkey_lengths bytes, asked at the end).
Keyword options: those of default_memory_bench_options(), whose help says what each means (lists
where plural; the model and training settings are run_recall's).
on_run(index, total, task, setting, mechanism, seed) is called before each run.
Returns {"runs": [run_recall's dict plus task, setting, seed], "cases": [{task, setting, mechanism,
seeds, accuracy (mean), accuracy_min, accuracy_max, cross_entropy, chance, state_bytes, seconds,
share_of_full_gain (None unless window and full ran and full beat the window)}]}. ValueError for
invalid options, before anything trains.

Example (two mechanisms on one tiny recall setting, one training step each):

>>> from attnmix.experimental import run_memory_benchmark
>>> runs = []
>>> report = run_memory_benchmark(on_run=lambda *run: runs.append(run), mechanisms=["window", "full"],
...                               tasks=["recall"], recall_gaps=[12], recall_pairs=[1], seeds=[0], d_model=8,
...                               n_layer=1, chunk=8, batch=2, steps=1, eval_sequences=4)
>>> runs  # (index, total, task, setting, mechanism, seed) before each run
[(1, 2, 'recall', 'gap 12, pairs 1', 'window', 0), (2, 2, 'recall', 'gap 12, pairs 1', 'full', 0)]
>>> [(case["mechanism"], case["seeds"], case["chance"]) for case in report["cases"]]  # chance: 1 of 16 values
[('window', 1, 0.0625), ('full', 1, 0.0625)]
>>> len(report["runs"]), all(0.0 <= run["accuracy"] <= 1.0 for run in report["runs"])
(2, True)
)doc";

constexpr const char* kClusterBankDoc =
    R"doc(One layer's far-field mixtures, one per stream (docs/mechanisms.md#moment-closure-far-field).

B streams, H heads, C = max_clusters slots, d = head_dim. Slots at and beyond n_clusters[b] are
inactive and all zero. The properties return float64 copies; a bank never changes in place (the
functions return new banks).

The constructor, ClusterBank(count (B,H,C), mu_k (B,H,C,d), mu_v (B,H,C,d), sigma_kk (B,H,C,d),
sigma_vk (B,H,C,d,d), n_clusters (B,), max_clusters=None), checks shapes, finiteness,
0 <= n_clusters <= C, count >= 0, sigma_kk >= 0 and all-zero inactive slots (ValueError);
max_clusters, when given, must equal C. Banks pickle.

Example (one stream, one head, two slots of which slot 0 is live, head_dim 1):

>>> import pickle
>>> import numpy as np
>>> from attnmix.experimental import ClusterBank
>>> count = np.array([[[5.0, 0.0]]])  # 1 stream, 1 head, 2 slots: slot 0 live
>>> mu_k = np.array([[[[0.5], [0.0]]]])  # head_dim 1
>>> sigma_kk = np.array([[[[0.25], [0.0]]]])
>>> bank = ClusterBank(count, mu_k, -mu_k, sigma_kk, np.zeros((1, 1, 2, 1, 1)), n_clusters=[1])
>>> bank
ClusterBank(batch_size=1, n_head=1, max_clusters=2, head_dim=1, n_clusters=[1])
>>> bank.total_per_head().tolist(), pickle.loads(pickle.dumps(bank)).mu_v[0, 0, 0].tolist()
([[5.0]], [-0.5])
>>> ClusterBank(count, mu_k, -mu_k, sigma_kk, np.zeros((1, 1, 2, 1, 1)), n_clusters=[0])
Traceback (most recent call last):
    ...
ValueError: ClusterBank: the inactive slot 0 of stream 0 (head 0) must be all zeros (n_clusters[0] = 0)
)doc";

constexpr const char* kBirthMergeDoc =
    R"(Birth, merge and the misfit receipt, per stream (docs/mechanisms.md#moment-closure-far-field).

k, v: (B, t, H, d). cluster_rule: "threshold" (births and merges by birth_threshold and
merge_threshold) or "budget" (every chunk births a cluster; when every slot is live the closest
two merge first; no other merges). Returns (bank, receipts): one dict per stream with the keys birthed,
birth_incorporated_batch, merged (list of (i, j)), merge_distances (only when a merge happened),
misfit ({cluster: float}), per_cluster_outlier_tokens ({cluster: {k, v: (n_out, H, d), indices,
residuals, member_indices}}, at most outlier_top_k tokens each) and misfit_scalar. ValueError for
shapes, non-finite values or a bad outlier_top_k; RuntimeError for a non-finite cluster distance.)";

constexpr const char* kIngestDoc =
    R"(Birth/merge, then the soft update of streams whose batch no birth absorbed.

The far field is described in docs/mechanisms.md#moment-closure-far-field. Returns (bank, receipts)
as birth_and_merge, each receipt also holding soft_update_applied, ingested_tokens_per_head,
expected_ingested_tokens_per_head and count_conserved. RuntimeError
("cluster ingestion did not count every observation exactly once ...") when a head's total did not
grow by exactly t.)";

constexpr const char* kTrainDoc =
    R"doc(Trains a streaming language model on a 1-D token array (stream/language_model.hpp).

Keyword options: those of default_train_options(), whose help says what each means. heldout: tokens to evaluate the final model on (and, with
eval_every = K > 0, the model after every K-th step); out: checkpoint path to write (None: no
file); resume_from: a checkpoint to continue; on_progress(dict) is called after every step with
step, steps, loss, tokens_per_second, elapsed_seconds, eta_seconds and, for moment closure, the
per-layer lists clusters, bank_mass and far_share; at the scored steps also heldout_bits_per_byte
(the lines of ``attnmix lm train --history``). Returns {first_step, steps, losses,
tokens, seconds, parameters, state_bytes, far_field, heldout}. ValueError for invalid options or
tokens; RuntimeError for a bad checkpoint or a non-finite loss.

Example (a tiny byte-level model, 20 steps on a repetitive text):

>>> import os, tempfile
>>> from attnmix.experimental import byte_tokens, train_language_model
>>> tokens = byte_tokens("the cat sat on the mat. " * 20)  # 480 bytes
>>> progress = []
>>> with tempfile.TemporaryDirectory() as folder:
...     path = os.path.join(folder, "tiny.ckpt")
...     summary = train_language_model(tokens[:400], heldout=tokens[400:], out=path, on_progress=progress.append,
...                                    d_model=16, n_layer=1, window=8, batch=2, chunk=8, steps=20, lr=1e-2)
...     written = os.path.exists(path)
>>> written, summary["steps"], len(summary["losses"]), summary["tokens"]  # 20 steps of 2 x 8 tokens
(True, 20, 20, 320)
>>> [p["step"] for p in progress[-2:]], progress[-1]["loss"] == summary["losses"][-1]
([19, 20], True)
>>> summary["losses"][-1] < summary["losses"][0]
True
>>> summary["heldout"]["bits_per_token"] < 8  # below the uniform code over 256 bytes
True
)doc";

constexpr const char* kRecallDoc =
    R"doc(Trains and evaluates one mechanism on the far-field recall task (stream/far_field.hpp).

mechanism: "window", "moment-closure", "moment-closure+outliers" (with an outlier store of
outlier_capacity tokens per cluster), "linear", "frequent-directions" (the window plus a sketch of
sketch_rows rows per head), "tensor-sketch" (the window plus sums over a degree-sketch_degree tensor
sketch of width sketch_dim) or "full".
Keyword options: those of default_recall_options(), whose help says what each means. on_step(step, loss) is called after every training step. Returns
{mechanism, accuracy, cross_entropy, first_loss, last_loss, state_bytes, seconds}: first_loss and
last_loss are the mean training losses of the first and the last 10 steps.

Example (linear attention, three training steps of a tiny model):

>>> import math
>>> from attnmix.experimental import run_recall
>>> losses = []
>>> result = run_recall("linear", on_step=lambda step, loss: losses.append(loss), d_model=16, n_layer=1, chunk=8,
...                     gap=8, batch=4, steps=3, eval_sequences=8)
>>> result["mechanism"], len(losses), 0.0 <= result["accuracy"] <= 1.0
('linear', 3, True)
>>> math.isclose(result["first_loss"], sum(losses) / 3)  # the mean of the first (here: all) steps
True
>>> result["state_bytes"]  # 2 heads of 8: S (2 x 8 x 8) and z (2 x 8) float64, a shift row (16) float32
1216
)doc";

constexpr const char* kGaussianLawDoc =
    R"doc(A Gaussian law over a d-vector: mean (d,), cov (d, d). Unpacks as (mean, cov).

GaussianLaw(mean, cov), or GaussianLaw(mu=..., covar=...) with the reference design's names.

Example:

>>> import numpy as np
>>> from attnmix.experimental import GaussianLaw
>>> law = GaussianLaw(np.zeros(2), np.eye(2))
>>> law
GaussianLaw(d=2)
>>> mean, cov = law  # unpacks as (mean, cov)
>>> mean.tolist(), cov.tolist()
([0.0, 0.0], [[1.0, 0.0], [0.0, 1.0]])
>>> GaussianLaw(mu=[1.0], covar=[[2.0]]).cov.tolist()  # the reference's keyword names
[[2.0]]
)doc";

constexpr const char* kRopeTablesDoc =
    R"doc(cos and sin of the RoPE angles (docs/mechanisms.md#streaming-language-model) of integer
positions (t,): each (t, head_dim), float64. ValueError for an odd head_dim.

Example:

>>> import numpy as np
>>> from attnmix.experimental import rope_tables
>>> cos, sin = rope_tables([0, 1, 2], head_dim=4)
>>> cos.shape, cos[0].tolist(), sin[0].tolist()  # position 0: no rotation
((3, 4), [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0])
>>> bool(np.allclose(cos**2 + sin**2, 1.0))
True
>>> np.round(np.arctan2(sin[1], cos[1]), 4).tolist()  # position 1's angles: frequencies 10000^(-2i/head_dim)
[1.0, 0.01, 1.0, 0.01]
)doc";

constexpr const char* kRotateHalfDoc =
    R"doc([-x2, x1] over the last axis (of even size), x = [x1, x2].

Example:

>>> from attnmix.experimental import rotate_half
>>> rotate_half([1.0, 2.0, 3.0, 4.0]).tolist()
[-3.0, -4.0, 1.0, 2.0]
)doc";

constexpr const char* kApplyRopeDoc =
    R"doc(RoPE(x) = x * cos + rotate_half(x) * sin, x (..., t, H, head_dim), tables (t, head_dim)
(docs/mechanisms.md#streaming-language-model).

Example (the rotation keeps lengths, and the score of a rotated query and key depends only on the
distance between their positions):

>>> import numpy as np
>>> from attnmix.experimental import apply_rope, rope_tables
>>> q, k = np.random.default_rng(0).standard_normal((2, 4))  # a query and a key, head_dim 4
>>> cos, sin = rope_tables(np.arange(5), 4)
>>> q_rot = apply_rope(np.tile(q, (5, 1, 1)), cos, sin)[:, 0]  # at positions 0..4 (x: (t, H, head_dim))
>>> k_rot = apply_rope(np.tile(k, (5, 1, 1)), cos, sin)[:, 0]
>>> q_rot[0].tolist() == q.tolist(), bool(np.allclose(np.linalg.norm(q_rot, axis=1), np.linalg.norm(q)))
(True, True)
>>> scores = q_rot @ k_rot.T  # scores[i, j]: the query at position i, the key at position j
>>> bool(np.isclose(scores[1, 0], scores[4, 3]) and np.isclose(scores[0, 2], scores[2, 4]))  # only i - j counts
True
>>> bool(np.isclose(scores[1, 0], scores[0, 1]))  # i - j = 1 and i - j = -1 differ
False
)doc";

constexpr const char* kDefaultTrainDoc =
    R"doc(The keyword options of train_language_model and their defaults (a new dict).

{options}

Example:

>>> from attnmix.experimental import default_train_options
>>> options = default_train_options()  # each key is a keyword of train_language_model
>>> options["mechanism"], options["vocab"], options["d_model"], options["steps"]
('window', 256, 32, 300)
)doc";

constexpr const char* kEvaluateDoc =
    R"doc(Streams tokens through a checkpoint's model in chunks (one stream, no gradients): {tokens,
mean_cross_entropy, bits_per_token, seconds, state_bytes, far_field}. tokens counts the scored
tokens (every one but the first); mean_cross_entropy is in nats per token, bits_per_token the same
in bits (bits per byte for a byte-level model); far_field holds one dict per layer for moment
closure (clusters, births, merges, ingestions, mean_misfit) and is empty otherwise.
window_cache="int8" holds the window's keys and values as int8 between chunks (window, full and
moment-closure checkpoints; state_bytes then counts the int8 form).

Example (the checkpoint scores the held-out bytes as training did):

>>> import math, os, tempfile
>>> from attnmix.experimental import byte_tokens, evaluate_language_model, train_language_model
>>> tokens = byte_tokens("the cat sat on the mat. " * 20)  # 480 bytes
>>> with tempfile.TemporaryDirectory() as folder:
...     path = os.path.join(folder, "tiny.ckpt")
...     summary = train_language_model(tokens[:400], heldout=tokens[400:], out=path, mechanism="moment-closure",
...                                    d_model=16, n_layer=1, window=8, batch=2, chunk=8, steps=20, lr=1e-2)
...     result = evaluate_language_model(path, tokens[400:], chunk=8)
...     int8 = evaluate_language_model(path, tokens[400:], chunk=8, window_cache="int8")
>>> result["tokens"], result["bits_per_token"] < 8  # 80 bytes, 79 predicted; below 8 bits, the uniform code
(79, True)
>>> math.isclose(result["mean_cross_entropy"], summary["heldout"]["mean_cross_entropy"], rel_tol=1e-9)
True
>>> math.isclose(result["bits_per_token"], result["mean_cross_entropy"] / math.log(2))
True
>>> len(result["far_field"]), int8["state_bytes"] < result["state_bytes"]  # one layer's far field; int8 is smaller
(1, True)
)doc";

constexpr const char* kDefaultGenerateDoc =
    R"doc(The keyword options of generate_language_model and their defaults (a new dict).

{options}

Example:

>>> from attnmix.experimental import default_generate_options
>>> default_generate_options()
{'tokens': 200, 'temperature': 0.8, 'top_k': 0, 'seed': 0, 'threads': 1, 'window_cache': 'float32'}
)doc";

constexpr const char* kGenerateDoc =
    R"doc(Feeds the prompt, then draws tokens from the model (keyword options: those of
default_generate_options(), whose help says what each means); returns the drawn tokens (int64). The same
checkpoint, prompt and seed give the same tokens.

Example:

>>> import os, tempfile
>>> import numpy as np
>>> from attnmix.experimental import byte_tokens, generate_language_model, train_language_model
>>> tokens = byte_tokens("the cat sat on the mat. " * 20)  # 480 bytes
>>> with tempfile.TemporaryDirectory() as folder:
...     path = os.path.join(folder, "tiny.ckpt")
...     _ = train_language_model(tokens, out=path, d_model=16, n_layer=1, window=8, batch=2, chunk=8, steps=20,
...                              lr=1e-2)
...     drawn = generate_language_model(path, byte_tokens("the "), tokens=16, seed=1)
...     again = generate_language_model(path, byte_tokens("the "), tokens=16, seed=1)
>>> drawn.dtype, drawn.shape, bool(np.array_equal(drawn, again))  # one seed, one draw
(dtype('int64'), (16,), True)
>>> 0 <= int(drawn.min()) and int(drawn.max()) < 256  # bytes (bytes(drawn.tolist()) is the text)
True
)doc";

constexpr const char* kCheckpointInfoDoc =
    R"doc(What a checkpoint holds: {options, step, corpus_tokens, corpus_fingerprint}. options are
train_language_model's keyword options the model was trained with (threads, checkpoint_every and
eval_every are not stored: their defaults); corpus_fingerprint identifies the training tokens.

Example:

>>> import os, tempfile
>>> from attnmix.experimental import byte_tokens, checkpoint_info, train_language_model
>>> tokens = byte_tokens("the cat sat on the mat. " * 20)  # 480 bytes
>>> with tempfile.TemporaryDirectory() as folder:
...     path = os.path.join(folder, "tiny.ckpt")
...     _ = train_language_model(tokens, out=path, d_model=16, n_layer=1, window=8, batch=2, chunk=8, steps=5)
...     info = checkpoint_info(path)
>>> info["step"], info["corpus_tokens"], info["options"]["mechanism"], info["options"]["d_model"]
(5, 480, 'window', 16)
>>> sorted(info)
['corpus_fingerprint', 'corpus_tokens', 'options', 'step']
)doc";

constexpr const char* kByteTokensDoc =
    R"doc(The bytes of a text (str: UTF-8) as token ids 0..255 (int64).

Example:

>>> from attnmix.experimental import byte_tokens
>>> byte_tokens("héllo").tolist()  # é is two bytes in UTF-8
[104, 195, 169, 108, 108, 111]
>>> byte_tokens(b"ab").dtype
dtype('int64')
)doc";

constexpr const char* kDefaultRecallDoc =
    R"doc(The keyword options of run_recall and their defaults (a new dict).

{options}

Example:

>>> from attnmix.experimental import default_recall_options
>>> options = default_recall_options()  # each key is a keyword of run_recall
>>> options["gap"], options["window"]  # the keys lie beyond the window when they are asked
(24, 16)
)doc";

constexpr const char* kDefaultMemoryBenchDoc =
    R"doc(The keyword options of run_memory_benchmark and their defaults (a new dict).

{options}

Example:

>>> from attnmix.experimental import default_memory_bench_options
>>> options = default_memory_bench_options()  # each key is a keyword of run_memory_benchmark
>>> options["tasks"], len(options["mechanisms"]), options["seeds"]
(['recall', 'mqar', 'passkey'], 7, [0])
)doc";

}  // namespace

void bind_stream(py::module_& m) {
  // ---- ClusterBank ----
  py::class_<ClusterBank>(m, "ClusterBank", kClusterBankDoc)
      .def(py::init(&make_bank), py::arg("count"), py::arg("mu_k"), py::arg("mu_v"),
           py::arg("sigma_kk"), py::arg("sigma_vk"), py::arg("n_clusters"),
           py::arg("max_clusters") = py::none())
      .def_property_readonly("count", [](const ClusterBank& b) { return array_out(b.count); },
                             "Soft token counts, a float64 array of shape (B, H, C) (a copy).")
      .def_property_readonly("mu_k", [](const ClusterBank& b) { return array_out(b.mu_k); },
                             "Key means, a float64 array of shape (B, H, C, d) (a copy).")
      .def_property_readonly("mu_v", [](const ClusterBank& b) { return array_out(b.mu_v); },
                             "Value means, a float64 array of shape (B, H, C, d) (a copy).")
      .def_property_readonly("sigma_kk", [](const ClusterBank& b) { return array_out(b.sigma_kk); },
                             "Diagonal key variances (>= 0), a float64 array of shape (B, H, C, d) (a copy).")
      .def_property_readonly("sigma_vk", [](const ClusterBank& b) { return array_out(b.sigma_vk); },
                             "Value-key covariances Cov(v, k), a float64 array of shape (B, H, C, d, d) whose rows "
                             "index value dimensions (a copy).")
      .def_property_readonly("n_clusters",
                             [](const ClusterBank& b) { return ids_out(b.n_clusters); },
                             "Live clusters per stream, an int64 array of shape (B,): slots 0 .. n_clusters[b]-1 of "
                             "stream b are active, shared by its heads.")
      .def_readonly("max_clusters", &ClusterBank::max_clusters, "Cluster slots per stream and head C, an int.")
      .def_property_readonly("batch_size", &ClusterBank::batch_size, "Number of streams B, an int.")
      .def_property_readonly("n_head", [](const ClusterBank& b) { return b.mu_k.size(1); },
                             "Number of heads H, an int.")
      .def_property_readonly("head_dim", [](const ClusterBank& b) { return b.mu_k.size(3); },
                             "Head dimension d, an int.")
      .def(
          "total_per_head", [](const ClusterBank& b) { return array_out(b.total_per_head()); },
          "Per stream and head, the live total count: (B, H).")
      .def("__repr__",
           [](const ClusterBank& b) {
             std::string live;
             for (const int64_t n : b.n_clusters)
               live += (live.empty() ? "" : ", ") + std::to_string(n);
             return "ClusterBank(batch_size=" + std::to_string(b.batch_size()) +
                    ", n_head=" + std::to_string(b.mu_k.size(1)) +
                    ", max_clusters=" + std::to_string(b.max_clusters) +
                    ", head_dim=" + std::to_string(b.mu_k.size(3)) + ", n_clusters=[" + live + "])";
           })
      .def(py::pickle(&bank_state, [](const py::tuple& s) {
        if (s.size() != 7) throw ValueError("ClusterBank: a pickled bank is a 7-tuple");
        return make_bank(py::object(s[0]), py::object(s[1]), py::object(s[2]), py::object(s[3]),
                         py::object(s[4]), py::object(s[5]), py::object(s[6]));
      }));

  m.def(
      "empty_cluster_bank",
      [](const py::object& batch_size, const py::object& n_head, const py::object& max_clusters,
         const py::object& head_dim) {
        constexpr std::string_view w = "empty_cluster_bank";
        return empty_cluster_bank(integer(batch_size, w, "batch_size"),
                                  integer(n_head, w, "n_head"),
                                  integer(max_clusters, w, "max_clusters"),
                                  integer(head_dim, w, "head_dim"), torch::kDouble);
      },
      py::arg("batch_size"), py::arg("n_head"), py::arg("max_clusters"), py::arg("head_dim"),
      "An all-zero float64 bank. ValueError unless every size is positive.");

  m.def(
      "mgf_cluster_attention",
      [](const py::object& q_obj, const ClusterBank& bank) {
        const auto q = real_tensor(q_obj, "mgf_cluster_attention", "q");
        ClusterAttention result;
        {
          py::gil_scoped_release release;
          result = mgf_cluster_attention(q, bank);
        }
        return py::make_tuple(array_out(result.out), array_out(result.logits));
      },
      py::arg("q"), py::arg("bank"),
      "q (B, t, H, d) -> (out (B, t, n, H, d), logits (B, t, n, H)), n = max(bank.n_clusters) "
      "(docs/mechanisms.md#moment-closure-far-field). Slots beyond a stream's live prefix get "
      "logit -inf and output 0.");

  m.def(
      "cluster_responsibilities",
      [](const py::object& k_obj, const ClusterBank& bank) {
        const auto k = real_tensor(k_obj, "cluster_responsibilities", "k");
        torch::Tensor r;
        {
          py::gil_scoped_release release;
          r = cluster_responsibilities(k, bank);
        }
        return array_out(r);
      },
      py::arg("k"), py::arg("bank"),
      "softmax over each stream's live clusters of logit_c(k): (B, t, H, C), zero beyond the live "
      "prefix (docs/mechanisms.md#moment-closure-far-field).");

  m.def(
      "update_cluster_bank",
      [](const ClusterBank& bank, const py::object& k_obj, const py::object& v_obj,
         const py::object& r_obj) {
        constexpr std::string_view w = "update_cluster_bank";
        const auto k = real_tensor(k_obj, w, "k");
        const auto v = real_tensor(v_obj, w, "v");
        const auto r = real_tensor(r_obj, w, "r");
        py::gil_scoped_release release;
        return update_cluster_bank(bank, k, v, r);
      },
      py::arg("bank"), py::arg("k"), py::arg("v"), py::arg("r"),
      "The Chan/Welford combination of the bank with tokens k, v (B, t, H, d) weighted by r (B, t, "
      "H, C) (docs/mechanisms.md#moment-closure-far-field); population moments.");

  bind_birth_merge(m, "birth_and_merge", &birth_and_merge, false, kBirthMergeDoc);
  bind_birth_merge(m, "ingest_cluster_batch", &ingest_cluster_batch, true, kIngestDoc);

  // ---- attention_law ----
  py::class_<GaussianLaw>(m, "GaussianLaw", kGaussianLawDoc)
      .def(py::init([](const py::object& mean, const py::object& cov, const py::object& mu, const py::object& covar) {
             // mean/cov, or the reference design's names mu/covar: one of each pair.
             const auto either = [](const py::object& a, const py::object& b, const char* names) -> py::object {
               if (a.is_none() == b.is_none())
                 throw TypeError(std::string("GaussianLaw: give exactly one of ") + names);
               return a.is_none() ? b : a;
             };
             return make_law(either(mean, mu, "mean or mu"), either(cov, covar, "cov or covar"), "GaussianLaw");
           }),
           py::arg("mean") = py::none(), py::arg("cov") = py::none(), py::kw_only(), py::arg("mu") = py::none(),
           py::arg("covar") = py::none())
      .def_property_readonly("mean", [](const GaussianLaw& l) { return array_out(l.mean); },
                             "The mean, a float64 array of shape (d,) (a copy).")
      .def_property_readonly("cov", [](const GaussianLaw& l) { return array_out(l.cov); },
                             "The covariance, a float64 array of shape (d, d) (a copy).")
      .def_property_readonly("mu", [](const GaussianLaw& l) { return array_out(l.mean); }, "mean, by the reference's name")
      .def_property_readonly("covar", [](const GaussianLaw& l) { return array_out(l.cov); }, "cov, by the reference's name")
      .def("__iter__",
           [](const GaussianLaw& l) {
             return py::iter(py::make_tuple(array_out(l.mean), array_out(l.cov)));
           })
      .def("__repr__", [](const GaussianLaw& l) {
        return "GaussianLaw(d=" + std::to_string(l.mean.size(0)) + ")";
      });

  m.def(
      "attention_law",
      [](const py::object& law_obj, const py::object& qkv_weight, const py::object& qkv_bias,
         const py::object& proj_weight, const py::object& proj_bias, const py::object& n_head) {
        constexpr std::string_view w = "attention_law";
        const GaussianLaw law = law_arg(law_obj);
        const auto wq = real_tensor(qkv_weight, w, "qkv_weight");
        const auto bq = real_tensor(qkv_bias, w, "qkv_bias");
        const auto wp = real_tensor(proj_weight, w, "proj_weight");
        // proj_bias=None: no bias (the reference's default).
        const auto bp = proj_bias.is_none() ? torch::zeros({wp.size(0)}, wp.options()) : real_tensor(proj_bias, w, "proj_bias");
        const int64_t heads = positive_int(n_head, w, "n_head");
        AttentionLawResult result;
        {
          py::gil_scoped_release release;
          result = attention_law(law, wq, bq, wp, bp, heads);
        }
        return py::make_tuple(result.law, array_out(result.jacobian));
      },
      py::arg("law"), py::arg("qkv_weight"), py::arg("qkv_bias"), py::arg("proj_weight"),
      py::arg("proj_bias") = py::none(), py::arg("n_head") = 1,
      "The exact Gaussian law of an attention layer's output "
      "(docs/mechanisms.md#moment-closure-far-field): law (a GaussianLaw or "
      "(mean, cov)) over the layer input, qkv_weight (3d, d), qkv_bias (3d,), proj_weight (d, d), "
      "proj_bias (d,) or None (no bias), n_head (default 1) -> (GaussianLaw, jacobian (d, d)).\n\n"
      "Example (values copy the input, which is certain to be (1, 1): so is the output):\n\n"
      ">>> import numpy as np\n"
      ">>> from attnmix.experimental import attention_law\n"
      ">>> qkv_weight = np.vstack([np.zeros((4, 2)), np.eye(2)])  # queries and keys 0, values x\n"
      ">>> law, jacobian = attention_law((np.ones(2), np.zeros((2, 2))), qkv_weight, np.zeros(6), np.eye(2))\n"
      ">>> law.mean.tolist(), law.cov.tolist()\n"
      "([1.0, 1.0], [[0.0, 0.0], [0.0, 0.0]])\n");

  // ---- RoPE ----
  m.def(
      "rope_tables",
      [](const py::object& positions, const py::object& head_dim) {
        const auto p = id_vector(positions, "rope_tables", "positions");
        const int64_t h = positive_int(head_dim, "rope_tables", "head_dim");
        const auto tables = rope_tables(torch::tensor(p, torch::kLong), h, torch::kDouble);
        return py::make_tuple(array_out(tables.cos), array_out(tables.sin));
      },
      py::arg("positions"), py::arg("head_dim"), kRopeTablesDoc);
  m.def(
      "rotate_half",
      [](const py::object& x_obj) {
        const auto x = real_tensor(x_obj, "rotate_half", "x");
        if (x.dim() < 1 || x.size(-1) % 2 != 0) {
          throw ValueError("rotate_half: x must have a last axis of even size");
        }
        return array_out(rotate_half(x));
      },
      py::arg("x"), kRotateHalfDoc);
  m.def(
      "apply_rope",
      [](const py::object& x_obj, const py::object& cos_obj, const py::object& sin_obj) {
        constexpr std::string_view w = "apply_rope";
        const auto x = real_tensor(x_obj, w, "x");
        const RopeTables tables{real_tensor(cos_obj, w, "cos"), real_tensor(sin_obj, w, "sin")};
        if (tables.cos.dim() != 2 || tables.sin.sizes() != tables.cos.sizes() ||
            tables.cos.size(1) % 2 != 0 || x.dim() < 3 || x.size(-3) != tables.cos.size(0) ||
            x.size(-1) != tables.cos.size(1)) {
          throw ValueError(
              "apply_rope: x must be (..., t, heads, head_dim) and cos, sin (t, head_dim) with an "
              "even head_dim");
        }
        return array_out(apply_rope(x, tables));
      },
      py::arg("x"), py::arg("cos"), py::arg("sin"), kApplyRopeDoc);

  // ---- language models ----
  static const std::string train_defaults_doc = options_doc(kDefaultTrainDoc, stream::train_option_table());
  static const std::string generate_defaults_doc =
      options_doc(kDefaultGenerateDoc, stream::generate_option_table());
  static const std::string recall_defaults_doc = options_doc(kDefaultRecallDoc, stream::recall_option_table());
  static const std::string memory_bench_defaults_doc =
      options_doc(kDefaultMemoryBenchDoc, stream::memory_bench_option_table());
  m.def(
      "default_train_options", [] { return options_out(stream::TrainOptions{}, stream::train_option_table()); },
      train_defaults_doc.c_str());
  m.def(
      "train_language_model",
      [](const py::object& tokens_obj, const py::object& heldout_obj, const py::object& out_obj,
         const py::object& resume_obj, const py::object& on_progress, const py::kwargs& kwargs) {
        constexpr std::string_view w = "train_language_model";
        const auto options = options_from(kwargs, stream::train_option_table(), w);
        const auto tokens = id_vector(tokens_obj, w, "tokens");
        const auto heldout =
            heldout_obj.is_none() ? std::vector<int64_t>{} : id_vector(heldout_obj, w, "heldout");
        const std::string out = out_obj.is_none() ? "" : path_arg(out_obj, w, "out");
        const std::string resume =
            resume_obj.is_none() ? "" : path_arg(resume_obj, w, "resume_from");
        require_callable(on_progress, w, "on_progress");
        std::function<void(const stream::Progress&)> report;
        if (!on_progress.is_none()) {
          // A borrowed handle: the argument outlives the call, and copies of this function touch no
          // refcount.
          report = [callback = py::handle(on_progress)](const stream::Progress& p) {
            py::gil_scoped_acquire acquire;
            callback(progress_out(p));
          };
        }
        stream::TrainSummary summary;
        {
          py::gil_scoped_release release;
          summary = stream::train(options, tokens, resume, out, report, heldout);
        }
        return summary_out(summary);
      },
      py::arg("tokens"), py::kw_only(), py::arg("heldout") = py::none(),
      py::arg("out") = py::none(), py::arg("resume_from") = py::none(),
      py::arg("on_progress") = py::none(), kTrainDoc);

  m.def(
      "evaluate_language_model",
      [](const py::object& checkpoint, const py::object& tokens_obj, const py::object& chunk,
         const py::object& threads, const py::object& window_cache) {
        constexpr std::string_view w = "evaluate_language_model";
        const std::string path = path_arg(checkpoint, w, "checkpoint");
        const auto tokens = id_vector(tokens_obj, w, "tokens");
        const auto c = option_in<int64_t>(chunk, w, "chunk");
        const auto n = option_in<int>(threads, w, "threads");
        const auto cache = option_in<stream::WindowCache>(window_cache, w, "window_cache");
        stream::Evaluation e;
        {
          py::gil_scoped_release release;
          e = stream::evaluate(path, tokens, c, n, cache);
        }
        return evaluation_out(e);
      },
      py::arg("checkpoint"), py::arg("tokens"), py::kw_only(),
      py::arg("chunk") = stream::TrainOptions{}.chunk, py::arg("threads") = stream::TrainOptions{}.threads,
      py::arg("window_cache") = "float32", kEvaluateDoc);

  m.def(
      "default_generate_options",
      [] { return options_out(stream::GenerateOptions{}, stream::generate_option_table()); },
      generate_defaults_doc.c_str());
  m.def(
      "generate_language_model",
      [](const py::object& checkpoint, const py::object& prompt_obj, const py::kwargs& kwargs) {
        constexpr std::string_view w = "generate_language_model";
        const auto options = options_from(kwargs, stream::generate_option_table(), w);
        const std::string path = path_arg(checkpoint, w, "checkpoint");
        const auto prompt = id_vector(prompt_obj, w, "prompt");
        std::vector<int64_t> drawn;
        {
          py::gil_scoped_release release;
          drawn = stream::generate(path, prompt, options);
        }
        return ids_out(drawn);
      },
      py::arg("checkpoint"), py::arg("prompt"), kGenerateDoc);

  m.def(
      "_option_tables",
      [] {
        return py::dict("train_language_model"_a = table_out(stream::train_option_table()),
                        "generate_language_model"_a = table_out(stream::generate_option_table()),
                        "run_recall"_a = table_out(stream::recall_option_table()),
                        "run_memory_benchmark"_a = table_out(stream::memory_bench_option_table()));
      },
      "Private (scripts/generate_stubs.py): each function's keyword options with their annotations and defaults.");
  m.def(
      "checkpoint_info",
      [](const py::object& checkpoint) {
        stream::CheckpointInfo info =
            stream::read_checkpoint_info(path_arg(checkpoint, "checkpoint_info", "checkpoint"));
        info.options.model = info.model;
        return py::dict("options"_a = options_out(info.options, stream::train_option_table()),
                        "step"_a = info.step, "corpus_tokens"_a = info.corpus_tokens,
                        "corpus_fingerprint"_a = info.corpus_fingerprint);
      },
      py::arg("checkpoint"), kCheckpointInfoDoc);

  m.def(
      "byte_tokens",
      [](const py::object& text) {
        if (PyUnicode_Check(text.ptr()) == 0 && PyBytes_Check(text.ptr()) == 0) {
          throw TypeError("byte_tokens: text must be a str or bytes (got " + type_name(text) + ")");
        }
        return ids_out(stream::byte_tokens(text.cast<std::string>()));  // a str as UTF-8
      },
      py::arg("text"), kByteTokensDoc);

  m.def(
      "default_recall_options", [] { return options_out(stream::RecallRunOptions{}, stream::recall_option_table()); },
      recall_defaults_doc.c_str());
  m.def(
      "run_recall",
      [](const py::object& mechanism, const py::object& on_step, const py::kwargs& kwargs) {
        constexpr std::string_view w = "run_recall";
        if (!PyUnicode_Check(mechanism.ptr())) {
          throw TypeError("run_recall: mechanism must be a str (got " + type_name(mechanism) + ")");
        }
        const auto name = mechanism.cast<std::string>();
        const auto options = options_from(kwargs, stream::recall_option_table(), w);
        require_callable(on_step, w, "on_step");
        std::function<void(int64_t, double)> report;
        if (!on_step.is_none()) {
          report = [callback = py::handle(on_step)](int64_t step, double loss) {
            py::gil_scoped_acquire acquire;
            callback(step, loss);
          };
        }
        stream::RecallResult result;
        {
          py::gil_scoped_release release;
          result = stream::run_recall(name, options, report);
        }
        return json_to_python(stream::recall_record(result));
      },
      py::arg("mechanism"), py::kw_only(), py::arg("on_step") = py::none(), kRecallDoc);

  m.def(
      "default_memory_bench_options",
      [] { return options_out(stream::MemoryBenchOptions{}, stream::memory_bench_option_table()); },
      memory_bench_defaults_doc.c_str());
  m.def(
      "run_memory_benchmark",
      [](const py::object& on_run, const py::kwargs& kwargs) {
        constexpr std::string_view w = "run_memory_benchmark";
        const auto options = options_from(kwargs, stream::memory_bench_option_table(), w);
        require_callable(on_run, w, "on_run");
        stream::MemoryBenchHooks hooks;
        if (!on_run.is_none()) {
          hooks.on_run = [callback = py::handle(on_run)](int64_t index, int64_t total,
                                                         const stream::MemoryBenchRun& run) {
            py::gil_scoped_acquire acquire;
            callback(index, total, run.task, run.setting, run.result.mechanism, run.seed);
          };
        }
        stream::MemoryBenchReport result;
        {
          py::gil_scoped_release release;
          result = stream::run_memory_benchmark(options, hooks);
        }
        return json_to_python(stream::memory_bench_record(result));
      },
      py::kw_only(), py::arg("on_run") = py::none(), kMemoryBenchDoc);
}

}  // namespace attnmix::python
