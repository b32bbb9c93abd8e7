# SPDX-License-Identifier: Apache-2.0
"""Chained attention through the Python API (docs/mechanisms.md#chained-attention): the unit acceptance rows (CA-1,
CA-2, CA-5, CA-6, a short CA-4 fit) and the shared contract (C-1..C-4, C-6, C-7, F-5, F-7) for CA, against numpy oracles
written here from the generative story (not from the library's forward-backward)."""
import io
import itertools
import json
import math
import pickle
from copy import deepcopy

import numpy as np
import pytest

import attnmix
from attnmix import (
    CategoricalDistribution,
    CategoricalEstimator,
    ChainedAttentionAccumulator,
    ChainedAttentionAccumulatorFactory,
    ChainedAttentionDataEncoder,
    ChainedAttentionDistribution,
    ChainedAttentionEstimator,
    ChainedAttentionSampler,
    CompositeDistribution,
    CompositeEstimator,
    ImpossibleEvidenceError,
    MixtureDistribution,
    MixtureEstimator,
    load_model,
    optimize,
    save_model,
)

QUADRUPLES = "^chained attention observations must be keys/values/query/target tuples$"


# ---- oracles and data -------------------------------------------------------------------------------------------


def random_model(rng, L=2, S=5, T=4, sigma2=0.3, name=None):
    """A random valid chained-attention model."""
    return ChainedAttentionDistribution(
        rng.standard_normal((L, S, S)), rng.dirichlet(np.ones(T), size=S), sigma2=sigma2, name=name
    )


def gate(K, u, keys, sigma2):
    """g(u, K)_j = softmax_j(-||e_u - K[k_j]||^2 / (2 sigma2)), from the squared distance itself."""
    e_u = np.eye(K.shape[0])[u]
    logits = -np.sum((e_u - K[keys]) ** 2, axis=1) / (2 * sigma2)
    p = np.exp(logits - logits.max())
    return p / p.sum()


def path_probabilities(model, keys, values, q):
    """p(z_0 .. z_{L-1}) for every path of N^L positions: z_0 ~ g(q, K0), z_l | z_{l-1} = i ~ g(v_i, K_l).

    Returns (paths, probabilities)."""
    K, s2 = model.key_tables, model.sigma2
    L, N = model.n_hops, len(keys)
    paths = list(itertools.product(range(N), repeat=L))
    probs = []
    for path in paths:
        p = gate(K[0], q, keys, s2)[path[0]]
        for hop in range(1, L):
            p *= gate(K[hop], values[path[hop - 1]], keys, s2)[path[hop]]
        probs.append(p)
    return paths, np.array(probs)


def brute_force_log_density(model, keys, values, q, t):
    """log sum over all N^L paths of p(path) B[v_{z_{L-1}}, t]."""
    paths, probs = path_probabilities(model, keys, values, q)
    f = np.array([model.emission[values[path[-1]], t] for path in paths])
    return math.log(np.sum(probs * f))


def brute_force_statistics(model, rows, weights):
    """The E-step statistics of docs/mechanisms.md#chained-attention for L = 2 from the exact path posterior P(i, j)."""
    L, S, T = model.n_hops, model.num_symbols, model.num_targets
    assert L == 2
    key_num, key_mass = np.zeros((L, S, S)), np.zeros((L, S))
    emission_count, ll, n = np.zeros((S, T)), 0.0, 0.0
    for (keys, values, q, t), w in zip(rows, weights):
        N = len(keys)
        paths, probs = path_probabilities(model, keys, values, q)
        joint = np.array([p * model.emission[values[j], t] for (i, j), p in zip(paths, probs)]).reshape(N, N)
        p = joint.sum()
        post = joint / p  # xi_0(i, j)
        gamma0, gamma1 = post.sum(axis=1), post.sum(axis=0)
        for i in range(N):
            key_num[0, keys[i], q] += w * gamma0[i]
            key_mass[0, keys[i]] += w * gamma0[i]
            for j in range(N):
                key_num[1, keys[j], values[i]] += w * post[i, j]
            key_mass[1, keys[i]] += w * gamma1[i]
            emission_count[values[i], t] += w * gamma1[i]
        ll += w * math.log(p)
        n += w
    return key_num, key_mass, emission_count, ll, n


def transitive_task(n, rng, S=30, M=5):
    """The task of docs/mechanisms.md#chained-attention: distinct a, b, c of [S] and a permutation pi per row;
    keys = [a, b_pi], values = [b, c], query = a_i, target = c_j where b_pi(j) = b_i.

    Returns (keys (n, 2M), values (n, 2M), query (n,), target (n,)), all int64."""
    rows = np.arange(n)
    symbols = np.argsort(rng.random((n, S)), axis=1)[:, : 3 * M]
    a, b, c = symbols[:, :M], symbols[:, M : 2 * M], symbols[:, 2 * M :]
    pi = np.argsort(rng.random((n, M)), axis=1)
    keys = np.concatenate([a, b[rows[:, None], pi]], axis=1)
    values = np.concatenate([b, c], axis=1)
    i = rng.integers(0, M, size=n)
    j = np.argsort(pi, axis=1)[rows, i]  # pi(j) = i
    assert np.all(keys[rows, M + j] == b[rows, i])
    return keys.astype(np.int64), values.astype(np.int64), a[rows, i].astype(np.int64), c[rows, j].astype(np.int64)


