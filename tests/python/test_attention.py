# SPDX-License-Identifier: Apache-2.0
"""Responsibility attention through the Python API: the unit acceptance rows (RA-1..RA-4, RA-7, RA-8, RA-10,
RA-11, RA-13) and the shared contract (C-1..C-7) for RA, against numpy oracles."""
import io
import math
import pickle
from copy import deepcopy

import numpy as np
import pytest

import attnmix
from attnmix import (
    ImpossibleEvidenceError,
    MixtureEstimator,
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionAccumulatorFactory,
    ResponsibilityAttentionDataEncoder,
    ResponsibilityAttentionDistribution,
    ResponsibilityAttentionEstimator,
    ResponsibilityAttentionSampler,
    optimize,
    sequence_to_triples,
)
from helpers import D, N, S, T, as_triples, impossible_case, model_data, random_model, recall_task


def direct_log_density(model, ctx, y, t):
    """Oracle: log sum_i pi_i N(y; K[c_i], sigma2 I) B[c_i, t], written from the generative story."""
    K, B, pi, s2 = model.key_means, model.emission, model.position_prior, model.sigma2
    sq = np.sum((y - K[ctx]) ** 2, axis=1)
    dens = pi * np.exp(-sq / (2 * s2)) / (2 * np.pi * s2) ** (len(y) / 2) * B[ctx, t]
    return math.log(np.sum(dens))


def fresh_accumulator(model):
    return model.estimator().accumulator_factory().make()


# ---- the distribution -------------------------------------------------------------------------------------------


def test_log_density_matches_generative_story(rng):
    model = random_model(rng)
    for ctx, y, t in model_data(model, 20, seed=3):
        assert model.log_density((ctx, y, t)) == pytest.approx(direct_log_density(model, ctx, y, t), rel=1e-12)
        assert model.density((ctx, y, t)) == pytest.approx(math.exp(direct_log_density(model, ctx, y, t)), rel=1e-11)


def test_attributes_follow_spec(rng):
    model = random_model(rng, S=5, N=4, D=3, T=6, sigma2=0.25, name="head")
    assert (model.num_symbols, model.context_length, model.query_dim, model.num_targets) == (5, 4, 3, 6)
    assert model.key_means.shape == (5, 3) and model.emission.shape == (5, 6) and model.position_prior.shape == (4,)
    assert model.sigma2 == 0.25 and model.name == "head"
    np.testing.assert_allclose(model.log_position_prior, np.log(model.position_prior), rtol=1e-15)
    assert model.gate_const == pytest.approx(-0.5 * 3 * math.log(2 * math.pi * 0.25), rel=1e-15)
    assert str(model) == "ResponsibilityAttentionDistribution(S=5, N=4, D=3, T=6, sigma2=0.25, name='head')"
    assert str(random_model(rng, sigma2=1.0)).endswith("sigma2=1.0, name=None)")


def test_missing_position_prior_has_the_reference_message():
    with pytest.raises(ValueError, match=r"^position_prior \(length = context length N\) is required\.$"):
        ResponsibilityAttentionDistribution(np.zeros((2, 1)), np.full((2, 2), 0.5))


def test_estimator_of_a_model_keeps_its_sigma2_and_name(rng):
    model = random_model(rng, sigma2=0.3, name="m")
    est = model.estimator(pseudo_count=2.0)
    assert isinstance(est, ResponsibilityAttentionEstimator)
    assert (est.num_symbols, est.context_length, est.query_dim, est.num_targets) == (5, 4, 3, 6)
    assert est.sigma2 == 0.3 and est.name == "m" and not est.estimate_sigma2 and est.pseudo_count == 2.0
    assert model.dist_to_encoder() == ResponsibilityAttentionDataEncoder(5, 4, 3, 6)
    assert model.dist_to_encoder() != ResponsibilityAttentionDataEncoder(5, 4, 3, None)


def test_models_pickle_through_their_params(rng):
    model = random_model(rng, name="p")
    copy = pickle.loads(pickle.dumps(model))
    assert isinstance(copy, ResponsibilityAttentionDistribution)
    for field in ("key_means", "emission", "position_prior"):
        np.testing.assert_array_equal(getattr(copy, field), getattr(model, field))
    assert (copy.sigma2, copy.name) == (model.sigma2, model.name)
    np.testing.assert_array_equal(deepcopy(model).emission, model.emission)


