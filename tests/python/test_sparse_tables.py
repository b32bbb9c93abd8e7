# SPDX-License-Identifier: Apache-2.0
"""Responsibility attention with sparse tables through the program: `attnmix fit --family ra-sparse --text` fits the
model the dense family fits (the same scores on training and held-out text, the same tables once expanded), its
model file lists only the pairs the text holds, score and predict read it, and Python refuses to load it with a
clear TypeError instead of a model it has no class for. `attnmix predict` works through the rows in blocks, so a
vocabulary-sized predictive distribution never exists for all rows at once."""
import json

import numpy as np
import pytest

import attnmix
from attnmix import load_model
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


def test_python_refuses_the_model_with_a_clear_error(fits):
    with pytest.raises(TypeError, match="sparse_responsibility_attention models have no Python class yet"):
        load_model(fits / "ra-sparse.json")
    assert isinstance(load_model(fits / "ra.json"), attnmix.ResponsibilityAttentionDistribution)


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
