# SPDX-License-Identifier: Apache-2.0
"""The combinators and classical leaves through Python (docs/mechanisms.md#building-blocks): mixtures, composites,
categorical and diagonal Gaussian leaves, their statistics layouts, keyed tying (F-5) and pickling."""
import io
import json
import math
import pickle

import numpy as np
import pytest

from attnmix import (
    CategoricalAccumulator,
    CategoricalDataEncoder,
    CategoricalDistribution,
    CategoricalEstimator,
    CategoricalSampler,
    ChainedAttentionDistribution,
    CompositeAccumulator,
    CompositeDataEncoder,
    CompositeDistribution,
    CompositeEstimator,
    CompositeSampler,
    DiagonalGaussianAccumulator,
    DiagonalGaussianDataEncoder,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    DiagonalGaussianSampler,
    ImpossibleEvidenceError,
    MixtureAccumulator,
    MixtureDataEncoder,
    MixtureDistribution,
    MixtureEstimator,
    MixtureSampler,
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionDataEncoder,
    ResponsibilityAttentionDistribution,
    ResponsibilityAttentionEstimator,
    Rng,
    optimize,
    save_model,
)
from helpers import D, N, S, T, model_data, random_model, recall_task, run_cli


def test_categorical_leaf(rng):
    dist = CategoricalDistribution([0.2, 0.3, 0.5], name="c")
    assert (dist.num_categories, dist.name) == (3, "c")
    np.testing.assert_array_equal(dist.p, [0.2, 0.3, 0.5])
    assert dist.log_density(2) == pytest.approx(math.log(0.5), rel=1e-15)
    ids = dist.sampler(seed=3).sample(2000)
    assert all(type(i) is int for i in ids)
    np.testing.assert_allclose(np.bincount(ids, minlength=3) / 2000, [0.2, 0.3, 0.5], atol=0.05)
    assert CategoricalSampler(dist, seed=3).sample(5) == ids[:5]
    assert CategoricalSampler(dist, seed=3).dist is dist and dist.sampler().dist is dist
    batch = CategoricalDataEncoder(3).seq_encode(ids)
    (encoded,) = batch
    np.testing.assert_array_equal(encoded, ids)
    acc = CategoricalEstimator(3).accumulator_factory().make()
    acc.seq_update(batch, np.ones(2000), dist)
    (counts,) = acc.value()
    np.testing.assert_array_equal(counts, np.bincount(ids, minlength=3))
    fit = CategoricalEstimator(3, smoothing=1.0).estimate(2000.0, acc.value())
    np.testing.assert_allclose(fit.p, (counts + 1) / (counts + 1).sum(), rtol=1e-12)
    zero = CategoricalDistribution([0.0, 1.0])
    with pytest.raises(ImpossibleEvidenceError):
        CategoricalAccumulator(2).update(0, 1.0, zero)
    with pytest.raises(ValueError, match="out-of-range ID"):
        CategoricalDataEncoder(3).seq_encode([0, 3])
    with pytest.raises(TypeError):
        CategoricalDataEncoder(3).seq_encode([True, False])


