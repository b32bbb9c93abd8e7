# SPDX-License-Identifier: Apache-2.0
"""attnmix.stats.latent.variational_multihop_attention: variational multi-hop attention at the reference design's module path (the same classes as
``attnmix.VariationalMultiHopAttentionDistribution`` and its siblings)."""
from attnmix import (  # noqa: F401
    AttentionOptimizerState,
    VariationalMultiHopAttentionAccumulator,
    VariationalMultiHopAttentionAccumulatorFactory,
    VariationalMultiHopAttentionDataEncoder,
    VariationalMultiHopAttentionDistribution,
    VariationalMultiHopAttentionEstimator,
    VariationalMultiHopAttentionSampler,
)

__all__ = ["AttentionOptimizerState", "VariationalMultiHopAttentionAccumulator", "VariationalMultiHopAttentionAccumulatorFactory", "VariationalMultiHopAttentionDataEncoder", "VariationalMultiHopAttentionDistribution", "VariationalMultiHopAttentionEstimator", "VariationalMultiHopAttentionSampler"]
