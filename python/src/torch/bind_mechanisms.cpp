// SPDX-License-Identifier: Apache-2.0
// attnmix._torch, the mechanisms: the libtorch modules SlidingWindowSpine and MomentClosureAttention as the private
// classes _SlidingWindowSpine and _MomentClosureAttention. python/attnmix/torch/mechanisms.py builds the public
// torch.nn.Modules on them: it takes the very parameter tensors the C++ forward reads (named_parameters), so Python
// optimizers, state dicts and dtype conversions act on the C++ module's weights directly.
//
// States cross as plain tuples of tensors and ints (each conversion moves tensor handles, never data):
//   near            (cache_k [tensor (b, len, H, hd) or None, per layer], cache_v [same], pos, batch_size, n_head,
//                    head_dim)
//   moment-closure  (near, [bank 7-tuple per layer (torch_args.hpp)], batch_size, detach_horizon_clusters)
// Every step checks, before the C++ runs: the parameters (all on the CPU, one dtype float32 or float64, the shapes
// they had at construction), the state's tensors (CPU, the parameters' dtype, rank 4 for caches; banks by
// validate_cluster_bank unless they are exactly the tensors the previous step returned, unmodified), and x, y
// (int64 (batch, time) tensors of equal shape with ids in [0, vocab)). The C++ checks the rest (the state's batch
// size and layout, the conservation receipts). Steps release the GIL.
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
#include "attnmix/stream/checkpoint_weights.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/language_model.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "torch_args.hpp"

namespace attnmix::python {

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

std::string text(std::string_view s) { return std::string(s); }

// "torch.float32" for messages read by Python users.
std::string dtype_text(torch::ScalarType type) {
  if (type == torch::kFloat) return "torch.float32";
  if (type == torch::kDouble) return "torch.float64";
  if (type == torch::kHalf) return "torch.float16";
  return "torch." + std::string(c10::toString(type));
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string out = "(";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + (sizes.size() == 1 ? ",)" : ")");
}

// What a bound module remembers of its parameters at construction, to refuse a forward on parameters that were
// replaced by tensors of another shape, moved off the CPU or converted one by one.
struct ParameterLayout {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;

  explicit ParameterLayout(torch::nn::Module& module) {
    for (const auto& p : module.named_parameters()) {
      names.push_back(p.key());
      shapes.push_back(p.value().sizes().vec());
    }
  }

  // The parameters' common dtype. @throws ValueError naming the parameter.
  torch::ScalarType check(torch::nn::Module& module, std::string_view where) const {
    const auto parameters = module.parameters();
    ATTNMIX_ASSERT(parameters.size() == shapes.size(), "a module's parameter list never changes");
    const auto dtype = parameters.front().scalar_type();
    for (size_t i = 0; i < parameters.size(); ++i) {
      const auto& p = parameters[i];
      const std::string what = text(where) + ": parameter " + names[i];
      if (!p.device().is_cpu()) {
        throw ValueError(what + " is on device " + p.device().str() + "; attnmix.torch runs on the CPU");
      }
      if (p.scalar_type() != torch::kFloat && p.scalar_type() != torch::kDouble) {
        throw ValueError(what + " must be float32 or float64 (got " + dtype_text(p.scalar_type()) +
                         ")");
      }
      if (p.scalar_type() != dtype) {
        throw ValueError(what + " is " + dtype_text(p.scalar_type()) + " but the others are " +
                         dtype_text(dtype) +
                         "; convert the whole module at once (module.float() or module.double())");
      }
      if (p.sizes() != c10::IntArrayRef(shapes[i])) {
        throw ValueError(what + " has shape " + shape_text(p.sizes()) + ", the model needs " +
                         shape_text(shapes[i]));
      }
    }
    return dtype;
  }
};

// A state's tensor: the argument checks of torch_args.hpp and the parameters' dtype.
torch::Tensor state_tensor(py::handle obj, torch::ScalarType dtype, std::string_view where, const std::string& name,
                           int64_t dims) {
  auto t = real_tensor_arg(obj, where, name, dims);
  if (t.scalar_type() != dtype) {
    throw ValueError(text(where) + ": " + name + " is " + dtype_text(t.scalar_type()) +
                     " but the model's parameters are " + dtype_text(dtype) +
                     " (make the state with init_state after converting the model)");
  }
  return t;
}

py::tuple state_fields(py::handle obj, size_t arity, std::string_view where, const char* kind) {
  if (!PyTuple_Check(obj.ptr()) || static_cast<size_t>(PyTuple_GET_SIZE(obj.ptr())) != arity) {
    throw TypeError(text(where) + ": state must be a " + kind + " (got " + type_name(obj) + ")");
  }
  return py::reinterpret_borrow<py::tuple>(obj);
}

py::sequence layer_list(py::handle obj, int64_t n_layer, std::string_view where, const std::string& name) {
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr())) {
    throw TypeError(text(where) + ": " + name + " must be a list with one entry per layer (got " + type_name(obj) +
                    ")");
  }
  const auto seq = py::reinterpret_borrow<py::sequence>(obj);
  if (static_cast<int64_t>(py::len(seq)) != n_layer) {
    throw ValueError(text(where) + ": " + name + " must hold one entry per layer (" + std::to_string(n_layer) +
                     ", got " + std::to_string(py::len(seq)) + "); was the state made by another model?");
  }
  return seq;
}

