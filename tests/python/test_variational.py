# SPDX-License-Identifier: Apache-2.0
"""The variational families through the Python API: AttentionOptimizerState
(docs/mechanisms.md#variational-embedding-attention), variational embedding attention
(docs/mechanisms.md#variational-embedding-attention; the unit acceptance rows VEA-1 and VEA-4..VEA-8 with the shared
contract C-1..C-7) and variational multi-hop attention (docs/mechanisms.md#variational-multi-hop-attention; acceptance
row VMHA-2), plus composition, keyed tying, model files and pickling.

The oracles are numpy code written here from the model equations: log densities and predictions from the gate and
the emission, the E-step from finite differences of sum_n w_n log p_n at a posterior whose variance is negligible
(log_var = -60, so every Monte-Carlo table equals the mean to 1e-13), and the M-step from the Adam formulas of
docs/mechanisms.md#variational-embedding-attention.
The acceptance fits (VEA-2, VEA-3, VMHA-1) are in test_variational_acceptance.py (label slow)."""
import io
import json
import math
import pickle
from copy import deepcopy

import numpy as np
import pytest

import attnmix
from attnmix import (
    AttentionOptimizerState,
    CategoricalDistribution,
    CategoricalEstimator,
    ChainedAttentionDataEncoder,
    CompositeDistribution,
    CompositeEstimator,
    ImpossibleEvidenceError,
    MixtureDistribution,
    MixtureEstimator,
    VariationalEmbeddingAttentionAccumulator,
    VariationalEmbeddingAttentionAccumulatorFactory,
    VariationalEmbeddingAttentionDataEncoder,
    VariationalEmbeddingAttentionDistribution,
    VariationalEmbeddingAttentionEstimator,
    VariationalEmbeddingAttentionSampler,
    VariationalMultiHopAttentionAccumulator,
    VariationalMultiHopAttentionAccumulatorFactory,
    VariationalMultiHopAttentionDataEncoder,
    VariationalMultiHopAttentionDistribution,
    VariationalMultiHopAttentionEstimator,
    VariationalMultiHopAttentionSampler,
    load_model,
    optimize,
    save_model,
)

VEA = "variational_embedding_attention"
VMHA = "variational_multihop_attention"
VEA_TRIPLES = "^variational embedding attention observations must be context/query/target triples$"
CA_QUADRUPLES = "^chained attention observations must be keys/values/query/target tuples$"
DIFFERENT_STATES = "cannot combine attention statistics from different optimizer states"
TINY_LOG_VAR = -60.0  # exp(-30) ~ 1e-13: every Monte-Carlo table equals the mean to rounding


# ---- models, data and oracles -----------------------------------------------------------------------------------


def random_vea(rng, S=6, N=4, D=3, T=5, sigma2=0.5, name=None, log_var=None, optimizer_state=None):
    mean = rng.standard_normal((S, D))
    lv = np.log(0.3) + 0.2 * rng.standard_normal((S, D)) if log_var is None else np.full((S, D), float(log_var))
    return VariationalEmbeddingAttentionDistribution(
        mean, lv, rng.dirichlet(np.ones(T), size=S), rng.dirichlet(np.ones(N)), sigma2=sigma2, name=name,
        optimizer_state=optimizer_state)


def random_vmha(rng, S=6, D=3, T=5, sigma2=0.3, name=None, log_var=None):
    mean = rng.standard_normal((S, D))
    lv = np.log(0.3) + 0.2 * rng.standard_normal((S, D)) if log_var is None else np.full((S, D), float(log_var))
    return VariationalMultiHopAttentionDistribution(mean, lv, rng.dirichlet(np.ones(T), size=S), sigma2=sigma2,
                                                    name=name)


def with_state(model, **changes):
    """The same VEA/VMHA parameters with an optimizer state whose fields are changed (iteration, seed, moments)."""
    s = model.optimizer_state
    fields = dict(family=s.family, mean=s.mean, log_var=s.log_var, mean_first_moment=s.mean_first_moment,
                  mean_second_moment=s.mean_second_moment, log_var_first_moment=s.log_var_first_moment,
                  log_var_second_moment=s.log_var_second_moment, iteration=s.iteration, seed=s.seed)
    fields.update(changes)
    state = AttentionOptimizerState(**fields)
    if isinstance(model, VariationalEmbeddingAttentionDistribution):
        return VariationalEmbeddingAttentionDistribution(model.mean, model.log_var, model.emission,
                                                         model.position_prior, model.sigma2, model.name, state)
    return VariationalMultiHopAttentionDistribution(model.mean, model.log_var, model.emission, model.sigma2,
                                                    model.name, state)


def lse(x):
    x = np.asarray(x, dtype=float)
    top = np.max(x)
    if top == -math.inf:
        return -math.inf
    return top + math.log(np.sum(np.exp(x - top)))


def vea_gate(model, context, q, E=None):
    """log a_i = log-softmax_i(log pi_i - ||E[q] - E[c_i]||^2 / (2 sigma2))."""
    E = model.mean if E is None else E
    with np.errstate(divide="ignore"):
        s = np.log(model.position_prior) - np.sum((E[q] - E[context]) ** 2, axis=1) / (2 * model.sigma2)
    return s - lse(s)


def vea_log_p(model, context, q, t, E=None):
    with np.errstate(divide="ignore"):
        return lse(vea_gate(model, context, q, E) + np.log(model.emission[context, t]))


def vea_proba(model, context, q):
    return np.exp(vea_gate(model, context, q)) @ model.emission[context]


def vmha_joint(model, keys, values, q, t=None, E=None):
    """p(z1 = i, z2 = j) B[v_j, t] (or without the emission when t is None): the (N, N) joint of
    docs/mechanisms.md#variational-multi-hop-attention."""
    E, s2 = (model.mean if E is None else E), model.sigma2
    s1 = -np.sum((E[q] - E[keys]) ** 2, axis=1) / (2 * s2)
    a1 = np.exp(s1 - lse(s1))
    s2_ = -np.sum((E[values][:, None, :] - E[keys][None, :, :]) ** 2, axis=2) / (2 * s2)
    a2 = np.exp(s2_ - s2_.max(axis=1, keepdims=True))
    a2 /= a2.sum(axis=1, keepdims=True)
    joint = a1[:, None] * a2
    return joint if t is None else joint * model.emission[values, t][None, :]


def vmha_log_p(model, keys, values, q, t, E=None):
    p = vmha_joint(model, keys, values, q, t, E).sum()
    return math.log(p) if p > 0 else -math.inf


def vmha_proba(model, keys, values, q):
    return vmha_joint(model, keys, values, q).sum(axis=0) @ model.emission[values]


def total_ll(log_p, model, rows, w, E):
    return sum(wn * log_p(model, *row, E=E) for row, wn in zip(rows, w) if wn > 0)


def finite_difference_gradient(log_p, model, rows, w, h=1e-5):
    """d/dm sum_n w_n log p_n(E = m) by central differences: the gradient the E-step must average."""
    m = np.array(model.mean)
    grad = np.zeros_like(m)
    for idx in np.ndindex(*m.shape):
        plus, minus = m.copy(), m.copy()
        plus[idx] += h
        minus[idx] -= h
        grad[idx] = (total_ll(log_p, model, rows, w, plus) - total_ll(log_p, model, rows, w, minus)) / (2 * h)
    return grad


def adam_oracle(state, grad_m, grad_logv, lr, kl_weight):
    """One Adam ascent step of docs/mechanisms.md#variational-embedding-attention from state (numpy; an
    AttentionOptimizerState or its to_dict() form, as value() gives it)."""
    state = AttentionOptimizerState.from_dict(state) if isinstance(state, dict) else state
    tau = state.iteration + 1
    m, lv = np.array(state.mean), np.array(state.log_var)
    g_m = grad_m - kl_weight * m
    g_lv = grad_logv - kl_weight * 0.5 * (np.exp(lv) - 1.0)

    def step(theta, g, mu1, mu2):
        mu1 = 0.9 * mu1 + 0.1 * g
        mu2 = 0.999 * mu2 + 0.001 * g * g
        return theta + lr * (mu1 / (1 - 0.9**tau)) / (np.sqrt(mu2 / (1 - 0.999**tau)) + 1e-8), mu1, mu2

    m, m1, m2 = step(m, g_m, state.mean_first_moment, state.mean_second_moment)
    lv, v1, v2 = step(lv, g_lv, state.log_var_first_moment, state.log_var_second_moment)
    return m, np.clip(lv, -8, 2), m1, m2, v1, v2


def smoothed(counts, eps):
    c = counts + eps
    return c / c.sum(axis=1, keepdims=True)


def fresh_accumulator(model):
    return model.estimator().accumulator_factory().make()


def e_step(model, rows_or_enc, w=None, acc=None):
    enc = rows_or_enc if isinstance(rows_or_enc, attnmix.EncodedBatch) else model.dist_to_encoder().seq_encode(
        rows_or_enc)
    acc = fresh_accumulator(model) if acc is None else acc
    acc.seq_update(enc, np.ones(enc.n_rows) if w is None else w, model)
    return acc


