# SPDX-License-Identifier: Apache-2.0
"""attnmix.torch.functional (ctest labels python;torch): the cluster-bank operations, attention_law and RoPE on torch
tensors. Gradients are checked by torch.autograd.gradcheck (float64, central differences: an independent oracle);
values against direct torch computations of the formulas written here (the logits, outputs and weighted moments),
the reference design's one-stream layout against the same formulas pooled over the batch, and every bad argument
raises TypeError or ValueError naming it."""
import subprocess
import sys

import pytest
import torch

import attnmix.torch as at
from attnmix.torch import ClusterBank

GRADCHECK = dict(eps=1e-6, atol=1e-4)  # float64 central differences
ORACLE_RTOL = 1e-12  # the same formulas in a different summation order (float64)
MOMENT_RTOL = 1e-10  # the Chan combination vs the direct weighted moments (a different algebraic route)


# ---- helpers ------------------------------------------------------------------------------------------------


def random_bank(gen, n_clusters, H, C, d, dtype=torch.float64):
    """Random statistics in each stream's live slots, zeros elsewhere (streams layout)."""
    B = len(n_clusters)
    count = torch.zeros(B, H, C, dtype=dtype)
    mu_k = torch.zeros(B, H, C, d, dtype=dtype)
    mu_v = torch.zeros(B, H, C, d, dtype=dtype)
    sigma_kk = torch.zeros(B, H, C, d, dtype=dtype)
    sigma_vk = torch.zeros(B, H, C, d, d, dtype=dtype)
    for b, n in enumerate(n_clusters):
        count[b, :, :n] = 2.0 + 8.0 * torch.rand(H, n, generator=gen, dtype=dtype)
        mu_k[b, :, :n] = torch.randn(H, n, d, generator=gen, dtype=dtype)
        mu_v[b, :, :n] = torch.randn(H, n, d, generator=gen, dtype=dtype)
        sigma_kk[b, :, :n] = 0.1 + 0.9 * torch.rand(H, n, d, generator=gen, dtype=dtype)
        sigma_vk[b, :, :n] = 0.3 * torch.randn(H, n, d, d, generator=gen, dtype=dtype)
    return ClusterBank(count, mu_k, mu_v, sigma_kk, sigma_vk, list(n_clusters), C)


def one_stream(bank):
    """Stream 0 of a bank in the reference's one-stream layout."""
    return ClusterBank(
        bank.count[0], bank.mu_k[0], bank.mu_v[0], bank.sigma_kk[0], bank.sigma_vk[0], bank.n_clusters[0],
        bank.max_clusters,
    )


def oracle_logits_outputs(q, count, mu_k, mu_v, sigma_kk, sigma_vk):
    """logit_c(q) and out_c(q) for one stream's live slots: q (t, H, d), stats (H, n, ...) → (t, H, n), (t, H, n, d)."""
    d = q.shape[-1]
    logits = (
        torch.einsum("thd,hcd->thc", q, mu_k) / d**0.5
        + torch.einsum("thd,hcd->thc", q * q, sigma_kk) / (2 * d)
        + torch.log(count.clamp_min(1e-8))[None]
    )
    out = torch.einsum("hcij,thj->thci", sigma_vk, q) / d**0.5 + mu_v[None]
    return logits, out


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(20240611)


def leaf(t):
    return t.detach().clone().requires_grad_(True)


# ---- values against the formulas ---------------------------------------------------------------------------


def test_mgf_cluster_attention_matches_the_formulas_per_stream(gen):
    bank = random_bank(gen, [2, 3], H=2, C=3, d=4)
    q = torch.randn(2, 5, 2, 4, generator=gen, dtype=torch.float64)
    out, logits = at.mgf_cluster_attention(q, bank)
    assert out.shape == (2, 5, 3, 2, 4) and logits.shape == (2, 5, 3, 2)
    for b, n in enumerate(bank.n_clusters):
        want_logits, want_out = oracle_logits_outputs(
            q[b], bank.count[b, :, :n], bank.mu_k[b, :, :n], bank.mu_v[b, :, :n], bank.sigma_kk[b, :, :n],
            bank.sigma_vk[b, :, :n],
        )
        torch.testing.assert_close(logits[b, :, :n], want_logits.transpose(1, 2), rtol=ORACLE_RTOL, atol=0)
        torch.testing.assert_close(out[b, :, :n], want_out.transpose(1, 2), rtol=ORACLE_RTOL, atol=1e-15)
        assert torch.all(logits[b, :, n:] == float("-inf")) and torch.all(out[b, :, n:] == 0)


