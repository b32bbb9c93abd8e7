// SPDX-License-Identifier: Apache-2.0
// attnmix._torch, the window mechanisms: the libtorch modules SlidingWindowSpine and MomentClosureAttention as the
// private classes _SlidingWindowSpine and _MomentClosureAttention (their methods from mechanism_binding.hpp), and
// _checkpoint_model. python/attnmix/torch/mechanisms.py builds the public torch.nn.Modules on them: it takes the very
// parameter tensors the C++ forward reads (named_parameters), so Python optimizers, state dicts and dtype
// conversions act on the C++ module's weights directly.
//
// States cross as plain tuples of tensors and ints:
//   near            (cache_k [tensor (b, len, H, hd) or None, per layer], cache_v [same], pos, batch_size, n_head,
//                    head_dim)
//   moment-closure  (near, [bank 7-tuple per layer (torch_args.hpp)], [store per layer, none without a store],
//                    batch_size, detach_horizon_clusters)
//   outlier store   (k_codes int8 (b, S, H, hd), k_low, k_scale float32 (b, S, H), v_codes, v_low, v_scale,
//                    owner int64 (b, S), residual float64 (b, S), capacity, k_hat, v_hat (b, S, H, hd) or None)
// The state's tensors are checked before the C++ runs (CPU, the parameters' dtype, rank 4 for caches; banks by
// validate_cluster_bank unless they are exactly the tensors the previous step returned, unmodified; stores by
// validate_outlier_store); the C++ checks the rest (the state's batch size and layout, the conservation receipts).
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../convert.hpp"
#include "../stream_receipts.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/language_model.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "mechanism_binding.hpp"
#include "torch_args.hpp"

namespace attnmix::python {

using namespace attnmix::stream;  // the streaming models this file exposes

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

SlidingWindowState near_from_tuple(py::handle obj, int64_t n_layer, torch::ScalarType dtype, std::string_view where,
                                   const std::string& prefix) {
  const auto f = tuple_fields(obj, 6, where, prefix.empty() ? "state" : prefix.substr(0, prefix.size() - 1),
                              "SlidingWindowState");
  SlidingWindowState s;
  const std::string names[2] = {prefix + "cache_k", prefix + "cache_v"};
  std::vector<torch::Tensor>* caches[2] = {&s.cache_k, &s.cache_v};
  for (int which = 0; which < 2; ++which) {
    const auto seq = layer_list(f[static_cast<size_t>(which)], n_layer, where, names[which]);
    for (int64_t l = 0; l < n_layer; ++l) {
      const py::handle entry = seq[static_cast<size_t>(l)];
      caches[which]->push_back(entry.is_none() ? torch::Tensor()
                                               : state_tensor(entry, dtype, where,
                                                              names[which] + "[" + std::to_string(l) + "]", 4));
    }
  }
  s.pos = nonnegative_int(f[2], where, prefix + "pos");
  s.batch_size = positive_int(f[3], where, prefix + "batch_size");
  s.n_head = positive_int(f[4], where, prefix + "n_head");
  s.head_dim = positive_int(f[5], where, prefix + "head_dim");
  return s;
}

py::tuple near_to_tuple(const SlidingWindowState& s) {
  py::list k, v;
  for (size_t l = 0; l < s.cache_k.size(); ++l) {
    k.append(optional_tensor_object(s.cache_k[l]));
    v.append(optional_tensor_object(s.cache_v[l]));
  }
  return py::make_tuple(k, v, s.pos, s.batch_size, s.n_head, s.head_dim);
}

struct SpineCodec {
  using Module = SlidingWindowSpineImpl;
  static constexpr std::string_view name = "SlidingWindowSpine";
  SlidingWindowState from_tuple(py::handle obj, Module& m, torch::ScalarType dtype, std::string_view where) const {
    return near_from_tuple(obj, m.options().n_layer, dtype, where, "state.");
  }
  py::object to_tuple(const SlidingWindowState& s) { return near_to_tuple(s); }
};

// The bank tensors of the last state a module returned: a bank that comes back as exactly these tensors (the same
// TensorImpls, held weakly so that no other tensor can take their address), with the version counters, shapes and
// dtypes they had, is the bank the C++ made; its values need no new check (finite, non-negative, zero inactive
// slots), which costs a pass over every bank tensor per layer and step.
struct BankMemo {
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl;
    int64_t version;
    std::vector<int64_t> sizes;
    torch::ScalarType dtype;
  };
  std::vector<Entry> tensors;  // per layer: count, mu_k, mu_v, sigma_kk, sigma_vk
  std::vector<std::vector<int64_t>> n_clusters;
  std::vector<int64_t> max_clusters;

