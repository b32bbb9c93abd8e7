// SPDX-License-Identifier: Apache-2.0
/// @file bindings.hpp
/// One function per area of the attnmix._core module (module.cpp calls them in this order, base
/// classes first; the families' binding functions are declared in module.cpp's list of families).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string_view>

namespace attnmix {
struct AttentionOptimizerState;
}  // namespace attnmix

namespace attnmix::python {

/// Rng, EncodedBatch, the role base classes and their generic methods, model files.
void bind_core(pybind11::module_& m);
/// optimize() and score() (docs/mechanisms.md#training).
void bind_inference(pybind11::module_& m);
/// The submodule assign: assignment-tree attention and its experiment (docs/mechanisms.md#assignment-tree-attention).
void bind_assign(pybind11::module_& m);

/// The statistics attachment of the variational families (docs/mechanisms.md#variational-embedding-attention) as the
/// last entry of their value() tuples (families.cpp), implemented with the AttentionOptimizerState class
/// (families/variational.cpp): an immutable attnmix.AttentionOptimizerState sharing `state`, or None.
[[nodiscard]] pybind11::object optimizer_state_to_python(
    const std::shared_ptr<const AttentionOptimizerState>& state);
/// The state as the last entry of a value() tuple: its to_dict() form (JSON-serialisable, as the reference's value()
/// gives it), or None.
[[nodiscard]] pybind11::object optimizer_state_to_dict(const std::shared_ptr<const AttentionOptimizerState>& state);
/// The state behind None (nullptr), an attnmix.AttentionOptimizerState or its to_dict() dict (validated).
/// @throws TypeError for anything else, naming `where` and `name`; ValueError for a dict that is not a valid state.
[[nodiscard]] std::shared_ptr<const AttentionOptimizerState> optimizer_state_from_python(
    pybind11::handle obj, std::string_view where, std::string_view name);

}  // namespace attnmix::python
