# SPDX-License-Identifier: Apache-2.0
"""Every public name of the Python module has a docstring (the API reference, `make docs`, is generated from them):
the names each public module exports and the public attributes of each exported class. Fields of a dataclass are
documented in its class docstring, so their defaults need none of their own."""
import dataclasses
import importlib
import inspect
import pkgutil

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
