# SPDX-License-Identifier: Apache-2.0
"""attnmix.torch.em_heads: responsibility-attention heads as autograd functions (issue 19 §5).

Gradients are checked by torch.autograd.gradcheck (float64 central differences of the forward, which is the model's
own seq_log_density / predict_proba) with respect to the query and the key means; forward values against the model;
float32; impossible evidence; strict argument checks; and the example examples/torch_em_encoder.py at small settings.
"""
import importlib.util
import pathlib

import numpy as np
import pytest
import torch

import attnmix
from attnmix.torch.em_heads import responsibility_log_density, responsibility_predict_proba

S, N, D, T = 5, 4, 3, 6
EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "torch_em_encoder.py"


@pytest.fixture
def model(rng):
    return attnmix.ResponsibilityAttentionDistribution(
        rng.standard_normal((S, D)), rng.dirichlet(np.ones(T), size=S), rng.dirichlet(np.ones(N)), 0.6)


@pytest.fixture
def rows(rng, model):
    """Contexts with repeated symbols (S = 5, N = 4; row 0 holds symbol 2 twice), queries near the keys, targets."""
    n = 6
    contexts = rng.integers(0, S, size=(n, N))
    contexts[0] = [2, 1, 2, 4]
    z = rng.integers(0, N, size=n)
    queries = np.asarray(model.key_means)[contexts[np.arange(n), z]] + 0.7 * rng.standard_normal((n, D))
    targets = rng.integers(0, T, size=n)
    return contexts, queries, targets


def _leaf(a, dtype=torch.float64):
    return torch.tensor(np.array(a), dtype=dtype, requires_grad=True)


# ---- gradients --------------------------------------------------------------------------------------------------


def test_log_density_gradcheck_query_and_key_means(model, rows):
    contexts, queries, targets = rows
    y, keys = _leaf(queries), _leaf(model.key_means)
    assert torch.autograd.gradcheck(
        lambda y, k: responsibility_log_density(model, contexts, y, targets, key_means=k), (y, keys),
        eps=1e-6, atol=1e-6, rtol=1e-5)


