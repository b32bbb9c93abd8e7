# SPDX-License-Identifier: Apache-2.0
"""EM-fitted responsibility-attention heads inside torch autograd.

A responsibility-attention head (``attnmix.ResponsibilityAttentionDistribution``) is a mixture over the positions
of a context: with key means ``K`` (S, D), emission ``B`` (S, T), position prior ``pi`` (N,) and gate variance
``sigma2``, an observation (context ``c`` of N symbol ids, real query ``y`` of length D, target ``t``) has

    l_i = log pi_i - ||y - K[c_i]||^2 / (2 sigma2) + log B[c_i, t] - (D/2) log(2 pi sigma2)
    log p(y, t | c) = logsumexp_i l_i
    p(t | c, y)     = sum_i a_i B[c_i, t],   a = softmax_i(log pi_i - ||y - K[c_i]||^2 / (2 sigma2))

The head is fitted by EM (``attnmix.optimize``) in closed form. The two functions here make it a differentiable
layer, so that a neural encoder can produce its queries: both return torch tensors with exact gradients with respect
to the query and, optionally, the key means, computed by attnmix's C++ core (the emission, the position prior and
``sigma2`` are constants)::

    import attnmix
    from attnmix.torch.em_heads import responsibility_log_density, responsibility_predict_proba

    head = attnmix.optimize((contexts, encoder(x).detach().double().numpy(), targets), estimator, out=None)
    log_p = responsibility_log_density(head, contexts, encoder(x), targets)      # (n,), differentiable
    loss = -log_p.mean(); loss.backward()                                          # gradients reach the encoder

Key means as parameters: by default the model's own key means are used as constants. Pass ``key_means`` (a tensor
of shape (S, D), for instance a ``torch.nn.Parameter`` initialised from ``model.key_means``) to use those values
instead (the model's emission, prior and ``sigma2`` are kept) and receive their gradient in ``key_means.grad``.

Contexts and targets are integer ids (numpy arrays, nested lists, or integer torch tensors), checked strictly: a
bool dtype, a ragged nesting or a wrong number of dimensions raises TypeError; a fractional, negative or out-of-range
id raises ValueError. Queries are float32 or float64 CPU tensors; the result has the query's dtype (computations run
in float64). Only first derivatives are available (no double backward).

Impossible evidence: a row whose log density is -inf (every position has a zero prior or a zero emission
probability for its target) returns -inf and contributes a zero gradient, since its log density is the constant -inf
around its query and key means. An incoming gradient that is not finite (for example the NaN that
``torch.logsumexp`` of an all -inf vector sends back) raises ValueError instead of producing NaN gradients.
"""
from __future__ import annotations

from typing import Any, NoReturn, Optional

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from attnmix import _core

__all__ = ["responsibility_log_density", "responsibility_predict_proba"]

_FLOAT_DTYPES = (torch.float32, torch.float64)


def _reraise(where: str, error: Exception) -> NoReturn:
    """Re-raises a TypeError / ValueError of the core with the public function's name in front."""
    if type(error) in (TypeError, ValueError):
        raise type(error)(f"{where}: {error}") from error
    raise error


def _check_model(model: Any, where: str) -> None:
    if not isinstance(model, _core.ResponsibilityAttentionDistribution):
        raise TypeError(f"{where}: model must be an attnmix.ResponsibilityAttentionDistribution "
                        f"(got {type(model).__name__})")