def assert_values_close(a, b, rtol=1e-12, atol=1e-15):
    """Every numeric field within rtol ("rel" as in the acceptance tasks), the optimizer states equal."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if x is None or isinstance(x, (dict, AttentionOptimizerState)):
            assert x == y
        else:
            np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def assert_values_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if x is None or isinstance(x, (dict, AttentionOptimizerState)):
            assert x == y
        else:
            np.testing.assert_array_equal(x, y)


def assert_same_vea(a, b):
    for field in ("mean", "log_var", "emission", "position_prior"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert (a.sigma2, a.name) == (b.sigma2, b.name)
    assert a.optimizer_state == b.optimizer_state


def assert_same_vmha(a, b):
    for field in ("mean", "log_var", "emission"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert (a.sigma2, a.name) == (b.sigma2, b.name)
    assert a.optimizer_state == b.optimizer_state


def vea_impossible_case():
    """pi = [0, 1], B = [[0, 1], [1, 0]], observation (ctx = [0, 1], q = 0, t = 1): position 0 has zero prior and
    B[1, 1] = 0, so no position explains the target."""
    model = VariationalEmbeddingAttentionDistribution(
        np.zeros((2, 1)), np.zeros((2, 1)), np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([0.0, 1.0]))
    return model, (np.array([0, 1]), 0, 1), (np.array([1, 0]), 1, 1)


def vmha_impossible_case():
    """B = [[1, 0], [1, 0]]: no value emits target 1."""
    model = VariationalMultiHopAttentionDistribution(np.zeros((2, 1)), np.zeros((2, 1)),
                                                     np.array([[1.0, 0.0], [1.0, 0.0]]))
    return model, (np.array([0, 1]), np.array([0, 1]), 0, 1), (np.array([0, 1]), np.array([1, 0]), 1, 0)


# ---- names --------------------------------------------------------------------------------------------------------


def test_reference_names_are_exported():
    for family in ("VariationalEmbeddingAttention", "VariationalMultiHopAttention"):
        for role in ("Distribution", "Estimator", "Accumulator", "AccumulatorFactory", "DataEncoder", "Sampler"):
            name = family + role
            assert name in attnmix.__all__
            assert getattr(attnmix, name) is getattr(attnmix._core, name)
    assert "AttentionOptimizerState" in attnmix.__all__
    assert attnmix.AttentionOptimizerState is attnmix._core.AttentionOptimizerState
    assert issubclass(VariationalEmbeddingAttentionDistribution, attnmix.Distribution)
    assert issubclass(VariationalMultiHopAttentionAccumulator, attnmix.Accumulator)


# ---- AttentionOptimizerState (docs/mechanisms.md#variational-embedding-attention, VEA-7) --------------------------


def test_fresh_state_has_zero_moments(rng):
    mean, log_var = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    s = AttentionOptimizerState.fresh(VEA, mean, log_var, seed=7)
    assert (s.family, s.iteration, s.seed, s.schema_version, s.algorithm) == (VEA, 0, 7, 1, "adam")
    np.testing.assert_array_equal(s.mean, mean)
    np.testing.assert_array_equal(s.log_var, log_var)
    for moment in (s.mean_first_moment, s.mean_second_moment, s.log_var_first_moment, s.log_var_second_moment):
        assert moment.shape == (4, 3) and not moment.any()
    with pytest.raises(ValueError):
        s.mean[0, 0] = 1.0  # immutable: read-only arrays
    assert AttentionOptimizerState.fresh(VMHA, mean, log_var).seed == 0
    assert "iteration=0" in repr(s) and VEA in repr(s)


def test_state_to_dict_round_trips_through_json(rng):
    """VEA-7: to_dict() is JSON-serialisable (nested lists) and from_dict(json round trip) is an equal state."""
    shape = (3, 2)
    s = AttentionOptimizerState(VMHA, rng.standard_normal(shape), rng.standard_normal(shape),
                                rng.standard_normal(shape), rng.random(shape), rng.standard_normal(shape),
                                rng.random(shape), iteration=12, seed=2**40 + 3)
    d = s.to_dict()
    assert d["schema_version"] == 1 and d["algorithm"] == "adam" and d["family"] == VMHA
    assert d["iteration"] == 12 and d["seed"] == 2**40 + 3
    assert isinstance(d["mean"], list) and isinstance(d["mean"][0], list)
    text = json.dumps(d)
    back = AttentionOptimizerState.from_dict(json.loads(text))
    assert back == s and not (back != s)
    np.testing.assert_array_equal(back.log_var_second_moment, s.log_var_second_moment)  # bit for bit
    with_arrays = dict(d, mean=np.array(s.mean), iteration=np.int64(12))  # numpy values are accepted
    assert AttentionOptimizerState.from_dict(with_arrays) == s
    assert AttentionOptimizerState.from_dict(d) != AttentionOptimizerState.from_dict(dict(d, iteration=13))
    assert s != "not a state"


def test_state_from_dict_validates(rng):
    """from_dict validates everything; an unknown schema_version or algorithm is a ValueError."""
    d = AttentionOptimizerState.fresh(VEA, rng.standard_normal((2, 2)), np.zeros((2, 2))).to_dict()
    for bad in (dict(d, schema_version=2), dict(d, algorithm="sgd"), dict(d, family="chained_attention"),
                dict(d, iteration=-1), dict(d, seed=-3), dict(d, mean=[[1.0, 2.0]]), dict(d, mean=[[1.0], [2.0, 3.0]]),
                dict(d, mean_second_moment=[[-1.0, 0.0], [0.0, 0.0]]), dict(d, mean=[[math.nan, 0.0], [0.0, 0.0]]),
                {k: v for k, v in d.items() if k != "log_var"}, dict(d, extra=1), dict(d, mean="abc")):
        with pytest.raises(ValueError):
            AttentionOptimizerState.from_dict(bad)
    with pytest.raises(TypeError):
        AttentionOptimizerState.from_dict([("mean", 1)])
    with pytest.raises(TypeError):
        AttentionOptimizerState.from_dict(dict(d, mean=object()))


def test_state_constructor_validates(rng):
    a = rng.standard_normal((2, 3))
    z = np.zeros((2, 3))
    assert AttentionOptimizerState(VEA, a, z, z, z, z, z).iteration == 0
    with pytest.raises(ValueError):
        AttentionOptimizerState("unknown", a, z, z, z, z, z)
    with pytest.raises(ValueError):
        AttentionOptimizerState(VEA, a, z[:1], z, z, z, z)  # shapes differ
    with pytest.raises(ValueError):
        AttentionOptimizerState(VEA, a, z, z, z, z, z, schema_version=2)
    with pytest.raises(ValueError):
        AttentionOptimizerState(VEA, a, z, z, z, z, z, algorithm="sgd")
    with pytest.raises(ValueError):
        AttentionOptimizerState(VEA, a, z, z, z, z, z, iteration=-1)
    with pytest.raises(TypeError):
        AttentionOptimizerState(VEA, a, z, z, z, z, z, iteration=1.0)
    with pytest.raises(TypeError):
        AttentionOptimizerState(VEA, a, z, z, z, z, z, seed=True)
    with pytest.raises(TypeError):
        AttentionOptimizerState(VEA, a.astype(complex), z, z, z, z, z)
    with pytest.raises(TypeError):
        AttentionOptimizerState(3, a, z, z, z, z, z)
    with pytest.raises(ValueError):
        AttentionOptimizerState.fresh(VEA, np.full((2, 2), np.inf), np.zeros((2, 2)))


def test_state_pickles_and_copies(rng):
    s = AttentionOptimizerState.fresh(VEA, rng.standard_normal((2, 2)), rng.standard_normal((2, 2)), seed=4)
    assert pickle.loads(pickle.dumps(s)) == s
    assert deepcopy(s) == s


# ---- VEA: distribution, attributes, prediction ------------------------------------------------------------------


def test_vea_attributes_and_str(rng):
    model = random_vea(rng, S=7, N=3, D=2, T=4, sigma2=0.25, name="vea")
    assert (model.num_symbols, model.context_length, model.embed_dim, model.num_targets) == (7, 3, 2, 4)
    assert model.mean.shape == model.log_var.shape == (7, 2)
    assert model.emission.shape == (7, 4) and model.position_prior.shape == (3,)
    assert model.sigma2 == 0.25 and model.name == "vea"
    assert str(model) == "VariationalEmbeddingAttentionDistribution(S=7, N=3, D=2, T=4, sigma2=0.25, name='vea')"
    assert repr(model) == str(model)
    emb = model.embeddings()
    assert emb.shape == (7, 2) and emb.dtype == np.float64
    np.testing.assert_array_equal(emb, model.mean)
    with pytest.raises(ValueError):
        emb[0, 0] = 0.0  # the model is immutable
    state = model.optimizer_state
    assert isinstance(state, AttentionOptimizerState)
    assert (state.family, state.iteration, state.seed) == (VEA, 0, 0)  # optimizer_state=None -> fresh, seed 0
    np.testing.assert_array_equal(state.mean, model.mean)
    np.testing.assert_array_equal(state.log_var, model.log_var)
    default = VariationalEmbeddingAttentionDistribution(np.zeros((2, 1)), np.zeros((2, 1)), np.full((2, 3), 1 / 3),
                                                        [0.5, 0.5])
    assert default.sigma2 == 0.5 and default.name is None
    assert str(default) == "VariationalEmbeddingAttentionDistribution(S=2, N=2, D=1, T=3, sigma2=0.5, name=None)"


def test_vea_estimator_and_encoder_of_a_model(rng):
    """docs/mechanisms.md#variational-embedding-attention: model.estimator() passes the dimensions, sigma2 and seed =
    optimizer_state.seed; the rest default."""
    model = with_state(random_vea(rng, S=6, N=4, D=3, T=5, sigma2=0.4, name="m"), seed=17, iteration=3)
    est = model.estimator(pseudo_count=2.0)
    assert isinstance(est, VariationalEmbeddingAttentionEstimator)
    assert (est.num_symbols, est.context_length, est.embed_dim, est.num_targets) == (6, 4, 3, 5)
    assert (est.sigma2, est.seed, est.name, est.pseudo_count) == (0.4, 17, "m", 2.0)
    assert (est.lr, est.mc, est.prior_strength, est.emission_smoothing, est.keys) == (0.05, 6, 1.0, 1e-4, None)
    assert model.dist_to_encoder() == VariationalEmbeddingAttentionDataEncoder(6, 4, 5)
    assert model.dist_to_encoder() != VariationalEmbeddingAttentionDataEncoder(6, None, 5)
    assert model.dist_to_encoder() != ChainedAttentionDataEncoder(6, 5)
    enc = VariationalEmbeddingAttentionDataEncoder(6, 4, 5)
    assert (enc.num_symbols, enc.context_length, enc.num_targets) == (6, 4, 5)
    assert VariationalEmbeddingAttentionDataEncoder().num_symbols is None
    defaults = VariationalEmbeddingAttentionEstimator(6, 4, 3, 5)
    assert (defaults.sigma2, defaults.lr, defaults.mc, defaults.prior_strength) == (0.5, 0.05, 6, 1.0)
    assert (defaults.emission_smoothing, defaults.seed, defaults.pseudo_count, defaults.name) == (1e-4, 0, None, None)


def test_vea_log_density_matches_the_model_and_batch_equals_rows(rng):
    """C-1: seq_log_density equals per-row log_density (rel 1e-12); both equal the numpy gate oracle."""
    model = random_vea(rng)
    rows = model.sampler(seed=3).sample(40)
    batch = model.seq_log_density(model.dist_to_encoder().seq_encode(rows))
    assert batch.shape == (40,) and batch.dtype == np.float64
    np.testing.assert_allclose(batch, [model.log_density(x) for x in rows], rtol=1e-12)
    np.testing.assert_allclose(batch, [vea_log_p(model, *x) for x in rows], rtol=1e-9)
    assert model.density(rows[0]) == pytest.approx(math.exp(batch[0]), rel=1e-12)
    np.testing.assert_array_equal(model.seq_log_density(rows), batch)  # raw rows are encoded first


def test_vea_predict_proba_sums_to_one_and_matches_the_gate(rng):
    """VEA-1: predict_proba rows sum to 1; (T,) for one example and (n, T) for a batch."""
    model = random_vea(rng, S=8, N=4, D=3, T=5)
    context, q, _ = model.dist_to_encoder().seq_encode(model.sampler(seed=4).sample(9))
    proba = model.predict_proba(context, q)
    assert proba.shape == (9, 5) and proba.dtype == np.float64
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
    for r in range(9):
        np.testing.assert_allclose(proba[r], vea_proba(model, context[r], q[r]), rtol=1e-9, atol=1e-15)
    single = model.predict_proba(context[0], q[0])
    assert single.shape == (5,)
    np.testing.assert_array_equal(single, proba[0])
    np.testing.assert_array_equal(model.predict_proba(context[0].tolist(), int(q[0])), proba[0])
    with pytest.raises(TypeError):
        model.predict_proba(context[0], q[:1])  # one example takes one query id
    with pytest.raises(TypeError):
        model.predict_proba(context, q[0])
    with pytest.raises(TypeError):
        model.predict_proba(context[None], q)
    with pytest.raises(ValueError):
        model.predict_proba(context, q[:5])
    with pytest.raises(ValueError):
        model.predict_proba(context[:, :3], q)  # N = 4
    with pytest.raises(ValueError, match="out-of-range ID"):
        model.predict_proba(context, q + 8)
    with pytest.raises(ValueError, match="out-of-range ID"):
        model.predict_proba(context - 1, q)
    with pytest.raises(TypeError, match="bool"):
        model.predict_proba(context.astype(bool), q)


# ---- VEA: samplers (VEA-6) -------------------------------------------------------------------------------------


def test_vea_sampler_types_and_contexts(rng):
    model = random_vea(rng, S=6, N=4)
    context, q, t = model.sampler(seed=1).sample()
    assert context.shape == (4,) and context.dtype == np.int64 and type(q) is int and type(t) is int
    assert 0 <= q < 6 and 0 <= t < 5
    for c, _, _ in model.sampler(seed=2).sample(50):
        assert len(set(c.tolist())) == 4  # without replacement when N <= S
    wide = random_vea(rng, S=3, N=5)  # N > S: with replacement (docs/porting.md)
    for c, q, t in wide.sampler(seed=3).sample(20):
        assert c.shape == (5,) and c.min() >= 0 and c.max() < 3
    sampler = VariationalEmbeddingAttentionSampler(model, seed=5)
    assert sampler.dist is model
    assert len(model.sampler(seed=5).sample(0)) == 0
    assert len(model.sampler(np.random.RandomState(3)).sample(2)) == 2
    assert len(model.sampler(attnmix.Rng(3)).sample(2)) == 2
    assert len(model.sampler().sample(1)) == 1
    with pytest.raises(TypeError):
        VariationalEmbeddingAttentionSampler(random_vmha(rng), 1)
    with pytest.raises(TypeError):
        model.sampler(seed=1.5)
    with pytest.raises(TypeError):
        model.sampler(1).sample(size=2.0)


def test_vea_plug_in_sampler_ignores_log_var_and_batches_equal_draws(rng):
    """VEA-6: the plug-in sampler does not depend on log_var; a batch of samples (plug-in and posterior-predictive)
    equals the same number of sequential draws."""
    a = random_vea(rng, log_var=-8.0)
    b = VariationalEmbeddingAttentionDistribution(a.mean, np.full(a.mean.shape, 2.0), a.emission, a.position_prior,
                                                  a.sigma2)
    for x, y in zip(a.sampler(seed=11).sample(60), b.sampler(seed=11).sample(60)):
        np.testing.assert_array_equal(x[0], y[0])
        assert x[1:] == y[1:]
    for make in (b.sampler, b.posterior_predictive_sampler):
        batch = make(seed=21).sample(8, batched=True)
        one_by_one = make(seed=21)
        for row in batch:
            c, q, t = one_by_one.sample()
            np.testing.assert_array_equal(row[0], c)
            assert row[1:] == (q, t)
    # the posterior-predictive sampler does draw a table from q: a wide posterior changes the targets
    tight = [t for _, _, t in a.posterior_predictive_sampler(seed=5).sample(200)]
    wide = [t for _, _, t in b.posterior_predictive_sampler(seed=5).sample(200)]
    assert tight != wide


def test_vea_sampler_targets_follow_the_emission():
    """Goodness of fit: with N = 1 the target is drawn from B[c_0]."""
    B = np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]])
    model = VariationalEmbeddingAttentionDistribution(np.zeros((3, 2)), np.zeros((3, 2)), B, [1.0])
    counts = np.zeros((3, 2))
    for c, _, t in model.sampler(seed=8).sample(6000):
        counts[c[0], t] += 1
    np.testing.assert_allclose(counts / counts.sum(axis=1, keepdims=True), B, atol=0.04)


# ---- VEA: encoder ----------------------------------------------------------------------------------------------


def test_vea_encoder_shapes_and_dtypes(rng):
    model = random_vea(rng, S=6, N=4, T=5)
    rows = model.sampler(seed=1).sample(8)
    enc = VariationalEmbeddingAttentionDataEncoder(6, 4, 5).seq_encode(rows)
    context, q, t = enc
    assert (context.shape, q.shape, t.shape) == ((8, 4), (8,), (8,))
    assert context.dtype == q.dtype == t.dtype == np.int64
    assert enc.n_rows == 8 and len(enc) == 3
    for r, (c, qq, tt) in enumerate(rows):
        np.testing.assert_array_equal(context[r], c)
        assert (q[r], t[r]) == (qq, tt)
    for array in (context, q, t):
        with pytest.raises(ValueError):
            array[0] = 0  # read-only
    again = model.dist_to_encoder().seq_encode((context, q, t))  # the tuple-of-arrays path
    for a, b in zip(again, enc):
        np.testing.assert_array_equal(a, b)
    floats = model.dist_to_encoder().seq_encode([([0.0, 1.0, 2.0, 3.0], 4.0, 1.0)])  # integral floats are ids
    np.testing.assert_array_equal(floats[0], [[0, 1, 2, 3]])
    empty = model.dist_to_encoder().seq_encode([])
    assert empty.n_rows == 0 and model.seq_log_density(empty).shape == (0,)
    assert model.dist_to_encoder().row_count(rows) == 8


def test_vea_id_validation(rng):
    """C-5: exact ids (docs/mechanisms.md#building-blocks and #variational-embedding-attention)."""
    model = random_vea(rng, S=6, N=3, T=5)
    enc = model.dist_to_encoder()
    with pytest.raises(ValueError, match="exact integer"):
        enc.seq_encode([([0, 1.5, 2], 1, 2)])
    with pytest.raises(ValueError):
        enc.seq_encode([([0, 1, 2], 0.5, 2)])
    with pytest.raises(ValueError):
        enc.seq_encode([([0, 1, 2], 1, math.nan)])
    for bad in (([0, -1, 2], 1, 2), ([0, 6, 2], 1, 2), ([0, 1, 2], 6, 2), ([0, 1, 2], -1, 2), ([0, 1, 2], 1, 5)):
        with pytest.raises(ValueError, match="out-of-range ID"):
            enc.seq_encode([bad])
    with pytest.raises(TypeError, match="bool"):
        enc.seq_encode([(np.array([True, False, True]), 1, 2)])
    with pytest.raises(TypeError, match="bool"):
        enc.seq_encode([([0, 1, 2], True, 2)])
    with pytest.raises(TypeError):
        enc.seq_encode([([0, 1, 2], [1], 2)])  # a query is one id
    with pytest.raises(TypeError):
        enc.seq_encode([([[0, 1], [2]], 1, 2)])  # ragged nesting
    with pytest.raises(ValueError, match="contexts must all have the same length .*row 1 has 2"):
        enc.seq_encode([([0, 1, 2], 1, 2), ([0, 1], 1, 2)])  # contexts of different widths: a shape problem
    with pytest.raises(ValueError):
        enc.seq_encode([([0, 1], 1, 2)] * 2)  # declared N = 3
    with pytest.raises(ValueError):
        VariationalEmbeddingAttentionDataEncoder().seq_encode([([], 1, 2)])  # N = 0
    for bad in ([([0, 1, 2], 1)], [([0, 1, 2], 1, 2, 0)], [5], [None], ["abc"]):
        with pytest.raises(TypeError, match=VEA_TRIPLES):
            enc.seq_encode(bad)
    with pytest.raises(TypeError):
        enc.seq_encode(5)
    context, q, t = np.array([[0, 1, 2]]), np.array([1]), np.array([2])
    with pytest.raises(TypeError):
        enc.seq_encode((context, q[:, None], t))  # queries are 1-D ids
    with pytest.raises(ValueError):
        enc.seq_encode((context, np.array([1, 2]), t))  # row counts differ
    with pytest.raises(ValueError, match="out-of-range ID"):
        enc.seq_encode((context + 4, q, t))
    with pytest.raises(TypeError):
        VariationalEmbeddingAttentionDataEncoder(2.0)
    with pytest.raises(ValueError):
        VariationalEmbeddingAttentionDataEncoder(2, 0)


def test_vea_undeclared_bounds_are_checked_against_the_model(rng):
    model = random_vea(rng, S=6, N=3, T=5)
    enc = VariationalEmbeddingAttentionDataEncoder().seq_encode([([0, 7, 1], 0, 1)])
    with pytest.raises(ValueError, match="out-of-range ID"):
        model.seq_log_density(enc)
    acc = fresh_accumulator(model)
    with pytest.raises(ValueError, match="out-of-range ID"):
        acc.seq_update(enc, np.ones(1), model)
    with pytest.raises(ValueError, match="out-of-range ID"):
        model.seq_log_density(VariationalEmbeddingAttentionDataEncoder().seq_encode([([0, 1, 2], 0, 9)]))
    with pytest.raises(ValueError):
        model.seq_log_density(VariationalEmbeddingAttentionDataEncoder().seq_encode([([0, 1], 0, 1)]))  # N = 3
    assert acc.value()[5] == 0.0


# ---- VEA: constructor and option validation (C-5, docs/mechanisms.md#variational-embedding-attention) -------------


def test_vea_constructor_validation(rng):
    m, lv, B, pi = np.zeros((3, 2)), np.zeros((3, 2)), np.full((3, 2), 0.5), np.full(4, 0.25)
    Dist = VariationalEmbeddingAttentionDistribution
    assert Dist(m.tolist(), lv.tolist(), B.tolist(), pi.tolist(), sigma2=1).sigma2 == 1.0
    with pytest.raises(ValueError, match="emission"):
        Dist(m, lv, np.array([[1.1, -0.1], [0.5, 0.5], [0.5, 0.5]]), pi)
    with pytest.raises(ValueError, match="emission"):
        Dist(m, lv, np.full((4, 2), 0.5), pi)  # S rows
    with pytest.raises(ValueError, match="position_prior"):
        Dist(m, lv, B, [0.5, 0.6])
    with pytest.raises(ValueError):
        Dist(m, lv[:2], B, pi)  # log_var shape
    with pytest.raises(ValueError):
        Dist(np.zeros(3), lv, B, pi)  # not 2-D
    with pytest.raises(ValueError):
        Dist(np.zeros((0, 2)), np.zeros((0, 2)), np.zeros((0, 2)), pi)  # empty
    with pytest.raises(ValueError):
        Dist(np.where(np.eye(3, 2) > 0, np.nan, 0.0), lv, B, pi)
    with pytest.raises(ValueError):
        Dist(m, np.full((3, 2), 800.0), B, pi)  # exp(log_var) overflows
    with pytest.raises(TypeError):
        Dist(m.astype(complex), lv, B, pi)
    with pytest.raises(TypeError):
        Dist(m > 0, lv, B, pi)
    with pytest.raises(TypeError):
        Dist(m, lv, B, None)  # position_prior is required
    for sigma2, error in ((0.0, ValueError), (-1.0, ValueError), (math.inf, ValueError), (math.nan, ValueError),
                          (True, TypeError), ("1", TypeError)):
        with pytest.raises(error):
            Dist(m, lv, B, pi, sigma2=sigma2)
    with pytest.raises(TypeError):
        Dist(m, lv, B, pi, name=3)


def test_vea_supplied_optimizer_state_must_match(rng):
    """docs/mechanisms.md#variational-embedding-attention: a supplied state must have the family, the geometry and
    bit-identical mean/log_var."""
    model = random_vea(rng)
    mean, lv = np.array(model.mean), np.array(model.log_var)
    args = (model.emission, model.position_prior)
    state = AttentionOptimizerState.fresh(VEA, mean, lv, seed=9)
    kept = VariationalEmbeddingAttentionDistribution(mean, lv, *args, optimizer_state=state)
    assert kept.optimizer_state == state and kept.optimizer_state.seed == 9
    nudged = mean.copy()
    nudged[0, 0] = np.nextafter(nudged[0, 0], np.inf)
    with pytest.raises(ValueError):
        VariationalEmbeddingAttentionDistribution(nudged, lv, *args, optimizer_state=state)
    with pytest.raises(ValueError):
        VariationalEmbeddingAttentionDistribution(
            mean, lv, *args, optimizer_state=AttentionOptimizerState.fresh(VMHA, mean, lv))
    with pytest.raises(ValueError):
        VariationalEmbeddingAttentionDistribution(
            mean, lv, *args, optimizer_state=AttentionOptimizerState.fresh(VEA, mean[:, :1], lv[:, :1]))
    # The to_dict() form (what value() gives) is accepted as well as the object.
    assert VariationalEmbeddingAttentionDistribution(mean, lv, *args, optimizer_state=state.to_dict()).optimizer_state == state
    with pytest.raises(TypeError):
        VariationalEmbeddingAttentionDistribution(mean, lv, *args, optimizer_state=[state])


def test_vea_estimator_and_accumulator_argument_validation():
    """docs/mechanisms.md#variational-embedding-attention: S, N, D, T, mc positive integers (bool or float ->
    TypeError); lr, sigma2 positive finite; prior_strength, emission_smoothing finite >= 0; seed a non-negative
    integer."""
    for args, error in (((0, 2, 2, 2), ValueError), ((2, -1, 2, 2), ValueError), ((2, 2, 0, 2), ValueError),
                        ((2, 2, 2, 0), ValueError), ((2.0, 2, 2, 2), TypeError), ((2, True, 2, 2), TypeError),
                        ((2, 2, 2.5, 2), TypeError), ((2, 2, 2, None), TypeError)):
        for cls in (VariationalEmbeddingAttentionEstimator, VariationalEmbeddingAttentionAccumulator,
                    VariationalEmbeddingAttentionAccumulatorFactory):
            with pytest.raises(error):
                cls(*args)
    for kwargs, error in (({"sigma2": 0.0}, ValueError), ({"sigma2": True}, TypeError), ({"lr": 0.0}, ValueError),
                          ({"lr": -0.1}, ValueError), ({"lr": math.inf}, ValueError), ({"lr": False}, TypeError),
                          ({"mc": 0}, ValueError), ({"mc": 2.0}, TypeError), ({"mc": True}, TypeError),
                          ({"prior_strength": -1.0}, ValueError), ({"prior_strength": math.nan}, ValueError),
                          ({"emission_smoothing": -1e-3}, ValueError), ({"emission_smoothing": math.inf}, ValueError),
                          ({"seed": -1}, ValueError), ({"seed": 1.0}, TypeError), ({"seed": True}, TypeError),
                          ({"keys": 3}, TypeError), ({"name": 3}, TypeError), ({"pseudo_count": -1.0}, ValueError)):
        with pytest.raises(error):
            VariationalEmbeddingAttentionEstimator(2, 2, 2, 2, **kwargs)
    for kwargs, error in (({"mc": 0}, ValueError), ({"mc": 1.5}, TypeError), ({"keys": 1}, TypeError),
                          ({"name": 1}, TypeError)):
        with pytest.raises(error):
            VariationalEmbeddingAttentionAccumulator(2, 2, 2, 2, **kwargs)
        with pytest.raises(error):
            VariationalEmbeddingAttentionAccumulatorFactory(2, 2, 2, 2, **kwargs)
    est = VariationalEmbeddingAttentionEstimator(2, 2, 2, 2, prior_strength=0.0, emission_smoothing=0.0, seed=2**40)
    assert (est.prior_strength, est.emission_smoothing, est.seed) == (0.0, 0.0, 2**40)
    with pytest.raises(TypeError):
        VariationalEmbeddingAttentionEstimator(2, 2, 2, 2, 0.5)  # options are keyword-only


def test_vea_accumulator_constructors_and_factory():
    acc = VariationalEmbeddingAttentionAccumulator(3, 2, 4, 5, mc=2, keys="k", name="a")
    assert (acc.num_symbols, acc.context_length, acc.embed_dim, acc.num_targets, acc.mc) == (3, 2, 4, 5, 2)
    assert (acc.keys, acc.name) == ("k", "a")
    value = acc.value()
    assert [np.shape(v) for v in value[:6]] == [(3, 4), (3, 4), (3, 5), (2,), (), ()]
    assert type(value[4]) is float and type(value[5]) is float and value[6] is None
    assert VariationalEmbeddingAttentionAccumulator(1, 1, 1, 1).mc == 6
    factory = VariationalEmbeddingAttentionAccumulatorFactory(3, 2, 4, 5, mc=2, keys="k", name="a")
    made = factory.make()
    assert isinstance(made, VariationalEmbeddingAttentionAccumulator)
    assert (made.mc, made.keys, made.name, factory.mc, factory.embed_dim) == (2, "k", "a", 2, 4)
    assert made.acc_to_encoder() == VariationalEmbeddingAttentionDataEncoder(3, 2, 5)
    est = VariationalEmbeddingAttentionEstimator(3, 2, 4, 5, mc=3, name="e", keys="k")
    assert isinstance(est.accumulator_factory(), VariationalEmbeddingAttentionAccumulatorFactory)
    made = est.accumulator_factory().make()
    assert (made.mc, made.name, made.keys) == (3, "e", "k")


# ---- VEA: statistics (C-1..C-7, VEA-4, VEA-5, VEA-8) --------------------------------------------------------------


def test_vea_e_step_matches_the_gradient_of_the_log_likelihood(rng):
    """docs/mechanisms.md#variational-embedding-attention with a negligible posterior variance: grad_m is the gradient
    of sum_n w_n log p_n at m (central differences), grad_logv vanishes, the counts are the weighted posterior
    responsibilities a_i b_i / p, ll = sum_n w_n log p_n and n = sum_n w_n; every Monte-Carlo sample gives the same
    values."""
    model = random_vea(rng, S=6, N=4, D=3, T=5, log_var=TINY_LOG_VAR)
    rows = model.sampler(seed=6).sample(25)
    w = rng.random(25)
    w[3] = 0.0
    grad_m, grad_logv, emission_count, position_count, ll, n, state = e_step(model, rows, w).value()
    assert state == model.optimizer_state.to_dict()
    np.testing.assert_allclose(grad_m, finite_difference_gradient(vea_log_p, model, rows, w), rtol=1e-5, atol=1e-7)
    assert np.max(np.abs(grad_logv)) < 1e-9
    expected_emission, expected_position = np.zeros((6, 5)), np.zeros(4)
    for (c, q, t), wn in zip(rows, w):
        with np.errstate(divide="ignore"):
            r = np.exp(vea_gate(model, c, q) + np.log(model.emission[c, t]) - vea_log_p(model, c, q, t))
        np.add.at(expected_emission, (c, t), wn * r)
        expected_position += wn * r
    np.testing.assert_allclose(emission_count, expected_emission, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(position_count, expected_position, rtol=1e-9, atol=1e-12)
    assert ll == pytest.approx(total_ll(vea_log_p, model, rows, w, model.mean), rel=1e-9)
    assert n == pytest.approx(w.sum(), rel=1e-12)
    assert position_count.sum() == pytest.approx(n, rel=1e-12) and emission_count.sum() == pytest.approx(n, rel=1e-12)


def test_vea_monte_carlo_noise_moves_the_gradient_and_depends_on_the_seed(rng):
    """With a real posterior variance the E-step evaluates perturbed tables: grad_logv is non-zero, the statistics
    depend on the state's seed and iteration (the noise key), and equal seeds reproduce them exactly."""
    model = random_vea(rng, log_var=math.log(0.3))
    rows = model.sampler(seed=6).sample(30)
    base = e_step(model, rows).value()
    assert np.max(np.abs(base[1])) > 1e-6
    assert_values_equal(e_step(model, rows).value(), base)
    for changed in (with_state(model, seed=1), with_state(model, iteration=1)):
        other = e_step(changed, rows).value()
        assert not np.array_equal(other[0], base[0])
    fewer = VariationalEmbeddingAttentionAccumulator(6, 4, 3, 5, mc=2)
    assert not np.array_equal(e_step(model, rows, acc=fewer).value()[0], base[0])  # mc of the accumulator


def test_vea_merge_equals_concatenation(rng):
    """C-2: acc(A u B) equals acc(A) combined with acc(B) (rel 1e-12): every chunk sees the same noise."""
    model = random_vea(rng)
    rows = model.sampler(seed=12).sample(60)
    w = rng.random(60)
    whole = e_step(model, rows, w)
    part_a, part_b = e_step(model, rows[:25], w[:25]), e_step(model, rows[25:], w[25:])
    assert part_a.combine(part_b.value()) is part_a
    assert_values_close(part_a.value(), whole.value())


def test_vea_one_and_seven_chunks_agree(rng):
    """VEA-8: seq_update over 1 chunk and over 7 chunks (in one accumulator) give equal statistics (rel 1e-12)."""
    model = random_vea(rng)
    rows = model.sampler(seed=13).sample(70)
    w = rng.random(70)
    whole = e_step(model, rows, w)
    chunked = fresh_accumulator(model)
    for chunk in np.array_split(np.arange(70), 7):
        e_step(model, [rows[i] for i in chunk], w[chunk], acc=chunked)
    assert_values_close(chunked.value(), whole.value())


def test_vea_fits_are_identical_for_every_thread_count(rng):
    """VEA-8 / F-1: optimize with 1 and 3 threads (3000 rows, 3 chunks) gives bitwise-identical models."""
    truth = random_vea(rng, S=8, N=4, D=3, T=5)
    data = truth.dist_to_encoder().seq_encode(truth.sampler(seed=1).sample(3000))
    est = VariationalEmbeddingAttentionEstimator(8, 4, 3, 5, mc=2)
    one = optimize(data, est, max_its=3, delta=None, rng=4, out=None, num_threads=1)
    three = optimize(data, est, max_its=3, delta=None, rng=4, out=None, num_threads=3)
    assert_same_vea(one, three)


def test_vea_value_is_a_snapshot_and_round_trips(rng):
    """C-3: from_value(value()) round-trips exactly (the optimizer state included); value() is a snapshot."""
    model = random_vea(rng)
    enc = model.dist_to_encoder().seq_encode(model.sampler(seed=13).sample(20))
    acc = e_step(model, enc)
    snapshot = acc.value()
    kept = [np.array(x, copy=True) for x in snapshot[:6]]
    snapshot[2][...] = 99.0  # writable copies, not views
    e_step(model, enc, acc=acc)
    np.testing.assert_allclose(acc.value()[2], 2 * kept[2], rtol=1e-12)
    other = VariationalEmbeddingAttentionAccumulator(6, 4, 3, 5).from_value(acc.value())
    assert_values_equal(other.value(), acc.value())
    assert other.value()[6] == model.optimizer_state.to_dict()
    assert other.from_value(VariationalEmbeddingAttentionAccumulator(6, 4, 3, 5).value()).value()[6] is None


def test_vea_zero_weights_and_scale(rng):
    """C-4: zero weights contribute nothing; weights x c gives every field x c (scale), ll and n included."""
    model = random_vea(rng)
    rows = model.sampler(seed=14).sample(30)
    w = rng.random(30)
    w[::3] = 0.0
    full = e_step(model, rows, w)
    nonzero = [i for i in range(30) if w[i] > 0]
    kept = e_step(model, [rows[i] for i in nonzero], w[nonzero])
    assert_values_close(full.value(), kept.value())
    scaled = e_step(model, rows, 2.5 * w)
    assert full.scale(2.5) is full
    assert_values_close(full.value(), scaled.value())
    with pytest.raises(ValueError):
        full.scale(-1.0)


def test_vea_weights_zero_one_equal_the_second_row_alone(rng):
    """VEA-4: weights [0, 1] give the statistics of the second row alone, in every field (rel 1e-12)."""
    model = random_vea(rng)
    rows = model.sampler(seed=15).sample(2)
    pair = e_step(model, rows, np.array([0.0, 1.0]))
    alone = e_step(model, rows[1:])
    assert_values_close(pair.value(), alone.value())
    doubled = e_step(model, rows[1:], np.array([2.0]))
    assert_values_close(doubled.value(), alone.scale(2.0).value())  # weights multiply the gradient and ll too


def test_vea_update_and_initialize_equal_their_seq_forms(rng):
    model = random_vea(rng)
    rows = model.sampler(seed=16).sample(3)
    one, seq = fresh_accumulator(model), e_step(model, rows, np.full(3, 0.5))
    for x in rows:
        one.update(x, 0.5, model)
    assert_values_close(one.value(), seq.value())
    init_one, init_seq = fresh_accumulator(model), fresh_accumulator(model)
    init_one.initialize(rows[0], 2.0, attnmix.Rng(4))
    init_seq.seq_initialize(model.dist_to_encoder().seq_encode(rows[:1]), np.array([2.0]), attnmix.Rng(4))
    assert_values_equal(init_one.value(), init_seq.value())
    grad_m, grad_logv, emission_count, position_count, ll, n, state = init_one.value()
    assert not grad_m.any() and not grad_logv.any() and (ll, n, state) == (0.0, 2.0, None)
    assert position_count.sum() == pytest.approx(2.0, rel=1e-12)
    assert emission_count.sum() == pytest.approx(2.0, rel=1e-12)
    c, _, t = rows[0]
    np.testing.assert_allclose(emission_count[:, t].sum(), 2.0, rtol=1e-12)  # only the row's target column
    assert np.all(emission_count[np.setdiff1d(np.arange(6), c)] == 0.0)


def test_vea_combine_requires_equal_optimizer_states(rng):
    """docs/mechanisms.md#variational-embedding-attention: statistics of different optimizer states (or of a state and
    of none) never combine; the accumulator is unchanged."""
    model = random_vea(rng)
    rows = model.sampler(seed=17).sample(10)
    acc = e_step(model, rows)
    before = acc.value()
    later = with_state(model, iteration=5)
    other = e_step(later, rows)
    init = fresh_accumulator(model)
    init.seq_initialize(model.dist_to_encoder().seq_encode(rows), np.ones(10), 1)
    for value in (other.value(), init.value()):
        with pytest.raises(ValueError, match=DIFFERENT_STATES):
            acc.combine(value)
        assert_values_equal(acc.value(), before)
    with pytest.raises(ValueError, match=DIFFERENT_STATES):
        acc.seq_update(model.dist_to_encoder().seq_encode(rows), np.ones(10), later)  # E-step of another state
    assert_values_equal(acc.value(), before)
    with pytest.raises(ValueError, match="missing field 'schema_version'"):  # a dict that is no state's to_dict()
        acc.from_value(before[:6] + ({"iteration": 0},))
    with pytest.raises(TypeError):
        acc.from_value(before[:6] + (["not", "a", "state"],))
    assert_values_equal(acc.value(), before)
    acc.combine(e_step(model, rows).value())  # the same state combines
    np.testing.assert_allclose(acc.value()[5], 20.0)


def test_vea_impossible_evidence_fails_before_mutation():
    """C-6 / VEA-5: -inf density; ImpossibleEvidenceError listing the rows, raised before any statistic (or the
    attached state) changes; zero-weight impossible rows are accepted."""
    model, impossible, possible = vea_impossible_case()
    assert model.log_density(impossible) == -math.inf and model.density(impossible) == 0.0
    acc = fresh_accumulator(model)
    before = acc.value()
    with pytest.raises(ImpossibleEvidenceError) as info:
        acc.update(impossible, 1.0, model)
    assert isinstance(info.value, ValueError) and info.value.rows == [0]
    assert "encountered impossible evidence at rows [0]" in str(info.value)
    assert_values_equal(acc.value(), before)  # still no state attached
    acc.update(possible, 1.0, model)
    before = acc.value()
    enc = model.dist_to_encoder().seq_encode([possible, impossible, impossible])
    with pytest.raises(ImpossibleEvidenceError) as info:
        acc.seq_update(enc, np.array([1.0, 2.0, 0.5]), model)
    assert info.value.rows == [1, 2]
    assert_values_equal(acc.value(), before)
    acc.seq_update(enc, np.array([1.0, 0.0, 0.0]), model)
    assert acc.value()[5] == before[5] + 1.0 and math.isfinite(acc.value()[4])
    np.testing.assert_array_equal(model.seq_log_density(enc)[1:], [-math.inf, -math.inf])
    with pytest.raises(ImpossibleEvidenceError):
        optimize([impossible, possible], model.estimator(), prev_estimate=model, max_its=2, out=None)


def test_vea_mass_law_violations_raise(rng):
    """C-7: "cannot exceed" / "must equal" in combine, from_value and estimate; nothing changes."""
    model = random_vea(rng)
    acc = e_step(model, model.sampler(seed=18).sample(10))
    gm, gl, emission, position, ll, n, state = acc.value()
    bigger = position.copy()
    bigger[1] *= 1.01
    with pytest.raises(ValueError, match="cannot exceed"):
        acc.combine((gm, gl, emission, bigger, ll, n, state))
    with pytest.raises(ValueError, match="must equal"):
        acc.from_value((gm, gl, emission * 0.99, position, ll, n, state))
    with pytest.raises(ValueError):
        acc.from_value((gm, gl, emission, position, ll, n))  # arity: the state entry is part of the tuple
    with pytest.raises(ValueError):
        acc.from_value((gm[:1], gl, emission, position, ll, n, state))  # shape
    with pytest.raises(ValueError):
        acc.from_value((gm, gl, emission, position, math.nan, n, state))
    with pytest.raises(ValueError):
        acc.from_value((gm * np.inf, gl, emission, position, ll, n, state))
    with pytest.raises(ValueError):
        acc.from_value((gm, gl, -emission, position, ll, -n, state))  # counts >= 0
    with pytest.raises(TypeError):
        acc.from_value(5)
    est = model.estimator()
    with pytest.raises(ValueError, match="must equal"):
        est.estimate(11.0, acc.value())
    with pytest.raises(ValueError, match="cannot exceed"):
        est.estimate(9.0, acc.value())
    assert_values_equal(acc.value(), (gm, gl, emission, position, ll, n, state))
    assert est.estimate(10.0, acc.value()).num_symbols == 6  # nobs = n


def test_vea_weight_and_model_argument_validation(rng):
    model = random_vea(rng)
    enc = model.dist_to_encoder().seq_encode(model.sampler(seed=1).sample(3))
    acc = fresh_accumulator(model)
    with pytest.raises(TypeError):
        acc.seq_update(enc, np.ones(3, dtype=bool), model)
    with pytest.raises(ValueError):
        acc.seq_update(enc, np.ones(2), model)
    with pytest.raises(ValueError):
        acc.seq_update(enc, np.array([1.0, -1.0, 1.0]), model)
    with pytest.raises(ValueError):
        acc.seq_update(enc, np.array([1.0, math.nan, 1.0]), model)
    with pytest.raises(TypeError):
        acc.seq_update(enc, np.ones(3), "not a model")
    with pytest.raises(ValueError):
        acc.seq_update(enc, np.ones(3), random_vea(rng, D=2))  # another layout
    with pytest.raises(TypeError):
        acc.seq_update(enc, np.ones(3), random_vmha(rng))  # another family
    assert acc.value()[5] == 0.0 and acc.value()[6] is None


# ---- VEA: the M-step and the optimizer state (VEA-7) ------------------------------------------------------------


def test_vea_estimate_is_one_adam_step_and_closed_form_counts(rng):
    """docs/mechanisms.md#variational-embedding-attention against numpy: Adam ascent with separate moments and the
    log_var clip, iteration + 1, seed kept; B = (emission_count + eps) row-normalised, pi = position_count / sum."""
    model = with_state(random_vea(rng), iteration=4, seed=3, mean_first_moment=rng.standard_normal((6, 3)),
                       mean_second_moment=rng.random((6, 3)), log_var_second_moment=rng.random((6, 3)))
    value = e_step(model, model.sampler(seed=19).sample(40)).value()
    est = VariationalEmbeddingAttentionEstimator(6, 4, 3, 5, sigma2=0.7, lr=0.3, prior_strength=0.5,
                                                 emission_smoothing=1e-3, seed=99, name="fit")
    fit = est.estimate(None, value)
    m, lv, m1, m2, v1, v2 = adam_oracle(value[6], value[0], value[1], lr=0.3, kl_weight=0.5)
    s = fit.optimizer_state
    assert (s.family, s.iteration, s.seed) == (VEA, 5, 3)  # the carried seed, not the estimator's
    for got, expected in ((fit.mean, m), (fit.log_var, lv), (s.mean_first_moment, m1), (s.mean_second_moment, m2),
                          (s.log_var_first_moment, v1), (s.log_var_second_moment, v2)):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(s.mean, fit.mean)
    np.testing.assert_allclose(fit.emission, smoothed(value[2], 1e-3), rtol=1e-12)
    np.testing.assert_allclose(fit.position_prior, value[3] / value[3].sum(), rtol=1e-12)
    assert (fit.sigma2, fit.name) == (0.7, "fit")
    for start, push, bound in ((1.9, 1e6, 2.0), (-7.9, -1e6, -8.0)):  # the log_var clip [-8, 2]
        near = random_vea(rng, log_var=start)
        v = e_step(near, near.sampler(seed=1).sample(5)).value()
        clipped = est.estimate(None, (v[0], np.full((6, 3), push), *v[2:]))  # a step of lr = 0.3 would pass it
        np.testing.assert_array_equal(clipped.log_var, np.full((6, 3), bound))


def test_vea_initial_estimate_draws_the_embeddings_from_the_seed(rng):
    """docs/mechanisms.md#variational-embedding-attention initialisation call (no state): m = 0.1 N(0, 1) from the
    estimator's seed, log v = log 0.3, zero moments, iteration 0."""
    model = random_vea(rng, S=40, N=4, D=10, T=5)
    acc = fresh_accumulator(model)
    rows = model.sampler(seed=1).sample(50)
    acc.seq_initialize(model.dist_to_encoder().seq_encode(rows), np.ones(50), 3)
    est = VariationalEmbeddingAttentionEstimator(40, 4, 10, 5, seed=5)
    init = est.estimate(50.0, acc.value())
    s = init.optimizer_state
    assert (s.iteration, s.seed, s.family) == (0, 5, VEA)
    np.testing.assert_array_equal(init.log_var, np.full((40, 10), math.log(0.3)))
    assert not (s.mean_first_moment.any() or s.mean_second_moment.any() or s.log_var_first_moment.any())
    assert 0.08 < np.std(init.mean) < 0.12 and abs(np.mean(init.mean)) < 0.03
    assert_same_vea(init, est.estimate(None, acc.value()))  # deterministic
    other = VariationalEmbeddingAttentionEstimator(40, 4, 10, 5, seed=6).estimate(None, acc.value())
    assert not np.array_equal(other.mean, init.mean)
    np.testing.assert_allclose(init.emission, smoothed(acc.value()[2], 1e-4), rtol=1e-12)


def test_vea_estimator_is_stateless_and_never_rerandomises(rng):
    """VEA-7: estimate applied twice to equal statistics gives equal models; model.estimator() and a fresh
    estimator continue the carried state (iteration + 1, each coordinate moved by at most lr on the first step)."""
    model = random_vea(rng)
    value = e_step(model, model.sampler(seed=20).sample(30)).value()
    est = model.estimator()
    first, second = est.estimate(None, value), est.estimate(None, value)
    assert_same_vea(first, second)
    fresh = VariationalEmbeddingAttentionEstimator(6, 4, 3, 5, seed=123).estimate(None, value)
    assert_same_vea(fresh, first)  # the state, not the estimator, holds the embeddings and the seed
    assert first.optimizer_state.iteration == 1 and first.optimizer_state.seed == 0
    assert np.max(np.abs(first.mean - model.mean)) <= 0.05 * (1 + 1e-9)
    assert np.max(np.abs(first.mean - model.mean)) > 0.01
    then = first.estimator().estimate(None, e_step(first, model.sampler(seed=21).sample(30)).value())
    assert then.optimizer_state.iteration == 2


def test_vea_optimize_continues_the_adam_trajectory(rng):
    """VEA-7: optimize(prev_estimate=model) does not re-initialise: the result is one of the iterates that manual EM
    steps from the model produce (bit for bit), with the iteration counter continuing."""
    truth = random_vea(rng, S=8, N=4, D=3, T=5)
    rows = truth.sampler(seed=2).sample(300)
    est = VariationalEmbeddingAttentionEstimator(8, 4, 3, 5, mc=2, lr=0.1)
    start = optimize(rows, est, max_its=4, delta=None, rng=3, out=None)
    assert isinstance(start, VariationalEmbeddingAttentionDistribution)
    assert 1 <= start.optimizer_state.iteration <= 4
    lines = io.StringIO()
    resumed = optimize(rows, est, max_its=3, delta=None, prev_estimate=start, out=lines)
    assert len(lines.getvalue().splitlines()) == 3
    iterates = [start]
    enc = start.dist_to_encoder().seq_encode(rows)
    for _ in range(3):  # EM steps with the estimator's accumulators (mc = 2), as optimize runs them
        iterates.append(est.estimate(None, e_step(iterates[-1], enc, acc=est.accumulator_factory().make()).value()))
    assert [m.optimizer_state.iteration for m in iterates] == [start.optimizer_state.iteration + k for k in range(4)]
    matches = [k for k, m in enumerate(iterates) if m.optimizer_state == resumed.optimizer_state]
    assert matches, "optimize(prev_estimate=...) re-initialised the embeddings"
    assert_same_vea(resumed, iterates[matches[0]])
    scores = [float(m.seq_log_density(enc).sum()) for m in iterates]
    assert scores[matches[0]] == max(scores)  # the best-scoring iterate (docs/mechanisms.md#training)


def test_vea_optimize_is_deterministic_and_writes_progress(rng):
    """F-6: two fits with the same seed are bitwise identical; triples and arrays give the same fit."""
    truth = random_vea(rng, S=8, N=4, D=3, T=5)
    rows = truth.sampler(seed=4).sample(200)
    arrays = tuple(np.array(a) for a in truth.dist_to_encoder().seq_encode(rows))
    est = VariationalEmbeddingAttentionEstimator(8, 4, 3, 5, mc=2)
    out = io.StringIO()
    a = optimize(rows, est, max_its=3, delta=None, rng=5, out=out)
    b = optimize(arrays, est, max_its=3, delta=None, rng=5, out=None)
    assert_same_vea(a, b)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].startswith("Iteration 1: ln[p_mat(Data|Model)]=")
    assert all(math.isfinite(float(line.split("=")[1].split(",")[0])) for line in lines)


# ---- VEA: composition, tying, files, pickling ---------------------------------------------------------------------


def test_vea_fits_inside_a_two_component_mixture(rng):
    truth = random_vea(rng, S=8, N=4, D=3, T=5)
    rows = truth.sampler(seed=5).sample(300)
    est = VariationalEmbeddingAttentionEstimator(8, 4, 3, 5, mc=2)
    out = io.StringIO()
    fit = optimize(rows, MixtureEstimator([est, est]), max_its=4, delta=None, rng=3, out=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and all(math.isfinite(float(line.split("=")[1].split(",")[0])) for line in lines)
    assert isinstance(fit, MixtureDistribution) and fit.num_components == 2
    assert sum(fit.w) == pytest.approx(1.0, abs=1e-9)
    assert all(isinstance(c, VariationalEmbeddingAttentionDistribution) for c in fit.components)
    assert all(c.optimizer_state.iteration >= 1 for c in fit.components)


def test_vea_mixture_statistics_carry_each_components_state(rng):
    """The mixture's value() nests the components' 7-tuples; from_value and estimate restore every state."""
    a, b = random_vea(rng), with_state(random_vea(rng), iteration=2, seed=8)
    mixture = MixtureDistribution([a, b], [0.3, 0.7])
    rows = a.sampler(seed=8).sample(20)
    enc = mixture.dist_to_encoder().seq_encode(rows)
    expected = np.logaddexp(math.log(0.3) + a.seq_log_density(rows), math.log(0.7) + b.seq_log_density(rows))
    np.testing.assert_allclose(mixture.seq_log_density(enc), expected, rtol=1e-12)
    acc = mixture.estimator().accumulator_factory().make()
    acc.seq_update(enc, np.ones(20), mixture)
    comp_count, children = acc.value()
    assert comp_count.sum() == pytest.approx(20.0, rel=1e-12)
    assert children[0][6] == a.optimizer_state.to_dict() and children[1][6] == b.optimizer_state.to_dict()
    copy = mixture.estimator().accumulator_factory().make().from_value(acc.value())
    assert copy.value()[1][1][6] == b.optimizer_state.to_dict()
    fit = mixture.estimator().estimate(None, acc.value())
    assert [c.optimizer_state.iteration for c in fit.components] == [1, 3]
    assert fit.components[1].optimizer_state.seed == 8


def test_vea_composes_with_a_categorical_label(rng):
    model = random_vea(rng)
    composite = CompositeDistribution([model, CategoricalDistribution([0.2, 0.8])])
    rows = [(x, 1) for x in model.sampler(seed=1).sample(5)]
    np.testing.assert_allclose(composite.seq_log_density(rows),
                               model.seq_log_density([x for x, _ in rows]) + math.log(0.8), rtol=1e-12)
    est = CompositeEstimator([VariationalEmbeddingAttentionEstimator(6, 4, 3, 5, mc=2), CategoricalEstimator(2)])
    fit = optimize(rows * 10, est, max_its=3, delta=None, rng=1, out=None)
    assert isinstance(fit.dists[0], VariationalEmbeddingAttentionDistribution)


def test_vea_keyed_tying(rng):
    """F-5: keyed components end identical; key_merge / key_replace pool the statistics (states included)."""
    truth = random_vea(rng, S=8, N=4, D=3, T=5)
    rows = truth.sampler(seed=6).sample(200)
    est = VariationalEmbeddingAttentionEstimator(8, 4, 3, 5, mc=2, keys="shared")
    fit = optimize(rows, MixtureEstimator([est, est]), max_its=3, delta=None, rng=2, out=None)
    assert_same_vea(fit.components[0], fit.components[1])
    model = random_vea(rng)
    data = model.sampler(seed=7).sample(20)
    first = e_step(model, data[:8], acc=VariationalEmbeddingAttentionAccumulator(6, 4, 3, 5, keys="k"))
    second = e_step(model, data[8:], acc=VariationalEmbeddingAttentionAccumulator(6, 4, 3, 5, keys="k"))
    whole = e_step(model, data)
    pool = {}
    first.key_merge(pool)
    second.key_merge(pool)
    assert pool["k"] is first
    first.key_replace(pool)
    second.key_replace(pool)
    assert_values_close(first.value(), whole.value())
    assert_values_equal(second.value(), first.value())


def test_vea_model_files_round_trip_bit_for_bit(rng, tmp_path):
    """F-7: save -> load is bit-identical, the optimizer state included (family variational_embedding_attention)."""
    model = with_state(random_vea(rng, name="vea"), iteration=7, seed=11,
                       mean_second_moment=rng.random((6, 3)))
    path = tmp_path / "model.json"
    save_model(model, path)
    doc = json.loads(path.read_text())
    assert (doc["format"], doc["family"], doc["name"]) == ("attnmix-model", VEA, "vea")
    assert set(doc["params"]) >= {"mean", "log_var", "emission", "position_prior", "sigma2"}
    assert AttentionOptimizerState.from_dict(doc["optimizer_state"]) == model.optimizer_state
    loaded = load_model(path)
    assert isinstance(loaded, VariationalEmbeddingAttentionDistribution)
    assert_same_vea(loaded, model)
    mixture = MixtureDistribution([model, random_vea(rng)], [0.4, 0.6])
    save_model(mixture, tmp_path / "mixture.json")
    back = load_model(tmp_path / "mixture.json")
    for a, b in zip(back.components, mixture.components):
        assert_same_vea(a, b)
    doc["params"]["mean"][0][0] += 1.0  # no longer the state's mean: the loader validates
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError):
        load_model(path)


def test_vea_models_pickle_through_their_params(rng):
    model = with_state(random_vea(rng, name="p"), iteration=3, seed=2)
    copy = pickle.loads(pickle.dumps(model))
    assert isinstance(copy, VariationalEmbeddingAttentionDistribution)
    assert_same_vea(copy, model)
    assert str(copy) == str(model)
    assert_same_vea(deepcopy(model), model)
    assert pickle.loads(pickle.dumps(random_vea(rng))).name is None
    mixture = pickle.loads(pickle.dumps(MixtureDistribution([model, random_vea(rng)], [0.5, 0.5])))
    assert_same_vea(mixture.components[0], model)


# ---- mixed precision (docs/mixed_precision.md) --------------------------------------------------------------------


def test_vea_mixed_precision_log_density_is_within_float_rounding(rng):
    model = random_vea(rng, S=20, N=16, D=32, T=7, sigma2=4.0)
    mixed = VariationalEmbeddingAttentionDistribution(model.mean, model.log_var, model.emission,
                                                      model.position_prior, model.sigma2, precision="mixed")
    assert (model.precision, mixed.precision) == ("float64", "mixed")
    assert str(mixed).endswith("name=None, precision='mixed')") and "precision" not in str(model)
    rows = model.sampler(3).sample(200)
    exact, approx = model.seq_log_density(rows), mixed.seq_log_density(rows)
    np.testing.assert_allclose(approx, exact, rtol=2e-6, atol=2e-6)
    assert np.mean(approx != exact) > 0.5  # the gate is float
    assert [mixed.log_density(x) for x in rows] == list(approx)
    contexts, queries = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    np.testing.assert_array_equal(mixed.predict_proba(contexts, queries), model.predict_proba(contexts, queries))


def test_vea_mixed_precision_fit_follows_float64_and_is_thread_count_invariant():
    rng = np.random.default_rng(12)
    S, N, D, T = 30, 8, 16, 30
    contexts = rng.integers(0, S, (2000, N))
    queries = rng.integers(0, S, 2000)
    data = (contexts, queries, contexts[np.arange(2000), rng.integers(0, N, 2000)])
    fits = {}
    for precision, threads in (("float64", 1), ("mixed", 1), ("mixed", 2)):
        est = VariationalEmbeddingAttentionEstimator(S, N, D, T, seed=4, precision=precision)
        assert est.precision == precision
        model = optimize(data, est, max_its=12, delta=None, rng=1, out=None, num_threads=threads)
        assert model.precision == precision and model.estimator().precision == precision
        fits[precision, threads] = model
    exact, mixed, mixed2 = fits["float64", 1], fits["mixed", 1], fits["mixed", 2]
    np.testing.assert_allclose(mixed.mean, exact.mean, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mixed.emission, exact.emission, rtol=1e-4, atol=1e-7)
    for name in ("mean", "log_var", "emission", "position_prior"):
        np.testing.assert_array_equal(getattr(mixed2, name), getattr(mixed, name))
    assert mixed2.optimizer_state == mixed.optimizer_state


def test_vea_precision_survives_pickles_but_not_model_files(rng, tmp_path):
    model = random_vea(rng, name="m")
    mixed = VariationalEmbeddingAttentionDistribution(model.mean, model.log_var, model.emission,
                                                      model.position_prior, model.sigma2, "m",
                                                      model.optimizer_state, precision="mixed")
    copy = pickle.loads(pickle.dumps(mixed))
    assert copy.precision == "mixed"
    assert_same_vea(copy, mixed)
    old = mixed.__getstate__()[:7]  # a pickle written before precision existed
    restored = VariationalEmbeddingAttentionDistribution.__new__(VariationalEmbeddingAttentionDistribution)
    restored.__setstate__(old)
    assert restored.precision == "float64"
    save_model(mixed, tmp_path / "m.json")  # model files store parameters, not the arithmetic
    assert load_model(tmp_path / "m.json").precision == "float64"


def test_vea_precision_must_be_a_known_name(rng):
    with pytest.raises(ValueError, match=r"precision must be 'float64' or 'mixed' \(got 'float32'\)"):
        VariationalEmbeddingAttentionEstimator(6, 4, 3, 5, precision="float32")
    with pytest.raises(TypeError, match="precision must be 'float64' or 'mixed'"):
        VariationalEmbeddingAttentionEstimator(6, 4, 3, 5, precision=32)
    model = random_vea(rng)
    with pytest.raises(ValueError, match="precision must be 'float64' or 'mixed'"):
        VariationalEmbeddingAttentionDistribution(model.mean, model.log_var, model.emission, model.position_prior,
                                                  precision="half")


# ---- VMHA (docs/mechanisms.md#variational-multi-hop-attention, VMHA-2) --------------------------------------------


def test_vmha_attributes_estimator_and_encoder(rng):
    model = random_vmha(rng, S=7, D=2, T=4, sigma2=0.25, name="hop")
    assert (model.num_symbols, model.embed_dim, model.num_targets) == (7, 2, 4)
    assert model.mean.shape == model.log_var.shape == (7, 2) and model.emission.shape == (7, 4)
    assert (model.sigma2, model.name) == (0.25, "hop")
    assert str(model) == "VariationalMultiHopAttentionDistribution(S=7, D=2, T=4, sigma2=0.25, name='hop')"
    np.testing.assert_array_equal(model.embeddings(), model.mean)
    s = model.optimizer_state
    assert (s.family, s.iteration, s.seed) == (VMHA, 0, 0)
    est = with_state(model, seed=4).estimator(pseudo_count=1.0)
    assert isinstance(est, VariationalMultiHopAttentionEstimator)
    assert (est.num_symbols, est.embed_dim, est.num_targets, est.sigma2, est.seed, est.name) == (7, 2, 4, 0.25, 4,
                                                                                               "hop")
    assert (est.lr, est.mc, est.prior_strength, est.anneal_iters, est.emission_smoothing) == (0.05, 5, 0.1, 100, 1e-4)
    defaults = VariationalMultiHopAttentionEstimator(7, 2, 4)
    assert (defaults.sigma2, defaults.seed, defaults.pseudo_count, defaults.keys) == (0.3, 0, None, None)
    assert VariationalMultiHopAttentionDistribution(np.zeros((2, 1)), np.zeros((2, 1)),
                                                    np.full((2, 2), 0.5)).sigma2 == 0.3
    enc = model.dist_to_encoder()
    assert isinstance(enc, VariationalMultiHopAttentionDataEncoder)
    assert enc == VariationalMultiHopAttentionDataEncoder(7, 4)
    assert enc != VariationalMultiHopAttentionDataEncoder(7, None)
    assert enc != ChainedAttentionDataEncoder(7, 4)  # the same observations, another family
    assert (enc.num_symbols, enc.num_targets) == (7, 4)
    # It reads chained attention's observations, but its errors name it, from the row lists and from the arrays.
    for bad in ([([0, 1, 7], [1, 2, 0], 2, 1)], (np.array([[0, 1, 7]]), np.array([[1, 2, 0]]), np.array([2]),
                                                np.array([1]))):
        with pytest.raises(ValueError, match=r"^VariationalMultiHopAttentionDataEncoder: out-of-range ID in keys"):
            enc.seq_encode(bad)
    with pytest.raises(ValueError, match=r"^ChainedAttentionDataEncoder: out-of-range ID in keys"):
        ChainedAttentionDataEncoder(7, 4).seq_encode([([0, 1, 7], [1, 2, 0], 2, 1)])
    factory = model.estimator().accumulator_factory()
    assert isinstance(factory, VariationalMultiHopAttentionAccumulatorFactory) and factory.mc == 5
    acc = factory.make()
    assert isinstance(acc, VariationalMultiHopAttentionAccumulator) and acc.acc_to_encoder() == enc
    value = acc.value()
    assert [np.shape(v) for v in value[:5]] == [(7, 2), (7, 2), (7, 4), (), ()] and value[5] is None


def test_vmha_log_density_and_prediction_match_the_two_hop_chain(rng):
    """C-1 for VMHA: seq_log_density equals per-row log_density (rel 1e-12) and the (i, j) sum of
    docs/mechanisms.md#variational-multi-hop-attention; predict_proba rows sum to 1."""
    model = random_vmha(rng, S=7, D=3, T=5)
    rows = model.sampler(seed=2, context_length=5).sample(30)
    enc = model.dist_to_encoder().seq_encode(rows)
    batch = model.seq_log_density(enc)
    np.testing.assert_allclose(batch, [model.log_density(x) for x in rows], rtol=1e-12)
    np.testing.assert_allclose(batch, [vmha_log_p(model, *x) for x in rows], rtol=1e-9)
    keys, values, q, _ = enc
    proba = model.predict_proba(keys, values, q)
    assert proba.shape == (30, 5)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-12)
    for r in range(30):
        np.testing.assert_allclose(proba[r], vmha_proba(model, keys[r], values[r], q[r]), rtol=1e-9, atol=1e-15)
    np.testing.assert_array_equal(model.predict_proba(keys[0], values[0], q[0]), proba[0])
    with pytest.raises(TypeError):
        model.predict_proba(keys, values[0], q)
    with pytest.raises(ValueError):
        model.predict_proba(keys, values[:, :3], q)
    with pytest.raises(ValueError):
        model.predict_proba(keys, values, q[:4])
    with pytest.raises(ValueError, match="out-of-range ID"):
        model.predict_proba(keys + 7, values, q)


