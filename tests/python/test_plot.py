# SPDX-License-Identifier: Apache-2.0
"""attnmix.plot on small fitted models: each figure has the expected panels, titles and labels, shows the model's own
numbers (the image data equal the posterior or the table it draws), and saves as a PNG or SVG of real content."""
import io
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import attnmix
from attnmix import plot
from attnmix.assign import frequency_estimate, kruskal_tree
from helpers import cli, run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def image_of(ax):
    (image,) = ax.get_images()
    return np.asarray(image.get_array())


def saved(fig, fmt):
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt)
    return buffer.getvalue()


def assert_real_png(fig):
    data = saved(fig, "png")
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 10_000  # a blank canvas of this size compresses to a few kB


def assert_real_svg(fig):
    root = ET.fromstring(saved(fig, "svg"))
    assert root.tag.endswith("svg")
    assert sum(1 for element in root.iter() if element.tag.endswith("path")) > 20


@pytest.fixture(scope="module")
def ra_fit():
    truth = attnmix.ResponsibilityAttentionDistribution(
        np.random.default_rng(1).standard_normal((5, 3)), np.random.default_rng(2).dirichlet(np.ones(4), size=5),
        np.full(4, 0.25), sigma2=0.5)
    rows = truth.sampler(seed=3).sample(300)
    model = attnmix.optimize(rows, attnmix.ResponsibilityAttentionEstimator(5, 4, 3, 4, sigma2=0.5), max_its=5,
                             rng=np.random.RandomState(0), out=None)
    return model, rows


def test_responsibilities_shows_the_posterior_with_symbols_targets_and_predictions(ra_fit):
    model, rows = ra_fit
    fig = plot.responsibilities(model, rows[:6])
    ax = fig.axes[0]
    np.testing.assert_array_equal(image_of(ax), model.responsibilities(rows[:6]))
    texts = [t.get_text() for t in ax.texts]
    assert texts[:4] == [str(s) for s in rows[0][0]]  # the first observation's context symbols, by position
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    predicted = model.predict_proba(np.array([r[0] for r in rows[:6]]), np.array([r[1] for r in rows[:6]])).argmax(1)
    assert ticks == [f"t={r[2]} pred={p}" for r, p in zip(rows[:6], predicted)]
    assert ax.get_xlabel() == "position"
    assert_real_png(fig)
    assert_real_svg(fig)


def test_responsibilities_take_a_tuple_of_arrays(ra_fit):
    model, rows = ra_fit
    arrays = tuple(np.array([r[f] for r in rows[:4]]) for f in range(3))
    np.testing.assert_array_equal(image_of(plot.responsibilities(model, arrays).axes[0]),
                                  image_of(plot.responsibilities(model, rows[:4]).axes[0]))


def test_attention_tables_draw_keys_emission_and_prior(ra_fit):
    model, _ = ra_fit
    fig = plot.attention_tables(model)
    keys, emission, prior = fig.axes[:3]  # the three panels, then the two colour bars
    np.testing.assert_array_equal(image_of(keys), model.key_means)
    np.testing.assert_array_equal(image_of(emission), model.emission)
    assert [p.get_height() for p in prior.patches] == pytest.approx(list(model.position_prior))
    assert prior.get_title() == "position prior π"
    assert_real_png(fig)


def test_tables_of_a_large_vocabulary_show_the_most_peaked_symbols():
    rng = np.random.default_rng(5)
    emission = rng.dirichlet(np.ones(6), size=100)
    emission[[7, 42, 90]] = np.eye(6)[[0, 1, 2]]  # three symbols that always emit one target
    model = attnmix.ResponsibilityAttentionDistribution(rng.standard_normal((100, 2)), emission, np.full(3, 1 / 3))
    fig = plot.attention_tables(model, top_k=3)
    keys = fig.axes[0]
    assert keys.get_title() == "key table K (3 of 100 symbols)"
    assert [t.get_text() for t in keys.get_yticklabels()] == ["7", "42", "90"]
    np.testing.assert_array_equal(image_of(keys), model.key_means[[7, 42, 90]])