def _real_tensor(x: Any, where: str, name: str) -> torch.Tensor:
    """A float32 / float64 dense CPU tensor (TypeError for anything else, ValueError for another device)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a torch.Tensor (got {type(x).__name__})")
    if x.layout != torch.strided:
        raise TypeError(f"{where}: {name} must be a dense (strided) tensor (got layout {x.layout})")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{where}: {name} must have dtype torch.float32 or torch.float64 (got {x.dtype})")
    if x.device.type != "cpu":
        raise ValueError(f"{where}: {name} must be on the CPU (got device {x.device})")
    return x


def _to_float64(x: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().to(torch.float64).numpy())


def _ids(x: Any, where: str, name: str, ndim: int) -> np.ndarray:
    """Ids as a numpy array of the required number of dimensions; the exactness and range checks are the core's."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool:
            raise TypeError(f"{where}: {name} must hold integer ids (got dtype torch.bool)")
        if x.device.type != "cpu":
            raise ValueError(f"{where}: {name} must be on the CPU (got device {x.device})")
        if x.dtype.is_complex:
            raise TypeError(f"{where}: {name} must hold integer ids (got dtype {x.dtype})")
        a = x.detach().numpy()
    elif isinstance(x, np.ndarray):
        a = x
    elif isinstance(x, (str, bytes, dict)) or x is None:
        raise TypeError(f"{where}: {name} must be an array of integer ids (got {type(x).__name__})")
    else:
        try:
            a = np.asarray(x)
        except ValueError as error:  # a ragged nesting
            raise TypeError(f"{where}: {name} must be a rectangular array of integer ids ({error})") from None
    if a.dtype == np.bool_ or a.dtype.kind not in "iuf":
        raise TypeError(f"{where}: {name} must hold integer ids (got dtype {a.dtype})")
    if a.ndim != ndim:
        raise TypeError(f"{where}: {name} must be a {ndim}-D array of integer ids (got shape {a.shape})")
    return a


def _head(model: Any, key_means: Optional[torch.Tensor], where: str) -> Any:
    """The model, or the model with key_means in place of its own key means."""
    if key_means is None:
        return model
    _real_tensor(key_means, where, "key_means")
    expected = (model.num_symbols, model.query_dim)
    if tuple(key_means.shape) != expected:
        raise ValueError(f"{where}: key_means must have shape {expected} (the model's (S, D)), "
                         f"got {tuple(key_means.shape)}")
    if not bool(torch.isfinite(key_means).all()):
        raise ValueError(f"{where}: key_means must be finite")
    try:
        return _core.ResponsibilityAttentionDistribution(_to_float64(key_means), model.emission,
                                                         model.position_prior, model.sigma2, model.name)
    except (TypeError, ValueError) as error:
        _reraise(where, error)


def _check_query(query: Any, model: Any, where: str, ndims: tuple) -> torch.Tensor:
    _real_tensor(query, where, "query")
    if query.dim() not in ndims:
        shapes = " or ".join({1: "(D,)", 2: "(n, D)"}[d] for d in ndims)
        raise ValueError(f"{where}: query must have shape {shapes} (got {tuple(query.shape)})")
    if query.shape[-1] != model.query_dim:
        raise ValueError(f"{where}: query must have D = {model.query_dim} columns (the model's query_dim), "
                         f"got shape {tuple(query.shape)}")
    if not bool(torch.isfinite(query).all()):
        raise ValueError(f"{where}: query must be finite")
    return query


class _LogDensity(torch.autograd.Function):
    """log p(y_n, t_n | c_n) (n,) of a fixed head; differentiable in the queries and the key means."""

    @staticmethod
    def forward(ctx, head, contexts, targets, query, key_means):  # noqa: D102
        y = _to_float64(query)
        where = "responsibility_log_density"
        try:
            batch = head.dist_to_encoder().seq_encode((contexts, y, targets))
            log_p = head.seq_log_density(batch)
        except (TypeError, ValueError) as error:
            _reraise(where, error)
        ctx.head = head
        ctx.batch = batch
        ctx.key_dtype = None if key_means is None else key_means.dtype
        return torch.from_numpy(np.asarray(log_p)).to(query.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_p):  # noqa: D102
        contexts, y, targets = ctx.batch
        grad_query, grad_keys = ctx.head._log_density_vjp(contexts, y, targets, _to_float64(grad_log_p))
        grad_query = torch.from_numpy(grad_query).to(grad_log_p.dtype)
        grad_keys = None if ctx.key_dtype is None else torch.from_numpy(grad_keys).to(ctx.key_dtype)
        return None, None, None, grad_query, grad_keys