def test_vmha_e_step_matches_the_gradient_of_the_log_likelihood(rng):
    """docs/mechanisms.md#variational-multi-hop-attention E-step with a negligible posterior variance: grad_m is the
    gradient of sum_n w_n log p_n (central differences), grad_logv vanishes, emission_count[v_j, t] = sum w r_j, ll and
    n."""
    model = random_vmha(rng, S=6, D=3, T=5, log_var=TINY_LOG_VAR)
    rows = model.sampler(seed=3, context_length=4).sample(20)
    w = rng.random(20)
    w[5] = 0.0
    grad_m, grad_logv, emission_count, ll, n, state = e_step(model, rows, w).value()
    assert state == model.optimizer_state.to_dict()
    np.testing.assert_allclose(grad_m, finite_difference_gradient(vmha_log_p, model, rows, w), rtol=1e-5, atol=1e-7)
    assert np.max(np.abs(grad_logv)) < 1e-9
    expected = np.zeros((6, 5))
    for (k, v, q, t), wn in zip(rows, w):
        joint = vmha_joint(model, k, v, q, t)
        np.add.at(expected, (v, t), wn * joint.sum(axis=0) / joint.sum())
    np.testing.assert_allclose(emission_count, expected, rtol=1e-9, atol=1e-12)
    assert ll == pytest.approx(total_ll(vmha_log_p, model, rows, w, model.mean), rel=1e-9)
    assert n == pytest.approx(w.sum(), rel=1e-12)


