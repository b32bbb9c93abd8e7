# SPDX-License-Identifier: Apache-2.0
"""The linear-feature streaming models as ``torch.nn.Module``: ``LinearAttentionSpine``, ``FrequentDirectionsSpine``
and ``TensorSketchSpine``, bounded memories of everything a stream has seen (docs/far-field.md).

They follow the context-mechanism protocol of ``attnmix.torch.mechanisms`` (``init_state``, ``step``, ``advance``,
``detach``, ``train_tbptt``), share its Transformer backbone and parameter names, and add one token shift per layer
(``shift.<l>.weight``, a ``Linear(d_model, d_model, bias=False)`` that starts at zero and lets a key carry the token
before it). Queries and keys are read through φ = elu + 1:

* ``LinearAttentionSpine(vocab, *, d_model=32, n_layer=2, n_head=2)``: causal linear attention over the whole
  stream. State per layer: ``sum_kv`` = Σ φ(k) vᵀ ``(b, H, hd, hd)`` and ``sum_k`` = Σ φ(k) ``(b, H, hd)`` in float64,
  and ``last_x`` ``(b, d_model)``, the layer's input at the previous token. Streaming in chunks computes what one pass
  computes.
* ``FrequentDirectionsSpine(vocab, *, ..., window=16, sketch_rows=16)``: the last ``window`` tokens exactly, every
  evicted row [φ(k); v] in a Frequent Directions sketch of ``sketch_rows`` rows (even, >= 4) per layer and head.
  State: ``window_k``, ``window_v`` ``(b, H, min(pos, window), hd)``, ``sketch`` ``(b, H, sketch_rows, 2 hd)``,
  ``sum_k``, ``mass`` = ‖A‖²_F and ``shrink_total`` = Σδ (float64), ``last_x``, and the counts ``filled`` and
  ``shrinks``. ``receipts(state)``: per layer ``{window, evicted, filled, shrinks, mass, kept, shrink_total, bound,
  bound_holds}``, where ``bound_holds`` checks the sketch's guarantee ``‖AᵀA − BᵀB‖₂ ≤ Σδ ≤ (‖A‖²_F − ‖B‖²_F)/(ℓ/2)``.
* ``TensorSketchSpine(vocab, *, ..., window=16, sketch_dim=64, sketch_degree=2)``: the window under the polynomial
  kernel (φ(q)·φ(k))^p and running sums over a tensor sketch of width ``sketch_dim`` of everything evicted. State:
  ``window_k``, ``window_v``, ``sum_kv`` ``(b, H, D, hd)``, ``sum_k`` ``(b, H, D)``, ``misfit`` ``(b, H)`` (the relative
  kernel error of the last evicting chunk) and ``last_x``.

States are dataclasses (``<Name>State(layers, pos, batch_size)`` with one ``<Name>LayerState`` per layer); every
step checks their shapes, dtypes and counts against the model (ValueError naming the field). ``from_checkpoint``
loads an ``attnmix lm train`` checkpoint of the mechanism ``linear``, ``frequent-directions`` or ``tensor-sketch``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, List, Tuple

import torch

from attnmix import _torch
from attnmix.torch.mechanisms import _chunk, _checkpoint_path, _cpu_device, _model_sizes, _positive_int, _Spine

__all__ = [
    "FrequentDirectionsLayerState",
    "FrequentDirectionsSpine",
    "FrequentDirectionsState",
    "LinearAttentionLayerState",
    "LinearAttentionSpine",
    "LinearAttentionState",
    "TensorSketchLayerState",
    "TensorSketchSpine",
    "TensorSketchState",
]


@dataclass
class LinearAttentionLayerState:
    """One layer's part of a ``LinearAttentionState``: ``sum_kv`` = Σ φ(k) vᵀ ``(b, H, hd, hd)`` and ``sum_k`` = Σ φ(k)
    ``(b, H, hd)`` over every token seen, in float64, and ``last_x`` ``(b, d_model)``, the layer's (normalised) input
    at the previous token, for the token shift.

    Example: the sums of 2 streams and 2 heads of size 4; φ = elu + 1 is positive, and so is every ``sum_k``:

    >>> import torch
    >>> from attnmix.torch import LinearAttentionSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = LinearAttentionSpine(16, d_model=8, n_layer=1, n_head=2)
    >>> state, _ = spine.advance(spine.init_state(2), torch.randint(0, 16, (2, 6)))
    >>> layer = state.layers[0]
    >>> tuple(layer.sum_kv.shape), tuple(layer.sum_k.shape), layer.sum_k.dtype, tuple(layer.last_x.shape)
    ((2, 2, 4, 4), (2, 2, 4), torch.float64, (2, 8))
    >>> bool((layer.sum_k > 0).all())
    True
    """

    sum_kv: torch.Tensor
    sum_k: torch.Tensor
    last_x: torch.Tensor


@dataclass
class LinearAttentionState:
    """What a ``LinearAttentionSpine`` carries between chunks: ``layers``, one ``LinearAttentionLayerState`` per
    layer; ``pos``, the absolute position of the next token; ``batch_size``, the number of streams.

    Example: the state has the same size after 3 tokens and after 300:

    >>> import torch
    >>> from attnmix.torch import LinearAttentionSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = LinearAttentionSpine(16, d_model=8, n_layer=2, n_head=2)
    >>> short, _ = spine.advance(spine.init_state(1), torch.randint(0, 16, (1, 3)))
    >>> long, _ = spine.advance(spine.init_state(1), torch.randint(0, 16, (1, 300)))
    >>> size = lambda state: sum(t.numel() for layer in state.layers for t in vars(layer).values())
    >>> (short.pos, short.batch_size, len(short.layers)), long.pos, size(short) == size(long)
    ((3, 1, 2), 300, True)
    """

    layers: List[LinearAttentionLayerState]
    pos: int = 0
    batch_size: int = 1


@dataclass
class FrequentDirectionsLayerState:
    """One layer's part of a ``FrequentDirectionsState``: ``window_k``, ``window_v``: φ(k) and the values of the last
    ``min(pos, window)`` tokens ``(b, H, n, hd)``, oldest first, in the parameters' dtype; ``sketch`` B ``(b, H,
    sketch_rows, 2 hd)`` of the evicted rows [φ(k); v], its rows from ``filled`` on zero; ``sum_k`` = Σ φ(k) over the
    evicted tokens ``(b, H, hd)``; ``mass`` = ‖A‖²_F of the evicted rows and ``shrink_total`` = Σδ, ``(b, H)``
    (``sketch``, ``sum_k``, ``mass`` and ``shrink_total`` in float64); ``last_x`` ``(b, d_model)``, the layer's
    (normalised) input at the previous token; ``filled``: the sketch rows in use; ``shrinks``: the shrinks so far.

    Example: after 16 tokens through a window of 4, 12 rows went into a sketch of 4 rows, which shrank 3 times and
    keeps no more squared mass than it was given:

    >>> import torch
    >>> from attnmix.torch import FrequentDirectionsSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = FrequentDirectionsSpine(16, d_model=8, n_layer=1, n_head=2, window=4, sketch_rows=4)
    >>> state, _ = spine.advance(spine.init_state(1), torch.randint(0, 16, (1, 16)))
    >>> layer = state.layers[0]
    >>> tuple(layer.window_k.shape), tuple(layer.sketch.shape), layer.filled, layer.shrinks
    ((1, 2, 4, 4), (1, 2, 4, 8), 3, 3)
    >>> bool((layer.sketch[:, :, layer.filled:] == 0).all()), bool((layer.window_k > 0).all())  # φ(k) > 0
    (True, True)
    >>> bool((layer.sketch.pow(2).sum((-2, -1)) <= layer.mass).all())  # ‖B‖²_F <= ‖A‖²_F
    True
    """

    window_k: torch.Tensor
    window_v: torch.Tensor
    sketch: torch.Tensor
    sum_k: torch.Tensor
    mass: torch.Tensor
    shrink_total: torch.Tensor
    last_x: torch.Tensor
    filled: int = 0
    shrinks: int = 0


@dataclass
class FrequentDirectionsState:
    """What a ``FrequentDirectionsSpine`` carries between chunks: ``layers``, one ``FrequentDirectionsLayerState`` per
    layer; ``pos``, the absolute position of the next token; ``batch_size``, the number of streams.

    Example: an empty state of 2 streams and a window of 4, then the same after 6 tokens:

    >>> import torch
    >>> from attnmix.torch import FrequentDirectionsSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = FrequentDirectionsSpine(16, d_model=8, n_layer=2, n_head=2, window=4)
    >>> state = spine.init_state(2)
    >>> state.pos, state.batch_size, len(state.layers), tuple(state.layers[0].window_k.shape)
    (0, 2, 2, (2, 2, 0, 4))
    >>> state, _ = spine.advance(state, torch.randint(0, 16, (2, 6)))
    >>> state.pos, tuple(state.layers[0].window_k.shape), state.layers[0].filled  # 2 tokens evicted
    (6, (2, 2, 4, 4), 2)
    """

    layers: List[FrequentDirectionsLayerState]
    pos: int = 0
    batch_size: int = 1


@dataclass
class TensorSketchLayerState:
    """One layer's part of a ``TensorSketchState``: ``window_k``, ``window_v``: φ(k) and the values of the last
    ``min(pos, window)`` tokens ``(b, H, n, hd)``, oldest first, in the parameters' dtype; ``sum_kv`` = Σ TS(φ(k)) vᵀ
    ``(b, H, sketch_dim, hd)`` and ``sum_k`` = Σ TS(φ(k)) ``(b, H, sketch_dim)`` over the evicted tokens; ``misfit``
    ``(b, H)``, the relative kernel error of the last evicting chunk (those three in float64); ``last_x`` ``(b,
    d_model)``, the layer's (normalised) input at the previous token.

    Example: a window of 4 and a sketch of width 16, after 12 tokens (8 evicted):

    >>> import torch
    >>> from attnmix.torch import TensorSketchSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = TensorSketchSpine(16, d_model=8, n_layer=1, n_head=2, window=4, sketch_dim=16)
    >>> state, _ = spine.advance(spine.init_state(1), torch.randint(0, 16, (1, 12)))
    >>> layer = state.layers[0]
    >>> tuple(layer.window_k.shape), tuple(layer.sum_kv.shape), tuple(layer.sum_k.shape), layer.sum_kv.dtype
    ((1, 2, 4, 4), (1, 2, 16, 4), (1, 2, 16), torch.float64)
    >>> tuple(layer.misfit.shape), bool(torch.isfinite(layer.misfit).all() and (layer.misfit >= 0).all())
    ((1, 2), True)
    """

    window_k: torch.Tensor
    window_v: torch.Tensor
    sum_kv: torch.Tensor
    sum_k: torch.Tensor
    misfit: torch.Tensor
    last_x: torch.Tensor


@dataclass
class TensorSketchState:
    """What a ``TensorSketchSpine`` carries between chunks: ``layers``, one ``TensorSketchLayerState`` per layer;
    ``pos``, the absolute position of the next token; ``batch_size``, the number of streams.

    Example: an empty state of 3 streams, and the window after 2 tokens:

    >>> import torch
    >>> from attnmix.torch import TensorSketchSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = TensorSketchSpine(16, d_model=8, n_layer=2, n_head=2, window=4, sketch_dim=16)
    >>> state = spine.init_state(3)
    >>> state.pos, state.batch_size, len(state.layers)
    (0, 3, 2)
    >>> state, _ = spine.advance(state, torch.randint(0, 16, (3, 2)))
    >>> state.pos, tuple(state.layers[1].window_v.shape), float(state.layers[1].sum_k.abs().sum())  # none evicted
    (2, (3, 2, 2, 4), 0.0)
    """

    layers: List[TensorSketchLayerState]
    pos: int = 0
    batch_size: int = 1


class _LayeredSpine(_Spine):
    """What the three spines share: states of per-layer fields, converted field by field to the C++ tuples."""

    _state_type: type
    _layer_type: type
    _mechanism: str

    def _native_state(self, state: Any, where: str) -> tuple:
        if not isinstance(state, self._state_type):
            raise TypeError(f"{where}: state must be a {self._state_type.__name__} (got {type(state).__name__})")
        self._check_bound(where)
        if not isinstance(state.layers, (list, tuple)):
            raise TypeError(f"{where}: state.layers must be a list (got {type(state.layers).__name__})")
        layers = []
        for l, layer in enumerate(state.layers):
            if not isinstance(layer, self._layer_type):
                raise TypeError(
                    f"{where}: state.layers[{l}] must be a {self._layer_type.__name__} (got {type(layer).__name__})"
                )
            layers.append(tuple(getattr(layer, f.name) for f in fields(layer)))
        return (layers, state.pos, state.batch_size)

    def _state(self, native: tuple) -> Any:
        layers, pos, batch_size = native
        return self._state_type([self._layer_type(*layer) for layer in layers], pos, batch_size)

    def init_state(self, batch_size: int, *, device: Any = "cpu") -> Any:
        """An empty state for ``batch_size`` streams (a positive integer, else ValueError) on the CPU."""
        where = f"{type(self).__name__}.init_state"
        b = _positive_int(batch_size, where, "batch_size")
        _cpu_device(device, where)
        return self._state(self._native.init_state(b))

    def step(self, state: Any, chunk: Tuple[torch.Tensor, torch.Tensor]) -> Tuple[Any, torch.Tensor]:
        """One chunk ``(x, y)`` (``(batch, t)`` int64 ids in ``[0, vocab)``, ``t >= 1``, ``batch`` the state's):
        returns ``(new state, loss)``, the loss the mean cross-entropy over the ``batch * t`` positions."""
        where = f"{type(self).__name__}.step"
        native = self._native_state(state, where)
        x, y = _chunk(chunk, where)
        out, loss = self._native.step(native, x, y)
        return self._state(out), loss

    def advance(self, state: Any, x: torch.Tensor) -> Tuple[Any, torch.Tensor]:
        """One chunk of inputs ``x`` without targets: ``(new state, logits (batch, t, vocab))``."""
        out, logits = self._native.advance(self._native_state(state, f"{type(self).__name__}.advance"), x)
        return self._state(out), logits

    def detach(self, state: Any) -> Any:
        """The same state with every carried tensor cut from the autograd graph."""
        return self._state(self._native.detach(self._native_state(state, f"{type(self).__name__}.detach")))

    @classmethod
    def _checkpoint_config(cls, info: Dict[str, Any]) -> Dict[str, Any]:
        return {k: info[k] for k in ("vocab", "d_model", "n_layer", "n_head")}

    @classmethod
    def from_checkpoint(cls, path: Any) -> Any:
        """The model of an ``attnmix lm train`` checkpoint of this mechanism with its trained parameters (float32).
        OSError for a file that cannot be read, RuntimeError naming the file for a malformed one, ValueError for a
        checkpoint of another mechanism. The caller's random stream is not consumed."""
        where = f"{cls.__name__}.from_checkpoint"
        path = _checkpoint_path(path, where)
        info = _torch._checkpoint_model(path)
        if info["mechanism"] != cls._mechanism:
            raise ValueError(f"{where}: {path} holds a {info['mechanism']} model, not {cls._mechanism}")
        return cls._from_checkpoint(path, cls._checkpoint_config(info))


class LinearAttentionSpine(_LayeredSpine):
    """Causal linear attention over the whole stream (see the module docs). Per chunk of ``t`` tokens and layer the
    cost is ``O(b t d^2)``; the state holds ``n_layer b (H hd (hd + 1) + d)`` numbers, whatever the stream's length.

    Example: two chunks give the logits of one pass, and a step's loss trains the model:

    >>> import torch
    >>> from attnmix.torch import LinearAttentionSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = LinearAttentionSpine(16, d_model=8, n_layer=2, n_head=2)
    >>> x = torch.randint(0, 16, (2, 12))
    >>> _, whole = spine.advance(spine.init_state(2), x)
    >>> state, first = spine.advance(spine.init_state(2), x[:, :5])
    >>> state, rest = spine.advance(state, x[:, 5:])
    >>> tuple(whole.shape), torch.allclose(whole, torch.cat([first, rest], dim=1), atol=1e-5)
    ((2, 12, 16), True)
    >>> opt = torch.optim.SGD(spine.parameters(), lr=0.1)
    >>> losses = []
    >>> for update in range(3):  # three updates on the same chunk
    ...     _, loss = spine.step(spine.init_state(2), (x[:, :-1], x[:, 1:]))
    ...     opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
    >>> losses[2] < losses[1] < losses[0]
    True
    """

    _state_type = LinearAttentionState
    _layer_type = LinearAttentionLayerState
    _mechanism = "linear"

    def __init__(self, vocab: int, *, d_model: int = 32, n_layer: int = 2, n_head: int = 2) -> None:
        super().__init__()
        self._setup(_model_sizes("LinearAttentionSpine", vocab, d_model, n_layer, n_head))

    @staticmethod
    def _make_native(c: Dict[str, Any]):
        return _torch._LinearAttentionSpine(c)


class FrequentDirectionsSpine(_LayeredSpine):
    """An exact window plus a Frequent Directions sketch of everything evicted (see the module docs).

    Example: 16 tokens through a window of 4 put 12 rows into a sketch of 4 rows; the receipt confirms the sketch's
    guarantee, and two chunks give the logits of one pass:

    >>> import torch
    >>> from attnmix.torch import FrequentDirectionsSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = FrequentDirectionsSpine(16, d_model=8, n_layer=1, n_head=2, window=4, sketch_rows=4)
    >>> x = torch.randint(0, 16, (1, 17))
    >>> state, loss = spine.step(spine.init_state(1), (x[:, :-1], x[:, 1:]))
    >>> receipt = spine.receipts(state)[0]  # layer 0
    >>> receipt["evicted"], receipt["filled"], receipt["shrinks"], receipt["bound_holds"], bool(torch.isfinite(loss))
    (12, 3, 3, True, True)
    >>> _, whole = spine.advance(spine.init_state(1), x)
    >>> state, first = spine.advance(spine.init_state(1), x[:, :5])
    >>> state, rest = spine.advance(state, x[:, 5:])
    >>> torch.allclose(whole, torch.cat([first, rest], dim=1), atol=1e-5)
    True
    """

    _state_type = FrequentDirectionsState
    _layer_type = FrequentDirectionsLayerState
    _mechanism = "frequent-directions"

    def __init__(
        self, vocab: int, *, d_model: int = 32, n_layer: int = 2, n_head: int = 2, window: int = 16,
        sketch_rows: int = 16,
    ) -> None:
        super().__init__()
        w = "FrequentDirectionsSpine"
        config = _model_sizes(w, vocab, d_model, n_layer, n_head)
        config["window"] = _positive_int(window, w, "window")
        config["sketch_rows"] = _positive_int(sketch_rows, w, "sketch_rows")
        if config["sketch_rows"] < 4 or config["sketch_rows"] % 2:
            raise ValueError(f"{w}: sketch_rows must be even and at least 4 (got {sketch_rows})")
        self._setup(config)

    @staticmethod
    def _make_native(c: Dict[str, Any]):
        return _torch._FrequentDirectionsSpine(c)

    @classmethod
    def _checkpoint_config(cls, info: Dict[str, Any]) -> Dict[str, Any]:
        return {**super()._checkpoint_config(info), "window": info["window"], "sketch_rows": info["sketch_rows"]}

    def receipts(self, state: FrequentDirectionsState) -> list:
        """Every layer's sketch receipt for ``state`` (see the module docs)."""
        return self._native.receipts(self._native_state(state, "FrequentDirectionsSpine.receipts"))


class TensorSketchSpine(_LayeredSpine):
    """A polynomial-kernel window plus running sums over a tensor sketch of everything evicted (module docs).

    Example: two chunks of 12 tokens through a window of 4 give the logits of one pass, and a finite loss:

    >>> import torch
    >>> from attnmix.torch import TensorSketchSpine
    >>> _ = torch.manual_seed(0)
    >>> spine = TensorSketchSpine(16, d_model=8, n_layer=1, n_head=2, window=4, sketch_dim=16)
    >>> x = torch.randint(0, 16, (2, 12))
    >>> _, whole = spine.advance(spine.init_state(2), x)
    >>> state, first = spine.advance(spine.init_state(2), x[:, :5])
    >>> state, rest = spine.advance(state, x[:, 5:])
    >>> tuple(whole.shape), torch.allclose(whole, torch.cat([first, rest], dim=1), atol=1e-5)
    ((2, 12, 16), True)
    >>> state, loss = spine.step(spine.init_state(2), (x[:, :-1], x[:, 1:]))
    >>> state.pos, bool(torch.isfinite(loss)), loss.requires_grad
    (11, True, True)
    """

    _state_type = TensorSketchState
    _layer_type = TensorSketchLayerState
    _mechanism = "tensor-sketch"

    def __init__(
        self, vocab: int, *, d_model: int = 32, n_layer: int = 2, n_head: int = 2, window: int = 16,
        sketch_dim: int = 64, sketch_degree: int = 2,
    ) -> None:
        super().__init__()
        w = "TensorSketchSpine"
        config = _model_sizes(w, vocab, d_model, n_layer, n_head)
        config["window"] = _positive_int(window, w, "window")
        config["sketch_dim"] = _positive_int(sketch_dim, w, "sketch_dim")
        config["sketch_degree"] = _positive_int(sketch_degree, w, "sketch_degree")
        self._setup(config)

    @staticmethod
    def _make_native(c: Dict[str, Any]):
        return _torch._TensorSketchSpine(c)

    @classmethod
    def _checkpoint_config(cls, info: Dict[str, Any]) -> Dict[str, Any]:
        keys = ("window", "sketch_dim", "sketch_degree")
        return {**super()._checkpoint_config(info), **{k: info[k] for k in keys}}
