# SPDX-License-Identifier: Apache-2.0
"""Data of the acceptance rows, generated with numpy, small models for the unit tests, and the attnmix program."""
import os
import subprocess

import numpy as np
import pytest

import attnmix

S, N, D, T = 16, 6, 16, 16


def recall_task(n, rng, f=None, noise=0.3):
    """The recall task of docs/mechanisms.md#responsibility-attention: each context holds N distinct symbols of [S]; the
    attended position is uniform; query = one_hot(attended symbol) + noise * N(0, I); target = f(attended symbol) for a
    permutation f.

    Returns ((contexts (n, N) int64, queries (n, D) float64, targets (n,) int64), f).
    """
    if f is None:
        f = rng.permutation(S)
    contexts = np.argsort(rng.random((n, S)), axis=1)[:, :N]
    z = rng.integers(0, N, size=n)
    symbols = contexts[np.arange(n), z]
    queries = np.eye(S)[symbols] + noise * rng.standard_normal((n, D))
    return (contexts.astype(np.int64), queries, f[symbols].astype(np.int64)), f


def as_triples(data):
    """The reference's list of (context, query, target) triples."""
    contexts, queries, targets = data
    return [(c, y, int(t)) for c, y, t in zip(contexts, queries, targets)]


def markov_text(rng, vocabulary):
    """RA-12's Markov(1) text: a transition matrix with Dirichlet(1) rows and generate(length), a token list drawn
    from it (first token uniform)."""
    transition = rng.dirichlet(np.ones(vocabulary), size=vocabulary)

    def generate(length):
        tokens = [int(rng.integers(vocabulary))]
        for _ in range(length - 1):
            tokens.append(int(rng.choice(vocabulary, p=transition[tokens[-1]])))
        return tokens

    return transition, generate


def accuracy(proba, targets):
    return float(np.mean(np.argmax(proba, axis=1) == targets))


def random_model(rng, S=5, N=4, D=3, T=6, sigma2=0.7, name=None):
    """A random valid responsibility-attention model."""
    return attnmix.ResponsibilityAttentionDistribution(
        rng.standard_normal((S, D)),
        rng.dirichlet(np.ones(T), size=S),
        rng.dirichlet(np.ones(N)),
        sigma2,
        name=name,
    )


def model_data(model, n, seed):
    """n observations drawn from model, as the reference's list of triples."""
    return model.sampler(seed).sample(n)


def impossible_case():
    """The reference impossible case of docs/mechanisms.md#responsibility-attention and its observation."""
    model = attnmix.ResponsibilityAttentionDistribution(
        np.zeros((2, 1)), np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([0.0, 1.0])
    )
    return model, (np.array([0, 1]), np.array([0.0]), 1)


def cli():
    """The attnmix program ctest built (ATTNMIX_CLI); the test is skipped where it is not set."""
    path = os.environ.get("ATTNMIX_CLI")
    if not path:
        pytest.skip("ATTNMIX_CLI is not set (ctest sets it when the CLI is built)")
    assert os.path.exists(path), f"ATTNMIX_CLI={path} does not exist"
    return path


def run_cli(*args):
    """Runs the program; asserts it succeeded."""
    result = subprocess.run([cli(), *map(str, args)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result