def test_vmha_statistics_contract(rng):
    """VMHA-2: merge = concatenation, 1 vs 7 chunks (rel 1e-12), value/from_value round trip and snapshot, zero
    weights and scale, weights [0, 1] = the second row, and states that differ never combine."""
    model = random_vmha(rng)
    rows = model.sampler(seed=4, context_length=5).sample(70)
    w = rng.random(70)
    whole = e_step(model, rows, w)
    part_a, part_b = e_step(model, rows[:30], w[:30]), e_step(model, rows[30:], w[30:])
    assert_values_close(part_a.combine(part_b.value()).value(), whole.value())
    chunked = fresh_accumulator(model)
    for chunk in np.array_split(np.arange(70), 7):
        e_step(model, [rows[i] for i in chunk], w[chunk], acc=chunked)
    assert_values_close(chunked.value(), whole.value())
    snapshot = whole.value()
    copy = VariationalMultiHopAttentionAccumulator(6, 3, 5).from_value(snapshot)
    assert_values_equal(copy.value(), snapshot)
    snapshot[0][...] = 0.0
    assert np.any(whole.value()[0] != 0.0)
    zero = w.copy()
    zero[::2] = 0.0
    kept = [i for i in range(70) if zero[i] > 0]
    assert_values_close(e_step(model, rows, zero).value(), e_step(model, [rows[i] for i in kept], zero[kept]).value())
    assert_values_close(e_step(model, rows, 3.0 * w).value(), e_step(model, rows, w).scale(3.0).value())
    assert_values_close(e_step(model, rows[:2], np.array([0.0, 1.0])).value(), e_step(model, rows[1:2]).value())
    with pytest.raises(ValueError, match=DIFFERENT_STATES):
        whole.combine(e_step(with_state(model, iteration=1), rows).value())
    gm, gl, emission, ll, n, state = whole.value()
    with pytest.raises(ValueError, match="must equal"):
        whole.from_value((gm, gl, emission * 0.9, ll, n, state))
    with pytest.raises(ValueError, match="cannot exceed"):
        whole.combine((gm, gl, emission * 1.1, ll, n, state))
    assert_values_equal(whole.value(), (gm, gl, emission, ll, n, state))


