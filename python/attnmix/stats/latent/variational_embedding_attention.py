# SPDX-License-Identifier: Apache-2.0
"""attnmix.stats.latent.variational_embedding_attention: variational embedding attention at the reference design's module path (the same classes as
``attnmix.VariationalEmbeddingAttentionDistribution`` and its siblings)."""
from attnmix import (  # noqa: F401
    AttentionOptimizerState,
    VariationalEmbeddingAttentionAccumulator,
    VariationalEmbeddingAttentionAccumulatorFactory,
    VariationalEmbeddingAttentionDataEncoder,
    VariationalEmbeddingAttentionDistribution,
    VariationalEmbeddingAttentionEstimator,
    VariationalEmbeddingAttentionSampler,
)

__all__ = ["AttentionOptimizerState", "VariationalEmbeddingAttentionAccumulator", "VariationalEmbeddingAttentionAccumulatorFactory", "VariationalEmbeddingAttentionDataEncoder", "VariationalEmbeddingAttentionDistribution", "VariationalEmbeddingAttentionEstimator", "VariationalEmbeddingAttentionSampler"]
