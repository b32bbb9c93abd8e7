// SPDX-License-Identifier: Apache-2.0
#include "torch_args.hpp"

#include <pybind11/stl.h>
#include <torch/csrc/Dtype.h>

#include <string>
#include <utility>
#include <vector>

#include "../convert.hpp"
#include "attnmix/core/errors.hpp"

namespace attnmix::python {

using namespace attnmix::stream;  // the streaming models this file exposes

namespace py = pybind11;

namespace {

std::string label(std::string_view where, std::string_view name) {
  return std::string(where) + ": " + std::string(name);
}

}  // namespace

torch::Tensor tensor_arg(py::handle obj, std::string_view where, std::string_view name) {
  if (!THPVariable_Check(obj.ptr())) {
    throw TypeError(label(where, name) + " must be a torch.Tensor (got " + type_name(obj) + ")");
  }
  torch::Tensor t = THPVariable_Unpack(obj.ptr());
  if (!t.device().is_cpu()) {
    throw ValueError(label(where, name) + " must be on the CPU (got device " + t.device().str() +
                     "); attnmix.torch runs on the CPU");
  }
  return t;
}

torch::Tensor real_tensor_arg(py::handle obj, std::string_view where, std::string_view name, int64_t dims) {
  torch::Tensor t = tensor_arg(obj, where, name);
  if (t.scalar_type() != torch::kFloat && t.scalar_type() != torch::kDouble) {
    throw ValueError(label(where, name) + " must be float32 or float64 (got " +
                     std::string(c10::toString(t.scalar_type())) + ")");
  }
  if (dims >= 0 && t.dim() != dims) {
    throw ValueError(label(where, name) + " must have " + std::to_string(dims) + " dimensions (got " +
                     std::to_string(t.dim()) + ")");
  }
  return t;
}

torch::Tensor token_arg(py::handle obj, std::string_view where, std::string_view name) {
  torch::Tensor t = tensor_arg(obj, where, name);
  if (t.scalar_type() != torch::kLong) {
    throw ValueError(label(where, name) + " must hold int64 token ids (got " +
                     std::string(c10::toString(t.scalar_type())) + ")");
  }
  if (t.dim() != 2) {
    throw ValueError(label(where, name) + " must be (batch, time) (got " + std::to_string(t.dim()) +
                     " dimensions)");
  }
  return t;
}

torch::ScalarType dtype_arg(py::handle obj, std::string_view where, std::string_view name) {
  if (!THPDtype_Check(obj.ptr())) {
    throw TypeError(label(where, name) + " must be a torch.dtype (got " + type_name(obj) + ")");
  }
  const auto type = reinterpret_cast<THPDtype*>(obj.ptr())->scalar_type;
  if (type != torch::kFloat && type != torch::kDouble) {
    throw ValueError(label(where, name) + " must be torch.float32 or torch.float64 (got " +
                     std::string(c10::toString(type)) + ")");
  }
  return type;
}

py::object tensor_object(const torch::Tensor& t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(t)); }

py::object optional_tensor_object(const torch::Tensor& t) { return t.defined() ? tensor_object(t) : py::none(); }

py::list named_parameters_out(torch::nn::Module& module) {
  py::list out;
  for (const auto& p : module.named_parameters()) out.append(py::make_tuple(p.key(), tensor_object(p.value())));
  return out;
}

std::string dtype_text(torch::ScalarType type) {
  if (type == torch::kFloat) return "torch.float32";
  if (type == torch::kDouble) return "torch.float64";
  if (type == torch::kHalf) return "torch.float16";
  if (type == torch::kChar) return "torch.int8";
  if (type == torch::kLong) return "torch.int64";
  return "torch." + std::string(c10::toString(type));
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string out = "(";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + (sizes.size() == 1 ? ",)" : ")");
}

py::tuple tuple_fields(py::handle obj, size_t arity, std::string_view where, std::string_view name,
                       std::string_view kind) {
  if (!PyTuple_Check(obj.ptr()) || static_cast<size_t>(PyTuple_GET_SIZE(obj.ptr())) != arity) {
    throw TypeError(label(where, name) + " must be a " + std::string(kind) + " (got " + type_name(obj) + ")");
  }
  return py::reinterpret_borrow<py::tuple>(obj);
}

ClusterBank bank_from_tuple(py::handle obj, std::string_view where, std::string_view name) {
  if (!PyTuple_Check(obj.ptr()) || PyTuple_GET_SIZE(obj.ptr()) != 7) {
    throw TypeError(label(where, name) + " must be a ClusterBank");
  }
  const auto fields = py::reinterpret_borrow<py::tuple>(obj);
  const std::string bank_name = label(where, name);
  ClusterBank bank;
  bank.count = real_tensor_arg(fields[0], bank_name, "count");
  bank.mu_k = real_tensor_arg(fields[1], bank_name, "mu_k");
  bank.mu_v = real_tensor_arg(fields[2], bank_name, "mu_v");
  bank.sigma_kk = real_tensor_arg(fields[3], bank_name, "sigma_kk");
  bank.sigma_vk = real_tensor_arg(fields[4], bank_name, "sigma_vk");
  const py::handle n_clusters = fields[5];
  if (!PyList_Check(n_clusters.ptr()) && !PyTuple_Check(n_clusters.ptr())) {
    throw TypeError(bank_name + ".n_clusters must be a list of integers, one per stream (got " +
                    type_name(n_clusters) + ")");
  }
  for (const py::handle n : py::reinterpret_borrow<py::sequence>(n_clusters)) {
    bank.n_clusters.push_back(nonnegative_int(n, bank_name, "n_clusters"));
  }
  bank.max_clusters = positive_int(fields[6], bank_name, "max_clusters");
  validate_cluster_bank(bank, bank_name);
  return bank;
}

py::tuple bank_to_tuple(const ClusterBank& b) {
  return py::make_tuple(tensor_object(b.count), tensor_object(b.mu_k), tensor_object(b.mu_v),
                        tensor_object(b.sigma_kk), tensor_object(b.sigma_vk), py::cast(b.n_clusters),
                        b.max_clusters);
}

}  // namespace attnmix::python