def test_vmha_update_and_initialize(rng):
    model = random_vmha(rng)
    rows = model.sampler(seed=5, context_length=3).sample(4)
    one = fresh_accumulator(model)
    for x in rows:
        one.update(x, 0.5, model)
    assert_values_close(one.value(), e_step(model, rows, np.full(4, 0.5)).value())
    init_one, init_seq = fresh_accumulator(model), fresh_accumulator(model)
    init_one.initialize(rows[0], 2.0, attnmix.Rng(4))
    init_seq.seq_initialize(model.dist_to_encoder().seq_encode(rows[:1]), [2.0], attnmix.Rng(4))
    assert_values_equal(init_one.value(), init_seq.value())
    grad_m, grad_logv, emission_count, ll, n, state = init_one.value()
    assert not grad_m.any() and not grad_logv.any() and (ll, n, state) == (0.0, 2.0, None)
    assert emission_count.sum() == pytest.approx(2.0, rel=1e-12)
    assert emission_count[:, rows[0][3]].sum() == pytest.approx(2.0, rel=1e-12)


def test_vmha_impossible_evidence_fails_before_mutation():
    """VMHA-2 / C-6: a row is impossible when no value emits its target."""
    model, impossible, possible = vmha_impossible_case()
    assert model.log_density(impossible) == -math.inf
    acc = e_step(model, [possible])
    before = acc.value()
    enc = model.dist_to_encoder().seq_encode([possible, impossible, impossible])
    with pytest.raises(ImpossibleEvidenceError) as info:
        acc.seq_update(enc, np.array([1.0, 1.0, 3.0]), model)
    assert info.value.rows == [1, 2] and "encountered impossible evidence at rows [1, 2]" in str(info.value)
    assert_values_equal(acc.value(), before)
    acc.seq_update(enc, np.array([1.0, 0.0, 0.0]), model)
    assert acc.value()[4] == 2.0 and math.isfinite(acc.value()[3])


