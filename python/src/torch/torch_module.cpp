// SPDX-License-Identifier: Apache-2.0
// attnmix._torch: the streaming mechanisms of attnmix::torch on torch tensors, with autograd (imported by the
// attnmix.torch package, never by `import attnmix`). It is built against torch's Python extension headers and
// libtorch_python, so tensors cross without copies and the C++ operations join the caller's autograd graph.
// Errors translate as in the other extensions (module_support.hpp); libtorch's own errors (c10::Error and its
// subclasses) become RuntimeError, ValueError, TypeError or IndexError with the message and without the C++
// backtrace.
#include <torch/extension.h>

#include "../convert.hpp"
#include "../module_support.hpp"

namespace py = pybind11;

namespace attnmix::python {

using namespace attnmix::stream;  // the streaming models this file exposes
void bind_functional(py::module_& m);  // bind_functional.cpp
void bind_mechanisms(py::module_& m);  // bind_mechanisms.cpp
void bind_sketch_spines(py::module_& m);  // bind_sketch_spines.cpp
void bind_layers(py::module_& m);      // bind_layers.cpp
}  // namespace attnmix::python

namespace {

void translate_torch_error(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  }
}

}  // namespace

PYBIND11_MODULE(_torch, m) {
  m.doc() = "attnmix._torch: the streaming mechanisms on torch tensors (use them through attnmix.torch).";
  m.attr("__version__") = ATTNMIX_VERSION;
  py::module_::import("torch");
  attnmix::python::register_exception_translation(
      py::module_::import("attnmix._core").attr("ImpossibleEvidenceError"));
  py::register_local_exception_translator(&translate_torch_error);
  attnmix::python::init_conversions();
  attnmix::python::bind_raise(m);

  attnmix::python::bind_functional(m);
  attnmix::python::bind_mechanisms(m);
  attnmix::python::bind_sketch_spines(m);
  attnmix::python::bind_layers(m);
  attnmix::python::harden_classes(m);  // last: every class is bound
}
