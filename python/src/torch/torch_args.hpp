// SPDX-License-Identifier: Apache-2.0
/// @file torch_args.hpp
/// Arguments of attnmix._torch: torch tensors taken as they are (the same tensor, no copy, its autograd history
/// kept), checked at the boundary, and cluster banks crossing as plain tuples.
///
/// Every check names the function and the argument: a non-tensor is a TypeError, a tensor off the CPU, of an
/// unsupported dtype or of the wrong rank a ValueError. attnmix.torch runs on the CPU in float32 and float64.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "attnmix/stream/moment_closure.hpp"

namespace attnmix::python {

/// obj itself as a tensor. @throws TypeError unless it is a torch.Tensor; ValueError unless it is on the CPU.
[[nodiscard]] torch::Tensor tensor_arg(pybind11::handle obj, std::string_view where, std::string_view name);

/// tensor_arg, float32 or float64 (ValueError otherwise), of rank `dims` when dims ≥ 0.
[[nodiscard]] torch::Tensor real_tensor_arg(pybind11::handle obj, std::string_view where, std::string_view name,
                                            int64_t dims = -1);

/// tensor_arg, int64 of rank 2 (token ids, (batch, time)).
[[nodiscard]] torch::Tensor token_arg(pybind11::handle obj, std::string_view where, std::string_view name);

/// A torch.dtype, float32 or float64. @throws TypeError for another type, ValueError for another dtype.
[[nodiscard]] torch::ScalarType dtype_arg(pybind11::handle obj, std::string_view where, std::string_view name);

/// A tensor for Python: the same tensor (no copy).
[[nodiscard]] pybind11::object tensor_object(const torch::Tensor& t);

/// tensor_object, or None for an undefined tensor.
[[nodiscard]] pybind11::object optional_tensor_object(const torch::Tensor& t);

/// [(name, tensor)] of a module's parameters: the very tensors (no copy), in the module's order.
[[nodiscard]] pybind11::list named_parameters_out(torch::nn::Module& module);

/// "torch.float32", "torch.float64", … for messages read by Python users.
[[nodiscard]] std::string dtype_text(torch::ScalarType type);

/// "(2, 3)", "(4,)": a shape as Python prints it.
[[nodiscard]] std::string shape_text(c10::IntArrayRef sizes);

/// obj as a tuple of `arity` fields. @throws TypeError "<where>: <name> must be a <kind>" otherwise.
[[nodiscard]] pybind11::tuple tuple_fields(pybind11::handle obj, size_t arity, std::string_view where,
                                           std::string_view name, std::string_view kind);

/// A bank from its tuple (count, mu_k, mu_v, sigma_kk, sigma_vk, n_clusters (a sequence of ints), max_clusters),
/// checked by validate_cluster_bank. @throws TypeError/ValueError naming `where`, `name` and the field.
[[nodiscard]] stream::ClusterBank bank_from_tuple(pybind11::handle obj, std::string_view where, std::string_view name);

/// The tuple of a bank, in the field order above (n_clusters a list).
[[nodiscard]] pybind11::tuple bank_to_tuple(const stream::ClusterBank& bank);

}  // namespace attnmix::python
