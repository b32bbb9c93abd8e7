# SPDX-License-Identifier: Apache-2.0
"""Every public name of the Python module has a docstring (the API reference, `make docs`, is generated from them):
the names each public module exports and the public attributes of each exported class. Fields of a dataclass are
documented in its class docstring, so their defaults need none of their own. Every public function of the modules in
EXAMPLE_MODULES, and every public class of those in EXAMPLE_CLASS_MODULES, shows an example, and each example runs
and prints what it says."""
import dataclasses
import doctest
import importlib
import inspect
import pkgutil

import pytest

import attnmix


def public_modules():
    names = ["attnmix"] + [f"attnmix.{m.name}" for m in pkgutil.iter_modules(attnmix.__path__)
                           if not m.name.startswith("_")]
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:  # attnmix.torch without torch: nothing of it to document in this build
            continue
    return modules


def undocumented():
    missing = []
    for module in public_modules():
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        for name in names:
            obj = getattr(module, name)
            if not (getattr(obj, "__doc__", None) or "").strip():
                missing.append(f"{module.__name__}.{name}")
            if not inspect.isclass(obj):
                continue
            fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            for attr, value in vars(obj).items():
                if attr.startswith("_") or attr in fields:
                    continue
                if not (getattr(value, "__doc__", None) or "").strip():
                    missing.append(f"{module.__name__}.{name}.{attr}")
    return missing


def test_every_public_name_has_a_docstring():
    assert undocumented() == []


# Modules whose every public function shows a runnable example, and (EXAMPLE_CLASS_MODULES) whose every public class
# does too. A module this build lacks is left out, as in public_modules: attnmix.torch needs Python torch, and the
# names of attnmix.experimental the extension attnmix._stream (both built only with libtorch).
EXAMPLE_MODULES = ["attnmix", "attnmix.assign", "attnmix.experimental", "attnmix.inference", "attnmix.plot",
                   "attnmix.stats", "attnmix.torch"]
EXAMPLE_CLASS_MODULES = ["attnmix", "attnmix.torch"]


def public_objects(module_names, classes):
    """{qualified name: object} of the public functions (or, with classes, the public classes) of the modules."""
    found = {}
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
            names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
            objects = {name: getattr(module, name) for name in names}
        except ImportError:
            continue
        for name, obj in objects.items():
            wanted = inspect.isclass(obj) if classes else (callable(obj) and not inspect.isclass(obj))
            if wanted and not inspect.ismodule(obj):
                found[f"{module_name}.{name}"] = obj
    return found


def public_functions():
    return public_objects(EXAMPLE_MODULES, classes=False)


def public_classes():
    return public_objects(EXAMPLE_CLASS_MODULES, classes=True)


def with_examples():
    return {**public_functions(), **public_classes()}


def test_every_public_function_shows_an_example():
    functions = public_functions()
    assert len(functions) >= 25
    assert [name for name, f in functions.items() if ">>>" not in (f.__doc__ or "")] == []


def test_every_public_class_shows_an_example():
    """The class's own docstring (not one it inherits) shows how to use it."""
    classes = public_classes()
    assert [name for name, c in classes.items() if ">>>" not in (c.__doc__ or "")] == []


@pytest.mark.parametrize("name", sorted(with_examples()))
def test_docstring_examples_run(name):
    """Each example runs on its own, as the docs' doctest builder runs it, and prints what its docstring says."""
    doc = with_examples()[name].__doc__
    test = doctest.DocTestParser().get_doctest(doc, {}, name, None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    output = []
    runner.run(test, out=output.append)
    assert test.examples and runner.failures == 0, "".join(output)