@pytest.fixture(scope="module")
def ca_model():
    rng = np.random.default_rng(7)
    return attnmix.ChainedAttentionDistribution(rng.standard_normal((2, 6, 6)), rng.dirichlet(np.ones(6), size=6),
                                                sigma2=0.3)


def test_hop_posteriors_one_panel_per_hop_with_key_value_cells(ca_model):
    rows = ca_model.sampler(seed=2, context_length=5).sample(4)
    fig = plot.hop_posteriors(ca_model, rows)
    panels = [ax for ax in fig.axes if ax.get_images() and ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["hop 1: p(position | row)", "hop 2: p(position | row)"]
    gamma = ca_model.posterior(rows)
    for hop, ax in enumerate(panels):
        np.testing.assert_array_equal(image_of(ax), gamma[:, hop, :])
    keys, values = rows[0][0], rows[0][1]
    assert [t.get_text() for t in panels[0].texts][:5] == [f"{k}→{v}" for k, v in zip(keys, values)]
    assert_real_png(fig)


def test_key_tables_one_heatmap_per_hop(ca_model):
    fig = plot.key_tables(ca_model)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 2
    for hop, ax in enumerate(panels):
        np.testing.assert_array_equal(image_of(ax), ca_model.key_tables[hop])


def test_embeddings_project_the_means_on_their_principal_plane():
    rng = np.random.default_rng(3)
    S, D = 6, 4
    model = attnmix.VariationalEmbeddingAttentionDistribution(
        rng.standard_normal((S, D)), np.full((S, D), -2.0), rng.dirichlet(np.ones(4), size=S), np.full(3, 1 / 3))
    labels = ["a", "b", "c", "d", "e", "f"]
    fig = plot.embeddings(model, labels=labels)
    ax = fig.axes[0]
    points = ax.collections[0].get_offsets()
    centred = model.mean - model.mean.mean(axis=0)
    # The projection keeps the distances within the principal plane: its Gram matrix is the rank-2 part of the means'.
    u, s, vt = np.linalg.svd(centred, full_matrices=False)
    np.testing.assert_allclose(np.asarray(points) @ np.asarray(points).T, (u[:, :2] * s[:2] ** 2) @ u[:, :2].T,
                               atol=1e-10)
    assert [t.get_text() for t in ax.texts] == labels
    widths = sorted(p.width for p in ax.patches)
    assert widths[0] == pytest.approx(2 * np.exp(-1.0))  # v = e^-2 on every axis: one standard deviation is e^-1
    with pytest.raises(ValueError, match="2 labels for 6 symbols"):
        plot.embeddings(model, labels=["a", "b"])
    assert_real_svg(fig)


def test_fit_history_from_lists_dicts_and_files(tmp_path):
    fig = plot.fit_history([-10.0, -8.0, -7.5])
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [1, 2, 3] and list(line.get_ydata()) == [-10.0, -8.0, -7.5]
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"iteration": i, "log_likelihood": -5.0 + i, "validation": -6.0 + i}) + "\n"
                            for i in (1, 2)))
    lines = plot.fit_history(path).axes[0].get_lines()
    assert [list(l.get_ydata()) for l in lines] == [[-4.0, -3.0], [-5.0, -4.0]]
    with pytest.raises(ValueError, match="empty"):
        plot.fit_history([])


def test_assignment_pictures():
    rng = attnmix.Rng(11)
    cost = np.random.default_rng(0).standard_normal((6, 5))
    freq = frequency_estimate(cost, 1.7, 64, rng)
    tree = kruskal_tree(freq)
    fig = plot.assignment_frequencies(freq, tree)
    ax = fig.axes[0]
    np.testing.assert_array_equal(image_of(ax), freq)
    edges = {(int(x), int(y)) for x, y in ax.collections[0].get_offsets()}
    assert edges == {(j, i) for i, j in zip(*np.nonzero(tree))} and len(edges) == 6 + 5 - 1
    with pytest.raises(ValueError, match="differ in shape"):
        plot.assignment_frequencies(freq, tree[:, :4])
    results = {"prediction_1_rmse": {"4": 0.1, "16": 0.05, "64": 0.025}, "prediction_1_rmse_slope_observed": -0.5,
               "prediction_2_union_edges": [{"K": 4, "observed": 30, "predicted": 31},
                                            {"K": 16, "observed": 50, "predicted": 49}]}
    fig = plot.assignment_scaling(results)
    left, right = fig.axes
    observed, law = left.get_lines()
    assert list(observed.get_ydata()) == [0.1, 0.05, 0.025]
    np.testing.assert_allclose(law.get_ydata(), [0.1, 0.05, 0.025])  # these numbers follow K^(-1/2) exactly
    assert left.get_xscale() == "log" and left.get_yscale() == "log"
    assert [list(l.get_ydata()) for l in right.get_lines()] == [[30, 50], [31, 49]]
    assert_real_png(fig)


