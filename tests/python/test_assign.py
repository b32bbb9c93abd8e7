# SPDX-License-Identifier: Apache-2.0
"""attnmix.assign (docs/mechanisms.md#assignment-tree-attention): the building blocks of assignment-tree attention
against scipy and against the seed's numpy code (as oracles), the strict argument rules, and the experiment's results
document."""
import math

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment as scipy_lsa

import attnmix
from attnmix import Rng
from attnmix.assign import (
    assignment_sample,
    assignment_tree,
    dense_attention,
    frequency_estimate,
    kruskal_tree,
    linear_sum_assignment,
    run_assignment_tree_experiment,
    sparse_attention,
    zero_frequency_tree_edges,
)

LAP_RTOL = 1e-9  # AT-1: optimal costs agree with scipy's to 1e-9 (both solvers are exact; only summation differs)
ORACLE_RTOL = 1e-12  # same formula as the seed's numpy code, different summation order

# The keys of results.json, in order (docs/mechanisms.md#assignment-tree-attention).
RESULT_KEYS = [
    "seed",
    "shape",
    "tau",
    "prediction_1_rmse_slope_predicted",
    "prediction_1_rmse_slope_observed",
    "prediction_1_rmse",
    "prediction_2_union_edges",
    "prediction_3_frequency_corr_alpha0",
    "prediction_3_frequency_corr_alpha1",
    "transport_max_row_marginal_error",
    "transport_max_key_marginal_error",
    "tree_edges_expected",
    "tree_edges_observed",
    "dense_retrieval_mse",
    "tree_sparse_retrieval_mse",
    "tree_edges_K16_mean",
    "raw_union_edges_K16_mean",
    "transport_max_key_marginal_error_expected",
    "prediction_3_tree_zero_frequency_edges",
    "retrieval_zero_frequency_tree_edges_total",
    "retrieval_repaired_query_rows_total",
    "retrieval_trials_with_repair",
    "prediction_3_frequencies",
    "prediction_3_tree_edges",
]


# ---- oracles: the seed's numpy code (seeds/004), verbatim in substance ---------------------------------------------


def seed_kruskal_tree(score):
    nq, nk = score.shape
    edges = [(float(score[i, j]), i, nq + j) for i in range(nq) for j in range(nk)]
    edges.sort(key=lambda x: (-x[0], x[1], x[2]))
    parent = list(range(nq + nk))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    chosen = []
    for _, u, v in edges:
        a, b = find(u), find(v)
        if a != b:
            parent[a] = b
            chosen.append((u, v - nq))
            if len(chosen) == nq + nk - 1:
                break
    tree = np.zeros_like(score, dtype=bool)
    for i, j in chosen:
        tree[i, j] = True
    return tree


