# SPDX-License-Identifier: Apache-2.0
"""The far-field operations of moment-closure attention on torch tensors, with autograd.

A *cluster bank* summarises the (key, value) pairs that left an attention window as a Gaussian mixture per head:
cluster ``c`` holds a soft count ``n_c``, means ``mu_k``, ``mu_v``, diagonal key variances ``sigma_kk`` and the full
cross-covariance ``sigma_vk = Cov(v, k)`` (row = value dimension). For a query ``q`` of head size ``d``::

    logit_c(q) = q . mu_k / sqrt(d) + sum_j q_j^2 sigma_kk_j / (2 d) + log max(n_c, 1e-8)
    out_c(q)   = mu_v + sigma_vk q / sqrt(d)

``logit_c`` is the log of the sum of ``exp(q . k / sqrt(d))`` over the cluster's tokens when they are Gaussian, so
it shares one softmax with exact attention logits; ``out_c`` is the exact attention output over that population.

Every function runs in attnmix's C++ implementation and records its operations in the caller's autograd graph:
gradients reach the query, the keys and values and every bank tensor that the formulas involve (birth and merge
decisions, and the statistics of a newly born cluster, are discrete and carry no gradient).

Two bank layouts are accepted, and results keep the layout they were given:

* **streams** (attnmix's own): ``count (B, H, C)``, ``mu_k, mu_v, sigma_kk (B, H, C, d)``, ``sigma_vk (B, H, C, d,
  d)`` and ``n_clusters`` a list of ``B`` ints. Stream ``b`` of a batch has its own mixture, fed by and answering
  only row ``b`` of ``q``, ``k`` and ``v``; receipts are lists with one dict per stream.
* **one stream** (the reference design's): ``count (H, C)``, ... and ``n_clusters`` an int. The bank is shared by
  every row of the batch, exactly as in the reference: ``(b, t)`` tokens count as one stream of ``b * t`` tokens;
  receipts are single dicts.

Banks never change in place: each update returns a new ``ClusterBank``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional, Tuple, Union

import torch

from attnmix import _torch

__all__ = [
    "E2_UNAVAILABLE_PIECES",
    "ClusterBank",
    "QuantizedKv",
    "apply_rope",
    "attention_law",
    "birth_and_merge",
    "cluster_responsibilities",
    "dequantize_kv_cache",
    "empty_cluster_bank",
    "ingest_cluster_batch",
    "mgf_cluster_attention",
    "quantize_kv_cache",
    "rope_tables",
    "rotate_half",
    "update_cluster_bank",
]

#: Far-field pieces that are declared but missing: none (kept so that code checking it keeps working).
E2_UNAVAILABLE_PIECES: dict = {}

rope_tables = _torch.rope_tables
apply_rope = _torch.apply_rope
rotate_half = _torch.rotate_half


@dataclass
class ClusterBank:
    """One layer's far-field mixtures (every head); see the module docstring for the two layouts.

    Slots at and beyond a stream's ``n_clusters`` are inactive and hold zeros. A bank built by hand is checked when
    a function receives it (shapes, one dtype and device, finite values, non-negative counts and variances, zero
    inactive slots): ValueError or TypeError names the field.

    Example: a one-stream bank of one head (``d = 2``) built by hand, one live cluster of 3 tokens in 2 slots:

    >>> import math
    >>> import torch
    >>> from attnmix.torch import ClusterBank, mgf_cluster_attention
    >>> bank = ClusterBank(count=torch.tensor([[3.0, 0.0]]), mu_k=torch.tensor([[[1.0, 0.0], [0.0, 0.0]]]),
    ...                    mu_v=torch.tensor([[[0.5, -0.5], [0.0, 0.0]]]), sigma_kk=torch.zeros(1, 2, 2),
    ...                    sigma_vk=torch.zeros(1, 2, 2, 2), n_clusters=1, max_clusters=2)
    >>> bank.one_stream, bank.total_per_head().tolist()
    (True, [3.0])
    >>> out, logits = mgf_cluster_attention(torch.ones(1, 1, 1, 2), bank)  # q = (1, 1), a token of b = t = 1
    >>> round(logits.item(), 4), round(1 / math.sqrt(2) + math.log(3), 4)  # q . mu_k / sqrt(2) + log 3
    (1.8057, 1.8057)
    >>> out.flatten().tolist()  # mu_v: sigma_vk is zero
    [0.5, -0.5]
    >>> import dataclasses
    >>> mgf_cluster_attention(torch.ones(1, 1, 1, 2), dataclasses.replace(bank, count=torch.tensor([[-3.0, 0.0]])))
    Traceback (most recent call last):
        ...
    ValueError: mgf_cluster_attention: bank: count must be >= 0
    """

    count: torch.Tensor
    mu_k: torch.Tensor
    mu_v: torch.Tensor
    sigma_kk: torch.Tensor
    sigma_vk: torch.Tensor
    n_clusters: Union[int, List[int]]
    max_clusters: int

    def detach(self) -> "ClusterBank":
        """The same bank with every tensor cut from the autograd graph."""
        return dataclasses.replace(
            self,
            count=self.count.detach(),
            mu_k=self.mu_k.detach(),
            mu_v=self.mu_v.detach(),
            sigma_kk=self.sigma_kk.detach(),
            sigma_vk=self.sigma_vk.detach(),
        )

    @property
    def one_stream(self) -> bool:
        """True for the reference's one-stream layout (``count`` is ``(H, C)``)."""
        return isinstance(self.count, torch.Tensor) and self.count.dim() == 2

    def total_per_head(self) -> torch.Tensor:
        """The live total count per head: ``(H,)`` for one stream, ``(B, H)`` for streams."""
        return self.count.sum(-1)