def test_fit_history_of_the_command_line(tmp_path):
    """`attnmix fit --history` writes one line per progress line, with the log-likelihoods it printed; the figure
    draws them; a history that would replace the model is refused before anything runs."""
    rng = np.random.default_rng(4)
    rows = tmp_path / "values.jsonl"
    rows.write_text("".join(json.dumps({"value": int(v)}) + "\n" for v in rng.integers(0, 4, 200)))
    history, model = tmp_path / "h.jsonl", tmp_path / "m.json"
    printed = run_cli("fit", "--family", "categorical", "--data", rows, "--valid", rows, "--out", model,
                      "--history", history, "--max-its", "4", "--delta", "none").stdout
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    progress = [line for line in printed.splitlines() if line.startswith("Iteration ")]
    assert [h["iteration"] for h in lines] == [1, 2, 3, 4] and len(progress) == 4
    for h, text in zip(lines, progress):
        assert f"ln[p_mat(Data|Model)]={h['log_likelihood']:.6e}" in text
        assert h["validation"] == h["log_likelihood"] and h["seconds"] >= 0
    assert lines[0]["delta"] is None
    assert lines[1]["delta"] == pytest.approx(lines[1]["log_likelihood"] - lines[0]["log_likelihood"])
    drawn = plot.fit_history(history).axes[0].get_lines()
    assert list(drawn[0].get_ydata()) == [h["log_likelihood"] for h in lines]
    refused = subprocess.run([cli(), "fit", "--family", "categorical", "--data", rows, "--out", tmp_path / "n.json",
                              "--history", tmp_path / "n.json"], capture_output=True, text=True)
    assert refused.returncode == 1 and "give each its own path" in refused.stderr
    assert not (tmp_path / "n.json").exists()


def write_rows(path, rows, fields):
    path.write_text("".join(json.dumps({f: np.asarray(v).tolist() for f, v in zip(fields, row)}) + "\n"
                            for row in rows))


def test_plot_command_writes_every_figure_and_the_page(tmp_path, ra_fit, ca_model):
    model, rows = ra_fit
    attnmix.save_model(model, tmp_path / "ra.json")
    write_rows(tmp_path / "ra.jsonl", rows[:20], ("context", "query", "target"))
    attnmix.save_model(ca_model, tmp_path / "ca.json")
    write_rows(tmp_path / "ca.jsonl", ca_model.sampler(seed=1, context_length=4).sample(5),
               ("keys", "values", "query", "target"))
    (tmp_path / "h.jsonl").write_text('{"iteration": 1, "log_likelihood": -3.0}\n'
                                      '{"iteration": 2, "log_likelihood": -2.0}\n')
    out = tmp_path / "figures"
    said = run_cli("plot", tmp_path / "ra.json", "--data", tmp_path / "ra.jsonl", "--rows", 6, "--history",
                   tmp_path / "h.jsonl", "--out", out, "--html").stdout
    assert "wrote 3 figures" in said and "tables, responsibilities, history" in said
    for name in ("tables", "responsibilities", "history"):
        assert (out / f"{name}.png").read_bytes().startswith(PNG_SIGNATURE)
        assert ET.parse(out / f"{name}.svg").getroot().tag.endswith("svg")
    page = (out / "index.html").read_text()
    assert page.count("<figure") == 3 and page.count("<svg") == 3 and "<figcaption>" in page
    assert "first 6 rows" in page  # the caption says what was drawn
    run_cli("plot", tmp_path / "ca.json", "--data", tmp_path / "ca.jsonl", "--out", out)
    assert (out / "hop_posteriors.png").exists() and (out / "key_tables.svg").exists()


