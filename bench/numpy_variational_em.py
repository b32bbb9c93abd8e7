#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""NumPy baseline for one variational-embedding-attention EM iteration
(docs/mechanisms.md#variational-embedding-attention), the problem of bench/bench_variational.cpp: n = 20000 rows, N = 16
positions, S = 512 symbols, D = 32, T = 512 targets, mc = 6 Monte-Carlo samples, sigma2 = 0.5.

One iteration = what optimize() runs per iteration: the Monte-Carlo E-step over all rows with unit weights
(for each of the mc noise tables E_k = m + exp(log v / 2) * eps_k: gate, posterior, log p, the gradient of the
data term scattered into an (S, D) table, emission and position counts) + the plug-in score (E = m) of every row
+ the M-step (one Adam ascent step on m and log v with the KL term, clip, emission and prior normalisation).

The implementation is vectorised over row chunks (default 256 rows, its fastest: 128-4096 measured): the (chunk, N, D)
difference tensor E[q] - E[c_i] is built per chunk, squared norms with einsum, softmax and posterior in
probability space, and every scatter is one np.bincount over flat indices computed once per data set (not timed,
like the data). It runs single-threaded (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS = 1 unless the
caller sets them, before numpy is imported) on OpenBLAS by default (Debian's libblas.so.3 alternative;
`compare.py variational --peer-blas reference` runs it on the reference BLAS and LAPACK instead; the BLAS loaded is
in the output under "blas", bench/blas.py).
Like the C++ kernel's fast path it needs p >= 1e-250 for every row (asserted; it holds for this model).

--check-cpp BENCH runs `BENCH --benchmark_filter=BM_VariationalCheckCase` (bench/bench_variational.cpp), one EM
iteration in C++ on a small case given by closed formulas (check_case()), and compares its log-likelihood and
checksums of the statistics and of the new model with this implementation. The Monte-Carlo noise of the check is
regenerated here by an independent Python implementation of attnmix's streams (docs/mechanisms.md#training: mt19937_64,
SplitMix64 derive_seed, Marsaglia polar normals), so the comparison is exact up to rounding.

Prints one JSON object; `median_s` is the median over the repetitions.

Usage: /usr/bin/python3 bench/numpy_variational_em.py [--rows 20000] [--reps 3] [--chunk 1024]
       /usr/bin/python3 bench/numpy_variational_em.py --check-cpp build-bench/bench/attnmix_bench
