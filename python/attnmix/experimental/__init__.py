# SPDX-License-Identifier: Apache-2.0
"""attnmix.experimental: the streaming part of attnmix on numpy arrays.

The pure functions of moment-closure attention (docs/mechanisms.md#moment-closure-far-field), on float64 arrays::

    from attnmix.experimental import empty_cluster_bank, ingest_cluster_batch, mgf_cluster_attention

    bank = empty_cluster_bank(batch_size=1, n_head=2, max_clusters=4, head_dim=8)
    bank, receipts = ingest_cluster_batch(bank, k, v, birth_threshold=-2.0)   # k, v: (B, t, H, d)
    out, logits = mgf_cluster_attention(q, bank)

``empty_cluster_bank(n_head, max_clusters, head_dim)`` (without ``batch_size``) is the reference design's one shared
bank, a ``OneStreamClusterBank`` (``count (H, C)``, ``n_clusters`` an int): the functions then take tokens
``(b, t, H, d)`` as one stream and return one receipt dict. The reference's module paths
``attnmix.experimental.moment_closure_attention`` and ``attnmix.experimental.context_spine`` hold the same names.

``attention_law``, RoPE (``rope_tables``, ``apply_rope``, ``rotate_half``), and the streaming language models on
token arrays (docs/mechanisms.md#streaming-language-model): ``train_language_model``, ``evaluate_language_model``,
``generate_language_model``, ``checkpoint_info``, the far-field recall experiment ``run_recall`` and the memory
benchmark ``run_memory_benchmark``, each returning plain dicts.

Everything runs in the compiled extension ``attnmix._stream``, which links libtorch (but needs no Python torch). It
is imported on first use of a name, never by ``import attnmix`` or by importing this module; it exists only when
attnmix was built with ATTNMIX_WITH_TORCH, and ImportError says so otherwise.
"""
import importlib
from typing import TYPE_CHECKING

from attnmix.experimental._one_stream import (
    OneStreamClusterBank,
    birth_and_merge,
    cluster_responsibilities,
    empty_cluster_bank,
    ingest_cluster_batch,
    mgf_cluster_attention,
    update_cluster_bank,
)

if TYPE_CHECKING:  # for type checkers only: at run time the names load on first use (__getattr__ below)
    from attnmix._stream import (
        ClusterBank,
        GaussianLaw,
        apply_rope,
        attention_law,
        byte_tokens,
        checkpoint_info,
        default_generate_options,
        default_memory_bench_options,
        default_recall_options,
        default_train_options,
        evaluate_language_model,
        generate_language_model,
        rope_tables,
        rotate_half,
        run_memory_benchmark,
        run_recall,
        train_language_model,
    )

__all__ = [
    "ClusterBank",
    "OneStreamClusterBank",
    "GaussianLaw",
    "apply_rope",
    "attention_law",
    "birth_and_merge",
    "byte_tokens",
    "checkpoint_info",
    "cluster_responsibilities",
    "default_generate_options",
    "default_memory_bench_options",
    "default_recall_options",
    "default_train_options",
    "empty_cluster_bank",
    "evaluate_language_model",
    "generate_language_model",
    "ingest_cluster_batch",
    "mgf_cluster_attention",
    "rope_tables",
    "rotate_half",
    "run_memory_benchmark",
    "run_recall",
    "train_language_model",
    "update_cluster_bank",
]


def _extension():
    try:
        return importlib.import_module("attnmix._stream")
    except ImportError as error:
        raise ImportError(
            "attnmix.experimental needs the compiled extension attnmix._stream, which is built only with "
            "ATTNMIX_WITH_TORCH (libtorch-dev); rebuild attnmix with it"
        ) from error


def __getattr__(name):
    if name in __all__ and name not in globals():
        value = getattr(_extension(), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
