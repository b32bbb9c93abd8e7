// SPDX-License-Identifier: Apache-2.0
/// @file bindings.hpp
/// One function per area of the attnmix._core module (module.cpp calls them in this order, base
/// classes first).
#pragma once

#include <pybind11/pybind11.h>

namespace attnmix::python {

/// Rng, EncodedBatch, the role base classes and their generic methods, model files.
void bind_core(pybind11::module_& m);
/// Responsibility attention: the six roles and sequence_to_triples (SPEC.md §2.4).
void bind_attention(pybind11::module_& m);
/// Chained attention: the six roles (SPEC.md §3.4).
void bind_chained(pybind11::module_& m);
/// Mixture, Composite, Categorical and DiagonalGaussian (SPEC.md §1.5).
void bind_stats(pybind11::module_& m);
/// optimize() and score() (SPEC.md §1.7).
void bind_inference(pybind11::module_& m);
/// The submodule assign: assignment-tree attention and its experiment (SPEC.md §8).
void bind_assign(pybind11::module_& m);

}  // namespace attnmix::python
