# SPDX-License-Identifier: Apache-2.0
"""The fitting acceptance rows of the variational families through the Python API (label: slow): VEA-2 and VEA-3
(in both precisions of the gate, docs/mixed_precision.md) and VMHA-1. Data are generated with numpy RandomState streams
(seeded from the test's rng fixture) as the acceptance tasks describe, with their thresholds. Each test prints what it
measured."""
import numpy as np
import pytest

from attnmix import (
    ResponsibilityAttentionEstimator,
    VariationalEmbeddingAttentionEstimator,
    VariationalMultiHopAttentionEstimator,
    optimize,
)

pytestmark = pytest.mark.slow

# The synonym task: C = 6 concepts x 2 synonyms; symbols 2c and 2c + 1 are concept c's synonyms.
C, S, N, D, T = 6, 12, 4, 8, 6


def random_state(rng):
    return np.random.RandomState(int(rng.integers(2**31)))


def synonym_task(n, rs, f_map, query_synonyms):
    """Each example draws N distinct concepts and a random synonym of each as the context; one of them (uniform
    position) is the queried concept, asked with a synonym drawn from query_synonyms; the target is f_map[concept].

    Returns (contexts (n, N), queries (n,), targets (n,)), all int64."""
    contexts = np.empty((n, N), dtype=np.int64)
    queries = np.empty(n, dtype=np.int64)
    targets = np.empty(n, dtype=np.int64)
    for r in range(n):
        concepts = rs.choice(C, size=N, replace=False)
        contexts[r] = 2 * concepts + rs.randint(0, 2, size=N)
        concept = concepts[rs.randint(N)]
        queries[r] = 2 * concept + query_synonyms[rs.randint(len(query_synonyms))]
        targets[r] = f_map[concept]
    return contexts, queries, targets


def vea_estimator(precision, seed=0):
    return VariationalEmbeddingAttentionEstimator(S, N, D, T, sigma2=0.5, lr=0.08, mc=5, seed=seed,
                                                  precision=precision)


both_precisions = pytest.mark.parametrize("precision", ["float64", "mixed"])


def accuracy(proba, targets):
    return float(np.mean(np.argmax(proba, axis=1) == targets))


@both_precisions
def test_tied_embeddings_transfer_to_held_out_synonyms(rng, precision):
    """VEA-2: train queries use synonym 0, test queries synonym 1; 1500 / 1000; 250 iterations, delta=None.
    Accuracy > 0.85; the nearest-neighbour embedding of > 0.8 of the symbols shares their concept; the untied
    one-hot responsibility-attention lookup (40 iterations) gets < 0.5, and the tied model beats it by > 0.3."""
    rs = random_state(rng)
    f_map = rs.permutation(C)
    train = synonym_task(1500, rs, f_map, [0])
    test = synonym_task(1000, rs, f_map, [1])
    model = optimize(train, vea_estimator(precision), max_its=250, delta=None, rng=rs, out=None)
    assert model.precision == precision
    acc = accuracy(model.predict_proba(test[0], test[1]), test[2])

    E = model.embeddings()
    distance = np.linalg.norm(E[:, None, :] - E[None, :, :], axis=2)
    np.fill_diagonal(distance, np.inf)
    agreement = float(np.mean(np.argmin(distance, axis=1) // 2 == np.arange(S) // 2))

    one_hot = np.eye(S)
    untied = ResponsibilityAttentionEstimator(num_symbols=S, context_length=N, query_dim=S, num_targets=T, sigma2=0.5)
    lookup = optimize((train[0], one_hot[train[1]], train[2]), untied, max_its=40, rng=rs, out=None)
    lookup_acc = accuracy(lookup.predict_proba(test[0], one_hot[test[1]]), test[2])
    print(f"VEA-2 ({precision}): tied accuracy {acc:.4f}, nearest-neighbour concept agreement {agreement:.4f}, "
          f"untied one-hot lookup accuracy {lookup_acc:.4f}")
    assert acc > 0.85, acc
    assert agreement > 0.8, agreement
    assert lookup_acc < 0.5, lookup_acc
    assert acc - lookup_acc > 0.3, (acc, lookup_acc)


@both_precisions
def test_monte_carlo_log_likelihood_rises(rng, precision):
    """VEA-3: 1200 rows (queries use either synonym), estimator seed 1, seq_initialize then 60 manual
    seq_update / estimate iterations: the mean of the last 10 E-step ll values exceeds the mean of the first 10 by
    more than 100."""
    rs = random_state(rng)
    data = synonym_task(1200, rs, rs.permutation(C), [0, 1])
    est = vea_estimator(precision, seed=1)
    enc = est.accumulator_factory().make().acc_to_encoder().seq_encode(data)
    acc = est.accumulator_factory().make()
    acc.seq_initialize(enc, np.ones(enc.n_rows), rs)
    model = est.estimate(float(enc.n_rows), acc.value())
    lls = []
    for _ in range(60):
        acc = est.accumulator_factory().make()
        acc.seq_update(enc, np.ones(enc.n_rows), model)
        lls.append(acc.value()[4])
        model = est.estimate(None, acc.value())
    assert model.optimizer_state.iteration == 60
    first, last = float(np.mean(lls[:10])), float(np.mean(lls[-10:]))
    print(f"VEA-3 ({precision}): mean ll of the first 10 iterations {first:.2f}, of the last 10 {last:.2f}")
    assert last > first + 100, (first, last)


def transitive_task(n, rs, M=3, symbols=18):
    """The two-hop task (the transitive-lookup construction with S = 18, Mr = 3): distinct a, b, c and a permutation pi
    per row; keys = [a, b_pi], values = [b, c], query a_i, target c_j where b_pi(j) = b_i."""
    keys = np.empty((n, 2 * M), dtype=np.int64)
    values = np.empty((n, 2 * M), dtype=np.int64)
    queries = np.empty(n, dtype=np.int64)
    targets = np.empty(n, dtype=np.int64)
    for r in range(n):
        drawn = rs.permutation(symbols)[: 3 * M]
        a, b, c = drawn[:M], drawn[M : 2 * M], drawn[2 * M :]
        pi = rs.permutation(M)
        keys[r] = np.concatenate([a, b[pi]])
        values[r] = np.concatenate([b, c])
        i = rs.randint(M)
        j = int(np.flatnonzero(pi == i)[0])
        assert keys[r, M + j] == b[i]
        queries[r], targets[r] = a[i], c[j]
    return keys, values, queries, targets


def test_two_hop_variational_attention_learns_transitive_lookup(rng):
    """VMHA-1: S = 18, Mr = 3, N = 6, D = 8; sigma2 0.3, lr 0.07, prior_strength 0.05, mc 2, anneal 80; 800 / 600;
    140 iterations, delta=None: accuracy > 0.7 and the mean of the full pairwise distance matrix of the embedding
    means > 2.0."""
    rs = random_state(rng)
    train, test = transitive_task(800, rs), transitive_task(600, rs)
    est = VariationalMultiHopAttentionEstimator(18, 8, 18, sigma2=0.3, lr=0.07, prior_strength=0.05, mc=2,
                                                anneal_iters=80)
    model = optimize(train, est, max_its=140, delta=None, rng=rs, out=None)
    acc = accuracy(model.predict_proba(test[0], test[1], test[2]), test[3])
    m = model.mean
    spread = float(np.mean(np.linalg.norm(m[:, None, :] - m[None, :, :], axis=2)))
    print(f"VMHA-1: accuracy {acc:.4f}, mean pairwise embedding distance {spread:.3f}")
    assert acc > 0.7, acc
    assert spread > 2.0, spread