# ---- RA-1 .. RA-4 -----------------------------------------------------------------------------------------------


def test_encoder_and_sampler_shapes(rng):
    """RA-1: encoder shapes (8,N), (8,D), (8,); the sampler gives 5 samples with context length N, query length
    D and an int target."""
    model = random_model(rng, S=S, N=N, D=D, T=T)
    rows = model_data(model, 8, seed=1)
    ctx, y, t = ResponsibilityAttentionDataEncoder(S, N, D, T).seq_encode(rows)
    assert (ctx.shape, y.shape, t.shape) == ((8, N), (8, D), (8,))
    assert (ctx.dtype, y.dtype, t.dtype) == (np.int64, np.float64, np.int64)
    samples = ResponsibilityAttentionSampler(model, seed=4).sample(5)
    assert len(samples) == 5
    for c, q, target in samples:
        assert c.shape == (N,) and q.shape == (D,) and type(target) is int
        assert len(set(c.tolist())) == N  # N <= S: drawn without replacement


def test_sample_of_size_equals_consecutive_draws(rng):
    model = random_model(rng)
    batch = model.sampler(seed=9).sample(4, batched=True)
    sampler = model.sampler(seed=9)
    for row in batch:
        c, q, t = sampler.sample()
        np.testing.assert_array_equal(row[0], c)
        np.testing.assert_array_equal(row[1], q)
        assert row[2] == t


def test_combine_value_doubles_key_mass(rng):
    """RA-2: combine(value) doubles key_mass."""
    model = random_model(rng)
    acc = fresh_accumulator(model)
    acc.seq_update(model.dist_to_encoder().seq_encode(model_data(model, 30, seed=2)), np.ones(30), model)
    key_mass = acc.value()[1]
    acc.combine(acc.value())
    np.testing.assert_array_equal(acc.value()[1], 2 * key_mass)


def test_predict_proba_rows_sum_to_one(rng):
    """RA-3: predict_proba shape (8, T), rows sum to 1 (1e-9); it equals sum_i a_i B[c_i] computed directly."""
    model = random_model(rng, S=S, N=N, D=D, T=T)
    ctx, y, _ = ResponsibilityAttentionDataEncoder().seq_encode(model_data(model, 8, seed=5))
    proba = model.predict_proba(ctx, y)
    assert proba.shape == (8, T)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-9)
    K, B, pi = model.key_means, model.emission, model.position_prior
    log_a = np.log(pi) - np.sum((y[:, None, :] - K[ctx]) ** 2, axis=2) / (2 * model.sigma2)
    a = np.exp(log_a - log_a.max(axis=1, keepdims=True))
    a /= a.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(proba, np.einsum("ni,nit->nt", a, B[ctx]), rtol=1e-12, atol=1e-15)
    single = model.predict_proba(ctx[0], y[0])
    assert single.shape == (T,)
    np.testing.assert_array_equal(single, proba[0])


def test_fixed_sigma2_is_returned_exactly(rng):
    """RA-4: an estimator with sigma2=0.42 (not learned) returns exactly 0.42."""
    model = random_model(rng, S=S, N=N, D=D, T=T)
    est = ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.42)
    acc = est.accumulator_factory().make()
    acc.seq_update(model.dist_to_encoder().seq_encode(model_data(model, 50, seed=6)), np.ones(50), model)
    assert est.estimate(None, acc.value()).sigma2 == 0.42


