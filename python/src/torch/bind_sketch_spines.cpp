// SPDX-License-Identifier: Apache-2.0
// attnmix._torch, the linear-feature spines: LinearAttentionSpine, FrequentDirectionsSpine and TensorSketchSpine as
// the private classes _LinearAttentionSpine, _FrequentDirectionsSpine and _TensorSketchSpine (their methods from
// mechanism_binding.hpp), wrapped by python/attnmix/torch/sketch_spines.py.
//
// States cross as (layers [one tuple per layer], pos, batch_size), a layer's tuple holding its tensors and then its
// counts in the order of the C++ layer state (linear_attention.hpp, frequent_directions.hpp, tensor_sketch.hpp):
//   linear               (sum_kv, sum_k, last_x)
//   frequent-directions  (window_k, window_v, sketch, sum_k, mass, shrink_total, last_x, filled, shrinks)
//   tensor-sketch        (window_k, window_v, sum_kv, sum_k, misfit, last_x)
// Here each tensor is checked to be a float32 or float64 CPU tensor; the C++ module checks every shape, dtype and
// count against the model before it computes (check_state).
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "../convert.hpp"
#include "attnmix/stream/frequent_directions.hpp"
#include "attnmix/stream/linear_attention.hpp"
#include "attnmix/stream/tensor_sketch.hpp"
#include "mechanism_binding.hpp"
#include "torch_args.hpp"

namespace attnmix::python {

using namespace attnmix::stream;  // the streaming models this file exposes

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

template <class Layer>
using TensorField = std::pair<const char*, torch::Tensor Layer::*>;
template <class Layer>
using CountField = std::pair<const char*, int64_t Layer::*>;

// The fields of one layer's state, in the tuple's order.
template <class Layer>
struct LayerFields;

template <>
struct LayerFields<LinearAttentionLayerState> {
  using L = LinearAttentionLayerState;
  static constexpr std::array<TensorField<L>, 3> tensors{
      {{"sum_kv", &L::sum_kv}, {"sum_k", &L::sum_k}, {"last_x", &L::last_x}}};
  static constexpr std::array<CountField<L>, 0> counts{};
};

template <>
struct LayerFields<FrequentDirectionsLayerState> {
  using L = FrequentDirectionsLayerState;
  static constexpr std::array<TensorField<L>, 7> tensors{{{"window_k", &L::window_k},
                                                          {"window_v", &L::window_v},
                                                          {"sketch", &L::sketch},
                                                          {"sum_k", &L::sum_k},
                                                          {"mass", &L::mass},
                                                          {"shrink_total", &L::shrink_total},
                                                          {"last_x", &L::last_x}}};
  static constexpr std::array<CountField<L>, 2> counts{{{"filled", &L::filled}, {"shrinks", &L::shrinks}}};
};

template <>
struct LayerFields<TensorSketchLayerState> {
  using L = TensorSketchLayerState;
  static constexpr std::array<TensorField<L>, 6> tensors{{{"window_k", &L::window_k},
                                                          {"window_v", &L::window_v},
                                                          {"sum_kv", &L::sum_kv},
                                                          {"sum_k", &L::sum_k},
                                                          {"misfit", &L::misfit},
                                                          {"last_x", &L::last_x}}};
  static constexpr std::array<CountField<L>, 0> counts{};
};

// The codec of a spine whose state is per-layer fields plus pos and batch_size.
template <class SpineModule, const std::string_view& Name>
struct LayeredCodec {
  using Module = SpineModule;
  using State = typename Module::state_type;
  using Layer = typename decltype(State::layers)::value_type;
  using Fields = LayerFields<Layer>;
  static constexpr std::string_view name = Name;

  State from_tuple(py::handle obj, Module& m, torch::ScalarType, std::string_view where) const {
    const std::string kind = std::string(name.substr(0, name.size() - std::string_view("Spine").size())) + "State";
    const auto f = tuple_fields(obj, 3, where, "state", kind);
    State s;
    const auto layers = layer_list(f[0], m.options().n_layer, where, "state.layers");
    for (size_t l = 0; l < py::len(layers); ++l) {
      const std::string prefix = "state.layers[" + std::to_string(l) + "]";
      const auto lf = tuple_fields(layers[l], Fields::tensors.size() + Fields::counts.size(), where, prefix,
                                   kind.substr(0, kind.size() - 5) + "LayerState");
      Layer layer;
      size_t i = 0;
      for (const auto& [field, member] : Fields::tensors) {
        layer.*member = real_tensor_arg(lf[i++], where, prefix + "." + field);
      }
      for (const auto& [field, member] : Fields::counts) {
        layer.*member = nonnegative_int(lf[i++], where, prefix + "." + field);
      }
      s.layers.push_back(std::move(layer));
    }
    s.pos = nonnegative_int(f[1], where, "state.pos");
    s.batch_size = positive_int(f[2], where, "state.batch_size");
    return s;
  }

