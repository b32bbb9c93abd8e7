# SPDX-License-Identifier: Apache-2.0
"""Every documented error (docs/mechanisms.md#building-blocks and #responsibility-attention): the exception translator,
the strict id / real / weight / scalar rules of the conversion layer, statistics validation, and the errors of optimize,
samplers and model files."""
import math
import pickle

import numpy as np
import pytest

import attnmix
from attnmix import (
    CategoricalDistribution,
    ImpossibleEvidenceError,
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionDataEncoder,
    ResponsibilityAttentionDistribution,
    ResponsibilityAttentionEstimator,
    Rng,
    optimize,
)
from helpers import impossible_case, model_data, random_model

TRIPLES = "^attention observations must be context/query/target triples$"


@pytest.fixture
def model(rng):
    return random_model(rng, S=5, N=4, D=3, T=6)


@pytest.fixture
def arrays(model):
    rows = model_data(model, 6, seed=31)
    return np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), np.array([r[2] for r in rows])


# ---- the translator (docs/mechanisms.md#building-blocks) --------------------------------------------------------


@pytest.mark.parametrize(
    "kind, expected",
    [("TypeError", TypeError), ("ValueError", ValueError), ("StateError", RuntimeError),
     ("ImpossibleEvidenceError", ImpossibleEvidenceError)],
)
def test_translator_maps_every_library_error(kind, expected):
    with pytest.raises(expected) as info:
        attnmix._core._raise(kind, "where: what must hold (got this)", [3, 7])
    assert type(info.value) is expected
    if kind == "ImpossibleEvidenceError":
        assert info.value.rows == [3, 7]
        assert str(info.value) == ("where: what must hold (got this) encountered impossible evidence at rows [3, 7]: "
                                   "log p = -inf with positive weight")
    else:
        assert str(info.value) == "where: what must hold (got this)"


def test_impossible_evidence_error_is_a_value_error_that_pickles():
    assert issubclass(ImpossibleEvidenceError, ValueError)
    assert ImpossibleEvidenceError.__module__ == "attnmix"
    error = ImpossibleEvidenceError("rows [1]", [1])
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.rows) == ("rows [1]", [1])


# ---- ids (docs/mechanisms.md#building-blocks) -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["arrays", "triples"])
def test_id_rules(model, arrays, path):
    ctx, y, t = arrays
    enc = model.dist_to_encoder()

    def encode(c, q=y, target=t):
        if path == "arrays":
            return enc.seq_encode((np.asarray(c) if not isinstance(c, np.ndarray) else c, q, target))
        return enc.seq_encode([(c[i], q[i], target[i]) for i in range(len(c))])

    with pytest.raises(TypeError, match="bool"):
        encode(ctx.astype(bool))
    with pytest.raises(TypeError):
        encode(ctx.astype(complex))
    with pytest.raises(TypeError):
        encode(ctx.astype(str))
    with pytest.raises(ValueError, match="exact integer"):
        encode(ctx + 0.5)
    bad = ctx.astype(float)
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="exact integer"):
        encode(bad)
    bad[1, 2] = np.inf
    with pytest.raises(ValueError, match="exact integer"):
        encode(bad)
    with pytest.raises(ValueError, match="out-of-range ID"):
        encode(ctx - 5)
    with pytest.raises(ValueError, match="out-of-range ID"):
        encode(ctx + 5)
    with pytest.raises(ValueError, match="out-of-range ID"):
        encode(ctx, target=t + 6)
    with pytest.raises(ValueError, match="out-of-range ID"):
        encode(ctx.astype(np.uint64) + np.uint64(2**63))
    with pytest.raises(ValueError):
        encode(ctx[:, :3])  # N = 3, declared 4
    encode(ctx.astype(float))  # integral floats are ids


def test_id_rules_for_python_objects(model, arrays):
    ctx, y, t = arrays
    enc = model.dist_to_encoder()
    row = (ctx[0].tolist(), y[0].tolist(), int(t[0]))
    with pytest.raises(TypeError, match="bool"):
        enc.seq_encode([([True, 1, 2, 3], row[1], row[2])])
    with pytest.raises(TypeError, match="bool"):
        enc.seq_encode([(row[0], row[1], True)])
    with pytest.raises(TypeError):
        enc.seq_encode([(["a", 1, 2, 3], row[1], row[2])])
    with pytest.raises(TypeError):
        enc.seq_encode([([None, 1, 2, 3], row[1], row[2])])
    with pytest.raises(TypeError):
        enc.seq_encode([(row[0], row[1], "2")])
    with pytest.raises(TypeError):
        enc.seq_encode([(row[0], row[1], [1])])  # a target must be one id
    with pytest.raises(TypeError):
        enc.seq_encode([([[0, 1], [2]], row[1], row[2])])  # ragged nesting
    with pytest.raises(ValueError, match="contexts must all have the same length .*row 1 has 3"):
        enc.seq_encode([row, ([0, 1, 2], row[1], row[2])])  # contexts of different widths: a shape problem
    with pytest.raises(ValueError, match="out-of-range ID"):
        enc.seq_encode([([2**70, 1, 2, 3], row[1], row[2])])
    with pytest.raises(ValueError):
        enc.seq_encode([(row[0], row[1], 2.5)])
    assert enc.seq_encode([(row[0], row[1], np.float32(2.0))])[2][0] == 2


