#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch baseline for moment-closure attention (docs/mechanisms.md#moment-closure-far-field, issue 9): the model,
TBPTT training step and streaming evaluation of bench/bench_moment_closure.cpp, written as a competent PyTorch user
would port the reference design (seed 003) to attnmix's semantics, i.e. with the batch axis of docs/porting.md: one
cluster bank per stream.

Tensor path (batched over the streams, the same arithmetic as src/stream/moment_closure.cpp): MGF logits and
outputs (docs/mechanisms.md#moment-closure-far-field), responsibilities, the differentiable Chan/Welford update
(docs/mechanisms.md#moment-closure-far-field) and the joint near/far softmax
(docs/mechanisms.md#moment-closure-far-field). Bookkeeping (per stream, in Python loops over torch tensors, as the
reference does it): birth, merge with rescan, the misfit receipt with its per-cluster outliers
(docs/mechanisms.md#moment-closure-far-field), the count-conservation check of ingestion
(docs/mechanisms.md#moment-closure-far-field) and the one-token/one-representation receipts before and after every layer
(docs/mechanisms.md#moment-closure-far-field), both with the rounding allowance of attnmix decision 0006.

Model: tok = Embedding(vocab, d); per layer ln1, qkv = Linear(d, 3d), proj = Linear(d, d), ln2, fc1 = Linear(d, 4d),
fc2 = Linear(4d, d); ln_f; logits = F.linear(ln_f(h), tok.weight) (tied head); GELU erf form; LayerNorm eps 1e-5.
The modules are constructed in that order, so under the same torch.manual_seed the initial parameters are bitwise
those of attnmix::MomentClosureAttention (SpineBackbone). RoPE (rotate-half, base 10000) at absolute positions on q
and the raw keys cache ++ k; far field with the un-rotated q against the bank as it was at the start of the step.
Training step (docs/mechanisms.md#streaming-language-model, detach_horizon 1): step, float(loss), zero_grad, backward of
loss / 1, AdamW (lr 1e-3, weight decay 0.01), detach (caches and banks: detach_horizon_clusters = True).

Problem (bench_moment_closure.cpp): vocab 256, d_model 32, 2 layers, 2 heads, window 16, max_clusters 4,
birth_threshold -2, default merge rule, batch 8, chunk 64; token (row r, position p) =
lehmer(lehmer((48271 p + 1000003 r + 1) mod M)) mod vocab, lehmer(h) = 48271 h mod M, M = 2^31 - 1 (the stream of
bench_spine.cpp); chunk c is x = stream[:, c T : (c + 1) T], y = the next tokens.

Modes (each prints one JSON object):
  (default)            training tokens/s in steady state (3 warm-up steps: the first births a cluster per stream and
                       layer; chunks cycle through 16 pre-built ones), median over --reps timed blocks of at least
                       --min-time seconds; --mechanism window times the same model without the far field (the
                       sliding-window spine) for the Python-side MCA/window ratio
  --check K            the first K training losses from an empty state (compare with
                       `attnmix_bench_moment_closure --mca_check_losses=K`); --dtype float64 converts the seeded
                       float32 parameters to float64 first (the C++ does the same)
  --stream-tokens N    streaming evaluation (no grad, --batch streams) to N tokens per stream: seconds per token of
                       the first and the last --stream-probe chunks, and the state bytes at both ends

--implementation attnmix runs the same driver (training step, AdamW, data) on attnmix.torch's MomentClosureAttention
(or SlidingWindowSpine), i.e. attnmix's C++ forward and backward called from Python, for the cost of driving it from
Python against the C++ benchmark; --d-model sets the width (default 32; always 2 heads).

Threads and BLAS: single-threaded by default (torch.set_num_threads(--threads); OPENBLAS_NUM_THREADS =
OMP_NUM_THREADS = MKL_NUM_THREADS = 1 unless the caller sets them, before torch is imported); libtorch's matrix
products run on OpenBLAS by default (Debian's libblas.so.3 alternative; `compare.py ... --peer-blas reference` runs
them on the reference BLAS and LAPACK instead); every JSON output has the BLAS it loaded under
"blas" (bench/blas.py).

Usage: /usr/bin/python3 bench/pytorch_moment_closure.py [--batch 8] [--chunk 64] [--reps 5] [--min-time 1.0]
       [--implementation pytorch|attnmix] [--d-model 32]
       /usr/bin/python3 bench/pytorch_moment_closure.py --check 8 [--dtype float64] [--birth-threshold -2]
       /usr/bin/python3 bench/pytorch_moment_closure.py --stream-tokens 100000 --batch 1
"""
import blas

blas.prepare_peer_process()  # before torch is imported: single-threaded unless the caller says otherwise

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from torch_stream_workload import LR, POOL, SEED, VOCAB, WEIGHT_DECAY, Layer, stream_chunk  # noqa: E402

D_MODEL, LAYERS, HEADS, WINDOW, MAX_CLUSTERS = 32, 2, 2, 16, 4
BIRTH_THRESHOLD = -2.0
BATCH, CHUNK = 8, 64

COUNT_FLOOR = 1e-8
VARIANCE_FLOOR = 1e-6


# ---- the cluster bank (docs/mechanisms.md#moment-closure-far-field), one mixture per stream --------------------


class Bank:
    """count (B, H, C), mu_k / mu_v / sigma_kk (B, H, C, d), sigma_vk (B, H, C, d, d), n_clusters: list of B ints."""

    __slots__ = ("count", "mu_k", "mu_v", "sigma_kk", "sigma_vk", "n_clusters", "max_clusters")

    def __init__(self, count, mu_k, mu_v, sigma_kk, sigma_vk, n_clusters, max_clusters):
        self.count, self.mu_k, self.mu_v, self.sigma_kk, self.sigma_vk = count, mu_k, mu_v, sigma_kk, sigma_vk
        self.n_clusters, self.max_clusters = list(n_clusters), max_clusters

    @staticmethod
    def empty(batch, n_head, max_clusters, d, dtype):
        z = lambda *shape: torch.zeros(*shape, dtype=dtype)  # noqa: E731
        vec = (batch, n_head, max_clusters, d)
        return Bank(z(batch, n_head, max_clusters), z(*vec), z(*vec), z(*vec), z(*vec, d), [0] * batch, max_clusters)

    def tensors(self):
        return (self.count, self.mu_k, self.mu_v, self.sigma_kk, self.sigma_vk)

    def replace(self, count, mu_k, mu_v, sigma_kk, sigma_vk, n_clusters=None):
        return Bank(count, mu_k, mu_v, sigma_kk, sigma_vk, self.n_clusters if n_clusters is None else n_clusters,
                    self.max_clusters)

    def detach(self):
        return self.replace(*(t.detach() for t in self.tensors()))

    def total_per_head(self):
        return self.count.sum(2)  # inactive slots are zero

    def bytes(self):
        return sum(t.numel() * t.element_size() for t in self.tensors())


def live_slots(bank, n):
    return torch.arange(n).unsqueeze(0) < torch.tensor(bank.n_clusters).unsqueeze(1)  # (B, n)


def mgf_logits(q, bank, n):
    """logit_c(q) for the first n slots, (B, t, H, n), unmasked (docs/mechanisms.md#moment-closure-far-field)."""
    d = float(q.shape[-1])
    log_count = bank.count[:, :, :n].clamp_min(COUNT_FLOOR).log().unsqueeze(1)
    return (torch.einsum("bthd,bhcd->bthc", q, bank.mu_k[:, :, :n]) / math.sqrt(d)
            + torch.einsum("bthd,bhcd->bthc", q * q, bank.sigma_kk[:, :, :n]) * (0.5 / d) + log_count)


def mgf_cluster_attention(q, bank):
    """q (B, t, H, d) -> out (B, t, n, H, d), logits (B, t, n, H); dead slots get -inf and 0."""
    B, t, H, d = q.shape
    n = max(bank.n_clusters)
    if n == 0:
        return q.new_zeros(B, t, 0, H, d), q.new_zeros(B, t, 0, H)
    dead = live_slots(bank, n).logical_not()
    logits = mgf_logits(q, bank, n).masked_fill(dead.view(B, 1, 1, n), float("-inf"))
    out = (torch.einsum("bhcij,bthj->bthci", bank.sigma_vk[:, :, :n], q) / math.sqrt(d)
           + bank.mu_v[:, :, :n].unsqueeze(1))
    out = out.masked_fill(dead.view(B, 1, 1, n, 1), 0.0)
    return out.transpose(2, 3), logits.transpose(2, 3)


def cluster_responsibilities(k, bank):
    """softmax over each stream's live clusters of logit_c(k), zero beyond them: (B, t, H, C)."""
    B, t, H, _ = k.shape
    n = max(bank.n_clusters)
    if n == 0:
        return k.new_zeros(B, t, H, bank.max_clusters)
    live = live_slots(bank, n)
    hide = live.logical_not().logical_and(live.any(1, keepdim=True)).view(B, 1, 1, n)
    r = torch.softmax(mgf_logits(k, bank, n).masked_fill(hide, float("-inf")), -1) * live.to(k.dtype).view(B, 1, 1, n)
    if n < bank.max_clusters:
        r = F.pad(r, (0, bank.max_clusters - n))
    return r


def update_cluster_bank(bank, k, v, r):
    """Differentiable Chan/Welford combination of the bank with k, v (B, t, H, d) weighted by r
    (docs/mechanisms.md#moment-closure-far-field)."""
    n1 = r.sum(1)
    n1_safe = n1.clamp_min(COUNT_FLOOR).unsqueeze(-1)
    mean_k1 = torch.einsum("bthc,bthd->bhcd", r, k) / n1_safe
    mean_v1 = torch.einsum("bthc,bthd->bhcd", r, v) / n1_safe
    dk = k.unsqueeze(3) - mean_k1.unsqueeze(1)
    dv = v.unsqueeze(3) - mean_v1.unsqueeze(1)
    m2_k1 = torch.einsum("bthc,bthcd->bhcd", r, dk * dk)
    c2_1 = torch.einsum("bthci,bthcj->bhcij", dv * r.unsqueeze(-1), dk)
    n0 = bank.count
    n = n0 + n1
    n_safe = n.clamp_min(COUNT_FLOOR)
    delta_k = mean_k1 - bank.mu_k
    delta_v = mean_v1 - bank.mu_v
    frac = (n1 / n_safe).unsqueeze(-1)
    cross = (n0 * n1 / n_safe).unsqueeze(-1)
    return bank.replace(
        n, bank.mu_k + delta_k * frac, bank.mu_v + delta_v * frac,
        (bank.sigma_kk * n0.unsqueeze(-1) + m2_k1 + delta_k * delta_k * cross) / n_safe.unsqueeze(-1),
        (bank.sigma_vk * n0.unsqueeze(-1).unsqueeze(-1) + c2_1
         + delta_v.unsqueeze(-1) * delta_k.unsqueeze(-2) * cross.unsqueeze(-1)) / n_safe.unsqueeze(-1).unsqueeze(-1))


# ---- birth, merge, misfit (docs/mechanisms.md#moment-closure-far-field): per stream, Python loops (the reference's
# way)


def pooled_combine(a, b):
    """Chan combination of slot statistics a = (count (H), mu_k (H, d), mu_v, sigma_kk, sigma_vk (H, d, d)) and b."""
    na, mka, mva, ska, sva = a
    nb, mkb, mvb, skb, svb = b
    n = na + nb
    nn_ = n.clamp_min(COUNT_FLOOR)
    frac = (nb / nn_).unsqueeze(-1)
    cross = (na * nb / nn_).unsqueeze(-1)
    dk, dv = mkb - mka, mvb - mva
    na1, nb1 = na.unsqueeze(-1), nb.unsqueeze(-1)
    c2 = sva * na1.unsqueeze(-1) + svb * nb1.unsqueeze(-1) + dv.unsqueeze(-1) * dk.unsqueeze(-2) * cross.unsqueeze(-1)
    return (n, mka + dk * frac, mva + dv * frac, (ska * na1 + skb * nb1 + dk * dk * cross) / nn_.unsqueeze(-1),
            c2 / nn_.unsqueeze(-1).unsqueeze(-1))


def cluster_distance(mk, sk, i, j):
    """RMS over heads and dims of dmu^2 / max(pooled variance, 1e-6), square-rooted."""
    delta = mk[:, i] - mk[:, j]
    pooled = 0.5 * (sk[:, i] + sk[:, j])
    distance = torch.sqrt((delta.square() / pooled.clamp_min(VARIANCE_FLOOR)).mean())
    if not bool(torch.isfinite(distance)):
        raise RuntimeError("cluster mean distance is non-finite.")
    return float(distance)


def stream_birth_and_merge(slots, n, max_clusters, kb, vb, birth_threshold, merge_threshold, outlier_top_k):
    """One stream: slots = [count (H, C), mu_k (H, C, d), mu_v, sigma_kk, sigma_vk (H, C, d, d)], kb, vb (t, H, d)
    detached. Returns (slots, n, receipt, changed)."""
    t, H, d = kb.shape
    receipt = {"birthed": False, "birth_incorporated_batch": False, "merged": [], "misfit": {},
               "per_cluster_outlier_tokens": {}}
    count, mu_k, mu_v, sigma_kk, sigma_vk = slots
    changed = False
    # --- birth: every head's best logit of the chunk mean below the threshold, and a free slot
    k_bar, v_bar = kb.mean(0), vb.mean(0)
    if n == 0:
        best = torch.full((H,), float("-inf"), dtype=kb.dtype)
    else:
        logits = ((k_bar.unsqueeze(1) * mu_k[:, :n]).sum(-1) / math.sqrt(d)
                  + (k_bar.square().unsqueeze(1) * sigma_kk[:, :n]).sum(-1) * (0.5 / d)
                  + count[:, :n].clamp_min(COUNT_FLOOR).log())
        best = logits.max(-1).values
    if bool((best < birth_threshold).all()) and n < max_clusters:
        dk, dv = kb - k_bar, vb - v_bar
        count, mu_k, mu_v, sigma_kk, sigma_vk = (x.clone() for x in (count, mu_k, mu_v, sigma_kk, sigma_vk))
        count[:, n] = float(t)
        mu_k[:, n] = k_bar
        mu_v[:, n] = v_bar
        sigma_kk[:, n] = (dk * dk).mean(0).clamp_min(VARIANCE_FLOOR)
        sigma_vk[:, n] = torch.einsum("thi,thj->hij", dv, dk) / float(t)
        n += 1
        changed = True
        receipt["birthed"] = receipt["birth_incorporated_batch"] = True
    # --- merge: scan pairs (i < j); on a merge, rescan from the same i
    i = 0
    while i < n:
        merged_here = False
        for j in range(i + 1, n):
            distance = cluster_distance(mu_k, sigma_kk, i, j)
            n_small = min(float(count[:, i].min()), float(count[:, j].min()))
            threshold = merge_threshold if merge_threshold is not None else 2.65 + 6.0 / math.sqrt(max(n_small, 1.0))
            if distance < threshold:
                pooled = pooled_combine(tuple(x[:, i] for x in (count, mu_k, mu_v, sigma_kk, sigma_vk)),
                                        tuple(x[:, j] for x in (count, mu_k, mu_v, sigma_kk, sigma_vk)))
                new = [x.clone() for x in (count, mu_k, mu_v, sigma_kk, sigma_vk)]
                last = n - 1
                for x, old, p in zip(new, (count, mu_k, mu_v, sigma_kk, sigma_vk), pooled):
                    x[:, i] = p
                    if j != last:
                        x[:, j] = old[:, last]
                    x[:, last] = 0.0
                count, mu_k, mu_v, sigma_kk, sigma_vk = new
                n -= 1
                changed = True
                receipt["merged"].append((i, j))
                receipt.setdefault("merge_distances", []).append(distance)
                merged_here = True
                break
        if not merged_here:
            i += 1
    # --- misfit receipt (no gradient, live clusters only)
    with torch.no_grad():
        if n > 0:
            mk, mv = mu_k[:, :n], mu_v[:, :n]
            sk, sv = sigma_kk[:, :n], sigma_vk[:, :n]
            logits = (torch.einsum("thd,hcd->thc", kb, mk) / math.sqrt(d)
                      + torch.einsum("thd,hcd->thc", kb * kb, sk) * (0.5 / d)
                      + count[:, :n].clamp_min(COUNT_FLOOR).log())
            membership = torch.softmax(logits, -1).mean(1).argmax(-1)  # (t,)
            whitened = (kb.unsqueeze(2) - mk.unsqueeze(0)) / sk.clamp_min(VARIANCE_FLOOR).unsqueeze(0)  # (t, H, n, d)
            predicted = mv.unsqueeze(0) + torch.einsum("hcij,thcj->thci", sv, whitened)
            resid = (vb.unsqueeze(2) - predicted).norm(dim=-1).mean(1)  # (t, n): head-mean residual norm
            misfit, outliers = {}, {}
            for c in range(n):
                members = torch.nonzero(membership == c, as_tuple=False).flatten()
                if members.numel():
                    r_c = resid[:, c][members]
                    misfit[c] = float(r_c.mean())
                    top = members[torch.topk(r_c, k=min(outlier_top_k, int(members.numel()))).indices]
                    outliers[c] = {"k": kb[top], "v": vb[top], "indices": top, "member_indices": members}
                else:
                    misfit[c] = 0.0
            receipt["misfit"], receipt["per_cluster_outlier_tokens"] = misfit, outliers
            weights = torch.tensor([max(misfit[c], 0.0) for c in range(n)], dtype=kb.dtype)
            counts = count[:, :n].mean(0).clamp_min(COUNT_FLOOR)
            receipt["misfit_scalar"] = float((weights * counts).sum() / counts.sum())
        else:
            receipt["misfit_scalar"] = 0.0
    return [count, mu_k, mu_v, sigma_kk, sigma_vk], n, receipt, changed


def birth_and_merge(bank, k, v, *, birth_threshold, merge_threshold=None, outlier_top_k=4):
    if isinstance(outlier_top_k, bool) or not isinstance(outlier_top_k, int) or outlier_top_k < 0:
        raise ValueError("outlier_top_k must be a non-negative exact integer.")
    if k.ndim != 4 or v.shape != k.shape or k.shape[1] <= 0 or k.shape[0] != len(bank.n_clusters):
        raise ValueError("k and v must be non-empty (batch, time, head, dim) tensors matching the bank.")
    heads_dims = bank.mu_k.shape[1:2] + bank.mu_k.shape[3:]
    if k.dtype != bank.mu_k.dtype or v.dtype != bank.mu_k.dtype or k.shape[2:] != heads_dims:
        raise ValueError("k and v must match the cluster bank's dtype and head dimensions.")
    if not bool(torch.isfinite(k).all()) or not bool(torch.isfinite(v).all()):
        raise ValueError("k and v must contain only finite values.")
    B = k.shape[0]
    receipts, per_stream, n_clusters, any_changed = [], [], list(bank.n_clusters), False
    for b in range(B):
        slots = [x[b] for x in bank.tensors()]
        slots, n_clusters[b], receipt, changed = stream_birth_and_merge(
            slots, bank.n_clusters[b], bank.max_clusters, k[b], v[b], birth_threshold, merge_threshold,
            outlier_top_k)
        per_stream.append(slots)
        receipts.append(receipt)
        any_changed = any_changed or changed
    if any_changed:
        bank = bank.replace(*(torch.stack([s[f] for s in per_stream], 0) for f in range(5)), n_clusters=n_clusters)
    return bank, receipts


def ingest_cluster_batch(bank, k, v, *, birth_threshold, merge_threshold=None, outlier_top_k=4):
    """docs/mechanisms.md#moment-closure-far-field: birth/merge on detached k, v, then the soft update for streams with
    clusters whose batch no birth absorbed; every head's total must grow by exactly t."""
    B, t = k.shape[0], k.shape[1]
    before = bank.total_per_head().detach()
    bank, receipts = birth_and_merge(bank, k.detach(), v.detach(), birth_threshold=birth_threshold,
                                     merge_threshold=merge_threshold, outlier_top_k=outlier_top_k)
    soft = [bank.n_clusters[b] > 0 and not receipts[b]["birth_incorporated_batch"] for b in range(B)]
    if any(soft):
        r = cluster_responsibilities(k, bank)
        if not all(soft):
            r = r * torch.tensor([1.0 if s else 0.0 for s in soft], dtype=r.dtype).view(B, 1, 1, 1)
        bank = update_cluster_bank(bank, k, v, r)
    grown = bank.total_per_head().detach() - before
    for b in range(B):
        receipt = receipts[b]
        receipt["soft_update_applied"] = soft[b]
        receipt["ingested_tokens_per_head"] = [float(g) for g in grown[b]]
        receipt["expected_ingested_tokens_per_head"] = t
        after = bank.total_per_head().detach()[b]
        magnitude = float(after.max()) * max(bank.n_clusters[b], 1)
        receipt["count_conserved"] = conserved(grown[b], t, magnitude, grown.dtype)
        if not receipt["count_conserved"]:
            raise RuntimeError("cluster ingestion did not count every observation exactly once: stream "
                               f"{b} grew by {receipt['ingested_tokens_per_head']}, expected {t}.")
    return bank, receipts


def null_receipt(n_head):
    return {"birthed": False, "birth_incorporated_batch": False, "merged": [], "misfit": {},
            "per_cluster_outlier_tokens": {}, "soft_update_applied": False, "ingested_tokens_per_head": [0.0] * n_head,
            "expected_ingested_tokens_per_head": 0, "count_conserved": True}


def conserved(values, expected, magnitude, dtype):
    """allclose(atol 1e-4, rtol 1e-5) plus the rounding of counts of size `magnitude` in dtype (attnmix decision
    0006, docs/decisions/0006-conservation-tolerance.md; without it float32 streams with several clusters fail)."""
    tolerance = 1e-4 + 1e-5 * abs(float(expected)) + 8.0 * torch.finfo(dtype).eps * abs(float(magnitude))
    return bool((values - float(expected)).abs().max() <= tolerance)


def check_far_totals(bank, expected, position, where):
    """Per stream: every head's far total equals `expected` (one-token/one-representation), with the rounding
    allowance of decision 0006 for totals of `position` tokens; returns the totals."""
    totals = bank.total_per_head().detach()
    out = []
    for b in range(totals.shape[0]):
        if not conserved(totals[b], expected, position, totals.dtype):
            raise RuntimeError("moment-closure state violates one-token/one-representation accounting "
                               f"({where}, stream {b}): far={totals[b].tolist()}, expected {expected}.")
        out.append([float(x) for x in totals[b]])
    return out


# ---- the model (docs/mechanisms.md#streaming-language-model and #moment-closure-far-field) ---------------------


def rope_tables(positions, hd, dtype):
    """src/stream/rope.cpp: cos, sin (len, hd) of the half-split angles at absolute positions."""
    exponents = torch.arange(0, hd, 2, dtype=dtype) / float(hd)
    inv_freq = torch.pow(torch.full((), 10000.0, dtype=dtype), -exponents)
    half = positions.to(dtype).unsqueeze(1) * inv_freq.unsqueeze(0)
    angles = torch.cat((half, half), 1)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return x * cos.unsqueeze(-2) + torch.cat((-x2, x1), -1) * sin.unsqueeze(-2)


class State:
    """near: per layer (cache_k, cache_v) raw (b, len, H, hd) or None; banks: one Bank per layer; pos."""

    __slots__ = ("caches", "banks", "pos", "batch_size")

    def __init__(self, caches, banks, pos, batch_size):
        self.caches, self.banks, self.pos, self.batch_size = caches, banks, pos, batch_size

    def detach(self, banks_too=True):
        caches = [None if c is None else (c[0].detach(), c[1].detach()) for c in self.caches]
        banks = [b.detach() for b in self.banks] if banks_too else list(self.banks)
        return State(caches, banks, self.pos, self.batch_size)

    def bytes(self):
        near = sum(t.numel() * t.element_size() for c in self.caches if c is not None for t in c)
        return near + sum(b.bytes() for b in self.banks)


class MomentClosureAttention(nn.Module):
    def __init__(self, vocab=VOCAB, d_model=D_MODEL, n_layer=LAYERS, n_head=HEADS, window=WINDOW,
                 max_clusters=MAX_CLUSTERS, birth_threshold=BIRTH_THRESHOLD, merge_threshold=None, far_field=True):
        super().__init__()
        if d_model % n_head or (d_model // n_head) % 2:
            raise ValueError("d_model must be divisible by n_head and head_dim even.")
        self.tok = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(Layer(d_model) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        self.vocab, self.d, self.n_head, self.hd, self.window = vocab, d_model, n_head, d_model // n_head, window
        self.max_clusters, self.birth_threshold, self.merge_threshold = max_clusters, birth_threshold, merge_threshold
        self.far_field = far_field  # False: the plain sliding-window spine over the same parameters
        self.last_receipts, self.last_misfit = [], 0.0

    def detach(self, state):
        return state.detach()

    def init_state(self, batch_size):
        dtype = self.tok.weight.dtype
        return State([None] * len(self.layers),
                     [Bank.empty(batch_size, self.n_head, self.max_clusters, self.hd, dtype) for _ in self.layers],
                     0, batch_size)

    def forward(self, state, x, y):
        b, t = x.shape
        if b != state.batch_size:
            raise ValueError("chunk batch size does not match the initialized state.")
        if len(state.banks) != len(self.layers) or any(len(bank.n_clusters) != b for bank in state.banks):
            raise ValueError("state must hold one cluster bank per layer with the chunk's batch size.")
        pos = state.pos
        cache_len = 0 if state.caches[0] is None else state.caches[0][0].shape[1]
        dtype = self.tok.weight.dtype
        if self.far_field:
            for bank in state.banks:  # representation receipt (pre)
                check_far_totals(bank, pos - cache_len, pos, "before the step")
        query_pos = torch.arange(pos, pos + t)
        key_pos = torch.arange(pos - cache_len, pos + t)
        cos_q, sin_q = rope_tables(query_pos, self.hd, dtype)
        cos_k, sin_k = rope_tables(key_pos, self.hd, dtype) if cache_len > 0 else (cos_q, sin_q)
        delta = query_pos.unsqueeze(1) - key_pos.unsqueeze(0)
        visible = (delta >= 0) & (delta < self.window)
        mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(visible.logical_not(), float("-inf"))
        scale = 1.0 / math.sqrt(self.hd)
        length = cache_len + t
        keep = min(self.window, length)
        evicted = length - keep
        h = self.tok(x)
        caches, banks, receipts = [], [], []
        for layer_index, (layer, cache, bank) in enumerate(zip(self.layers, state.caches, state.banks)):
            q, k, v = layer.qkv(layer.ln1(h)).view(b, t, 3, self.n_head, self.hd).unbind(2)
            if cache is not None:
                k = torch.cat((cache[0], k), 1)
                v = torch.cat((cache[1], v), 1)
            q_rot = apply_rope(q, cos_q, sin_q).transpose(1, 2)  # (b, H, t, hd)
            k_rot = apply_rope(k, cos_k, sin_k).transpose(1, 2)  # (b, H, L, hd)
            scores = torch.matmul(q_rot, k_rot.transpose(-2, -1)) * scale + mask
            values = v.transpose(1, 2)
            if self.far_field and max(bank.n_clusters) > 0:
                far_out, far_logits = mgf_cluster_attention(q, bank)  # un-rotated q, the bank at the step's start
                n = far_logits.shape[2]
                weights = torch.softmax(torch.cat((scores, far_logits.permute(0, 3, 1, 2)), -1), -1)
                near = torch.matmul(weights[..., :length], values)
                far = torch.einsum("bhtc,bhtcd->bhtd", weights[..., length:length + n], far_out.permute(0, 3, 1, 2, 4))
                out = (near + far).transpose(1, 2).reshape(b, t, self.d)
            else:
                out = torch.matmul(torch.softmax(scores, -1), values).transpose(1, 2).reshape(b, t, self.d)
            h = h + layer.proj(out)
            h = h + layer.fc2(F.gelu(layer.fc1(layer.ln2(h))))
            caches.append((k[:, length - keep:], v[:, length - keep:]))
            if not self.far_field:
                banks.append(bank)
                continue
            if evicted > 0:
                bank, streams = ingest_cluster_batch(bank, k[:, :evicted], v[:, :evicted],
                                                     birth_threshold=self.birth_threshold,
                                                     merge_threshold=self.merge_threshold)
            else:
                streams = [null_receipt(self.n_head) for _ in range(b)]
            totals = check_far_totals(bank, pos + t - keep, pos + t, f"layer {layer_index} after the step")
            for s, receipt in enumerate(streams):  # accounting (post)
                receipt["accounting"] = {"positions_seen": pos + t, "near_tokens": keep, "evicted_tokens": evicted,
                                         "far_tokens_per_head": totals[s],
                                         "expected_far_tokens_per_head": pos + t - keep, "overlap_tokens": 0,
                                         "conserved": True}
            banks.append(bank)
            receipts.append({"batch_size": b, "streams": streams,
                             "misfit_scalar": sum(r.get("misfit_scalar", 0.0) for r in streams) / b})
        logits = F.linear(self.ln_f(h), self.tok.weight)
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), y.reshape(-1))
        self.last_receipts = receipts
        self.last_misfit = sum(r["misfit_scalar"] for r in receipts) / len(receipts) if receipts else 0.0
        return State(caches, banks, pos + t, b), loss


# ---- drivers ---------------------------------------------------------------------------------------------------


class AttnmixMechanism:
    """attnmix.torch's module (the C++ implementation driven from Python) behind this script's model interface."""

    def __init__(self, args, far_field):
        import attnmix.torch as at

        if far_field:
            self.module = at.MomentClosureAttention(VOCAB, d_model=args.d_model, n_layer=LAYERS, n_head=HEADS,
                                                    window=WINDOW, max_clusters=MAX_CLUSTERS,
                                                    birth_threshold=args.birth_threshold,
                                                    merge_threshold=args.merge_threshold)
        else:
            self.module = at.SlidingWindowSpine(VOCAB, d_model=args.d_model, n_layer=LAYERS, n_head=HEADS,
                                                window=WINDOW)
        self.far_field = far_field

    def double(self):
        self.module.double()
        return self

    def parameters(self):
        return self.module.parameters()

    def init_state(self, batch_size):
        return self.module.init_state(batch_size)

    def __call__(self, state, x, y):
        return self.module.step(state, (x, y))

    def detach(self, state):
        return self.module.detach(state)

    @property
    def last_receipts(self):
        return self.module.last_receipts if self.far_field else []

    @property
    def last_misfit(self):
        return self.module.last_misfit if self.far_field else 0.0


def make(args, far_field=True):
    torch.manual_seed(SEED)
    if args.implementation == "attnmix":
        model = AttnmixMechanism(args, far_field)
    else:
        model = MomentClosureAttention(d_model=args.d_model, birth_threshold=args.birth_threshold,
                                       merge_threshold=args.merge_threshold, far_field=far_field)
    if args.dtype == "float64":
        model = model.double()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    return model, opt


def train_step(model, opt, state, x, y):
    """One TBPTT update at detach_horizon 1 (docs/mechanisms.md#streaming-language-model); returns (state, float
    loss)."""
    state, loss = model(state, x, y)
    value = float(loss)
    opt.zero_grad()
    (loss / 1).backward()
    opt.step()
    return model.detach(state), value


def events(model):
    """(births, merges) of the last step over layers and streams."""
    births = sum(r["birthed"] for layer in model.last_receipts for r in layer["streams"])
    merges = sum(len(r["merged"]) for layer in model.last_receipts for r in layer["streams"])
    return births, merges


def bench(args):
    model, opt = make(args, far_field=args.mechanism == "mca")
    pool = [stream_chunk(args.batch, args.chunk, c) for c in range(POOL)]
    state = model.init_state(args.batch)
    step = 0
    for _ in range(3):  # the first chunk births a cluster per stream and layer
        state, _ = train_step(model, opt, state, *pool[step % POOL])
        step += 1
    rates, cpu_rates, births, merges, steps = [], [], 0, 0, 0
    for _ in range(args.reps):
        n, start, cpu_start = 0, time.perf_counter(), time.process_time()
        while True:
            state, _ = train_step(model, opt, state, *pool[step % POOL])
            eb, em = events(model)
            births, merges = births + eb, merges + em
            step += 1
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= args.min_time:
                break
        steps += n
        rates.append(n * args.batch * args.chunk / elapsed)
        cpu_rates.append(n * args.batch * args.chunk / (time.process_time() - cpu_start))
    clusters = [list(bank.n_clusters) for bank in state.banks]
    return {"mode": "train", "implementation": args.implementation, "mechanism": args.mechanism,
            "d_model": args.d_model, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "batch": args.batch, "chunk": args.chunk, "window": WINDOW,
            "tokens_per_s": statistics.median(rates),
            "seconds_per_step": args.batch * args.chunk / statistics.median(rates),
            "rates": rates, "tokens_per_cpu_s": statistics.median(cpu_rates), "timed_steps": steps,
            "births_per_step": births / steps, "merges_per_step": merges / steps, "n_clusters": clusters}


def bank_sums(state):
    """Per layer, the sums of count, mu_k, mu_v, sigma_kk and sigma_vk (a far-field fingerprint for the check)."""
    return [[float(t.detach().double().sum()) for t in (bank.count, bank.mu_k, bank.mu_v, bank.sigma_kk, bank.sigma_vk)]
            for bank in state.banks]


def check(args):
    model, opt = make(args)
    param_sum = sum(p.detach().double().sum().item() for p in model.parameters())
    state = model.init_state(args.batch)
    losses, births, merges = [], [], []
    for c in range(args.check):
        state, value = train_step(model, opt, state, *stream_chunk(args.batch, args.chunk, c))
        losses.append(value)
        eb, em = events(model)
        births.append(eb)
        merges.append(em)
    return {"mode": "check", "implementation": args.implementation, "dtype": args.dtype, "batch": args.batch, "chunk": args.chunk,
            "birth_threshold": args.birth_threshold, "merge_threshold": args.merge_threshold, "param_sum": param_sum,
            "losses": losses, "births": births, "merges": merges,
            "n_clusters": [list(bank.n_clusters) for bank in state.banks], "bank_sums": bank_sums(state),
            "misfit": model.last_misfit}


def stream(args):
    """Streaming evaluation without autograd to --stream-tokens tokens per stream."""
    torch.manual_seed(SEED)
    model = MomentClosureAttention(birth_threshold=args.birth_threshold, merge_threshold=args.merge_threshold).eval()
    n_chunks = -(-args.stream_tokens // args.chunk)
    probe = min(args.stream_probe, n_chunks // 2)
    state = model.init_state(args.batch)
    times = []
    with torch.no_grad():
        for c in range(n_chunks):
            start = time.perf_counter()
            state, _ = model(state, *stream_chunk(args.batch, args.chunk, c))
            times.append(time.perf_counter() - start)
            if c == probe:
                first_bytes = state.bytes()
    per_token = args.batch * args.chunk
    # skip the first chunk (no bank yet): chunks 1 .. probe, and the last `probe` chunks
    early = statistics.median(times[1:probe + 1]) / per_token
    late = statistics.median(times[-probe:]) / per_token
    return {"mode": "stream", "implementation": "pytorch", "batch": args.batch, "chunk": args.chunk,
            "tokens_per_stream": n_chunks * args.chunk, "probe_chunks": probe, "early_s_per_token": early,
            "late_s_per_token": late, "late_over_early": late / early, "state_bytes_early": first_bytes,
            "state_bytes_late": state.bytes(), "n_clusters": [list(bank.n_clusters) for bank in state.banks]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--chunk", type=int, default=CHUNK)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per timed block")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--mechanism", choices=["mca", "window"], default="mca")
    parser.add_argument("--implementation", choices=["pytorch", "attnmix"], default="pytorch",
                        help="this file's PyTorch implementation, or attnmix.torch's module (C++) driven from here")
    parser.add_argument("--d-model", type=int, default=D_MODEL)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--birth-threshold", type=float, default=BIRTH_THRESHOLD)
    parser.add_argument("--merge-threshold", type=float, default=None)
    parser.add_argument("--check", type=int, default=0, metavar="K", help="print the first K training losses")
    parser.add_argument("--stream-tokens", type=int, default=0, metavar="N", help="streaming evaluation, N tokens")
    parser.add_argument("--stream-probe", type=int, default=64, help="chunks timed at each end of the stream")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.check:
        result = check(args)
    elif args.stream_tokens:
        result = stream(args)
    else:
        result = bench(args)
    result["blas"] = blas.loaded_blas()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
