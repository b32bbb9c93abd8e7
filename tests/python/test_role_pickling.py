# SPDX-License-Identifier: Apache-2.0
"""Estimators, accumulators and accumulator factories pickle (as models do), so that they can go to and come back from
multiprocessing workers: unpickling calls the class again with the sizes, options, seed, name, keys and pseudo_count
it was made with (an accumulator then takes its statistics back through from_value), so a pickled estimator fits the
same models and a pickled accumulator holds the same statistics; mixtures and composites pickle their components in
turn. The sparse responsibility-attention roles hold their training rows' cells and say that they cannot be pickled."""
import copy
import pickle

import numpy as np
import pytest

import attnmix
from attnmix import _core

GENERATED = {entry["class"]: entry for entry in _core._estimator_classes()}


def _settings(estimator, entry):
    """What a generated estimator was made with, through its attributes."""
    names = [size["keyword"] for size in entry["sizes"]] + [option["name"] for option in entry["options"]]
    names += ["name", "keys"] + (["seed"] if entry["seeded"] else [])
    return {name: getattr(estimator, name) for name in names}


@pytest.mark.parametrize("class_name", sorted(name for name, entry in GENERATED.items() if not entry["rows"]))
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_generated_estimators_pickle_with_their_settings(class_name, protocol):
    entry = GENERATED[class_name]
    sizes = [3 + k for k in range(len(entry["sizes"]))]
    extra = {"seed": 11} if entry["seeded"] else {}
    estimator = getattr(attnmix, class_name)(*sizes, name="est", keys="tied", pseudo_count=2.0, **extra)
    again = pickle.loads(pickle.dumps(estimator, protocol=protocol))
    assert type(again) is type(estimator)
    assert _settings(again, entry) == _settings(estimator, entry)
    assert _settings(copy.deepcopy(estimator), entry) == _settings(estimator, entry)


def test_a_pickled_estimator_fits_the_same_model(rng):
    truth = attnmix.ResponsibilityAttentionDistribution(
        key_means=rng.standard_normal((4, 3)) * 2, emission=rng.dirichlet(np.ones(4), size=4),
        position_prior=[0.2, 0.3, 0.5], sigma2=0.5)
    data = truth.sampler(seed=3).sample(300)
    estimator = attnmix.ResponsibilityAttentionEstimator(4, 3, 3, 4, sigma2=0.7, estimate_sigma2=True,
                                                         emission_smoothing=1e-3, precision="mixed", name="fit")
    again = pickle.loads(pickle.dumps(estimator))
    first = attnmix.optimize(data, estimator, max_its=8, rng=5, out=None)
    second = attnmix.optimize(data, again, max_its=8, rng=5, out=None)
    assert pickle.dumps(first) == pickle.dumps(second)  # every parameter, bit for bit
    assert second.precision == "mixed" and second.name == "fit"


def test_mixtures_and_composites_pickle_their_components(rng):
    mixture = attnmix.MixtureEstimator([attnmix.DiagonalGaussianEstimator(1, min_sigma2=0.01)] * 2, keys="k",
                                       name="two")
    composite = attnmix.CompositeEstimator([attnmix.CategoricalEstimator(3, smoothing=0.5), mixture], name="pair")
    again = pickle.loads(pickle.dumps(composite))
    assert type(again) is attnmix.CompositeEstimator
    data = [(int(k), [float(x)]) for k, x in zip(rng.integers(0, 3, 200), np.concatenate(
        [rng.normal(-3, 1, 100), rng.normal(3, 1, 100)]))]
    first = attnmix.optimize(data, composite, max_its=10, rng=2, out=None)
    second = attnmix.optimize(data, again, max_its=10, rng=2, out=None)
    assert pickle.dumps(first) == pickle.dumps(second)
    assert second.name == "pair" and second.dists[1].name == "two"
    assert min(component.sigma2[0] for component in second.dists[1].components) >= 0.01


