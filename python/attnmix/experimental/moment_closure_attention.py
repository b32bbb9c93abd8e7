# SPDX-License-Identifier: Apache-2.0
"""attnmix.experimental.moment_closure_attention: the reference design's path of moment-closure attention. Like the
reference's module it works on torch tensors (importing it imports torch): the classes and functions are those of
``attnmix.torch``, whose banks also take the reference's one-stream layout."""
from attnmix.torch import (  # noqa: F401
    ClusterBank,
    MomentClosureAttention,
    MomentClosureState,
    attention_law,
    birth_and_merge,
    cluster_responsibilities,
    empty_cluster_bank,
    ingest_cluster_batch,
    mgf_cluster_attention,
    update_cluster_bank,
)

__all__ = [
    "ClusterBank",
    "MomentClosureAttention",
    "MomentClosureState",
    "attention_law",
    "birth_and_merge",
    "cluster_responsibilities",
    "empty_cluster_bank",
    "ingest_cluster_batch",
    "mgf_cluster_attention",
    "update_cluster_bank",
]
