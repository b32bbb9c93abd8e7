# SPDX-License-Identifier: Apache-2.0
"""numpy in and out: every accepted dtype, shape and memory layout (C, Fortran, strided, byte-swapped) reads the
same values; encoded batches are immutable views; statistics and parameters come back in the documented layouts."""
import numpy as np
import pytest

from attnmix import ResponsibilityAttentionDataEncoder, ResponsibilityAttentionDistribution
from helpers import model_data, random_model

S, N, D, T = 5, 4, 3, 6


@pytest.fixture
def data(rng):
    model = random_model(rng, S=S, N=N, D=D, T=T)
    rows = model_data(model, 12, seed=21)
    ctx = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows])
    t = np.array([r[2] for r in rows])
    return model, ctx, y, t


def assert_batch(batch, ctx, y, t):
    got_ctx, got_y, got_t = batch
    assert (got_ctx.dtype, got_y.dtype, got_t.dtype) == (np.int64, np.float64, np.int64)
    np.testing.assert_array_equal(got_ctx, ctx)
    np.testing.assert_array_equal(got_y, y)
    np.testing.assert_array_equal(got_t, t)


@pytest.mark.parametrize("id_dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                      np.uint64, np.float16, np.float32, np.float64, np.longdouble, object])
def test_id_dtypes(data, id_dtype):
    model, ctx, y, t = data
    enc = model.dist_to_encoder()
    assert_batch(enc.seq_encode((ctx.astype(id_dtype), y, t.astype(id_dtype))), ctx, y, t)


@pytest.mark.parametrize("real_dtype", [np.float16, np.float32, np.float64, np.longdouble, np.int32, np.int64])
def test_real_dtypes(data, real_dtype):
    model, ctx, y, t = data
    y = y.astype(real_dtype)
    assert_batch(model.dist_to_encoder().seq_encode((ctx, y, t)), ctx, y.astype(np.float64), t)


def test_memory_layouts(data):
    model, ctx, y, t = data
    enc = model.dist_to_encoder()
    fortran = (np.asfortranarray(ctx), np.asfortranarray(y), t)
    assert not fortran[0].flags.c_contiguous and not fortran[1].flags.c_contiguous
    assert_batch(enc.seq_encode(fortran), ctx, y, t)
    wide_ctx = np.repeat(ctx, 2, axis=1)  # every other column is a strided view of ctx
    wide_y = np.zeros((2 * len(y), D))
    wide_y[::2] = y
    strided = (wide_ctx[:, ::2], wide_y[::2], np.repeat(t, 3)[::3])
    assert not strided[0].flags.c_contiguous and not strided[1].flags.c_contiguous
    assert_batch(enc.seq_encode(strided), ctx, y, t)
    transposed = (np.ascontiguousarray(ctx.T).T, np.ascontiguousarray(y.T).T, t)
    assert_batch(enc.seq_encode(transposed), ctx, y, t)
    swapped = (ctx.astype(">i8"), y.astype(">f8"), t.astype(">i4"))
    assert_batch(enc.seq_encode(swapped), ctx, y, t)
    reversed_rows = (ctx[::-1], y[::-1], t[::-1])
    assert_batch(enc.seq_encode(reversed_rows), ctx[::-1], y[::-1], t[::-1])


def test_lists_and_arrays_encode_alike(data):
    model, ctx, y, t = data
    enc = model.dist_to_encoder()
    from_arrays = enc.seq_encode((ctx, y, t))
    from_triples = enc.seq_encode([(c, q, int(target)) for c, q, target in zip(ctx, y, t)])
    from_lists = enc.seq_encode([(c.tolist(), q.tolist(), int(target)) for c, q, target in zip(ctx, y, t)])
    from_tuples = enc.seq_encode(tuple((tuple(c), tuple(q), np.int32(target)) for c, q, target in zip(ctx, y, t)))
    for batch in (from_triples, from_lists, from_tuples):
        assert_batch(batch, *from_arrays)
    np.testing.assert_array_equal(model.seq_log_density(from_arrays), model.seq_log_density(from_triples))
    np.testing.assert_array_equal(model.seq_log_density((ctx, y, t)), model.seq_log_density(from_arrays))


def test_encoded_batch_is_an_immutable_tuple_of_views(data):
    model, ctx, y, t = data
    batch = model.dist_to_encoder().seq_encode((ctx, y, t))
    assert len(batch) == 3 and batch.n_rows == 12
    c, q, target = batch
    for part in (c, q, target, batch[0], batch[-1]):
        assert not part.flags.writeable
        with pytest.raises(ValueError):
            part[...] = 0
    assert [p.shape for p in batch[:2]] == [(12, N), (12, D)]
    assert all(part.base is not None for part in batch)  # views of the batch's own storage, no copies
    ctx[0, 0] = (ctx[0, 0] + 1) % S  # the batch owns its data: changing the input changes nothing
    assert batch[0][0, 0] != ctx[0, 0]
    assert model.dist_to_encoder().seq_encode(batch) is batch  # validated already: passes through
    del batch
    assert q.sum() == pytest.approx(y.sum())  # views keep the batch alive


def test_empty_batches(data):
    model, ctx, y, t = data
    enc = model.dist_to_encoder()
    empty = enc.seq_encode([])
    assert [p.shape for p in empty] == [(0, N), (0, D), (0,)]
    assert model.seq_log_density(empty).shape == (0,)
    arrays = enc.seq_encode((ctx[:0], y[:0], t[:0]))
    assert arrays.n_rows == 0
    assert ResponsibilityAttentionDataEncoder().seq_encode([]).n_rows == 0


def test_weights_dtypes_and_layouts(data):
    model, ctx, y, t = data
    batch = model.dist_to_encoder().seq_encode((ctx, y, t))
    w = np.arange(12) * 0.25  # exact in every float width
    reference = model.estimator().accumulator_factory().make()
    reference.seq_update(batch, w, model)
    for other in (w.astype(np.float32), w.astype(np.float16), np.repeat(w, 2)[::2], w.astype(">f8"), list(w),
                  tuple(float(x) for x in w)):
        acc = model.estimator().accumulator_factory().make()
        acc.seq_update(batch, other, model)
        for a, b in zip(acc.value(), reference.value()):
            np.testing.assert_array_equal(a, b)
    acc = model.estimator().accumulator_factory().make()
    acc.seq_update(batch, np.ones(12, dtype=np.int32), model)  # integer weights are reals
    assert acc.value()[3].sum() == pytest.approx(12.0)


def test_statistics_round_trip_through_other_dtypes(data):
    model, ctx, y, t = data
    acc = model.estimator().accumulator_factory().make()
    acc.seq_update((ctx, y, t), np.ones(12), model)
    value = acc.value()
    assert [v.dtype for v in value[:4]] == [np.float64] * 4 and type(value[4]) is float
    as_lists = tuple(v.tolist() if isinstance(v, np.ndarray) else v for v in value)
    as_fortran = tuple(np.asfortranarray(v) if isinstance(v, np.ndarray) else np.float64(v) for v in value)
    for other in (as_lists, as_fortran, list(value), value[:4] + (np.array(value[4]),)):
        copy = model.estimator().accumulator_factory().make().from_value(other)
        for a, b in zip(copy.value(), value):
            np.testing.assert_array_equal(a, b)


def test_parameters_are_read_only_views(rng):
    K = rng.standard_normal((S, D))
    B = rng.dirichlet(np.ones(T), size=S)
    pi = rng.dirichlet(np.ones(N))
    model = ResponsibilityAttentionDistribution(np.asfortranarray(K), B.astype(np.float64), list(pi), 0.5)
    np.testing.assert_array_equal(model.key_means, K)
    np.testing.assert_array_equal(model.emission, B)
    np.testing.assert_array_equal(model.position_prior, pi)
    assert model.key_means.flags.c_contiguous
    for array in (model.key_means, model.emission, model.position_prior, model.log_position_prior):
        assert not array.flags.writeable
    K[0, 0] += 1.0  # the model copied its parameters
    assert model.key_means[0, 0] != K[0, 0]
    keys = model.key_means
    del model
    assert keys.shape == (S, D)  # a view keeps its model alive


def test_predict_proba_accepts_any_layout(data):
    model, ctx, y, t = data
    expected = model.predict_proba(ctx, y)
    np.testing.assert_array_equal(model.predict_proba(np.asfortranarray(ctx.astype(np.int32)), y.T.copy().T), expected)
    np.testing.assert_array_equal(model.predict_proba(ctx.tolist(), y.tolist()), expected)
    np.testing.assert_array_equal(model.predict_proba(ctx[3], y[3]), expected[3])