@pytest.mark.parametrize("bad", [[(1, 2)], [(1, 2, 3, 4)], [{"context": 1}], [5], ["abc"], [None]])
def test_observations_must_be_triples(model, bad):
    with pytest.raises(TypeError, match=TRIPLES):
        model.dist_to_encoder().seq_encode(bad)


def test_data_must_be_a_sequence(model):
    with pytest.raises(TypeError):
        model.dist_to_encoder().seq_encode(5)
    with pytest.raises(TypeError):
        model.dist_to_encoder().seq_encode(None)


def test_array_path_shapes(model, arrays):
    ctx, y, t = arrays
    enc = model.dist_to_encoder()
    with pytest.raises(TypeError):
        enc.seq_encode((ctx, y, t[:, None]))  # targets must be 1-D ids
    with pytest.raises(ValueError):
        enc.seq_encode((ctx, y[:, 0], t))  # queries must be 2-D
    with pytest.raises(ValueError):
        enc.seq_encode((ctx, y[:5], t))  # row counts differ
    with pytest.raises(ValueError):
        enc.seq_encode((ctx, y[:, :2], t))  # D = 2, declared 3


# ---- reals ------------------------------------------------------------------------------------------------------


def test_query_rules(model, arrays):
    ctx, y, t = arrays
    enc = model.dist_to_encoder()
    with pytest.raises(TypeError):
        enc.seq_encode((ctx, y.astype(complex), t))
    with pytest.raises(TypeError, match="bool"):
        enc.seq_encode((ctx, y > 0, t))
    with pytest.raises(TypeError):
        enc.seq_encode([(ctx[0], ["a", "b", "c"], t[0])])
    bad = y.copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        enc.seq_encode((ctx, bad, t))
    with pytest.raises(ValueError):
        enc.seq_encode([(ctx[0], y[0], t[0]), (ctx[1], y[1][:2], t[1])])  # ragged queries


def test_parameter_rules():
    K, B, pi = np.zeros((2, 1)), np.full((2, 2), 0.5), np.array([0.5, 0.5])
    with pytest.raises(TypeError):
        ResponsibilityAttentionDistribution(K.astype(bool), B, pi)
    with pytest.raises(TypeError):
        ResponsibilityAttentionDistribution([["a"], ["b"]], B, pi)
    with pytest.raises(ValueError):
        ResponsibilityAttentionDistribution(np.zeros(2), B, pi)  # not 2-D
    with pytest.raises(ValueError):
        ResponsibilityAttentionDistribution(np.zeros((0, 1)), B, pi)  # empty
    with pytest.raises(ValueError):
        ResponsibilityAttentionDistribution(K, B[:1], pi)  # one emission row per symbol
    with pytest.raises(ValueError):
        ResponsibilityAttentionDistribution(K, B, np.array([0.6, 0.6]))  # not a simplex
    with pytest.raises(ValueError):
        ResponsibilityAttentionDistribution(K, B, np.array([[0.5, 0.5]]))
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            ResponsibilityAttentionDistribution(K, B, pi, sigma2=bad)
    for bad in (True, "1.0", None, [1.0]):
        with pytest.raises(TypeError):
            ResponsibilityAttentionDistribution(K, B, pi, sigma2=bad)
    with pytest.raises(TypeError):
        ResponsibilityAttentionDistribution(K, B, pi, name=3)


# ---- weights ----------------------------------------------------------------------------------------------------


def test_weight_rules(model, arrays):
    batch = model.dist_to_encoder().seq_encode(arrays)
    acc = model.estimator().accumulator_factory().make()
    with pytest.raises(TypeError, match="bool"):
        acc.seq_update(batch, np.ones(6, dtype=bool), model)
    with pytest.raises(TypeError):
        acc.seq_update(batch, ["a"] * 6, model)
    with pytest.raises(TypeError):
        acc.seq_update(batch, np.ones(6, dtype=complex), model)
    with pytest.raises(ValueError, match="shape"):
        acc.seq_update(batch, np.ones(5), model)
    with pytest.raises(ValueError, match="shape"):
        acc.seq_update(batch, np.ones((6, 1)), model)
    with pytest.raises(ValueError, match="shape"):
        acc.seq_update(batch, 1.0, model)
    for bad in (np.nan, np.inf, -1.0):
        w = np.ones(6)
        w[3] = bad
        with pytest.raises(ValueError):
            acc.seq_update(batch, w, model)
    row = tuple(np.asarray(p)[0] for p in batch)
    with pytest.raises(TypeError, match="bool"):
        acc.update(row, True, model)
    with pytest.raises(ValueError):
        acc.update(row, -0.5, model)
    with pytest.raises(ValueError):
        acc.update(row, [1.0], model)
    assert all(np.all(v == 0) for v in acc.value()[:4])  # nothing was added by the failed calls