def test_vmha_estimate_anneals_the_kl_weight(rng):
    """docs/mechanisms.md#variational-multi-hop-attention: one Adam step with lambda_tau = prior_strength * min(1, tau /
    anneal_iters); B smoothed."""
    model = random_vmha(rng)
    rows = model.sampler(seed=6, context_length=4).sample(40)
    est = VariationalMultiHopAttentionEstimator(6, 3, 5, lr=0.2, prior_strength=0.8, anneal_iters=10,
                                                emission_smoothing=1e-3)
    for iteration in (0, 4, 9, 30):
        start = with_state(model, iteration=iteration, seed=2, mean_second_moment=rng.random((6, 3)))
        value = e_step(start, rows).value()
        fit = est.estimate(None, value)
        tau = iteration + 1
        m, lv, m1, m2, v1, v2 = adam_oracle(value[5], value[0], value[1], lr=0.2, kl_weight=0.8 * min(1, tau / 10))
        s = fit.optimizer_state
        assert (s.iteration, s.seed, s.family) == (tau, 2, VMHA)
        for got, expected in ((fit.mean, m), (fit.log_var, lv), (s.mean_first_moment, m1),
                              (s.mean_second_moment, m2), (s.log_var_first_moment, v1),
                              (s.log_var_second_moment, v2)):
            np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(fit.emission, smoothed(value[2], 1e-3), rtol=1e-12)
    assert_same_vmha(est.estimate(None, value), est.estimate(None, value))  # stateless