def test_estimate_matches_closed_form(rng):
    """The M-step of docs/mechanisms.md#responsibility-attention against numpy."""
    model = random_model(rng)
    acc = fresh_accumulator(model)
    acc.seq_update(model.dist_to_encoder().seq_encode(model_data(model, 200, seed=7)), np.ones(200), model)
    key_sum, key_mass, emission_count, position_count, query_sq = acc.value()
    est = ResponsibilityAttentionEstimator(5, 4, 3, 6, estimate_sigma2=True, emission_smoothing=1e-3)
    fit = est.estimate(None, acc.value())
    np.testing.assert_allclose(fit.key_means, key_sum / key_mass[:, None], rtol=1e-12)
    counts = emission_count + 1e-3
    np.testing.assert_allclose(fit.emission, counts / counts.sum(axis=1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(fit.position_prior, position_count / position_count.sum(), rtol=1e-12)
    scatter = query_sq - np.sum(np.sum(key_sum**2, axis=1) / key_mass)
    assert fit.sigma2 == pytest.approx(scatter / (3 * key_mass.sum()), rel=1e-10)


# ---- RA-7, RA-8, RA-10 ------------------------------------------------------------------------------------------


def manual_em_log_likelihoods(estimator, data, iterations, seed):
    """docs/mechanisms.md#training by hand: seq_initialize, then E-step / M-step pairs, recording each model's
    log-likelihood."""
    enc = estimator.accumulator_factory().make().acc_to_encoder().seq_encode(data)
    n = enc.n_rows
    acc = estimator.accumulator_factory().make()
    acc.seq_initialize(enc, np.ones(n), attnmix.Rng(seed))
    model = estimator.estimate(float(n), acc.value())
    lls = []
    for _ in range(iterations):
        acc = estimator.accumulator_factory().make()
        acc.seq_update(enc, np.ones(n), model)
        model = estimator.estimate(None, acc.value())
        lls.append(float(np.sum(model.seq_log_density(enc))))
    return lls


def test_em_is_monotone(rng):
    """RA-7: EM is monotone on 1500 observations over 15 manual iterations (within 1e-3)."""
    data, _ = recall_task(1500, rng)
    lls = manual_em_log_likelihoods(ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.5), data, 15, seed=1)
    assert all(b >= a - 1e-3 for a, b in zip(lls, lls[1:])), lls


def test_sigma2_learning_em_is_monotone(rng):
    """RA-10: sigma2-learning EM is monotone over 12 iterations (within 1e-3)."""
    data, _ = recall_task(1500, rng)
    est = ResponsibilityAttentionEstimator(S, N, D, T, estimate_sigma2=True)
    lls = manual_em_log_likelihoods(est, data, 12, seed=2)
    assert all(b >= a - 1e-3 for a, b in zip(lls, lls[1:])), lls


def test_fits_inside_two_component_mixture(rng):
    """RA-8: fits inside a 2-component MixtureEstimator for 10 iterations: finite LL, weights sum to 1."""
    data, _ = recall_task(1000, rng)
    est = ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.5)
    out = io.StringIO()
    fit = optimize(as_triples(data), MixtureEstimator([est, est]), max_its=10, rng=3, out=out)
    lines = out.getvalue().splitlines()
    assert lines and all(math.isfinite(float(line.split("=")[1].split(",")[0])) for line in lines)
    assert isinstance(fit, attnmix.MixtureDistribution) and fit.num_components == 2
    assert sum(fit.w) == pytest.approx(1.0, abs=1e-6)
    assert all(isinstance(c, ResponsibilityAttentionDistribution) for c in fit.components)


# ---- RA-11 ------------------------------------------------------------------------------------------------------


def test_sequence_to_triples():
    """RA-11: context [5, 1, 3], target 2, one-hot of 3; 4 triples; embedding queries."""
    tokens = [5, 1, 3, 2, 0, 4, 1]
    triples = sequence_to_triples(tokens, 3)
    assert len(triples) == 4
    ctx, query, target = triples[0]
    np.testing.assert_array_equal(ctx, [5, 1, 3])
    assert target == 2 and type(target) is int
    np.testing.assert_array_equal(query, np.eye(6)[3])
    assert triples[3][2] == 1
    embeddings = np.stack([np.arange(6.0), -np.arange(6.0)], axis=1)
    embedded = sequence_to_triples(np.array(tokens), 3, embeddings=embeddings)
    np.testing.assert_array_equal(embedded[1][1], [2.0, -2.0])  # triple 1's current token is tokens[3] = 2
    assert sequence_to_triples([1, 2], 3) == []
    assert len(sequence_to_triples(tokens, 3, num_symbols=9)[0][1]) == 9
    with pytest.raises(ValueError, match="out-of-range ID"):
        sequence_to_triples(tokens, 3, num_symbols=5)
    with pytest.raises(ValueError, match=r"^tokens must be a 1-D sequence\.$"):
        sequence_to_triples([[1, 2], [3, 4]], 1)
    with pytest.raises(ValueError, match=r"^tokens must be a 1-D sequence\.$"):
        sequence_to_triples(5, 1)
    with pytest.raises(ValueError):
        sequence_to_triples(tokens, 3, embeddings=np.zeros((3, 2)))  # fewer rows than S
    with pytest.raises(TypeError):
        sequence_to_triples(np.array([True, False]), 1)
    with pytest.raises(ValueError):
        sequence_to_triples([1.5, 2.0], 1)
    with pytest.raises(TypeError):
        sequence_to_triples(tokens, 3.0)