# ---- scalars ----------------------------------------------------------------------------------------------------


def test_estimator_scalar_rules():
    Est = ResponsibilityAttentionEstimator
    for bad in (True, 2.0, "2", None, np.float64(2.0)):
        with pytest.raises(TypeError):
            Est(bad, 2, 2, 2)
    for bad in (0, -1):
        with pytest.raises(ValueError):
            Est(2, bad, 2, 2)
    assert Est(np.int32(2), np.int64(2), 2, 2).num_symbols == 2
    for bad in (1, 0, "True", None, 1.0):
        with pytest.raises(TypeError):
            Est(2, 2, 2, 2, estimate_sigma2=bad)
    assert Est(2, 2, 2, 2, estimate_sigma2=np.bool_(True)).estimate_sigma2 is True
    with pytest.raises(TypeError):
        Est(2, 2, 2, 2, sigma2=False)
    for name, bad in (("sigma2", 0.0), ("sigma2", math.inf), ("min_sigma2", 0.0), ("min_sigma2", math.nan),
                      ("emission_smoothing", -1e-9), ("emission_smoothing", math.nan)):
        with pytest.raises(ValueError):
            Est(2, 2, 2, 2, **{name: bad})
    assert Est(2, 2, 2, 2, emission_smoothing=0).emission_smoothing == 0.0
    with pytest.raises(TypeError):
        Est(2, 2, 2, 2, name=1)
    with pytest.raises(TypeError):
        Est(2, 2, 2, 2, keys=1)
    with pytest.raises(TypeError):
        Est(2, 2, 2, 2, pseudo_count="x")
    with pytest.raises(TypeError):
        Est(2, 2, 2, 2, 1.0)  # keyword-only options


def test_encoder_and_accumulator_dimension_rules():
    with pytest.raises(TypeError):
        ResponsibilityAttentionDataEncoder(num_symbols=2.0)
    with pytest.raises(TypeError):
        ResponsibilityAttentionDataEncoder(context_length=True)
    with pytest.raises(ValueError):
        ResponsibilityAttentionDataEncoder(query_dim=0)
    with pytest.raises(TypeError):
        ResponsibilityAttentionAccumulator(2, 2, 2.5, 2)
    with pytest.raises(ValueError):
        ResponsibilityAttentionAccumulator(2, 2, 2, -3)


# ---- statistics (docs/mechanisms.md#building-blocks) ------------------------------------------------------------


def test_statistics_validation(model, arrays):
    acc = model.estimator().accumulator_factory().make()
    acc.seq_update(arrays, np.ones(6), model)
    key_sum, key_mass, emission, position, query_sq = acc.value()
    before = acc.value()
    with pytest.raises(ValueError, match="5 entries"):
        acc.combine((key_sum, key_mass, emission, position))
    with pytest.raises(TypeError):
        acc.combine({"key_sum": key_sum})
    with pytest.raises(TypeError):
        acc.combine(3.0)
    with pytest.raises(ValueError, match="shape"):
        acc.combine((key_sum[:, :2], key_mass, emission, position, query_sq))
    with pytest.raises(ValueError, match="shape"):
        acc.from_value((key_sum, key_mass[None, :], emission, position, query_sq))
    with pytest.raises(ValueError, match="shape"):
        acc.from_value((key_sum, key_mass, emission, position, [query_sq]))
    with pytest.raises(TypeError):
        acc.combine((key_sum.astype(complex), key_mass, emission, position, query_sq))
    with pytest.raises(TypeError):
        acc.combine((key_sum, key_mass, emission, position, True))
    bad = key_sum.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        acc.combine((bad, key_mass, emission, position, query_sq))
    with pytest.raises(ValueError, match=">= 0"):
        acc.combine((key_sum, key_mass, emission, position, -1.0))
    negative = emission.copy()
    negative[0, 0] = -1e-3
    negative[0, 1] += 1e-3
    with pytest.raises(ValueError, match=">= 0"):
        acc.from_value((key_sum, key_mass, negative, position, query_sq))
    with pytest.raises(ValueError):
        model.estimator().estimate(None, (key_sum, key_mass, emission, position[:3], query_sq))
    with pytest.raises(TypeError):
        model.estimator().estimate(True, acc.value())
    with pytest.raises(ValueError):
        model.estimator().estimate(-1.0, acc.value())
    with pytest.raises(ValueError):
        acc.scale(-1.0)
    with pytest.raises(ValueError):
        acc.scale(math.nan)
    with pytest.raises(TypeError):
        acc.scale(True)
    for a, b in zip(acc.value(), before):  # every failure left the statistics unchanged
        np.testing.assert_array_equal(a, b)
    other = ResponsibilityAttentionAccumulator(5, 4, 3, 7)
    with pytest.raises(ValueError):
        acc.combine(other)  # another layout
    with pytest.raises(ValueError):
        acc.combine(other.value())