  static std::vector<const torch::Tensor*> fields(const ClusterBank& b) {
    return {&b.count, &b.mu_k, &b.mu_v, &b.sigma_kk, &b.sigma_vk};
  }

  void remember(const std::vector<ClusterBank>& banks) {
    tensors.clear();
    n_clusters.clear();
    max_clusters.clear();
    for (const auto& bank : banks) {
      for (const auto* t : fields(bank)) {
        tensors.push_back({c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t->getIntrusivePtr()),
                           t->_version(), t->sizes().vec(), t->scalar_type()});
      }
      n_clusters.push_back(bank.n_clusters);
      max_clusters.push_back(bank.max_clusters);
    }
  }

  bool known(size_t layer, const ClusterBank& bank) const {
    if (layer >= n_clusters.size() || n_clusters[layer] != bank.n_clusters ||
        max_clusters[layer] != bank.max_clusters) {
      return false;
    }
    const auto f = fields(bank);
    for (size_t i = 0; i < f.size(); ++i) {
      const Entry& e = tensors[layer * f.size() + i];
      if (e.impl.expired() || f[i]->unsafeGetTensorImpl() != e.impl._unsafe_get_target() ||
          f[i]->_version() != e.version || f[i]->sizes() != c10::IntArrayRef(e.sizes) ||
          f[i]->scalar_type() != e.dtype || !f[i]->device().is_cpu()) {
        return false;
      }
    }
    return true;
  }
};

// A bank of a state: the tuple's fields as tensor handles, checked like bank_from_tuple (shapes, dtype, device,
// finite values, zero inactive slots) unless the memo knows them.
ClusterBank state_bank(py::handle obj, size_t layer, torch::ScalarType dtype, const BankMemo& memo,
                       std::string_view where) {
  const std::string name = "state.banks[" + std::to_string(layer) + "]";
  if (!PyTuple_Check(obj.ptr()) || PyTuple_GET_SIZE(obj.ptr()) != 7) {
    throw TypeError(std::string(where) + ": " + name + " must be a ClusterBank");
  }
  const auto f = py::reinterpret_borrow<py::tuple>(obj);
  ClusterBank quick;
  bool all_tensors = true;
  for (size_t i = 0; i < 5; ++i) all_tensors = all_tensors && THPVariable_Check(f[i].ptr());
  if (all_tensors && (PyList_Check(f[5].ptr()) || PyTuple_Check(f[5].ptr()))) {
    quick.count = THPVariable_Unpack(f[0].ptr());
    quick.mu_k = THPVariable_Unpack(f[1].ptr());
    quick.mu_v = THPVariable_Unpack(f[2].ptr());
    quick.sigma_kk = THPVariable_Unpack(f[3].ptr());
    quick.sigma_vk = THPVariable_Unpack(f[4].ptr());
    for (const py::handle n : py::reinterpret_borrow<py::sequence>(f[5])) {
      if (!PyLong_Check(n.ptr()) || PyBool_Check(n.ptr())) {
        quick.n_clusters.clear();
        break;
      }
      quick.n_clusters.push_back(n.cast<int64_t>());
    }
    if (PyLong_Check(f[6].ptr()) && !PyBool_Check(f[6].ptr())) quick.max_clusters = f[6].cast<int64_t>();
    if (memo.known(layer, quick) && quick.count.scalar_type() == dtype) {
      return quick;
    }
  }
  ClusterBank bank = bank_from_tuple(obj, where, name);
  if (bank.count.scalar_type() != dtype) {
    throw ValueError(std::string(where) + ": " + name + " is " + dtype_text(bank.count.scalar_type()) +
                     " but the model's parameters are " + dtype_text(dtype) +
                     " (make the state with init_state after converting the model)");
  }
  return bank;
}

