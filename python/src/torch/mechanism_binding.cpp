// SPDX-License-Identifier: Apache-2.0
// The shared checks of the bound mechanisms; see mechanism_binding.hpp.
#include "mechanism_binding.hpp"

#include <string>

#include "attnmix/core/errors.hpp"

namespace attnmix::python {

using namespace attnmix::stream;  // the streaming models this file exposes

namespace py = pybind11;

ParameterLayout::ParameterLayout(torch::nn::Module& module) {
  for (const auto& p : module.named_parameters()) {
    names.push_back(p.key());
    shapes.push_back(p.value().sizes().vec());
  }
}

torch::ScalarType ParameterLayout::check(torch::nn::Module& module, std::string_view where) const {
  const auto parameters = module.parameters();
  ATTNMIX_ASSERT(parameters.size() == shapes.size(), "a module's parameter list never changes");
  const auto dtype = parameters.front().scalar_type();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const auto& p = parameters[i];
    const std::string what = std::string(where) + ": parameter " + names[i];
    if (!p.device().is_cpu()) {
      throw ValueError(what + " is on device " + p.device().str() + "; attnmix.torch runs on the CPU");
    }
    if (p.scalar_type() != torch::kFloat && p.scalar_type() != torch::kDouble) {
      throw ValueError(what + " must be float32 or float64 (got " + dtype_text(p.scalar_type()) + ")");
    }
    if (p.scalar_type() != dtype) {
      throw ValueError(what + " is " + dtype_text(p.scalar_type()) + " but the others are " + dtype_text(dtype) +
                       "; convert the whole module at once (module.float() or module.double())");
    }
    if (p.sizes() != c10::IntArrayRef(shapes[i])) {
      throw ValueError(what + " has shape " + shape_text(p.sizes()) + ", the model needs " + shape_text(shapes[i]));
    }
  }
  return dtype;
}

torch::Tensor state_tensor(py::handle obj, torch::ScalarType dtype, std::string_view where, const std::string& name,
                           int64_t dims) {
  auto t = real_tensor_arg(obj, where, name, dims);
  if (t.scalar_type() != dtype) {
    throw ValueError(std::string(where) + ": " + name + " is " + dtype_text(t.scalar_type()) +
                     " but the model's parameters are " + dtype_text(dtype) +
                     " (make the state with init_state after converting the model)");
  }
  return t;
}

py::sequence layer_list(py::handle obj, int64_t n_layer, std::string_view where, const std::string& name) {
  if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr())) {
    throw TypeError(std::string(where) + ": " + name + " must be a list with one entry per layer (got " +
                    type_name(obj) + ")");
  }
  const auto seq = py::reinterpret_borrow<py::sequence>(obj);
  if (static_cast<int64_t>(py::len(seq)) != n_layer) {
    throw ValueError(std::string(where) + ": " + name + " must hold one entry per layer (" + std::to_string(n_layer) +
                     ", got " + std::to_string(py::len(seq)) + "); was the state made by another model?");
  }
  return seq;
}

std::pair<torch::Tensor, torch::Tensor> chunk_args(py::handle x_obj, py::handle y_obj, int64_t vocab,
                                                   std::string_view where, bool with_targets) {
  const auto x = token_arg(x_obj, where, "x");
  const auto y = with_targets ? token_arg(y_obj, where, "y") : torch::Tensor();
  const auto check_ids = [&](const torch::Tensor& t, const char* name) {
    if (t.size(0) <= 0 || t.size(1) <= 0) {
      throw ValueError(std::string(where) + ": " + name + " must have batch >= 1 and time >= 1 (got shape " +
                       shape_text(t.sizes()) + ")");
    }
    const auto [lo, hi] = torch::aminmax(t);
    const auto low = lo.item<int64_t>(), high = hi.item<int64_t>();
    if (low < 0 || high >= vocab) {
      throw ValueError(std::string(where) + ": " + name + " holds the id " + std::to_string(low < 0 ? low : high) +
                       ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  };
  check_ids(x, "x");
  if (with_targets) {
    if (x.sizes() != y.sizes()) {
      throw ValueError(std::string(where) + ": x and y must have the same shape (got " + shape_text(x.sizes()) +
                       " and " + shape_text(y.sizes()) + ")");
    }
    check_ids(y, "y");
  }
  return {x, y};
}

MechanismConfig::MechanismConfig(py::handle config, std::string_view where) : where_(where) {
  if (!PyDict_Check(config.ptr())) {
    throw TypeError(where_ + ": the configuration must be a dict (got " + type_name(config) + ")");
  }
  dict_ = py::reinterpret_borrow<py::dict>(config);
}

py::handle MechanismConfig::at(const char* key) const {
  PyObject* value = PyDict_GetItemString(dict_.ptr(), key);  // borrowed
  if (value == nullptr) throw ValueError(where_ + ": the configuration has no entry " + key);
  return value;
}

int64_t MechanismConfig::positive(const char* key) const { return positive_int(at(key), where_, key); }
int64_t MechanismConfig::nonnegative(const char* key) const { return nonnegative_int(at(key), where_, key); }
double MechanismConfig::real(const char* key) const { return real_number(at(key), where_, key); }

std::optional<int64_t> MechanismConfig::optional_positive(const char* key) const {
  return optional_positive_int(at(key), where_, key);
}

ClusterRule MechanismConfig::cluster_rule(const char* key) const { return cluster_rule_arg(at(key), where_); }

std::optional<double> MechanismConfig::optional_real(const char* key) const {
  const auto value = at(key);
  if (value.is_none()) return std::nullopt;
  return real_number(value, where_, key);
}

}  // namespace attnmix::python