def seed_sparse_attention(q, k, v, tree_freq, alpha=1.0, eps=1e-6):
    logits = q @ k.T / math.sqrt(q.shape[1])
    support = tree_freq > 0
    for i in range(len(q)):
        if not support[i].any():
            support[i, np.argmax(tree_freq[i])] = True
    with np.errstate(divide="ignore"):
        biased = logits + alpha * np.log(eps + tree_freq)
    biased[~support] = -np.inf
    z = biased - np.max(biased, axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return p @ v, p


def seed_dense_attention(q, k, v):
    logits = q @ k.T / math.sqrt(q.shape[1])
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    return p @ v, p


def is_spanning_tree(tree):
    nq, nk = tree.shape
    parent = list(range(nq + nk))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for i, j in zip(*np.nonzero(tree)):
        a, b = find(int(i)), find(nq + int(j))
        if a == b:
            return False  # a cycle
        parent[a] = b
    return len({find(x) for x in range(nq + nk)}) == 1


def random_cost(rng):
    """A random rectangular cost matrix of one of several kinds: continuous, heavily tied, wide-ranging."""
    nq, nk = (int(x) for x in rng.integers(1, 13, size=2))
    kind = rng.integers(4)
    if kind == 0:
        return rng.normal(size=(nq, nk))
    if kind == 1:
        return rng.integers(0, 4, size=(nq, nk)).astype(float)  # many ties
    if kind == 2:
        return np.exp(rng.normal(scale=4.0, size=(nq, nk)))  # costs spanning many orders of magnitude
    return rng.uniform(-100.0, 100.0, size=(nq, nk))


def small_problem(rng, n=15, d=8):
    q = rng.normal(size=(n + 1, d))
    k = rng.normal(size=(n, d))
    return q, k, ((q[:, None, :] - k[None, :, :]) ** 2).sum(axis=2)


# ---- linear_sum_assignment (AT-1) ------------------------------------------------------------------------------------


def check_assignment(cost, rows, cols):
    nq, nk = cost.shape
    assert rows.dtype == np.int64 and cols.dtype == np.int64
    assert rows.shape == cols.shape == (min(nq, nk),)
    assert np.all(np.diff(rows) > 0)  # sorted by row, distinct
    assert len(set(cols.tolist())) == len(cols)
    assert np.all((0 <= rows) & (rows < nq)) and np.all((0 <= cols) & (cols < nk))


def test_linear_sum_assignment_agrees_with_scipy(rng):
    """AT-1: 1000 random rectangular matrices (both orientations, ties, wide ranges; a quarter with forbidden +inf
    pairs): the optimal cost agrees with scipy's to 1e-9, and a problem scipy finds infeasible raises ValueError."""
    n_inf = n_infeasible = 0
    for trial in range(1000):
        cost = random_cost(rng)
        if trial % 4 == 3:
            cost[rng.random(cost.shape) < 0.3] = np.inf
            n_inf += 1
        try:
            ref_rows, ref_cols = scipy_lsa(cost)
        except ValueError:
            n_infeasible += 1
            with pytest.raises(ValueError):
                linear_sum_assignment(cost)
            continue
        rows, cols = linear_sum_assignment(cost)
        check_assignment(cost, rows, cols)
        ours, ref = cost[rows, cols].sum(), cost[ref_rows, ref_cols].sum()
        assert np.isfinite(ours)
        np.testing.assert_allclose(ours, ref, rtol=LAP_RTOL, atol=1e-12, err_msg=f"trial {trial}\n{cost}")
    assert n_inf == 250
    assert 0 < n_infeasible < 250  # both feasible and infeasible matrices with +inf entries were seen


def test_linear_sum_assignment_shapes_and_errors():
    cost = np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0], [1.0, 1.0, 1.0]])  # 4 x 3: one row unmatched
    rows, cols = linear_sum_assignment(cost)
    check_assignment(cost, rows, cols)
    assert cost[rows, cols].sum() == pytest.approx(cost[scipy_lsa(cost)].sum())
    rows_t, cols_t = linear_sum_assignment(cost.T)  # 3 x 4
    check_assignment(cost.T, rows_t, cols_t)
    assert cost.T[rows_t, cols_t].sum() == pytest.approx(cost[rows, cols].sum())
    # Nested lists, integer dtypes and non-contiguous arrays are accepted.
    assert [r.tolist() for r in linear_sum_assignment(cost.tolist())] == [rows.tolist(), cols.tolist()]
    big = np.asfortranarray(np.repeat(cost, 2, axis=1))[:, ::2]
    assert [r.tolist() for r in linear_sum_assignment(big)] == [rows.tolist(), cols.tolist()]
    linear_sum_assignment(np.arange(6, dtype=np.int32).reshape(2, 3))
    # Infeasible: both rows may use only column 0.
    with pytest.raises(ValueError):
        linear_sum_assignment([[1.0, np.inf], [2.0, np.inf]])
    for bad in (np.nan, -np.inf):
        with pytest.raises(ValueError):
            linear_sum_assignment([[1.0, bad], [2.0, 3.0]])
    with pytest.raises(TypeError):
        linear_sum_assignment(np.ones((2, 2), dtype=bool))
    with pytest.raises(ValueError):
        linear_sum_assignment(np.ones(3))  # not 2-D


# ---- sampling and frequencies (AT-3) ----------------------------------------------------------------------------------


def test_assignment_sample_pairs_and_streams(rng):
    _, _, cost = small_problem(rng)
    pairs = assignment_sample(cost, 1.7, Rng(3))
    assert isinstance(pairs, list) and len(pairs) == 15
    assert all(isinstance(p, tuple) and len(p) == 2 and all(type(x) is int for x in p) for p in pairs)
    assert sorted(j for _, j in pairs) == list(range(15))  # every key matched once
    assert [i for i, _ in pairs] == sorted({i for i, _ in pairs})
    assert assignment_sample(cost, 1.7, Rng(3)) == pairs  # a seed gives the same sample
    stream = Rng(3)
    first = assignment_sample(cost, 1.7, stream)
    assert first == pairs and assignment_sample(cost, 1.7, stream) != first  # the Rng advances in place
    # tau = 0: the unperturbed optimum.
    rows, cols = linear_sum_assignment(cost)
    assert assignment_sample(cost, 0.0, Rng(1)) == list(zip(rows.tolist(), cols.tolist()))
    for bad_tau in (-1.0, np.inf, np.nan):
        with pytest.raises(ValueError):
            assignment_sample(cost, bad_tau, Rng(1))
    with pytest.raises(TypeError):
        assignment_sample(cost, True, Rng(1))
    with pytest.raises(TypeError):
        assignment_sample(cost, 1.7, "seed")


