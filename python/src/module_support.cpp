// SPDX-License-Identifier: Apache-2.0
// The import-time support shared by attnmix._core and attnmix._stream (module_support.hpp): one
// exception translation, pickling for every protocol and the guard against instances made by
// __new__ alone.
//
// Why these are needed (pybind11 2.10):
//   * py::register_exception_translator adds to one process-wide list, shared by every pybind11
//     module and tried latest first: _stream's translator, catching attnmix::ValueError, caught the
//     ImpossibleEvidenceError of _core's functions. A module-local translator is tried first, and
//     only for the functions of its own module.
//   * Protocols 0 and 1 pickle through copyreg._reduce_ex, which calls the first base class with a
//     __new__ of its own (pybind11_object) on the instance; pybind11 cannot make an instance of it
//     and aborts. A class's own __reduce__ takes precedence over copyreg for every protocol.
//   * When a method receives an instance whose __init__ never ran, pybind11 allocates its C++ value
//     lazily (type_caster_generic::load_value calls the class's operator_new) and then uses the
//     unconstructed memory. Pointing that operator_new at a function that throws turns every such
//     use into a TypeError; a constructed instance never reaches it, so valid calls cost nothing.
#include "module_support.hpp"

#include <pybind11/eval.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <exception>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/core/errors.hpp"

