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
    shape), ``low`` and ``scale`` (float32, the shape without its last dimension)."""

    codes: torch.Tensor
    low: torch.Tensor
    scale: torch.Tensor


def quantize_kv_cache(x: torch.Tensor) -> QuantizedKv:
    """Affine int8 quantisation of keys or values ``x`` (float32 or float64, any shape), row by row.

    Per row: ``low = min``, ``scale = (max - min) / 255``, ``code = round((x - low) / scale) - 128``; the
    reconstruction ``low + (code + 128) * scale`` is within ``scale / 2`` of ``x`` (a constant row is exact).
    Storage: one byte per value plus 8 bytes per row. Carries no gradient. ValueError for a non-finite value.
    """
    return QuantizedKv(*_torch._quantize_kv_cache(x))


def dequantize_kv_cache(q: QuantizedKv, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The reconstruction of ``quantize_kv_cache`` in ``dtype`` (float32 or float64)."""
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

    ``birth_and_merge`` on the detached tokens (with its ``cluster_rule``); then, for a stream with clusters whose batch no birth absorbed,
    the soft update with ``cluster_responsibilities(k)`` (differentiable in ``k``, ``v`` and the bank). The
    receipt adds ``soft_update_applied``, ``ingested_tokens_per_head``, ``expected_ingested_tokens_per_head`` and
    ``count_conserved``; RuntimeError when a head's total did not grow by exactly the number of tokens.
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
