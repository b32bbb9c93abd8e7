# SPDX-License-Identifier: Apache-2.0
"""Streaming attention layers for your own architectures.

Each layer is the attention sublayer of a pre-norm Transformer block on its own: it maps a chunk of (normalised)
hidden states ``h (batch, t, d_model)`` and the layer's carried state to the attention output and the new state::

    q, k, v = split(qkv(h))                                  each (batch, t, n_head, head_dim)
    K = cache_k ++ k, V = cache_v ++ v                       the raw keys and values of the last tokens, then the chunk
    near = RoPE(q) . RoPE(K) / sqrt(head_dim)                RoPE at absolute positions, masked to the window
    far  = logit_c(q) for each cluster of the bank           moment closure only (un-rotated query)
    out  = proj(softmax([near ; far]) . [V ; out_c(q)])      one joint softmax over tokens and clusters

``qkv = Linear(d_model, 3 d_model)`` (its output splits as ``[q | k | v]``, each head-major) and ``proj =
Linear(d_model, d_model)`` are ordinary ``torch.nn.Parameter``\\ s (``qkv.weight``, ``qkv.bias``, ``proj.weight``,
``proj.bias``): optimizers, ``state_dict``, ``.double()``, ``torch.save`` and ``copy.deepcopy`` work as with any
module. The computation runs in attnmix's C++ implementation and joins your autograd graph.

RoPE uses the rotate-half convention with base 10000 (pairs ``(x_k, x_{k + head_dim/2})``); values are never
rotated and the cache holds raw keys, so streaming a sequence in chunks through ``SlidingWindowSelfAttention``
gives exactly the one-pass windowed attention. A query at position ``P`` sees the keys at ``P - window + 1 ... P``.

``MomentClosureSelfAttention`` adds a far field: the keys and values leaving the window are summarised per stream
and head by at most ``max_clusters`` Gaussian clusters (count, means, diagonal key variances, value-key
cross-covariance). A cluster's logit ``q . mu_k / sqrt(d) + sum_j q_j^2 sigma_kk_j / (2 d) + log count`` and output
``mu_v + sigma_vk q / sqrt(d)`` are the exact attention logit and output of a Gaussian population, so the window's
tokens and the clusters share one softmax. Evicted tokens join the bank at the end of each chunk: a new cluster when
the chunk's mean key fits no cluster (its best logit is below ``birth_threshold`` in every head) and a slot is
free, otherwise a soft, differentiable update weighted by each token's responsibilities; close clusters merge
(``merge_threshold``; default ``2.65 + 6 / sqrt(max(n_small, 1))``). The layer checks that every position it has
seen is represented exactly once, in the window or in the bank (RuntimeError otherwise), and reports what
ingestion did in ``last_receipt`` (one layer's receipt, as ``MomentClosureAttention.last_receipts[l]``, with the
share of the attention that went to the far field, ``far_attention_share``). Gradients flow through the soft
updates; the birth and merge decisions and the statistics of a newly born cluster carry none. A token that has slid out of a late query's window but is evicted
only at the end of the chunk is visible to that query in neither field.

The state is bounded: the window's raw keys and values (``batch * window * 2 * d_model`` numbers) and a bank of
fixed size, whatever the length of the stream (``SlidingWindowSelfAttention(window=None)`` is full causal
attention, whose cache grows with the stream). ``state=None`` starts an empty stream; ``detach_state`` cuts the
state from the autograd graph (truncated backpropagation through time). CPU; float32 and float64 (``h`` must have
the parameters' dtype).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import torch

from attnmix import _torch
from attnmix.torch import functional

__all__ = [
    "MomentClosureLayerState",
    "MomentClosureSelfAttention",
    "SlidingWindowLayerState",
    "SlidingWindowSelfAttention",
]


def _nbytes(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _detach(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach()


@dataclass
class SlidingWindowLayerState:
    """What a ``SlidingWindowSelfAttention`` carries from one chunk to the next.

    ``cache_k``, ``cache_v``: the raw (un-rotated) keys and values of the last ``min(window, pos)`` tokens, each
    ``(batch_size, length, n_head, head_dim)``, or None while empty; ``pos``: the absolute position of the next
    token; ``batch_size``: the number of streams.

    Example: a window of 3 after 7 tokens of 2 streams keeps the last 3 keys and values:

    >>> import torch
    >>> from attnmix.torch import SlidingWindowSelfAttention
    >>> _ = torch.manual_seed(0)
    >>> attn = SlidingWindowSelfAttention(d_model=8, n_head=2, window=3)
    >>> attn.init_state(2)
    SlidingWindowLayerState(cache_k=None, cache_v=None, pos=0, batch_size=2)
    >>> out, state = attn(torch.randn(2, 7, 8))
    >>> state.pos, tuple(state.cache_k.shape), state.nbytes  # 2 tensors of 2 * 3 * 2 * 4 float32 numbers
    (7, (2, 3, 2, 4), 384)
    >>> state.cache_k.requires_grad, state.detach().cache_k.requires_grad
    (True, False)
    """

    cache_k: Optional[torch.Tensor]
    cache_v: Optional[torch.Tensor]
    pos: int
    batch_size: int

    def detach(self) -> "SlidingWindowLayerState":
        """The same state with every tensor cut from the autograd graph."""
        return dataclasses.replace(self, cache_k=_detach(self.cache_k), cache_v=_detach(self.cache_v))

    @property
    def nbytes(self) -> int:
        """Bytes held by the tensors of the state."""
        return _nbytes(self.cache_k) + _nbytes(self.cache_v)

    def _to_native(self) -> tuple:
        return (self.cache_k, self.cache_v, self.pos, self.batch_size)

    @classmethod
    def _from_native(cls, native: tuple) -> "SlidingWindowLayerState":
        cache_k, cache_v, pos, batch_size = native
        return cls(cache_k, cache_v, int(pos), int(batch_size))


@dataclass
class MomentClosureLayerState:
    """What a ``MomentClosureSelfAttention`` carries from one chunk to the next.

    The window as in ``SlidingWindowLayerState`` (``cache_k``, ``cache_v``, ``pos``, ``batch_size``) and ``bank``,
    an ``attnmix.torch.ClusterBank`` with one mixture per stream (``count (batch_size, n_head, max_clusters)``, ...)
    that holds the ``pos - min(window, pos)`` tokens evicted from the window.

    Example: after 12 tokens through a window of 4, each head's bank counts the 8 evicted ones:

    >>> import torch
    >>> from attnmix.torch import MomentClosureSelfAttention
    >>> _ = torch.manual_seed(0)
    >>> attn = MomentClosureSelfAttention(d_model=8, n_head=2, window=4, max_clusters=2)
    >>> out, state = attn(torch.randn(1, 12, 8))
    >>> state.pos, tuple(state.cache_k.shape), tuple(state.bank.count.shape)  # bank: (batch_size, n_head, clusters)
    (12, (1, 4, 2, 4), (1, 2, 2))
    >>> [round(n, 3) for n in state.bank.total_per_head()[0].tolist()], state.pos - 4
    ([8.0, 8.0], 8)
    >>> state.detach().bank.mu_k.requires_grad, state.nbytes > 0
    (False, True)
    """

    cache_k: Optional[torch.Tensor]
    cache_v: Optional[torch.Tensor]
    pos: int
    batch_size: int
    bank: functional.ClusterBank

    def detach(self) -> "MomentClosureLayerState":
        """The same state with every tensor (the cache and the bank) cut from the autograd graph."""
        return dataclasses.replace(
            self, cache_k=_detach(self.cache_k), cache_v=_detach(self.cache_v), bank=self.bank.detach()
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the tensors of the state (the cache and the bank)."""
        bank = self.bank
        return (
            _nbytes(self.cache_k)
            + _nbytes(self.cache_v)
            + sum(_nbytes(t) for t in (bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk))
        )

    def _to_native(self, where: str) -> tuple:
        native, one_stream = functional._native(self.bank, f"{where}: state.bank")
        if one_stream:
            raise ValueError(
                f"{where}: state.bank must hold one mixture per stream (count (batch_size, n_head, max_clusters)); "
                "got the one-stream layout"
            )
        return (self.cache_k, self.cache_v, self.pos, self.batch_size, native)

    @classmethod
    def _from_native(cls, native: tuple) -> "MomentClosureLayerState":
        cache_k, cache_v, pos, batch_size, bank = native
        return cls(cache_k, cache_v, int(pos), int(batch_size), functional._bank(bank, False))


