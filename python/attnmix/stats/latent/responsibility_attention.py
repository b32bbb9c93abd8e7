# SPDX-License-Identifier: Apache-2.0
"""attnmix.stats.latent.responsibility_attention: responsibility attention at the reference design's module path (the same classes as
``attnmix.ResponsibilityAttentionDistribution`` and its siblings)."""
from attnmix import (  # noqa: F401
    ResponsibilityAttentionAccumulator,
    ResponsibilityAttentionAccumulatorFactory,
    ResponsibilityAttentionDataEncoder,
    ResponsibilityAttentionDistribution,
    ResponsibilityAttentionEstimator,
    ResponsibilityAttentionSampler,
    sequence_to_triples,
)

__all__ = ["ResponsibilityAttentionAccumulator", "ResponsibilityAttentionAccumulatorFactory", "ResponsibilityAttentionDataEncoder", "ResponsibilityAttentionDistribution", "ResponsibilityAttentionEstimator", "ResponsibilityAttentionSampler", "sequence_to_triples"]