def test_predict_proba_gradcheck_query_and_key_means(model, rows):
    contexts, queries, _ = rows
    y, keys = _leaf(queries), _leaf(model.key_means)
    assert torch.autograd.gradcheck(
        lambda y, k: responsibility_predict_proba(model, contexts, y, key_means=k), (y, keys),
        eps=1e-6, atol=1e-6, rtol=1e-5)
    # One example: context (N,), query (D,) -> (T,).
    y1 = _leaf(queries[0])
    assert torch.autograd.gradcheck(
        lambda y, k: responsibility_predict_proba(model, contexts[0], y, key_means=k), (y1, keys),
        eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradient_formula_and_default_key_means(model, rows):
    """d log p / d y = sum_i r_i (K[c_i] - y) / sigma2; the default key means are constants."""
    contexts, queries, targets = rows
    y = _leaf(queries)
    responsibility_log_density(model, contexts, y, targets).sum().backward()
    K = np.asarray(model.key_means)
    for n in range(len(targets)):
        keys = K[contexts[n]]                                               # (N, D)
        ell = (np.log(model.position_prior) - ((queries[n] - keys) ** 2).sum(1) / (2 * model.sigma2)
               + np.log(np.asarray(model.emission)[contexts[n], targets[n]]))
        r = np.exp(ell - ell.max())
        r /= r.sum()
        np.testing.assert_allclose(y.grad[n].numpy(), r @ (keys - queries[n]) / model.sigma2, rtol=1e-10,
                                   atol=1e-12)
    # The same query gradient with the key means passed explicitly (and no key gradient without them).
    y2, k2 = _leaf(queries), _leaf(model.key_means)
    responsibility_log_density(model, contexts, y2, targets, key_means=k2).sum().backward()
    np.testing.assert_allclose(y2.grad.numpy(), y.grad.numpy(), rtol=1e-14, atol=1e-15)
    assert k2.grad is not None and k2.grad.shape == (S, D)


def test_parameter_key_means_receive_gradients(model, rows):
    contexts, queries, targets = rows
    original = np.array(model.key_means)
    keys = torch.nn.Parameter(torch.tensor(original))
    optimizer = torch.optim.SGD([keys], lr=0.05)
    y = torch.tensor(queries)
    before = responsibility_log_density(model, contexts, y, targets, key_means=keys).sum().item()
    for _ in range(5):
        optimizer.zero_grad()
        (-responsibility_log_density(model, contexts, y, targets, key_means=keys).sum()).backward()
        optimizer.step()
    after = responsibility_log_density(model, contexts, y, targets, key_means=keys).sum().item()
    assert after > before
    assert not np.array_equal(keys.detach().numpy(), original)
    np.testing.assert_array_equal(model.key_means, original)  # the model itself is unchanged


# ---- forward values ---------------------------------------------------------------------------------------------


def test_forward_equals_the_model(model, rows):
    contexts, queries, targets = rows
    log_p = responsibility_log_density(model, contexts, torch.tensor(queries), targets)
    assert log_p.shape == (len(targets),) and log_p.dtype == torch.float64
    np.testing.assert_array_equal(log_p.numpy(), model.seq_log_density((contexts, queries, targets)))
    proba = responsibility_predict_proba(model, contexts, torch.tensor(queries))
    assert proba.shape == (len(targets), T)
    np.testing.assert_array_equal(proba.numpy(), model.predict_proba(contexts, queries))
    single = responsibility_predict_proba(model, contexts[1], torch.tensor(queries[1]))
    assert single.shape == (T,)
    np.testing.assert_array_equal(single.numpy(), model.predict_proba(contexts[1], queries[1]))


def test_key_means_argument_replaces_the_models_keys(model, rows, rng):
    contexts, queries, targets = rows
    other = rng.standard_normal((S, D))
    moved = attnmix.ResponsibilityAttentionDistribution(other, model.emission, model.position_prior, model.sigma2)
    y, k = torch.tensor(queries), torch.tensor(other)
    np.testing.assert_array_equal(responsibility_log_density(model, contexts, y, targets, key_means=k).numpy(),
                                  moved.seq_log_density((contexts, queries, targets)))
    np.testing.assert_array_equal(responsibility_predict_proba(model, contexts, y, key_means=k).numpy(),
                                  moved.predict_proba(contexts, queries))


def test_ids_as_lists_and_integer_tensors(model, rows):
    contexts, queries, targets = rows
    y = torch.tensor(queries)
    expected = responsibility_log_density(model, contexts, y, targets)
    for c, t in [(contexts.tolist(), targets.tolist()), (torch.from_numpy(contexts), torch.from_numpy(targets)),
                 (contexts.astype(np.float64), targets.astype(np.int32))]:
        np.testing.assert_array_equal(responsibility_log_density(model, c, y, t).numpy(), expected.numpy())


def test_float32(model, rows):
    contexts, queries, targets = rows
    y, k = _leaf(queries, torch.float32), _leaf(model.key_means, torch.float32)
    log_p = responsibility_log_density(model, contexts, y, targets, key_means=k)
    assert log_p.dtype == torch.float32
    log_p.sum().backward()
    assert y.grad.dtype == torch.float32 and k.grad.dtype == torch.float32
    y64, k64 = _leaf(queries), _leaf(model.key_means)
    responsibility_log_density(model, contexts, y64, targets, key_means=k64).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), y64.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(k.grad.numpy(), k64.grad.numpy(), rtol=1e-4, atol=1e-5)
    y.grad = None
    proba = responsibility_predict_proba(model, contexts, y)
    assert proba.dtype == torch.float32
    proba[:, 0].sum().backward()
    assert y.grad.dtype == torch.float32 and torch.isfinite(y.grad).all()


# ---- impossible evidence ----------------------------------------------------------------------------------------


def _impossible_case():
    """Position 0 has prior 0; target 0 is impossible from symbol 0."""
    model = attnmix.ResponsibilityAttentionDistribution(
        np.array([[0.0, 0.5], [1.0, -0.3]]), np.array([[0.0, 1.0], [0.6, 0.4]]), np.array([0.0, 0.5, 0.5]), 0.8)
    contexts = np.array([[1, 0, 1], [1, 0, 0]])  # row 1 with target 0 is impossible
    return model, contexts, np.array([[0.1, 0.2], [-0.4, 0.3]]), np.array([0, 0])


def test_impossible_rows_give_minus_inf_and_zero_gradient():
    model, contexts, queries, targets = _impossible_case()
    y, k = _leaf(queries), _leaf(model.key_means)
    log_p = responsibility_log_density(model, contexts, y, targets, key_means=k)
    assert np.isfinite(log_p[0].item()) and log_p[1].item() == -np.inf
    log_p.sum().backward()  # the incoming gradient of the -inf row is finite (1)
    assert torch.isfinite(y.grad).all() and torch.isfinite(k.grad).all()
    assert torch.equal(y.grad[1], torch.zeros(2))
    # The key gradient is that of the possible row alone.
    y0, k0 = _leaf(queries[:1]), _leaf(model.key_means)
    responsibility_log_density(model, contexts[:1], y0, targets[:1], key_means=k0).sum().backward()
    np.testing.assert_array_equal(k.grad.numpy(), k0.grad.numpy())


def test_non_finite_incoming_gradient_raises():
    model, contexts, queries, targets = _impossible_case()
    y = _leaf(queries[1:])
    log_p = responsibility_log_density(model, contexts[1:], y, targets[1:])
    with pytest.raises(ValueError, match="finite"):
        torch.logsumexp(log_p, dim=0).backward()  # sends NaN back for an all -inf vector


# ---- argument checks --------------------------------------------------------------------------------------------