def test_a_sparse_estimator_says_it_cannot_be_pickled():
    estimator = attnmix.SparseResponsibilityAttentionEstimator(3, 2, 3, 3, rows=[([0, 1], 1, 2), ([2, 2], 0, 1)])
    with pytest.raises(TypeError, match="SparseResponsibilityAttentionEstimator objects cannot be pickled: they hold "
                                        "the cells of the training rows"):
        pickle.dumps(estimator)


@pytest.mark.parametrize("class_name", sorted(name for name, entry in GENERATED.items() if not entry["rows"]))
def test_generated_accumulators_and_factories_pickle_with_their_settings(class_name):
    entry = GENERATED[class_name]
    sizes = [3 + k for k in range(len(entry["sizes"]))]
    stem = class_name.removesuffix("Estimator")
    accumulator = getattr(attnmix, stem + "Accumulator")(*sizes, keys="tied", name="acc")
    factory = getattr(attnmix, stem + "AccumulatorFactory")(*sizes, keys="tied", name="fac")
    for obj in (accumulator, factory):
        again = pickle.loads(pickle.dumps(obj))
        assert type(again) is type(obj)
        for size in entry["sizes"]:
            assert getattr(again, size["keyword"]) == getattr(obj, size["keyword"])
    again = pickle.loads(pickle.dumps(accumulator))
    assert (again.keys, again.name) == ("tied", "acc")
    assert pickle.dumps(again.value()) == pickle.dumps(accumulator.value())


def test_statistics_come_back_from_workers(rng):
    """The map-reduce of the reference's users: halves accumulated apart, pickled, combined, equal the whole."""
    model = attnmix.VariationalEmbeddingAttentionDistribution(
        mean=rng.standard_normal((4, 2)), log_var=np.full((4, 2), -2.0), emission=rng.dirichlet(np.ones(3), size=4),
        position_prior=[0.5, 0.5], sigma2=0.5)
    data = model.sampler(seed=1).sample(60)
    whole = model.estimator().accumulator_factory().make()
    whole.seq_update(data, np.ones(60), model)
    halves = []
    for part in (data[:30], data[30:]):
        acc = model.estimator().accumulator_factory().make()
        acc.seq_update(part, np.ones(30), model)
        halves.append(pickle.loads(pickle.dumps(acc)))
    halves[0].combine(halves[1].value())
    for a, b in zip(halves[0].value()[:-1], whole.value()[:-1]):  # the statistics; the last entry is the Adam state
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert halves[0].value()[-1]["iteration"] == whole.value()[-1]["iteration"]


def test_combinator_accumulators_pickle_their_children_and_statistics():
    mixture = attnmix.MixtureDistribution([attnmix.CategoricalDistribution([0.9, 0.1]),
                                           attnmix.CategoricalDistribution([0.2, 0.8])], [0.5, 0.5])
    acc = attnmix.MixtureAccumulator([attnmix.CategoricalAccumulator(2), attnmix.CategoricalAccumulator(2)],
                                     keys="m", name="mix")
    acc.seq_update([0, 1, 1, 0, 1], [1.0, 2.0, 1.0, 0.5, 1.0], mixture)
    pair = attnmix.CompositeAccumulator([acc, attnmix.DiagonalGaussianAccumulator(1)], name="pair")
    for obj in (acc, pair):
        again = pickle.loads(pickle.dumps(obj))
        assert type(again) is type(obj) and again.name == obj.name
        assert pickle.dumps(again.value()) == pickle.dumps(obj.value())
    assert pickle.loads(pickle.dumps(acc)).keys == "m"


def test_sparse_statistics_say_they_cannot_be_pickled():
    rows = [([0, 1], 1, 2), ([2, 2], 0, 1)]
    for obj in (attnmix.SparseResponsibilityAttentionAccumulator(3, 2, 3, 3, rows=rows),
                attnmix.SparseResponsibilityAttentionAccumulatorFactory(3, 2, 3, 3, rows=rows)):
        with pytest.raises(TypeError, match=type(obj).__name__ + " objects cannot be pickled: they hold the cells"):
            pickle.dumps(obj)
