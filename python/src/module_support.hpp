// SPDX-License-Identifier: Apache-2.0
/// @file module_support.hpp
/// What every extension module of attnmix (_core, _stream) does at import, compiled into each of
/// them (module_support.cpp), so the two behave as one module (docs/mechanisms.md#building-blocks):
///
/// * One exception translation, registered module-locally, so that neither module's translator can
///   shadow the other's (pybind11 keeps one process-wide list, latest first, for every module):
///     attnmix::ImpossibleEvidenceError → attnmix.ImpossibleEvidenceError (a ValueError with .rows;
///                                        one class, made by _core and imported by _stream)
///     attnmix::TypeError  → TypeError     attnmix::ValueError → ValueError
///     attnmix::StateError → RuntimeError
///     attnmix::IoError    → OSError(errno, message): FileNotFoundError, PermissionError,
///                           IsADirectoryError, … by errno (a plain OSError when errno is 0)
///   The C++ message is kept verbatim.
/// * Every bound class pickles with every protocol (0-5), or refuses with TypeError; none aborts. A
///   class with __setstate__ gets __reduce__ = (copyreg.__newobj__, (cls,), self.__getstate__()),
///   the pickle protocols 2-5 always wrote, now for 0 and 1 too; any other class gets a __reduce__
///   raising TypeError("cannot pickle 'X' object").
/// * An instance made by Cls.__new__(Cls) without __init__ raises TypeError("X object is not
///   initialised (created by __new__ without __init__)") from every method, property and function
///   it reaches (X is the class whose C++ value is needed: Cls or a base of it), instead of running
///   C++ code on unconstructed memory.
#pragma once

#include <pybind11/pybind11.h>

namespace attnmix::python {

/// attnmix.ImpossibleEvidenceError, a new Python class (only _core calls it, once).
[[nodiscard]] pybind11::object make_impossible_evidence_error();

/// Registers the translation above for the functions of the module being initialised;
/// impossible_evidence is the attnmix.ImpossibleEvidenceError class (kept alive for the life of the
/// process).
void register_exception_translation(pybind11::handle impossible_evidence);

/// _raise(kind, message, rows=[], error_number=0): raises the C++ exception `kind` ("TypeError",
/// "ValueError", "ImpossibleEvidenceError", "StateError", "IoError") through m's functions, so the
/// tests can check every translation of every module.
void bind_raise(pybind11::module_& m);

/// Pickling and the uninitialised-instance guard for every class bound in m (its submodules and
/// nested classes included). Call it last, after every class of the module is bound.
void harden_classes(pybind11::module_& m);

}  // namespace attnmix::python