def accuracy(model, data):
    keys, values, query, target = data
    return float(np.mean(np.argmax(model.predict_proba(keys, values, query), axis=1) == target))


def impossible_case():
    """The reference impossible case of docs/mechanisms.md#chained-attention: B = [[1, 0], [1, 0]], (keys=[0,1],
    vals=[0,1], q=0, t=1)."""
    model = ChainedAttentionDistribution(np.zeros((2, 2, 2)), np.array([[1.0, 0.0], [1.0, 0.0]]))
    return model, (np.array([0, 1]), np.array([0, 1]), 0, 1)


def fresh_accumulator(model):
    return model.estimator().accumulator_factory().make()


def assert_same_params(a, b):
    np.testing.assert_array_equal(a.key_tables, b.key_tables)
    np.testing.assert_array_equal(a.emission, b.emission)
    assert (a.sigma2, a.name) == (b.sigma2, b.name)


# ---- names, attributes, shapes ----------------------------------------------------------------------------------


def test_reference_names_are_exported():
    for name in ("Distribution", "Estimator", "Accumulator", "AccumulatorFactory", "DataEncoder", "Sampler"):
        assert f"ChainedAttention{name}" in attnmix.__all__
        assert getattr(attnmix, f"ChainedAttention{name}") is getattr(attnmix._core, f"ChainedAttention{name}")


def test_attributes_and_str_follow_spec(rng):
    model = random_model(rng, L=3, S=5, T=4, sigma2=0.25, name="chain")
    assert (model.n_hops, model.num_symbols, model.num_targets) == (3, 5, 4)
    assert model.key_tables.shape == (3, 5, 5) and model.key_tables.dtype == np.float64
    assert model.emission.shape == (5, 4) and model.emission.dtype == np.float64
    assert model.sigma2 == 0.25 and model.name == "chain"
    assert str(model) == "ChainedAttentionDistribution(L=3, S=5, T=4, sigma2=0.25, name='chain')"
    assert repr(model) == str(model)
    default = ChainedAttentionDistribution(np.zeros((1, 2, 2)), np.full((2, 3), 1 / 3))
    assert default.sigma2 == 0.1 and default.name is None
    assert str(default) == "ChainedAttentionDistribution(L=1, S=2, T=3, sigma2=0.1, name=None)"
    keys = rng.standard_normal((2, 4, 4))
    np.testing.assert_array_equal(ChainedAttentionDistribution(keys, np.full((4, 2), 0.5)).key_tables, keys)


def test_estimator_and_encoder_of_a_model(rng):
    model = random_model(rng, L=2, S=5, T=4, sigma2=0.3, name="m")
    est = model.estimator(pseudo_count=2.0)
    assert isinstance(est, ChainedAttentionEstimator)
    assert (est.n_hops, est.num_symbols, est.num_targets) == (2, 5, 4)
    assert (est.sigma2, est.name, est.pseudo_count, est.emission_smoothing) == (0.3, "m", 2.0, 1e-4)
    assert model.dist_to_encoder() == ChainedAttentionDataEncoder(5, 4)
    assert model.dist_to_encoder() != ChainedAttentionDataEncoder(5, None)
    assert ChainedAttentionDataEncoder().num_symbols is None
    assert (ChainedAttentionDataEncoder(5, 4).num_symbols, ChainedAttentionDataEncoder(5, 4).num_targets) == (5, 4)
    defaults = ChainedAttentionEstimator(2, 5, 4)
    assert (defaults.sigma2, defaults.emission_smoothing, defaults.pseudo_count) == (0.1, 1e-4, None)
    assert (defaults.name, defaults.keys) == (None, None)


def test_encoder_shapes_and_dtypes(rng):
    """CA-1: seq_encode gives keys int64 (n, N), vals int64 (n, N), q int64 (n,), t int64 (n,)."""
    model = random_model(rng)
    rows = model.sampler(seed=1, context_length=7).sample(8)
    enc = ChainedAttentionDataEncoder(5, 4).seq_encode(rows)
    keys, vals, q, t = enc
    assert (keys.shape, vals.shape, q.shape, t.shape) == ((8, 7), (8, 7), (8,), (8,))
    assert all(a.dtype == np.int64 for a in (keys, vals, q, t))
    assert enc.n_rows == 8 and len(enc) == 4
    for r, (k, v, qq, tt) in enumerate(rows):
        np.testing.assert_array_equal(keys[r], k)
        np.testing.assert_array_equal(vals[r], v)
        assert (q[r], t[r]) == (qq, tt)
    with pytest.raises(ValueError):
        keys[0, 0] = 1  # read-only views
    again = model.dist_to_encoder().seq_encode((keys, vals, q, t))  # the tuple-of-arrays path
    for a, b in zip(again, enc):
        np.testing.assert_array_equal(a, b)
    float_ids = model.dist_to_encoder().seq_encode([([0.0, 1.0], [2.0, 3.0], 4.0, 1.0)])  # integral floats are ids
    np.testing.assert_array_equal(float_ids[0], [[0, 1]])
    empty = model.dist_to_encoder().seq_encode([])
    assert empty.n_rows == 0 and model.seq_log_density(empty).shape == (0,)


