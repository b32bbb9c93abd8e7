# SPDX-License-Identifier: Apache-2.0
"""Responsibility attention with sparse tables through the program and in Python: `attnmix fit --family ra-sparse
--text` fits the model the dense family fits (the same scores on training and held-out text, the same tables once
expanded), its model file lists only the pairs the text holds, score and predict read it, and Python loads it as a
SparseResponsibilityAttentionDistribution. The Python classes fit what the dense classes fit on the same symbol rows,
the program's fit bit for bit, and refuse bad tables and missing rows by name. `attnmix predict` works through the
rows in blocks, so a vocabulary-sized predictive distribution never exists for all rows at once."""
import json
import pickle

import numpy as np
import pytest

import attnmix
from attnmix import (ResponsibilityAttentionEstimator, SparseResponsibilityAttentionAccumulator,
                     SparseResponsibilityAttentionDistribution, SparseResponsibilityAttentionEstimator, load_model,
                     optimize, save_model)
from helpers import run_cli

TEXT = ("in the beginning was the word and the word was with the light and the light shone in the dark "
        "and the dark did not hold the light for the word was the light of the world ") * 3
HELD_OUT = "the word was in the world and the world was dark and the light was the word "


def total_of(stdout):
    return float(stdout.split("total=")[1].split()[0])


def dense_table(table):
    """A model file's table (rows, or the sparse-rows layout) as an array."""
    if isinstance(table, list):
        return np.array(table)
    out = np.repeat(np.array(table["default"])[:, None], table["shape"][1], axis=1)
    for r, (columns, values) in enumerate(zip(table["columns"], table["values"])):
        out[r, columns] = values
    return out