# ---- RA-13 ------------------------------------------------------------------------------------------------------


def test_invalid_parameters_and_ids_raise_documented_errors():
    """RA-13: non-simplex emission, fractional / negative / out-of-range ids, bool ids."""
    K, pi = np.zeros((2, 1)), np.array([0.5, 0.5])
    with pytest.raises(ValueError, match="emission"):
        ResponsibilityAttentionDistribution(K, np.array([[0.5, 0.5], [1.1, -0.1]]), pi)
    with pytest.raises(ValueError, match="1e-12"):
        ResponsibilityAttentionDistribution(K, np.array([[0.5, 0.5], [0.5, 0.5 + 1e-9]]), pi)
    with pytest.raises(ValueError):
        ResponsibilityAttentionDistribution(K, np.full((2, 2), 0.5), pi, sigma2=0.0)
    with pytest.raises(TypeError):
        ResponsibilityAttentionDistribution(K, np.full((2, 2), 0.5), pi, sigma2=True)
    with pytest.raises(TypeError):
        ResponsibilityAttentionDistribution(K.astype(complex), np.full((2, 2), 0.5), pi)
    with pytest.raises(ValueError):
        ResponsibilityAttentionDistribution(np.array([[np.nan], [0.0]]), np.full((2, 2), 0.5), pi)
    model = ResponsibilityAttentionDistribution(K, np.full((2, 2), 0.5), pi)
    enc = model.dist_to_encoder()
    with pytest.raises(ValueError, match="out-of-range ID"):
        enc.seq_encode([([0, 2], [0.0], 1)])
    with pytest.raises(ValueError, match="out-of-range ID"):
        enc.seq_encode([([0, -1], [0.0], 1)])
    with pytest.raises(ValueError, match="out-of-range ID"):
        enc.seq_encode([([0, 1], [0.0], 2)])
    with pytest.raises(ValueError):
        enc.seq_encode([([0.0, 1.5], [0.0], 1)])
    with pytest.raises(TypeError):
        enc.seq_encode([(np.array([True, False]), [0.0], 1)])
    with pytest.raises(ValueError):
        enc.seq_encode([([0, 1, 1], [0.0], 1)])  # N = 3, declared 2
    with pytest.raises(ValueError):
        enc.seq_encode([([0, 1], [0.0, 1.0], 1)])  # D = 2, declared 1
    with pytest.raises(TypeError, match="^attention observations must be context/query/target triples$"):
        enc.seq_encode([([0, 1], [0.0])])
    ctx, y, t = enc.seq_encode([([0.0, 1.0], [0.0], 1.0)])  # integral floats are ids
    np.testing.assert_array_equal(ctx, [[0, 1]])


def test_zero_prior_position_gives_impossible_evidence():
    """RA-13 / docs/mechanisms.md#responsibility-attention reference case: -inf density, ImpossibleEvidenceError listing
    the row, nothing changed; zero-weight impossible rows are accepted."""
    model, obs = impossible_case()
    assert model.log_density(obs) == -math.inf
    assert model.density(obs) == 0.0
    acc = fresh_accumulator(model)
    acc.update((np.array([1, 1]), np.array([0.3]), 0), 1.0, model)
    before = acc.value()
    with pytest.raises(ImpossibleEvidenceError) as info:
        acc.update(obs, 1.0, model)
    assert isinstance(info.value, ValueError)
    assert info.value.rows == [0]
    assert "encountered impossible evidence at rows [0]" in str(info.value)
    for a, b in zip(acc.value(), before):
        np.testing.assert_array_equal(a, b)
    enc = model.dist_to_encoder().seq_encode([(np.array([1, 1]), np.array([0.3]), 0), obs, obs])
    with pytest.raises(ImpossibleEvidenceError) as info:
        acc.seq_update(enc, np.array([1.0, 2.0, 0.5]), model)
    assert info.value.rows == [1, 2]
    acc.seq_update(enc, np.array([1.0, 0.0, 0.0]), model)  # zero weights: allowed
    assert acc.value()[3].sum() == pytest.approx(before[3].sum() + 1.0)
    np.testing.assert_array_equal(model.seq_log_density(enc)[1:], [-math.inf, -math.inf])