def _native(bank: Any, where: str) -> Tuple[tuple, bool]:
    """The tuple the extension takes, and whether the bank has the one-stream layout."""
    if not isinstance(bank, ClusterBank):
        raise TypeError(f"{where}: bank must be an attnmix.torch.ClusterBank (got {type(bank).__name__})")
    fields = (bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk)
    if bank.one_stream:
        if isinstance(bank.n_clusters, bool) or not isinstance(bank.n_clusters, int):
            raise TypeError(
                f"{where}: bank.n_clusters must be an int for a one-stream bank (count (heads, max_clusters)); "
                f"got {type(bank.n_clusters).__name__}"
            )
        fields = tuple(t.unsqueeze(0) if isinstance(t, torch.Tensor) else t for t in fields)
        return fields + ([bank.n_clusters], bank.max_clusters), True
    return fields + (bank.n_clusters, bank.max_clusters), False


def _bank(native: tuple, one_stream: bool) -> ClusterBank:
    count, mu_k, mu_v, sigma_kk, sigma_vk, n_clusters, max_clusters = native
    if one_stream:
        return ClusterBank(
            count[0], mu_k[0], mu_v[0], sigma_kk[0], sigma_vk[0], int(n_clusters[0]), int(max_clusters)
        )
    return ClusterBank(count, mu_k, mu_v, sigma_kk, sigma_vk, list(n_clusters), int(max_clusters))


def _tokens(x: Any, where: str, name: str, one_stream: bool) -> Any:
    """A (b, t, H, d) tensor as the extension's (B, t', H, d): one-stream banks see one stream of b * t tokens."""
    if not one_stream or not isinstance(x, torch.Tensor) or x.dim() != 4:
        return x  # the extension reports what is wrong
    return x.reshape(1, x.shape[0] * x.shape[1], x.shape[2], x.shape[3])