def test_sampler_types_and_context_length(rng):
    """CA-1 sampler types; CA-6: the sampler honours context_length (default 6)."""
    model = random_model(rng)
    keys, values, q, t = model.sampler(seed=3).sample()
    assert keys.shape == (6,) and values.shape == (6,) and keys.dtype == values.dtype == np.int64
    assert type(q) is int and type(t) is int and 0 <= q < 5 and 0 <= t < 4
    for length in (1, 3, 11):
        for k, v, q, t in ChainedAttentionSampler(model, seed=4, context_length=length).sample(5):
            assert k.shape == (length,) and v.shape == (length,)
            assert k.min() >= 0 and k.max() < 5 and v.min() >= 0 and v.max() < 5
    assert len(model.sampler(5, context_length=2).sample(0)) == 0
    sampler = ChainedAttentionSampler(model, seed=5)
    assert sampler.dist is model


def test_sample_of_size_equals_consecutive_draws(rng):
    model = random_model(rng)
    batch = model.sampler(seed=9, context_length=4).sample(4, batched=True)
    sampler = model.sampler(seed=9, context_length=4)
    for row in batch:
        k, v, q, t = sampler.sample()
        np.testing.assert_array_equal(row[0], k)
        np.testing.assert_array_equal(row[1], v)
        assert (row[2], row[3]) == (q, t)


def test_sampler_marginals_match_the_model():
    """A goodness-of-fit check of the sampler: with fixed keys and values the target frequencies follow
    predict_proba (keys, values and q are uniform, so condition on one context by filtering)."""
    model = ChainedAttentionDistribution(np.stack([2 * np.eye(2), 2 * np.eye(2)]), np.array([[0.9, 0.1], [0.2, 0.8]]))
    draws = model.sampler(seed=11, context_length=1).sample(4000)
    counts = np.zeros((2, 2))
    for k, v, q, t in draws:
        counts[v[0], t] += 1
    freq = counts / counts.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(freq, model.emission, atol=0.04)  # N = 1: t ~ B[v_0]


# ---- the distribution against brute force -----------------------------------------------------------------------


@pytest.mark.parametrize("L,N", [(2, 5), (3, 4), (1, 6)])
def test_log_density_matches_path_enumeration(rng, L, N):
    """CA-2: the forward-backward likelihood equals brute-force enumeration of all N^L paths (sigma2 0.3,
    30 samples; rtol 1e-9)."""
    model = random_model(rng, L=L, S=6, T=5, sigma2=0.3)
    rows = model.sampler(seed=2, context_length=N).sample(30)
    batch = model.seq_log_density(model.dist_to_encoder().seq_encode(rows))
    for r, (keys, values, q, t) in enumerate(rows):
        expected = brute_force_log_density(model, keys, values, q, t)
        assert model.log_density((keys, values, q, t)) == pytest.approx(expected, rel=1e-9)
        assert model.density((keys, values, q, t)) == pytest.approx(math.exp(expected), rel=1e-9)
        assert batch[r] == pytest.approx(expected, rel=1e-9)


def test_batch_log_density_equals_per_row(rng):
    """C-1 / CA-1: seq_log_density equals per-row log_density (rel 1e-12)."""
    model = random_model(rng)
    rows = model.sampler(seed=11).sample(40)
    batch = model.seq_log_density(model.dist_to_encoder().seq_encode(rows))
    assert batch.shape == (40,) and batch.dtype == np.float64
    np.testing.assert_allclose(batch, [model.log_density(x) for x in rows], rtol=1e-12)


def test_predict_proba_sums_to_one_and_matches_enumeration(rng):
    """CA-1: predict_proba rows sum to 1; (T,) for 1-D keys and (n, T) otherwise; equal to
    sum over paths p(path) B[v_{z_{L-1}}] (the target marginalised)."""
    model = random_model(rng, L=2, S=6, T=5)
    keys, values, q, _ = model.dist_to_encoder().seq_encode(model.sampler(seed=5, context_length=4).sample(8))
    proba = model.predict_proba(keys, values, q)
    assert proba.shape == (8, 5) and proba.dtype == np.float64
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-9)
    for r in range(8):
        paths, probs = path_probabilities(model, keys[r], values[r], q[r])
        expected = sum(p * model.emission[values[r][path[-1]]] for path, p in zip(paths, probs))
        np.testing.assert_allclose(proba[r], expected, rtol=1e-9, atol=1e-15)
    single = model.predict_proba(keys[0], values[0], q[0])
    assert single.shape == (5,)
    np.testing.assert_array_equal(single, proba[0])
    np.testing.assert_array_equal(model.predict_proba(keys[0].tolist(), values[0].tolist(), int(q[0])), proba[0])
    with pytest.raises(TypeError):
        model.predict_proba(keys[0], values[0], q[:1])  # one example takes one query id
    with pytest.raises(TypeError):
        model.predict_proba(keys, values[0], q)
    with pytest.raises(ValueError):
        model.predict_proba(keys, values[:, :3], q)
    with pytest.raises(ValueError):
        model.predict_proba(keys, values, q[:5])
    with pytest.raises(ValueError, match="out-of-range ID"):
        model.predict_proba(keys + 6, values, q)
    with pytest.raises(TypeError, match="bool"):
        model.predict_proba(keys.astype(bool), values, q)


# ---- statistics and the M-step ----------------------------------------------------------------------------------


