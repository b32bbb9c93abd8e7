# SPDX-License-Identifier: Apache-2.0
"""attnmix: attention as a mixture (SPEC.md).

Probabilistic attention mechanisms in which *which context position is attended* is a latent variable, fitted by
exact EM. The classes keep the reference design's names and call signatures (mixle), so

    from attnmix import ResponsibilityAttentionEstimator, optimize

    est = ResponsibilityAttentionEstimator(16, 6, 16, 16, sigma2=0.5)
    model = optimize(data, est, max_its=40)          # data: (context, query, target) triples

fits a responsibility-attention head. Everything runs in the compiled module ``attnmix._core`` (C++20); this
package re-exports it. ``import attnmix`` needs only numpy.
"""
from attnmix import _core
from attnmix._core import (
    Accumulator,
    AccumulatorFactory,
    CategoricalAccumulator,
    CategoricalDataEncoder,
    CategoricalDistribution,
    CategoricalEstimator,
    CategoricalSampler,
    ChainedAttentionAccumulator,
    ChainedAttentionAccumulatorFactory,
    ChainedAttentionDataEncoder,
    ChainedAttentionDistribution,
    ChainedAttentionEstimator,
    ChainedAttentionSampler,
    CompositeAccumulator,
    CompositeDataEncoder,
    CompositeDistribution,
    CompositeEstimator,
    DataEncoder,
    DiagonalGaussianAccumulator,
    DiagonalGaussianDataEncoder,
    DiagonalGaussianDistribution,
    DiagonalGaussianEstimator,
    DiagonalGaussianSampler,
    Distribution,
    EncodedBatch,
    Estimator,
    ImpossibleEvidenceError,
    MixtureAccumulator,
    MixtureDataEncoder,
    MixtureDistribution,
    MixtureEstimator,
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionAccumulatorFactory,
    ResponsibilityAttentionDataEncoder,
    ResponsibilityAttentionDistribution,
    ResponsibilityAttentionEstimator,
    ResponsibilityAttentionSampler,
    Rng,
    load_model,
    optimize,
    save_model,
    sequence_to_triples,
)
from attnmix import assign, inference

__version__ = _core.__version__

__all__ = [
    "Accumulator",
    "AccumulatorFactory",
    "CategoricalAccumulator",
    "CategoricalDataEncoder",
    "CategoricalDistribution",
    "CategoricalEstimator",
    "CategoricalSampler",
    "ChainedAttentionAccumulator",
    "ChainedAttentionAccumulatorFactory",
    "ChainedAttentionDataEncoder",
    "ChainedAttentionDistribution",
    "ChainedAttentionEstimator",
    "ChainedAttentionSampler",
    "CompositeAccumulator",
    "CompositeDataEncoder",
    "CompositeDistribution",
    "CompositeEstimator",
    "DataEncoder",
    "DiagonalGaussianAccumulator",
    "DiagonalGaussianDataEncoder",
    "DiagonalGaussianDistribution",
    "DiagonalGaussianEstimator",
    "DiagonalGaussianSampler",
    "Distribution",
    "EncodedBatch",
    "Estimator",
    "ImpossibleEvidenceError",
    "MixtureAccumulator",
    "MixtureDataEncoder",
    "MixtureDistribution",
    "MixtureEstimator",
    "ResponsibilityAttentionAccumulator",
    "ResponsibilityAttentionAccumulatorFactory",
    "ResponsibilityAttentionDataEncoder",
    "ResponsibilityAttentionDistribution",
    "ResponsibilityAttentionEstimator",
    "ResponsibilityAttentionSampler",
    "Rng",
    "assign",
    "inference",
    "load_model",
    "optimize",
    "save_model",
    "sequence_to_triples",
]
