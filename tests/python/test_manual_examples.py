# SPDX-License-Identifier: Apache-2.0
"""The manual's Python examples run: every ```python block of README.md and docs/**/*.md, the blocks of one page in
order in one namespace (a page's later blocks use what its earlier ones made), in a scratch working folder, so an
example that falls out of step with the API fails here. Printed values the text quotes are checked where a line
ends in `# <value>` after a print call."""
import contextlib
import io
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
QUOTED = re.compile(r"^print\((.*)\)\s*#\s*(-?[0-9.]+)\s*$")


def python_blocks(page):
    return BLOCK.findall(page.read_text(encoding="utf-8"))


EXAMPLE_PAGES = [page for page in PAGES if python_blocks(page)]


def test_the_manual_has_examples():
    names = {page.name for page in EXAMPLE_PAGES}
    assert {"README.md", "tutorials.md", "torch.md"} <= names


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_of_the_page_run(page, tmp_path, monkeypatch):
    pytest.importorskip("attnmix.torch")  # README's and torch.md's examples; a build without it has no such pages
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__"}
    for number, block in enumerate(python_blocks(page), start=1):
        quoted = [m.groups() for m in map(QUOTED.match, block.splitlines()) if m]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block, f"{page.name} example {number}", "exec"), namespace)  # noqa: S102
        if quoted:  # one quoted print per block: its value, to the digits quoted
            assert len(quoted) == 1, f"{page.name} example {number}: quote one printed value per block"
            value = quoted[0][1]
            decimals = len(value.split(".")[1]) if "." in value else 0
            shown = float(printed.getvalue().split()[-1])
            assert round(shown, decimals) == pytest.approx(float(value)), (page.name, number, shown, value)
