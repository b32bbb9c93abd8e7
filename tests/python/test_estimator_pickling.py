# SPDX-License-Identifier: Apache-2.0
"""Estimators pickle (as models do): unpickling calls the class again with the sizes, options, seed, name, keys and
pseudo_count it was made with, so a pickled estimator fits the same models; mixtures and composites pickle their
component estimators in turn. A sparse responsibility-attention estimator holds its training rows' cells and says
that it cannot be pickled."""
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