def test_vmha_initial_estimate_uses_unit_scale(rng):
    """docs/mechanisms.md#variational-multi-hop-attention: the initial means are N(0, 1) from the estimator's seed, log
    v = log 0.3."""
    model = random_vmha(rng, S=40, D=10, T=5)
    acc = fresh_accumulator(model)
    acc.seq_initialize(model.dist_to_encoder().seq_encode(model.sampler(seed=1).sample(30)), np.ones(30), 2)
    init = VariationalMultiHopAttentionEstimator(40, 10, 5, seed=3).estimate(30.0, acc.value())
    assert (init.optimizer_state.iteration, init.optimizer_state.seed) == (0, 3)
    assert 0.85 < np.std(init.mean) < 1.15
    np.testing.assert_array_equal(init.log_var, np.full((40, 10), math.log(0.3)))


def test_vmha_samplers(rng):
    """VMHA-2 / VEA-6: the sampler honours context_length; the plug-in sampler ignores log_var; batches equal
    sequential draws (plug-in and posterior-predictive)."""
    a = random_vmha(rng, log_var=-8.0)
    b = VariationalMultiHopAttentionDistribution(a.mean, np.full(a.mean.shape, 2.0), a.emission, a.sigma2)
    keys, values, q, t = a.sampler(seed=1).sample()
    assert keys.shape == values.shape == (6,) and keys.dtype == np.int64 and type(q) is int and type(t) is int
    for length in (1, 4, 9):
        for k, v, _, _ in VariationalMultiHopAttentionSampler(a, seed=2, context_length=length).sample(5):
            assert k.shape == v.shape == (length,)
    for x, y in zip(a.sampler(seed=3, context_length=4).sample(40), b.sampler(seed=3, context_length=4).sample(40)):
        np.testing.assert_array_equal(x[0], y[0])
        np.testing.assert_array_equal(x[1], y[1])
        assert x[2:] == y[2:]
    for make in (b.sampler, b.posterior_predictive_sampler):
        batch = make(seed=7, context_length=3).sample(6)
        one_by_one = make(seed=7, context_length=3)
        for row in batch:
            k, v, q, t = one_by_one.sample()
            np.testing.assert_array_equal(row[0], k)
            np.testing.assert_array_equal(row[1], v)
            assert row[2:] == (q, t)
    with pytest.raises(ValueError):
        a.sampler(1, context_length=0)
    with pytest.raises(TypeError):
        a.sampler(1, context_length=2.0)
    with pytest.raises(TypeError):
        a.sampler(1, 4)  # context_length is keyword-only
    with pytest.raises(TypeError):
        VariationalMultiHopAttentionSampler(random_vea(rng), 1)
    assert VariationalMultiHopAttentionSampler(a, 1).dist is a