def empty_cluster_bank(
    batch_size: Optional[int],
    n_head: int,
    max_clusters: int,
    head_dim: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: Union[str, torch.device] = "cpu",
) -> ClusterBank:
    """An all-zero bank: ``batch_size`` streams, or the one-stream layout when ``batch_size`` is None.

    ValueError unless every size is a positive integer; ``dtype`` is torch.float32 or torch.float64 and ``device``
    the CPU.

    Example: two streams of 3 heads with 4 slots of head size 8, and the one-stream layout:

    >>> import torch
    >>> from attnmix.torch import empty_cluster_bank
    >>> bank = empty_cluster_bank(2, n_head=3, max_clusters=4, head_dim=8)
    >>> tuple(bank.count.shape), tuple(bank.sigma_vk.shape), bank.n_clusters, bank.count.dtype
    ((2, 3, 4), (2, 3, 4, 8, 8), [0, 0], torch.float32)
    >>> one = empty_cluster_bank(None, n_head=3, max_clusters=4, head_dim=8, dtype=torch.float64)
    >>> tuple(one.count.shape), one.n_clusters, one.one_stream, float(one.mu_k.abs().sum())
    ((3, 4), 0, True, 0.0)
    """
    if torch.device(device).type != "cpu":
        raise ValueError(f"empty_cluster_bank: device must be the CPU (got {device}); attnmix.torch runs on the CPU")
    one_stream = batch_size is None
    native = _torch._empty_cluster_bank(1 if one_stream else batch_size, n_head, max_clusters, head_dim, dtype)
    return _bank(native, one_stream)


