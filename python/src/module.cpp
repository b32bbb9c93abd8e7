// SPDX-License-Identifier: Apache-2.0
// attnmix._core: the module definition. The exception translation (docs/mechanisms.md#building-blocks), pickling and
// the guard against uninitialised instances are shared with attnmix._stream (module_support.hpp):
//   attnmix::TypeError → TypeError, attnmix::ValueError → ValueError,
//   attnmix::ImpossibleEvidenceError → attnmix.ImpossibleEvidenceError (a ValueError with .rows),
//   attnmix::StateError → RuntimeError, attnmix::IoError → OSError (by errno: FileNotFoundError,
//   …); the C++ message is kept verbatim.
#include <pybind11/pybind11.h>

#include "bindings.hpp"
#include "convert.hpp"
#include "estimator_class.hpp"
#include "module_support.hpp"

namespace py = pybind11;

namespace attnmix::python {
// The families' Python classes: a family's binding file under families/ and its line here, in binding order.
void bind_attention(py::module_& m);         // families/responsibility.cpp: responsibility attention, sequence_to_triples
void bind_sparse_attention(py::module_& m);  // families/sparse_responsibility.cpp: sparse responsibility attention
void bind_chained(py::module_& m);           // families/chained.cpp: chained attention
void bind_variational(py::module_& m);       // families/variational.cpp: both variational families, their optimizer state
void bind_stats(py::module_& m);             // families/stats.cpp: Mixture, Composite, Categorical, DiagonalGaussian
constexpr void (*kFamilyBindings[])(py::module_&) = {bind_attention, bind_sparse_attention, bind_chained,
                                                        bind_variational, bind_stats};
}  // namespace attnmix::python

PYBIND11_MODULE(_core, m) {
  m.doc() = "attnmix._core: the compiled attnmix module (import it through the `attnmix` package).";
  m.attr("__version__") = ATTNMIX_VERSION;
  const py::object impossible = attnmix::python::make_impossible_evidence_error();
  m.attr("ImpossibleEvidenceError") = impossible;
  attnmix::python::register_exception_translation(impossible);
  attnmix::python::init_conversions();

  // _raise(kind, message, rows=[], error_number=0) raises the C++ exception `kind`, so the tests
  // can check every translation (docs/mechanisms.md#building-blocks), including StateError, which no family of this
  // module raises yet.
  attnmix::python::bind_raise(m);

  attnmix::python::bind_core(m);
  for (const auto bind_family : attnmix::python::kFamilyBindings) bind_family(m);
  attnmix::python::bind_inference(m);
  attnmix::python::bind_assign(m);
  attnmix::python::bind_estimator_table(m);
  attnmix::python::harden_classes(m);  // last: every class is bound
}
