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
    ``(H, C, d)``, ``sigma_vk (H, C, d, d)``, ``n_clusters`` an int and ``max_clusters``. Arrays are copies.

    ``empty_cluster_bank(n_head, max_clusters, head_dim)`` makes one; the far-field functions then take the tokens
    ``(b, t, H, d)`` of every sequence as one stream of ``b * t`` tokens. The constructor takes the arrays above
    and checks them as ``ClusterBank`` does (ValueError).

    Example: three sequences of five tokens fill one bank:

    >>> import numpy as np
    >>> from attnmix.experimental import empty_cluster_bank, ingest_cluster_batch
    >>> bank = empty_cluster_bank(2, 4, 8)  # n_head, max_clusters, head_dim
    >>> k, v = np.random.default_rng(0).standard_normal((2, 3, 5, 2, 8))  # (b, t, H, d) each
    >>> bank, receipt = ingest_cluster_batch(bank, k, v, birth_threshold=-2.0)
    >>> bank
    OneStreamClusterBank(n_head=2, max_clusters=4, n_clusters=1)
    >>> bank.count.shape, bank.total_per_head().tolist(), receipt["count_conserved"]  # 3 x 5 tokens per head
    ((2, 4), [15.0, 15.0], True)
    """

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
    """empty_cluster_bank(batch_size, n_head, max_clusters, head_dim) -> ClusterBank
    empty_cluster_bank(n_head, max_clusters, head_dim) -> OneStreamClusterBank

    With ``batch_size``: an all-zero float64 ``ClusterBank`` of ``batch_size`` streams, no cluster live; without
    (the reference's form): a ``OneStreamClusterBank``, one stream shared by every sequence. ValueError unless
    every size is positive.

    Example:

    >>> from attnmix.experimental import empty_cluster_bank
    >>> bank = empty_cluster_bank(batch_size=2, n_head=2, max_clusters=4, head_dim=8)
    >>> bank
    ClusterBank(batch_size=2, n_head=2, max_clusters=4, head_dim=8, n_clusters=[0, 0])
    >>> bank.count.shape, bank.sigma_vk.shape, float(bank.count.sum())
    ((2, 2, 4), (2, 2, 4, 8, 8), 0.0)
    >>> empty_cluster_bank(2, 4, 8)  # without batch_size: one shared bank
    OneStreamClusterBank(n_head=2, max_clusters=4, n_clusters=0)
    """
    if len(sizes) + len(named) == 3 and "batch_size" not in named:
        return OneStreamClusterBank._of(_stream().empty_cluster_bank(1, *sizes, **named))
    return _stream().empty_cluster_bank(*sizes, **named)


def mgf_cluster_attention(q, bank):
    """The far field's attention for queries ``q (B, t, H, d)``: ``(out (B, t, n, H, d), logits (B, t, n, H))``
    with ``n = max(bank.n_clusters)``, each cluster's logit and output by the moment-generating function
    (docs/mechanisms.md#moment-closure-far-field). Slots beyond a stream's live prefix get logit ``-inf`` and
    output 0. With a ``OneStreamClusterBank``, queries ``(b, t, H, d)`` all attend to the one bank.

    Example: stream 0 holds one cluster, stream 1 two; every token's value is (1, 1):

    >>> import numpy as np
    >>> from attnmix.experimental import empty_cluster_bank, ingest_cluster_batch, mgf_cluster_attention
    >>> k, v = np.full((2, 4, 1, 2), 3.0), np.ones((2, 4, 1, 2))  # 2 streams of 4 tokens, 1 head, d = 2
    >>> bank, _ = ingest_cluster_batch(empty_cluster_bank(2, 1, 2, 2), k, v, birth_threshold=-2.0)
    >>> k[1] *= -1  # stream 1's next keys point the other way: a second cluster
    >>> bank, _ = ingest_cluster_batch(bank, k, v, birth_threshold=-2.0)
    >>> bank.n_clusters.tolist()
    [1, 2]
    >>> out, logits = mgf_cluster_attention(np.ones((2, 3, 1, 2)), bank)  # 3 queries per stream
    >>> out.shape, logits.shape
    ((2, 3, 2, 1, 2), (2, 3, 2, 1))
    >>> float(logits[0, 0, 1, 0]), out[0, 0, 1, 0].tolist()  # stream 0's slot 1 is not live
    (-inf, [0.0, 0.0])
    >>> out[1, 0, :, 0].round(6).tolist()  # values without spread: each output is the value mean
    [[1.0, 1.0], [1.0, 1.0]]
    """
    if not isinstance(bank, OneStreamClusterBank):
        return _stream().mgf_cluster_attention(q, bank)
    b, t = np.shape(q)[:2]
    out, logits = _stream().mgf_cluster_attention(_tokens(q), bank._bank)
    return out.reshape(b, t, *out.shape[2:]), logits.reshape(b, t, *logits.shape[2:])


def cluster_responsibilities(k, bank):
    """Each key's posterior over its stream's clusters: the softmax over the live clusters of their logits with
    the key as the query, ``k (B, t, H, d) -> (B, t, H, C)``, zero beyond the live prefix
    (docs/mechanisms.md#moment-closure-far-field). With a ``OneStreamClusterBank``, keys ``(b, t, H, d)`` all use
    the one bank.

    Example: stream 0 holds one cluster, of keys (3, 3); stream 1 two, of keys (3, 3) and (-3, -3):

    >>> import numpy as np
    >>> from attnmix.experimental import cluster_responsibilities, empty_cluster_bank, ingest_cluster_batch
    >>> k, v = np.full((2, 4, 1, 2), 3.0), np.ones((2, 4, 1, 2))  # 2 streams of 4 tokens, 1 head, d = 2
    >>> bank, _ = ingest_cluster_batch(empty_cluster_bank(2, 1, 2, 2), k, v, birth_threshold=-2.0)
    >>> k[1] *= -1
    >>> bank, _ = ingest_cluster_batch(bank, k, v, birth_threshold=-2.0)
    >>> keys = np.array([[3.0, 3.0], [-3.0, -3.0]]).reshape(1, 2, 1, 2).repeat(2, axis=0)  # 2 keys per stream
    >>> r = cluster_responsibilities(keys, bank)
    >>> r.shape, r.sum(axis=-1).round(12).tolist()  # (B, t, H, C); each key's row sums to 1
    ((2, 2, 1, 2), [[[1.0], [1.0]], [[1.0], [1.0]]])
    >>> r[1, :, 0].round(3).tolist()  # in stream 1 each key goes to its own cluster
    [[1.0, 0.0], [0.0, 1.0]]
    """
    if not isinstance(bank, OneStreamClusterBank):
        return _stream().cluster_responsibilities(k, bank)
    b, t = np.shape(k)[:2]
    r = _stream().cluster_responsibilities(_tokens(k), bank._bank)
    return r.reshape(b, t, *r.shape[2:])


def update_cluster_bank(bank, k, v, r):
    """The bank combined with tokens ``k, v (B, t, H, d)`` weighted by responsibilities ``r (B, t, H, C)``: each
    cluster's count, means, variances and cross-covariance pooled with the tokens' weighted moments by the
    Chan/Welford update (population moments; docs/mechanisms.md#moment-closure-far-field). Returns a new bank. With
    a ``OneStreamClusterBank``, every sequence's tokens ``(b, t, H, d)`` join the one bank.

    Example: four keys (1, 1) found a cluster, four keys (3, 3) join it:

    >>> import numpy as np
    >>> from attnmix.experimental import empty_cluster_bank, ingest_cluster_batch, update_cluster_bank
    >>> k, v = np.ones((1, 4, 1, 2)), np.zeros((1, 4, 1, 2))  # 1 stream of 4 tokens, 1 head, d = 2
    >>> bank, _ = ingest_cluster_batch(empty_cluster_bank(1, 1, 2, 2), k, v, birth_threshold=-2.0)
    >>> r = np.zeros((1, 4, 1, 2))
    >>> r[..., 0] = 1.0  # every token wholly to cluster 0
    >>> bank = update_cluster_bank(bank, 3 * k, v, r)
    >>> bank.count[0, 0].tolist(), bank.mu_k[0, 0, 0].tolist(), bank.sigma_kk[0, 0, 0].round(3).tolist()
    ([8.0, 0.0], [2.0, 2.0], [1.0, 1.0])
    """
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
    """birth_and_merge(bank, k, v, *, birth_threshold, merge_threshold=None, outlier_top_k=4, cluster_rule="threshold")

    Birth, merge and the misfit receipt of a chunk of tokens ``k, v (B, t, H, d)``, per stream
    (docs/mechanisms.md#moment-closure-far-field). ``cluster_rule``: ``"threshold"`` (a chunk founds a cluster when
    its mean key's best logit lies below ``birth_threshold`` on every head; clusters closer than
    ``merge_threshold``, None for the default rule, merge) or ``"budget"`` (every chunk founds a cluster; when every
    slot is live the closest two merge first; no other merges). A chunk that founds no cluster is not added here
    (``ingest_cluster_batch`` adds it).

    Returns ``(bank, receipts)``, one receipt dict per stream with the keys ``birthed``,
    ``birth_incorporated_batch``, ``merged`` (list of ``(i, j)``), ``merge_distances`` (only when a merge
    happened), ``misfit`` (``{cluster: float}``), ``per_cluster_outlier_tokens`` (``{cluster: {k, v: (n_out, H,
    d), indices, residuals, member_indices}}``, at most ``outlier_top_k`` tokens each) and ``misfit_scalar``; with a
    ``OneStreamClusterBank``, ``(bank, receipt)`` with the one dict. ValueError for shapes, non-finite values or a
    bad ``outlier_top_k``; RuntimeError for a non-finite cluster distance.

    Example: the budget rule with two slots; the third chunk makes room by merging the two closest clusters:

    >>> import numpy as np
    >>> from attnmix.experimental import birth_and_merge, empty_cluster_bank
    >>> rng = np.random.default_rng(0)
    >>> centres = np.array([[3.0, 0.0], [2.4, 0.0], [-3.0, 0.0]])  # of the keys of three chunks
    >>> bank = empty_cluster_bank(batch_size=1, n_head=1, max_clusters=2, head_dim=2)
    >>> for centre in centres:  # 1 stream of 4 tokens, 1 head, d = 2
    ...     k = centre + 0.1 * rng.standard_normal((1, 4, 1, 2))
    ...     v = rng.standard_normal((1, 4, 1, 2))
    ...     bank, receipts = birth_and_merge(bank, k, v, birth_threshold=-2.0, cluster_rule="budget")
    ...     print(receipts[0]["birthed"], receipts[0]["merged"], bank.count[0, 0].tolist())
    True [] [4.0, 0.0]
    True [] [4.0, 4.0]
    True [(0, 1)] [8.0, 4.0]
    >>> bank.mu_k[0, 0, :, 0].round(1).tolist()  # slot 0: the merged pair (3.0 and 2.4); slot 1: the third chunk
    [2.7, -3.0]
    """
    return _ingestion("birth_and_merge", bank, k, v, **options)


def ingest_cluster_batch(bank, k, v, **options):
    """ingest_cluster_batch(bank, k, v, *, birth_threshold, merge_threshold=None, outlier_top_k=4, cluster_rule="threshold")

    ``birth_and_merge``, then the soft update (``update_cluster_bank`` with ``cluster_responsibilities``) of the
    streams whose chunk no birth absorbed: every token is counted once (docs/mechanisms.md#moment-closure-far-field).

    Returns ``(bank, receipts)`` as ``birth_and_merge``, each receipt also holding ``soft_update_applied``,
    ``ingested_tokens_per_head``, ``expected_ingested_tokens_per_head`` and ``count_conserved``; with a
    ``OneStreamClusterBank``, ``(bank, receipt)`` with the one dict. RuntimeError ("cluster ingestion did not
    count every observation exactly once ...") when a head's total did not grow by exactly ``t``.

    Example: three chunks of one stream; the second points the other way and founds a cluster of its own, the
    third joins the first cluster:

    >>> import numpy as np
    >>> from attnmix.experimental import empty_cluster_bank, ingest_cluster_batch
    >>> rng = np.random.default_rng(0)
    >>> centres = np.array([[3.0, 0.0], [-3.0, 0.0], [3.0, 0.0]])  # of the keys of three chunks
    >>> bank = empty_cluster_bank(batch_size=1, n_head=1, max_clusters=4, head_dim=2)
    >>> for centre in centres:  # 1 stream of 4 tokens, 1 head, d = 2
    ...     k = centre + 0.1 * rng.standard_normal((1, 4, 1, 2))
    ...     v = rng.standard_normal((1, 4, 1, 2))
    ...     bank, receipts = ingest_cluster_batch(bank, k, v, birth_threshold=-2.0)
    ...     receipt = receipts[0]
    ...     print(receipt["birthed"], receipt["soft_update_applied"], receipt["count_conserved"],
    ...           bank.count[0, 0].round(3).tolist())
    True False True [4.0, 0.0, 0.0, 0.0]
    True False True [4.0, 4.0, 0.0, 0.0]
    False True True [8.0, 4.0, 0.0, 0.0]
    """
    return _ingestion("ingest_cluster_batch", bank, k, v, **options)