def test_diagonal_gaussian_leaf(rng):
    dist = DiagonalGaussianDistribution([1.0, -2.0], [0.5, 2.0], name="g")
    assert (dist.dim, dist.name) == (2, "g")
    x = np.array([0.3, -1.0])
    expected = -0.5 * np.sum(np.log(2 * np.pi * dist.sigma2) + (x - dist.mu) ** 2 / dist.sigma2)
    assert dist.log_density(x) == pytest.approx(expected, rel=1e-14)
    draws = dist.sampler(seed=4).sample(4000)
    assert draws[0].shape == (2,)
    values = np.array(draws)
    np.testing.assert_allclose(values.mean(axis=0), [1.0, -2.0], atol=0.1)
    np.testing.assert_allclose(values.var(axis=0), [0.5, 2.0], rtol=0.1)
    np.testing.assert_array_equal(DiagonalGaussianSampler(dist, seed=4).sample(), draws[0])
    assert DiagonalGaussianSampler(dist, seed=4).dist is dist and dist.sampler().dist is dist
    batch = DiagonalGaussianDataEncoder(2).seq_encode(values)
    acc = DiagonalGaussianAccumulator(2)
    acc.seq_update(batch, np.ones(4000), dist)
    total, total_sq, count = acc.value()
    assert count == 4000.0 and type(count) is float
    np.testing.assert_allclose(total, values.sum(axis=0), rtol=1e-12)
    fit = DiagonalGaussianEstimator(2).estimate(None, acc.value())
    np.testing.assert_allclose(fit.mu, values.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(fit.sigma2, values.var(axis=0), rtol=1e-8)
    with pytest.raises(ValueError):
        DiagonalGaussianDistribution([0.0], [0.0])
    with pytest.raises(ValueError):
        DiagonalGaussianDataEncoder(3).seq_encode(values)


def test_mixture_of_attention_heads(rng):
    data, _ = recall_task(800, rng)
    est = ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.5)
    fit = optimize(data, MixtureEstimator([est, est]), max_its=5, rng=1, out=None)
    assert isinstance(fit, MixtureDistribution) and fit.w.shape == (2,) and not fit.w.flags.writeable
    encoder = fit.dist_to_encoder()
    assert isinstance(encoder, MixtureDataEncoder)
    assert encoder == MixtureDataEncoder(ResponsibilityAttentionDataEncoder(S, N, D, T))
    batch = encoder.seq_encode(data)
    log_p = fit.seq_log_density(batch)
    parts = np.stack([c.seq_log_density(batch) for c in fit.components], axis=1) + np.log(fit.w)
    np.testing.assert_allclose(log_p, np.logaddexp.reduce(parts, axis=1), rtol=1e-12)
    rho = fit.seq_posterior(batch)
    np.testing.assert_allclose(rho.sum(axis=1), 1.0, atol=1e-12)
    acc = fit.estimator().accumulator_factory().make()
    assert isinstance(acc, MixtureAccumulator)
    acc.seq_update(batch, np.ones(800), fit)
    comp_count, children = acc.value()
    assert comp_count.shape == (2,) and len(children) == 2 and len(children[0]) == 5
    np.testing.assert_allclose(comp_count, rho.sum(axis=0), rtol=1e-10)
    views = acc.accumulators
    assert all(isinstance(v, ResponsibilityAttentionAccumulator) for v in views)
    np.testing.assert_array_equal(views[1].value()[1], children[1][1])
    copy = pickle.loads(pickle.dumps(fit))
    np.testing.assert_array_equal(copy.seq_log_density(batch), log_p)


def test_mixture_accumulator_views_follow_their_parent(rng):
    model = random_model(rng)
    mixture = MixtureDistribution([model, model], [0.25, 0.75])
    acc = MixtureAccumulator([model.estimator().accumulator_factory().make()] * 2, name="mix")
    child = acc.accumulators[0]
    rows = model_data(model, 20, seed=3)
    acc.seq_update(mixture.dist_to_encoder().seq_encode(rows), np.ones(20), mixture)
    assert child.value()[3].sum() == pytest.approx(5.0)  # a view: sees its parent's E-step
    acc.combine(acc.value())  # the parent replaces its children; the view still resolves
    assert child.value()[3].sum() == pytest.approx(10.0)
    child.scale(0.0)
    assert acc.value()[1][0][3].sum() == 0.0
    assert acc.name == "mix" and child.name is None


