#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch baseline for one responsibility-attention EM iteration, the problem of bench/bench_em_iteration.cpp and
bench/numpy_ra_em.py (same distributions, same generator as numpy_ra_em.py): n = 200000 rows, N = 16, D = 32,
S = T = 256, sigma2 = 1 (fixed).

Written as a competent PyTorch user would, on one thread (torch.set_num_threads(1); OpenBLAS single-threaded by
default, bench/blas.py), in float64 and in float32 (every tensor and every sum in that dtype, as a float32 user
runs it). Per chunk of --chunk rows: gather K[c] (chunk, N, D), distances by the expansion |y|^2 - 2 y.K[c] +
|K[c]|^2 with y.K[s] for every symbol by one GEMM (Y K^T) and the N needed ones gathered, log-softmax with
logsumexp, then the responsibilities summed per symbol into a dense (chunk, S) matrix A (scatter_add_) so that
key_sum is a second GEMM (A^T Y), and emission_count by index_add_; then the closed-form M-step. Under
torch.inference_mode (no autograd). (This formulation was the fastest of those tried: gathering K[c] with einsum,
index_add_ or scatter_add_ of the (chunk·N, D) products, and a sparse one-hot product were 2-6x slower.)

Each dtype's statistics are checked against numpy_ra_em.py's chunked iteration on the same data (float64 within
1e-9, float32 within 1e-3 relative of the total); the output JSON has each dtype's median seconds per iteration
under "variants" and the BLAS loaded under "blas".

Usage: /usr/bin/python3 bench/pytorch_ra_em.py [--rows 200000] [--reps 5] [--chunk 1024] [--dtype both|float64|float32]
"""
import blas

blas.prepare_peer_process()  # before torch and numpy are imported: single-threaded unless the caller says otherwise

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import numpy_ra_em as reference  # noqa: E402

N, D, S, T = reference.N, reference.D, reference.S, reference.T


class TorchIteration:
    def __init__(self, data, dtype, chunk):
        C, Y, t = data
        self.dtype, self.chunk = dtype, chunk
        self.C = torch.from_numpy(C)
        self.Y = torch.from_numpy(Y).to(dtype)
        self.y_sq = (self.Y * self.Y).sum(dim=1)
        self.emission_index = self.C * T + torch.from_numpy(t)[:, None]  # flat index of emission_count[c_i, t]

    def iteration(self, model):
        K, B, pi = (torch.from_numpy(np.asarray(a)).to(self.dtype) for a in model)
        C, Y, y_sq = self.C, self.Y, self.y_sq
        n = C.shape[0]
        inv_two_sigma2 = 1.0 / (2.0 * reference.SIGMA2)
        gate_const = -0.5 * D * math.log(2.0 * math.pi * reference.SIGMA2)
        log_pi, log_B = torch.log(pi), torch.log(B).reshape(-1)
        k_sq = (K * K).sum(dim=1)
        key_sum = torch.zeros(S, D, dtype=self.dtype)
        key_mass = torch.zeros(S, dtype=self.dtype)
        emission = torch.zeros(S * T, dtype=self.dtype)
        position = torch.zeros(N, dtype=self.dtype)
        query_sq = torch.zeros((), dtype=self.dtype)
        log_p = torch.empty(n, dtype=self.dtype)
        for begin in range(0, n, self.chunk):
            end = min(begin + self.chunk, n)
            Cb, Yb, index = C[begin:end], Y[begin:end], self.emission_index[begin:end]
            yk = torch.gather(Yb @ K.T, 1, Cb)  # y.K[s] for every symbol by one GEMM, then the N needed
            dist = y_sq[begin:end, None] - 2.0 * yk + k_sq[Cb]
            L = log_pi - dist * inv_two_sigma2 + log_B[index]
            lse = torch.logsumexp(L, dim=1, keepdim=True)
            R = torch.exp(L - lse)
            log_p[begin:end] = lse[:, 0] + gate_const
            # A[n, s] = sum of r_ni over the positions holding symbol s: key_sum by a second GEMM.
            A = torch.zeros(end - begin, S, dtype=self.dtype).scatter_add_(1, Cb, R)
            key_sum += A.T @ Yb
            key_mass += A.sum(dim=0)
            emission.index_add_(0, index.reshape(-1), R.reshape(-1))
            position += R.sum(dim=0)
            query_sq += R.sum(dim=1) @ y_sq[begin:end]
        stats = (key_sum, key_mass, emission.reshape(S, T), position, query_sq)
        return self.m_step(*stats[:4]), stats, log_p

    @staticmethod
    def m_step(key_sum, key_mass, emission, position):
        K = key_sum / torch.clamp(key_mass, min=reference.KEY_MASS_FLOOR)[:, None]
        B = emission + reference.EMISSION_SMOOTHING
        B = B / B.sum(dim=1, keepdim=True)
        return K, B, position / position.sum()


def check_against_numpy(result, expected, dtype):
    """The statistics and log-likelihood of one iteration against numpy_ra_em.py's chunked iteration."""
    (_, stats, log_p), (_, ref_stats, ref_log_p) = result, expected
    rtol = 1e-9 if dtype == torch.float64 else 1e-3
    for name, got, want in zip(("key_sum", "key_mass", "emission", "position"), stats[:4], ref_stats[:4]):
        error = float(np.max(np.abs(got.double().numpy() - want)))
        if error > rtol * float(np.max(np.abs(want))):
            raise SystemExit(f"pytorch_ra_em: {dtype} {name} differs from numpy by {error}")
    total, ref_total = float(log_p.double().sum()), float(ref_log_p.sum())
    if abs(total - ref_total) > rtol * abs(ref_total):
        raise SystemExit(f"pytorch_ra_em: {dtype} log-likelihood {total} differs from numpy's {ref_total}")


def time_dtype(data, model, dtype, chunk, reps, expected):
    impl = TorchIteration(data, dtype, chunk)
    check_against_numpy(impl.iteration(model), expected, dtype)  # also the warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        impl.iteration(model)
        times.append(time.perf_counter() - t0)
    return {"times_s": times, "median_s": statistics.median(times), "min_s": min(times)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--dtype", choices=["both", "float64", "float32"], default="both")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, data = reference.make_problem(args.rows)
    expected = reference.Chunked(data).iteration(model)
    dtypes = {"both": ["float64", "float32"], "float64": ["float64"], "float32": ["float32"]}[args.dtype]
    variants = {}
    with torch.inference_mode():
        for name in dtypes:
            variants[name] = time_dtype(data, model, getattr(torch, name), args.chunk, args.reps, expected)
    print(json.dumps({
        "benchmark": "pytorch_ra_em", "rows": args.rows, "N": N, "D": D, "S": S, "T": T, "chunk": args.chunk,
        "variants": variants, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "blas": blas.loaded_blas(),
    }, indent=1))


if __name__ == "__main__":
    main()