OutlierStore store_from_tuple(py::handle obj, const ClusterBank& bank, std::string_view where,
                              const std::string& name) {
  const auto f = tuple_fields(obj, 11, where, name, "OutlierStore");
  // The tensors as they are: validate_outlier_store checks their dtypes and shapes.
  OutlierStore s;
  s.k = {tensor_arg(f[0], where, name + ".k_codes"), tensor_arg(f[1], where, name + ".k_low"),
         tensor_arg(f[2], where, name + ".k_scale")};
  s.v = {tensor_arg(f[3], where, name + ".v_codes"), tensor_arg(f[4], where, name + ".v_low"),
         tensor_arg(f[5], where, name + ".v_scale")};
  const auto owner = tensor_arg(f[6], where, name + ".owner");
  const auto residual = tensor_arg(f[7], where, name + ".residual");
  s.capacity = positive_int(f[8], where, name + ".capacity");
  const int64_t B = bank.batch_size(), S = bank.max_clusters * s.capacity;
  if (owner.scalar_type() != torch::kLong || owner.sizes() != c10::IntArrayRef{B, S}) {
    throw ValueError(std::string(where) + ": " + name + ".owner must be an int64 tensor of shape (" +
                     std::to_string(B) + ", " + std::to_string(S) + ")");
  }
  if (residual.scalar_type() != torch::kDouble || residual.sizes() != c10::IntArrayRef{B, S}) {
    throw ValueError(std::string(where) + ": " + name + ".residual must be a float64 tensor of shape (" +
                     std::to_string(B) + ", " + std::to_string(S) + ")");
  }
  const auto owner_c = owner.contiguous();
  const auto residual_c = residual.contiguous();
  s.owner.assign(owner_c.data_ptr<int64_t>(), owner_c.data_ptr<int64_t>() + B * S);
  s.residual.assign(residual_c.data_ptr<double>(), residual_c.data_ptr<double>() + B * S);
  if (!f[9].is_none()) s.k_hat = real_tensor_arg(f[9], where, name + ".k_hat");
  if (!f[10].is_none()) s.v_hat = real_tensor_arg(f[10], where, name + ".v_hat");
  validate_outlier_store(s, bank, std::string(where), name + ".");
  return s;
}

py::tuple store_to_tuple(const OutlierStore& s) {
  const int64_t B = s.batch_size(), S = s.slots();
  auto owner = torch::tensor(s.owner, torch::kLong).view({B, S});
  auto residual = torch::tensor(s.residual, torch::kDouble).view({B, S});
  return py::make_tuple(tensor_object(s.k.codes), tensor_object(s.k.low), tensor_object(s.k.scale),
                        tensor_object(s.v.codes), tensor_object(s.v.low), tensor_object(s.v.scale),
                        tensor_object(owner), tensor_object(residual), s.capacity, optional_tensor_object(s.k_hat),
                        optional_tensor_object(s.v_hat));
}

struct MomentCodec {
  using Module = MomentClosureAttentionImpl;
  static constexpr std::string_view name = "MomentClosureAttention";
  BankMemo memo;

  MomentClosureState from_tuple(py::handle obj, Module& m, torch::ScalarType dtype, std::string_view where) const {
    const auto& o = m.options();
    const auto f = tuple_fields(obj, 5, where, "state", "MomentClosureState");
    MomentClosureState s;
    s.near = near_from_tuple(f[0], o.n_layer, dtype, where, "state.near.");
    const auto banks = layer_list(f[1], o.n_layer, where, "state.banks");
    for (int64_t l = 0; l < o.n_layer; ++l) {
      s.banks.push_back(state_bank(banks[static_cast<size_t>(l)], static_cast<size_t>(l), dtype, memo, where));
    }
    const auto stores = layer_list(f[2], o.outlier_capacity > 0 ? o.n_layer : 0, where, "state.stores");
    for (size_t l = 0; l < py::len(stores); ++l) {
      s.stores.push_back(store_from_tuple(stores[l], s.banks[l], where, "state.stores[" + std::to_string(l) + "]"));
    }
    s.batch_size = positive_int(f[3], where, "state.batch_size");
    s.detach_horizon_clusters = flag(f[4], where, "state.detach_horizon_clusters");
    return s;
  }