def mgf_cluster_attention(q: torch.Tensor, bank: ClusterBank) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of queries ``q (b, t, H, d)`` against the live clusters.

    Returns ``(out (b, t, n, H, d), logits (b, t, n, H))`` with ``n`` the largest live count of any stream; a slot
    beyond a stream's live prefix gets logit -inf and output 0 (exactly as if it were absent). With ``n = 0`` both
    are empty. With one live cluster, ``out`` equals the ``attention_law`` mean of that population.

    Example: 8 random tokens of 2 heads become one cluster per head; its logits and outputs are the formulas of the
    module docs:

    >>> import torch
    >>> from attnmix.torch import empty_cluster_bank, ingest_cluster_batch, mgf_cluster_attention
    >>> _ = torch.manual_seed(0)
    >>> k, v, q = torch.randn(3, 1, 8, 2, 4, dtype=torch.float64)  # each (b, t, H, d) = (1, 8, 2, 4)
    >>> bank = empty_cluster_bank(1, n_head=2, max_clusters=3, head_dim=4, dtype=torch.float64)
    >>> bank, receipts = ingest_cluster_batch(bank, k, v, birth_threshold=-2.0)
    >>> out, logits = mgf_cluster_attention(q, bank)
    >>> bank.n_clusters, tuple(out.shape), tuple(logits.shape)  # n = 1 live cluster
    ([1], (1, 8, 1, 2, 4), (1, 8, 1, 2))
    >>> n, mu_k, mu_v, s_kk, s_vk = (x[0, :, 0] for x in (bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk,
    ...                                                    bank.sigma_vk))  # cluster 0 of each head
    >>> torch.allclose(logits[:, :, 0], (q * mu_k).sum(-1) / 2 + (q**2 * s_kk).sum(-1) / 8 + n.log())
    True
    >>> torch.allclose(out[:, :, 0], mu_v + torch.einsum("hij,bthj->bthi", s_vk, q) / 2)
    True
    """
    native, one_stream = _native(bank, "mgf_cluster_attention")
    out, logits = _torch._mgf_cluster_attention(_tokens(q, "mgf_cluster_attention", "q", one_stream), native)
    if one_stream:
        b, t = q.shape[0], q.shape[1]
        out = out.reshape(b, t, *out.shape[2:])
        logits = logits.reshape(b, t, *logits.shape[2:])
    return out, logits


def cluster_responsibilities(k: torch.Tensor, bank: ClusterBank) -> torch.Tensor:
    """``softmax_c logit_c(k)`` over the live clusters, each token's own key acting as the query: ``(b, t, H, C)``.

    Exactly zero beyond the live prefix, and all zero for a stream without clusters.

    Example: two chunks of keys around (3, 3) and (-3, -3), each born as a cluster (``cluster_rule="budget"``); each
    token is given to its own chunk's cluster, and the third slot stays empty:

    >>> import torch
    >>> from attnmix.torch import birth_and_merge, cluster_responsibilities, empty_cluster_bank
    >>> _ = torch.manual_seed(0)
    >>> k = torch.cat([torch.randn(1, 4, 1, 2) + 3, torch.randn(1, 4, 1, 2) - 3], dim=1)  # (b, t, H, d)
    >>> bank = empty_cluster_bank(None, n_head=1, max_clusters=3, head_dim=2)  # one stream
    >>> for chunk in k.split(4, dim=1):
    ...     bank, receipt = birth_and_merge(bank, chunk, chunk, birth_threshold=0.0, cluster_rule="budget")
    >>> r = cluster_responsibilities(k, bank)
    >>> bank.n_clusters, tuple(r.shape)
    (2, (1, 8, 1, 3))
    >>> r[0, :, 0].argmax(-1).tolist(), torch.allclose(r.sum(-1), torch.ones(1, 8, 1)), bool((r[..., 2] == 0).all())
    ([0, 0, 0, 0, 1, 1, 1, 1], True, True)
    """
    native, one_stream = _native(bank, "cluster_responsibilities")
    r = _torch._cluster_responsibilities(_tokens(k, "cluster_responsibilities", "k", one_stream), native)
    return r.reshape(k.shape[0], k.shape[1], *r.shape[2:]) if one_stream else r


def update_cluster_bank(
    bank: ClusterBank, k: torch.Tensor, v: torch.Tensor, responsibilities: torch.Tensor
) -> ClusterBank:
    """The bank combined with tokens ``k, v (b, t, H, d)`` weighted by ``responsibilities (b, t, H, C)``.

    Per stream, head and cluster, the tokens' weighted count, means and (population) second moments are pooled
    with the cluster's by the parallel (Chan) combination; a cluster that receives no weight is unchanged, an
    empty one takes the batch's moments. Differentiable in every input.

    Example: a cluster born from 3 tokens, updated with 3 more of full weight, holds the moments of all 6:

    >>> import torch
    >>> from attnmix.torch import birth_and_merge, empty_cluster_bank, update_cluster_bank
    >>> _ = torch.manual_seed(0)
    >>> k1, v1, k2, v2 = torch.randn(4, 1, 3, 1, 2, dtype=torch.float64)  # each (b, t, H, d) = (1, 3, 1, 2)
    >>> bank = empty_cluster_bank(1, n_head=1, max_clusters=1, head_dim=2, dtype=torch.float64)
    >>> bank, _ = birth_and_merge(bank, k1, v1, birth_threshold=0.0)  # cluster 0: the first 3 tokens
    >>> new = update_cluster_bank(bank, k2, v2, torch.ones(1, 3, 1, 1, dtype=torch.float64))
    >>> bank.count.flatten().tolist(), new.count.flatten().tolist()  # banks never change in place
    ([3.0], [6.0])
    >>> k, v = torch.cat([k1, k2], dim=1)[0, :, 0], torch.cat([v1, v2], dim=1)[0, :, 0]  # the 6 tokens, (6, d)
    >>> torch.allclose(new.mu_k[0, 0, 0], k.mean(0)), torch.allclose(new.sigma_kk[0, 0, 0], k.var(0, unbiased=False))
    (True, True)
    >>> torch.allclose(new.sigma_vk[0, 0, 0], (v - v.mean(0)).T @ (k - k.mean(0)) / 6)  # Cov(v, k)
    True
    """
    native, one_stream = _native(bank, "update_cluster_bank")
    out = _torch._update_cluster_bank(
        native,
        _tokens(k, "update_cluster_bank", "k", one_stream),
        _tokens(v, "update_cluster_bank", "v", one_stream),
        _tokens(responsibilities, "update_cluster_bank", "responsibilities", one_stream),
    )
    return _bank(out, one_stream)


class QuantizedKv(NamedTuple):
    """Int8 codes of a tensor with one affine scale per row (the last dimension): ``codes`` (int8, the tensor's
    shape), ``low`` and ``scale`` (float32, the shape without its last dimension).

    Example: the codes of a (2, 3, 8) tensor, taken apart as a tuple:

    >>> import torch
    >>> from attnmix.torch import quantize_kv_cache
    >>> codes, low, scale = quantize_kv_cache(torch.randn(2, 3, 8))
    >>> codes.dtype, tuple(codes.shape), low.dtype, tuple(low.shape), tuple(scale.shape)
    (torch.int8, (2, 3, 8), torch.float32, (2, 3), (2, 3))
    >>> bool((codes.amin(-1) == -128).all()), bool((codes.amax(-1) == 127).all())  # each row spans the int8 range
    (True, True)
    """

    codes: torch.Tensor
    low: torch.Tensor
    scale: torch.Tensor


def quantize_kv_cache(x: torch.Tensor) -> QuantizedKv:
    """Affine int8 quantisation of keys or values ``x`` (float32 or float64, any shape), row by row.

    Per row: ``low = min``, ``scale = (max - min) / 255``, ``code = round((x - low) / scale) - 128``; the
    reconstruction ``low + (code + 128) * scale`` is within ``scale / 2`` of ``x`` (a constant row is exact).
    Storage: one byte per value plus 8 bytes per row. Carries no gradient. ValueError for a non-finite value.

    Example: every value of 6 random rows is reconstructed within half a step of its row:

    >>> import torch
    >>> from attnmix.torch import dequantize_kv_cache, quantize_kv_cache
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(2, 3, 8)
    >>> q = quantize_kv_cache(x)
    >>> torch.allclose(q.scale, (x.amax(-1) - x.amin(-1)) / 255), torch.equal(q.low, x.amin(-1))
    (True, True)
    >>> bool(((dequantize_kv_cache(q) - x).abs() <= q.scale[..., None] / 2).all())
    True
    """
    return QuantizedKv(*_torch._quantize_kv_cache(x))


def dequantize_kv_cache(q: QuantizedKv, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The reconstruction of ``quantize_kv_cache`` in ``dtype`` (float32 or float64).

    Example: a constant row comes back exactly; a ramp of 256 steps too, to float32 rounding:

    >>> import torch
    >>> from attnmix.torch import dequantize_kv_cache, quantize_kv_cache
    >>> dequantize_kv_cache(quantize_kv_cache(torch.full((1, 4), 0.25))).tolist()
    [[0.25, 0.25, 0.25, 0.25]]
    >>> ramp = torch.arange(256, dtype=torch.float64) / 255  # 0, 1/255, ..., 1: each value on the code grid
    >>> back = dequantize_kv_cache(quantize_kv_cache(ramp), torch.float64)
    >>> back.dtype, float((back - ramp).abs().max()) < 1e-6
    (torch.float64, True)
    """
    codes, low, scale = q
    return _torch._dequantize_kv_cache(codes, low, scale, dtype)