class _Projection(torch.nn.Module):
    """The parameters of one linear map of an attention layer: ``weight (out_features, in_features)`` and ``bias``.

    The attention layer computes with them itself; calling this module applies the same affine map.
    """

    def __init__(self, weight: torch.nn.Parameter, bias: torch.nn.Parameter):
        super().__init__()
        self.weight = weight
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}"


class _StreamingSelfAttention(torch.nn.Module):
    """What both layers share: the C++ module, its parameters registered as this module's, and pickling."""

    _native_type: Any = None
    _state_type: Any = None
    _name = ""

    def __init__(self, **config: Any):
        super().__init__()
        self._config: Dict[str, Any] = dict(config)
        native = self._native_type(**config)
        parameters = dict(native.named_parameters())
        for tensor in parameters.values():
            # The Python object of the C++ module's own tensor becomes a Parameter: it stays that tensor.
            tensor.__class__ = torch.nn.Parameter
        self._native = native
        self.qkv = _Projection(parameters["qkv.weight"], parameters["qkv.bias"])
        self.proj = _Projection(parameters["proj.weight"], parameters["proj.bias"])
        self.last_receipt: Optional[dict] = None

    # ---- streaming ---------------------------------------------------------------------------------------------

    def init_state(self, batch_size: int):
        """An empty state for ``batch_size`` streams (in the parameters' dtype); the same as passing None."""
        return self._state_type._from_native(self._native.init_state(batch_size))

    def detach_state(self, state):
        """``state`` with every tensor cut from the autograd graph (the values are unchanged)."""
        return self._checked_state(state).detach()

    def forward(self, h: torch.Tensor, state=None) -> Tuple[torch.Tensor, Any]:
        native_state = None if state is None else self._native_state(self._checked_state(state))
        out, new_state, receipt = self._native.forward(h, native_state)
        self.last_receipt = receipt
        return out, self._state_type._from_native(new_state)

    def _checked_state(self, state):
        if not isinstance(state, self._state_type):
            raise TypeError(
                f"{self._name}: state must be a {self._state_type.__name__} or None (got {type(state).__name__})"
            )
        return state

    def _native_state(self, state) -> tuple:
        return state._to_native()

    # ---- module plumbing ---------------------------------------------------------------------------------------

    def extra_repr(self) -> str:
        return ", ".join(f"{name}={value!r}" for name, value in self._config.items())

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_native"]  # rebuilt by __setstate__ around the saved parameter values
        state["last_receipt"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        native = self._native_type(**self._config)
        fresh = dict(native.named_parameters())
        for prefix, container in (("qkv", self.qkv), ("proj", self.proj)):
            for name in ("weight", "bias"):
                saved = container._parameters[name]
                tensor = fresh[f"{prefix}.{name}"]
                tensor.__class__ = torch.nn.Parameter
                with torch.no_grad():
                    tensor.data = saved.data  # the saved dtype and values; the C++ module reads this tensor
                tensor.requires_grad_(saved.requires_grad)
                if saved.grad is not None:
                    tensor.grad = saved.grad
                container._parameters[name] = tensor
        self._native = native


class SlidingWindowSelfAttention(_StreamingSelfAttention):
    """Causal self-attention over a sliding window of the stream, with RoPE at absolute positions.

    ``SlidingWindowSelfAttention(d_model, n_head, window)``: ``d_model`` divisible by ``n_head`` with an even
    ``head_dim = d_model / n_head``; ``window`` a positive integer (each query sees itself and the ``window - 1``
    tokens before it) or None for full causal attention (then the state grows with the stream). ValueError for
    invalid sizes, TypeError for non-integers.

    ``forward(h, state=None) -> (out, state)``: ``h`` is ``(batch, t, d_model)`` with ``t >= 1`` in the parameters'
    dtype, ``state`` a ``SlidingWindowLayerState`` of the same batch size (None: a new stream); ``out`` is
    ``(batch, t, d_model)``. Streaming a sequence in chunks gives the same outputs as one pass over it.
    ``last_receipt`` is always None (there is no far field to report on).

    Example: with ``window=1`` each query sees only its own token, so the output is ``proj`` of the values; with a
    window of 3, two chunks give the outputs of one pass:

    >>> import torch
    >>> from attnmix.torch import SlidingWindowSelfAttention
    >>> _ = torch.manual_seed(0)
    >>> h = torch.randn(2, 7, 8)  # (batch, t, d_model)
    >>> own = SlidingWindowSelfAttention(d_model=8, n_head=2, window=1)
    >>> out, state = own(h)
    >>> tuple(out.shape), torch.allclose(out, own.proj(own.qkv(h)[..., 16:]), atol=1e-6)  # [q | k | v]
    ((2, 7, 8), True)
    >>> attn = SlidingWindowSelfAttention(d_model=8, n_head=2, window=3)
    >>> whole, _ = attn(h)
    >>> first, state = attn(h[:, :4])
    >>> rest, state = attn(h[:, 4:], state)
    >>> torch.allclose(whole, torch.cat([first, rest], dim=1), atol=1e-6), attn.last_receipt
    (True, None)
    >>> whole.pow(2).sum().backward()
    >>> [(name, tuple(p.grad.shape)) for name, p in attn.named_parameters()]  # every parameter has its gradient
    [('qkv.weight', (24, 8)), ('qkv.bias', (24,)), ('proj.weight', (8, 8)), ('proj.bias', (8,))]
    """

    _native_type = _torch._SlidingWindowSelfAttention
    _state_type = SlidingWindowLayerState
    _name = "SlidingWindowSelfAttention"

    def __init__(self, d_model: int, n_head: int, window: Optional[int]):
        super().__init__(d_model=d_model, n_head=n_head, window=window)


class MomentClosureSelfAttention(_StreamingSelfAttention):
    """Sliding-window self-attention plus a bounded far field over the tokens that left the window.

    ``MomentClosureSelfAttention(d_model, n_head, window, max_clusters, birth_threshold=-2.0,
    merge_threshold=None, cluster_rule="threshold")``: sizes as ``SlidingWindowSelfAttention`` (``window`` a positive
    integer), ``max_clusters`` clusters per stream and head, finite thresholds, ``cluster_rule`` ``"threshold"`` or
    ``"budget"`` (as ``attnmix.torch.functional.birth_and_merge``). ValueError for invalid values, TypeError for
    values of the wrong type.

    ``forward(h, state=None) -> (out, state)`` as ``SlidingWindowSelfAttention``, with a ``MomentClosureLayerState``.
    After each call ``last_receipt`` is ``{"batch_size", "streams": [one dict per stream: birthed,
    birth_incorporated_batch, merged, misfit, per_cluster_outlier_tokens, misfit_scalar, soft_update_applied,
    ingested_tokens_per_head, expected_ingested_tokens_per_head, count_conserved, accounting], "misfit_scalar"}``.
    RuntimeError when the state's bank does not hold exactly the tokens evicted from its window.

    Example: 12 tokens in chunks of 4 through a window of 4: the first evicted chunk is born as a cluster, the next
    joins it, and every token is counted once:

    >>> import torch
    >>> from attnmix.torch import MomentClosureSelfAttention
    >>> _ = torch.manual_seed(0)
    >>> attn = MomentClosureSelfAttention(d_model=8, n_head=2, window=4, max_clusters=2)
    >>> state = None  # a new stream
    >>> for h in torch.randn(1, 12, 8).split(4, dim=1):
    ...     out, state = attn(h, state)
    ...     receipt = attn.last_receipt["streams"][0]
    ...     print(state.pos, state.bank.n_clusters, receipt["birthed"], receipt["count_conserved"],
    ...           [round(n, 3) for n in state.bank.total_per_head()[0].tolist()])
    4 [0] False True [0.0, 0.0]
    8 [1] True True [4.0, 4.0]
    12 [1] False True [8.0, 8.0]
    >>> tuple(out.shape), bool(torch.isfinite(out).all())
    ((1, 4, 8), True)
    """

    _native_type = _torch._MomentClosureSelfAttention
    _state_type = MomentClosureLayerState
    _name = "MomentClosureSelfAttention"

    def __init__(
        self,
        d_model: int,
        n_head: int,
        window: int,
        max_clusters: int,
        birth_threshold: float = -2.0,
        merge_threshold: Optional[float] = None,
        cluster_rule: str = "threshold",
    ):
        super().__init__(
            d_model=d_model,
            n_head=n_head,
            window=window,
            max_clusters=max_clusters,
            birth_threshold=birth_threshold,
            merge_threshold=merge_threshold,
            cluster_rule=cluster_rule,
        )

    def _native_state(self, state) -> tuple:
        return state._to_native(f"{self._name}.forward")