  py::object to_tuple(const MomentClosureState& s) {
    memo.remember(s.banks);
    py::list banks, stores;
    for (const auto& bank : s.banks) banks.append(bank_to_tuple(bank));
    for (const auto& store : s.stores) stores.append(store_to_tuple(store));
    return py::make_tuple(near_to_tuple(s.near), banks, stores, s.batch_size, s.detach_horizon_clusters);
  }
};

py::object optional_real_object(const std::optional<double>& v) {
  return v ? py::object(py::float_(*v)) : py::object(py::none());
}

}  // namespace

void bind_mechanisms(py::module_& m) {
  bind_mechanism<SpineCodec>(m, "_SlidingWindowSpine",
                             "The libtorch SlidingWindowSpine behind attnmix.torch.SlidingWindowSpine (private).")
      .def(py::init([](const py::object& config) {
             const MechanismConfig c(config, SpineCodec::name);
             auto o = c.model_sizes<SpineOptions>();
             o.window = c.optional_positive("window");
             o.cp_size = c.positive("cp_size");
             return std::make_unique<BoundMechanism<SpineCodec>>(o);
           }),
           py::arg("config"));

  bind_mechanism<MomentCodec>(
      m, "_MomentClosureAttention",
      "The libtorch MomentClosureAttention behind attnmix.torch.MomentClosureAttention (private).")
      .def(py::init([](const py::object& config) {
             const MechanismConfig c(config, MomentCodec::name);
             auto o = c.model_sizes<MomentClosureOptions>();
             o.window = c.positive("window");
             o.max_clusters = c.positive("max_clusters");
             o.birth_threshold = c.real("birth_threshold");
             o.merge_threshold = c.optional_real("merge_threshold");
             o.outlier_capacity = c.nonnegative("outlier_capacity");
             o.cluster_rule = c.cluster_rule("cluster_rule");
             return std::make_unique<BoundMechanism<MomentCodec>>(o);
           }),
           py::arg("config"))
      .def(
          "last_receipts",
          [](BoundMechanism<MomentCodec>& b) {
            py::list out;
            for (const auto& r : b.module->last_receipts()) out.append(layer_receipt_out(r, &tensor_object));
            return out;
          },
          "The last step's receipts, one dict per layer: {batch_size, streams: [receipt per stream], misfit_scalar"
          " and, with a store, outliers}.")
      .def("last_misfit", [](BoundMechanism<MomentCodec>& b) { return b.module->last_misfit(); });

  m.def(
      "_checkpoint_model",
      [](const std::string& path) {
        stream::CheckpointInfo info;
        {
          py::gil_scoped_release release;
          info = stream::read_checkpoint_info(path);
        }
        const auto& c = info.model;
        return py::dict("mechanism"_a = stream::mechanism_name(c.mechanism), "vocab"_a = c.vocab,
                        "d_model"_a = c.d_model, "n_layer"_a = c.n_layer, "n_head"_a = c.n_head,
                        "window"_a = c.window, "max_clusters"_a = c.max_clusters,
                        "birth_threshold"_a = c.birth_threshold,
                        "merge_threshold"_a = optional_real_object(c.merge_threshold),
                        "outlier_capacity"_a = c.outlier_capacity,
                        "cluster_rule"_a = cluster_rule_name(c.cluster_rule), "sketch_rows"_a = c.sketch_rows,
                        "sketch_dim"_a = c.sketch_dim, "sketch_degree"_a = c.sketch_degree, "step"_a = info.step);
      },
      py::arg("path"), "The model configuration of an `attnmix lm train` checkpoint, and its step.");
}

}  // namespace attnmix::python