@pytest.fixture
def fits(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    (tmp_path / "held_out.txt").write_text(HELD_OUT)
    for family in ("ra", "ra-sparse"):
        run_cli("fit", "--family", family, "--text", corpus, "--tokens", "words", "--context-length", 3,
                "--max-its", 8, "--seed", 4, "--estimate-sigma2", "--out", tmp_path / f"{family}.json")
    return tmp_path


def test_sparse_fit_is_the_dense_fit(fits):
    dense = json.loads((fits / "ra.json").read_text())["params"]
    sparse = json.loads((fits / "ra-sparse.json").read_text())
    assert sparse["family"] == "sparse_responsibility_attention"
    params = sparse["params"]
    for name in ("key_means", "emission"):
        assert params[name]["layout"] == "sparse_rows"
        np.testing.assert_allclose(dense_table(params[name]), dense_table(dense[name]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(params["position_prior"], dense["position_prior"], rtol=1e-10)
    assert params["sigma2"] == pytest.approx(dense["sigma2"], rel=1e-10)
    # The key table lists the (context word, current word) pairs of the rows, far fewer than S x S.
    words = TEXT.split()
    ids = {w: k for k, w in enumerate(dict.fromkeys(words))}
    tokens = [ids[w] for w in words]
    pairs = {(s, tokens[p]) for p in range(2, len(tokens) - 1) for s in tokens[p - 2:p + 1]}
    assert sum(len(c) for c in params["key_means"]["columns"]) == len(pairs) < len(ids) ** 2


def test_score_and_predict_read_the_sparse_model(fits):
    for text in ("corpus.txt", "held_out.txt"):
        dense = run_cli("score", "--model", fits / "ra.json", "--text", fits / text).stdout
        sparse = run_cli("score", "--model", fits / "ra-sparse.json", "--text", fits / text).stdout
        assert total_of(sparse) == pytest.approx(total_of(dense), rel=1e-10)
    dense = np.loadtxt(run_cli("predict", "--model", fits / "ra.json", "--text", fits / "held_out.txt",
                               "--proba").stdout.splitlines())
    sparse = np.loadtxt(run_cli("predict", "--model", fits / "ra-sparse.json", "--text", fits / "held_out.txt",
                                "--proba").stdout.splitlines())
    np.testing.assert_allclose(sparse, dense, rtol=1e-9, atol=1e-12)


def test_python_loads_the_programs_sparse_model(fits, tmp_path):
    sparse = load_model(fits / "ra-sparse.json")
    dense = load_model(fits / "ra.json")
    assert isinstance(sparse, SparseResponsibilityAttentionDistribution)
    expanded = sparse.dense()
    assert isinstance(expanded, attnmix.ResponsibilityAttentionDistribution)
    for field in ("key_means", "emission", "position_prior"):
        np.testing.assert_allclose(getattr(expanded, field), getattr(dense, field), rtol=1e-10, atol=1e-12)
    save_model(sparse, tmp_path / "again.json")  # Python writes the file the program wrote
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads((fits / "ra-sparse.json").read_text())


S, N, T = 30, 3, 25


def symbol_rows(rng, n):
    contexts = rng.integers(0, S, size=(n, N))
    queries = rng.integers(0, S, size=n)
    targets = (contexts[:, 1] * 7 + queries) % T
    noisy = rng.random(n) < 0.2
    targets[noisy] = rng.integers(0, T, size=int(noisy.sum()))
    return contexts, queries, targets


def one_hot(queries):
    out = np.zeros((len(queries), S))
    out[np.arange(len(queries)), queries] = 1.0
    return out


def test_python_sparse_fit_is_the_dense_fit():
    """EM with sparse tables and EM with dense tables over the one-hot rows give the same model (the same
    initial responsibilities for the same rng), and the sparse model scores, predicts and attends as its expansion."""
    rng = np.random.default_rng(11)
    contexts, queries, targets = symbol_rows(rng, 800)
    rows = (contexts, queries, targets)
    options = dict(estimate_sigma2=True, emission_smoothing=1e-3)
    sparse = optimize(rows, SparseResponsibilityAttentionEstimator(S, N, S, T, rows=rows, **options), max_its=10,
                      rng=3, delta=None, out=None)
    dense = optimize((contexts, one_hot(queries), targets), ResponsibilityAttentionEstimator(S, N, S, T, **options),
                     max_its=10, rng=3, delta=None, out=None)
    expanded = sparse.dense()
    for field in ("key_means", "emission", "position_prior"):
        np.testing.assert_allclose(getattr(expanded, field), getattr(dense, field), rtol=1e-10, atol=1e-12)
    assert sparse.sigma2 == pytest.approx(dense.sigma2, rel=1e-10)
    held_out = symbol_rows(np.random.default_rng(12), 200)
    np.testing.assert_allclose(sparse.seq_log_density(held_out),
                               dense.seq_log_density((held_out[0], one_hot(held_out[1]), held_out[2])), rtol=1e-10)
    np.testing.assert_allclose(sparse.predict_proba(held_out[0], held_out[1]),
                               dense.predict_proba(held_out[0], one_hot(held_out[1])), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(sparse.predict_proba(held_out[0][0], int(held_out[1][0])),
                               dense.predict_proba(held_out[0][0], one_hot(held_out[1][:1])[0]), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(sparse.responsibilities(rows), dense.responsibilities((contexts, one_hot(queries),
                                                                                      targets)), atol=1e-10)


def test_the_tables_hold_the_pairs_of_the_rows():
    rng = np.random.default_rng(13)
    contexts, queries, targets = symbol_rows(rng, 300)
    rows = (contexts, queries, targets)
    model = optimize(rows, SparseResponsibilityAttentionEstimator(S, N, S, T, rows=rows), max_its=3, rng=1,
                     out=None)
    keys, emission = model.key_means, model.emission
    assert keys["shape"] == (S, S) and emission["shape"] == (S, T)
    key_pairs = {(c, q) for row, q in zip(contexts, queries) for c in row}
    listed = {(s, c) for s in range(S) for c in keys["columns"][keys["row_begin"][s]:keys["row_begin"][s + 1]]}
    assert listed == key_pairs
    emission_pairs = {(c, t) for row, t in zip(contexts, targets) for c in row}
    assert len(emission["columns"]) == len(emission["values"]) == len(emission_pairs)
    assert not keys["default"].any()
    row_sums = np.add.reduceat(emission["values"], emission["row_begin"][:-1]) if len(emission["values"]) else 0
    listed_per_row = np.diff(emission["row_begin"])
    np.testing.assert_allclose(row_sums + (T - listed_per_row) * emission["default"], 1.0, rtol=1e-12)
    # The same rows through the statistics classes: one number per listed cell.
    acc = SparseResponsibilityAttentionAccumulator(S, N, S, T, rows=rows)
    assert acc.key_sum.shape == (len(key_pairs),) and acc.emission_count.shape == (len(emission_pairs),)
    # Pickling and the constructor take the tables back.
    again = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(again.seq_log_density(rows), model.seq_log_density(rows))
    rebuilt = SparseResponsibilityAttentionDistribution(keys, emission, model.position_prior, sigma2=model.sigma2)
    np.testing.assert_array_equal(rebuilt.seq_log_density(rows), model.seq_log_density(rows))


def test_python_fit_equals_the_programs_fit(tmp_path):
    rng = np.random.default_rng(14)
    contexts, queries, targets = symbol_rows(rng, 500)
    queries[0], targets[0], contexts[0, 0] = S - 1, T - 1, S - 1  # every size reached in the file
    with open(tmp_path / "rows.jsonl", "w") as out:
        for c, q, t in zip(contexts, queries, targets):
            out.write(json.dumps({"context": c.tolist(), "query": int(q), "target": int(t)}) + "\n")
    run_cli("fit", "--family", "ra-sparse", "--data", tmp_path / "rows.jsonl", "--max-its", 5, "--seed", 2,
            "--delta", "none", "--sigma2", 0.7, "--out", tmp_path / "m.json")
    rows = (contexts, queries, targets)
    python = optimize(rows, SparseResponsibilityAttentionEstimator(S, N, S, T, rows=rows, sigma2=0.7), max_its=5,
                      rng=2, delta=None, out=None)
    program = load_model(tmp_path / "m.json")
    for table in ("key_means", "emission"):
        for entry in ("row_begin", "columns", "values", "default"):
            np.testing.assert_array_equal(getattr(program, table)[entry], getattr(python, table)[entry])
    np.testing.assert_array_equal(program.position_prior, python.position_prior)


def test_bad_tables_and_missing_rows_are_named():
    rows = [([0, 1], 2, 1), ([1, 1], 0, 0)]
    with pytest.raises(TypeError, match="missing required argument 'rows'"):
        SparseResponsibilityAttentionEstimator(3, 2, 3, 2)
    with pytest.raises(ValueError, match="out-of-range ID in query symbol"):
        SparseResponsibilityAttentionEstimator(3, 2, 3, 2, rows=[([0, 1], 5, 1)])
    model = optimize(rows, SparseResponsibilityAttentionEstimator(3, 2, 3, 2, rows=rows), max_its=2, rng=1,
                     out=None)
    keys, emission = model.key_means, model.emission
    with pytest.raises(ValueError, match="key_means has no 'columns' entry"):
        SparseResponsibilityAttentionDistribution({k: v for k, v in keys.items() if k != "columns"}, emission,
                                                  model.position_prior)
    with pytest.raises(ValueError, match=r"key_means\['default'\] must be 0 in every row"):
        SparseResponsibilityAttentionDistribution(dict(keys, default=np.ones(3)), emission, model.position_prior)
    with pytest.raises(ValueError, match="columns of row"):
        SparseResponsibilityAttentionDistribution(dict(keys, columns=keys["columns"] + 3), emission,
                                                  model.position_prior)
    with pytest.raises(ValueError, match=r"emission\['values'\] has 1 entries"):
        SparseResponsibilityAttentionDistribution(keys, dict(emission, values=emission["values"][:1]),
                                                  model.position_prior)
    with pytest.raises(TypeError, match="emission must be a dict of compressed rows"):
        SparseResponsibilityAttentionDistribution(keys, model.dense().emission, model.position_prior)
    with pytest.raises(ValueError, match="unknown entry 'shapes'"):
        SparseResponsibilityAttentionDistribution(dict(keys, shapes=(3, 3)), emission, model.position_prior)
    # Rows whose pairs the estimator's rows do not hold are refused by name.
    with pytest.raises(ValueError, match="pair"):
        optimize([([2, 2], 1, 1)], SparseResponsibilityAttentionEstimator(3, 2, 3, 2, rows=rows), max_its=1, rng=1,
                 out=None)


def test_predict_goes_through_rows_in_blocks_with_the_models_probabilities(tmp_path):
    """`attnmix predict` computes at most 2^22 probabilities at a time (a text model over tens of thousands of words
    predicts any number of rows in bounded memory): with T = 5000 targets, 2 000 rows take four blocks (one row, then
    838 at a time), and every row's distribution, argmax and the accuracy are those of the model's predict_proba over
    all rows at once."""
    rng = np.random.default_rng(3)
    n, T = 2000, 5000
    contexts = rng.integers(0, 3, size=(n, 2))
    queries = rng.normal(size=(n, 2))
    targets = rng.integers(0, 40, size=n)
    with open(tmp_path / "rows.jsonl", "w") as f:
        for c, q, t in zip(contexts, queries, targets):
            f.write(json.dumps({"context": c.tolist(), "query": q.tolist(), "target": int(t)}) + "\n")
    run_cli("fit", "--data", tmp_path / "rows.jsonl", "--targets", T, "--max-its", 2, "--out", tmp_path / "m.json")
    model = load_model(tmp_path / "m.json")
    expected = model.predict_proba(contexts, queries)
    assert expected.shape == (n, T)
    proba = run_cli("predict", "--model", tmp_path / "m.json", "--data", tmp_path / "rows.jsonl", "--proba")
    got = np.array([[float(x) for x in line.split()] for line in proba.stdout.splitlines()])
    np.testing.assert_array_equal(got, expected)
    argmax = run_cli("predict", "--model", tmp_path / "m.json", "--data", tmp_path / "rows.jsonl")
    best = [int(line.split("\t")[0]) for line in argmax.stdout.splitlines()]
    assert best == expected.argmax(axis=1).tolist()
    correct = int((expected.argmax(axis=1) == targets).sum())
    assert f"({correct}/{n} rows)" in argmax.stderr


def test_a_key_table_without_pairs_is_the_zero_key_table():
    keys = {"shape": (2, 3), "row_begin": [0, 0, 0], "columns": [], "values": []}
    emission = {"shape": (2, 2), "row_begin": [0, 1, 1], "columns": [1], "values": [0.75], "default": [0.25, 0.5]}
    model = SparseResponsibilityAttentionDistribution(keys, emission, [0.5, 0.5], sigma2=2.0)
    dense = model.dense()
    assert not dense.key_means.any() and dense.emission.tolist() == [[0.25, 0.75], [0.5, 0.5]]
    rows = (np.array([[0, 1], [1, 1]]), np.array([2, 0]), np.array([1, 0]))
    np.testing.assert_allclose(model.seq_log_density(rows),
                               dense.seq_log_density((rows[0], np.eye(3)[rows[1]], rows[2])), rtol=1e-14)