  py::object to_tuple(const State& s) {
    py::list layers;
    for (const auto& layer : s.layers) {
      py::list fields;
      for (const auto& [field, member] : Fields::tensors) fields.append(tensor_object(layer.*member));
      for (const auto& [field, member] : Fields::counts) fields.append(layer.*member);
      layers.append(py::tuple(fields));
    }
    return py::make_tuple(layers, s.pos, s.batch_size);
  }
};

constexpr std::string_view kLinear = "LinearAttentionSpine";
constexpr std::string_view kFrequentDirections = "FrequentDirectionsSpine";
constexpr std::string_view kTensorSketch = "TensorSketchSpine";
using LinearCodec = LayeredCodec<LinearAttentionSpineImpl, kLinear>;
using FrequentDirectionsCodec = LayeredCodec<FrequentDirectionsSpineImpl, kFrequentDirections>;
using TensorSketchCodec = LayeredCodec<TensorSketchSpineImpl, kTensorSketch>;

py::dict receipt_out(const FrequentDirectionsReceipt& r) {
  return py::dict("window"_a = r.window, "evicted"_a = r.evicted, "filled"_a = r.filled, "shrinks"_a = r.shrinks,
                  "mass"_a = tensor_object(r.mass), "kept"_a = tensor_object(r.kept),
                  "shrink_total"_a = tensor_object(r.shrink_total), "bound"_a = tensor_object(r.bound),
                  "bound_holds"_a = r.bound_holds);
}

}  // namespace

void bind_sketch_spines(py::module_& m) {
  bind_mechanism<LinearCodec>(m, "_LinearAttentionSpine",
                              "The libtorch LinearAttentionSpine behind attnmix.torch.LinearAttentionSpine (private).")
      .def(py::init([](const py::object& config) {
             const MechanismConfig c(config, kLinear);
             return std::make_unique<BoundMechanism<LinearCodec>>(c.model_sizes<LinearAttentionOptions>());
           }),
           py::arg("config"));

  bind_mechanism<FrequentDirectionsCodec>(
      m, "_FrequentDirectionsSpine",
      "The libtorch FrequentDirectionsSpine behind attnmix.torch.FrequentDirectionsSpine (private).")
      .def(py::init([](const py::object& config) {
             const MechanismConfig c(config, kFrequentDirections);
             auto o = c.model_sizes<FrequentDirectionsOptions>();
             o.window = c.positive("window");
             o.sketch_rows = c.positive("sketch_rows");
             return std::make_unique<BoundMechanism<FrequentDirectionsCodec>>(o);
           }),
           py::arg("config"))
      .def(
          "receipts",
          [](BoundMechanism<FrequentDirectionsCodec>& b, const py::object& state) {
            constexpr std::string_view where = "FrequentDirectionsSpine.receipts";
            const auto dtype = b.layout.check(*b.module, where);
            py::list out;
            for (const auto& r : b.module->receipts(b.codec.from_tuple(state, *b.module, dtype, where))) {
              out.append(receipt_out(r));
            }
            return out;
          },
          py::arg("state"), "Every layer's sketch receipt (frequent_directions.hpp).");

  bind_mechanism<TensorSketchCodec>(
      m, "_TensorSketchSpine", "The libtorch TensorSketchSpine behind attnmix.torch.TensorSketchSpine (private).")
      .def(py::init([](const py::object& config) {
             const MechanismConfig c(config, kTensorSketch);
             auto o = c.model_sizes<TensorSketchOptions>();
             o.window = c.positive("window");
             o.sketch_dim = c.positive("sketch_dim");
             o.degree = c.positive("sketch_degree");
             return std::make_unique<BoundMechanism<TensorSketchCodec>>(o);
           }),
           py::arg("config"));
}

}  // namespace attnmix::python