def test_keyed_tying_in_a_mixture(rng):
    """F-5: two RA components with the same key end with identical parameters, equal to estimate of the sum of
    their separate statistics."""
    data, _ = recall_task(1500, rng)
    tied = ResponsibilityAttentionEstimator(S, N, D, T, sigma2=0.5, keys="shared")
    acc = MixtureEstimator([tied, tied]).accumulator_factory().make()
    first, second = acc.accumulators
    assert first.keys == "shared"
    w = rng.random(1500)
    model = random_model(rng, S=S, N=N, D=D, T=T)
    first.seq_update(data, w, model)
    second.seq_update(data, 1.0 - w, model)
    separate = [first.value(), second.value()]
    pool = {}
    acc.key_merge(pool)
    assert pool["shared"] is not None
    acc.key_replace(pool)
    a, b = (tied.estimate(None, child.value()) for child in acc.accumulators)
    summed = ResponsibilityAttentionAccumulator(S, N, D, T).from_value(separate[0]).combine(separate[1])
    expected = tied.estimate(None, summed.value())
    for x, y, z in zip((a.key_means, a.emission, a.position_prior), (b.key_means, b.emission, b.position_prior),
                       (expected.key_means, expected.emission, expected.position_prior)):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_allclose(x, z, rtol=1e-12)


def test_composite_of_attention_and_label(rng):
    head = random_model(rng, S=5, N=4, D=3, T=6)
    label = CategoricalDistribution([0.25, 0.75])
    dist = CompositeDistribution([head, label], name="pair")
    assert [type(c) for c in dist.dists] == [ResponsibilityAttentionDistribution, CategoricalDistribution]
    rows = [(obs, int(rng.integers(2))) for obs in model_data(head, 30, seed=5)]
    encoder = dist.dist_to_encoder()
    assert encoder == CompositeDataEncoder([head.dist_to_encoder(), CategoricalDataEncoder(2)])
    batch = encoder.seq_encode(rows)
    head_batch, label_batch = batch
    assert head_batch.n_rows == 30 and len(head_batch) == 3 and len(label_batch) == 1
    np.testing.assert_allclose(dist.seq_log_density(batch),
                               head.seq_log_density(head_batch) + label.seq_log_density(label_batch), rtol=1e-12)
    assert dist.log_density(rows[0]) == pytest.approx(head.log_density(rows[0][0]) + label.log_density(rows[0][1]))
    np.testing.assert_array_equal(dist.seq_log_density((head_batch, label_batch)), dist.seq_log_density(batch))
    est = CompositeEstimator([head.estimator(), CategoricalEstimator(2, smoothing=0.5)])
    acc = est.accumulator_factory().make()
    assert isinstance(acc, CompositeAccumulator) and len(acc.accumulators) == 2
    acc.seq_update(batch, np.ones(30), dist)
    head_stats, (counts,) = acc.value()
    assert len(head_stats) == 5 and counts.sum() == 30.0
    fit = est.estimate(30.0, acc.value())
    assert isinstance(fit, CompositeDistribution)
    copy = pickle.loads(pickle.dumps(fit))
    np.testing.assert_array_equal(copy.seq_log_density(batch), fit.seq_log_density(batch))
    with pytest.raises(TypeError, match="composite observations must be tuples of 2 fields"):
        encoder.seq_encode([rows[0][0]])
    fitted = optimize(rows, est, max_its=3, out=None)
    assert isinstance(fitted, CompositeDistribution)


def test_leaf_constructors_and_pickles():
    for dist in (CategoricalDistribution([1.0]), DiagonalGaussianDistribution([0.0, 1.0], [1.0, 2.0], name="g")):
        copy = pickle.loads(pickle.dumps(dist))
        assert type(copy) is type(dist) and copy.name == dist.name
    assert CategoricalAccumulator(4, keys="k").keys == "k"
    assert DiagonalGaussianAccumulator(3).dim == 3
    assert CategoricalEstimator(4, smoothing=0.5).smoothing == 0.5
    assert DiagonalGaussianEstimator(2, min_sigma2=1e-3).min_sigma2 == 1e-3
    with pytest.raises(TypeError):
        MixtureDistribution([1, 2], [0.5, 0.5])
    with pytest.raises(ValueError):
        MixtureDistribution([CategoricalDistribution([1.0])] * 2, [0.6, 0.6])
    with pytest.raises(TypeError):
        MixtureEstimator(["estimator"])
    with pytest.raises(TypeError):
        CompositeAccumulator([1])
    assert repr(MixtureDistribution([CategoricalDistribution([1.0])], [1.0])).startswith("MixtureDistribution(")
    assert "accumulators" in dir(MixtureAccumulator)
    out = io.StringIO()
    assert out.getvalue() == ""


