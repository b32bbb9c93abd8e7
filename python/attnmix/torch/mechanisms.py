# SPDX-License-Identifier: Apache-2.0
"""Streaming language models as ``torch.nn.Module``: ``SlidingWindowSpine`` and ``MomentClosureAttention``.

Both read a long token stream chunk by chunk and carry a state between chunks (the *context-mechanism* protocol)::

    import torch
    from attnmix.torch import MomentClosureAttention, train_tbptt

    torch.manual_seed(0)
    mech = MomentClosureAttention(vocab=256, d_model=32, n_layer=2, n_head=2, window=16)
    opt = torch.optim.AdamW(mech.parameters(), lr=3e-3)
    state = mech.init_state(batch_size=8)
    for x, y in chunks:                      # x, y: (8, t) int64 tensors, y = x shifted by one token
        state, loss = mech.step(state, (x, y))
        opt.zero_grad(); loss.backward(); opt.step()
        state = mech.detach(state)           # truncated backpropagation through time
    # or: result = train_tbptt(mech, state, chunks, opt, detach_horizon=2)

**The model.** A pre-norm causal Transformer: ``tok = Embedding(vocab, d_model)``; per layer ``ln1``, ``qkv =
Linear(d, 3d)`` (split ``[q | k | v]``, head-major), attention, ``proj = Linear(d, d)`` with a residual, ``ln2`` and
``mlp = Linear(d, 4d) -> GELU -> Linear(4d, d)`` with a residual; then ``ln_f`` and ``head = Linear(d, vocab,
bias=False)`` tied to ``tok``. Rotary position embeddings (half-split, base 10000) are applied once, at absolute
positions, to queries and to the raw cached keys, so streaming a sequence in chunks computes what one pass over it
computes whenever the window covers the stream.

* ``SlidingWindowSpine``: each query sees the raw keys and values of the last ``window`` tokens (``window=None``:
  every earlier token, full causal attention). State: per layer the cached raw keys and values.
* ``MomentClosureAttention``: the same window, plus per layer a *cluster bank* summarising the tokens evicted from
  the window as at most ``max_clusters`` Gaussian clusters per stream and head (see ``attnmix.torch.functional``);
  each query attends to the window's tokens and the clusters through one softmax. Every stream of a batch has its
  own bank. Each step checks that every token seen is represented exactly once (``last_receipts``).

**Everything runs in attnmix's C++ implementation** (on libtorch, the library Python torch uses). ``parameters()``
are the very tensors the C++ forward reads, so any torch optimizer trains them, ``state_dict()`` /
``load_state_dict()`` read and write them, and ``module.double()`` converts them in place. The parameter names are
the reference design's (``tok.weight``, ``qkv.0.weight``, ``mlp.0.2.bias``, ``ln_f.weight``, ``head.weight``, ...),
so its state dicts load. Replace parameter values in place (``load_state_dict``, ``param.data.copy_(...)``), never
the Parameter objects or the submodules: a step refuses a module whose Parameters or submodules were replaced. The
loss joins your autograd graph; gradients reach every parameter (and the carried state until ``detach``). CPU only;
float32 (the default) or float64 (after ``module.double()``); the thread count is ``torch.set_num_threads``.
Parameters start from libtorch's default initialisation under ``torch.manual_seed``, exactly as ``attnmix lm train
--seed`` does, and ``from_checkpoint`` loads a model that ``attnmix lm train`` wrote.

**States** are dataclasses of tensors and ints (``SlidingWindowState``, ``MomentClosureState``); they pickle with
``torch.save``, and so do the modules (a loaded module is rebuilt from its constructor arguments and takes the saved
parameter values, dtype, ``requires_grad`` flags and training mode; hooks are not saved). A state is never changed
in place: ``step`` returns a new one.

Errors: a state of the wrong type, a non-tensor chunk element, or a bank that is not a ``ClusterBank`` raise
TypeError; wrong dtypes, devices, shapes, ids outside the vocabulary, a batch size other than the state's
("batch size"), or a state made by another model raise ValueError naming the argument; a state whose far field does
not count every evicted token exactly once raises RuntimeError ("one-token/one-representation").
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Tuple, runtime_checkable

import torch
import torch.nn as nn

from attnmix import _torch
from attnmix.torch.functional import ClusterBank, _bank, _native

__all__ = [
    "ContextMechanism",
    "MomentClosureAttention",
    "MomentClosureState",
    "OutlierStore",
    "SlidingWindowSpine",
    "SlidingWindowState",
    "train_tbptt",
]

_CPU = torch.device("cpu")


@dataclass
class SlidingWindowState:
    """What a sliding-window spine carries between chunks.

    ``cache_k[l]``, ``cache_v[l]``: layer ``l``'s cached raw (un-rotated) keys and values, ``(batch, len, n_head,
    head_dim)`` tensors, or None while the layer has cached nothing; ``pos``: the absolute position of the next
    token; ``batch_size``: the number of streams; ``n_head`` and ``head_dim``: the model's (None: the model's own);
    ``device``: the CPU.

    Example: a window of 4 over 3 streams, before and after a chunk of 6 tokens:

    >>> import torch
    >>> from attnmix.torch import SlidingWindowSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = SlidingWindowSpine(16, d_model=8, n_layer=2, n_head=2, window=4)
    >>> state = spine.init_state(batch_size=3)
    >>> state.cache_k, state.pos, state.batch_size
    ([None, None], 0, 3)
    >>> state, logits = spine.advance(state, torch.randint(0, 16, (3, 6)))
    >>> state.pos, len(state.cache_k), tuple(state.cache_k[0].shape)  # the last 4 tokens of each layer
    (6, 2, (3, 4, 2, 4))
    """

    cache_k: List[Optional[torch.Tensor]]
    cache_v: List[Optional[torch.Tensor]]
    pos: int = 0
    batch_size: int = 1
    n_head: Optional[int] = None
    head_dim: Optional[int] = None
    device: Any = _CPU


@dataclass
class OutlierStore:
    """One layer's outlier store (``MomentClosureAttention(outlier_capacity=N)``, N > 0): per stream and cluster at most
    ``capacity`` of the evicted tokens the cluster's regression of value on key predicts worst, kept as int8 rows and
    attended exactly in the same softmax as the window and the clusters.

    ``S = max_clusters * capacity`` slots per stream: ``k_codes``, ``v_codes`` int8 ``(batch, S, n_head, head_dim)``
    and their float32 ``k_low``, ``k_scale``, ``v_low``, ``v_scale`` ``(batch, S, n_head)`` (a row decodes to ``low +
    (code + 128) * scale``); ``owner`` int64 ``(batch, S)``: the cluster a slot's token belongs to, -1 for a free
    (all-zero) slot; ``residual`` float64 ``(batch, S)``: the token's misfit when it was stored; while training,
    ``k_hat``, ``v_hat``: the decoded rows carrying the gradient to the tokens they came from (None otherwise).

    Example: 2 clusters of up to 2 outliers each: ``S = 4`` slots, free at first, some filled once tokens leave the
    window (as many as the receipt says it holds):

    >>> import torch
    >>> from attnmix.torch import MomentClosureAttention
    >>> _ = torch.manual_seed(0)
    >>> mech = MomentClosureAttention(16, d_model=8, n_layer=1, n_head=2, window=4, max_clusters=2, outlier_capacity=2)
    >>> store = mech.init_state(batch_size=1).stores[0]
    >>> store.capacity, tuple(store.k_codes.shape), store.k_codes.dtype, store.owner.tolist()
    (2, (1, 4, 2, 4), torch.int8, [[-1, -1, -1, -1]])
    >>> x = torch.randint(0, 16, (1, 13))
    >>> state, loss = mech.step(mech.init_state(batch_size=1), (x[:, :-1], x[:, 1:]))  # 12 tokens: 8 evicted
    >>> held = int((state.stores[0].owner >= 0).sum())
    >>> 0 < held <= 4, held == mech.last_receipts[0]["outliers"]["held"]
    (True, True)
    """

    k_codes: torch.Tensor
    k_low: torch.Tensor
    k_scale: torch.Tensor
    v_codes: torch.Tensor
    v_low: torch.Tensor
    v_scale: torch.Tensor
    owner: torch.Tensor
    residual: torch.Tensor
    capacity: int
    k_hat: Optional[torch.Tensor] = None
    v_hat: Optional[torch.Tensor] = None


@dataclass
class MomentClosureState:
    """What moment-closure attention carries between chunks.

    ``near``: the exact window (a ``SlidingWindowState``); ``banks``: one ``ClusterBank`` per layer, with one mixture
    per stream (``count (batch, n_head, max_clusters)``, ..., ``n_clusters`` a list with one int per stream; for
    ``batch_size == 1`` the one-stream layout of the reference design, ``count (n_head, max_clusters)`` and an int
    ``n_clusters``, is accepted too, and steps keep the layout they were given); ``batch_size``: the number of
    streams; ``detach_horizon_clusters``: whether ``detach`` also cuts the banks from the autograd graph (else only
    the window's caches); ``stores``: one ``OutlierStore`` per layer when the model keeps outliers, else empty.

    Example: 2 streams through a window of 4; after 8 tokens the 4 evicted ones are in each layer's banks:

    >>> import torch
    >>> from attnmix.torch import MomentClosureAttention
    >>> _ = torch.manual_seed(0)
    >>> mech = MomentClosureAttention(16, d_model=8, n_layer=2, n_head=2, window=4, max_clusters=3)
    >>> state = mech.init_state(batch_size=2)
    >>> state.batch_size, state.near.pos, len(state.banks), tuple(state.banks[0].count.shape), state.stores
    (2, 0, 2, (2, 2, 3), [])
    >>> x = torch.randint(0, 16, (2, 9))
    >>> state, loss = mech.step(state, (x[:, :-1], x[:, 1:]))
    >>> state.near.pos, [round(n, 3) for n in state.banks[0].total_per_head().flatten().tolist()]  # (stream, head)
    (8, [4.0, 4.0, 4.0, 4.0])
    """

    near: SlidingWindowState
    banks: List[ClusterBank]
    batch_size: int = 1
    detach_horizon_clusters: bool = True
    stores: List[OutlierStore] = field(default_factory=list)


@runtime_checkable
class ContextMechanism(Protocol):
    """A mechanism that streams a token sequence in chunks, carrying a state between them (``isinstance`` checks it).

    ``init_state(batch_size, *, device="cpu")`` makes an empty state for ``batch_size`` streams;
    ``step(state, (x, y)) -> (state, loss)`` runs one chunk (``x``, ``y``: ``(batch, t)`` int64 token ids, ``y`` the
    targets) and returns the new state and the mean token cross-entropy of the chunk; ``detach(state)`` cuts every
    carried tensor from the autograd graph.

    Example: attnmix's mechanisms have the protocol; any class with these three methods has it too:

    >>> import math
    >>> import torch
    >>> from attnmix.torch import ContextMechanism, LinearAttentionSpine, SlidingWindowSpine
    >>> isinstance(SlidingWindowSpine(16, d_model=8), ContextMechanism), isinstance(object(), ContextMechanism)
    (True, False)
    >>> class Uniform:  # every one of 16 symbols with probability 1/16; nothing carried between chunks
    ...     def init_state(self, batch_size, *, device="cpu"): return None
    ...     def step(self, state, chunk): return state, torch.tensor(math.log(16))
    ...     def detach(self, state): return state
    >>> isinstance(Uniform(), ContextMechanism), isinstance(LinearAttentionSpine(16, d_model=8), ContextMechanism)
    (True, True)
    """

    def init_state(self, batch_size: int, *, device: Any = "cpu") -> Any:
        """An empty state for ``batch_size`` streams on ``device``."""
        ...

    def step(self, state: Any, chunk: Tuple[torch.Tensor, torch.Tensor]) -> Tuple[Any, torch.Tensor]:
        """Runs one chunk ``(x, y)`` of ``(batch, t)`` int64 token ids (``y`` the targets) from ``state``; returns the
        new state and the chunk's mean token cross-entropy."""
        ...

    def detach(self, state: Any) -> Any:
        """``state`` with every carried tensor cut from the autograd graph."""
        ...


# ---- argument checks ------------------------------------------------------------------------------------------


def _positive_int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{where}: {name} must be a positive exact integer (got {value!r})")
    return int(value)


def _nonnegative_int(value: Any, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{where}: {name} must be a non-negative exact integer (got {value!r})")
    return int(value)


def _finite_real(value: Any, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{where}: {name} must be a finite real number (got {value!r})")
    return float(value)


def _cpu_device(device: Any, where: str) -> torch.device:
    if device is _CPU:
        return _CPU
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError) as error:
        raise TypeError(f"{where}: device must be a torch.device or a device string (got {device!r})") from error
    if dev.type != "cpu":
        raise ValueError(f"{where}: device must be the CPU (got {dev}); attnmix.torch runs on the CPU")
    return dev


def _chunk(chunk: Any, where: str) -> Tuple[Any, Any]:
    if not isinstance(chunk, tuple) or len(chunk) != 2:
        raise ValueError(f"{where}: chunk must be an (x, y) tuple of (batch, time) int64 tensors")
    return chunk


def _model_sizes(where: str, vocab, d_model, n_layer, n_head) -> Dict[str, int]:
    sizes = {
        "vocab": _positive_int(vocab, where, "vocab"),
        "d_model": _positive_int(d_model, where, "d_model"),
        "n_layer": _positive_int(n_layer, where, "n_layer"),
        "n_head": _positive_int(n_head, where, "n_head"),
    }
    if sizes["d_model"] % sizes["n_head"]:
        raise ValueError(f"{where}: d_model ({sizes['d_model']}) must be divisible by n_head ({sizes['n_head']})")
    if (sizes["d_model"] // sizes["n_head"]) % 2:
        raise ValueError(
            f"{where}: head_dim = d_model / n_head ({sizes['d_model'] // sizes['n_head']}) must be even for RoPE"
        )
    return sizes


def _checkpoint_path(path: Any, where: str) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{where}: path must be a str or os.PathLike (got {type(path).__name__})")
    return os.fspath(path)


# ---- the modules ----------------------------------------------------------------------------------------------


class _Spine(nn.Module):
    """What both mechanisms share: the C++ module, its parameters under the reference names, state conversions."""

    def _setup(self, config: Dict[str, Any]) -> None:
        """Builds the C++ module (drawing its initial parameters) and registers its tensors as Parameters."""
        self._config = dict(config)
        self._native = self._make_native(self._config)
        for key, value in self._config.items():
            setattr(self, key, value)
        self.head_dim = self.d_model // self.n_head
        params = dict(self._native.named_parameters())
        for tensor in params.values():
            if type(tensor) is torch.Tensor:  # noqa: E721  (make the C++ tensor itself a Parameter, in place)
                tensor.__class__ = nn.Parameter
        used = set()

        def take(name: str) -> nn.Parameter:
            used.add(name)
            return params[name]

        d, vocab, n_layer = self.d_model, self.vocab, self.n_layer

        # Containers built on the meta device (no memory, no random draws), then given the C++ tensors.
        def linear(prefix: str, n_in: int, n_out: int) -> nn.Linear:
            m = nn.Linear(n_in, n_out, device="meta")
            m.weight = take(prefix + ".weight")
            m.bias = take(prefix + ".bias")
            return m

        def norm(prefix: str) -> nn.LayerNorm:
            m = nn.LayerNorm(d, eps=1e-5, device="meta")
            m.weight = take(prefix + ".weight")
            m.bias = take(prefix + ".bias")
            return m

        layer = [f"backbone.layer{l}." for l in range(n_layer)]
        self.tok = nn.Embedding(vocab, d, device="meta")
        self.tok.weight = take("backbone.tok.weight")
        self.qkv = nn.ModuleList([linear(p + "qkv", d, 3 * d) for p in layer])
        self.proj = nn.ModuleList([linear(p + "proj", d, d) for p in layer])
        self.ln1 = nn.ModuleList([norm(p + "ln1") for p in layer])
        self.ln2 = nn.ModuleList([norm(p + "ln2") for p in layer])
        self.mlp = nn.ModuleList(
            [nn.Sequential(linear(p + "fc1", d, 4 * d), nn.GELU(), linear(p + "fc2", 4 * d, d)) for p in layer]
        )
        self.ln_f = norm("backbone.ln_f")
        self.head = nn.Linear(d, vocab, bias=False, device="meta")
        self.head.weight = self.tok.weight  # tied, as in the reference design (both names are in state_dict())
        if "shift0.weight" in params:  # the linear-feature spines' token shifts (sketch_spines.py)
            self.shift = nn.ModuleList([nn.Linear(d, d, bias=False, device="meta") for _ in range(n_layer)])
            for l, m in enumerate(self.shift):
                m.weight = take(f"shift{l}.weight")
        assert used == set(params), "every C++ parameter is registered once"
        # (registry, name, object) of every Parameter and submodule registration, to refuse a forward on a module
        # whose Parameters or containers were replaced (the C++ forward would not read the replacements).
        self._bound = [
            (registry, name, value)
            for module in self.modules()
            for registry in (module._parameters, module._modules)
            for name, value in registry.items()
        ]
        self._receipts: Optional[list] = []  # the last step's receipts, converted on first use (None: not yet)
        self._misfit: Optional[float] = 0.0

    def _check_bound(self, where: str) -> None:
        for registry, name, value in self._bound:
            if registry.get(name) is not value:
                raise RuntimeError(
                    f"{where}: {name!r}, a Parameter or submodule of the module, was replaced (now "
                    f"{type(registry.get(name)).__name__}); the C++ forward reads the tensors made at construction: "
                    "change values in place (load_state_dict, param.data.copy_(...)) instead"
                )

    # -- states --

    def _near_native(self, near: Any, where: str, name: str) -> tuple:
        if not isinstance(near, SlidingWindowState):
            raise TypeError(f"{where}: {name} must be a SlidingWindowState (got {type(near).__name__})")
        _cpu_device(near.device, where)
        return (
            near.cache_k,
            near.cache_v,
            near.pos,
            near.batch_size,
            self.n_head if near.n_head is None else near.n_head,
            self.head_dim if near.head_dim is None else near.head_dim,
        )

    @staticmethod
    def _near_state(native: tuple, device: Any) -> SlidingWindowState:
        cache_k, cache_v, pos, batch_size, n_head, head_dim = native
        return SlidingWindowState(cache_k, cache_v, pos, batch_size, n_head, head_dim, device)

    # -- pickling: the constructor arguments and the parameter values --

    def __getstate__(self) -> Dict[str, Any]:
        named = list(self.named_parameters())
        return {
            "config": dict(self._config),
            "dtype": self.tok.weight.dtype,
            "training": self.training,
            "parameters": {name: p.detach() for name, p in named},
            "requires_grad": {name: p.requires_grad for name, p in named},
            "extra": self._extra_state(),
        }

    def __setstate__(self, state: Dict[str, Any]) -> None:
        nn.Module.__init__(self)
        with torch.random.fork_rng(devices=[]):  # rebuilding must not consume the caller's random stream
            self._setup(state["config"])
        if state["dtype"] != self.tok.weight.dtype:
            self.to(state["dtype"])
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(state["parameters"][name])
                p.requires_grad_(state["requires_grad"][name])
        self.train(state["training"])
        self._restore_extra(state["extra"])

    @classmethod
    def _from_checkpoint(cls, path: Any, config: Dict[str, Any]) -> "_Spine":
        with torch.random.fork_rng(devices=[]):  # the weights come from the file
            model = cls(**config)
        model._native.load_checkpoint(path)
        return model

    def _extra_state(self) -> Dict[str, Any]:
        return {}

    def _restore_extra(self, extra: Dict[str, Any]) -> None:
        pass

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._config.items())

    def forward(self, state: Any, x: torch.Tensor) -> Tuple[Any, torch.Tensor]:
        """Same as ``advance``: ``module(state, x)`` returns ``(state, logits (batch, t, vocab))``."""
        return self.advance(state, x)


class SlidingWindowSpine(_Spine):
    """A streaming causal Transformer whose queries see the last ``window`` tokens exactly (see the module docs).

    ``SlidingWindowSpine(vocab, *, d_model=32, n_layer=2, n_head=2, window=64, cp_size=1)``: every size a positive
    integer, ``d_model`` divisible by ``n_head`` with an even ``head_dim = d_model / n_head``; ``window=None`` means
    full causal attention over every token since ``init_state``; ``cp_size`` (context parallelism) must be 1.
    ValueError otherwise. Per chunk of ``t`` tokens and layer the cost is ``O(b t d^2 + b t (window + t) d)``; the
    state holds ``2 n_layer b window d`` numbers.

    Example: full causal attention over 2 streams of 6 tokens: two chunks give the logits of one pass, and a step's
    loss reaches every parameter:

    >>> import torch
    >>> from attnmix.torch import SlidingWindowSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = SlidingWindowSpine(16, d_model=8, n_layer=1, n_head=2, window=None)
    >>> x = torch.randint(0, 16, (2, 6))
    >>> _, whole = spine.advance(spine.init_state(2), x)
    >>> state, first = spine.advance(spine.init_state(2), x[:, :4])
    >>> state, rest = spine.advance(state, x[:, 4:])
    >>> tuple(whole.shape), torch.allclose(whole, torch.cat([first, rest], dim=1), atol=1e-6)
    ((2, 6, 16), True)
    >>> state, loss = spine.step(spine.init_state(2), (x[:, :-1], x[:, 1:]))
    >>> loss.backward()
    >>> bool(torch.isfinite(loss)), all(p.grad is not None for p in spine.parameters())
    (True, True)
    """

    def __init__(
        self,
        vocab: int,
        *,
        d_model: int = 32,
        n_layer: int = 2,
        n_head: int = 2,
        window: Optional[int] = 64,
        cp_size: int = 1,
    ) -> None:
        super().__init__()
        w = "SlidingWindowSpine"
        config: Dict[str, Any] = _model_sizes(w, vocab, d_model, n_layer, n_head)
        config["window"] = None if window is None else _positive_int(window, w, "window")
        if _positive_int(cp_size, w, "cp_size") != 1:
            raise ValueError(f"{w}: cp_size must be 1 (context parallelism is not supported; got {cp_size})")
        config["cp_size"] = 1
        self._setup(config)

    @staticmethod
    def _make_native(c: Dict[str, Any]):
        return _torch._SlidingWindowSpine(c)

    @classmethod
    def from_checkpoint(cls, path: Any) -> "SlidingWindowSpine":
        """The model of an ``attnmix lm train`` checkpoint of mechanism "window" or "full" (window=None), with its
        trained parameters (float32). The file is checked first (format, checksums, options, every parameter's
        shape and finiteness): OSError for a file that cannot be read, RuntimeError naming the file for a malformed
        one; ValueError for a moment-closure checkpoint
        (use ``MomentClosureAttention.from_checkpoint``). The caller's random stream is not consumed."""
        path = _checkpoint_path(path, "SlidingWindowSpine.from_checkpoint")
        info = _torch._checkpoint_model(path)
        if info["mechanism"] not in ("window", "full"):
            raise ValueError(
                f"SlidingWindowSpine.from_checkpoint: {path} holds a {info['mechanism']} model; use "
                "MomentClosureAttention.from_checkpoint"
            )
        config = {k: info[k] for k in ("vocab", "d_model", "n_layer", "n_head")}
        config["window"] = None if info["mechanism"] == "full" else info["window"]
        return cls._from_checkpoint(path, config)

    def init_state(self, batch_size: int, *, device: Any = "cpu") -> SlidingWindowState:
        """An empty state for ``batch_size`` streams (a positive integer, else ValueError) on the CPU."""
        where = "SlidingWindowSpine.init_state"
        b = _positive_int(batch_size, where, "batch_size")
        return self._near_state(self._native.init_state(b), _cpu_device(device, where))

    def _checked(self, state: Any, where: str) -> tuple:
        if not isinstance(state, SlidingWindowState):
            raise TypeError(f"{where}: state must be a SlidingWindowState (got {type(state).__name__})")
        self._check_bound(where)
        return self._near_native(state, where, "state")

    def step(self, state: SlidingWindowState, chunk: Tuple[torch.Tensor, torch.Tensor]):
        """One chunk ``(x, y)`` (``(batch, t)`` int64 ids in ``[0, vocab)``, ``t >= 1``, ``batch`` the state's):
        returns ``(new state, loss)``, the loss the mean cross-entropy over the ``batch * t`` positions."""
        where = "SlidingWindowSpine.step"
        native = self._checked(state, where)
        x, y = _chunk(chunk, where)
        out, loss = self._native.step(native, x, y)
        return self._near_state(out, state.device), loss

    def advance(self, state: SlidingWindowState, x: torch.Tensor) -> Tuple[SlidingWindowState, torch.Tensor]:
        """One chunk of inputs ``x`` without targets: ``(new state, logits (batch, t, vocab))``."""
        where = "SlidingWindowSpine.advance"
        native = self._checked(state, where)
        out, logits = self._native.advance(native, x)
        return self._near_state(out, state.device), logits

    def detach(self, state: SlidingWindowState) -> SlidingWindowState:
        """The same state with every cached tensor cut from the autograd graph."""
        where = "SlidingWindowSpine.detach"
        native = self._checked(state, where)
        return self._near_state(self._native.detach(native), state.device)


class MomentClosureAttention(_Spine):
    """The sliding window plus a far field of Gaussian clusters over the evicted tokens (see the module docs).

    ``MomentClosureAttention(vocab, *, d_model=32, n_layer=2, n_head=2, window=16, max_clusters=4,
    birth_threshold=-2.0, merge_threshold=None, outlier_capacity=0, cluster_rule="threshold")``: sizes as for
    ``SlidingWindowSpine``
    (``window`` a positive integer), ``max_clusters`` a positive integer, the thresholds finite
    (``merge_threshold=None``: the default rule ``2.65 + 6 / sqrt(n)``), ``outlier_capacity`` a non-negative integer;
    ValueError otherwise. ``outlier_capacity=N > 0`` is "moment closure + outliers": per layer, stream and cluster the
    ``N`` evicted tokens the cluster represents worst are kept exactly (int8, ``state.stores``) and attended in the
    same softmax; each layer's receipt then has ``"outliers"`` (``offered``, ``stored``, ``evicted``, ``held``,
    ``bytes``, ``max_reconstruction_error``). ``cluster_rule="budget"``: every evicted chunk births its own cluster,
    and when all ``max_clusters`` are live the two closest merge first to make room (no other merges; the thresholds
    are not used) -- a chunk of rare key-value structure then keeps its own cluster instead of being diluted by the
    filler that follows it (docs/far-field.md).

    Per step and layer: the window's exact attention and the clusters' moment-generating-function attention share
    one softmax; then the tokens that leave the window join the bank (a new cluster when the chunk's mean key is far
    from every cluster on every head and a slot is free; otherwise a differentiable weighted update), clusters that
    come close merge, and receipts check that every token seen is represented exactly once. ``last_receipts``: the
    last step's receipts, one dict per layer, ``{"batch_size", "streams": [one receipt per stream], "misfit_scalar",
    "far_attention_share"}`` and, with an outlier store, ``"outliers"``; ``far_attention_share`` is the share of the
    step's attention that went to the far field, and a stream's receipt holds ``birthed``,
    ``birth_incorporated_batch``, ``merged``, ``misfit``, ``per_cluster_outlier_tokens``, ``misfit_scalar``,
    ``soft_update_applied``, ``ingested_tokens_per_head``, ``expected_ingested_tokens_per_head``, ``count_conserved``
    and ``accounting``. ``last_misfit``: the mean over
    layers of their ``misfit_scalar`` (0 when nothing was evicted). Where the reference design reads
    ``mech.last_receipts[l]["birthed"]`` and ``state.banks[l].n_clusters`` (one bank shared by the batch), read
    ``mech.last_receipts[l]["streams"][b]["birthed"]`` and ``state.banks[l].n_clusters[b]``.

    Example: one stream through a window of 4 in two chunks of 8 tokens; the first evicted tokens are born as a
    cluster, and each layer's bank holds every one of them once:

    >>> import torch
    >>> from attnmix.torch import MomentClosureAttention
    >>> _ = torch.manual_seed(0)
    >>> mech = MomentClosureAttention(16, d_model=8, n_layer=2, n_head=2, window=4, max_clusters=3)
    >>> state, x = mech.init_state(batch_size=1), torch.randint(0, 16, (1, 17))
    >>> for chunk in (x[:, :9], x[:, 8:]):  # (x, y) with y the next tokens
    ...     state, loss = mech.step(state, (chunk[:, :-1], chunk[:, 1:]))
    ...     receipt = mech.last_receipts[0]["streams"][0]  # layer 0, stream 0
    ...     print(state.near.pos, state.banks[0].n_clusters, receipt["birthed"], receipt["count_conserved"],
    ...           [round(n, 3) for n in state.banks[0].total_per_head()[0].tolist()])
    8 [1] True True [4.0, 4.0]
    16 [1] False True [12.0, 12.0]
    >>> bool(torch.isfinite(loss)), len(mech.last_receipts), mech.last_misfit >= 0
    (True, 2, True)
    """

    def __init__(
        self,
        vocab: int,
        *,
        d_model: int = 32,
        n_layer: int = 2,
        n_head: int = 2,
        window: int = 16,
        max_clusters: int = 4,
        birth_threshold: float = -2.0,
        merge_threshold: Optional[float] = None,
        outlier_capacity: int = 0,
        cluster_rule: str = "threshold",
    ) -> None:
        super().__init__()
        w = "MomentClosureAttention"
        config: Dict[str, Any] = _model_sizes(w, vocab, d_model, n_layer, n_head)
        config["window"] = _positive_int(window, w, "window")
        config["max_clusters"] = _positive_int(max_clusters, w, "max_clusters")
        config["birth_threshold"] = _finite_real(birth_threshold, w, "birth_threshold")
        config["merge_threshold"] = (
            None if merge_threshold is None else _finite_real(merge_threshold, w, "merge_threshold")
        )
        config["outlier_capacity"] = _nonnegative_int(outlier_capacity, w, "outlier_capacity")
        config["cluster_rule"] = cluster_rule
        self._setup(config)

    @staticmethod
    def _make_native(c: Dict[str, Any]):
        return _torch._MomentClosureAttention(c)

    @classmethod
    def from_checkpoint(cls, path: Any) -> "MomentClosureAttention":
        """The model of an ``attnmix lm train`` checkpoint of mechanism "moment-closure" (its sizes and far-field
        settings) with its trained parameters (float32). OSError for a file that cannot be read, RuntimeError naming the
        file for a malformed one;
        ValueError for a window or full checkpoint (use ``SlidingWindowSpine.from_checkpoint``). The caller's random
        stream is not consumed."""
        path = _checkpoint_path(path, "MomentClosureAttention.from_checkpoint")
        info = _torch._checkpoint_model(path)
        if info["mechanism"] != "moment-closure":
            raise ValueError(
                f"MomentClosureAttention.from_checkpoint: {path} holds a {info['mechanism']} model; use "
                "SlidingWindowSpine.from_checkpoint"
            )
        keys = (
            "vocab", "d_model", "n_layer", "n_head", "window", "max_clusters", "birth_threshold", "merge_threshold",
            "outlier_capacity", "cluster_rule",
        )
        return cls._from_checkpoint(path, {k: info[k] for k in keys})

    def init_state(self, batch_size: int, *, device: Any = "cpu") -> MomentClosureState:
        """An empty state for ``batch_size`` streams (a positive integer, else ValueError): empty caches and one empty
        bank per layer with one mixture per stream, in the parameters' dtype, on the CPU."""
        where = "MomentClosureAttention.init_state"
        b = _positive_int(batch_size, where, "batch_size")
        return self._state(self._native.init_state(b), None, _cpu_device(device, where))

    def _checked(self, state: Any, where: str) -> Tuple[tuple, List[bool]]:
        if not isinstance(state, MomentClosureState):
            raise TypeError(f"{where}: state must be a MomentClosureState (got {type(state).__name__})")
        self._check_bound(where)
        near = self._near_native(state.near, where, "state.near")
        if not isinstance(state.banks, (list, tuple)):
            raise TypeError(f"{where}: state.banks must be a list of ClusterBank (got {type(state.banks).__name__})")
        banks, one_stream = [], []
        for bank in state.banks:
            native, one = _native(bank, where)
            banks.append(native)
            one_stream.append(one)
        if not isinstance(state.stores, (list, tuple)) or not all(isinstance(s, OutlierStore) for s in state.stores):
            raise TypeError(f"{where}: state.stores must be a list of OutlierStore (got {state.stores!r:.60})")
        stores = [tuple(getattr(s, f.name) for f in fields(OutlierStore)) for s in state.stores]
        return (near, banks, stores, state.batch_size, state.detach_horizon_clusters), one_stream

    def _state(self, native: tuple, one_stream: Optional[List[bool]], device: Any) -> MomentClosureState:
        near, banks, stores, batch_size, detach_clusters = native
        if one_stream is None:
            one_stream = [False] * len(banks)
        return MomentClosureState(
            self._near_state(near, device),
            [_bank(bank, one) for bank, one in zip(banks, one_stream)],
            batch_size,
            detach_clusters,
            [OutlierStore(*store) for store in stores],
        )

    def step(self, state: MomentClosureState, chunk: Tuple[torch.Tensor, torch.Tensor]):
        """One chunk ``(x, y)`` (``(batch, t)`` int64 ids in ``[0, vocab)``, ``t >= 1``, ``batch`` the state's, else
        ValueError "batch size"): returns ``(new state, loss)``, the loss the mean cross-entropy over the ``batch * t``
        positions; updates ``last_receipts`` and ``last_misfit``. RuntimeError ("one-token/one-representation")
        when a bank does not hold exactly the tokens evicted so far."""
        where = "MomentClosureAttention.step"
        native, one_stream = self._checked(state, where)
        x, y = _chunk(chunk, where)
        out, loss = self._native.step(native, x, y)
        self._receipts, self._misfit = None, None
        return self._state(out, one_stream, state.near.device), loss

    def advance(self, state: MomentClosureState, x: torch.Tensor) -> Tuple[MomentClosureState, torch.Tensor]:
        """One chunk of inputs ``x`` without targets: ``(new state, logits (batch, t, vocab))``; updates the
        receipts as ``step`` does."""
        where = "MomentClosureAttention.advance"
        native, one_stream = self._checked(state, where)
        out, logits = self._native.advance(native, x)
        self._receipts, self._misfit = None, None
        return self._state(out, one_stream, state.near.device), logits

    def detach(self, state: MomentClosureState) -> MomentClosureState:
        """The same state with the caches (and, when ``state.detach_horizon_clusters``, every bank tensor) cut from
        the autograd graph."""
        where = "MomentClosureAttention.detach"
        native, one_stream = self._checked(state, where)
        return self._state(self._native.detach(native), one_stream, state.near.device)

    @property
    def last_receipts(self) -> list:
        """The last step's receipts, one dict per layer (``[]`` before the first step); see the class docs."""
        if self._receipts is None:
            self._receipts = self._native.last_receipts()
        return self._receipts

    @property
    def last_misfit(self) -> float:
        """The mean over layers of the last step's ``misfit_scalar`` (0.0 before the first step)."""
        if self._misfit is None:
            self._misfit = self._native.last_misfit()
        return self._misfit

    def _extra_state(self) -> Dict[str, Any]:
        return {"receipts": self.last_receipts, "misfit": self.last_misfit}

    def _restore_extra(self, extra: Dict[str, Any]) -> None:
        self._receipts = extra["receipts"]
        self._misfit = extra["misfit"]


# ---- truncated backpropagation through time -------------------------------------------------------------------


def train_tbptt(
    mechanism: ContextMechanism,
    state: Any,
    chunks: Iterable[Tuple[torch.Tensor, torch.Tensor]],
    opt: torch.optim.Optimizer,
    *,
    detach_horizon: int = 1,
    before_update: Optional[Callable[[int], None]] = None,
) -> Dict[str, Any]:
    """Trains on a stream of chunks by truncated backpropagation through time.

    For each chunk: ``state, loss = mechanism.step(state, chunk)``; ``float(loss)`` is recorded and ``loss`` joins a
    running sum. After every ``detach_horizon`` chunks: ``opt.zero_grad()``, backward of ``sum / count``,
    ``before_update(k)`` if given (``k`` the 0-based update index: clip gradients or set the learning rate there),
    ``opt.step()``, ``state = mechanism.detach(state)``, and the sum restarts. A remainder of fewer chunks is flushed
    the same way at the end. Only the backward graph is cut; the forward state carries on.

    Returns ``{"losses": [float per chunk], "state": final state}``. ValueError unless ``detach_horizon`` is a
    positive integer; TypeError when ``mechanism`` is not a ``ContextMechanism`` or ``before_update`` not callable.

    Example: 20 chunks of 8 tokens of the repeating stream 0, 1, ..., 7, an update every 2 chunks; the loss falls
    as the model learns the cycle:

    >>> import torch
    >>> from attnmix.torch import SlidingWindowSpine, train_tbptt
    >>> _ = torch.manual_seed(0)
    >>> mech = SlidingWindowSpine(8, d_model=8, n_layer=1, n_head=2, window=8)
    >>> stream = torch.arange(8).repeat(1, 21)  # (1, 168)
    >>> chunks = [(stream[:, i:i + 8], stream[:, i + 1:i + 9]) for i in range(0, 160, 8)]
    >>> opt = torch.optim.Adam(mech.parameters(), lr=0.05)
    >>> result = train_tbptt(mech, mech.init_state(1), chunks, opt, detach_horizon=2)
    >>> len(result["losses"]), result["state"].pos, result["losses"][-1] < result["losses"][0] / 4
    (20, 160, True)
    """
    if isinstance(detach_horizon, bool) or not isinstance(detach_horizon, numbers.Integral) or detach_horizon <= 0:
        raise ValueError(f"train_tbptt: detach_horizon must be a positive integer (got {detach_horizon!r})")
    if not isinstance(mechanism, ContextMechanism):
        raise TypeError(
            f"train_tbptt: mechanism must have init_state, step and detach (got {type(mechanism).__name__})"
        )
    if before_update is not None and not callable(before_update):
        raise TypeError(f"train_tbptt: before_update must be callable or None (got {type(before_update).__name__})")
    losses: List[float] = []
    total: Optional[torch.Tensor] = None
    count = 0
    updates = 0

    def update(state: Any) -> Any:
        opt.zero_grad()
        (total / count).backward()
        if before_update is not None:
            before_update(updates)
        opt.step()
        return mechanism.detach(state)

    for chunk in chunks:
        state, loss = mechanism.step(state, chunk)
        losses.append(float(loss))
        total = loss if count == 0 else total + loss
        count += 1
        if count == detach_horizon:
            state = update(state)
            total, count, updates = None, 0, updates + 1
    if count:
        state = update(state)
    return {"losses": losses, "state": state}