def _ingestion(function, name, bank, k, v, birth_threshold, merge_threshold, outlier_top_k, cluster_rule):
    native, one_stream = _native(bank, name)
    out, receipts = function(
        native,
        _tokens(k, name, "k", one_stream),
        _tokens(v, name, "v", one_stream),
        birth_threshold,
        merge_threshold,
        outlier_top_k,
        cluster_rule,
    )
    return _bank(out, one_stream), (receipts[0] if one_stream else receipts)


def birth_and_merge(
    bank: ClusterBank,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    birth_threshold: float,
    merge_threshold: Optional[float] = None,
    outlier_top_k: int = 4,
    cluster_rule: str = "threshold",
):
    """Once per chunk: birth of a cluster, merges, and the misfit receipt. Returns ``(bank, receipt)``.

    **Birth**: when every head's best ``logit_c`` of the chunk's mean key is below ``birth_threshold`` and a slot
    is free, the chunk becomes a new cluster (its count, means, variances floored at 1e-6, and cross-covariance).
    **Merge**: two clusters whose RMS standardised key-mean distance is below ``merge_threshold`` (default
    ``2.65 + 6 / sqrt(max(n_small, 1))``, ``n_small`` the smaller count) are pooled and the bank compacted.
    ``cluster_rule``: ``"threshold"`` (births and merges as above) or ``"budget"`` (every chunk births its own
    cluster; when every slot is live the two closest clusters merge first to make room; no other merges, the thresholds
    unused), TypeError for a non-str.
    The receipt (one dict per stream, or one dict for a one-stream bank) holds ``birthed``,
    ``birth_incorporated_batch``, ``merged`` ([(i, j)]: j merged into i), ``merge_distances`` (when any),
    ``misfit`` ({cluster: mean residual norm of its member tokens}), ``per_cluster_outlier_tokens`` ({cluster:
    {k, v, indices, member_indices}}) and ``misfit_scalar``. Decisions and born statistics carry no gradient; a
    merge pools the bank's own (differentiable) statistics. ValueError for bad shapes, dtypes or non-finite values.

    Example: chunks of 4 keys around (4, 4), (-4, -4) and (4, 4) again: the first two are born as clusters, the third
    fits cluster 0 (and ``birth_and_merge`` alone does not add it: ``ingest_cluster_batch`` does); a merge threshold
    above the clusters' distance pools them:

    >>> import torch
    >>> from attnmix.torch import birth_and_merge, empty_cluster_bank
    >>> _ = torch.manual_seed(0)
    >>> k = torch.randn(3, 1, 4, 1, 2) + torch.tensor([4.0, -4.0, 4.0]).view(3, 1, 1, 1, 1)  # 3 chunks (b, t, H, d)
    >>> bank = empty_cluster_bank(None, n_head=1, max_clusters=4, head_dim=2)  # one stream
    >>> for chunk in k:
    ...     bank, receipt = birth_and_merge(bank, chunk, chunk, birth_threshold=-2.0)
    ...     print(receipt["birthed"], bank.n_clusters, bank.count.tolist())
    True 1 [[4.0, 0.0, 0.0, 0.0]]
    True 2 [[4.0, 4.0, 0.0, 0.0]]
    False 2 [[4.0, 4.0, 0.0, 0.0]]
    >>> pooled, receipt = birth_and_merge(bank, k[1], k[1], birth_threshold=-2.0, merge_threshold=20.0)
    >>> receipt["merged"], round(receipt["merge_distances"][0], 2), pooled.n_clusters, pooled.count.tolist()
    ([(0, 1)], 10.17, 1, [[8.0, 0.0, 0.0, 0.0]])
    """
    return _ingestion(
        _torch._birth_and_merge,
        "birth_and_merge",
        bank,
        k,
        v,
        birth_threshold,
        merge_threshold,
        outlier_top_k,
        cluster_rule,
    )


