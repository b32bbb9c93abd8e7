// SPDX-License-Identifier: Apache-2.0
// attnmix._core: the module definition and the one exception translator of the bindings (SPEC.md
// §1.9):
//   attnmix::TypeError → TypeError, attnmix::ValueError → ValueError,
//   attnmix::ImpossibleEvidenceError → attnmix.ImpossibleEvidenceError (a ValueError with .rows),
//   attnmix::StateError → RuntimeError; the C++ message is kept verbatim.
#include <pybind11/eval.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "bindings.hpp"
#include "convert.hpp"

namespace py = pybind11;

namespace {

/// attnmix.ImpossibleEvidenceError, defined in Python so that it carries `rows` and pickles with
/// it.
py::object make_impossible_evidence_error() {
  py::dict scope;
  scope["__builtins__"] = py::module_::import("builtins");
  scope["__name__"] = "attnmix";
  py::exec(R"(
class ImpossibleEvidenceError(ValueError):
    """Rows whose likelihood is exactly zero were given positive weight (SPEC.md §1.2).

    Nothing was changed by the call that raised it.

    Attributes:
        rows: the offending row indices, ascending, relative to the batch passed in.
    """

    def __init__(self, message="", rows=()):
        super().__init__(message)
        self.rows = [int(r) for r in rows]

    def __reduce__(self):
        return (type(self), (self.args[0] if self.args else "", self.rows))
)",
           scope);
  return scope["ImpossibleEvidenceError"];
}

PyObject* impossible_evidence_type =
    nullptr;  // a strong reference, kept for the life of the process

void translate(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const attnmix::ImpossibleEvidenceError& e) {
    py::list rows;
    for (int64_t row : e.rows()) rows.append(row);
    const py::object exc = py::handle(impossible_evidence_type)(py::str(e.what()), rows);
    PyErr_SetObject(impossible_evidence_type, exc.ptr());
  } catch (const attnmix::TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const attnmix::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const attnmix::StateError& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "attnmix._core: the compiled attnmix module (import it through the `attnmix` package).";
  m.attr("__version__") = ATTNMIX_VERSION;
  py::object impossible = make_impossible_evidence_error();
  impossible_evidence_type = impossible.inc_ref().ptr();
  m.attr("ImpossibleEvidenceError") = impossible;
  py::register_exception_translator(&translate);
  attnmix::python::init_conversions();

  // Raises the C++ exception `kind` with `message`, so the tests can check every translation
  // (SPEC.md §1.9), including StateError, which no family of this module raises yet.
  m.def(
      "_raise",
      [](const std::string& kind, const std::string& message, const std::vector<int64_t>& rows) {
        if (kind == "TypeError") throw attnmix::TypeError(message);
        if (kind == "ValueError") throw attnmix::ValueError(message);
        if (kind == "ImpossibleEvidenceError")
          throw attnmix::ImpossibleEvidenceError(message, rows);
        if (kind == "StateError") throw attnmix::StateError(message);
        throw std::invalid_argument("_raise: unknown kind " + kind);
      },
      py::arg("kind"), py::arg("message"), py::arg("rows") = std::vector<int64_t>{});

  attnmix::python::bind_core(m);
  attnmix::python::bind_attention(m);
  attnmix::python::bind_chained(m);
  attnmix::python::bind_variational(m);
  attnmix::python::bind_stats(m);
  attnmix::python::bind_inference(m);
  attnmix::python::bind_assign(m);
}