def test_bad_arguments(model, rows):
    contexts, queries, targets = rows
    y = torch.tensor(queries)
    ld, pp = responsibility_log_density, responsibility_predict_proba
    cases = [
        (TypeError, "model", lambda: ld(object(), contexts, y, targets)),
        (TypeError, "query", lambda: ld(model, contexts, queries, targets)),                  # numpy, not a tensor
        (TypeError, "query", lambda: ld(model, contexts, y.to(torch.int64), targets)),
        (TypeError, "query", lambda: ld(model, contexts, y.to(torch.float16), targets)),
        (TypeError, "query", lambda: pp(model, contexts, y.to(torch.complex128))),
        (ValueError, "query", lambda: ld(model, contexts, y[:, :2], targets)),               # D = 2, model D = 3
        (ValueError, "query", lambda: ld(model, contexts, y[0], targets)),                   # 1-D for a batch
        (ValueError, "query", lambda: pp(model, contexts, y[None])),                         # 3-D
        (ValueError, "query", lambda: ld(model, contexts, y * float("nan"), targets)),
        (ValueError, "rows", lambda: ld(model, contexts[:3], y, targets)),
        (ValueError, "rows", lambda: pp(model, contexts[:3], y)),
        (TypeError, "context", lambda: ld(model, contexts.astype(bool), y, targets)),
        (TypeError, "context", lambda: ld(model, torch.from_numpy(contexts) > 0, y, targets)),
        (TypeError, "context", lambda: ld(model, contexts[0], y, targets)),                  # 1-D for a batch
        (TypeError, "context", lambda: pp(model, contexts, y[0])),                           # 2-D for one example
        (TypeError, "context", lambda: ld(model, [[0, 1, 2, 3], [0, 1]] * 3, y, targets)),   # ragged
        (TypeError, "context", lambda: ld(model, "0123", y, targets)),
        (ValueError, "context", lambda: ld(model, contexts + 0.5, y, targets)),              # fractional
        (ValueError, "out-of-range ID", lambda: ld(model, contexts + S, y, targets)),
        (ValueError, "out-of-range ID", lambda: pp(model, contexts - S, y)),
        (TypeError, "target", lambda: ld(model, contexts, y, targets[:, None])),
        (ValueError, "out-of-range ID", lambda: ld(model, contexts, y, targets + T)),
        (ValueError, "key_means", lambda: ld(model, contexts, y, targets, key_means=torch.zeros(S, D + 1))),
        (TypeError, "key_means", lambda: ld(model, contexts, y, targets, key_means=np.zeros((S, D)))),
        (TypeError, "key_means", lambda: pp(model, contexts, y, key_means=torch.zeros(S, D, dtype=torch.int32))),
        (ValueError, "key_means", lambda: pp(model, contexts, y, key_means=torch.full((S, D), float("inf")))),
    ]
    for error, text, call in cases:
        with pytest.raises(error, match=text):
            call()


def test_private_vjp_helpers_convert_strictly(model, rows):
    contexts, queries, targets = rows
    n = len(targets)
    grad_q, grad_k = model._log_density_vjp(contexts, queries, targets, np.ones(n))
    assert grad_q.shape == (n, D) and grad_k.shape == (S, D)
    grad_q, grad_k = model._predict_proba_vjp(contexts, queries, np.ones((n, T)))
    np.testing.assert_allclose(grad_q, 0.0, atol=1e-12)  # sum_t p(t) = 1 does not depend on the query
    np.testing.assert_allclose(grad_k, 0.0, atol=1e-12)
    with pytest.raises(ValueError, match="gradient length"):
        model._log_density_vjp(contexts, queries, targets, np.ones(n - 1))
    with pytest.raises(ValueError, match="finite"):
        model._log_density_vjp(contexts, queries, targets, np.full(n, np.nan))
    with pytest.raises(ValueError, match="gradient columns"):
        model._predict_proba_vjp(contexts, queries, np.ones((n, T + 1)))
    with pytest.raises(TypeError, match="context"):
        model._predict_proba_vjp(contexts.astype(bool), queries, np.ones((n, T)))
    with pytest.raises(TypeError, match="query"):
        model._log_density_vjp(contexts, queries.astype(complex), targets, np.ones(n))
    with pytest.raises(ValueError, match="out-of-range ID"):
        model._log_density_vjp(contexts, queries, targets + T, np.ones(n))


# ---- the example ------------------------------------------------------------------------------------------------


def test_example_alternation_beats_both_baselines():
    spec = importlib.util.spec_from_file_location("torch_em_encoder", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    results = example.run(n_train=1000, n_test=1000, seed=7, rounds=5, steps=20, classifier_epochs=200,
                          raw_em_its=30, with_context_baseline=False, verbose=False)
    a, b, c = results["head_on_raw_inputs"], results["encoder_softmax"], results["encoder_em_head"]
    assert c > a and c > b, results