"""
import blas

blas.prepare_peer_process()  # before numpy is imported: single-threaded unless the caller says otherwise

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

N, S, D, T, MC = 16, 512, 32, 512, 6
SIGMA2 = 0.5
LR = 0.05
PRIOR_STRENGTH = 1.0
EMISSION_SMOOTHING = 1e-4
MASK64 = (1 << 64) - 1


# ---- attnmix's random streams, independently in Python (docs/mechanisms.md#training) ---------------------------
class MT19937_64:
    """The 64-bit Mersenne Twister of std::mt19937_64 (default tempering constants)."""

    def __init__(self, seed):
        self.mt = [0] * 312
        self.mt[0] = seed & MASK64
        for i in range(1, 312):
            self.mt[i] = (6364136223846793005 * (self.mt[i - 1] ^ (self.mt[i - 1] >> 62)) + i) & MASK64
        self.index = 312

    def _twist(self):
        upper, lower = 0xFFFFFFFF80000000, 0x7FFFFFFF
        for i in range(312):
            x = (self.mt[i] & upper) | (self.mt[(i + 1) % 312] & lower)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            self.mt[i] = self.mt[(i + 156) % 312] ^ xa
        self.index = 0

    def next(self):
        if self.index >= 312:
            self._twist()
        y = self.mt[self.index]
        self.index += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK64


class AttnmixRng:
    """attnmix::Rng: uniform = 53 bits x 2^-53, normal by the polar method with a cached spare."""

    def __init__(self, seed):
        self.engine = MT19937_64(seed)
        self.spare = None

    def uniform(self):
        return (self.engine.next() >> 11) * 2.0**-53

    def normal(self):
        if self.spare is not None:
            out, self.spare = self.spare, None
            return out
        while True:
            u = 2.0 * self.uniform() - 1.0
            v = 2.0 * self.uniform() - 1.0
            s = u * u + v * v
            if 0.0 < s < 1.0:
                break
        factor = math.sqrt(-2.0 * math.log(s) / s)
        self.spare = v * factor
        return u * factor


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


K_MC_NOISE = 2


def derive_seed(seed, purpose, index):
    h = splitmix64(seed)
    h = splitmix64(h ^ purpose)
    return splitmix64(h ^ index)


def attnmix_noise(seed, iteration, mc, shape):
    rng = AttnmixRng(derive_seed(seed, K_MC_NOISE, iteration))
    size = shape[0] * shape[1]
    return [np.array([rng.normal() for _ in range(size)]).reshape(shape) for _ in range(mc)]


# ---- the iteration ----------------------------------------------------------------------------------------------
class Data:
    """Rows and the flat scatter indices derived from them once (not timed)."""

    def __init__(self, c, q, t, s, d, tt, chunk):
        self.c, self.q, self.t = c, q, t
        self.n, self.N = c.shape
        self.S, self.D, self.T = s, d, tt
        self.chunk = chunk
        self.emission_index = c * tt + t[:, None]  # (n, N) into the flat (S, T) table
        self.key_index = c[:, :, None] * d + np.arange(d)  # (n, N, D) into the flat (S, D) table
        self.query_index = q[:, None] * d + np.arange(d)  # (n, D)


def chunk_posterior(E, logpi, B, data, lo, hi, sigma2):
    """gate a, posterior r, log p and the differences E[q] - E[c_i] of rows [lo, hi)."""
    c = data.c[lo:hi]
    diff = E[data.q[lo:hi]][:, None, :] - E[c]
    s = logpi - np.einsum("cnd,cnd->cn", diff, diff) / (2.0 * sigma2)
    u = np.exp(s - s.max(axis=1, keepdims=True))
    z = u.sum(axis=1)
    ub = u * B[c, data.t[lo:hi][:, None]]
    num = ub.sum(axis=1)
    assert np.all(num / z >= 1e-250), "a row needs the log-space path, which this baseline does not have"
    return u / z[:, None], ub / num[:, None], np.log(num) - np.log(z), diff


def em_iteration(model, data, mc, noise, lr=LR, prior_strength=PRIOR_STRENGTH, smoothing=EMISSION_SMOOTHING):
    """One optimize() iteration: returns (next model, plug-in score of model, statistics)."""
    m, logv, B, pi, sigma2 = model["mean"], model["log_var"], model["emission"], model["prior"], model["sigma2"]
    S, D, T, n, N = data.S, data.D, data.T, data.n, data.N
    logpi = np.log(pi)
    s_std = np.exp(0.5 * logv)
    grad_m = np.zeros(S * D)
    grad_logv = np.zeros(S * D)
    emission_count = np.zeros(S * T)
    position_count = np.zeros(N)
    ll = 0.0
    for k in range(mc):
        E = m + s_std * noise[k]
        G = np.zeros(S * D)
        for lo in range(0, n, data.chunk):
            hi = min(n, lo + data.chunk)
            a, r, log_p, diff = chunk_posterior(E, logpi, B, data, lo, hi, sigma2)
            ll += log_p.sum() / mc
            emission_count += np.bincount(data.emission_index[lo:hi].ravel(), weights=(r / mc).ravel(),
                                          minlength=S * T)
            position_count += r.sum(axis=0) / mc
            x = ((r - a) / sigma2)[:, :, None] * diff
            G += np.bincount(data.key_index[lo:hi].ravel(), weights=x.ravel(), minlength=S * D)
            G -= np.bincount(data.query_index[lo:hi].ravel(), weights=x.sum(axis=1).ravel(), minlength=S * D)
        grad_m += G / mc
        grad_logv += G * (0.5 * s_std * noise[k]).ravel() / mc
    score = 0.0
    for lo in range(0, n, data.chunk):
        score += chunk_posterior(m, logpi, B, data, lo, min(n, lo + data.chunk), sigma2)[2].sum()
    # M-step: one Adam ascent step (docs/mechanisms.md#variational-embedding-attention), then the closed-form emission
    # and prior.
    tau = model["iteration"] + 1
    g_m = grad_m.reshape(S, D) - prior_strength * m
    g_lv = grad_logv.reshape(S, D) - prior_strength * 0.5 * (np.exp(logv) - 1.0)
    nxt = dict(model)
    for theta, g, first, second in (("mean", g_m, "m1", "m2"), ("log_var", g_lv, "v1", "v2")):
        mu1 = 0.9 * model[first] + 0.1 * g
        mu2 = 0.999 * model[second] + 0.001 * g * g
        nxt[theta] = model[theta] + lr * (mu1 / (1 - 0.9**tau)) / (np.sqrt(mu2 / (1 - 0.999**tau)) + 1e-8)
        nxt[first], nxt[second] = mu1, mu2
    nxt["log_var"] = np.clip(nxt["log_var"], -8.0, 2.0)
    nxt["iteration"] = tau
    counts = emission_count.reshape(S, T) + smoothing
    nxt["emission"] = counts / counts.sum(axis=1, keepdims=True)
    nxt["prior"] = position_count / position_count.sum()
    stats = {"grad_m": grad_m.reshape(S, D), "grad_logv": grad_logv.reshape(S, D),
             "emission_count": emission_count.reshape(S, T), "position_count": position_count, "ll": ll}
    return nxt, score, stats


def make_problem(rows, seed=20240611):
    """The benchmark's distributions (bench/bench_variational.cpp draws the same ones from other streams)."""
    rng = np.random.default_rng(seed)
    model = {
        "mean": 0.3 * rng.standard_normal((S, D)),
        "log_var": np.full((S, D), math.log(0.1)),
        "emission": None,
        "prior": None,
        "sigma2": SIGMA2,
        "iteration": 5,
    }
    B = 0.05 + 0.95 * rng.random((S, T))
    model["emission"] = B / B.sum(axis=1, keepdims=True)
    pi = 0.5 + 0.5 * rng.random(N)
    model["prior"] = pi / pi.sum()
    for key in ("m1", "m2", "v1", "v2"):
        model[key] = np.zeros((S, D))
    c = rng.integers(0, S, size=(rows, N))
    q = rng.integers(0, S, size=rows)
    t = rng.integers(0, T, size=rows)
    return model, c, q, t, rng


