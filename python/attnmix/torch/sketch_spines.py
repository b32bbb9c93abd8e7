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
    sum_kv: torch.Tensor
    sum_k: torch.Tensor
    last_x: torch.Tensor


@dataclass
class LinearAttentionState:
    layers: List[LinearAttentionLayerState]
    pos: int = 0
    batch_size: int = 1


@dataclass
class FrequentDirectionsLayerState:
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
    layers: List[FrequentDirectionsLayerState]
    pos: int = 0
    batch_size: int = 1


@dataclass
class TensorSketchLayerState:
    window_k: torch.Tensor
    window_v: torch.Tensor
    sum_kv: torch.Tensor
    sum_k: torch.Tensor
    misfit: torch.Tensor
    last_x: torch.Tensor


@dataclass
class TensorSketchState:
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
    cost is ``O(b t d^2)``; the state holds ``n_layer b (H hd (hd + 1) + d)`` numbers, whatever the stream's length."""

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
    """An exact window plus a Frequent Directions sketch of everything evicted (see the module docs)."""

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
    """A polynomial-kernel window plus running sums over a tensor sketch of everything evicted (module docs)."""

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