# ---- models, batches and accumulators of other families or dimensions ------------------------------------------


def test_family_and_dimension_mismatches(model, arrays, rng):
    acc = model.estimator().accumulator_factory().make()
    with pytest.raises(TypeError):
        acc.seq_update(arrays, np.ones(6), None)
    with pytest.raises(TypeError):
        acc.seq_update(arrays, np.ones(6), "model")
    categorical = CategoricalDistribution([0.5, 0.5])
    with pytest.raises(TypeError):
        acc.seq_update(arrays, np.ones(6), categorical)
    with pytest.raises(TypeError):
        categorical.seq_log_density(model.dist_to_encoder().seq_encode(arrays))  # a batch of another family
    other = random_model(rng, S=5, N=4, D=3, T=7)
    with pytest.raises(ValueError):
        acc.seq_update(arrays, np.ones(6), other)  # accumulator of T = 6, model of T = 7
    wide = random_model(rng, S=9, N=4, D=3, T=6)
    wide_batch = wide.dist_to_encoder().seq_encode(model_data(wide, 40, seed=2))
    with pytest.raises(ValueError, match="out-of-range ID"):
        model.seq_log_density(wide_batch)
    assert all(np.all(v == 0) for v in acc.value()[:4])


def test_impossible_evidence_in_optimize():
    model, obs = impossible_case()
    with pytest.raises(ImpossibleEvidenceError) as info:
        optimize([(np.array([1, 1]), np.array([0.0]), 0), obs], model.estimator(), prev_estimate=model, out=None)
    assert info.value.rows == [1]


# ---- optimize, samplers, Rng ------------------------------------------------------------------------------------


def test_optimize_argument_rules(model, arrays):
    est = model.estimator()
    with pytest.raises(TypeError):
        optimize(arrays, est, engine="fast")  # reference keywords that attnmix does not support
    with pytest.raises(TypeError):
        optimize(arrays, est, prior=None)
    with pytest.raises(TypeError):
        optimize(arrays, "estimator")
    with pytest.raises(TypeError):
        optimize(arrays, est, prev_estimate="model")
    for name, bad, error in (
        ("max_its", -1, ValueError), ("max_its", 1.0, TypeError), ("max_its", True, TypeError),
        ("delta", "small", TypeError), ("delta", math.nan, ValueError), ("init_p", None, TypeError),
        ("init_p", math.nan, ValueError), ("print_iter", 0, ValueError), ("reuse_estep_ll", 1, TypeError),
        ("num_threads", 0, ValueError), ("num_threads", 2.0, TypeError), ("rng", "seed", TypeError),
        ("rng", -1, ValueError), ("rng", True, TypeError), ("rng", 1.5, TypeError),
    ):
        with pytest.raises(error):
            optimize(arrays, est, out=None, **{name: bad})


def test_sampler_and_rng_rules(model):
    with pytest.raises(TypeError):
        model.sampler("seed")
    with pytest.raises(ValueError):
        model.sampler(-1)
    sampler = model.sampler(1)
    with pytest.raises(ValueError):
        sampler.sample(-1)
    with pytest.raises(TypeError):
        sampler.sample(2.0)
    with pytest.raises(TypeError):
        sampler.sample(2, batched=1)
    with pytest.raises(TypeError):
        attnmix.ResponsibilityAttentionSampler(CategoricalDistribution([1.0]))
    with pytest.raises(ValueError):
        Rng(-1)
    with pytest.raises(TypeError):
        Rng(1.5)
    with pytest.raises(ValueError):
        Rng(1).sample_without_replacement(3, 5)
    with pytest.raises(ValueError):
        Rng(1).uniform_int(0)


def test_model_file_errors(model, tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json"):  # an OSError by errno (test_hardening.py)
        attnmix.load_model(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "attnmix-model", "schema_version": 1, "family": "nope", "params": {}}')
    with pytest.raises(ValueError, match="unknown family"):
        attnmix.load_model(bad)
    bad.write_text("not json")
    with pytest.raises(ValueError):
        attnmix.load_model(str(bad))
    with pytest.raises(TypeError):
        attnmix.save_model("model", tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()