# ---- the shared contract for RA --------------------------------------------------------------------------------


def test_batch_log_density_equals_per_row(rng):
    """C-1: seq_log_density equals per-row log_density (atol 1e-10)."""
    model = random_model(rng)
    rows = model_data(model, 40, seed=11)
    batch = model.seq_log_density(model.dist_to_encoder().seq_encode(rows))
    np.testing.assert_allclose(batch, [model.log_density(x) for x in rows], rtol=0, atol=1e-10)


def test_merge_equals_concatenation(rng):
    """C-2: acc(A u B) equals acc(A) combined with acc(B) (rel 1e-12)."""
    model = random_model(rng)
    rows = model_data(model, 60, seed=12)
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
    enc = model.dist_to_encoder().seq_encode(model_data(model, 20, seed=13))
    acc = fresh_accumulator(model)
    acc.seq_update(enc, np.ones(20), model)
    snapshot = acc.value()
    kept = [np.array(x, copy=True) for x in snapshot]
    snapshot[0][...] = 99.0  # writable copies, not views
    acc.seq_update(enc, np.ones(20), model)
    np.testing.assert_array_equal(acc.value()[1], 2 * kept[1])
    other = fresh_accumulator(model).from_value(acc.value())
    for a, b in zip(other.value(), acc.value()):
        np.testing.assert_array_equal(a, b)


def test_zero_weights_and_scale(rng):
    """C-4: zero weights contribute nothing; weights x c gives every field x c (scale)."""
    model = random_model(rng)
    enc = model.dist_to_encoder().seq_encode(model_data(model, 30, seed=14))
    w = rng.random(30)
    w[::3] = 0.0
    full, kept, scaled = (fresh_accumulator(model) for _ in range(3))
    full.seq_update(enc, w, model)
    rows = [i for i in range(30) if w[i] > 0]
    kept.seq_update(model.dist_to_encoder().seq_encode([tuple(np.asarray(p)[i] for p in enc) for i in rows]),
                    w[rows], model)
    for a, b in zip(full.value(), kept.value()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    scaled.seq_update(enc, 2.5 * w, model)
    full.scale(2.5)
    for a, b in zip(full.value(), scaled.value()):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)


def test_mass_law_violations_raise(rng):
    """C-7: mass-law violations in combine / from_value / estimate ("cannot exceed" / "must equal")."""
    model = random_model(rng)
    acc = fresh_accumulator(model)
    acc.seq_update(model.dist_to_encoder().seq_encode(model_data(model, 10, seed=15)), np.ones(10), model)
    key_sum, key_mass, emission, position, query_sq = acc.value()
    with pytest.raises(ValueError, match="cannot exceed"):
        acc.combine((key_sum, key_mass * 1.01, emission, position, query_sq))
    with pytest.raises(ValueError, match="must equal"):
        acc.from_value((key_sum, key_mass, emission * 0.99, position, query_sq))
    est = model.estimator()
    with pytest.raises(ValueError, match="must equal"):
        est.estimate(11.0, acc.value())
    with pytest.raises(ValueError, match="cannot exceed"):
        est.estimate(9.0, acc.value())
    assert est.estimate(10.0, acc.value()).num_symbols == 5


def test_accumulator_constructors_and_factory():
    acc = ResponsibilityAttentionAccumulator(3, 2, 4, 5, keys="k", name="a")
    assert (acc.num_symbols, acc.context_length, acc.query_dim, acc.num_targets) == (3, 2, 4, 5)
    assert (acc.keys, acc.name) == ("k", "a")
    shapes = [np.shape(v) for v in acc.value()]
    assert shapes == [(3, 4), (3,), (3, 5), (2,), ()]
    factory = ResponsibilityAttentionAccumulatorFactory(3, 2, 4, 5, keys="k", name="a")
    made = factory.make()
    assert isinstance(made, ResponsibilityAttentionAccumulator) and made.keys == "k" and made.name == "a"
    assert made.acc_to_encoder() == ResponsibilityAttentionDataEncoder(3, 2, 4, 5)
    est = ResponsibilityAttentionEstimator(3, 2, 4, 5, name="e", keys="k")
    assert isinstance(est.accumulator_factory(), ResponsibilityAttentionAccumulatorFactory)
    assert est.accumulator_factory().make().name == "e"


