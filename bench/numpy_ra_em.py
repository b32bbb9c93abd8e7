#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""NumPy baseline for one responsibility-attention EM iteration (docs/mechanisms.md#responsibility-attention), the
problem of bench/bench_em_iteration.cpp: n = 200000 rows, N = 16, D = 32, S = 256, T = 256, sigma2 = 1 (fixed).

One iteration = E-step over all rows with unit weights (log-joint, log-softmax, scatter-add of
key_sum, key_mass, emission_count, position_count, query_sq) + closed-form M-step. Two vectorised
implementations, both single-threaded (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS = 1
unless the caller sets them, before numpy is imported) on OpenBLAS by default (Debian's libblas.so.3
alternative; `compare.py run --peer-blas reference` runs them on the reference BLAS and LAPACK instead;
the BLAS loaded is in the output under "blas", bench/blas.py):

  chunked    self-contained per iteration, rows in chunks of 2048: gather K[c] (chunk, N, D),
             y.K[c] with einsum and the expansion |y|^2 - 2 y.K[c] + |K[c]|^2, log-softmax, and
             bincount scatters (key_sum as one bincount per query dimension).
  presorted  additionally precomputes, once per data set (not timed), a symbol-sorted layout of
             the (row, position) pairs and a copy of the queries in that order (n*N*D doubles,
             819 MB here); each iteration then does one matrix-vector product per symbol for
             y.K[s] and another for key_sum. Faster, but needs that extra memory.

Both give the same statistics (checked on every run). Prints one JSON object; `median_s` is the
median over the repetitions of the faster variant, `variants` has every variant's times.