def test_seq_update_matches_path_posterior(rng):
    """The E-step statistics of docs/mechanisms.md#chained-attention against the exact posterior over the N^2 paths (L =
    2)."""
    model = random_model(rng, L=2, S=5, T=4)
    rows = model.sampler(seed=6, context_length=4).sample(25)
    w = rng.random(25)
    acc = fresh_accumulator(model)
    acc.seq_update(model.dist_to_encoder().seq_encode(rows), w, model)
    value = acc.value()
    assert [np.shape(v) for v in value] == [(2, 5, 5), (2, 5), (5, 4), (), ()]
    assert type(value[3]) is float and type(value[4]) is float
    for got, expected in zip(value, brute_force_statistics(model, rows, w)):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def test_combine_value_doubles_emission_counts(rng):
    """CA-1: combine(value) doubles the emission counts."""
    model = random_model(rng)
    acc = fresh_accumulator(model)
    acc.seq_update(model.dist_to_encoder().seq_encode(model.sampler(seed=2).sample(30)), np.ones(30), model)
    emission_count = acc.value()[2]
    assert acc.combine(acc.value()) is acc
    np.testing.assert_array_equal(acc.value()[2], 2 * emission_count)


def test_estimate_matches_closed_form(rng):
    """The M-step of docs/mechanisms.md#chained-attention against numpy: K_l[s] = key_num / max(key_mass, 1e-9), B
    smoothed, sigma2 kept."""
    model = random_model(rng, L=2, S=5, T=4)
    acc = fresh_accumulator(model)
    acc.seq_update(model.dist_to_encoder().seq_encode(model.sampler(seed=7).sample(100)), np.ones(100), model)
    key_num, key_mass, emission_count, ll, n = acc.value()
    assert n == 100.0 and math.isfinite(ll)
    est = ChainedAttentionEstimator(2, 5, 4, sigma2=0.42, emission_smoothing=1e-3)
    fit = est.estimate(None, acc.value())
    assert isinstance(fit, ChainedAttentionDistribution) and fit.sigma2 == 0.42
    np.testing.assert_allclose(fit.key_tables, key_num / np.maximum(key_mass, 1e-9)[:, :, None], rtol=1e-12)
    counts = emission_count + 1e-3
    np.testing.assert_allclose(fit.emission, counts / counts.sum(axis=1, keepdims=True), rtol=1e-12)
    assert est.estimate(100.0, acc.value()).num_symbols == 5  # nobs = n
    assert est.estimate(None, acc).num_symbols == 5  # an accumulator is accepted as statistics


