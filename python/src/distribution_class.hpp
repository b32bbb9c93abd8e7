// SPDX-License-Identifier: Apache-2.0
/// @file distribution_class.hpp
/// What every family's Python distribution class defines the same way: its text (__repr__, which str() uses too),
/// its pickling through its constructor, and its per-row posterior matrices.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include "attnmix/core/errors.hpp"
#include "convert.hpp"
#include "roles.hpp"

namespace attnmix::python {

namespace py = pybind11;

namespace detail {
/// The number of parameters of a function pointer or of a lambda's call operator.
template <class F>
struct Arity : Arity<decltype(&F::operator())> {};
template <class R, class... A>
struct Arity<R (*)(A...)> : std::integral_constant<size_t, sizeof...(A)> {};
template <class R, class C, class... A>
struct Arity<R (C::*)(A...) const> : std::integral_constant<size_t, sizeof...(A)> {};

template <class Make, size_t... I>
auto call_with(const Make& make, const py::list& args, std::index_sequence<I...> /*positions*/) {
  return make(py::object(args[I])...);
}
}  // namespace detail

/// Defines __repr__ (`describe(model)`) and pickling on a distribution class whose constructor is
/// `make(arguments...)`: the pickled state is `state(model)`, make's arguments in order. A state shorter by up to
/// `late.size()` entries, a pickle written before make's last arguments existed, is completed from the end of `late`
/// (their values before they existed).
template <class Dist, class... Extra, class Describe, class State, class Make>
void def_text_and_pickle(py::class_<Dist, Extra...>& cls, Describe describe, State state, Make make,
                         const py::tuple& late = py::tuple()) {
  const std::string name = py::cast<std::string>(cls.attr("__name__"));
  cls.def("__repr__", [describe](const Dist& d) { return describe(d.model()); });
  cls.def(py::pickle([state](const Dist& d) { return state(d.model()); },
                     [make, late, name](const py::tuple& saved) {
                       constexpr size_t kArguments = detail::Arity<Make>::value;
                       const size_t missing = kArguments - std::min(kArguments, saved.size());
                       if (saved.size() > kArguments || missing > late.size())
                         throw ValueError(name + ": bad pickle state");
                       py::list arguments(saved);
                       for (size_t k = late.size() - missing; k < late.size(); ++k) arguments.append(late[k]);
                       return detail::call_with(make, arguments, std::make_index_sequence<kArguments>{});
                     }));
}

/// The method `name`(x) of a distribution class: the matrix `of(model, batch)` (a new float64 array, one row per row
/// of x) of the rows x — anything the model's encoder accepts, or an encoded batch — computed without the GIL.
template <class Dist, class... Extra, class Of>
void def_rows_matrix(py::class_<Dist, Extra...>& cls, const char* name, Of of, const char* doc) {
  cls.def(
      name,
      [of](const Dist& d, py::object x) {
        const AnyBatch batch = batch_of(x, *encoder_of(d.any));
        Matrix out;
        {
          const py::gil_scoped_release release;
          out = of(d.model(), batch);
        }
        return copy_reals(out.data(), {out.rows(), out.cols()});
      },
      py::arg("x"), doc);
}

}  // namespace attnmix::python