def test_plot_command_draws_the_assignment_tree_results(tmp_path):
    """`attnmix plot --assign-tree` on what `attnmix assign-tree` wrote: the scaling laws, and prediction 3's matching
    frequencies with the tree's 30 edges circled on the cells the results list; results without the matrix (written
    before it was recorded) still give the scaling figure; an edge outside the matrix is a data error."""
    results = tmp_path / "results.json"
    run_cli("assign-tree", "--out", results, "--threads", "1")
    doc = json.loads(results.read_text())
    out = tmp_path / "figures"
    said = run_cli("plot", "--assign-tree", results, "--out", out).stdout
    assert "wrote 2 figures" in said
    assert (out / "assign_tree_frequencies.png").read_bytes().startswith(PNG_SIGNATURE)
    freq = np.array(doc["prediction_3_frequencies"])
    tree = np.zeros(freq.shape, dtype=bool)
    for q, k in doc["prediction_3_tree_edges"]:
        tree[q, k] = True
    fig = plot.assignment_frequencies(freq, tree)
    circled = fig.axes[0].collections[0].get_offsets()
    assert sorted(map(tuple, np.asarray(circled)[:, ::-1].astype(int).tolist())) == sorted(
        map(tuple, doc["prediction_3_tree_edges"]))
    older = {k: v for k, v in doc.items() if not k.startswith("prediction_3_f") and k != "prediction_3_tree_edges"}
    results.write_text(json.dumps(older))
    assert "wrote 1 figure" in run_cli("plot", "--assign-tree", results, "--out", tmp_path / "older").stdout
    doc["prediction_3_tree_edges"][0] = [16, 0]
    results.write_text(json.dumps(doc))
    bad = subprocess.run([cli(), "plot", "--assign-tree", results, "--out", tmp_path / "bad"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "tree edge (16, 0) lies outside" in bad.stderr


@pytest.mark.parametrize("args, code, message", [
    ([], 1, "give a MODEL, --history or --assign-tree"),
    (["{ca}", "--data", "{ra_rows}"], 2, "line 1: missing field 'keys'"),
    (["{missing}"], 2, "cannot open the model file"),
    (["{ra}", "--rows", "0"], 1, "--rows must be positive"),
    (["--history", "{ra_rows}"], 2, "not a history of attnmix fit or lm train"),
])
def test_plot_command_errors_write_nothing(tmp_path, ra_fit, ca_model, args, code, message):
    model, rows = ra_fit
    files = {"ra": tmp_path / "ra.json", "ca": tmp_path / "ca.json", "ra_rows": tmp_path / "ra.jsonl",
             "missing": tmp_path / "missing.json"}
    attnmix.save_model(model, files["ra"])
    attnmix.save_model(ca_model, files["ca"])
    write_rows(files["ra_rows"], rows[:3], ("context", "query", "target"))
    out = tmp_path / "figures"
    result = subprocess.run([cli(), "plot", *[a.format(**files) for a in args], "--out", out], capture_output=True,
                            text=True)
    assert result.returncode == code and message in result.stderr
    assert not out.exists() or not any(out.iterdir())


def test_lm_history_draws_loss_in_bits_heldout_and_speed(tmp_path):
    path = tmp_path / "lm.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 2.0 * np.log(2) / s, "tokens_per_second": 100.0 * s,
                                        "elapsed_seconds": 0.1 * s, **({"heldout_bits_per_byte": 1.5} if s == 2 else {})})
                            + "\n" for s in (1, 2, 4))
                    + json.dumps({"step": 4, "heldout_bits_per_byte": 0.75}) + "\n")
    fig = plot.lm_history(path)
    loss, speed = fig.axes
    training, heldout = loss.get_lines()
    np.testing.assert_allclose(training.get_ydata(), [2.0, 1.0, 0.5])  # nats / ln 2 = bits
    np.testing.assert_array_equal(np.column_stack(heldout.get_data()), [[2, 1.5], [4, 0.75]])
    assert "last: 0.750" in heldout.get_label()
    assert list(speed.get_lines()[0].get_ydata()) == [100.0, 200.0, 400.0]
    with pytest.raises(ValueError, match="no training steps"):
        plot.lm_history([{"step": 1, "heldout_bits_per_byte": 1.0}])