# ---- mixed precision (docs/mixed_precision.md) --------------------------------------------------------------------


def test_mixed_precision_log_density_is_within_float_rounding(rng):
    model = random_model(rng, S=9, N=20, D=40, T=7, sigma2=10.0)
    mixed = ResponsibilityAttentionDistribution(model.key_means, model.emission, model.position_prior, 10.0,
                                                precision="mixed")
    assert (model.precision, mixed.precision) == ("float64", "mixed")
    assert str(mixed).endswith("name=None, precision='mixed')")
    data = model_data(model, 200, seed=4)
    for ctx, y, t in data[:20]:
        assert mixed.log_density((ctx, y, t)) == pytest.approx(direct_log_density(model, ctx, y, t), abs=2e-5)


def test_mixed_precision_fit_matches_float64_and_is_thread_count_invariant():
    data, _ = recall_task(3000, np.random.default_rng(8))
    fits = {}
    for precision, threads in (("float64", 1), ("mixed", 1), ("mixed", 2)):
        est = ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.3, precision=precision)
        assert est.precision == precision
        model = optimize(data, est, max_its=8, delta=None, rng=np.random.default_rng(1), num_threads=threads,
                         out=io.StringIO())
        assert model.precision == precision and model.estimator().precision == precision
        fits[precision, threads] = model
    exact, mixed, mixed2 = fits["float64", 1], fits["mixed", 1], fits["mixed", 2]
    for field in ("key_means", "emission", "position_prior"):
        np.testing.assert_array_equal(getattr(mixed2, field), getattr(mixed, field))
        np.testing.assert_allclose(getattr(mixed, field), getattr(exact, field), rtol=1e-4, atol=1e-6)
    copy = pickle.loads(pickle.dumps(mixed))
    assert copy.precision == "mixed"
    np.testing.assert_array_equal(copy.key_means, mixed.key_means)


def test_precision_must_be_a_known_name():
    with pytest.raises(ValueError, match=r"precision must be 'float64' or 'mixed' \(got 'float32'\)"):
        ResponsibilityAttentionEstimator(S, N, D, T, precision="float32")
    with pytest.raises(TypeError, match="precision must be 'float64' or 'mixed'"):
        ResponsibilityAttentionEstimator(S, N, D, T, precision=32)
    with pytest.raises(TypeError):
        ResponsibilityAttentionDistribution(np.zeros((2, 1)), np.full((2, 2), 0.5), np.full(2, 0.5), 1.0, None,
                                            "mixed")  # keyword-only


def test_responsibilities_are_the_posterior_of_the_generative_story(rng):
    """r[n, i] = pi_i N(y; K[c_i], sigma2 I) B[c_i, t] / p(y, t | c), from the formula itself; a row impossible under
    the model (its target emitted by no context symbol) is all zeros."""
    model = random_model(rng)
    rows = model_data(model, 25, seed=4)
    r = model.responsibilities(rows)
    assert r.shape == (25, model.context_length)
    K, B, pi, s2 = model.key_means, model.emission, model.position_prior, model.sigma2
    for n, (ctx, y, t) in enumerate(rows):
        joint = pi * np.exp(-np.sum((y - K[ctx]) ** 2, axis=1) / (2 * s2)) * B[ctx, t]
        np.testing.assert_allclose(r[n], joint / joint.sum(), rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(model.responsibilities(model.dist_to_encoder().seq_encode(rows)), r)
    emission = np.full((3, 2), 0.5)
    emission[:, 1] = [1.0, 1.0, 0.0]
    emission[:, 0] = [0.0, 0.0, 1.0]
    blind = attnmix.ResponsibilityAttentionDistribution(np.zeros((3, 2)), emission, np.array([0.5, 0.5]), sigma2=1.0)
    r = blind.responsibilities([(np.array([0, 1]), np.zeros(2), 0), (np.array([0, 2]), np.zeros(2), 0)])
    np.testing.assert_array_equal(r, [[0.0, 0.0], [0.0, 1.0]])