Usage: /usr/bin/python3 bench/numpy_ra_em.py [--rows 200000] [--reps 5] [--variant both|chunked|presorted]
"""
import os

import blas

blas.prepare_peer_process()  # before numpy is imported: single-threaded unless the caller says otherwise

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

N, D, S, T = 16, 32, 256, 256
SIGMA2 = 1.0
EMISSION_SMOOTHING = 1e-6
KEY_MASS_FLOOR = 1e-12
CHUNK = 2048


def make_problem(n, seed=20240611):
    """Same distributions as bench_em_iteration.cpp (other random streams)."""
    rng = np.random.default_rng(seed)
    K = rng.standard_normal((S, D))
    B = 0.05 + 0.95 * rng.random((S, T))
    B /= B.sum(axis=1, keepdims=True)
    pi = 0.5 + 0.5 * rng.random(N)
    pi /= pi.sum()
    C = rng.integers(0, S, size=(n, N))
    z = rng.integers(0, N, size=n)
    Y = K[C[np.arange(n), z]] + np.sqrt(SIGMA2) * rng.standard_normal((n, D))
    t = rng.integers(0, T, size=n)
    return (K, B, pi), (C, Y, t)


def m_step(key_sum, key_mass, emission, position):
    K = key_sum / np.maximum(key_mass, KEY_MASS_FLOOR)[:, None]
    B = emission + EMISSION_SMOOTHING
    B /= B.sum(axis=1, keepdims=True)
    total = position.sum()
    pi = position / total if total > 0 else np.full(N, 1.0 / N)
    return K, B, pi


class Chunked:
    name = "chunked"

    def __init__(self, data):
        C, Y, t = data
        self.C, self.Y, self.t = C, Y, t
        self.YT = np.ascontiguousarray(Y.T)  # contiguous columns for the key_sum bincounts
        self.y_sq = np.einsum("nd,nd->n", Y, Y)
        self.emission_index = C * T + t[:, None]  # flat index of emission_count[c_i, t]

    def iteration(self, model):
        K, B, pi = model
        C, Y, YT, y_sq = self.C, self.Y, self.YT, self.y_sq
        n = C.shape[0]
        inv_two_sigma2 = 1.0 / (2.0 * SIGMA2)
        gate_const = -0.5 * D * np.log(2.0 * np.pi * SIGMA2)
        with np.errstate(divide="ignore"):
            log_pi = np.log(pi)
            log_B = np.log(B)
        k_sq = np.einsum("sd,sd->s", K, K)
        key_sum = np.zeros((S, D))
        key_mass = np.zeros(S)
        emission = np.zeros(S * T)
        position = np.zeros(N)
        query_sq = 0.0
        log_p = np.empty(n)
        buf = np.empty((CHUNK, N))
        for begin in range(0, n, CHUNK):
            end = min(begin + CHUNK, n)
            Cb = C[begin:end]
            Kc = K[Cb]  # (b, N, D)
            yk = np.einsum("nid,nd->ni", Kc, Y[begin:end])
            dist = y_sq[begin:end, None] - 2.0 * yk + k_sq[Cb]
            L = log_pi - dist * inv_two_sigma2 + log_B.ravel()[self.emission_index[begin:end]]
            m = L.max(axis=1, keepdims=True)
            E = np.exp(L - m)
            tot = E.sum(axis=1)
            R = E / tot[:, None]
            log_p[begin:end] = m[:, 0] + np.log(tot) + gate_const
            Cf = Cb.ravel()
            Rf = R.ravel()
            key_mass += np.bincount(Cf, Rf, S)
            emission += np.bincount(self.emission_index[begin:end].ravel(), Rf, S * T)
            position += R.sum(axis=0)
            query_sq += float(R.sum(axis=1) @ y_sq[begin:end])
            out = buf[: end - begin]
            for d in range(D):
                np.multiply(R, YT[d, begin:end, None], out=out)
                key_sum[:, d] += np.bincount(Cf, out.ravel(), S)
        stats = (key_sum, key_mass, emission.reshape(S, T), position, query_sq)
        return m_step(*stats[:4]), stats, log_p


class Presorted:
    name = "presorted"

    def __init__(self, data):
        C, Y, t = data
        n = C.shape[0]
        flat = C.ravel()
        self.n = n
        self.order = np.argsort(flat, kind="stable")  # (row, position) pairs grouped by symbol
        self.bounds = np.searchsorted(flat[self.order], np.arange(S + 1))
        self.Ys = Y[self.order // N]  # queries in pair order: n*N*D doubles
        self.y_sq = np.einsum("nd,nd->n", Y, Y)
        self.emission_index = (C * T + t[:, None]).ravel()
        self.C = C

    def iteration(self, model):
        K, B, pi = model
        n, order, bounds, Ys = self.n, self.order, self.bounds, self.Ys
        inv_two_sigma2 = 1.0 / (2.0 * SIGMA2)
        gate_const = -0.5 * D * np.log(2.0 * np.pi * SIGMA2)
        with np.errstate(divide="ignore"):
            log_pi = np.log(pi)
            log_B = np.log(B)
        k_sq = np.einsum("sd,sd->s", K, K)
        yk_sorted = np.empty(n * N)
        for s in range(S):
            a, b = bounds[s], bounds[s + 1]
            np.matmul(Ys[a:b], K[s], out=yk_sorted[a:b])
        yk = np.empty(n * N)
        yk[order] = yk_sorted
        yk = yk.reshape(n, N)
        L = log_pi - (self.y_sq[:, None] - 2.0 * yk + k_sq[self.C]) * inv_two_sigma2
        L += log_B.ravel()[self.emission_index].reshape(n, N)
        m = L.max(axis=1, keepdims=True)
        E = np.exp(L - m)
        tot = E.sum(axis=1)
        R = E / tot[:, None]
        log_p = m[:, 0] + np.log(tot) + gate_const
        Rf = R.ravel()
        key_mass = np.bincount(self.C.ravel(), Rf, S)
        emission = np.bincount(self.emission_index, Rf, S * T)
        position = R.sum(axis=0)
        query_sq = float(R.sum(axis=1) @ self.y_sq)
        w = Rf[order]
        key_sum = np.empty((S, D))
        for s in range(S):
            a, b = bounds[s], bounds[s + 1]
            np.matmul(w[a:b], Ys[a:b], out=key_sum[s])
        stats = (key_sum, key_mass, emission.reshape(S, T), position, query_sq)
        return m_step(*stats[:4]), stats, log_p


def time_variant(cls, data, model, reps):
    t0 = time.perf_counter()
    impl = cls(data)
    setup = time.perf_counter() - t0
    impl.iteration(model)  # warm-up
    times = []
    result = None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = impl.iteration(model)
        times.append(time.perf_counter() - t0)
    return {"setup_s": setup, "times_s": times, "median_s": statistics.median(times),
            "min_s": min(times)}, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--variant", choices=["both", "chunked", "presorted"], default="both")
    args = parser.parse_args()

    model, data = make_problem(args.rows)
    classes = {"chunked": [Chunked], "presorted": [Presorted], "both": [Chunked, Presorted]}[args.variant]
    variants = {}
    results = {}
    for cls in classes:
        variants[cls.name], results[cls.name] = time_variant(cls, data, model, args.reps)
    if len(results) == 2:  # both variants compute the same iteration
        (m1, s1, lp1), (m2, s2, lp2) = results["chunked"], results["presorted"]
        for a, b in zip(list(m1) + list(s1[:4]) + [lp1], list(m2) + list(s2[:4]) + [lp2]):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(s1[4], s2[4], rtol=1e-9)
    best = min(variants, key=lambda k: variants[k]["median_s"])
    _, stats, log_p = results[best]
    print(json.dumps({
        "benchmark": "numpy_ra_em",
        "rows": args.rows, "N": N, "D": D, "S": S, "T": T,
        "median_s": variants[best]["median_s"],
        "best_variant": best,
        "variants": variants,
        "log_likelihood": float(log_p.sum()),
        "numpy": np.__version__,
        "python": platform.python_version(),
        "threads_env": {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
        "blas": blas.loaded_blas(),
    }, indent=1))


if __name__ == "__main__":
    main()