def test_lm_train_history_through_the_program(tmp_path):
    """`attnmix lm train --history` writes one line per step with the losses the run trained on (every --eval-every
    steps with the held-out bits per byte, which the progress lines show too), then the held-out bits per byte the
    summary prints; `attnmix plot --history` draws it."""
    if "lm" not in subprocess.run([cli(), "--help"], capture_output=True, text=True).stdout:
        pytest.skip("this build has no attnmix lm")
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    history = tmp_path / "lm.jsonl"
    result = subprocess.run([cli(), "lm", "train", "--text", text, "--steps", "4", "--batch", "2", "--chunk", "16",
                             "--window", "8", "--d-model", "16", "--eval-every", "2", "--history", history],
                            capture_output=True, text=True)
    if result.returncode == 2 and "libtorch" in result.stderr:
        pytest.skip("this build has no libtorch")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in history.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 4]
    assert all(r["loss"] > 0 and r["tokens_per_second"] > 0 for r in records[:4])
    assert ["heldout_bits_per_byte" in r for r in records] == [False, True, False, False, True]
    (progress_line,) = [line for line in result.stderr.splitlines() if line.startswith("step 2/4")]
    assert f"held out {records[1]['heldout_bits_per_byte']:.4g} bits/byte" in progress_line
    (summary_line,) = [line for line in result.stdout.splitlines() if line.startswith("  held out ")]
    assert f"= {records[4]['heldout_bits_per_byte']:.4g} bits per byte" in summary_line
    run_cli("plot", "--history", history, "--out", tmp_path / "figures")
    assert (tmp_path / "figures" / "history.png").read_bytes().startswith(PNG_SIGNATURE)


def test_optimize_records_the_history_it_prints(ra_fit):
    """optimize(history=[...]) appends the lines of `attnmix fit --history`: the log-likelihoods it printed."""
    model, rows = ra_fit
    printed, history = io.StringIO(), []
    attnmix.optimize(rows, model.estimator(), max_its=4, delta=None, vdata=rows[:50], out=printed, history=history,
                     rng=np.random.RandomState(1))
    lines = printed.getvalue().splitlines()
    assert [h["iteration"] for h in history] == [1, 2, 3, 4] and len(lines) == 4
    for h, text in zip(history, lines):
        assert f"ln[p_mat(Data|Model)]={h['log_likelihood']:.6e}" in text and h["validation"] < 0
    assert history[0]["delta"] is None
    assert history[2]["delta"] == pytest.approx(history[2]["log_likelihood"] - history[1]["log_likelihood"])
    silent = []
    attnmix.optimize(rows, model.estimator(), max_its=4, delta=None, out=None, history=silent,
                     rng=np.random.RandomState(1))
    assert [h["log_likelihood"] for h in silent] == [h["log_likelihood"] for h in history]
    assert list(plot.fit_history(history).axes[0].get_lines()[0].get_ydata()) == [h["log_likelihood"] for h in history]
    with pytest.raises(TypeError, match="history must be None or a list"):
        attnmix.optimize(rows, model.estimator(), max_its=1, out=None, history=())