namespace attnmix::python {

namespace py = pybind11;

namespace {

// ---- exceptions ---------------------------------------------------------------------------------

/// attnmix.ImpossibleEvidenceError of this module's translator (a strong reference, kept for the
/// life of the process: the translator may run until the interpreter ends).
PyObject* impossible_evidence_type = nullptr;

void set_os_error(const IoError& e) {
  // OSError(errno, strerror) picks the subclass from errno (FileNotFoundError, …).
  const py::object error = e.error_number() != 0
                               ? py::handle(PyExc_OSError)(e.error_number(), py::str(e.what()))
                               : py::handle(PyExc_OSError)(py::str(e.what()));
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
}

void translate(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const ImpossibleEvidenceError& e) {  // before ValueError, its base
    py::list rows;
    for (const int64_t row : e.rows()) rows.append(row);
    const py::object exc = py::handle(impossible_evidence_type)(py::str(e.what()), rows);
    PyErr_SetObject(impossible_evidence_type, exc.ptr());
  } catch (const TypeError& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const StateError& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (const IoError& e) {
    set_os_error(e);
  }
}

// ---- instances made by __new__ alone ------------------------------------------------------------

/// The class names of the guarded classes, by guard slot (this module's classes only).
std::vector<std::string>& guarded_names() {
  static std::vector<std::string> names;
  return names;
}

constexpr const char* kNotInitialised =
    " object is not initialised (created by __new__ without __init__)";

[[noreturn]] void refuse_uninitialised(size_t slot) {
  const std::vector<std::string>& names = guarded_names();
  throw py::type_error((slot < names.size() ? names[slot] : std::string("this attnmix")) +
                       kNotInitialised);
}

/// One operator_new per slot, so that the error can name the class (pybind11 passes only the size).
template <size_t Slot>
void* refuse_slot(size_t /*size*/) {
  refuse_uninitialised(Slot);
}
void* refuse_unnamed(size_t /*size*/) { refuse_uninitialised(SIZE_MAX); }

using OperatorNew = void* (*)(size_t);
constexpr size_t kGuardSlots = 256;  // ample: _core binds about 80 classes
template <size_t... Slot>
constexpr std::array<OperatorNew, sizeof...(Slot)> make_guards(std::index_sequence<Slot...>) {
  return {&refuse_slot<Slot>...};
}
constexpr std::array<OperatorNew, kGuardSlots> kGuards =
    make_guards(std::make_index_sequence<kGuardSlots>{});

void guard_uninitialised(py::detail::type_info& info, const std::string& name) {
  std::vector<std::string>& names = guarded_names();
  if (names.size() < kGuardSlots) {
    info.operator_new = kGuards[names.size()];
    names.push_back(name);
  } else {
    info.operator_new = &refuse_unnamed;
  }
}

// ---- pickling -----------------------------------------------------------------------------------

/// The attribute dict of a module or a class (a class's __dict__ is a read-only proxy of it).
py::dict own_dict(py::handle scope) {
  if (PyType_Check(scope.ptr()))
    return py::reinterpret_borrow<py::dict>(reinterpret_cast<PyTypeObject*>(scope.ptr())->tp_dict);
  return py::reinterpret_borrow<py::dict>(PyModule_GetDict(scope.ptr()));
}

void install_reduce(py::handle cls, const std::string& name) {
  const py::dict own = own_dict(cls);
  if (own.contains("__reduce__") || own.contains("__reduce_ex__"))
    return;  // the class defines its own
  if (py::hasattr(cls, "__setstate__")) {
    // copyreg.__newobj__(cls) then obj.__setstate__(state): what protocols 2-5 write by themselves
    // (NEWOBJ, BUILD), so their pickles stay byte-identical; protocols 0 and 1 write the same call
    // as a global and a REDUCE.
    py::setattr(
        cls, "__reduce__",
        py::cpp_function(
            [](py::handle self) {
              return py::make_tuple(py::module_::import("copyreg").attr("__newobj__"),
                                    py::make_tuple(py::type::handle_of(self)),
                                    self.attr("__getstate__")());
            },
            py::is_method(cls), py::name("__reduce__"),
            py::doc("Pickle support for every protocol: (copyreg.__newobj__, (cls,), state).")));
  } else {
    py::setattr(cls, "__reduce__",
                py::cpp_function(
                    [name](py::handle /*self*/) -> py::object {
                      throw py::type_error("cannot pickle '" + name + "' object");
                    },
                    py::is_method(cls), py::name("__reduce__"),
                    py::doc("This class does not pickle (TypeError).")));
  }
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

/// The classes bound by this module: pybind11-registered types (not Python subclasses of them)
/// whose __module__ is module_name or one of its submodules.
void harden_scope(py::handle scope, const std::string& module_name, std::set<PyObject*>& seen) {
  const py::list values = own_dict(scope).attr("values")();  // a copy: classes change below
  for (const py::handle value : values) {
    if (!seen.insert(value.ptr()).second) continue;
    if (PyModule_Check(value.ptr())) {
      const std::string sub = py::str(value.attr("__name__"));
      if (starts_with(sub, module_name + ".")) harden_scope(value, module_name, seen);
      continue;
    }
    if (!PyType_Check(value.ptr())) continue;
    auto* type = reinterpret_cast<PyTypeObject*>(value.ptr());
    const std::vector<py::detail::type_info*>& infos = py::detail::all_type_info(type);
    if (infos.size() != 1 || infos.front()->type != type)
      continue;  // not a class bound by pybind11 itself
    if (!py::hasattr(value, "__module__")) continue;
    const std::string owner = py::str(value.attr("__module__"));
    if (owner != module_name && !starts_with(owner, module_name + ".")) continue;
    const std::string name = py::str(value.attr("__name__"));
    guard_uninitialised(*infos.front(), name);
    install_reduce(value, name);
    harden_scope(value, module_name, seen);  // nested classes
  }
}

}  // namespace

py::object make_impossible_evidence_error() {
  py::dict scope;
  scope["__builtins__"] = py::module_::import("builtins");
  scope["__name__"] = "attnmix";
  py::exec(R"(
class ImpossibleEvidenceError(ValueError):
    """Rows whose likelihood is exactly zero were given positive weight.

    Nothing was changed by the call that raised it.

    Attributes:
        rows: the offending row indices, ascending, relative to the batch passed in.

    Example:

    >>> import attnmix
    >>> model = attnmix.CategoricalDistribution([0.5, 0.5, 0.0])
    >>> acc = attnmix.CategoricalAccumulator(3)
    >>> try:
    ...     acc.seq_update([0, 2, 1], [1.0, 1.0, 1.0], model)
    ... except attnmix.ImpossibleEvidenceError as error:
    ...     print(error.rows, isinstance(error, ValueError))
    [1] True
    >>> acc.counts.tolist()
    [0.0, 0.0, 0.0]
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

void register_exception_translation(py::handle impossible_evidence) {
  impossible_evidence_type = impossible_evidence.inc_ref().ptr();
  py::register_local_exception_translator(&translate);
}

void bind_raise(py::module_& m) {
  m.def(
      "_raise",
      [](const std::string& kind, const std::string& message, const std::vector<int64_t>& rows,
         int error_number) {
        if (kind == "TypeError") throw TypeError(message);
        if (kind == "ValueError") throw ValueError(message);
        if (kind == "ImpossibleEvidenceError") throw ImpossibleEvidenceError(message, rows);
        if (kind == "StateError") throw StateError(message);
        if (kind == "IoError") throw IoError(message, error_number);
        throw std::invalid_argument("_raise: unknown kind " + kind);
      },
      py::arg("kind"), py::arg("message"), py::arg("rows") = std::vector<int64_t>{},
      py::arg("error_number") = 0);
}

void harden_classes(py::module_& m) {
  std::set<PyObject*> seen;
  harden_scope(m, py::str(m.attr("__name__")), seen);
}

}  // namespace attnmix::python
