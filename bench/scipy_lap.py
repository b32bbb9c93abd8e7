#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Time scipy.optimize.linear_sum_assignment on the matrices of bench/bench_assign.cpp, the seed-004 style
frequency estimate (K = 128 on 16 x 15) and, with --seed-script, the seed-004 experiment end to end.

  /usr/bin/python3 bench/scipy_lap.py [--min-time 0.3] [--seed-script PATH]

Prints JSON: {"lap": {"16x15": {"seconds": median per call, "cost": optimal cost}, ...},
"frequency_estimate_K128_s": ..., "seed_script_s": wall seconds or null, "blas": the BLAS numpy loaded}.

Single-threaded (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS = 1 unless the caller sets them, before
numpy is imported) on OpenBLAS by default (Debian's libblas.so.3 alternative; `compare.py assign --peer-blas
reference` runs it on the reference BLAS and LAPACK instead; bench/blas.py); the seed script runs in this process's
environment. linear_sum_assignment itself calls no BLAS.
"""
import os

import blas

blas.prepare_peer_process()  # before numpy is imported: single-threaded unless the caller says otherwise

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from scipy.optimize import linear_sum_assignment  # noqa: E402

SHAPES = [(16, 15), (16, 16), (64, 64), (256, 256), (1024, 1024)]
GAMMA = np.uint64(0x9E3779B97F4A7C15)


def uniform_cost(nq, nk):
    """Entry e (row-major) = SplitMix64(seed + (e + 1)·γ) >> 11 times 2^-53, seed = nq·4096 + nk (bench_assign.cpp)."""
    with np.errstate(over="ignore"):
        z = np.uint64(nq * 4096 + nk) + np.arange(1, nq * nk + 1, dtype=np.uint64) * GAMMA
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53).reshape(nq, nk)


def time_call(fn, min_time, rounds=5):
    """Median over `rounds` of the mean time per call of a loop that runs for about min_time / rounds."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    n = max(1, int(min_time / rounds / one))
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - t0) / n)
    return statistics.median(per)


def frequency_estimate(cost, tau, K, rng):
    """Seed 004's frequency_estimate, verbatim in behaviour."""
    counts = np.zeros_like(cost, dtype=float)
    for _ in range(K):
        noisy = cost + tau * rng.gumbel(size=cost.shape)
        rows, cols = linear_sum_assignment(noisy)
        for i, j in zip(rows.tolist(), cols.tolist()):
            counts[i, j] += 1.0
    return counts / K


def run_seed_script(path):
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run(["/usr/bin/python3", os.path.abspath(path)], cwd=tmp, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of timing per figure")
    parser.add_argument("--seed-script", help="also run this seed-004 script end to end (wall time)")
    args = parser.parse_args()
    out = {"lap": {}}
    for nq, nk in SHAPES:
        cost = uniform_cost(nq, nk)
        rows, cols = linear_sum_assignment(cost)
        out["lap"][f"{nq}x{nk}"] = {
            "seconds": time_call(lambda c=cost: linear_sum_assignment(c), args.min_time),
            "cost": float(cost[rows, cols].sum()),
        }
    cost = uniform_cost(16, 15)
    rng = np.random.default_rng(1)
    out["frequency_estimate_K128_s"] = time_call(lambda: frequency_estimate(cost, 1.7, 128, rng), args.min_time)
    out["seed_script_s"] = run_seed_script(args.seed_script) if args.seed_script else None
    out["blas"] = blas.loaded_blas()
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
