# SPDX-License-Identifier: Apache-2.0
"""The page of `attnmix plot --html` in a real browser: headless chromium opens it, logs nothing to its console and
takes a screenshot in which the figures are drawn (coloured heatmap pixels, not a blank page). Skipped, with the
reason, only where chromium is missing or cannot start."""
import shutil
import subprocess

import numpy as np
import pytest

import attnmix
from helpers import run_cli

BROWSER = shutil.which("chromium")


def browse(url, screenshot):
    return subprocess.run([BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", f"--screenshot={screenshot}",
                           "--window-size=1280,2400", url], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if BROWSER is None:
        pytest.skip("chromium is not installed (scripts/install-deps.sh installs it)")
    blank = tmp_path_factory.mktemp("blank")
    (blank / "empty.html").write_text("<!DOCTYPE html><title>empty</title>")
    started = browse((blank / "empty.html").as_uri(), blank / "shot.png")
    if started.returncode != 0 or not (blank / "shot.png").exists():
        pytest.skip(f"chromium cannot start here: {started.stderr.strip().splitlines()[-1:]}")
    return BROWSER


def test_the_html_page_renders_its_figures_without_console_messages(browser, tmp_path):
    rng = np.random.default_rng(3)
    model = attnmix.ResponsibilityAttentionDistribution(rng.standard_normal((5, 3)), rng.dirichlet(np.ones(4), size=5),
                                                        np.full(4, 0.25), sigma2=0.5)
    attnmix.save_model(model, tmp_path / "ra.json")
    rows = model.sampler(seed=1).sample(6)
    (tmp_path / "ra.jsonl").write_text("".join(
        '{"context": %s, "query": %s, "target": %d}\n' % (list(map(int, c)), list(map(float, y)), t)
        for c, y, t in rows))
    run_cli("plot", tmp_path / "ra.json", "--data", tmp_path / "ra.jsonl", "--out", tmp_path / "figures", "--html")
    shot = tmp_path / "shot.png"
    result = browse((tmp_path / "figures" / "index.html").as_uri(), shot)
    assert result.returncode == 0, result.stderr
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
    from matplotlib.image import imread

    pixels = imread(shot)[..., :3]
    saturation = pixels.max(axis=2) - pixels.min(axis=2)
    assert (saturation > 0.3).mean() > 0.02  # the viridis heatmaps are drawn, not only text on white
