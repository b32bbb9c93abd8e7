# SPDX-License-Identifier: Apache-2.0
"""The stubs of the generated estimator classes in _core.pyi, and the keyword options of the streaming functions in
_stream.pyi, are what scripts/generate_stubs.py writes from the family descriptors and the streaming option tables (CI
fails when they are stale); each generated class accepts exactly the keywords its stub lists, with the defaults the
stub shows, and each streaming function's stub lists the keywords and defaults of its default_*_options()."""
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest

import attnmix
from attnmix import _core

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_generated_stubs_are_current():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "generate_stubs.py"), "--check"],
                            capture_output=True, text=True, env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("entry", _core._estimator_classes(), ids=lambda e: e["class"])
def test_every_option_is_a_keyword_with_its_default(entry):
    cls = getattr(attnmix, entry["class"])
    sizes = [2] * len(entry["sizes"])
    # A family shaped by its data takes training rows (the sparse family's: one row of symbol 0, all sizes equal).
    rows = (lambda k: {"rows": (np.zeros((1, k), np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))}) \
        if entry["rows"] else (lambda k: {})
    estimator = cls(*sizes, **rows(2))
    for size in entry["sizes"]:
        assert getattr(estimator, size["keyword"]) == 2
    for option in entry["options"]:
        assert getattr(estimator, option["name"]) == option["default"]
        assert type(getattr(estimator, option["name"])) is type(option["default"])
    # The same class from keywords only, every option set to its default explicitly.
    keywords = {s["keyword"]: 3 for s in entry["sizes"]}
    keywords.update({o["name"]: o["default"] for o in entry["options"]})
    again = cls(**keywords, **rows(3))
    assert all(getattr(again, s["keyword"]) == 3 for s in entry["sizes"])
    assert entry["class"] + "(" in cls.__init__.__doc__
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        cls(*sizes, bogus=1, **rows(2))
    with pytest.raises(TypeError, match="missing required argument"):
        cls(*sizes[:-1], **rows(2))
    if entry["rows"]:
        with pytest.raises(TypeError, match="missing required argument 'rows'"):
            cls(*sizes)
    with pytest.raises(TypeError, match="keyword-only"):
        cls(*sizes, 1.0, **rows(2))
    assert inspect.isclass(cls) and issubclass(cls, attnmix.Estimator)


def test_stream_stubs_list_every_option_with_its_default():
    stream = pytest.importorskip("attnmix._stream")  # absent only from builds without libtorch
    defaults = {"train_language_model": stream.default_train_options(),
                "generate_language_model": stream.default_generate_options(),
                "run_recall": stream.default_recall_options(),
                "run_memory_benchmark": stream.default_memory_bench_options()}
    tables = stream._option_tables()
    assert set(tables) == set(defaults)
    with open(os.path.join(ROOT, "python", "attnmix", "_stream.pyi")) as f:
        stubs = f.read()
    for function, options in tables.items():
        assert {o["name"]: o["default"] for o in options} == defaults[function]
        for option in options:
            assert f"    {option['name']}: {option['type']} = {option['default']!r},\n" in stubs, (function, option)