SlidingWindowState near_from_tuple(py::handle obj, int64_t n_layer, torch::ScalarType dtype, std::string_view where,
                                   const std::string& prefix) {
  const auto f = state_fields(obj, 6, where, "SlidingWindowState");
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

py::object optional_tensor(const torch::Tensor& t) { return t.defined() ? tensor_object(t) : py::none(); }

py::tuple near_to_tuple(const SlidingWindowState& s) {
  py::list k, v;
  for (size_t l = 0; l < s.cache_k.size(); ++l) {
    k.append(optional_tensor(s.cache_k[l]));
    v.append(optional_tensor(s.cache_v[l]));
  }
  return py::make_tuple(k, v, s.pos, s.batch_size, s.n_head, s.head_dim);
}

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
    throw TypeError(text(where) + ": " + name + " must be a ClusterBank");
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
    throw ValueError(text(where) + ": " + name + " is " + dtype_text(bank.count.scalar_type()) +
                     " but the model's parameters are " + dtype_text(dtype) +
                     " (make the state with init_state after converting the model)");
  }
  return bank;
}

MomentClosureState moment_from_tuple(py::handle obj, const MomentClosureOptions& o, torch::ScalarType dtype,
                                     const BankMemo& memo, std::string_view where) {
  const auto f = state_fields(obj, 4, where, "MomentClosureState");
  MomentClosureState s;
  s.near = near_from_tuple(f[0], o.n_layer, dtype, where, "state.near.");
  const auto banks = layer_list(f[1], o.n_layer, where, "state.banks");
  for (int64_t l = 0; l < o.n_layer; ++l) {
    s.banks.push_back(state_bank(banks[static_cast<size_t>(l)], static_cast<size_t>(l), dtype, memo, where));
  }
  s.batch_size = positive_int(f[2], where, "state.batch_size");
  s.detach_horizon_clusters = flag(f[3], where, "state.detach_horizon_clusters");
  return s;
}

py::tuple moment_to_tuple(const MomentClosureState& s) {
  py::list banks;
  for (const auto& bank : s.banks) banks.append(bank_to_tuple(bank));
  return py::make_tuple(near_to_tuple(s.near), banks, s.batch_size, s.detach_horizon_clusters);
}