def test_merge_equals_concatenation(rng):
    """C-2: acc(A u B) equals acc(A) combined with acc(B) (rel 1e-12)."""
    model = random_model(rng)
    rows = model.sampler(seed=12).sample(60)
    w = rng.random(60)
    enc = model.dist_to_encoder()
    whole, part_a, part_b = (fresh_accumulator(model) for _ in range(3))
    whole.seq_update(enc.seq_encode(rows), w, model)
    part_a.seq_update(enc.seq_encode(rows[:25]), w[:25], model)
    part_b.seq_update(enc.seq_encode(rows[25:]), w[25:], model)
    part_a.combine(part_b.value())
    for a, b in zip(part_a.value(), whole.value()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_value_is_a_snapshot_and_round_trips(rng):
    """C-3: from_value(value()) round-trips exactly; value() is a snapshot."""
    model = random_model(rng)
    enc = model.dist_to_encoder().seq_encode(model.sampler(seed=13).sample(20))
    acc = fresh_accumulator(model)
    acc.seq_update(enc, np.ones(20), model)
    snapshot = acc.value()
    kept = [np.array(x, copy=True) for x in snapshot]
    snapshot[0][...] = 99.0  # writable copies, not views
    acc.seq_update(enc, np.ones(20), model)
    np.testing.assert_array_equal(acc.value()[2], 2 * kept[2])
    other = fresh_accumulator(model).from_value(acc.value())
    for a, b in zip(other.value(), acc.value()):
        np.testing.assert_array_equal(a, b)


def test_zero_weights_and_scale(rng):
    """C-4: zero weights contribute nothing; weights x c gives every field x c (scale), ll and n included."""
    model = random_model(rng)
    rows = model.sampler(seed=14).sample(30)
    w = rng.random(30)
    w[::3] = 0.0
    full, kept, scaled = (fresh_accumulator(model) for _ in range(3))
    full.seq_update(model.dist_to_encoder().seq_encode(rows), w, model)
    nonzero = [i for i in range(30) if w[i] > 0]
    kept.seq_update(model.dist_to_encoder().seq_encode([rows[i] for i in nonzero]), w[nonzero], model)
    for a, b in zip(full.value(), kept.value()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    scaled.seq_update(model.dist_to_encoder().seq_encode(rows), 2.5 * w, model)
    full.scale(2.5)
    for a, b in zip(full.value(), scaled.value()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_update_and_initialize_equal_their_seq_forms(rng):
    model = random_model(rng)
    rows = model.sampler(seed=15).sample(3)
    one, seq = fresh_accumulator(model), fresh_accumulator(model)
    for x in rows:
        one.update(x, 0.5, model)
    seq.seq_update(model.dist_to_encoder().seq_encode(rows), np.full(3, 0.5), model)
    for a, b in zip(one.value(), seq.value()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    init_one, init_seq = fresh_accumulator(model), fresh_accumulator(model)
    init_one.initialize(rows[0], 2.0, attnmix.Rng(4))
    init_seq.seq_initialize(model.dist_to_encoder().seq_encode(rows[:1]), np.array([2.0]), attnmix.Rng(4))
    for a, b in zip(init_one.value(), init_seq.value()):
        np.testing.assert_array_equal(a, b)
    key_num, key_mass, emission_count, ll, n = init_one.value()
    assert (ll, n) == (0.0, 2.0)  # ll untouched by seq_initialize
    np.testing.assert_allclose(key_mass.sum(axis=1), [2.0, 2.0], rtol=1e-12)
    assert emission_count.sum() == pytest.approx(2.0, rel=1e-12)


def test_mass_law_violations_raise(rng):
    """C-7: mass-law violations in combine / from_value / estimate ("cannot exceed" / "must equal")."""
    model = random_model(rng)
    acc = fresh_accumulator(model)
    acc.seq_update(model.dist_to_encoder().seq_encode(model.sampler(seed=15).sample(10)), np.ones(10), model)
    key_num, key_mass, emission, ll, n = acc.value()
    bigger = key_mass.copy()
    bigger[1] *= 1.01
    with pytest.raises(ValueError, match="cannot exceed"):
        acc.combine((key_num, bigger, emission, ll, n))
    with pytest.raises(ValueError, match="must equal"):
        acc.from_value((key_num, key_mass, emission * 0.99, ll, n))
    with pytest.raises(ValueError):
        acc.from_value((key_num, key_mass, emission, ll))  # arity
    with pytest.raises(ValueError):
        acc.from_value((key_num[:1], key_mass, emission, ll, n))  # shape
    with pytest.raises(ValueError):
        acc.from_value((key_num, key_mass, emission, math.nan, n))
    with pytest.raises(TypeError):
        acc.from_value(5)
    est = model.estimator()
    with pytest.raises(ValueError, match="must equal"):
        est.estimate(11.0, acc.value())
    with pytest.raises(ValueError, match="cannot exceed"):
        est.estimate(9.0, acc.value())
    for a, b in zip(acc.value(), (key_num, key_mass, emission, ll, n)):  # nothing changed
        np.testing.assert_array_equal(a, b)


def test_accumulator_constructors_and_factory():
    acc = ChainedAttentionAccumulator(2, 3, 4, keys="k", name="a")
    assert (acc.n_hops, acc.num_symbols, acc.num_targets, acc.keys, acc.name) == (2, 3, 4, "k", "a")
    assert [np.shape(v) for v in acc.value()] == [(2, 3, 3), (2, 3), (3, 4), (), ()]
    factory = ChainedAttentionAccumulatorFactory(2, 3, 4, keys="k", name="a")
    assert (factory.n_hops, factory.num_symbols, factory.num_targets) == (2, 3, 4)
    made = factory.make()
    assert isinstance(made, ChainedAttentionAccumulator) and made.keys == "k" and made.name == "a"
    assert made.acc_to_encoder() == ChainedAttentionDataEncoder(3, 4)
    est = ChainedAttentionEstimator(2, 3, 4, name="e", keys="k")
    assert isinstance(est.accumulator_factory(), ChainedAttentionAccumulatorFactory)
    assert est.accumulator_factory().make().name == "e" and est.accumulator_factory().make().keys == "k"
    assert ChainedAttentionAccumulator(1, 1, 1).keys is None


# ---- validation (CA-5, C-5, C-6) ------------------------------------------------------------------------------


def test_constructor_validation():
    """CA-5: non-simplex emission rejected; keys a finite real (L, S, S) array; sigma2 positive finite."""
    K, B = np.zeros((2, 2, 2)), np.full((2, 2), 0.5)
    with pytest.raises(ValueError, match="emission"):
        ChainedAttentionDistribution(K, np.array([[1.1, -0.1], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="emission"):
        ChainedAttentionDistribution(K, np.array([[0.5, 0.5], [0.5, 0.5 + 1e-9]]))
    with pytest.raises(ValueError):
        ChainedAttentionDistribution(K, np.full((3, 2), 0.5))  # S rows
    with pytest.raises(ValueError):
        ChainedAttentionDistribution(np.zeros((2, 2)), B)  # not 3-D
    with pytest.raises(ValueError):
        ChainedAttentionDistribution(np.zeros((0, 2, 2)), B)  # L = 0
    with pytest.raises(ValueError):
        ChainedAttentionDistribution(np.zeros((2, 2, 3)), B)  # not square
    with pytest.raises(ValueError):
        ChainedAttentionDistribution(np.zeros((2, 3, 3)), B)  # S differs from the emission
    bad = K.copy()
    bad[1, 0, 1] = np.nan
    with pytest.raises(ValueError):
        ChainedAttentionDistribution(bad, B)
    with pytest.raises(TypeError):
        ChainedAttentionDistribution(K.astype(complex), B)
    with pytest.raises(TypeError):
        ChainedAttentionDistribution(K > 0, B)
    with pytest.raises(TypeError):
        ChainedAttentionDistribution(K, B.astype(bool))
    for sigma2, error in ((0.0, ValueError), (-1.0, ValueError), (math.inf, ValueError), (math.nan, ValueError),
                          (True, TypeError), ("1", TypeError)):
        with pytest.raises(error):
            ChainedAttentionDistribution(K, B, sigma2=sigma2)
    with pytest.raises(TypeError):
        ChainedAttentionDistribution(K, B, name=3)
    assert ChainedAttentionDistribution(K.tolist(), B.tolist(), sigma2=1).sigma2 == 1.0


def test_estimator_and_accumulator_argument_validation():
    for args, error in (((0, 2, 2), ValueError), ((2, -1, 2), ValueError), ((2, 2, 0), ValueError),
                        ((2.0, 2, 2), TypeError), ((True, 2, 2), TypeError), ((2, 2, None), TypeError)):
        with pytest.raises(error):
            ChainedAttentionEstimator(*args)
        with pytest.raises(error):
            ChainedAttentionAccumulator(*args)
        with pytest.raises(error):
            ChainedAttentionAccumulatorFactory(*args)
    for kwargs, error in (({"sigma2": 0.0}, ValueError), ({"sigma2": True}, TypeError),
                          ({"emission_smoothing": -1e-3}, ValueError), ({"emission_smoothing": math.inf}, ValueError),
                          ({"emission_smoothing": False}, TypeError), ({"keys": 3}, TypeError),
                          ({"name": 3}, TypeError), ({"pseudo_count": -1.0}, ValueError)):
        with pytest.raises(error):
            ChainedAttentionEstimator(2, 2, 2, **kwargs)
    assert ChainedAttentionEstimator(2, 2, 2, emission_smoothing=0.0).emission_smoothing == 0.0
    with pytest.raises(TypeError):
        ChainedAttentionEstimator(2, 2, 2, 0.5)  # sigma2 is keyword-only
    with pytest.raises(TypeError):
        ChainedAttentionDataEncoder(2.0)
    with pytest.raises(ValueError):
        ChainedAttentionDataEncoder(2, 0)


def test_sampler_argument_validation(rng):
    model = random_model(rng)
    with pytest.raises(ValueError):
        model.sampler(1, context_length=0)
    with pytest.raises(TypeError):
        model.sampler(1, context_length=2.0)
    with pytest.raises(TypeError):
        ChainedAttentionSampler(model, 1, context_length=True)
    with pytest.raises(TypeError):
        model.sampler(1, 4)  # context_length is keyword-only
    with pytest.raises(TypeError):
        ChainedAttentionSampler(object(), 1)
    with pytest.raises(TypeError):
        model.sampler(seed=1.5)
    assert len(model.sampler(np.random.default_rng(3)).sample(2)) == 2
    assert len(model.sampler(attnmix.Rng(3)).sample(2)) == 2
    assert len(model.sampler().sample(1)) == 1


def test_id_validation(rng):
    """CA-5: fractional, negative and out-of-range ids are rejected (docs/mechanisms.md#building-blocks)."""
    model = random_model(rng, S=5, T=4)
    enc = model.dist_to_encoder()
    good = ([0, 1, 2], [3, 4, 0], 1, 2)
    with pytest.raises(ValueError, match="exact integer"):
        enc.seq_encode([([0, 1.5, 2], good[1], 1, 2)])
    with pytest.raises(ValueError, match="exact integer"):
        enc.seq_encode([(good[0], [0, np.nan, 2], 1, 2)])
    with pytest.raises(ValueError):
        enc.seq_encode([(good[0], good[1], 0.5, 2)])
    for bad in (([0, -1, 2], good[1], 1, 2), ([0, 5, 2], good[1], 1, 2), (good[0], [0, 1, 5], 1, 2),
                (good[0], good[1], 5, 2), (good[0], good[1], -1, 2), (good[0], good[1], 1, 4)):
        with pytest.raises(ValueError, match="out-of-range ID"):
            enc.seq_encode([bad])
    with pytest.raises(TypeError, match="bool"):
        enc.seq_encode([(np.array([True, False, True]), good[1], 1, 2)])
    with pytest.raises(TypeError, match="bool"):
        enc.seq_encode([(good[0], good[1], True, 2)])
    with pytest.raises(TypeError):
        enc.seq_encode([(good[0], good[1], [1], 2)])  # a query is one id
    with pytest.raises(TypeError):
        enc.seq_encode([([[0, 1], [2]], good[1], 1, 2)])  # ragged nesting
    with pytest.raises(ValueError, match="keys must all have the same length .*row 1 has 2"):
        enc.seq_encode([good, ([0, 1], [2, 3], 1, 2)])  # keys of different widths: a shape problem
    with pytest.raises(ValueError):
        enc.seq_encode([(good[0], [0, 1], 1, 2)])  # keys and values of different lengths
    with pytest.raises(ValueError):
        enc.seq_encode([([], [], 1, 2)])  # N = 0
    for bad in ([(good[0], good[1], 1)], [good + (0,)], [5], [None], ["abcd"]):
        with pytest.raises(TypeError, match=QUADRUPLES):
            enc.seq_encode(bad)
    with pytest.raises(TypeError):
        enc.seq_encode(5)
    keys, values, q, t = (np.array([good[0]]), np.array([good[1]]), np.array([1]), np.array([2]))
    with pytest.raises(TypeError):
        enc.seq_encode((keys, values, q[:, None], t))  # queries must be 1-D ids
    with pytest.raises(ValueError):
        enc.seq_encode((keys, values[:, :2], q, t))
    with pytest.raises(ValueError):
        enc.seq_encode((keys, values, np.array([1, 2]), t))  # row counts differ
    with pytest.raises(ValueError, match="out-of-range ID"):
        enc.seq_encode((keys + 5, values, q, t))


def test_undeclared_bounds_are_checked_against_the_model(rng):
    """An encoder without declared bounds accepts any non-negative id; the model checks it in seq_update and
    log_density."""
    model = random_model(rng, S=5, T=4)
    enc = ChainedAttentionDataEncoder().seq_encode([([0, 7], [1, 2], 0, 1)])
    with pytest.raises(ValueError, match="out-of-range ID"):
        model.seq_log_density(enc)
    acc = fresh_accumulator(model)
    with pytest.raises(ValueError, match="out-of-range ID"):
        acc.seq_update(enc, np.ones(1), model)
    too_big_target = ChainedAttentionDataEncoder().seq_encode([([0, 1], [1, 2], 0, 9)])
    with pytest.raises(ValueError, match="out-of-range ID"):
        model.seq_log_density(too_big_target)
    assert acc.value()[4] == 0.0


def test_weight_and_estimate_argument_validation(rng):
    model = random_model(rng)
    enc = model.dist_to_encoder().seq_encode(model.sampler(seed=1).sample(3))
    acc = fresh_accumulator(model)
    with pytest.raises(TypeError):
        acc.seq_update(enc, np.ones(3, dtype=bool), model)
    with pytest.raises(ValueError):
        acc.seq_update(enc, np.ones(2), model)
    with pytest.raises(ValueError):
        acc.seq_update(enc, -np.ones(3), model)
    with pytest.raises(TypeError):
        acc.seq_update(enc, np.ones(3), "not a model")
    other = random_model(rng, L=3)
    with pytest.raises(ValueError):
        acc.seq_update(enc, np.ones(3), other)  # the model's statistics have another layout
    assert acc.value()[4] == 0.0


def test_impossible_evidence_leaves_the_accumulator_unchanged():
    """C-6 / docs/mechanisms.md#chained-attention reference case: -inf density, ImpossibleEvidenceError listing the
    rows, nothing changed; zero-weight impossible rows are accepted."""
    model, obs = impossible_case()
    assert model.log_density(obs) == -math.inf
    assert model.density(obs) == 0.0
    acc = fresh_accumulator(model)
    possible = (np.array([1, 0]), np.array([1, 1]), 1, 0)
    acc.update(possible, 1.0, model)
    before = acc.value()
    with pytest.raises(ImpossibleEvidenceError) as info:
        acc.update(obs, 1.0, model)
    assert isinstance(info.value, ValueError)
    assert info.value.rows == [0]
    assert "encountered impossible evidence at rows [0]" in str(info.value)
    for a, b in zip(acc.value(), before):
        np.testing.assert_array_equal(a, b)
    enc = model.dist_to_encoder().seq_encode([possible, obs, obs])
    with pytest.raises(ImpossibleEvidenceError) as info:
        acc.seq_update(enc, np.array([1.0, 2.0, 0.5]), model)
    assert info.value.rows == [1, 2]
    for a, b in zip(acc.value(), before):
        np.testing.assert_array_equal(a, b)
    acc.seq_update(enc, np.array([1.0, 0.0, 0.0]), model)  # zero weights: allowed
    assert acc.value()[4] == before[4] + 1.0
    assert math.isfinite(acc.value()[3])
    np.testing.assert_array_equal(model.seq_log_density(enc)[1:], [-math.inf, -math.inf])
    with pytest.raises(ImpossibleEvidenceError):
        optimize([obs, possible], model.estimator(), prev_estimate=model, max_its=2, out=None)


# ---- fitting (CA-4, short), composition, tying ------------------------------------------------------------------


def test_two_hops_solve_the_transitive_task_and_one_hop_does_not(rng):
    """CA-4 (short form; the full 2000/2000 run is a C++ slow test): on the transitive task two hops beat one hop
    by a wide margin."""
    train, test = transitive_task(600, rng), transitive_task(600, rng)
    accuracies = {}
    for hops in (1, 2):
        est = ChainedAttentionEstimator(hops, 30, 30, sigma2=0.1)
        model = optimize(train, est, max_its=12, delta=None, rng=1, out=None)
        assert isinstance(model, ChainedAttentionDistribution) and model.n_hops == hops
        accuracies[hops] = accuracy(model, test)
    assert accuracies[2] > 0.8 and accuracies[1] < 0.25 and accuracies[2] - accuracies[1] > 0.5, accuracies


def test_optimize_writes_progress_and_is_deterministic(rng):
    """F-6 for CA: two fits with the same seed are bitwise identical; optimize accepts triples and arrays alike."""
    data = transitive_task(200, rng)
    rows = [(k, v, int(q), int(t)) for k, v, q, t in zip(*data)]
    est = ChainedAttentionEstimator(2, 30, 30)
    out = io.StringIO()
    a = optimize(rows, est, max_its=3, rng=5, out=out)
    b = optimize(data, est, max_its=3, rng=5, out=None)
    assert_same_params(a, b)
    lines = out.getvalue().splitlines()
    assert lines and all(math.isfinite(float(line.split("=")[1].split(",")[0])) for line in lines)
    c = optimize(data, est, max_its=2, prev_estimate=a, out=None)
    assert isinstance(c, ChainedAttentionDistribution)


def test_fits_inside_two_component_mixture(rng):
    """RA-8's counterpart for CA: a 2-component MixtureEstimator of CA heads fits; weights sum to 1."""
    data = transitive_task(300, rng)
    est = ChainedAttentionEstimator(2, 30, 30)
    out = io.StringIO()
    fit = optimize(data, MixtureEstimator([est, est]), max_its=4, rng=3, out=out)
    lines = out.getvalue().splitlines()
    assert lines and all(math.isfinite(float(line.split("=")[1].split(",")[0])) for line in lines)
    assert isinstance(fit, MixtureDistribution) and fit.num_components == 2
    assert sum(fit.w) == pytest.approx(1.0, abs=1e-9)
    assert all(isinstance(c, ChainedAttentionDistribution) for c in fit.components)


def test_mixture_log_density_is_the_log_sum_of_components(rng):
    a, b = random_model(rng), random_model(rng)
    mixture = MixtureDistribution([a, b], [0.3, 0.7])
    rows = a.sampler(seed=8).sample(10)
    enc = mixture.dist_to_encoder().seq_encode(rows)
    expected = np.logaddexp(np.log(0.3) + a.seq_log_density(rows), np.log(0.7) + b.seq_log_density(rows))
    np.testing.assert_allclose(mixture.seq_log_density(enc), expected, rtol=1e-12)
    acc = mixture.estimator().accumulator_factory().make()
    acc.seq_update(enc, np.ones(10), mixture)
    comp_count, children = acc.value()
    assert comp_count.sum() == pytest.approx(10.0, rel=1e-12)
    assert [child[4] for child in children] == pytest.approx(list(comp_count), rel=1e-12)


def test_composes_with_a_categorical_label(rng):
    """A CA head beside a categorical field (docs/mechanisms.md#building-blocks): log p = log p_CA + log p_cat, and the
    product fits."""
    model = random_model(rng)
    composite = CompositeDistribution([model, CategoricalDistribution([0.2, 0.8])])
    rows = [(x, 1) for x in model.sampler(seed=1).sample(5)]
    np.testing.assert_allclose(
        composite.seq_log_density(rows), model.seq_log_density([x for x, _ in rows]) + math.log(0.8), rtol=1e-12)
    est = CompositeEstimator([ChainedAttentionEstimator(2, 5, 4), CategoricalEstimator(2)])
    fit = optimize(rows * 10, est, max_its=3, rng=1, out=None)
    assert isinstance(fit.dists[0], ChainedAttentionDistribution) and fit.dists[0].n_hops == 2


def test_keyed_tying_gives_identical_components(rng):
    """F-5 for CA: two components with the same key end with identical parameters."""
    data = transitive_task(200, rng)
    est = ChainedAttentionEstimator(2, 30, 30, keys="shared")
    fit = optimize(data, MixtureEstimator([est, est]), max_its=3, rng=2, out=None)
    assert_same_params(fit.components[0], fit.components[1])


# ---- model files and pickling (F-7) -----------------------------------------------------------------------------


def test_model_files_round_trip_bit_for_bit(rng, tmp_path):
    """F-7: save -> load is bit-identical and goes through validation (family "chained_attention")."""
    model = random_model(rng, L=3, name="chain")
    path = tmp_path / "model.json"
    save_model(model, path)
    doc = json.loads(path.read_text())
    assert (doc["format"], doc["schema_version"], doc["family"], doc["name"]) == (
        "attnmix-model", 1, "chained_attention", "chain")
    assert set(doc["params"]) >= {"keys", "emission", "sigma2"}
    loaded = load_model(path)
    assert isinstance(loaded, ChainedAttentionDistribution)
    assert_same_params(loaded, model)
    mixture = MixtureDistribution([model, random_model(rng, L=3)], [0.4, 0.6], name="mix")
    save_model(mixture, str(tmp_path / "mixture.json"))
    back = load_model(tmp_path / "mixture.json")
    assert isinstance(back, MixtureDistribution) and back.name == "mix"
    for a, b in zip(back.components, mixture.components):
        assert_same_params(a, b)
    doc["params"]["emission"][0][0] += 0.5  # no longer a row simplex: the loader validates
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="emission"):
        load_model(path)


def test_models_pickle_through_their_params(rng):
    model = random_model(rng, name="p")
    copy = pickle.loads(pickle.dumps(model))
    assert isinstance(copy, ChainedAttentionDistribution)
    assert_same_params(copy, model)
    assert str(copy) == str(model)
    assert_same_params(deepcopy(model), model)
    unnamed = pickle.loads(pickle.dumps(random_model(rng)))
    assert unnamed.name is None
    mixture = pickle.loads(pickle.dumps(MixtureDistribution([model, unnamed], [0.5, 0.5])))
    assert_same_params(mixture.components[0], model)


@pytest.mark.parametrize("L,N", [(2, 5), (3, 4), (1, 6)])
def test_posterior_is_the_path_enumeration_marginal(rng, L, N):
    """gamma[n, hop, j] = P(z_hop = j | keys, values, q, t), the marginal of the brute-force path posterior."""
    model = random_model(rng, L=L, S=6, T=5, sigma2=0.3)
    rows = model.sampler(seed=5, context_length=N).sample(12)
    gamma = model.posterior(rows)
    assert gamma.shape == (12, L, N)
    for n, (keys, values, q, t) in enumerate(rows):
        paths, probs = path_probabilities(model, keys, values, q)
        joint = probs * np.array([model.emission[values[path[-1]], t] for path in paths])
        joint /= joint.sum()
        for hop in range(L):
            marginal = np.zeros(N)
            for path, p in zip(paths, joint):
                marginal[path[hop]] += p
            np.testing.assert_allclose(gamma[n, hop], marginal, rtol=1e-9, atol=1e-14)
