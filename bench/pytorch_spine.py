#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch baseline for the streaming language-model spine (docs/mechanisms.md#streaming-language-model, issue 8): the
model and TBPTT training step of bench/bench_spine.cpp, written for the benchmark as a competent PyTorch user would
(nn.Module, one fused qkv projection viewed as (b, t, 3, H, h_d), the inverse RoPE frequencies as a buffer,
torch.set_num_threads(1)).

Model: tok = Embedding(vocab, d); per layer ln1, qkv = Linear(d, 3d), proj = Linear(d, d), ln2, fc1 = Linear(d, 4d),
fc2 = Linear(4d, d); ln_f; logits = F.linear(ln_f(h), tok.weight) (tied head); GELU erf form; LayerNorm eps 1e-5.
Modules are constructed in that order, so under the same torch.manual_seed the initial parameters are bitwise the
C++ ones (torch::nn and torch.nn draw the same default initialisations in the same order).
Step (docs/mechanisms.md#streaming-language-model): RoPE (rotate-half, base 10000) at absolute positions, applied once
to q and to the raw keys cache ++ k; sliding-window mask 0 <= P_i - P_j < window; softmax attention; the new cache keeps
the last min(window, len) raw keys and values. Training step (docs/mechanisms.md#streaming-language-model,
detach_horizon 1): step, float(loss), zero_grad, backward of loss / 1, AdamW step (lr 1e-3, weight decay 0.01), detach.
Per step, like the C++ spine, the RoPE cos/sin tables and the mask are built from the positions (the C++ spine caches
neither).

Problem (bench_spine.cpp): vocab 256, 2 layers, 2 heads, window 64, batch 8, chunk 64; token (row r, position p) =
lehmer(lehmer((48271 p + 1000003 r + 1) mod M)) mod vocab, lehmer(h) = 48271 h mod M, M = 2^31 - 1.

Threads and BLAS: single-threaded by default (torch.set_num_threads(--threads); OPENBLAS_NUM_THREADS =
OMP_NUM_THREADS = MKL_NUM_THREADS = 1 unless the caller sets them, before torch is imported); libtorch's matrix
products run on OpenBLAS by default (Debian's libblas.so.3 alternative; `compare.py ... --peer-blas reference` runs
them on the reference BLAS and LAPACK instead); every JSON output but --serve's has the BLAS it loaded under
"blas" (bench/blas.py).

Modes (output: JSON):
  (default)          tokens/s of the training step at --d-model in steady state (the cache already holds a full
                     window; 3 warm-up steps; chunks cycle through 16 pre-built ones), median over --reps timed
                     blocks of at least --min-time seconds each
  --check K          the first K training losses from an empty state (compare with
                     `attnmix_bench_spine --spine_check_losses=K`)
  --rss-tokens N     streaming evaluation under torch.no_grad over at least N tokens; ru_maxrss (KiB)
  --serve            lock-step server for `compare.py spine`: prints "ready" after the warm-up, then runs n training
                     steps per line n read from stdin and prints their wall and CPU time (JSON)

Usage: /usr/bin/python3 bench/pytorch_spine.py [--d-model 32] [--reps 5] [--min-time 1.0] [--foreach]
       /usr/bin/python3 bench/pytorch_spine.py --check 8 [--d-model 32]
       /usr/bin/python3 bench/pytorch_spine.py --rss-tokens 1000000
"""
import blas

blas.prepare_peer_process()  # before torch is imported: single-threaded unless the caller says otherwise

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from torch_stream_workload import LR, POOL, SEED, VOCAB, WEIGHT_DECAY, Layer, stream_chunk  # noqa: E402

LAYERS, HEADS, WINDOW, BATCH, CHUNK = 2, 2, 64, 8, 64


def spine_chunk(c):
    return stream_chunk(BATCH, CHUNK, c)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Spine(nn.Module):
    """Sliding-window spine; state = (list of (cache_k, cache_v) per layer or None, pos)."""

    def __init__(self, vocab, d_model, n_layer, n_head, window):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(Layer(d_model) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model, eps=1e-5)
        self.d, self.n_head, self.hd, self.window = d_model, n_head, d_model // n_head, window
        self.scale = 1.0 / math.sqrt(self.hd)
        # The same float32 arithmetic as rope_tables (src/stream/rope.cpp), computed once.
        exponents = torch.arange(0, self.hd, 2, dtype=torch.float32) / float(self.hd)
        self.register_buffer("inv_freq", torch.pow(torch.full((), 10000.0), -exponents), persistent=False)

    def init_state(self):
        return [None] * len(self.layers), 0

    def rope(self, positions):
        half = positions.to(torch.float32).unsqueeze(1) * self.inv_freq.unsqueeze(0)
        angles = torch.cat((half, half), dim=1)
        return angles.cos().unsqueeze(-2), angles.sin().unsqueeze(-2)  # (len, 1, hd)

    def forward(self, state, x, y):
        caches, pos = state
        b, t = x.shape
        cache_len = 0 if caches[0] is None else caches[0][0].shape[1]
        key_pos = torch.arange(pos - cache_len, pos + t)
        cos_k, sin_k = self.rope(key_pos)
        cos_q, sin_q = cos_k[cache_len:], sin_k[cache_len:]
        delta = key_pos[cache_len:].unsqueeze(1) - key_pos.unsqueeze(0)  # (t, L)
        hidden = (delta < 0) | (delta >= self.window)
        keep = min(self.window, cache_len + t)
        h = self.tok(x)
        new_caches = []
        for layer, cache in zip(self.layers, caches):
            q, k, v = layer.qkv(layer.ln1(h)).view(b, t, 3, self.n_head, self.hd).unbind(2)
            if cache is not None:
                k = torch.cat((cache[0], k), dim=1)
                v = torch.cat((cache[1], v), dim=1)
            q_rot = (q * cos_q + rotate_half(q) * sin_q).transpose(1, 2)  # (b, H, t, hd)
            k_rot = (k * cos_k + rotate_half(k) * sin_k).transpose(1, 2)  # (b, H, L, hd)
            scores = torch.matmul(q_rot, k_rot.transpose(-2, -1)) * self.scale
            weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
            out = torch.matmul(weights, v.transpose(1, 2)).transpose(1, 2).reshape(b, t, self.d)
            h = h + layer.proj(out)
            h = h + layer.fc2(F.gelu(layer.fc1(layer.ln2(h))))
            new_caches.append((k[:, -keep:], v[:, -keep:]))
        logits = F.linear(self.ln_f(h), self.tok.weight)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        return (new_caches, pos + t), loss


def detach(state):
    caches, pos = state
    return [(k.detach(), v.detach()) for k, v in caches], pos


def make(d_model, foreach):
    torch.manual_seed(SEED)
    model = Spine(VOCAB, d_model, LAYERS, HEADS, WINDOW)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=foreach)
    return model, opt


def train_step(model, opt, state, x, y):
    """One TBPTT update at detach_horizon 1 (docs/mechanisms.md#streaming-language-model); returns (state, float
    loss)."""
    state, loss = model(state, x, y)
    value = float(loss)
    opt.zero_grad()
    (loss / 1).backward()
    opt.step()
    return detach(state), value


def bench(args):
    model, opt = make(args.d_model, args.foreach)
    pool = [spine_chunk(c) for c in range(POOL)]
    state = model.init_state()
    step = 0
    for _ in range(3):  # the first chunk fills the window
        state, _ = train_step(model, opt, state, *pool[step % POOL])
        step += 1
    rates, cpu_rates = [], []
    for _ in range(args.reps):
        n, start, cpu_start = 0, time.perf_counter(), time.process_time()
        while True:
            state, _ = train_step(model, opt, state, *pool[step % POOL])
            step += 1
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= args.min_time:
                break
        rates.append(n * BATCH * CHUNK / elapsed)
        cpu_rates.append(n * BATCH * CHUNK / (time.process_time() - cpu_start))
    return {"mode": "train", "implementation": "pytorch", "torch": torch.__version__, "d_model": args.d_model,
            "threads": torch.get_num_threads(), "foreach": args.foreach, "tokens_per_s": statistics.median(rates),
            "seconds_per_step": BATCH * CHUNK / statistics.median(rates), "rates": rates,
            "tokens_per_cpu_s": statistics.median(cpu_rates)}


def serve(args):
    """Lock-step server for compare.py spine: "ready" after the warm-up, then n steps per line n of stdin."""
    model, opt = make(args.d_model, args.foreach)
    pool = [spine_chunk(c) for c in range(POOL)]
    state = model.init_state()
    step = 0
    for _ in range(3):
        state, _ = train_step(model, opt, state, *pool[step % POOL])
        step += 1
    print("ready", flush=True)
    for line in sys.stdin:
        try:
            n = int(line)
        except ValueError:
            break
        if n < 1:
            break
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(n):
            state, _ = train_step(model, opt, state, *pool[step % POOL])
            step += 1
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        print(json.dumps({"steps": n, "wall_s": wall, "cpu_s": cpu, "tokens_per_s": n * BATCH * CHUNK / wall}),
              flush=True)


def check(args):
    model, opt = make(args.d_model, args.foreach)
    param_sum = sum(p.detach().double().sum().item() for p in model.parameters())
    state = model.init_state()
    losses = []
    for c in range(args.check):
        state, value = train_step(model, opt, state, *spine_chunk(c))
        losses.append(value)
    return {"mode": "check", "implementation": "pytorch", "d_model": args.d_model, "param_sum": param_sum,
            "losses": losses}


def rss(args):
    torch.manual_seed(SEED)
    model = Spine(VOCAB, args.d_model, LAYERS, HEADS, WINDOW).eval()
    per_chunk = BATCH * CHUNK
    n_chunks = -(-args.rss_tokens // per_chunk)
    state = model.init_state()
    total = 0.0
    start = time.perf_counter()
    with torch.no_grad():
        for c in range(n_chunks):
            state, loss = model(state, *spine_chunk(c))
            total += float(loss)
    seconds = time.perf_counter() - start
    return {"mode": "rss", "implementation": "pytorch", "d_model": args.d_model, "tokens": n_chunks * per_chunk,
            "chunks": n_chunks, "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "mean_loss": total / n_chunks, "seconds": seconds, "tokens_per_s": n_chunks * per_chunk / seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per timed block")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--foreach", action="store_true", help="AdamW(foreach=True), the multi-tensor update")
    parser.add_argument("--check", type=int, default=0, metavar="K", help="print the first K training losses")
    parser.add_argument("--rss-tokens", type=int, default=0, metavar="N", help="streaming evaluation over N tokens")
    parser.add_argument("--serve", action="store_true", help="lock-step server for compare.py spine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.serve:
        serve(args)
        return
    if args.check:
        result = check(args)
    elif args.rss_tokens:
        result = rss(args)
    else:
        result = bench(args)
    result["blas"] = blas.loaded_blas()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
