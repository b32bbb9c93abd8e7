// SPDX-License-Identifier: Apache-2.0
// What every streaming mechanism of attnmix._torch shares (bind_mechanisms.cpp, bind_sketch_spines.cpp): the
// private class of one libtorch ContextMechanism module, with the methods the Python modules of
// python/attnmix/torch/mechanisms.py call, generated from a codec that converts the mechanism's state to and from
// a plain tuple of tensors and ints (each conversion moves tensor handles, never data).
//
// A codec is a struct with
//   using Module = …Impl;                      the libtorch module
//   static constexpr std::string_view name;    the public class name, for messages ("LinearAttentionSpine")
//   State from_tuple(py::handle, Module&, torch::ScalarType parameters' dtype, std::string_view where)
//   py::object to_tuple(const State&)          (may remember what it handed out, as moment closure's bank memo)
// and the generated methods are named_parameters(), init_state(batch_size), step(state, x, y) → (state, loss),
// advance(state, x) → (state, logits), detach(state) and load_checkpoint(path). Every step checks the parameters
// (CPU, one dtype float32 or float64, the shapes they had at construction) and x, y (int64 (batch, time) tensors of
// one shape with ids in [0, vocab)) before the C++ runs, and releases the GIL while it runs.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/extension.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../convert.hpp"
#include "attnmix/stream/checkpoint_weights.hpp"
#include "torch_args.hpp"

namespace attnmix::python {

/// What a bound module remembers of its parameters at construction, to refuse a forward on parameters that were
/// replaced by tensors of another shape, moved off the CPU or converted one by one.
struct ParameterLayout {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;

  explicit ParameterLayout(torch::nn::Module& module);

  /// The parameters' common dtype. @throws ValueError naming the parameter.
  torch::ScalarType check(torch::nn::Module& module, std::string_view where) const;
};

/// A state's tensor: real_tensor_arg of rank `dims` in the parameters' dtype. @throws ValueError otherwise.
torch::Tensor state_tensor(pybind11::handle obj, torch::ScalarType dtype, std::string_view where,
                           const std::string& name, int64_t dims);

/// obj as a sequence with one entry per layer (a list or tuple). @throws TypeError, ValueError naming `name`.
pybind11::sequence layer_list(pybind11::handle obj, int64_t n_layer, std::string_view where, const std::string& name);

/// x and y of a step: int64 (batch, time) tensors of one shape, both sizes positive, ids in [0, vocab); y only when
/// with_targets. @throws TypeError, ValueError naming x or y.
std::pair<torch::Tensor, torch::Tensor> chunk_args(pybind11::handle x_obj, pybind11::handle y_obj, int64_t vocab,
                                                   std::string_view where, bool with_targets);

/// A constructor's configuration: the entries of the dict that python/attnmix/torch/mechanisms.py keeps as the
/// module's `_config`, checked as they are read. @throws TypeError unless a dict; ValueError for a missing key or
/// a value of the wrong kind, naming the class and the key.
class MechanismConfig {
 public:
  MechanismConfig(pybind11::handle config, std::string_view where);
  int64_t positive(const char* key) const;
  int64_t nonnegative(const char* key) const;
  double real(const char* key) const;
  std::optional<int64_t> optional_positive(const char* key) const;
  std::optional<double> optional_real(const char* key) const;
  stream::ClusterRule cluster_rule(const char* key) const;

  /// Options with the sizes every mechanism has (vocab, d_model, n_layer, n_head) read; the rest at their defaults.
  template <class Options>
  Options model_sizes() const {
    Options o;
    o.vocab = positive("vocab");
    o.d_model = positive("d_model");
    o.n_layer = positive("n_layer");
    o.n_head = positive("n_head");
    return o;
  }

 private:
  pybind11::handle at(const char* key) const;
  pybind11::dict dict_;
  std::string where_;
};

template <class Codec>
struct BoundMechanism {
  using Module = typename Codec::Module;
  std::shared_ptr<Module> module;
  ParameterLayout layout;
  Codec codec;

  template <class Options>
  explicit BoundMechanism(const Options& options)
      : module(std::make_shared<Module>(options)), layout(*module) {}
};

/// The private class of one mechanism with the generated methods; the caller adds the constructor and what is
/// particular to the mechanism (receipts).
template <class Codec>
pybind11::class_<BoundMechanism<Codec>> bind_mechanism(pybind11::module_& m, const char* class_name,
                                                       const char* doc) {
  namespace py = pybind11;
  using Bound = BoundMechanism<Codec>;
  const std::string name(Codec::name);
  py::class_<Bound> cls(m, class_name, doc);
  cls.def("named_parameters", [](Bound& b) { return named_parameters_out(*b.module); },
          "[(C++ name, tensor)]: the very tensors the forward reads, in the C++ module's order.")
      .def(
          "init_state",
          [name](Bound& b, const py::object& batch_size) {
            return b.codec.to_tuple(b.module->init_state(positive_int(batch_size, name + ".init_state", "batch_size")));
          },
          py::arg("batch_size"))
      .def(
          "step",
          [name](Bound& b, const py::object& state, const py::object& x_obj, const py::object& y_obj) {
            const std::string where = name + ".step";
            const auto dtype = b.layout.check(*b.module, where);
            const auto s = b.codec.from_tuple(state, *b.module, dtype, where);
            const auto [x, y] = chunk_args(x_obj, y_obj, b.module->options().vocab, where, true);
            decltype(b.module->step(s, x, y)) r;
            {
              py::gil_scoped_release release;
              r = b.module->step(s, x, y);
            }
            return py::make_tuple(b.codec.to_tuple(r.state), tensor_object(r.loss));
          },
          py::arg("state"), py::arg("x"), py::arg("y"))
      .def(
          "advance",
          [name](Bound& b, const py::object& state, const py::object& x_obj) {
            const std::string where = name + ".advance";
            const auto dtype = b.layout.check(*b.module, where);
            const auto s = b.codec.from_tuple(state, *b.module, dtype, where);
            const auto x = chunk_args(x_obj, py::none(), b.module->options().vocab, where, false).first;
            decltype(b.module->advance(s, x)) r;
            {
              py::gil_scoped_release release;
              r = b.module->advance(s, x);
            }
            return py::make_tuple(b.codec.to_tuple(r.state), tensor_object(r.logits));
          },
          py::arg("state"), py::arg("x"))
      .def(
          "detach",
          [name](Bound& b, const py::object& state) {
            const std::string where = name + ".detach";
            const auto dtype = b.layout.check(*b.module, where);
            return b.codec.to_tuple(b.module->detach(b.codec.from_tuple(state, *b.module, dtype, where)));
          },
          py::arg("state"))
      .def(
          "load_checkpoint",
          [](Bound& b, const std::string& path) {
            py::gil_scoped_release release;
            load_checkpoint_weights(path, *b.module);
          },
          py::arg("path"), "Copies an `attnmix lm train` checkpoint's parameters into the module.");
  return cls;
}

}  // namespace attnmix::python