// x and y of a step: int64 (batch, time) tensors of one shape, both sizes positive, ids in [0, vocab).
std::pair<torch::Tensor, torch::Tensor> chunk_args(py::handle x_obj, py::handle y_obj, int64_t vocab,
                                                   std::string_view where, bool with_targets) {
  const auto x = token_arg(x_obj, where, "x");
  const auto y = with_targets ? token_arg(y_obj, where, "y") : torch::Tensor();
  const auto check_ids = [&](const torch::Tensor& t, const char* name) {
    if (t.size(0) <= 0 || t.size(1) <= 0) {
      throw ValueError(text(where) + ": " + name + " must have batch >= 1 and time >= 1 (got shape " +
                       shape_text(t.sizes()) + ")");
    }
    const auto [lo, hi] = torch::aminmax(t);
    const auto low = lo.item<int64_t>(), high = hi.item<int64_t>();
    if (low < 0 || high >= vocab) {
      throw ValueError(text(where) + ": " + name + " holds the id " + std::to_string(low < 0 ? low : high) +
                       ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  };
  check_ids(x, "x");
  if (with_targets) {
    if (x.sizes() != y.sizes()) {
      throw ValueError(text(where) + ": x and y must have the same shape (got " + shape_text(x.sizes()) + " and " +
                       shape_text(y.sizes()) + ")");
    }
    check_ids(y, "y");
  }
  return {x, y};
}

// The modules as bound: the libtorch module (a TORCH_MODULE holder is a shared_ptr) and its parameter layout.
struct BoundSpine {
  std::shared_ptr<SlidingWindowSpineImpl> module;
  ParameterLayout layout;
  explicit BoundSpine(const SpineOptions& o)
      : module(std::make_shared<SlidingWindowSpineImpl>(o)), layout(*module) {}
};

struct BoundMomentClosure {
  std::shared_ptr<MomentClosureAttentionImpl> module;
  ParameterLayout layout;
  BankMemo memo;
  explicit BoundMomentClosure(const MomentClosureOptions& o)
      : module(std::make_shared<MomentClosureAttentionImpl>(o)), layout(*module) {}
};

py::list named_parameters_out(torch::nn::Module& module) {
  py::list out;
  for (const auto& p : module.named_parameters()) out.append(py::make_tuple(p.key(), tensor_object(p.value())));
  return out;
}

constexpr std::string_view kSpine = "SlidingWindowSpine";
constexpr std::string_view kMoment = "MomentClosureAttention";

}  // namespace

void bind_mechanisms(py::module_& m) {
  py::class_<BoundSpine>(m, "_SlidingWindowSpine",
                         "The libtorch SlidingWindowSpine behind attnmix.torch.SlidingWindowSpine (private).")
      .def(py::init([](const py::object& vocab, const py::object& d_model, const py::object& n_layer,
                       const py::object& n_head, const py::object& window, const py::object& cp_size) {
             SpineOptions o;
             o.vocab = positive_int(vocab, kSpine, "vocab");
             o.d_model = positive_int(d_model, kSpine, "d_model");
             o.n_layer = positive_int(n_layer, kSpine, "n_layer");
             o.n_head = positive_int(n_head, kSpine, "n_head");
             o.window = optional_positive_int(window, kSpine, "window");
             o.cp_size = positive_int(cp_size, kSpine, "cp_size");
             return std::make_unique<BoundSpine>(o);
           }),
           py::arg("vocab"), py::arg("d_model"), py::arg("n_layer"), py::arg("n_head"), py::arg("window"),
           py::arg("cp_size"))
      .def("named_parameters", [](BoundSpine& b) { return named_parameters_out(*b.module); },
           "[(C++ name, tensor)]: the very tensors the forward reads, in the C++ module's order.")
      .def(
          "init_state",
          [](BoundSpine& b, const py::object& batch_size) {
            return near_to_tuple(b.module->init_state(positive_int(batch_size, "SlidingWindowSpine.init_state",
                                                                   "batch_size")));
          },
          py::arg("batch_size"))
      .def(
          "step",
          [](BoundSpine& b, const py::object& state, const py::object& x_obj, const py::object& y_obj) {
            constexpr std::string_view w = "SlidingWindowSpine.step";
            const auto dtype = b.layout.check(*b.module, w);
            const auto s = near_from_tuple(state, b.module->options().n_layer, dtype, w, "state.");
            const auto [x, y] = chunk_args(x_obj, y_obj, b.module->options().vocab, w, true);
            MechanismStep<SlidingWindowState> r;
            {
              py::gil_scoped_release release;
              r = b.module->step(s, x, y);
            }
            return py::make_tuple(near_to_tuple(r.state), tensor_object(r.loss));
          },
          py::arg("state"), py::arg("x"), py::arg("y"))
      .def(
          "advance",
          [](BoundSpine& b, const py::object& state, const py::object& x_obj) {
            constexpr std::string_view w = "SlidingWindowSpine.advance";
            const auto dtype = b.layout.check(*b.module, w);
            const auto s = near_from_tuple(state, b.module->options().n_layer, dtype, w, "state.");
            const auto x = chunk_args(x_obj, py::none(), b.module->options().vocab, w, false).first;
            SpineOutput r;
            {
              py::gil_scoped_release release;
              r = b.module->advance(s, x);
            }
            return py::make_tuple(near_to_tuple(r.state), tensor_object(r.logits));
          },
          py::arg("state"), py::arg("x"))
      .def(
          "detach",
          [](BoundSpine& b, const py::object& state) {
            constexpr std::string_view w = "SlidingWindowSpine.detach";
            const auto dtype = b.layout.check(*b.module, w);
            return near_to_tuple(
                b.module->detach(near_from_tuple(state, b.module->options().n_layer, dtype, w, "state.")));
          },
          py::arg("state"))
      .def(
          "load_checkpoint",
          [](BoundSpine& b, const std::string& path) {
            py::gil_scoped_release release;
            load_checkpoint_weights(path, *b.module->backbone());
          },
          py::arg("path"), "Copies an `attnmix lm train` checkpoint's parameters into the module.");

  py::class_<BoundMomentClosure>(
      m, "_MomentClosureAttention",
      "The libtorch MomentClosureAttention behind attnmix.torch.MomentClosureAttention (private).")
      .def(py::init([](const py::object& vocab, const py::object& d_model, const py::object& n_layer,
                       const py::object& n_head, const py::object& window, const py::object& max_clusters,
                       const py::object& birth_threshold, const py::object& merge_threshold) {
             MomentClosureOptions o;
             o.vocab = positive_int(vocab, kMoment, "vocab");
             o.d_model = positive_int(d_model, kMoment, "d_model");
             o.n_layer = positive_int(n_layer, kMoment, "n_layer");
             o.n_head = positive_int(n_head, kMoment, "n_head");
             o.window = positive_int(window, kMoment, "window");
             o.max_clusters = positive_int(max_clusters, kMoment, "max_clusters");
             o.birth_threshold = real_number(birth_threshold, kMoment, "birth_threshold");
             if (!merge_threshold.is_none()) {
               o.merge_threshold = real_number(merge_threshold, kMoment, "merge_threshold");
             }
             return std::make_unique<BoundMomentClosure>(o);
           }),
           py::arg("vocab"), py::arg("d_model"), py::arg("n_layer"), py::arg("n_head"), py::arg("window"),
           py::arg("max_clusters"), py::arg("birth_threshold"), py::arg("merge_threshold"))
      .def("named_parameters", [](BoundMomentClosure& b) { return named_parameters_out(*b.module); },
           "[(C++ name, tensor)]: the very tensors the forward reads, in the C++ module's order.")
      .def(
          "init_state",
          [](BoundMomentClosure& b, const py::object& batch_size) {
            const auto state =
                b.module->init_state(positive_int(batch_size, "MomentClosureAttention.init_state", "batch_size"));
            b.memo.remember(state.banks);
            return moment_to_tuple(state);
          },
          py::arg("batch_size"))
      .def(
          "step",
          [](BoundMomentClosure& b, const py::object& state, const py::object& x_obj, const py::object& y_obj) {
            constexpr std::string_view w = "MomentClosureAttention.step";
            const auto dtype = b.layout.check(*b.module, w);
            const auto s = moment_from_tuple(state, b.module->options(), dtype, b.memo, w);
            const auto [x, y] = chunk_args(x_obj, y_obj, b.module->options().vocab, w, true);
            MechanismStep<MomentClosureState> r;
            {
              py::gil_scoped_release release;
              r = b.module->step(s, x, y);
            }
            b.memo.remember(r.state.banks);
            return py::make_tuple(moment_to_tuple(r.state), tensor_object(r.loss));
          },
          py::arg("state"), py::arg("x"), py::arg("y"))
      .def(
          "advance",
          [](BoundMomentClosure& b, const py::object& state, const py::object& x_obj) {
            constexpr std::string_view w = "MomentClosureAttention.advance";
            const auto dtype = b.layout.check(*b.module, w);
            const auto s = moment_from_tuple(state, b.module->options(), dtype, b.memo, w);
            const auto x = chunk_args(x_obj, py::none(), b.module->options().vocab, w, false).first;
            MomentClosureOutput r;
            {
              py::gil_scoped_release release;
              r = b.module->advance(s, x);
            }
            b.memo.remember(r.state.banks);
            return py::make_tuple(moment_to_tuple(r.state), tensor_object(r.logits));
          },
          py::arg("state"), py::arg("x"))
      .def(
          "detach",
          [](BoundMomentClosure& b, const py::object& state) {
            constexpr std::string_view w = "MomentClosureAttention.detach";
            const auto dtype = b.layout.check(*b.module, w);
            const auto detached = b.module->detach(moment_from_tuple(state, b.module->options(), dtype, b.memo, w));
            b.memo.remember(detached.banks);
            return moment_to_tuple(detached);
          },
          py::arg("state"))
      .def(
          "last_receipts",
          [](BoundMomentClosure& b) {
            py::list out;
            for (const auto& r : b.module->last_receipts()) out.append(layer_receipt_out(r, &tensor_object));
            return out;
          },
          "The last step's receipts, one dict per layer: {batch_size, streams: [receipt per stream], misfit_scalar}.")
      .def("last_misfit", [](BoundMomentClosure& b) { return b.module->last_misfit(); })
      .def(
          "load_checkpoint",
          [](BoundMomentClosure& b, const std::string& path) {
            py::gil_scoped_release release;
            load_checkpoint_weights(path, *b.module->backbone());
          },
          py::arg("path"), "Copies an `attnmix lm train` checkpoint's parameters into the module.");

  m.def(
      "_checkpoint_model",
      [](const std::string& path) {
        lm::CheckpointInfo info;
        {
          py::gil_scoped_release release;
          info = lm::read_checkpoint_info(path);
        }
        const auto& c = info.model;
        return py::dict("mechanism"_a = lm::mechanism_name(c.mechanism), "vocab"_a = c.vocab,
                        "d_model"_a = c.d_model, "n_layer"_a = c.n_layer, "n_head"_a = c.n_head,
                        "window"_a = c.window, "max_clusters"_a = c.max_clusters,
                        "birth_threshold"_a = c.birth_threshold,
                        "merge_threshold"_a = c.merge_threshold ? py::object(py::float_(*c.merge_threshold))
                                                                : py::object(py::none()),
                        "step"_a = info.step);
      },
      py::arg("path"), "The model configuration of an `attnmix lm train` checkpoint, and its step.");
}

}  // namespace attnmix::python
