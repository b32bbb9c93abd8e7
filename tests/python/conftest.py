# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures of the Python tests.

The module is imported here, at collection time: if attnmix (or its compiled part) is missing or broken, every test
file fails to collect and ctest reports the failure. Nothing is ever skipped for a missing module. When ctest runs
the tests it names the build tree's package (ATTNMIX_PYTHON_BUILD_DIR), and the tests refuse any other copy (an
installed one, say).
"""
import os

import numpy as np
import pytest

import attnmix

SEED = int(os.environ.get("ATTNMIX_TEST_SEED", "20240611"))

_build_dir = os.environ.get("ATTNMIX_PYTHON_BUILD_DIR")
if _build_dir and not os.path.realpath(attnmix.__file__).startswith(os.path.realpath(_build_dir)):
    raise ImportError(f"attnmix was imported from {attnmix.__file__}, not from the build tree {_build_dir}")


def pytest_report_header(config):
    return f"attnmix {attnmix.__version__} from {os.path.dirname(attnmix.__file__)}; ATTNMIX_TEST_SEED={SEED}"


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.python)


@pytest.fixture
def rng(request):
    """A numpy Generator seeded from ATTNMIX_TEST_SEED (default 20240611) and the test's name.

    The seed is recorded in the test report, so a failure shows it.
    """
    seed = (SEED + sum(map(ord, request.node.name))) % (2**31)
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seeds = [value for key, value in item.user_properties if key == "seed"]
        if seeds:
            report.sections.append(("rng fixture seed", f"seed {seeds[0]} (ATTNMIX_TEST_SEED={SEED})"))