def ingest_cluster_batch(
    bank: ClusterBank,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    birth_threshold: float,
    merge_threshold: Optional[float] = None,
    outlier_top_k: int = 4,
    cluster_rule: str = "threshold",
):
    """Adds a batch of evicted tokens to the bank exactly once. Returns ``(bank, receipt)``.

    ``birth_and_merge`` on the detached tokens (with its ``cluster_rule``); then, for a stream with clusters whose
    batch no birth absorbed, the soft update with ``cluster_responsibilities(k)`` (differentiable in ``k``, ``v`` and
    the bank). The receipt adds ``soft_update_applied``, ``ingested_tokens_per_head``, ``expected_ingested_tokens_per_head`` and
    ``count_conserved``; RuntimeError when a head's total did not grow by exactly the number of tokens.

    Example: the chunks of ``birth_and_merge``'s example; the third, not born as a cluster, joins cluster 0 by
    the soft update, and every token is counted once:

    >>> import torch
    >>> from attnmix.torch import empty_cluster_bank, ingest_cluster_batch
    >>> _ = torch.manual_seed(0)
    >>> k = torch.randn(3, 1, 4, 1, 2) + torch.tensor([4.0, -4.0, 4.0]).view(3, 1, 1, 1, 1)  # 3 chunks (b, t, H, d)
    >>> bank = empty_cluster_bank(None, n_head=1, max_clusters=4, head_dim=2)
    >>> for chunk in k:
    ...     bank, receipt = ingest_cluster_batch(bank, chunk, chunk, birth_threshold=-2.0)
    ...     print(receipt["birthed"], receipt["soft_update_applied"], receipt["count_conserved"],
    ...           [round(n, 3) for n in bank.count[0].tolist()])
    True False True [4.0, 0.0, 0.0, 0.0]
    True False True [4.0, 4.0, 0.0, 0.0]
    False True True [8.0, 4.0, 0.0, 0.0]
    """
    return _ingestion(
        _torch._ingest_cluster_batch,
        "ingest_cluster_batch",
        bank,
        k,
        v,
        birth_threshold,
        merge_threshold,
        outlier_top_k,
        cluster_rule,
    )