def test_cluster_responsibilities_are_the_softmax_over_live_clusters(gen):
    bank = random_bank(gen, [2, 0], H=2, C=3, d=4)
    k = torch.randn(2, 4, 2, 4, generator=gen, dtype=torch.float64)
    r = at.cluster_responsibilities(k, bank)
    assert r.shape == (2, 4, 2, 3)
    want, _ = oracle_logits_outputs(k[0], bank.count[0, :, :2], bank.mu_k[0, :, :2], bank.mu_v[0, :, :2],
                                    bank.sigma_kk[0, :, :2], bank.sigma_vk[0, :, :2])
    torch.testing.assert_close(r[0, :, :, :2], want.softmax(-1), rtol=ORACLE_RTOL, atol=1e-15)
    assert torch.all(r[0, :, :, 2:] == 0) and torch.all(r[1] == 0)  # dead slots; a stream without clusters


def test_update_cluster_bank_equals_the_direct_weighted_moments(gen):
    bank = random_bank(gen, [3], H=2, C=3, d=4)
    k = torch.randn(1, 6, 2, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 6, 2, 4, generator=gen, dtype=torch.float64)
    r = torch.rand(1, 6, 2, 3, generator=gen, dtype=torch.float64).softmax(-1)
    new = at.update_cluster_bank(bank, k, v, r)
    # Oracle: the old cluster as n0 pseudo-tokens at its mean plus its scatter, pooled with the weighted tokens.
    n0, n1 = bank.count[0], r[0].sum(0)  # (H, C)
    total = n0 + n1
    sum_k = bank.mu_k[0] * n0[..., None] + torch.einsum("thc,thd->hcd", r[0], k[0])
    sum_v = bank.mu_v[0] * n0[..., None] + torch.einsum("thc,thd->hcd", r[0], v[0])
    mean_k, mean_v = sum_k / total[..., None], sum_v / total[..., None]
    m2 = (bank.sigma_kk[0] + (bank.mu_k[0] - mean_k) ** 2) * n0[..., None] + torch.einsum(
        "thc,thcd->hcd", r[0], (k[0][:, :, None] - mean_k[None]) ** 2)
    dv = v[0][:, :, None] - mean_v[None]
    dk = k[0][:, :, None] - mean_k[None]
    cross = (bank.sigma_vk[0] + (bank.mu_v[0] - mean_v)[..., :, None] * (bank.mu_k[0] - mean_k)[..., None, :]) * n0[
        ..., None, None] + torch.einsum("thc,thci,thcj->hcij", r[0], dv, dk)
    torch.testing.assert_close(new.count[0], total, rtol=MOMENT_RTOL, atol=0)
    torch.testing.assert_close(new.mu_k[0], mean_k, rtol=MOMENT_RTOL, atol=1e-14)
    torch.testing.assert_close(new.mu_v[0], mean_v, rtol=MOMENT_RTOL, atol=1e-14)
    torch.testing.assert_close(new.sigma_kk[0], m2 / total[..., None], rtol=MOMENT_RTOL, atol=1e-14)
    torch.testing.assert_close(new.sigma_vk[0], cross / total[..., None, None], rtol=MOMENT_RTOL, atol=1e-14)


def test_birth_and_merge_cases_and_receipt_keys():
    # Birth into an empty bank, then a second birth far away (chunks around +5 and -5, sigma 0.1).
    gen = torch.Generator().manual_seed(1)
    bank = at.empty_cluster_bank(1, 1, 4, 3, dtype=torch.float64)
    k = 5 + 0.1 * torch.randn(1, 8, 1, 3, generator=gen, dtype=torch.float64)
    bank, receipts = at.birth_and_merge(bank, k, k.clone(), birth_threshold=-2.0)
    assert bank.n_clusters == [1] and receipts[0]["birthed"] and receipts[0]["birth_incorporated_batch"]
    k2 = -5 + 0.1 * torch.randn(1, 8, 1, 3, generator=gen, dtype=torch.float64)
    bank, receipts = at.birth_and_merge(bank, k2, k2.clone(), birth_threshold=-2.0)
    assert bank.n_clusters == [2] and receipts[0]["birthed"]
    assert set(receipts[0]) == {"birthed", "birth_incorporated_batch", "merged", "misfit",
                                "per_cluster_outlier_tokens", "misfit_scalar"}
    outliers = receipts[0]["per_cluster_outlier_tokens"]
    assert all(isinstance(o["k"], torch.Tensor) and o["k"].shape[1:] == (1, 3) for o in outliers.values())
    # A forced merge pools the two clusters and compacts the bank.
    bank, receipts = at.birth_and_merge(bank, k2, k2.clone(), birth_threshold=-1e6, merge_threshold=1e6)
    assert bank.n_clusters == [1] and receipts[0]["merged"] == [(0, 1)] and "merge_distances" in receipts[0]
    assert torch.all(bank.count[0, :, 1:] == 0)


