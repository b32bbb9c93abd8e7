# SPDX-License-Identifier: Apache-2.0
"""The reference design's one-stream cluster banks on numpy arrays (attnmix.experimental).

attnmix's banks have a stream axis: one far-field mixture per stream, ``count (B, H, C)``. Code written for the
reference keeps one bank without that axis, ``count (H, C)`` with an int ``n_clusters``, shared by every sequence
of a batch. ``empty_cluster_bank(n_head, max_clusters, head_dim)`` (no ``batch_size``) makes such a bank, a
:class:`OneStreamClusterBank`, and the far-field functions take it as the reference does: tokens ``(b, t, H, d)``
are one stream of ``b * t`` tokens, and ``birth_and_merge`` / ``ingest_cluster_batch`` return one receipt dict
instead of a list. Everything is computed by the streams implementation on a bank of one stream.
"""
from typing import Any, Optional

import numpy as np


class OneStreamClusterBank:
    """One far-field mixture shared by every sequence: ``count (H, C)``, ``mu_k``, ``mu_v``, ``sigma_kk``
    ``(H, C, d)``, ``sigma_vk (H, C, d, d)``, ``n_clusters`` an int and ``max_clusters``. Arrays are copies."""

    def __init__(self, count, mu_k, mu_v, sigma_kk, sigma_vk, n_clusters: int, max_clusters: Optional[int] = None):
        if isinstance(n_clusters, bool) or not isinstance(n_clusters, (int, np.integer)):
            raise TypeError(f"OneStreamClusterBank: n_clusters must be an int (got {type(n_clusters).__name__})")
        fields = [np.asarray(x, dtype=np.float64)[None] for x in (count, mu_k, mu_v, sigma_kk, sigma_vk)]
        self._bank = _stream().ClusterBank(*fields, [int(n_clusters)], max_clusters)  # validates

    @classmethod
    def _of(cls, bank) -> "OneStreamClusterBank":
        out = cls.__new__(cls)
        out._bank = bank
        return out

    count = property(lambda self: self._bank.count[0],
                     doc="Soft token counts, a float64 array of shape ``(H, C)`` (a copy).")
    mu_k = property(lambda self: self._bank.mu_k[0], doc="Key means, a float64 array of shape ``(H, C, d)`` (a copy).")
    mu_v = property(lambda self: self._bank.mu_v[0],
                    doc="Value means, a float64 array of shape ``(H, C, d)`` (a copy).")
    sigma_kk = property(lambda self: self._bank.sigma_kk[0],
                        doc="Diagonal key variances (>= 0), a float64 array of shape ``(H, C, d)`` (a copy).")
    sigma_vk = property(lambda self: self._bank.sigma_vk[0],
                        doc="Value-key covariances Cov(v, k), a float64 array of shape ``(H, C, d, d)`` whose rows "
                            "index value dimensions (a copy).")
    n_clusters = property(lambda self: int(self._bank.n_clusters[0]),
                          doc="Live clusters, an int: slots ``0 .. n_clusters-1`` are active in every head.")
    max_clusters = property(lambda self: self._bank.max_clusters, doc="Cluster slots per head C, an int.")

    def total_per_head(self) -> np.ndarray:
        """The live total count per head: ``(H,)``."""
        return self._bank.total_per_head()[0]

    def __repr__(self) -> str:
        return (f"OneStreamClusterBank(n_head={self.count.shape[0]}, max_clusters={self.max_clusters}, "
                f"n_clusters={self.n_clusters})")


def _stream():
    from attnmix import experimental

    return experimental._extension()


def _tokens(x: Any) -> Any:
    """``(b, t, H, d)`` tokens of a one-stream bank as one stream of ``b * t`` tokens."""
    a = np.asarray(x, dtype=np.float64)
    return a.reshape(1, a.shape[0] * a.shape[1], *a.shape[2:]) if a.ndim >= 2 else a


def empty_cluster_bank(*sizes, **named):
    """``empty_cluster_bank(batch_size, n_head, max_clusters, head_dim)``: an all-zero bank of ``batch_size``
    streams; ``empty_cluster_bank(n_head, max_clusters, head_dim)`` (the reference's form): one shared stream."""
    if len(sizes) + len(named) == 3 and "batch_size" not in named:
        return OneStreamClusterBank._of(_stream().empty_cluster_bank(1, *sizes, **named))
    return _stream().empty_cluster_bank(*sizes, **named)


def mgf_cluster_attention(q, bank):
    """As attnmix._stream.mgf_cluster_attention; a one-stream bank's queries ``(b, t, H, d)`` share it."""
    if not isinstance(bank, OneStreamClusterBank):
        return _stream().mgf_cluster_attention(q, bank)
    b, t = np.shape(q)[:2]
    out, logits = _stream().mgf_cluster_attention(_tokens(q), bank._bank)
    return out.reshape(b, t, *out.shape[2:]), logits.reshape(b, t, *logits.shape[2:])


def cluster_responsibilities(k, bank):
    """As attnmix._stream.cluster_responsibilities; a one-stream bank's keys ``(b, t, H, d)`` share it."""
    if not isinstance(bank, OneStreamClusterBank):
        return _stream().cluster_responsibilities(k, bank)
    b, t = np.shape(k)[:2]
    r = _stream().cluster_responsibilities(_tokens(k), bank._bank)
    return r.reshape(b, t, *r.shape[2:])


def update_cluster_bank(bank, k, v, r):
    """As attnmix._stream.update_cluster_bank; a one-stream bank takes every sequence's tokens."""
    if not isinstance(bank, OneStreamClusterBank):
        return _stream().update_cluster_bank(bank, k, v, r)
    return OneStreamClusterBank._of(_stream().update_cluster_bank(bank._bank, _tokens(k), _tokens(v), _tokens(r)))


def _ingestion(name, bank, k, v, **options):
    function = getattr(_stream(), name)
    if not isinstance(bank, OneStreamClusterBank):
        return function(bank, k, v, **options)
    out, receipts = function(bank._bank, _tokens(k), _tokens(v), **options)
    return OneStreamClusterBank._of(out), receipts[0]


def birth_and_merge(bank, k, v, **options):
    """As attnmix._stream.birth_and_merge; with a one-stream bank, ``(bank, receipt)`` with one receipt dict."""
    return _ingestion("birth_and_merge", bank, k, v, **options)


def ingest_cluster_batch(bank, k, v, **options):
    """As attnmix._stream.ingest_cluster_batch; with a one-stream bank, ``(bank, receipt)`` with one receipt dict."""
    return _ingestion("ingest_cluster_batch", bank, k, v, **options)
