# ATTNMIX_WITH_PYTHON (STYLE.md §8, §9): build the attnmix Python module (attnmix._core, pybind11).
# Left unset, the first configure turns it ON when pybind11 (≥ 2.10) and Python ≥ 3.11 with Development.Module and
# NumPy are found, OFF otherwise, and caches the answer (delete the cache entry to look again). Set to ON, missing
# dependencies are an error; set to OFF, nothing is looked for.
# The interpreter is pinned: Python_EXECUTABLE defaults to /usr/bin/python3 (Debian's numpy and pytest live there,
# not in a pyenv python3 that may come first on PATH); the module is built for it and the tests run with it.
if(NOT Python_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "The Python interpreter the attnmix module is built and tested for")
endif()
set(PYBIND11_FINDPYTHON ON)

if(DEFINED CACHE{ATTNMIX_WITH_PYTHON})
  if(ATTNMIX_WITH_PYTHON)
    find_package(Python 3.11 REQUIRED COMPONENTS Interpreter Development.Module NumPy)
    find_package(pybind11 2.10 REQUIRED CONFIG)
  endif()
else()
  find_package(Python 3.11 QUIET COMPONENTS Interpreter Development.Module NumPy)
  if(Python_FOUND)
    find_package(pybind11 2.10 QUIET CONFIG)
  endif()
  if(Python_FOUND AND pybind11_FOUND)
    set(_attnmix_python_default ON)
  else()
    set(_attnmix_python_default OFF)
    message(STATUS "attnmix: Python module OFF (needs pybind11-dev, python3-dev and python3-numpy)")
  endif()
  set(ATTNMIX_WITH_PYTHON ${_attnmix_python_default} CACHE BOOL
      "Build the attnmix Python module (default: ON when pybind11 and Python 3.11 with NumPy are found)")
endif()