def test_ingest_cluster_batch_counts_every_token_once(gen):
    bank = at.empty_cluster_bank(1, 2, 4, 4, dtype=torch.float64)
    k = torch.randn(1, 3, 2, 4, generator=gen, dtype=torch.float64)
    bank, receipts = at.ingest_cluster_batch(bank, k, k.clone(), birth_threshold=-2.0)
    r = receipts[0]
    assert r["birth_incorporated_batch"] and not r["soft_update_applied"] and r["count_conserved"]
    assert r["ingested_tokens_per_head"] == [3.0, 3.0] and r["expected_ingested_tokens_per_head"] == 3
    bank, receipts = at.ingest_cluster_batch(bank, k, k.clone(), birth_threshold=-1e6, merge_threshold=1e-9)
    assert receipts[0]["soft_update_applied"]
    torch.testing.assert_close(bank.total_per_head(), torch.full((1, 2), 6.0, dtype=torch.float64))


def test_the_budget_rule_births_every_chunk_and_makes_room_by_the_closest_pair(gen):
    """cluster_rule="budget": chunks the threshold rule absorbs still birth; a full bank first merges its closest pair
    (the two chunks near +5), whose pooled moments are the moments of their tokens together; the numpy binding of
    attnmix.experimental agrees; a gradient reaches both merged clusters (gradcheck)."""
    from attnmix import experimental as ex

    chunks = [shift + 0.5 * torch.randn(1, 8, 1, 3, generator=gen, dtype=torch.float64) for shift in (5, 5.5, -5, 0)]
    bank = at.empty_cluster_bank(1, 1, 3, 3, dtype=torch.float64)
    _, receipts = at.ingest_cluster_batch(
        at.ingest_cluster_batch(bank, chunks[0], chunks[0], birth_threshold=-2.0)[0], chunks[1], chunks[1],
        birth_threshold=-2.0,
    )
    assert not receipts[0]["birthed"]  # the threshold rule absorbs the second chunk
    for c in chunks[:3]:
        bank, receipts = at.ingest_cluster_batch(bank, c, c * 2, birth_threshold=-2.0, cluster_rule="budget")
        assert receipts[0]["birthed"] and receipts[0]["merged"] == []
    full, receipts = at.ingest_cluster_batch(bank, chunks[3], chunks[3] * 2, birth_threshold=-2.0,
                                             cluster_rule="budget")
    assert receipts[0]["birthed"] and receipts[0]["merged"] == [(0, 1)] and full.n_clusters == [3]
    union = torch.cat(chunks[:2], 1)[0, :, 0]  # (16, 3)
    torch.testing.assert_close(full.mu_k[0, 0, 0], union.mean(0), rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(full.sigma_kk[0, 0, 0], union.var(0, unbiased=False), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(full.mu_k[0, 0, 2], chunks[3][0, :, 0].mean(0), rtol=1e-13, atol=1e-13)
    theirs, their_receipts = ex.birth_and_merge(
        ex.ClusterBank(*(x.numpy() for x in (bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk)),
                       bank.n_clusters),
        chunks[3].numpy(), (chunks[3] * 2).numpy(), birth_threshold=-2.0, cluster_rule="budget",
    )
    assert their_receipts[0]["merged"] == [(0, 1)]
    torch.testing.assert_close(torch.from_numpy(theirs.mu_k), full.mu_k, rtol=0, atol=0)
    with pytest.raises(ValueError, match="cluster_rule"):
        at.birth_and_merge(bank, chunks[3], chunks[3], birth_threshold=-2.0, cluster_rule="budgets")
    with pytest.raises(TypeError, match="cluster_rule"):
        at.birth_and_merge(bank, chunks[3], chunks[3], birth_threshold=-2.0, cluster_rule=None)

    small = random_bank(gen, [2], H=1, C=2, d=2)
    k = torch.randn(1, 3, 1, 2, generator=gen, dtype=torch.float64)

    def make_room(*stats):
        b, r = at.birth_and_merge(rebuilt(small, stats), k, k, birth_threshold=-2.0, cluster_rule="budget")
        assert r[0]["merged"] == [(0, 1)] and r[0]["birthed"]
        return b.count, b.mu_k, b.mu_v, b.sigma_kk, b.sigma_vk

    assert torch.autograd.gradcheck(make_room, bank_leaves(small), **GRADCHECK)


def random_layer_and_law(gen, d):
    """A Gaussian law (mean, cov) over a layer input of size d and random qkv (W, bias) and proj (P, p) weights."""
    mean = torch.randn(d, generator=gen, dtype=torch.float64)
    a = torch.randn(d, d, generator=gen, dtype=torch.float64)
    cov = a @ a.T + 0.1 * torch.eye(d, dtype=torch.float64)
    W = torch.randn(3 * d, d, generator=gen, dtype=torch.float64)
    bias = torch.randn(3 * d, generator=gen, dtype=torch.float64)
    P = torch.randn(d, d, generator=gen, dtype=torch.float64)
    p = torch.randn(d, generator=gen, dtype=torch.float64)
    return mean, cov, W, bias, P, p


def test_attention_law_is_the_exact_linear_push(gen):
    d, H = 4, 2
    mean, cov, W, bias, P, p = random_layer_and_law(gen, d)
    law, jacobian = at.attention_law((mean, cov), W, bias, P, p, H)
    mu, sigma = W @ mean + bias, W @ cov @ W.T
    hd = d // H
    A = torch.zeros(d, d, dtype=torch.float64)
    for h in range(H):
        k = slice(d + h * hd, d + (h + 1) * hd)
        v = slice(2 * d + h * hd, 2 * d + (h + 1) * hd)
        A[h * hd:(h + 1) * hd, h * hd:(h + 1) * hd] = sigma[v, k] / hd**0.5
    m = mu[2 * d:] + A @ mu[:d]
    C = A @ sigma[:d, :d] @ A.T
    torch.testing.assert_close(law.mean, P @ m + p, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(law.cov, P @ C @ P.T, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(jacobian, P @ A @ W[:d], rtol=1e-12, atol=1e-12)


def test_one_cluster_output_equals_the_attention_law_mean(gen):
    # A population h ~ N(mean, cov) pushed through qkv gives per head one Gaussian (k, v) cluster; the MGF output at
    # the mean query, pushed through proj, is the mean of attention_law's output law.
    d, H = 4, 2
    hd = d // H
    mean, cov, W, bias, P, p = random_layer_and_law(gen, d)
    law, _ = at.attention_law((mean, cov), W, bias, P, p, H)
    mu, sigma = W @ mean + bias, W @ cov @ W.T
    heads = [(slice(h * hd, (h + 1) * hd), slice(d + h * hd, d + (h + 1) * hd), slice(2 * d + h * hd,
                                                                                      2 * d + (h + 1) * hd))
             for h in range(H)]
    bank = ClusterBank(
        torch.ones(1, H, 1, dtype=torch.float64),
        torch.stack([mu[k] for _, k, _ in heads]).view(1, H, 1, hd),
        torch.stack([mu[v] for _, _, v in heads]).view(1, H, 1, hd),
        torch.stack([sigma[k, k].diagonal() for _, k, _ in heads]).view(1, H, 1, hd),
        torch.stack([sigma[v, k] for _, k, v in heads]).view(1, H, 1, hd, hd),
        [1], 1)
    q = torch.stack([mu[qs] for qs, _, _ in heads]).view(1, 1, H, hd)
    out, _ = at.mgf_cluster_attention(q, bank)
    torch.testing.assert_close(P @ out[0, 0, 0].reshape(d) + p, law.mean, rtol=1e-6, atol=1e-8)


def test_rope_test_vector_and_rotate_half():
    cos, sin = at.rope_tables(torch.tensor([1, 2]), 4, torch.float64)
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64).expand(2, 1, 4)
    y = at.apply_rope(x, cos, sin)
    torch.testing.assert_close(y[0, 0], torch.tensor([-1.9841, 1.9599, 2.4624, 4.0198], dtype=torch.float64),
                               atol=1e-4, rtol=0)
    torch.testing.assert_close(y[1, 0], torch.tensor([-3.1440, 1.9196, -0.3391, 4.0392], dtype=torch.float64),
                               atol=1e-4, rtol=0)
    assert at.rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == [-3.0, -4.0, 1.0, 2.0]
    assert at.rope_tables(torch.tensor([0, 1]), 4)[0].dtype == torch.float32


# ---- gradients ----------------------------------------------------------------------------------------------


def bank_leaves(bank):
    return [leaf(t) for t in (bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk)]


def rebuilt(bank, tensors):
    return ClusterBank(*tensors, bank.n_clusters, bank.max_clusters)


def assert_gradients_reach(outputs_fn, inputs):
    """gradcheck, then every input gets a finite gradient that is not identically zero."""
    assert torch.autograd.gradcheck(outputs_fn, inputs, **GRADCHECK)
    outs = outputs_fn(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    total = sum((o[torch.isfinite(o)] * (1 + torch.arange(o[torch.isfinite(o)].numel()))).sum() for o in outs)
    grads = torch.autograd.grad(total, inputs, allow_unused=True)
    for i, g in enumerate(grads):
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, f"input {i}"


def test_gradcheck_mgf_cluster_attention(gen):
    bank = random_bank(gen, [2], H=2, C=2, d=3)
    q = leaf(torch.randn(1, 2, 2, 3, generator=gen, dtype=torch.float64))
    assert_gradients_reach(lambda q, *s: at.mgf_cluster_attention(q, rebuilt(bank, s)), [q, *bank_leaves(bank)])


def test_gradcheck_cluster_responsibilities(gen):
    bank = random_bank(gen, [2], H=1, C=2, d=3)
    k = leaf(torch.randn(1, 3, 1, 3, generator=gen, dtype=torch.float64))
    tensors = bank_leaves(bank)
    # sigma_vk and mu_v do not enter the logits: check the others.
    fn = lambda k, count, mu_k, sigma_kk: at.cluster_responsibilities(  # noqa: E731
        k, ClusterBank(count, mu_k, bank.mu_v, sigma_kk, bank.sigma_vk, bank.n_clusters, bank.max_clusters))
    assert_gradients_reach(fn, [k, tensors[0], tensors[1], tensors[3]])


def test_gradcheck_update_cluster_bank(gen):
    bank = random_bank(gen, [2], H=1, C=2, d=2)
    k = leaf(torch.randn(1, 3, 1, 2, generator=gen, dtype=torch.float64))
    v = leaf(torch.randn(1, 3, 1, 2, generator=gen, dtype=torch.float64))
    r = leaf(torch.rand(1, 3, 1, 2, generator=gen, dtype=torch.float64).softmax(-1))

    def fn(k, v, r, *stats):
        b = at.update_cluster_bank(rebuilt(bank, stats), k, v, r)
        return b.count, b.mu_k, b.mu_v, b.sigma_kk, b.sigma_vk

    assert_gradients_reach(fn, [k, v, r, *bank_leaves(bank)])


def test_gradcheck_ingestion_through_the_soft_update_and_a_merge(gen):
    bank = random_bank(gen, [2], H=1, C=2, d=2)  # every slot live: gradcheck perturbs every entry
    k = leaf(torch.randn(1, 3, 1, 2, generator=gen, dtype=torch.float64))
    v = leaf(torch.randn(1, 3, 1, 2, generator=gen, dtype=torch.float64))

    def soft(k, v, *stats):
        b, receipts = at.ingest_cluster_batch(rebuilt(bank, stats), k, v, birth_threshold=-1e6,
                                              merge_threshold=1e-9)
        assert receipts[0]["soft_update_applied"]
        return b.mu_k, b.mu_v, b.sigma_kk, b.sigma_vk

    inputs = [k, v, *bank_leaves(bank)]
    assert torch.autograd.gradcheck(soft, inputs, **GRADCHECK)

    def merged(*stats):
        b, receipts = at.birth_and_merge(rebuilt(bank, stats), k.detach(), v.detach(), birth_threshold=-1e6,
                                         merge_threshold=1e6)
        assert receipts[0]["merged"] == [(0, 1)]
        return b.count, b.mu_k, b.mu_v, b.sigma_kk, b.sigma_vk

    assert torch.autograd.gradcheck(merged, bank_leaves(bank), **GRADCHECK)


def test_gradcheck_attention_law_and_rope(gen):
    d = 4
    args = [leaf(torch.randn(*s, generator=gen, dtype=torch.float64)) for s in
            [(d,), (d, d), (3 * d, d), (3 * d,), (d, d), (d,)]]
    fn = lambda m, c, *w: tuple(  # noqa: E731
        [at.attention_law((m, c @ c.T), *w, 2)[0].mean, at.attention_law((m, c @ c.T), *w, 2)[1]])
    assert torch.autograd.gradcheck(fn, args, **GRADCHECK)
    cos, sin = at.rope_tables(torch.arange(3), 4, torch.float64)
    x = leaf(torch.randn(2, 3, 1, 4, generator=gen, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda x: at.apply_rope(x, cos, sin), [x], **GRADCHECK)


# ---- the reference design's one-stream layout ---------------------------------------------------------------


def test_one_stream_banks_pool_the_batch_like_the_reference(gen):
    streams = random_bank(gen, [2], H=2, C=3, d=4)
    bank = one_stream(streams)
    assert bank.one_stream and bank.count.shape == (2, 3)
    q = torch.randn(3, 5, 2, 4, generator=gen, dtype=torch.float64)  # a batch of 3 shares the bank
    out, logits = at.mgf_cluster_attention(q, bank)
    assert out.shape == (3, 5, 2, 2, 4) and logits.shape == (3, 5, 2, 2)
    for b in range(3):
        want_logits, want_out = oracle_logits_outputs(q[b], bank.count[:, :2], bank.mu_k[:, :2], bank.mu_v[:, :2],
                                                      bank.sigma_kk[:, :2], bank.sigma_vk[:, :2])
        torch.testing.assert_close(logits[b], want_logits.transpose(1, 2), rtol=ORACLE_RTOL, atol=0)
        torch.testing.assert_close(out[b], want_out.transpose(1, 2), rtol=ORACLE_RTOL, atol=1e-15)
    r = at.cluster_responsibilities(q, bank)
    assert r.shape == (3, 5, 2, 3)
    # The update pools every row of the batch into the one mixture, as the reference does.
    v = torch.randn_like(q)
    pooled = at.update_cluster_bank(bank, q, v, r)
    flat = at.update_cluster_bank(streams, q.reshape(1, 15, 2, 4), v.reshape(1, 15, 2, 4), r.reshape(1, 15, 2, 3))
    assert pooled.one_stream and isinstance(pooled.n_clusters, int)
    torch.testing.assert_close(pooled.sigma_vk, flat.sigma_vk[0], rtol=0, atol=0)
    new, receipt = at.ingest_cluster_batch(bank, q, v, birth_threshold=-2.0)
    assert isinstance(receipt, dict) and receipt["expected_ingested_tokens_per_head"] == 15
    empty = at.empty_cluster_bank(None, 2, 4, 8)
    assert empty.count.shape == (2, 4) and empty.n_clusters == 0 and empty.count.dtype == torch.float32
    assert at.E2_UNAVAILABLE_PIECES == {}


def test_float32_banks_work_and_detach_cuts_the_graph(gen):
    bank = at.empty_cluster_bank(2, 2, 3, 4)
    k = torch.randn(2, 3, 2, 4, generator=gen, requires_grad=True)
    bank, _ = at.ingest_cluster_batch(bank, k, k * 2, birth_threshold=-2.0)
    bank, _ = at.ingest_cluster_batch(bank, k, k * 2, birth_threshold=-1e6, merge_threshold=1e-9)
    assert bank.mu_k.dtype == torch.float32 and bank.mu_k.requires_grad
    detached = bank.detach()
    assert not any(t.requires_grad for t in (detached.count, detached.mu_k, detached.mu_v, detached.sigma_kk,
                                              detached.sigma_vk))


# ---- bad arguments -------------------------------------------------------------------------------------------


def test_bad_arguments_raise_naming_them(gen):
    bank = random_bank(gen, [1], H=2, C=3, d=4)
    q = torch.randn(1, 2, 2, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        at.mgf_cluster_attention(q.numpy(), bank)
    with pytest.raises(ValueError, match="q must have the bank's dtype"):
        at.mgf_cluster_attention(q.float(), bank)
    with pytest.raises(ValueError, match="q must be on the CPU"):
        at.mgf_cluster_attention(torch.empty(1, 2, 2, 4, device="meta"), bank)
    with pytest.raises(ValueError, match="q must be float32 or float64"):
        at.mgf_cluster_attention(q.long(), bank)
    with pytest.raises(ValueError, match=r"q must be \(batch 1"):
        at.mgf_cluster_attention(torch.randn(2, 2, 2, 4, dtype=torch.float64), bank)
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        at.mgf_cluster_attention(q[0], bank)
    with pytest.raises(TypeError, match="bank must be an attnmix.torch.ClusterBank"):
        at.mgf_cluster_attention(q, (bank.count,))
    bad = ClusterBank(bank.count, bank.mu_k[..., :3], bank.mu_v, bank.sigma_kk, bank.sigma_vk, [1], 3)
    with pytest.raises(ValueError, match="mu_v must have shape"):
        at.mgf_cluster_attention(q, bad)
    negative = ClusterBank(-bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk, [1], 3)
    with pytest.raises(ValueError, match="count must be >= 0"):
        at.cluster_responsibilities(q, negative)
    with pytest.raises(TypeError, match="n_clusters must be a list"):
        at.mgf_cluster_attention(q, ClusterBank(bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk, 1, 3))
    with pytest.raises(TypeError, match="n_clusters must be an int"):
        at.mgf_cluster_attention(q, ClusterBank(*bank_leaves(one_stream(bank))[:5], [1], 3))
    with pytest.raises(ValueError, match="responsibilities must have the bank's dtype"):
        at.update_cluster_bank(bank, q, q, torch.zeros(1, 2, 2, 3))
    with pytest.raises(ValueError, match="outlier_top_k"):
        at.birth_and_merge(bank, q, q, birth_threshold=-2.0, outlier_top_k=True)
    with pytest.raises(ValueError, match="finite"):
        at.ingest_cluster_batch(bank, q * float("nan"), q, birth_threshold=-2.0)
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        at.empty_cluster_bank(1, 1, 1, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="batch_size must be a positive"):
        at.empty_cluster_bank(0, 1, 1, 2)
    with pytest.raises(ValueError, match="multiple|divisible|n_head"):
        at.attention_law((torch.zeros(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64)),
                         torch.zeros(9, 3, dtype=torch.float64), torch.zeros(9, dtype=torch.float64),
                         torch.zeros(3, 3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64), 2)


def test_import_attnmix_alone_never_imports_torch():
    code = "import sys, attnmix; assert 'torch' not in sys.modules; import attnmix.torch; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_quantize_kv_cache_round_trips_within_half_a_step():
    torch.manual_seed(3)
    x = torch.randn(2, 5, 2, 8, dtype=torch.float64) * 2.0
    q = at.quantize_kv_cache(x)
    assert q.codes.dtype == torch.int8 and q.codes.shape == x.shape and q.low.shape == (2, 5, 2)
    # the codes from the formula, computed here in float64 from the stored float32 low and scale
    low, scale = q.low.double().unsqueeze(-1), q.scale.double().unsqueeze(-1)
    expected = torch.round((x - low) / scale).clamp(0, 255) - 128
    assert torch.equal(q.codes.double(), expected)
    x_hat = at.dequantize_kv_cache(q, torch.float64)
    assert x_hat.dtype == torch.float64
    assert bool(((x_hat - x).abs() <= scale / 2 + 1e-6).all())
    assert torch.equal(at.dequantize_kv_cache(at.quantize_kv_cache(torch.full((3, 4), 1.5))), torch.full((3, 4), 1.5))
    with pytest.raises(ValueError, match="non-finite"):
        at.quantize_kv_cache(torch.tensor([[1.0, float("inf")]]))
    with pytest.raises(ValueError, match="float32 or float64"):
        at.quantize_kv_cache(torch.ones(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="low and scale"):
        at.dequantize_kv_cache(at.QuantizedKv(q.codes, q.low[:1], q.scale))