def test_demo_plots_every_section(tmp_path):
    """`attnmix demo --plots DIR` saves each EM section's model (and the rows it draws), the assignment tree's
    frequencies and the language model's training history, and plots them there."""
    out = run_cli("demo", "--plots", tmp_path).stdout
    assert "Figures (attnmix plot):" in out
    expected = {"responsibility": {"tables", "responsibilities"}, "chained": {"key_tables", "hop_posteriors"},
                "variational": {"embeddings"}, "assign_tree": {"assign_tree_frequencies"}}
    if (tmp_path / "language_model").exists():
        expected["language_model"] = {"history"}
    else:  # a build without libtorch, or a system without the demo's text
        assert "Skipped" in out
    for section, names in expected.items():
        folder = tmp_path / section
        assert {p.stem for p in folder.glob("*.png")} == names
        assert (folder / "index.html").read_text().count("<figure") == len(names)
        if section == "assign_tree":
            results = json.loads((folder / "results.json").read_text())
            assert len(results["prediction_3_tree_edges"]) == 30  # the demo prints "30 edges = 16 + 15 - 1"
            assert np.allclose(np.sum(results["prediction_3_frequencies"], axis=0), 1.0)
        elif section == "language_model":
            steps = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines()]
            assert [r["step"] for r in steps[:-1]] == list(range(1, len(steps)))
            assert f"{steps[-1]['heldout_bits_per_byte']:.2f}" in out  # the held-out figure the demo printed
        else:
            model = attnmix.load_model(folder / "model.json")
            if (folder / "rows.jsonl").exists():
                assert len((folder / "rows.jsonl").read_text().splitlines()) == 8
                assert type(model).__name__ != "VariationalEmbeddingAttentionDistribution"


def test_lm_history_of_moment_closure_follows_the_bank(tmp_path):
    """Moment closure's history carries, per step and layer, the live clusters (none before the first eviction, never
    more than --max-clusters, the last step's equal to the final state the summary reports), the bank mass (every
    evicted token counted once: a chunk of 16 per step once the window is full) and the far field's share of the
    step's attention (0 while the bank it attends to is empty, then a probability); the figure gains a panel for
    each."""
    if "lm" not in subprocess.run([cli(), "--help"], capture_output=True, text=True).stdout:
        pytest.skip("this build has no attnmix lm")
    history = tmp_path / "mc.jsonl"
    result = subprocess.run([cli(), "lm", "train", "--mechanism", "moment-closure", "--window", "16", "--chunk", "16",
                             "--max-clusters", "3", "--steps", "8", "--batch", "2", "--d-model", "16", "--holdout",
                             "0", "--history", history], capture_output=True, text=True)
    if result.returncode == 2 and "libtorch" in result.stderr:
        pytest.skip("this build has no libtorch")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in history.read_text().splitlines()]
    assert len(records) == 8 and all(len(r["clusters"]) == 2 for r in records)
    assert records[0]["clusters"] == [0.0, 0.0]  # the first chunk evicts nothing
    assert all(0 <= c <= 3 for r in records for c in r["clusters"])
    for layer, line in enumerate(l for l in result.stdout.splitlines() if l.strip().startswith("layer ")):
        count = float(line.split()[2])
        assert records[-1]["clusters"][layer] == pytest.approx(count)
    assert [r["bank_mass"] for r in records] == [[16.0 * s] * 2 for s in range(8)]
    assert records[0]["far_share"] == [0.0, 0.0] and records[1]["far_share"] == [0.0, 0.0]  # empty bank attended
    assert all(0.0 < f < 1.0 for r in records[2:] for f in r["far_share"])
    fig = plot.lm_history(history)
    assert [ax.get_title() for ax in fig.axes] == ["loss", "training speed", "far field: live clusters",
                                                   "far field: bank mass", "far field: share of attention"]
    for ax, key in zip(fig.axes[2:], ["clusters", "bank_mass", "far_share"]):
        assert [list(l.get_ydata()) for l in ax.get_lines()] == [[r[key][k] for r in records] for k in range(2)]
    assert fig.axes[4].get_ylim() == (0.0, 1.0)


def test_plot_command_without_matplotlib_says_what_to_install(tmp_path):
    """Where matplotlib cannot be imported, `attnmix plot` (this module under the program) exits with the data-error
    code and names the package to install, writing nothing."""
    history = tmp_path / "h.jsonl"
    history.write_text('{"iteration": 1, "log_likelihood": -3.0}\n')
    blocked = ("import runpy, sys; sys.modules['matplotlib'] = None; sys.argv = ['attnmix plot'] + sys.argv[1:]; "
               "runpy.run_module('attnmix._plot_command', run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", blocked, "--history", history, "--out", tmp_path / "figures"],
                            capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "needs matplotlib (Debian: apt install python3-matplotlib)" in result.stderr
    assert not (tmp_path / "figures").exists()
