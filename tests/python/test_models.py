# SPDX-License-Identifier: Apache-2.0
"""Models between Python and the CLI (docs/model-format.md, F-7): JSON model files round-trip bit for bit and through
validation; a model fitted in Python scores identically in `attnmix score`, and `attnmix fit` with the same options
produces the same model as optimize()."""
import json
import os

import numpy as np
import pytest

import attnmix
from attnmix import MixtureDistribution, ResponsibilityAttentionEstimator, load_model, optimize, save_model
from helpers import D, N, S, T, random_model, recall_task, run_cli



def assert_same_params(a, b):
    for field in ("key_means", "emission", "position_prior"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert (a.sigma2, a.name) == (b.sigma2, b.name)


def test_model_files_round_trip_bit_for_bit(rng, tmp_path):
    """F-7: save -> load is bit-identical (17 significant digits) and goes through validation."""
    model = random_model(rng, name="head")
    path = tmp_path / "model.json"
    save_model(model, path)
    doc = json.loads(path.read_text())
    assert (doc["format"], doc["schema_version"], doc["family"], doc["name"]) == (
        "attnmix-model", 1, "responsibility_attention", "head")
    assert_same_params(load_model(path), model)
    mixture = MixtureDistribution([model, random_model(rng)], [0.3, 0.7], name="mix")
    save_model(mixture, str(tmp_path / "mixture.json"))
    loaded = load_model(tmp_path / "mixture.json")
    assert isinstance(loaded, MixtureDistribution) and loaded.name == "mix"
    np.testing.assert_array_equal(loaded.w, mixture.w)
    for a, b in zip(loaded.components, mixture.components):
        assert_same_params(a, b)
    doc["params"]["emission"][0][0] += 0.5  # no longer a row simplex: the loader validates
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="emission"):
        load_model(path)


def test_classical_leaves_and_composites_have_model_files(rng, tmp_path):
    """Categorical and diagonal Gaussian models, composites of them and mixtures of composites save and load bit for
    bit, as the Python classes they were."""
    from attnmix import CategoricalDistribution, CompositeDistribution, DiagonalGaussianDistribution

    def composite(name):
        p = rng.random(4) + 0.1
        return CompositeDistribution(
            [CategoricalDistribution(p / p.sum(), name="colour"),
             DiagonalGaussianDistribution(rng.normal(size=3) * 1e3, rng.random(3) + 1e-3)],
            name=name,
        )

    mixture = MixtureDistribution([composite("a"), composite("b")], [0.25, 0.75], name="both")
    save_model(mixture, tmp_path / "m.json")
    loaded = load_model(tmp_path / "m.json")
    assert isinstance(loaded, MixtureDistribution) and loaded.name == "both"
    for got, want in zip(loaded.components, mixture.components):
        assert isinstance(got, CompositeDistribution) and got.name == want.name
        cat, gauss = got.dists
        assert isinstance(cat, CategoricalDistribution) and cat.name == "colour"
        np.testing.assert_array_equal(cat.p, want.dists[0].p)
        assert isinstance(gauss, DiagonalGaussianDistribution)
        np.testing.assert_array_equal(gauss.mu, want.dists[1].mu)
        np.testing.assert_array_equal(gauss.sigma2, want.dists[1].sigma2)
    doc = json.loads((tmp_path / "m.json").read_text())
    assert [c["family"] for c in doc["params"]["components"][0]["params"]["components"]] == [
        "categorical", "diagonal_gaussian"]


def test_fixture_model_scores_like_the_cli():
    data_dir = os.environ.get("ATTNMIX_TEST_DATA_DIR")
    if not data_dir:
        pytest.skip("ATTNMIX_TEST_DATA_DIR is not set (ctest sets it)")
    model = load_model(os.path.join(data_dir, "ra_model.json"))
    with np.load(os.path.join(data_dir, "ra_small.npz")) as npz:
        data = (npz["context"], npz["query"], npz["target"])
    total = float(run_cli("score", "--model", os.path.join(data_dir, "ra_model.json"), "--data",
                          os.path.join(data_dir, "ra_small.npz")).stdout.split("total=")[1].split()[0])
    assert attnmix.inference.score(model, data) == total


def test_python_fit_scores_identically_in_the_cli(rng, tmp_path):
    data, _ = recall_task(3000, rng)
    model = optimize(data, ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.5), max_its=6, rng=3, out=None)
    model_path, data_path = tmp_path / "fit.json", tmp_path / "data.npz"
    save_model(model, model_path)
    np.savez(data_path, context=data[0], query=data[1], target=data[2])
    summary = run_cli("score", "--model", model_path, "--data", data_path).stdout
    total = float(summary.split("total=")[1].split()[0])
    assert attnmix.inference.score(model, data) == total  # the same double: same model, same summation order
    per_row = run_cli("score", "--model", model_path, "--data", data_path, "--per-row").stdout.split()
    np.testing.assert_array_equal(np.array(per_row, dtype=float), model.seq_log_density(data))


def test_cli_fit_equals_python_fit(rng, tmp_path):
    """`attnmix fit` and optimize() with the same options give the same model, bit for bit."""
    data, _ = recall_task(2500, rng)
    data_path, cli_model = tmp_path / "data.npz", tmp_path / "cli.json"
    np.savez(data_path, context=data[0].astype(np.int32), query=data[1], target=data[2])
    run_cli("fit", "--data", data_path, "--out", cli_model, "--symbols", S, "--targets", T, "--sigma2", 0.5,
            "--max-its", 7, "--seed", 11, "--init-p", 0.2, "--delta", "none")
    est = ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.5)
    model = optimize(data, est, max_its=7, rng=11, init_p=0.2, delta=None, out=None)
    assert_same_params(load_model(cli_model), model)


def test_text_models_are_saved_in_the_sparse_rows_layout(rng, tmp_path):
    """A model whose large tables are mostly their rows' defaults (a text model: zero keys, smoothed unseen targets)
    is saved as schema version 2 with sparse-rows tables, loads back bit for bit, and `attnmix score` reads it."""
    S, T = 90, 80
    key_means = np.zeros((S, S))
    counts = np.zeros((S, T))
    for s in range(S):
        key_means[s, rng.integers(0, S, 2)] = rng.normal(size=2)
        counts[s, rng.integers(0, T, 3)] += rng.exponential(size=3)
    emission = (counts + 1e-6) / (counts.sum(1, keepdims=True) + T * 1e-6)
    model = attnmix.ResponsibilityAttentionDistribution(key_means, emission, np.full(3, 1 / 3), sigma2=0.5)
    save_model(model, tmp_path / "text.json")
    doc = json.loads((tmp_path / "text.json").read_text())
    assert doc["schema_version"] == 2
    assert doc["params"]["key_means"]["layout"] == "sparse_rows"
    assert max(len(c) for c in doc["params"]["emission"]["columns"]) <= 3
    loaded = load_model(tmp_path / "text.json")
    np.testing.assert_array_equal(loaded.key_means, key_means)
    np.testing.assert_array_equal(loaded.emission, model.emission)
    rows = (rng.integers(0, S, (40, 3)), rng.integers(0, S, 40), rng.integers(0, T, 40))
    np.savez(tmp_path / "rows.npz", context=rows[0], query=rows[1], target=rows[2])
    total = float(run_cli("score", "--model", tmp_path / "text.json", "--data", tmp_path / "rows.npz")
                  .stdout.split("total=")[1].split()[0])
    assert total == attnmix.inference.score(model, rows)
