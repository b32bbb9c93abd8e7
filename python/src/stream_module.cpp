// SPDX-License-Identifier: Apache-2.0
// attnmix._stream: the streaming part of attnmix (SPEC.md §6-7, target attnmix::torch) on numpy
// arrays, imported lazily by attnmix.experimental. It is a separate extension because it loads
// libtorch, which `import attnmix` must never do; it needs no Python torch (tensors cross as
// float64 numpy arrays, copied both ways). Errors translate as in attnmix._core (SPEC.md §1.9):
// attnmix::TypeError → TypeError, attnmix::ValueError → ValueError, attnmix::StateError →
// RuntimeError; the C++ message is kept verbatim. (std::runtime_error, which the language-model
// functions raise for a bad checkpoint, is RuntimeError through pybind11's own translation.)
#include <pybind11/pybind11.h>

#include <exception>
#include <stdexcept>
#include <string>

#include "attnmix/core/errors.hpp"
#include "convert.hpp"

namespace py = pybind11;

namespace attnmix::python {
/// The cluster-bank functions, attention_law, RoPE and the language-model entry points
/// (bind_stream.cpp).
void bind_stream(py::module_& m);
}  // namespace attnmix::python

namespace {

void translate(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const attnmix::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const attnmix::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const attnmix::StateError& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

}  // namespace

PYBIND11_MODULE(_stream, m) {
  m.doc() =
      "attnmix._stream: the streaming functions of SPEC.md §6-7 on numpy arrays (import them "
      "through "
      "attnmix.experimental).";
  m.attr("__version__") = ATTNMIX_VERSION;
  py::register_exception_translator(&translate);
  attnmix::python::init_conversions();

  // Raises the C++ exception `kind` with `message`, so the tests can check every translation of
  // this module.
  m.def(
      "_raise",
      [](const std::string& kind, const std::string& message) {
        if (kind == "TypeError") throw attnmix::TypeError(message);
        if (kind == "ValueError") throw attnmix::ValueError(message);
        if (kind == "StateError") throw attnmix::StateError(message);
        throw std::invalid_argument("_raise: unknown kind " + kind);
      },
      py::arg("kind"), py::arg("message"));

  attnmix::python::bind_stream(m);
}
