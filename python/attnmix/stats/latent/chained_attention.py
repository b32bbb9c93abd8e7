# SPDX-License-Identifier: Apache-2.0
"""attnmix.stats.latent.chained_attention: chained attention at the reference design's module path (the same classes as
``attnmix.ChainedAttentionDistribution`` and its siblings)."""
from attnmix import (  # noqa: F401
    ChainedAttentionAccumulator,
    ChainedAttentionAccumulatorFactory,
    ChainedAttentionDataEncoder,
    ChainedAttentionDistribution,
    ChainedAttentionEstimator,
    ChainedAttentionSampler,
)

__all__ = ["ChainedAttentionAccumulator", "ChainedAttentionAccumulatorFactory", "ChainedAttentionDataEncoder", "ChainedAttentionDistribution", "ChainedAttentionEstimator", "ChainedAttentionSampler"]
