# SPDX-License-Identifier: Apache-2.0
"""attnmix.torch's attention layers for users' own architectures (SlidingWindowSelfAttention,
MomentClosureSelfAttention), and examples/torch_recall_transformer.py.

The oracles below are written from the layers' documented math in plain torch, not from attnmix's code: the
projections, RoPE (rotate-half, base 10000) at absolute positions, the window mask over a whole sequence (no cache),
the MGF cluster logits and outputs, one joint softmax, and the cluster bank's evolution (birth with floored
variances, the default or given merge rule with the pooled combination, the responsibility-weighted Chan update).
That the layers are the very sublayers of attnmix's MomentClosureAttention and SlidingWindowSpine (bitwise) is
checked in C++ (tests/cpp/stream/self_attention_test.cpp), where the mechanisms' internals are reachable.
"""
import copy
import io
import json
import math
import os
import pickle
import subprocess
import sys

import pytest
import torch

import attnmix.torch as at
from attnmix.torch import (
    ClusterBank,
    MomentClosureLayerState,
    MomentClosureSelfAttention,
    SlidingWindowLayerState,
    SlidingWindowSelfAttention,
)

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples", "torch_recall_transformer.py")


def randn(*shape, seed, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def randomise(layer, seed, scale=0.5):
    """Replaces the layer's parameters (in place) by seeded normal draws."""
    with torch.no_grad():
        for i, (_, p) in enumerate(sorted(layer.named_parameters())):
            p.copy_(randn(*p.shape, seed=seed + i, dtype=p.dtype, scale=scale))


# ---- the oracle ------------------------------------------------------------------------------------------------


def rope(x, positions):
    """x (b, t, H, d) rotated at positions (t,): pairs (x_k, x_{k+d/2}) by p * 10000^(-2k/d)."""
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos().to(x.dtype)[None, :, None, :], angles.sin().to(x.dtype)[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def qkv_of(layer, x, n_head):
    b, t, d = x.shape
    y = x @ layer.qkv.weight.T + layer.qkv.bias
    q, k, v = y.split(d, -1)
    return [z.reshape(b, t, n_head, d // n_head) for z in (q, k, v)]


def window_oracle(layer, x, n_head, window):
    """One pass of windowed causal attention over the whole sequence x (b, T, d)."""
    b, T, d = x.shape
    q, k, v = qkv_of(layer, x, n_head)
    p = torch.arange(T)
    qr, kr = rope(q, p), rope(k, p)
    scores = torch.einsum("bihd,bjhd->bhij", qr, kr) / math.sqrt(d // n_head)
    delta = p[:, None] - p[None, :]
    visible = delta >= 0 if window is None else (delta >= 0) & (delta < window)
    scores = scores.masked_fill(~visible, float("-inf"))
    out = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v).reshape(b, T, d)
    return out @ layer.proj.weight.T + layer.proj.bias


class OracleBank:
    """One stream's mixture: lists of per-cluster tensors over heads, (H,), (H, d), (H, d), (H, d), (H, d, d)."""

    def __init__(self):
        self.clusters = []

    def logits(self, q):  # q (H, d) -> (H, n)
        d = q.shape[-1]
        return torch.stack(
            [
                (q * c["mu_k"]).sum(-1) / math.sqrt(d)
                + (q * q * c["sigma_kk"]).sum(-1) / (2 * d)
                + c["count"].clamp_min(1e-8).log()
                for c in self.clusters
            ],
            -1,
        )

    def outputs(self, q):  # (H, n, d)
        d = q.shape[-1]
        return torch.stack(
            [c["mu_v"] + torch.einsum("hij,hj->hi", c["sigma_vk"], q) / math.sqrt(d) for c in self.clusters], 1
        )

    def ingest(self, k, v, birth_threshold, merge_threshold, max_clusters):
        """k, v (e, H, d) of one stream."""
        e = k.shape[0]
        k_bar, v_bar = k.mean(0), v.mean(0)
        best = self.logits(k_bar).max(-1).values if self.clusters else torch.full((k.shape[1],), float("-inf"))
        birthed = bool((best < birth_threshold).all()) and len(self.clusters) < max_clusters
        if birthed:
            dk, dv = k - k_bar, v - v_bar
            self.clusters.append(
                {
                    "count": torch.full((k.shape[1],), float(e), dtype=k.dtype),
                    "mu_k": k_bar,
                    "mu_v": v_bar,
                    "sigma_kk": (dk * dk).mean(0).clamp_min(1e-6),
                    "sigma_vk": torch.einsum("thi,thj->hij", dv, dk) / e,
                }
            )
        i = 0
        while i < len(self.clusters):
            for j in range(i + 1, len(self.clusters)):
                a, c = self.clusters[i], self.clusters[j]
                ratio = (a["mu_k"] - c["mu_k"]) ** 2 / (0.5 * (a["sigma_kk"] + c["sigma_kk"])).clamp_min(1e-6)
                distance = float(ratio.mean().sqrt())
                n_small = min(float(a["count"].min()), float(c["count"].min()))
                threshold = merge_threshold if merge_threshold is not None else 2.65 + 6 / math.sqrt(max(n_small, 1))
                if distance < threshold:
                    self.clusters[i] = self.pooled(a, c)
                    last = self.clusters.pop()
                    if j < len(self.clusters):
                        self.clusters[j] = last
                    break
            else:
                i += 1
        if self.clusters and not birthed:
            r = torch.stack([self.logits(k[t]) for t in range(e)]).softmax(-1)  # (e, H, n)
            for c_index, c in enumerate(self.clusters):
                w = r[:, :, c_index]  # (e, H)
                n1 = w.sum(0)
                safe = n1.clamp_min(1e-8)[:, None]
                mk1 = (w[..., None] * k).sum(0) / safe
                mv1 = (w[..., None] * v).sum(0) / safe
                dk, dv = k - mk1, v - mv1
                batch = {
                    "count": n1,
                    "mu_k": mk1,
                    "mu_v": mv1,
                    "sigma_kk": (w[..., None] * dk * dk).sum(0) / safe,
                    "sigma_vk": torch.einsum("th,thi,thj->hij", w, dv, dk) / safe[..., None],
                }
                self.clusters[c_index] = self.pooled(c, batch)
        return birthed

    @staticmethod
    def pooled(a, b):
        na, nb = a["count"], b["count"]
        n = na + nb
        nn = n.clamp_min(1e-8)
        dk, dv = b["mu_k"] - a["mu_k"], b["mu_v"] - a["mu_v"]
        cross = (na * nb / nn)[:, None]
        return {
            "count": n,
            "mu_k": a["mu_k"] + dk * (nb / nn)[:, None],
            "mu_v": a["mu_v"] + dv * (nb / nn)[:, None],
            "sigma_kk": (a["sigma_kk"] * na[:, None] + b["sigma_kk"] * nb[:, None] + dk * dk * cross) / nn[:, None],
            "sigma_vk": (
                a["sigma_vk"] * na[:, None, None]
                + b["sigma_vk"] * nb[:, None, None]
                + dv[:, :, None] * dk[:, None, :] * cross[..., None]
            )
            / nn[:, None, None],
        }


def moment_closure_oracle(layer, chunks, n_head, window, max_clusters, birth_threshold, merge_threshold):
    """The layer's outputs over a stream of chunks (each (b, t, d)), computed from scratch; also the banks."""
    b, d = chunks[0].shape[0], chunks[0].shape[2]
    hd = d // n_head
    banks = [OracleBank() for _ in range(b)]
    k_all = torch.zeros(b, 0, n_head, hd, dtype=chunks[0].dtype)
    v_all = torch.zeros_like(k_all)
    outs, births = [], 0
    pos = 0
    for x in chunks:
        t = x.shape[1]
        q, k, v = qkv_of(layer, x, n_head)
        c = min(window, pos)
        K = torch.cat([k_all[:, pos - c :], k], 1)
        V = torch.cat([v_all[:, pos - c :], v], 1)
        qp, kp = torch.arange(pos, pos + t), torch.arange(pos - c, pos + t)
        near = torch.einsum("bihd,bjhd->bhij", rope(q, qp), rope(K, kp)) / math.sqrt(hd)
        delta = qp[:, None] - kp[None, :]
        near = near.masked_fill(~((delta >= 0) & (delta < window)), float("-inf"))
        out = torch.zeros(b, t, n_head, hd, dtype=x.dtype)
        for s in range(b):
            for i in range(t):
                logits = near[s, :, i]  # (H, L)
                values = V[s].permute(1, 0, 2)  # (H, L, hd)
                if banks[s].clusters:
                    logits = torch.cat([logits, banks[s].logits(q[s, i])], -1)
                    values = torch.cat([values, banks[s].outputs(q[s, i])], 1)
                out[s, i] = torch.einsum("hl,hld->hd", logits.softmax(-1), values)
        outs.append(out.reshape(b, t, d) @ layer.proj.weight.T + layer.proj.bias)
        length = c + t
        keep = min(window, length)
        if length > keep:
            for s in range(b):
                births += banks[s].ingest(
                    K[s, : length - keep], V[s, : length - keep], birth_threshold, merge_threshold, max_clusters
                )
        k_all, v_all = torch.cat([k_all, k], 1), torch.cat([v_all, v], 1)
        pos += t
    return outs, banks, births


def assert_bank_matches(bank, oracle_banks, atol):
    for s, ob in enumerate(oracle_banks):
        n = len(ob.clusters)
        assert bank.n_clusters[s] == n
        for name in ("count", "mu_k", "mu_v", "sigma_kk", "sigma_vk"):
            got = getattr(bank, name)[s]  # (H, C, ...)
            want = torch.stack([c[name] for c in ob.clusters], 1) if n else got[:, :0]
            torch.testing.assert_close(got[:, :n], want, rtol=1e-9, atol=atol)
            assert torch.all(got[:, n:] == 0)


LAYERS = [lambda: SlidingWindowSelfAttention(8, 2, 4), lambda: MomentClosureSelfAttention(8, 2, 4, 3)]


# ---- parameters ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", LAYERS)
def test_parameters_are_the_tensors_the_layer_computes_with(make):
    layer = make()
    names = [n for n, _ in layer.named_parameters()]
    assert names == ["qkv.weight", "qkv.bias", "proj.weight", "proj.bias"]
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in layer.parameters())
    assert layer.qkv.weight.shape == (24, 8) and layer.proj.weight.shape == (8, 8)
    h = randn(2, 5, 8, seed=1, dtype=torch.float32)
    out, _ = layer(h)
    # Changing a parameter in place changes the output: the C++ forward reads these tensors.
    with torch.no_grad():
        layer.proj.bias.add_(1.0)
    out2, _ = layer(h)
    torch.testing.assert_close(out2, out + 1.0)
    # Gradients accumulate where optimizers look, and an optimizer step changes the outputs.
    out2.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())
    torch.optim.AdamW(layer.parameters(), lr=0.1).step()
    out3, _ = layer(h)
    assert not torch.allclose(out3, out2)
    # .double() converts in place; then h must be float64.
    layer.double()
    assert all(p.dtype == torch.float64 for p in layer.parameters())
    out4, state = layer(h.double())
    assert out4.dtype == torch.float64 and state.cache_k.dtype == torch.float64
    with pytest.raises(ValueError, match="dtype"):
        layer(h)


# ---- gradients (float64) ---------------------------------------------------------------------------------------


def test_sliding_window_gradcheck():
    layer = SlidingWindowSelfAttention(4, 2, 3).double()
    randomise(layer, 10)
    h1 = randn(2, 3, 4, seed=2).requires_grad_()
    h2 = randn(2, 2, 4, seed=3).requires_grad_()

    def f(h1, h2, *params):
        out1, state = layer(h1)
        out2, state = layer(h2, state)  # keys of the first chunk through the cache; two of them evicted
        return out1, out2, state.cache_k, state.cache_v

    assert torch.autograd.gradcheck(f, (h1, h2, *layer.parameters()))


def hand_made_state(b, n_head, hd, window, max_clusters, far, seed):
    """Live bank parameters (gradcheck inputs) and a function building a consistent state from them: stream 0 has
    two clusters, stream 1 one; the window holds `window` raw tokens and the bank `far` tokens per head."""
    live = torch.zeros(b, 1, max_clusters)
    live[0, 0, :2] = 1
    live[1, 0, :1] = 1
    share = torch.tensor([[0.6, 0.4], [0.3, 0.7]], dtype=torch.float64)  # stream 0's split per head
    count = torch.zeros(b, n_head, max_clusters, dtype=torch.float64)
    count[0, :, :2] = far * share
    count[1, :, 0] = far
    params = {
        "count": count.requires_grad_(),
        "mu_k": randn(b, n_head, max_clusters, hd, seed=seed).requires_grad_(),
        "mu_v": randn(b, n_head, max_clusters, hd, seed=seed + 1).requires_grad_(),
        "sigma_kk": (0.5 + randn(b, n_head, max_clusters, hd, seed=seed + 2).abs()).requires_grad_(),
        "sigma_vk": randn(b, n_head, max_clusters, hd, hd, seed=seed + 3, scale=0.3).requires_grad_(),
    }
    cache_k = randn(b, window, n_head, hd, seed=seed + 4).requires_grad_()
    cache_v = randn(b, window, n_head, hd, seed=seed + 5).requires_grad_()

    def build(count, mu_k, mu_v, sigma_kk, sigma_vk, cache_k, cache_v):
        mask = live.to(torch.float64)
        bank = ClusterBank(
            count * mask,
            mu_k * mask[..., None],
            mu_v * mask[..., None],
            sigma_kk * mask[..., None],
            sigma_vk * mask[..., None, None],
            [2, 1],
            max_clusters,
        )
        return MomentClosureLayerState(cache_k, cache_v, far + window, b, bank)

    return params, cache_k, cache_v, build


def test_moment_closure_gradcheck():
    """Two chunks against a bank with live clusters (dead slots masked), every eviction through the soft update
    (births and merges disabled): gradients w.r.t. h, the parameters, the cache and the bank."""
    window, max_clusters = 3, 3
    layer = MomentClosureSelfAttention(4, 2, window, max_clusters, birth_threshold=-1e4, merge_threshold=0.0)
    layer.double()
    randomise(layer, 20)
    params, cache_k, cache_v, build = hand_made_state(2, 2, 2, window, max_clusters, far=5, seed=30)
    h1 = randn(2, 2, 4, seed=4).requires_grad_()
    h2 = randn(2, 3, 4, seed=5).requires_grad_()
    bank_inputs = [params[n] for n in ("count", "mu_k", "mu_v", "sigma_kk", "sigma_vk")]

    def f(h1, h2, count, mu_k, mu_v, sigma_kk, sigma_vk, cache_k, cache_v, *layer_params):
        state = build(count, mu_k, mu_v, sigma_kk, sigma_vk, cache_k, cache_v)
        out1, state = layer(h1, state)
        out2, state = layer(h2, state)  # attends to a bank that the first chunk's evicted tokens updated
        for receipt in layer.last_receipt["streams"]:
            assert receipt["soft_update_applied"] and not receipt["birthed"] and not receipt["merged"]
        bank = state.bank
        return out1, out2, state.cache_k, bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk

    assert torch.autograd.gradcheck(f, (h1, h2, *bank_inputs, cache_k, cache_v, *layer.parameters()))


# ---- against the oracle ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [3, None])
def test_sliding_window_streaming_equals_the_one_pass_oracle(window):
    layer = SlidingWindowSelfAttention(8, 2, window).double()
    randomise(layer, 40)
    x = randn(2, 11, 8, seed=6)
    outs, state = [], None
    for start, stop in [(0, 3), (3, 4), (4, 8), (8, 11)]:
        out, state = layer(x[:, start:stop], state)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 1), window_oracle(layer, x, 2, window), rtol=1e-10, atol=1e-12)
    assert state.pos == 11 and state.cache_k.shape == (2, 11 if window is None else 3, 2, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sliding_window_chunks_equal_one_pass_when_the_window_covers_the_stream(dtype):
    torch.manual_seed(7)
    layer = SlidingWindowSelfAttention(8, 2, 64).to(dtype)
    x = randn(3, 20, 8, seed=8, dtype=dtype)
    whole, _ = layer(x)
    outs, state = [], None
    for start in range(0, 20, 6):
        out, state = layer(x[:, start : start + 6], state)
        outs.append(out)
    streamed = torch.cat(outs, 1)
    relative = ((streamed - whole).abs().max() / whole.abs().max()).item()
    assert relative <= (1e-5 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("merge_threshold", [0.0, None])
def test_moment_closure_equals_the_oracle(merge_threshold):
    """Five chunks, two streams: near field, far field, joint softmax, births, merges and soft updates."""
    n_head, window, max_clusters, birth = 2, 4, 3, 0.0
    layer = MomentClosureSelfAttention(8, n_head, window, max_clusters, birth, merge_threshold).double()
    randomise(layer, 50, scale=0.6)
    sizes = [5, 3, 6, 2, 4]
    chunks = [randn(2, t, 8, seed=60 + i) + (3.0 if i == 2 else 0.0) for i, t in enumerate(sizes)]
    outs, state, soft = [], None, False
    for x in chunks:
        out, state = layer(x, state)
        outs.append(out)
        soft = soft or any(r["soft_update_applied"] for r in layer.last_receipt["streams"])
        assert all(r["accounting"]["conserved"] for r in layer.last_receipt["streams"])
    expected, banks, births = moment_closure_oracle(layer, chunks, n_head, window, max_clusters, birth, merge_threshold)
    for got, want in zip(outs, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
    assert_bank_matches(state.bank, banks, atol=1e-9)
    assert births >= 2 and soft  # the oracle saw both ways into the bank


# ---- state ------------------------------------------------------------------------------------------------------


def test_state_is_bounded():
    b, d, n_head, window, max_clusters = 2, 8, 2, 4, 3
    hd = d // n_head
    mca = MomentClosureSelfAttention(d, n_head, window, max_clusters)
    swa = SlidingWindowSelfAttention(d, n_head, window)
    mca_bytes, swa_bytes = [], []
    s_mca = mca.init_state(b)
    s_swa = swa.init_state(b)
    for i in range(20):
        x = randn(b, 3, d, seed=70 + i, dtype=torch.float32)
        with torch.no_grad():
            _, s_mca = mca(x, s_mca)
            _, s_swa = swa(x, s_swa)
        mca_bytes.append(s_mca.nbytes)
        swa_bytes.append(s_swa.nbytes)
    cache = 2 * b * window * d * 4
    bank = b * n_head * max_clusters * (1 + 3 * hd + hd * hd) * 4
    assert swa_bytes[2:] == [cache] * 18
    assert mca_bytes[2:] == [cache + bank] * 18
    assert s_mca.pos == 60 and s_mca.cache_k.shape[1] == window
    assert s_mca.bank.total_per_head().sub(60 - window).abs().max() < 1e-3


def test_init_state_equals_none_and_detach_cuts_the_graph():
    layer = MomentClosureSelfAttention(8, 2, 4, 2)
    x = randn(2, 6, 8, seed=9, dtype=torch.float32)
    a, sa = layer(x)
    b, sb = layer(x, layer.init_state(2))
    assert torch.equal(a, b) and torch.equal(sa.cache_k, sb.cache_k)
    assert sa.bank.count.dtype == torch.float32 and sa.bank.n_clusters == [1, 1]
    assert sa.cache_k.requires_grad
    cut = layer.detach_state(sa)
    assert not cut.cache_k.requires_grad and not cut.bank.mu_k.requires_grad
    assert torch.equal(cut.cache_k, sa.cache_k)
    assert layer.last_receipt["batch_size"] == 2 and len(layer.last_receipt["streams"]) == 2
    assert SlidingWindowSelfAttention(8, 2, 4)(x)[1].batch_size == 2


# ---- bad inputs -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: SlidingWindowSelfAttention(0, 2, 4), ValueError, "d_model"),
        (lambda: SlidingWindowSelfAttention(8, 3, 4), ValueError, "divisible"),
        (lambda: SlidingWindowSelfAttention(6, 2, 4), ValueError, "even"),
        (lambda: SlidingWindowSelfAttention(8, 2, 0), ValueError, "window"),
        (lambda: SlidingWindowSelfAttention(8.0, 2, 4), TypeError, "d_model"),
        (lambda: SlidingWindowSelfAttention(True, 2, 4), TypeError, "d_model"),
        (lambda: MomentClosureSelfAttention(8, 2, None, 2), TypeError, "window"),
        (lambda: MomentClosureSelfAttention(8, 2, 4, 0), ValueError, "max_clusters"),
        (lambda: MomentClosureSelfAttention(8, 2, 4, 2, birth_threshold=math.inf), ValueError, "birth_threshold"),
        (lambda: MomentClosureSelfAttention(8, 2, 4, 2, merge_threshold=math.nan), ValueError, "merge_threshold"),
        (lambda: MomentClosureSelfAttention(8, 2, 4, 2, birth_threshold="-2"), TypeError, "birth_threshold"),
    ],
)
def test_bad_construction(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_forward_arguments():
    mca = MomentClosureSelfAttention(8, 2, 4, 2)
    swa = SlidingWindowSelfAttention(8, 2, 4)
    h = randn(2, 5, 8, seed=11, dtype=torch.float32)
    _, state = mca(h)
    _, window_state = swa(h)
    with pytest.raises(TypeError, match="h must be a torch.Tensor"):
        mca(h.numpy())
    with pytest.raises(ValueError, match="h"):
        mca(h.long())
    with pytest.raises(ValueError, match="h must have 3 dimensions"):
        mca(h[0])
    with pytest.raises(ValueError, match="d_model 8"):
        mca(h[..., :4])
    with pytest.raises(ValueError, match="h must have the parameters' dtype"):
        mca(h.double(), state)
    with pytest.raises(ValueError, match="batch size"):
        mca(h[:1], state)
    with pytest.raises(ValueError, match="batch size"):
        swa(h[:1], window_state)
    with pytest.raises(TypeError, match="MomentClosureLayerState"):
        mca(h, window_state)
    with pytest.raises(TypeError, match="SlidingWindowLayerState"):
        swa(h, state)
    with pytest.raises(TypeError, match="state.pos"):
        swa(h, SlidingWindowLayerState(window_state.cache_k, window_state.cache_v, 5.0, 2))
    with pytest.raises(ValueError, match="cache"):
        swa(h, SlidingWindowLayerState(window_state.cache_k[:, :2], window_state.cache_v[:, :2], 5, 2))
    with pytest.raises(ValueError, match="cache_k and cache_v"):
        swa(h, SlidingWindowLayerState(window_state.cache_k, None, 5, 2))
    tampered = copy.copy(state)
    tampered.pos = state.pos + 1  # the bank no longer holds exactly the evicted tokens
    with pytest.raises(RuntimeError, match="one-token/one-representation"):
        mca(h, tampered)
    broken = copy.copy(state)
    broken.bank = ClusterBank(*[getattr(state.bank, f) for f in ("count", "mu_k", "mu_v", "sigma_kk")],
                              state.bank.sigma_vk * float("nan"), state.bank.n_clusters, 2)
    with pytest.raises(ValueError, match="sigma_vk must be finite"):
        mca(h, broken)
    with pytest.raises(TypeError, match="ClusterBank"):
        mca(h, MomentClosureLayerState(state.cache_k, state.cache_v, state.pos, 2, (1, 2)))
    with pytest.raises(ValueError, match="batch_size"):
        mca.init_state(0)
    with pytest.raises(TypeError, match="batch_size"):
        swa.init_state(True)


# ---- saving and copying ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("make", LAYERS)
def test_torch_save_deepcopy_and_state_dict_round_trip(make):
    torch.manual_seed(12)
    layer = make().double()
    x1 = randn(2, 6, 8, seed=13)
    x2 = randn(2, 3, 8, seed=14)
    _, state = layer(x1)
    expected, _ = layer(x2, state)

    buffer = io.BytesIO()
    torch.save({"layer": layer, "state": state}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    got, _ = loaded["layer"](x2, loaded["state"])
    assert torch.equal(got, expected)
    assert loaded["layer"].qkv.weight.dtype == torch.float64
    assert isinstance(loaded["state"], type(state))

    twin = copy.deepcopy(layer)
    assert torch.equal(twin(x2, state)[0], expected)
    with torch.no_grad():
        twin.proj.bias.add_(1.0)  # the copy has its own parameters, and computes with them
    torch.testing.assert_close(twin(x2, state)[0], expected + 1.0)
    assert torch.equal(layer(x2, state)[0], expected)
    assert torch.equal(pickle.loads(pickle.dumps(layer))(x2, state)[0], expected)

    fresh = make().double()
    fresh.load_state_dict(layer.state_dict())
    assert torch.equal(fresh(x2, state)[0], expected)
    assert sorted(layer.state_dict()) == ["proj.bias", "proj.weight", "qkv.bias", "qkv.weight"]


def test_exported_names():
    for name in ("SlidingWindowSelfAttention", "MomentClosureSelfAttention", "SlidingWindowLayerState",
                 "MomentClosureLayerState"):
        assert name in at.__all__ and getattr(at, name) is getattr(at.layers, name)
    assert "window=4" in repr(MomentClosureSelfAttention(8, 2, 4, 2))


# ---- the recall example ----------------------------------------------------------------------------------------


def test_recall_example_learns():
    """examples/torch_recall_transformer.py with small settings: a user-defined Transformer around
    MomentClosureSelfAttention learns the far-field recall task well above chance."""
    result = subprocess.run(
        [sys.executable, EXAMPLE, "--small", "--json"],
        capture_output=True,
        text=True,
        timeout=500,
        env=dict(os.environ),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    chance = 1.0 / summary["settings"]["values"]
    assert summary["accuracy"] > chance + 0.15, summary
    assert summary["last_loss"] < summary["first_loss"], summary
