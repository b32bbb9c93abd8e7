// SPDX-License-Identifier: Apache-2.0
// attnmix._torch, the layers: the attention sublayers of self_attention.hpp as private classes that
// python/attnmix/torch/layers.py wraps in torch.nn.Modules. The C++ modules own the parameters; named_parameters()
// hands out the same tensors (no copy), so the Python module registers exactly what the C++ forward reads. States
// cross as plain tuples:
//   sliding window  (cache_k or None, cache_v or None, pos, batch_size)
//   moment closure  (cache_k or None, cache_v or None, pos, batch_size, bank tuple (torch_args.hpp))
// forward(h, state or None) → (out, state tuple, receipt dict or None) releases the GIL while it computes.
// Also _recall_sequences, the data of the far-field recall task (far_field.hpp), for examples that train their own
// models on exactly the sequences `attnmix lm recall` uses.
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
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/far_field.hpp"
#include "attnmix/stream/self_attention.hpp"
#include "torch_args.hpp"

namespace attnmix::python {

using namespace attnmix::stream;  // the streaming models this file exposes

namespace py = pybind11;

namespace {

constexpr std::string_view kWindowForward = "SlidingWindowSelfAttention.forward";
constexpr std::string_view kClosureForward = "MomentClosureSelfAttention.forward";

struct WindowLayer {
  std::shared_ptr<SlidingWindowSelfAttentionImpl> impl;
};

struct ClosureLayer {
  std::shared_ptr<MomentClosureSelfAttentionImpl> impl;
};

torch::Tensor optional_cache_arg(py::handle obj, std::string_view where, std::string_view name) {
  return obj.is_none() ? torch::Tensor() : real_tensor_arg(obj, where, name, 4);
}

WindowLayerState window_state_from(const py::tuple& fields, std::string_view where) {
  WindowLayerState s;
  s.cache_k = optional_cache_arg(fields[0], where, "state.cache_k");
  s.cache_v = optional_cache_arg(fields[1], where, "state.cache_v");
  s.pos = nonnegative_int(fields[2], where, "state.pos");
  s.batch_size = positive_int(fields[3], where, "state.batch_size");
  return s;
}

py::tuple window_state_out(const WindowLayerState& s) {
  return py::make_tuple(optional_tensor_object(s.cache_k), optional_tensor_object(s.cache_v), s.pos, s.batch_size);
}

py::tuple closure_state_out(const MomentClosureLayerState& s) {
  return py::make_tuple(optional_tensor_object(s.near.cache_k), optional_tensor_object(s.near.cache_v), s.near.pos,
                        s.near.batch_size, bank_to_tuple(s.bank));
}

// The recall task's options from keywords over the C++ defaults (an unknown keyword → TypeError).
stream::RecallTaskOptions task_from(const py::kwargs& kwargs, std::string_view where) {
  stream::RecallTaskOptions task;
  for (const auto& [key, value] : kwargs) {
    const auto name = py::str(key).cast<std::string>();
    if (name == "keys") {
      task.keys = positive_int(value, where, "keys");
    } else if (name == "values") {
      task.values = positive_int(value, where, "values");
    } else if (name == "filler") {
      task.filler = positive_int(value, where, "filler");
    } else if (name == "pairs") {
      task.pairs = positive_int(value, where, "pairs");
    } else if (name == "queries") {
      task.queries = positive_int(value, where, "queries");
    } else if (name == "gap") {
      task.gap = nonnegative_int(value, where, "gap");
    } else {
      throw TypeError(std::string(where) + "() got an unexpected keyword argument '" + name + "'");
    }
  }
  return task;
}

}  // namespace

void bind_layers(py::module_& m) {
  py::class_<WindowLayer>(m, "_SlidingWindowSelfAttention",
                          "The C++ sliding-window attention sublayer (use attnmix.torch.SlidingWindowSelfAttention).")
      .def(py::init([](const py::object& d_model, const py::object& n_head, const py::object& window) {
             constexpr std::string_view w = "SlidingWindowSelfAttention";
             SlidingWindowSelfAttentionOptions o;
             o.d_model = positive_int(d_model, w, "d_model");
             o.n_head = positive_int(n_head, w, "n_head");
             o.window = optional_positive_int(window, w, "window");
             return WindowLayer{std::make_shared<SlidingWindowSelfAttentionImpl>(o)};
           }),
           py::arg("d_model"), py::arg("n_head"), py::arg("window"))
      .def("named_parameters", [](WindowLayer& self) { return named_parameters_out(*self.impl); })
      .def("init_state",
           [](WindowLayer& self, const py::object& batch_size) {
             constexpr std::string_view w = "SlidingWindowSelfAttention.init_state";
             return window_state_out(self.impl->init_state(positive_int(batch_size, w, "batch_size")));
           })
      .def("forward", [](WindowLayer& self, const py::object& h_obj, const py::object& state_obj) {
        const auto h = real_tensor_arg(h_obj, kWindowForward, "h", 3);
        std::optional<WindowLayerState> state;
        if (!state_obj.is_none()) {
          state = window_state_from(
              tuple_fields(state_obj, 4, kWindowForward, "state", "tuple (cache_k, cache_v, pos, batch_size)"),
              kWindowForward);
        }
        SlidingWindowSelfAttentionOutput out;
        {
          py::gil_scoped_release release;
          out = self.impl->forward(h, state);
        }
        return py::make_tuple(tensor_object(out.out), window_state_out(out.state), py::none());
      });

  py::class_<ClosureLayer>(m, "_MomentClosureSelfAttention",
                           "The C++ moment-closure attention sublayer (use attnmix.torch.MomentClosureSelfAttention).")
      .def(py::init([](const py::object& d_model, const py::object& n_head, const py::object& window,
                       const py::object& max_clusters, const py::object& birth_threshold,
                       const py::object& merge_threshold, const py::object& cluster_rule) {
             constexpr std::string_view w = "MomentClosureSelfAttention";
             MomentClosureSelfAttentionOptions o;
             o.d_model = positive_int(d_model, w, "d_model");
             o.n_head = positive_int(n_head, w, "n_head");
             o.window = positive_int(window, w, "window");
             o.max_clusters = positive_int(max_clusters, w, "max_clusters");
             o.birth_threshold = real_number(birth_threshold, w, "birth_threshold");
             if (!merge_threshold.is_none()) o.merge_threshold = real_number(merge_threshold, w, "merge_threshold");
             o.cluster_rule = cluster_rule_arg(cluster_rule, w);
             return ClosureLayer{std::make_shared<MomentClosureSelfAttentionImpl>(o)};
           }),
           py::arg("d_model"), py::arg("n_head"), py::arg("window"), py::arg("max_clusters"),
           py::arg("birth_threshold"), py::arg("merge_threshold"), py::arg("cluster_rule"))
      .def("named_parameters", [](ClosureLayer& self) { return named_parameters_out(*self.impl); })
      .def("init_state",
           [](ClosureLayer& self, const py::object& batch_size) {
             constexpr std::string_view w = "MomentClosureSelfAttention.init_state";
             return closure_state_out(self.impl->init_state(positive_int(batch_size, w, "batch_size")));
           })
      .def("forward", [](ClosureLayer& self, const py::object& h_obj, const py::object& state_obj) {
        const auto h = real_tensor_arg(h_obj, kClosureForward, "h", 3);
        std::optional<MomentClosureLayerState> state;
        if (!state_obj.is_none()) {
          const auto fields = tuple_fields(state_obj, 5, kClosureForward, "state",
                                           "tuple (cache_k, cache_v, pos, batch_size, bank)");
          state = MomentClosureLayerState{window_state_from(fields, kClosureForward),
                                          bank_from_tuple(fields[4], kClosureForward, "state.bank")};
        }
        MomentClosureSelfAttentionOutput out;
        {
          py::gil_scoped_release release;
          out = self.impl->forward(h, state);
        }
        return py::make_tuple(tensor_object(out.out), closure_state_out(out.state),
                              layer_receipt_out(out.receipt, &tensor_object));
      });

  m.def(
      "_recall_sequences",
      [](const py::object& seed, const py::object& stream, const py::object& batch_sizes, const py::kwargs& kwargs) {
        constexpr std::string_view w = "_recall_sequences";
        const auto task = task_from(kwargs, w);
        const uint64_t seed_value = seed_int(seed, w, "seed");
        const auto stream_value = nonnegative_int(stream, w, "stream");
        std::vector<int64_t> sizes;
        for (const py::handle size : py::iter(batch_sizes)) sizes.push_back(positive_int(size, w, "batch_sizes"));
        std::vector<stream::RecallSequences> drawn;
        {
          py::gil_scoped_release release;
          Rng rng = stream::recall_data_rng(seed_value, stream_value);
          for (const int64_t size : sizes) drawn.push_back(stream::recall_sequences(rng, task, size));
        }
        py::list out;
        for (const auto& s : drawn) {
          const auto tokens = torch::tensor(s.tokens, torch::kLong).view({s.batch, s.length});
          const auto answers = torch::tensor(std::vector<int64_t>(s.answers.begin(), s.answers.end()), torch::kLong)
                                   .view({s.batch, s.length - 1})
                                   .to(torch::kBool);
          out.append(py::make_tuple(tensor_object(tokens), tensor_object(answers)));
        }
        return out;
      },
      py::arg("seed"), py::arg("stream"), py::arg("batch_sizes"),
      "The far-field recall task's sequences, exactly as attnmix's recall runs draw them: for each batch size, "
      "(tokens (batch, length) int64, answers (batch, length - 1) bool: position p's next token is a recalled "
      "value). stream 0 is the training data of a seed, 1 the held-out data; consecutive batches continue one "
      "stream. Keyword options: keys, values, filler, pairs, queries, gap (defaults as run_recall's).");
}

}  // namespace attnmix::python