def test_frequency_estimate_columns_sum_to_one(rng):
    """AT-3: every column of a frequency estimate with nq >= nk sums to 1 (exactly when K is a power of 2)."""
    _, _, cost = small_problem(rng)
    for K in (1, 16, 128):
        freq = frequency_estimate(cost, 1.7, K, Rng(K))
        assert freq.dtype == np.float64 and freq.shape == (16, 15)
        np.testing.assert_array_equal(freq.sum(axis=0), np.ones(15))
        np.testing.assert_array_equal(freq * K, np.round(freq * K))  # counts / K
        assert np.all(freq.sum(axis=1) <= 1.0 + 1e-12)
        assert freq.sum() == pytest.approx(15.0)
    freq = frequency_estimate(cost, 1.7, 100, Rng(5))
    np.testing.assert_allclose(freq.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(frequency_estimate(cost, 1.7, 100, Rng(5)), freq)  # deterministic
    wide = frequency_estimate(cost.T, 1.7, 32, Rng(2))  # nq < nk: every row sums to 1 instead
    np.testing.assert_array_equal(wide.sum(axis=1), np.ones(15))
    for bad_k in (0, -3):
        with pytest.raises(ValueError):
            frequency_estimate(cost, 1.7, bad_k, Rng(1))
    for bad_k in (2.0, True):
        with pytest.raises(TypeError):
            frequency_estimate(cost, 1.7, bad_k, Rng(1))


# ---- the tree (AT-2) --------------------------------------------------------------------------------------------------


def test_kruskal_tree_matches_the_seed_order(rng):
    """AT-2: nq + nk - 1 edges forming a spanning tree; ties broken in the order (-score, i, nq + j), as the seed."""
    for _ in range(200):
        nq, nk = (int(x) for x in rng.integers(1, 10, size=2))
        score = rng.integers(0, 3, size=(nq, nk)).astype(float) / 4 if rng.random() < 0.5 else rng.random((nq, nk))
        tree = kruskal_tree(score)
        assert tree.dtype == np.bool_ and tree.shape == (nq, nk)
        assert tree.sum() == nq + nk - 1
        assert is_spanning_tree(tree)
        np.testing.assert_array_equal(tree, seed_kruskal_tree(score))
    # All scores tied: query 0 takes every key, then every other query joins through key 0.
    tree = kruskal_tree(np.zeros((4, 3)))
    expected = np.zeros((4, 3), dtype=bool)
    expected[0, :] = True
    expected[:, 0] = True
    np.testing.assert_array_equal(tree, expected)
    with pytest.raises(ValueError):
        kruskal_tree([[0.5, np.nan]])


def test_assignment_tree_composes_the_blocks(rng):
    _, _, cost = small_problem(rng)
    tree_freq, tree, freq = assignment_tree(cost, 1.7, 128, Rng(777))
    np.testing.assert_array_equal(freq, frequency_estimate(cost, 1.7, 128, Rng(777)))
    np.testing.assert_array_equal(tree, kruskal_tree(freq))
    np.testing.assert_array_equal(tree_freq, freq * tree)
    assert tree.sum() == 30
    assert zero_frequency_tree_edges(tree, freq) == np.count_nonzero(tree & (freq == 0))


def test_zero_frequency_tree_edges_counts_and_rules():
    tree = np.array([[True, True, False], [False, True, True]])
    freq = np.array([[0.5, 0.0, 0.5], [0.0, 0.0, 1.0]])
    assert zero_frequency_tree_edges(tree, freq) == 2
    assert zero_frequency_tree_edges(tree.tolist(), freq) == 2  # nested Python bools
    with pytest.raises(TypeError):
        zero_frequency_tree_edges(tree.astype(int), freq)  # a mask must be bool
    with pytest.raises(ValueError):
        zero_frequency_tree_edges(tree.ravel(), freq)


# ---- attention ---------------------------------------------------------------------------------------------------------


def test_sparse_and_dense_attention_match_the_seed(rng):
    for trial in range(20):
        q, k, cost = small_problem(rng)
        v = rng.normal(size=(15, 3))
        tree_freq, _, _ = assignment_tree(cost, 1.7, 16, Rng(7000 + trial))
        for alpha in (0.0, 0.5, 1.0):
            out, p = sparse_attention(q, k, v, tree_freq, alpha=alpha)
            ref_out, ref_p = seed_sparse_attention(q, k, v, tree_freq, alpha=alpha)
            assert out.shape == (16, 3) and p.shape == (16, 15)
            np.testing.assert_allclose(p, ref_p, rtol=ORACLE_RTOL, atol=1e-15)
            np.testing.assert_allclose(out, ref_out, rtol=ORACLE_RTOL, atol=1e-14)
            np.testing.assert_array_equal(p > 0, (tree_freq > 0) | (ref_p > 0))
        out, p = dense_attention(q, k, v)
        ref_out, ref_p = seed_dense_attention(q, k, v)
        np.testing.assert_allclose(p, ref_p, rtol=ORACLE_RTOL, atol=1e-15)
        np.testing.assert_allclose(out, ref_out, rtol=ORACLE_RTOL, atol=1e-14)


def test_sparse_attention_reports_repaired_rows(rng):
    q, k, _ = small_problem(rng, n=3, d=2)
    v = rng.normal(size=(3, 2))
    tree_freq = np.array([[0.5, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.25, 0.75], [0.0, 0.0, 0.0]])
    result = sparse_attention(q, k, v, tree_freq)
    assert len(result) == 2
    out, p, report = sparse_attention(q, k, v, tree_freq, 1.0, 1e-6, return_report=True)
    assert report == {"repaired_rows": [1, 3]}
    np.testing.assert_array_equal(p[[1, 3]], [[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # column 0: the first maximum
    np.testing.assert_array_equal(out[1], v[0])
    np.testing.assert_array_equal(p[0], [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(result[1], p)
    assert sparse_attention(q, k, v, np.full((4, 3), 0.25), return_report=True)[2] == {"repaired_rows": []}
    with pytest.raises(TypeError):
        sparse_attention(q, k, v, tree_freq, 1.0, 1e-6, True)  # return_report is keyword-only
    with pytest.raises(TypeError):
        sparse_attention(q, k, v, tree_freq, return_report=1)
    with pytest.raises(ValueError):
        sparse_attention(q, k, v, tree_freq, eps=0.0)
    with pytest.raises(ValueError):
        sparse_attention(q, k, v, -tree_freq)
    with pytest.raises(ValueError):
        sparse_attention(q, k, v, tree_freq[:, :2])  # shape mismatch


# ---- the experiment (AT-4 … AT-9) ----------------------------------------------------------------------------------


def test_module_layout():
    assert attnmix.assign.linear_sum_assignment is linear_sum_assignment
    assert "assign" in attnmix.__all__
    assert sorted(attnmix.assign.__all__) == attnmix.assign.__all__
    assert all(callable(getattr(attnmix.assign, name)) for name in attnmix.assign.__all__)


def test_experiment_results_document():
    """AT-4 … AT-9 through Python: every key in the documented order, the predictions hold at the acceptance thresholds,
    and a second run with the same seed returns the same document. (About half a second per run in Release, so not
    marked slow.)"""
    result = run_assignment_tree_experiment()
    assert list(result) == RESULT_KEYS
    assert result["seed"] == 1234 and result["shape"] == [16, 15] and result["tau"] == 1.7
    assert list(result["prediction_1_rmse"]) == ["4", "8", "16", "32", "64", "128", "256", "512"]
    assert [list(u) for u in result["prediction_2_union_edges"]] == [["K", "observed", "predicted"]] * 8
    assert abs(result["prediction_1_rmse_slope_observed"] + 0.5) <= 0.06
    for u in result["prediction_2_union_edges"]:
        assert abs(u["observed"] - u["predicted"]) <= 0.05 * u["predicted"], u
    assert result["prediction_3_frequency_corr_alpha1"] > result["prediction_3_frequency_corr_alpha0"]
    n = 15
    assert result["transport_max_key_marginal_error"] == pytest.approx(1 / n - 1 / (n + 1), rel=0, abs=1e-12)
    assert result["transport_max_key_marginal_error_expected"] == pytest.approx(1 / n - 1 / (n + 1), abs=1e-15)
    assert 0 < result["transport_max_row_marginal_error"] <= 1 / (n + 1)
    assert result["tree_edges_expected"] == result["tree_edges_observed"] == 30
    assert result["tree_edges_K16_mean"] == 30.0
    for key in RESULT_KEYS[-6:-2]:
        assert type(result[key]) is int and result[key] >= 0
    # Prediction 3's matrices: every key matched once per sample (columns sum to 1), and a spanning tree of the 16 + 15
    # query and key nodes (30 edges joining all of them).
    freq = np.array(result["prediction_3_frequencies"])
    assert freq.shape == (16, 15) and np.allclose(freq.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    edges = result["prediction_3_tree_edges"]
    assert len(edges) == 30 and edges == sorted(edges)
    parent = list(range(31))
    def root(a):
        while parent[a] != a:
            a = parent[a]
        return a
    for q, k in edges:
        parent[root(q)] = root(16 + k)
    assert len({root(a) for a in range(31)}) == 1
    assert run_assignment_tree_experiment(1234) == result
    with pytest.raises(TypeError):
        run_assignment_tree_experiment(1.5)