# ---- the closed-form check case (bench/bench_variational.cpp, BM_VariationalCheckCase) --------------------------
CHECK_S, CHECK_N, CHECK_D, CHECK_T, CHECK_ROWS, CHECK_MC = 7, 5, 3, 4, 40, 3
CHECK_SEED, CHECK_ITERATION = 11, 3


def check_case():
    S_, N_, D_, T_, n_ = CHECK_S, CHECK_N, CHECK_D, CHECK_T, CHECK_ROWS
    idx = np.arange(S_ * D_).reshape(S_, D_)
    mean = np.sin(1.0 + idx)
    log_var = -1.0 + 0.5 * np.cos(2.0 + idx)
    B = 1.5 + np.sin(3.0 + np.arange(S_ * T_).reshape(S_, T_))
    B = B / B.sum(axis=1, keepdims=True)
    pi = 1.0 + 0.5 * np.cos(np.arange(N_))
    pi = pi / pi.sum()
    moments = {key: (0.01 * (j + 1)) * np.cos(idx + j) ** 2 for j, key in enumerate(("m1", "m2", "v1", "v2"))}
    model = {"mean": mean, "log_var": log_var, "emission": B, "prior": pi, "sigma2": 0.7,
             "iteration": CHECK_ITERATION, **moments}
    r = np.arange(n_)[:, None]
    i = np.arange(N_)[None, :]
    c = (5 * r + 3 * i + (r * i) % 4) % S_
    q = (2 * np.arange(n_) + 1) % S_
    t = (7 * np.arange(n_) + 2) % T_
    return model, c, q, t


def checksum(x):
    flat = np.asarray(x, dtype=float).ravel()
    return float(np.sum(flat * np.cos(np.arange(flat.size))))


def check_cpp(bench):
    out = subprocess.run([bench, "--benchmark_filter=BM_VariationalCheckCase", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    counters = json.loads(out)["benchmarks"][0]
    model, c, q, t = check_case()
    data = Data(c, q, t, CHECK_S, CHECK_D, CHECK_T, chunk=16)
    noise = attnmix_noise(CHECK_SEED, CHECK_ITERATION, CHECK_MC, (CHECK_S, CHECK_D))
    nxt, score, stats = em_iteration(model, data, CHECK_MC, noise, lr=0.05, prior_strength=1.0)
    ours = {
        "ll": stats["ll"],
        "score": score,
        "grad_m": checksum(stats["grad_m"]),
        "grad_logv": checksum(stats["grad_logv"]),
        "emission_count": checksum(stats["emission_count"]),
        "position_count": checksum(stats["position_count"]),
        "mean": checksum(nxt["mean"]),
        "log_var": checksum(nxt["log_var"]),
        "emission": checksum(nxt["emission"]),
        "prior": checksum(nxt["prior"]),
    }
    worst = 0.0
    report = {}
    for key, value in ours.items():
        err = abs(counters[key] - value) / max(1.0, abs(value))
        worst = max(worst, err)
        report[key] = {"cpp": counters[key], "numpy": value, "rel_err": err}
    print(json.dumps({"check": report, "worst_rel_err": worst}, indent=1))
    if worst > 1e-9:
        sys.exit("C++ and NumPy disagree beyond 1e-9")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=256)
    parser.add_argument("--check-cpp", metavar="BENCH")
    args = parser.parse_args()
    if args.check_cpp:
        check_cpp(args.check_cpp)
        return
    model, c, q, t, rng = make_problem(args.rows)
    data = Data(c, q, t, S, D, T, args.chunk)
    times = []
    for rep in range(args.reps + 1):  # the first run is a warm-up
        t0 = time.perf_counter()
        noise = [rng.standard_normal((S, D)) for _ in range(MC)]  # each iteration draws its tables, as C++ does
        em_iteration(model, data, MC, noise)
        if rep > 0:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"variant": "numpy-chunked", "rows": args.rows, "N": N, "S": S, "D": D, "T": T, "mc": MC,
                      "chunk": args.chunk, "times_s": times, "median_s": statistics.median(times),
                      "numpy": np.__version__, "python": platform.python_version(), "blas": blas.loaded_blas()}))


if __name__ == "__main__":
    main()