def test_vmha_validation(rng):
    """VMHA-2 / C-5: constructor, estimator (anneal_iters a positive integer), accumulator and encoder."""
    m, lv, B = np.zeros((3, 2)), np.zeros((3, 2)), np.full((3, 2), 0.5)
    Dist = VariationalMultiHopAttentionDistribution
    with pytest.raises(ValueError, match="emission"):
        Dist(m, lv, np.array([[1.1, -0.1], [0.5, 0.5], [0.5, 0.5]]))
    with pytest.raises(ValueError):
        Dist(m, lv[:, :1], B)
    with pytest.raises(ValueError):
        Dist(m, np.full((3, 2), 800.0), B)
    with pytest.raises(TypeError):
        Dist(m > 0, lv, B)
    with pytest.raises(ValueError):
        Dist(m, lv, B, sigma2=0.0)
    with pytest.raises(ValueError):
        Dist(m, lv, B, optimizer_state=AttentionOptimizerState.fresh(VEA, m, lv))  # another family
    for kwargs, error in (({"anneal_iters": 0}, ValueError), ({"anneal_iters": 2.0}, TypeError),
                          ({"anneal_iters": True}, TypeError), ({"mc": 0}, ValueError), ({"lr": 0.0}, ValueError),
                          ({"prior_strength": -0.1}, ValueError), ({"seed": -1}, ValueError),
                          ({"sigma2": True}, TypeError)):
        with pytest.raises(error):
            VariationalMultiHopAttentionEstimator(3, 2, 2, **kwargs)
    for args, error in (((0, 2, 2), ValueError), ((3, 2.0, 2), TypeError), ((3, 2, True), TypeError)):
        for cls in (VariationalMultiHopAttentionEstimator, VariationalMultiHopAttentionAccumulator,
                    VariationalMultiHopAttentionAccumulatorFactory):
            with pytest.raises(error):
                cls(*args)
    model = random_vmha(rng, S=5, T=4)
    enc = model.dist_to_encoder()
    for bad in (([0, 5], [1, 2], 0, 1), ([0, 1], [1, 2], 0, 4), ([0, -1], [1, 2], 0, 1)):
        with pytest.raises(ValueError, match="out-of-range ID"):
            enc.seq_encode([bad])
    with pytest.raises(ValueError, match="exact integer"):
        enc.seq_encode([([0, 1.5], [1, 2], 0, 1)])
    with pytest.raises(TypeError, match=CA_QUADRUPLES):
        enc.seq_encode([([0, 1], [1, 2], 0)])
    with pytest.raises(ValueError):
        enc.seq_encode([([0, 1], [1], 0, 1)])


def test_vmha_fits_continues_composes_and_is_deterministic(rng):
    """optimize fits VMHA (also in a mixture with keyed tying); two fits are bitwise identical; prev_estimate
    continues the state; 1 and 3 threads agree bitwise."""
    truth = random_vmha(rng, S=8, D=3, T=6)
    rows = truth.sampler(seed=8, context_length=4).sample(2500)
    est = VariationalMultiHopAttentionEstimator(8, 3, 6, mc=1)
    a = optimize(rows, est, max_its=2, delta=None, rng=1, out=None, num_threads=1)
    b = optimize(rows, est, max_its=2, delta=None, rng=1, out=None, num_threads=3)
    assert isinstance(a, VariationalMultiHopAttentionDistribution)
    assert_same_vmha(a, b)
    resumed = optimize(rows, est, max_its=2, delta=None, prev_estimate=a, out=None)
    iterates = [a]
    for _ in range(2):
        iterates.append(est.estimate(None, e_step(iterates[-1], rows, acc=est.accumulator_factory().make()).value()))
    matches = [k for k, m in enumerate(iterates) if m.optimizer_state == resumed.optimizer_state]
    assert matches, "optimize(prev_estimate=...) re-initialised the embeddings"
    assert_same_vmha(resumed, iterates[matches[0]])
    assert resumed.optimizer_state.iteration == a.optimizer_state.iteration + matches[0]
    tied = VariationalMultiHopAttentionEstimator(8, 3, 6, mc=1, keys="hop")
    fit = optimize(rows[:300], MixtureEstimator([tied, tied]), max_its=2, delta=None, rng=2, out=None)
    assert_same_vmha(fit.components[0], fit.components[1])


def test_vmha_model_files_and_pickling(rng, tmp_path):
    """F-7 for VMHA: save -> load bit-identical (family variational_multihop_attention, state included); pickling."""
    model = with_state(random_vmha(rng, name="hop"), iteration=5, seed=3)
    path = tmp_path / "vmha.json"
    save_model(model, path)
    doc = json.loads(path.read_text())
    assert (doc["family"], doc["name"]) == (VMHA, "hop")
    assert set(doc["params"]) >= {"mean", "log_var", "emission", "sigma2"}
    assert AttentionOptimizerState.from_dict(doc["optimizer_state"]) == model.optimizer_state
    loaded = load_model(path)
    assert isinstance(loaded, VariationalMultiHopAttentionDistribution)
    assert_same_vmha(loaded, model)
    copy = pickle.loads(pickle.dumps(model))
    assert isinstance(copy, VariationalMultiHopAttentionDistribution)
    assert_same_vmha(copy, model)
    assert str(copy) == str(model)
