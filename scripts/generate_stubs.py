#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the generated parts of the stubs: the estimator classes in python/attnmix/_core.pyi from the family
descriptors, and the keyword options of the streaming functions in python/attnmix/_stream.pyi from their option tables.

The estimator classes of the attention families are generated from each family's option table in C++
(python/src/estimator_class.hpp); `attnmix._core._estimator_classes()` lists them with their sizes and options. The
streaming functions (train_language_model, generate_language_model, run_recall, run_memory_benchmark) take the options
of the tables in include/attnmix/stream/option_table.hpp; `attnmix._stream._option_tables()` lists them with their
annotations and defaults. This script renders each class's stub, and each function's keyword options, between the
markers
    # >>> generated: <name> (scripts/generate_stubs.py)
    # <<< generated: <name>
so that the stubs say what the classes and functions accept. --check (run by the Python tests) fails with a diff
when a stub file differs from what it would write.

Usage: PYTHONPATH=build/python /usr/bin/python3 scripts/generate_stubs.py [--check] [--stubs python/attnmix/_core.pyi]
    [--stream-stubs python/attnmix/_stream.pyi]
"""
import argparse
import difflib
import os
import re
import sys

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "attnmix")


def python_type(option):
    if option["choices"]:
        return "Literal[" + ", ".join(f'"{c}"' for c in option["choices"]) + "]"
    return type(option["default"]).__name__


def stub(entry):
    """The stub of one generated estimator class."""
    name = entry["class"]
    family = name[: -len("Estimator")]
    args = [f"{s['keyword']}: int" for s in entry["sizes"]]
    keywords = ["rows: Data"] if entry["rows"] else []
    keywords += [f"{o['name']}: {python_type(o)} = {o['default']!r}" for o in entry["options"]]
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


def stream_keywords(options):
    """The keyword parameters of a streaming function, one per line, indented for its signature."""
    return "".join(f"    {o['name']}: {o['type']} = {o['default']!r},\n" for o in options) + "    "


def rendered(text, blocks):
    """`text` with every generated block (name → its text) rewritten; a block without markers is an error."""
    for name, body in blocks.items():
        pattern = re.compile(rf"(# >>> generated: {name} \(scripts/generate_stubs.py\)\n).*?(# <<< generated: {name}\n)",
                             re.S)
        if not pattern.search(text):
            raise SystemExit(f"generate_stubs: {name} has no generated block in the stubs (add its markers)")
        text = pattern.sub(lambda m: m.group(1) + body + m.group(2), text)
    return text


def update(path, blocks, check):
    """Rewrites the generated blocks of one stub file; with `check`, prints the diff instead. True when current."""
    with open(path) as f:
        text = f.read()
    new = rendered(text, blocks)
    if new == text:
        return True
    if check:
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), path, "generated"))
        return False
    with open(path, "w") as f:
        f.write(new)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail with a diff instead of writing")
    parser.add_argument("--stubs", default=os.path.join(PACKAGE, "_core.pyi"))
    parser.add_argument("--stream-stubs", default=os.path.join(PACKAGE, "_stream.pyi"))
    a = parser.parse_args()
    from attnmix import _core

    current = update(a.stubs, {e["class"]: stub(e) for e in _core._estimator_classes()}, a.check)
    try:
        from attnmix import _stream
    except ImportError:  # a build without libtorch has no streaming module
        _stream = None
    if _stream is not None:
        tables = _stream._option_tables()
        current = update(a.stream_stubs, {name: stream_keywords(options) for name, options in tables.items()},
                         a.check) and current
    if not current:
        print("generate_stubs: the stubs are stale; run scripts/generate_stubs.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