# ---- samplers of the combinators -----------------------------------------------------------------------------------


def test_mixture_sampler_draws_the_mixture_law():
    model = MixtureDistribution([CategoricalDistribution([0.7, 0.2, 0.1]), CategoricalDistribution([0.1, 0.1, 0.8])],
                                [0.4, 0.6])
    n = 20000
    draws = MixtureSampler(model, seed=11).sample(n)
    assert all(isinstance(x, int) for x in draws)
    expected = np.array([model.density(k) for k in range(3)])  # oracle: the mixture's own density
    frequency = np.bincount(draws, minlength=3) / n
    assert np.all(np.abs(frequency - expected) < 4 * np.sqrt(expected * (1 - expected) / n))
    # Deterministic in the seed, and calls continue one another.
    assert model.sampler(11).sample(n) == draws
    sampler = MixtureSampler(model, seed=11)
    assert sampler.sample(3) + sampler.sample(n - 3) == draws
    assert MixtureSampler(model, seed=11).sample() == draws[0]
    assert MixtureSampler(model, seed=12).sample(n) != draws
    assert MixtureSampler(model, seed=2**64 - 1).sample(2) == MixtureSampler(model, seed=2**64 - 1).sample(2)


def test_mixture_sampler_writes_the_rows_of_attnmix_sample(tmp_path, rng):
    model = MixtureDistribution([random_model(rng), random_model(rng), random_model(rng)], [0.2, 0.5, 0.3])
    save_model(model, tmp_path / "mixture.json")
    lines = run_cli("sample", "--model", tmp_path / "mixture.json", "-n", 40, "--seed", 7).stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    draws = MixtureSampler(model, seed=7).sample(40)
    assert len(rows) == len(draws) == 40
    for row, (context, query, target) in zip(rows, draws):
        assert row["context"] == context.tolist() and row["target"] == target
        np.testing.assert_array_equal(row["query"], query)
    # Keyword options reach every component's sampler: chained attention's context length.
    chained = [ChainedAttentionDistribution(rng.standard_normal((2, 5, 5)), rng.dirichlet(np.ones(4), size=5))
               for _ in range(2)]
    model = MixtureDistribution(chained, [0.5, 0.5])
    save_model(model, tmp_path / "chained.json")
    lines = run_cli("sample", "--model", tmp_path / "chained.json", "-n", 20, "--seed", 3,
                    "--context-length", 9).stdout.splitlines()
    draws = model.sampler(3, context_length=9).sample(20)
    for line, (keys, values, query, target) in zip(lines, draws):
        row = json.loads(line)
        assert len(keys) == 9
        assert (row["keys"], row["values"], row["query"], row["target"]) == (keys.tolist(), values.tolist(), query,
                                                                           target)


def test_composite_sampler_draws_independent_fields():
    label = CategoricalDistribution([0.25, 0.75])
    value = DiagonalGaussianDistribution([5.0, -1.0], [1.0, 4.0])
    model = CompositeDistribution([label, value])
    n = 20000
    draws = CompositeSampler(model, seed=4).sample(n)
    assert all(isinstance(d, tuple) and len(d) == 2 for d in draws)
    ids = np.array([d[0] for d in draws])
    xs = np.stack([d[1] for d in draws])
    assert abs(ids.mean() - 0.75) < 4 * np.sqrt(0.75 * 0.25 / n)
    assert np.all(np.abs(xs.mean(axis=0) - [5.0, -1.0]) < 4 * np.sqrt(np.array([1.0, 4.0]) / n))
    np.testing.assert_allclose(xs.var(axis=0), [1.0, 4.0], rtol=0.05)
    # Independence: the label says nothing about the value.
    assert abs(xs[ids == 1, 0].mean() - xs[ids == 0, 0].mean()) < 4 * np.sqrt(1 / (n * 0.25) + 1 / (n * 0.75))
    # Every call seeds field f's sampler with the f-th 64-bit draw of Rng(seed), as the library's CompositeSampler.
    seeds = Rng(4)
    first, second = seeds.next_u64(), seeds.next_u64()
    assert ids.tolist() == CategoricalSampler(label, seed=first).sample(n)
    np.testing.assert_array_equal(xs, np.stack(DiagonalGaussianSampler(value, seed=second).sample(n)))
    sampler = model.sampler(4)
    assert sampler.sample(n)[0][0] == draws[0][0] and sampler.sample()[0] == CategoricalSampler(
        label, seed=seeds.next_u64()).sample()
    assert CompositeSampler(model, seed=4).sample(0) == []
    # The draws are observations the model scores.
    assert np.all(np.isfinite(model.seq_log_density(model.dist_to_encoder().seq_encode(draws[:50]))))


