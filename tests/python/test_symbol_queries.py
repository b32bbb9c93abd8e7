# SPDX-License-Identifier: Apache-2.0
"""Responsibility attention with symbol queries: a query id q stands for the one-hot row e_q, in Python (a 1-D integer
array, or an int per observation), in data files (a JSON Lines integer, an .npz integer array of shape (n,)) and in
`attnmix fit --text`. Each is checked against the same rows with the one-hot vectors written out."""
import json
import subprocess

import numpy as np
import pytest

import attnmix
from attnmix import ResponsibilityAttentionEstimator, load_model, optimize
from helpers import cli, run_cli

S, N, T = 12, 4, 9


def symbol_rows(rng, n, D=S):
    contexts = rng.integers(0, S, size=(n, N))
    queries = rng.integers(0, D, size=n)
    targets = rng.integers(0, T, size=n)
    return contexts, queries, targets


def one_hot(queries, D=S):
    out = np.zeros((len(queries), D))
    out[np.arange(len(queries)), queries] = 1.0
    return out


def random_model(rng, D=S):
    emission = rng.random((S, T)) + 0.05
    prior = rng.random(N) + 0.1
    return attnmix.ResponsibilityAttentionDistribution(
        key_means=rng.normal(size=(S, D)) * 0.5, emission=emission / emission.sum(1, keepdims=True),
        position_prior=prior / prior.sum(), sigma2=0.6)


