// SPDX-License-Identifier: Apache-2.0
// attnmix._stream: the streaming part of attnmix (docs/mechanisms.md#streaming-language-model and
// #moment-closure-far-field, target attnmix::torch) on numpy arrays, imported lazily by attnmix.experimental. It is a
// separate extension because it loads libtorch, which `import attnmix` must never do; it needs no Python torch (tensors
// cross as float64 numpy arrays, copied both ways). Errors translate exactly as in attnmix._core, by the
// same code (module_support.hpp), registered for this module's functions only, and with the same
// attnmix.ImpossibleEvidenceError class, imported from _core. (std::runtime_error, which the
// language-model functions raise for a bad checkpoint, is RuntimeError through pybind11's own
// translation.)
#include <pybind11/pybind11.h>

#include "convert.hpp"
#include "module_support.hpp"

namespace py = pybind11;

namespace attnmix::python {
/// The cluster-bank functions, attention_law, RoPE and the language-model entry points
/// (bind_stream.cpp).
void bind_stream(py::module_& m);
}  // namespace attnmix::python

PYBIND11_MODULE(_stream, m) {
  m.doc() =
      "attnmix._stream: the streaming functions (docs/mechanisms.md#streaming-language-model, "
      "docs/mechanisms.md#moment-closure-far-field) on numpy arrays (import them through "
      "attnmix.experimental).";
  m.attr("__version__") = ATTNMIX_VERSION;
  attnmix::python::register_exception_translation(
      py::module_::import("attnmix._core").attr("ImpossibleEvidenceError"));
  attnmix::python::init_conversions();

  // _raise(kind, message, rows=[], error_number=0): as attnmix._core._raise, through this module's
  // translation.
  attnmix::python::bind_raise(m);

  attnmix::python::bind_stream(m);
  attnmix::python::harden_classes(m);  // last: every class is bound
}
