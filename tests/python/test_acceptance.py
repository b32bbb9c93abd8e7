# SPDX-License-Identifier: Apache-2.0
"""The fitting acceptance rows of docs/mechanisms.md#responsibility-attention through the Python API (label: slow):
RA-5, RA-6, RA-9, RA-12, each in both precisions of the E-step (docs/mixed_precision.md). Data are generated with numpy
as the acceptance tasks describe; the thresholds are those of the acceptance tasks."""
import numpy as np
import pytest

from attnmix import ResponsibilityAttentionDistribution, ResponsibilityAttentionEstimator, optimize, sequence_to_triples
from helpers import D, N, S, T, accuracy, as_triples, markov_text, recall_task

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("precision", ["float64", "mixed"])]


def recall_estimator(precision):
    return ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.5, precision=precision)


def test_em_recovers_addressing(rng, precision):
    """RA-5: 4000 train / 1500 test, max_its=40, seed 2: accuracy > 0.85; argmax_t B[s] = f(s) and
    argmax_d K[s] = s for every symbol. Training data as the reference's list of triples."""
    train, f = recall_task(4000, rng)
    test, _ = recall_task(1500, rng, f=f)
    model = optimize(as_triples(train), recall_estimator(precision), max_its=40, rng=2, out=None)
    acc = accuracy(model.predict_proba(test[0], test[1]), test[2])
    assert acc > 0.85, acc
    np.testing.assert_array_equal(np.argmax(model.emission, axis=1), f)
    np.testing.assert_array_equal(np.argmax(model.key_means, axis=1), np.arange(S))


def test_beats_position_only_baseline(rng, precision):
    """RA-6: 3000 / 2000, 30 iterations: accuracy > 0.85 and > 3x the position-only baseline
    argmax_t sum_i pi_i B[c_i, t]. Training data as numpy arrays (the fast path)."""
    train, f = recall_task(3000, rng)
    test, _ = recall_task(2000, rng, f=f)
    model = optimize(train, recall_estimator(precision), max_its=30, rng=3, out=None)
    acc = accuracy(model.predict_proba(test[0], test[1]), test[2])
    baseline = accuracy(np.einsum("i,nit->nt", model.position_prior, model.emission[test[0]]), test[2])
    assert acc > 0.85, acc
    assert acc > 3 * baseline, (acc, baseline)


def test_learns_sigma2(rng, precision):
    """RA-9: truth sigma2 = 0.7, keys 2 N(0, 1), B = I, 6000 samples, initial sigma2 1.0, 40 iterations:
    |sigma2 - 0.7| < 0.07."""
    truth = ResponsibilityAttentionDistribution(
        2.0 * rng.standard_normal((S, D)), np.eye(S), np.full(N, 1.0 / N), sigma2=0.7
    )
    data = truth.sampler(seed=int(rng.integers(2**31))).sample(6000)
    est = ResponsibilityAttentionEstimator(S, N, D, S, sigma2=1.0, estimate_sigma2=True, precision=precision)
    model = optimize(data, est, max_its=40, rng=4, out=None)
    assert abs(model.sigma2 - 0.7) < 0.07, model.sigma2


def test_markov_text_approaches_bigram_optimum(rng, precision):
    """RA-12: Markov(1) text, V = 8, N = 4, sigma2 = 0.3, 6000 training triples with one-hot queries: accuracy beats
    the unigram predictor by 0.03 and is within 0.04 of the bigram-optimal accuracy."""
    V, context = 8, 4
    transition, generate = markov_text(rng, V)
    train = sequence_to_triples(generate(6000 + context), context, num_symbols=V)
    test = sequence_to_triples(generate(4000 + context), context, num_symbols=V)
    assert len(train) == 6000
    est = ResponsibilityAttentionEstimator(V, context, V, V, sigma2=0.3, precision=precision)
    model = optimize(train, est, max_its=40, rng=5, out=None)
    contexts = np.array([c for c, _, _ in test])
    queries = np.array([q for _, q, _ in test])
    targets = np.array([t for _, _, t in test])
    acc = accuracy(model.predict_proba(contexts, queries), targets)
    unigram = np.bincount([t for _, _, t in train], minlength=V).argmax()
    unigram_acc = float(np.mean(targets == unigram))
    bigram_acc = float(np.mean(np.argmax(transition[contexts[:, -1]], axis=1) == targets))
    assert acc > unigram_acc + 0.03, (acc, unigram_acc)
    assert abs(acc - bigram_acc) < 0.04, (acc, bigram_acc)