class _PredictProba(torch.autograd.Function):
    """p(t | c_n, y_n) (n, T) of a fixed head; differentiable in the queries and the key means."""

    @staticmethod
    def forward(ctx, head, contexts, query, key_means):  # noqa: D102
        y = _to_float64(query)
        try:
            proba = head.predict_proba(contexts, y)
        except (TypeError, ValueError) as error:
            _reraise("responsibility_predict_proba", error)
        ctx.head = head
        ctx.contexts = np.array(contexts)  # a copy: the caller may change its array before backward
        ctx.y = y
        ctx.key_dtype = None if key_means is None else key_means.dtype
        return torch.from_numpy(np.asarray(proba)).to(query.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_proba):  # noqa: D102
        grad_query, grad_keys = ctx.head._predict_proba_vjp(ctx.contexts, ctx.y, _to_float64(grad_proba))
        grad_query = torch.from_numpy(grad_query).to(grad_proba.dtype)
        grad_keys = None if ctx.key_dtype is None else torch.from_numpy(grad_keys).to(ctx.key_dtype)
        return None, None, grad_query, grad_keys


def responsibility_log_density(model: Any, context: Any, query: torch.Tensor, target: Any,
                               key_means: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The log density log p(query_n, target_n | context_n) of each row under a responsibility-attention head.

    Args:
        model
            An ``attnmix.ResponsibilityAttentionDistribution`` (S symbols, N positions, D query dims, T targets).
        context
            (n, N) integer symbol ids in [0, S).
        query
            (n, D) float32 or float64 CPU tensor; it may require grad.
        target
            (n,) integer target ids in [0, T).
        key_means
            None (the model's key means, as constants) or an (S, D) float32 / float64 CPU tensor used in
            place of them (the model's emission, prior and variance are kept); it may require grad, for instance a
            ``torch.nn.Parameter``.

    Returns:
        An (n,) tensor in the query's dtype, equal to ``model.seq_log_density`` of the rows (with ``key_means`` in
        place of the model's when given; -inf for impossible rows). Backward gives the exact gradients
        d log p / d query_n = sum_i r_ni (K[c_ni] - query_n) / sigma2 and
        d log p / d K[s] = sum_{n, i: c_ni = s} r_ni (query_n - K[s]) / sigma2 (r: the posterior responsibilities;
        a symbol repeated in a context contributes once per position); impossible rows contribute zero.

    Raises:
        TypeError: model is not a ResponsibilityAttentionDistribution; query or key_means is not a float32 /
            float64 dense tensor; context or target is not an integer id array of the right number of dimensions.
        ValueError: wrong shapes, non-finite values, ids out of range or fractional, a tensor not on the CPU, or a
            non-finite incoming gradient during backward.

    Example: a head of 5 symbols, 3-dimensional queries, 4 targets and 4 positions; the log densities of two rows
    and their gradients agree with the formula of the module docs written in plain torch:

    >>> import math
    >>> import numpy as np
    >>> import torch
    >>> import attnmix
    >>> from attnmix.torch import responsibility_log_density
    >>> rng = np.random.default_rng(0)
    >>> model = attnmix.ResponsibilityAttentionDistribution(
    ...     rng.standard_normal((5, 3)), rng.dirichlet(np.ones(4), size=5), np.full(4, 0.25), sigma2=0.5)
    >>> context, target = torch.tensor([[0, 1, 2, 3], [4, 4, 1, 0]]), torch.tensor([2, 0])
    >>> query = torch.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    >>> log_p = responsibility_log_density(model, context, query, target)
    >>> log_p.sum().backward()
    >>> tuple(log_p.shape), log_p.dtype, tuple(query.grad.shape)
    ((2,), torch.float64, (2, 3))
    >>> K, B, pi = (torch.tensor(a) for a in (model.key_means, model.emission, model.position_prior))
    >>> y = query.detach().clone().requires_grad_()
    >>> l = (pi.log() - ((y[:, None] - K[context]) ** 2).sum(-1) / (2 * 0.5) + B[context, target[:, None]].log()
    ...      - 3 / 2 * math.log(2 * math.pi * 0.5))  # l_i, (rows, positions)
    >>> l.logsumexp(-1).sum().backward()
    >>> torch.allclose(log_p, l.logsumexp(-1)), torch.allclose(query.grad, y.grad)
    (True, True)
    """
    where = "responsibility_log_density"
    _check_model(model, where)
    _check_query(query, model, where, (2,))
    contexts = _ids(context, where, "context", 2)
    targets = _ids(target, where, "target", 1)
    n = query.shape[0]
    if contexts.shape[0] != n or targets.shape[0] != n:
        raise ValueError(f"{where}: context, query and target must have the same number of rows "
                         f"(got {contexts.shape[0]}, {n}, {targets.shape[0]})")
    head = _head(model, key_means, where)
    return _LogDensity.apply(head, contexts, targets, query, key_means)


def responsibility_predict_proba(model: Any, context: Any, query: torch.Tensor,
                                 key_means: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The predictive distribution p(t | context, query) = sum_i a_i B[c_i, t] of a responsibility-attention head.

    The attention a = softmax_i(log pi_i - ||query - K[c_i]||^2 / (2 sigma2)) does not see the target.

    Args:
        model
            An ``attnmix.ResponsibilityAttentionDistribution`` (S symbols, N positions, D query dims, T targets).
        context
            (N,) integer symbol ids for one example, or (n, N) for a batch.
        query
            (D,) for one example or (n, D) for a batch (matching the context): a float32 or float64 CPU tensor
            that may require grad.
        key_means
            None (the model's key means, as constants) or an (S, D) float32 / float64 CPU tensor used in
            place of them; it may require grad.

    Returns:
        A (T,) tensor for one example or (n, T) for a batch, in the query's dtype, equal to ``model.predict_proba``.
        Backward gives the exact vector-Jacobian product: for an incoming gradient G (n, T), with
        u_i = sum_t G_t B[c_i, t] and u_bar = sum_j a_j u_j, d/d query = sum_i a_i (u_i - u_bar) (K[c_i] - query) /
        sigma2, and K[c_i] receives the negative of the same term.

    Raises:
        TypeError: model is not a ResponsibilityAttentionDistribution; query or key_means is not a float32 /
            float64 dense tensor; context is not an integer id array of the right number of dimensions.
        ValueError: wrong shapes, non-finite values, ids out of range or fractional, a tensor not on the CPU, or a
            non-finite incoming gradient during backward.

    Example: the head of ``responsibility_log_density``'s example; each row is a distribution over the 4 targets,
    equal to ``model.predict_proba``, and a gradient step on the query raises the probability of target 2:

    >>> import numpy as np
    >>> import torch
    >>> import attnmix
    >>> from attnmix.torch import responsibility_predict_proba
    >>> rng = np.random.default_rng(0)
    >>> model = attnmix.ResponsibilityAttentionDistribution(
    ...     rng.standard_normal((5, 3)), rng.dirichlet(np.ones(4), size=5), np.full(4, 0.25), sigma2=0.5)
    >>> context, query = np.array([[0, 1, 2, 3], [4, 4, 1, 0]]), torch.zeros(2, 3)
    >>> p = responsibility_predict_proba(model, context, query)
    >>> tuple(p.shape), p.dtype, torch.allclose(p.sum(-1), torch.ones(2))
    ((2, 4), torch.float32, True)
    >>> np.allclose(p.numpy(), model.predict_proba(context, np.zeros((2, 3))))
    True
    >>> q = torch.zeros(3, requires_grad=True)  # one example: context (N,), query (D,)
    >>> before = responsibility_predict_proba(model, context[0], q)[2]
    >>> before.log().backward()
    >>> after = responsibility_predict_proba(model, context[0], (q + 0.1 * q.grad).detach())[2]
    >>> bool(after > before)
    True
    """
    where = "responsibility_predict_proba"
    _check_model(model, where)
    _check_query(query, model, where, (1, 2))
    single = query.dim() == 1
    contexts = _ids(context, where, "context", 1 if single else 2)
    if single:
        contexts = contexts[None, :]
        query_2d = query[None, :]
    else:
        query_2d = query
        if contexts.shape[0] != query.shape[0]:
            raise ValueError(f"{where}: context and query must have the same number of rows "
                             f"(got {contexts.shape[0]} and {query.shape[0]})")
    head = _head(model, key_means, where)
    proba = _PredictProba.apply(head, contexts, query_2d, key_means)
    return proba[0] if single else proba