class GaussianLaw:
    """A Gaussian law over a d-vector: ``mean (d,)`` and ``cov (d, d)`` tensors. ``GaussianLaw(mu=..., covar=...)``
    and the attributes ``mu`` and ``covar`` are the reference design's names for the same."""

    def __init__(self, mean: Optional[torch.Tensor] = None, cov: Optional[torch.Tensor] = None, *,
                 mu: Optional[torch.Tensor] = None, covar: Optional[torch.Tensor] = None):
        if (mean is None) == (mu is None) or (cov is None) == (covar is None):
            raise TypeError("GaussianLaw: give exactly one of mean or mu, and one of cov or covar")
        self.mean = mean if mu is None else mu
        self.cov = cov if covar is None else covar

    @property
    def mu(self) -> torch.Tensor:
        return self.mean

    @property
    def covar(self) -> torch.Tensor:
        return self.cov

    def __repr__(self) -> str:
        return f"GaussianLaw(mean={self.mean!r}, cov={self.cov!r})"


def attention_law(law, qkv_weight, qkv_bias, proj_weight, proj_bias=None, n_head: int = 1):
    """The exact Gaussian law of an attention layer's output when its input ``h`` is ``N(law.mean, law.cov)``.

    ``law`` is a GaussianLaw or a ``(mean, cov)`` pair; the weights are those of ``qkv = Linear(d, 3d)`` and
    ``proj = Linear(d, d)``. Per head the population's attention output is affine in the query,
    ``mu_v + Sigma_vk q / sqrt(d_head)``, so the law is pushed exactly through ``qkv``, that map and ``proj``.
    ``proj_bias=None`` is no bias; ``n_head`` defaults to one head.
    Returns ``(GaussianLaw, jacobian (d, d))``; differentiable in every tensor. ValueError when ``d_model`` is not
    a multiple of ``n_head`` or a shape does not match.

    Example: one head of width 4; the law's mean, covariance and Jacobian agree with the same affine map written in
    plain torch (``mu_v = W_v m + b_v``, ``Sigma_vk = W_v S W_k^T``, the query ``W_q h + b_q``):

    >>> import torch
    >>> from attnmix.torch import attention_law
    >>> _ = torch.manual_seed(0)
    >>> qkv, proj = torch.nn.Linear(4, 12).double(), torch.nn.Linear(4, 4).double()
    >>> m, S = torch.tensor([1.0, -1.0, 0.5, 0.0], dtype=torch.float64), torch.eye(4, dtype=torch.float64)
    >>> law, J = attention_law((m, S), qkv.weight, qkv.bias, proj.weight, proj.bias)
    >>> tuple(law.mean.shape), tuple(law.cov.shape), tuple(J.shape)
    ((4,), (4, 4), (4, 4))
    >>> (W_q, W_k, W_v), (b_q, b_k, b_v) = qkv.weight.split(4), qkv.bias.split(4)
    >>> mu_v, Sigma_vk = W_v @ m + b_v, W_v @ S @ W_k.T
    >>> torch.allclose(law.mean, proj(mu_v + Sigma_vk @ (W_q @ m + b_q) / 2))  # / sqrt(d_head)
    True
    >>> torch.allclose(J, proj.weight @ Sigma_vk @ W_q / 2), torch.allclose(law.cov, J @ S @ J.T)
    (True, True)
    """
    if proj_bias is None:
        proj_bias = torch.zeros(proj_weight.shape[0], dtype=proj_weight.dtype, device=proj_weight.device)
    if isinstance(law, GaussianLaw):
        mean, cov = law.mean, law.cov
    elif isinstance(law, (tuple, list)) and len(law) == 2:
        mean, cov = law
    else:
        raise TypeError(f"attention_law: law must be a GaussianLaw or a (mean, cov) pair (got {type(law).__name__})")
    out_mean, out_cov, jacobian = _torch._attention_law(
        mean, cov, qkv_weight, qkv_bias, proj_weight, proj_bias, n_head
    )
    return GaussianLaw(out_mean, out_cov), jacobian