def test_composite_rows_of_attnmix_sample_and_score(tmp_path, rng):
    # A composite's data files hold component f's field "x" as "f<f>_x"; the program's rows are CompositeSampler's.
    model = CompositeDistribution([CategoricalDistribution([0.1, 0.6, 0.3]), random_model(rng),
                                   DiagonalGaussianDistribution([0.0, 2.0, -1.0], [1.0, 0.5, 3.0])])
    save_model(model, tmp_path / "composite.json")
    lines = run_cli("sample", "--model", tmp_path / "composite.json", "-n", 30, "--seed", 5).stdout.splitlines()
    rows = [json.loads(line) for line in lines]
    draws = CompositeSampler(model, seed=5).sample(30)
    assert len(rows) == 30
    for row, (label, (context, query, target), x) in zip(rows, draws):
        assert sorted(row) == ["f0_value", "f1_context", "f1_query", "f1_target", "f2_value"]
        assert row["f0_value"] == label and row["f1_context"] == context.tolist() and row["f1_target"] == target
        np.testing.assert_array_equal(row["f1_query"], query)
        np.testing.assert_array_equal(row["f2_value"], x)
    # The program scores those rows as the model does.
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n")
    scored = run_cli("score", "--model", tmp_path / "composite.json", "--data", tmp_path / "rows.jsonl", "--per-row")
    expected = model.seq_log_density(model.dist_to_encoder().seq_encode(draws))
    np.testing.assert_allclose([float(v) for v in scored.stdout.split()], expected, rtol=1e-12)
    # A field may be a mixture: the program draws it as MixtureSampler does.
    label = MixtureDistribution([CategoricalDistribution([0.9, 0.1]), CategoricalDistribution([0.2, 0.8])], [0.3, 0.7])
    model = CompositeDistribution([label, DiagonalGaussianDistribution([1.0], [2.0])])
    save_model(model, tmp_path / "nested.json")
    lines = run_cli("sample", "--model", tmp_path / "nested.json", "-n", 25, "--seed", 8).stdout.splitlines()
    draws = CompositeSampler(model, seed=8).sample(25)
    assert [json.loads(line)["f0_value"] for line in lines] == [d[0] for d in draws]
    np.testing.assert_array_equal([json.loads(line)["f1_value"] for line in lines], [d[1] for d in draws])


def test_combinator_samplers_refuse_bad_arguments():
    mixture = MixtureDistribution([CategoricalDistribution([0.5, 0.5])] * 2, [0.5, 0.5])
    composite = CompositeDistribution([CategoricalDistribution([0.5, 0.5])])
    with pytest.raises(TypeError, match="MixtureSampler: dist must be a MixtureDistribution"):
        MixtureSampler(composite)
    with pytest.raises(TypeError, match="CompositeSampler: dist must be a CompositeDistribution"):
        CompositeSampler(mixture)
    with pytest.raises(ValueError, match="size must be an integer >= 0"):
        mixture.sampler(0).sample(-1)
    with pytest.raises(TypeError, match="size must be an integer"):
        composite.sampler(0).sample(True)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        mixture.sampler(-1)
    with pytest.raises(ValueError, match="beyond 64 bits"):
        composite.sampler(2**64)
    with pytest.raises(TypeError):  # a categorical sampler takes no context length
        mixture.sampler(0, context_length=4)