def test_symbol_arrays_and_observations_give_the_one_hot_densities(rng):
    model = random_model(rng, D=15)
    contexts, queries, targets = symbol_rows(rng, 200, D=15)
    want = model.seq_log_density((contexts, one_hot(queries, 15), targets))
    np.testing.assert_allclose(model.seq_log_density((contexts, queries, targets)), want, rtol=1e-12, atol=1e-12)
    rows = [(c, int(q), int(t)) for c, q, t in zip(contexts, queries, targets)]
    np.testing.assert_allclose(model.seq_log_density(rows), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(model.responsibilities((contexts, queries, targets)),
                               model.responsibilities((contexts, one_hot(queries, 15), targets)), atol=1e-12)
    encoded = model.dist_to_encoder().seq_encode((contexts, queries, targets))
    assert encoded[1].shape == (200,) and encoded[1].dtype == np.int64
    np.testing.assert_array_equal(encoded[1], queries)
    with pytest.raises(ValueError, match="row 1 is an array but row 0's is a symbol id"):
        model.seq_log_density([(contexts[0], 3, 0), (contexts[1], one_hot([3], 15)[0], 0)])
    with pytest.raises(ValueError, match="query symbol"):
        model.dist_to_encoder().seq_encode((contexts, queries + 15, targets))


def test_python_fit_of_symbols_equals_the_one_hot_fit(rng):
    contexts, queries, targets = symbol_rows(rng, 1500)
    est = ResponsibilityAttentionEstimator(S, N, S, T, estimate_sigma2=True)
    symbols = optimize((contexts, queries, targets), est, max_its=8, rng=4, delta=None, out=None)
    dense = optimize((contexts, one_hot(queries), targets), est, max_its=8, rng=4, delta=None, out=None)
    for field in ("key_means", "emission", "position_prior"):
        np.testing.assert_allclose(getattr(symbols, field), getattr(dense, field), rtol=1e-10, atol=1e-10)
    assert symbols.sigma2 == pytest.approx(dense.sigma2, rel=1e-10)


def test_data_files_take_symbol_queries(rng, tmp_path):
    """A JSON Lines integer and an .npz (n,) integer array fit the model Python fits from the same symbols, bit for
    bit; D is 1 + the largest symbol, and the model scores them like the one-hot rows."""
    contexts, queries, targets = symbol_rows(rng, 600)
    queries[5] = S - 1  # D = S
    with open(tmp_path / "rows.jsonl", "w") as out:
        for c, q, t in zip(contexts, queries, targets):
            out.write(json.dumps({"context": c.tolist(), "query": int(q), "target": int(t)}) + "\n")
    np.savez(tmp_path / "rows.npz", context=contexts, query=queries.astype(np.int32), target=targets)
    flags = ("--max-its", 5, "--seed", 2, "--delta", "none", "--sigma2", 0.7)
    for name in ("rows.jsonl", "rows.npz"):
        run_cli("fit", "--data", tmp_path / name, "--out", tmp_path / (name + ".model.json"), *flags)
    est = ResponsibilityAttentionEstimator(S, N, S, T, sigma2=0.7)
    python = optimize((contexts, queries, targets), est, max_its=5, rng=2, delta=None, out=None)
    for name in ("rows.jsonl", "rows.npz"):
        fitted = load_model(tmp_path / (name + ".model.json"))
        assert fitted.query_dim == S
        for field in ("key_means", "emission", "position_prior"):
            np.testing.assert_array_equal(getattr(fitted, field), getattr(python, field))
    total = float(run_cli("score", "--model", tmp_path / "rows.jsonl.model.json", "--data",
                          tmp_path / "rows.npz").stdout.split("total=")[1].split()[0])
    dense = python.seq_log_density((contexts, one_hot(queries), targets)).sum()
    assert total == pytest.approx(dense, rel=1e-12)


def run_failing(*args):
    return subprocess.run([cli(), *map(str, args)], capture_output=True, text=True)


def test_bad_symbol_queries_in_data_files_name_line_and_field(tmp_path):
    rows = [{"context": [0, 1], "query": 2, "target": 0}, {"context": [1, 2], "query": [0.0, 1.0, 0.0], "target": 1}]
    (tmp_path / "mixed.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = run_failing("fit", "--data", tmp_path / "mixed.jsonl", "--out", tmp_path / "m.json")
    assert result.returncode == 2 and not (tmp_path / "m.json").exists()
    assert "mixed.jsonl: line 2: query: an array here but symbol ids from line 1 on" in result.stderr
    (tmp_path / "wide.jsonl").write_text(json.dumps({"context": [0, 1], "query": 5, "target": 0}) + "\n")
    result = run_failing("fit", "--data", tmp_path / "wide.jsonl", "--query-dim", 4, "--out", tmp_path / "m.json")
    assert result.returncode == 2 and "wide.jsonl: line 1: query" in result.stderr and "D = 4" in result.stderr
    (tmp_path / "text.jsonl").write_text(json.dumps({"context": [0, 1], "query": "a", "target": 0}) + "\n")
    result = run_failing("fit", "--data", tmp_path / "text.jsonl", "--out", tmp_path / "m.json")
    assert result.returncode == 2
    assert "text.jsonl: line 1: query: must be an array of numbers or one symbol id (got a string" in result.stderr


def test_text_fits_use_symbol_queries(tmp_path):
    """fit --text builds symbol queries: its model is the model of the one-hot rows of the same triples."""
    words = ("the cat sat on the mat and the dog sat on the log while the cat ran " * 6).split()
    (tmp_path / "corpus.txt").write_text(" ".join(words) + "\n")
    run_cli("fit", "--text", tmp_path / "corpus.txt", "--tokens", "words", "--context-length", 3, "--max-its", 6,
            "--seed", 1, "--delta", "none", "--out", tmp_path / "text.json")
    fitted = load_model(tmp_path / "text.json")
    vocabulary = sorted(set(words), key=words.index)  # first-seen order
    assert fitted.num_symbols == fitted.query_dim
    tokens = np.array([vocabulary.index(w) for w in words])
    triples = attnmix.sequence_to_triples(tokens, 3, num_symbols=fitted.num_symbols)
    contexts = np.array([c for c, _, _ in triples])
    dense = np.array([q for _, q, _ in triples])
    targets = np.array([t for _, _, t in triples])
    est = ResponsibilityAttentionEstimator(fitted.num_symbols, 3, fitted.query_dim, fitted.num_targets)
    model = optimize((contexts, dense, targets), est, max_its=6, rng=1, delta=None, out=None)
    np.testing.assert_allclose(fitted.key_means, model.key_means, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(fitted.emission, model.emission, rtol=1e-9, atol=1e-12)


def test_sequence_to_triples_gives_symbol_queries_on_request():
    """symbol_queries=True: the same triples with the token itself as the query, which scores like its one-hot row."""
    tokens = [3, 0, 1, 2, 0, 3, 3, 1]
    one_hot_triples = attnmix.sequence_to_triples(tokens, 3, num_symbols=4)
    symbol_triples = attnmix.sequence_to_triples(tokens, 3, num_symbols=4, symbol_queries=True)
    assert len(symbol_triples) == len(one_hot_triples) == len(tokens) - 3
    for (c1, q1, t1), (c2, q2, t2) in zip(one_hot_triples, symbol_triples):
        assert c1.tolist() == c2.tolist() and t1 == t2
        assert isinstance(q2, int) and q1.tolist() == np.eye(4)[q2].tolist()
    model = attnmix.ResponsibilityAttentionDistribution(np.random.default_rng(5).normal(size=(4, 4)),
                                                        np.full((4, 4), 0.25), sigma2=0.7,
                                                        position_prior=[0.2, 0.3, 0.5])
    np.testing.assert_allclose(model.seq_log_density(symbol_triples), model.seq_log_density(one_hot_triples),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="symbol_queries and embeddings exclude each other"):
        attnmix.sequence_to_triples(tokens, 3, embeddings=np.eye(4), symbol_queries=True)
    with pytest.raises(TypeError, match="symbol_queries"):
        attnmix.sequence_to_triples(tokens, 3, symbol_queries="yes")
