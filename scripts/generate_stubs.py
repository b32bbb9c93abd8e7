#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the stubs of the estimator classes in python/attnmix/_core.pyi from the family descriptors.

The estimator classes of the attention families are generated from each family's option table in C++
(python/src/estimator_class.hpp); `attnmix._core._estimator_classes()` lists them with their sizes and options, and
this script renders each one's stub between the markers
    # >>> generated: <Class> (scripts/generate_stubs.py)
    # <<< generated: <Class>
in _core.pyi, so that the stubs say what the classes accept. --check (run by the Python tests) fails with a diff
when _core.pyi differs from what it would write.

Usage: PYTHONPATH=build/python /usr/bin/python3 scripts/generate_stubs.py [--check] [--stubs python/attnmix/_core.pyi]
"""
import argparse
import difflib
import os
import re
import sys

STUBS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "attnmix", "_core.pyi")


def python_type(option):
    if option["choices"]:
        return "Literal[" + ", ".join(f'"{c}"' for c in option["choices"]) + "]"
    return type(option["default"]).__name__


def stub(entry):
    """The stub of one generated estimator class."""
    name = entry["class"]
    family = name[: -len("Estimator")]
    args = [f"{s['keyword']}: int" for s in entry["sizes"]]
    keywords = [f"{o['name']}: {python_type(o)} = {o['default']!r}" for o in entry["options"]]
    if entry["seeded"]:
        keywords.append("seed: int = 0")
    keywords += ["pseudo_count: float | None = None", "name: str | None = None", "keys: str | None = None"]
    lines = [f"class {name}(Estimator):", "    def __init__("]
    for item in ["self"] + args + ["*"] + keywords:
        lines.append(f"        {item},")
    lines.append("    ) -> None: ...")
    lines += [f"    {s['keyword']}: int" for s in entry["sizes"]]
    lines += [f"    {o['name']}: {python_type(o)}" for o in entry["options"]]
    if entry["seeded"]:
        lines.append("    seed: int")
    lines += ["    name: str | None", "    keys: str | None",
              f"    def accumulator_factory(self) -> {family}AccumulatorFactory: ...",
              f"    def estimate(self, nobs: float | None, value: Any) -> {family}Distribution: ..."]
    return "\n".join(lines) + "\n"


def rendered(text, entries):
    """`text` with every generated block rewritten; a class without markers is an error."""
    for entry in entries:
        name = entry["class"]
        pattern = re.compile(rf"(# >>> generated: {name} \(scripts/generate_stubs.py\)\n).*?(# <<< generated: {name}\n)",
                             re.S)
        if not pattern.search(text):
            raise SystemExit(f"generate_stubs: {name} has no generated block in the stubs (add its markers)")
        text = pattern.sub(lambda m: m.group(1) + stub(entry) + m.group(2), text)
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail with a diff instead of writing")
    parser.add_argument("--stubs", default=STUBS)
    a = parser.parse_args()
    from attnmix import _core

    with open(a.stubs) as f:
        text = f.read()
    new = rendered(text, _core._estimator_classes())
    if a.check:
        if new != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), a.stubs, "generated"))
            print("generate_stubs: the stubs are stale; run scripts/generate_stubs.py")
            return 1
        return 0
    if new != text:
        with open(a.stubs, "w") as f:
            f.write(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
