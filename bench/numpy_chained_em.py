#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""NumPy baselines for one chained-attention EM iteration (docs/mechanisms.md#chained-attention), the problem of
bench/bench_chained.cpp: the transitive-lookup task (docs/mechanisms.md#chained-attention) with n = 20000 rows, N = 10
positions (M = 5 pairs), S = T = 30 symbols, L = 2 or 3 hops, sigma2 = 0.1 (fixed).

One iteration = E-step over all rows with unit weights (gates, forward-backward, gamma/xi, the
statistics of docs/mechanisms.md#chained-attention scattered with bincount: key_num, key_mass, emission_count, ll, n) +
M-step (K = key_num / max(key_mass, 1e-9), B = emission_count + 1e-4 row-normalised). Three
vectorised implementations, all single-threaded (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS
= 1 unless the caller sets them, before numpy is imported) on OpenBLAS by default (Debian's libblas.so.3
alternative; `compare.py chained --peer-blas reference` runs them on the reference BLAS and LAPACK
instead; the BLAS loaded is in the output under "blas", bench/blas.py):

  reference     the reference design's formulation (seed 001, mixle): the whole batch at once, the
                (n, N, N, S) difference tensor, einsum recursions, statistics scattered with np.add.at
                as dense one-hot rows (class Reference).
  materialised  a tuned version of the same idea, over row chunks: the (chunk, N, N, S) difference
                tensor e_{v_i} - K[k_j] is built per chunk (np.subtract into a preallocated buffer)
                and its squared norm taken with einsum; likewise (chunk, N, S) for hop 0.
  onehot        the expansion of docs/mechanisms.md#chained-attention: a gate table G[u, s] = (2 K[s, u] - rho[s]) / (2
  sigma2)
                per hop (S*S entries, once per iteration), gathered with np.take at flat indices
                v_i*S + k_j computed once per data set (not timed, like the scatter indices).

The last two share everything else (softmax in place, forward-backward with stacked matmul, gamma,
xi, bincount scatters, M-step). Neither baseline has the log-space rescue of the C++ kernel: the check
p >= 1e-250 is asserted instead (it holds for this model, whose emission entries are >= 0.05/T·…).
All variants are compared with each other on every run (rtol 1e-9).

--check-cpp BENCH runs `BENCH --benchmark_filter=BM_ChainedCheckCase` (bench/bench_chained.cpp),
which fits one EM iteration in C++ on a small case defined by closed formulas (S = 7, T = 5, N = 6,
n = 64, sigma2 = 0.3, L = 2 and 3; see check_case()), and compares its log-likelihood and checksums
of the statistics and of the new model with both variants here and with brute-force enumeration
of all N^L hop paths.

Prints one JSON object; `median_s` is the median over the repetitions of each variant.

Usage: /usr/bin/python3 bench/numpy_chained_em.py [--rows 20000] [--hops 2] [--reps 5]
           [--variant all|both|reference|materialised|onehot] [--chunk-materialised 64] [--chunk-onehot 2048]
       /usr/bin/python3 bench/numpy_chained_em.py --check-cpp build-benchca/bench/attnmix_bench
"""
import os

import blas

blas.prepare_peer_process()  # before numpy is imported: single-threaded unless the caller says otherwise

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

M_PAIRS, N, S, T = 5, 10, 30, 30
SIGMA2 = 0.1
EMISSION_SMOOTHING = 1e-4
KEY_MASS_FLOOR = 1e-9
RESCUE_BELOW = 1e-250


# ----------------------------------------------------------------------------------------------
# Problem: same distributions as bench_chained.cpp (other random streams).

def transitive_task(n, rng, n_symbols=S, n_pairs=M_PAIRS):
    """docs/mechanisms.md#chained-attention: keys = [a, b_pi], values = [b, c], query a_i, target c_j with b_pi(j) =
    b_i."""
    m = n_pairs
    symbols = np.argsort(rng.random((n, n_symbols)), axis=1)[:, :3 * m]  # distinct per row
    a, b, c = symbols[:, :m], symbols[:, m:2 * m], symbols[:, 2 * m:]
    perm = np.argsort(rng.random((n, m)), axis=1)
    rows = np.arange(n)[:, None]
    keys = np.concatenate([a, b[rows, perm]], axis=1)
    vals = np.concatenate([b, c], axis=1)
    i = rng.integers(0, m, size=n)
    j = np.argmax(perm == i[:, None], axis=1)
    return keys, vals, a[np.arange(n), i], c[np.arange(n), j]


def random_model(L, rng):
    """K entries U(0, 1); emission rows normalised U(0.05, 1) draws (as bench_chained.cpp)."""
    K = rng.random((L, S, S))
    B = 0.05 + 0.95 * rng.random((S, T))
    B /= B.sum(axis=1, keepdims=True)
    return K, B, SIGMA2


# ----------------------------------------------------------------------------------------------
# Shared parts: softmax, forward-backward, scatter, M-step.

def softmax_(x):
    """In-place softmax over the last axis."""
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


class Stats:
    def __init__(self, L, n_symbols, n_targets):
        self.S, self.T = n_symbols, n_targets
        self.key_num = np.zeros((L, n_symbols * n_symbols))
        self.key_mass = np.zeros((L, n_symbols))
        self.emission = np.zeros(n_symbols * n_targets)
        self.ll = 0.0
        self.n = 0.0

    def value(self):
        L = self.key_mass.shape[0]
        return (self.key_num.reshape(L, self.S, self.S), self.key_mass,
                self.emission.reshape(self.S, self.T), self.ll, self.n)


def forward_backward_scatter(alpha0, trans, f, idx, stats):
    """alpha0 (c, N) and trans[l] (c, N, N) are the gates of a chunk, f (c, N) = B[v_j, t]; idx holds
    the chunk's flat scatter indices. Adds the chunk's statistics (docs/mechanisms.md#chained-attention, unit
    weights)."""
    L = len(trans) + 1
    S_ = stats.S
    alpha = [alpha0]
    for A in trans:
        alpha.append(np.matmul(alpha[-1][:, None, :], A)[:, 0, :])  # faster than einsum here
    p = np.einsum("nj,nj->n", alpha[-1], f)
    if p.min() < RESCUE_BELOW:
        raise RuntimeError("p < 1e-250: this baseline has no log-space rescue")
    beta = [None] * L
    beta[L - 1] = f
    for ell in range(L - 2, -1, -1):
        beta[ell] = np.matmul(trans[ell], beta[ell + 1][:, :, None])[:, :, 0]
    inv_p = (1.0 / p)[:, None]
    gamma0 = alpha[0] * beta[0] * inv_p
    stats.key_num[0] += np.bincount(idx["hop0"], gamma0.ravel(), S_ * S_)
    stats.key_mass[0] += np.bincount(idx["keys"], gamma0.ravel(), S_)
    for ell in range(1, L):
        xi = trans[ell - 1] * (alpha[ell - 1] * inv_p)[:, :, None]  # ξ_{ℓ-1}(i, j)
        xi *= beta[ell][:, None, :]
        stats.key_num[ell] += np.bincount(idx["pairs"], xi.ravel(), S_ * S_)
        stats.key_mass[ell] += np.bincount(idx["keys"], xi.sum(axis=1).ravel(), S_)
    gamma_last = gamma0 if L == 1 else alpha[L - 1] * beta[L - 1] * inv_p
    stats.emission += np.bincount(idx["emission"], gamma_last.ravel(), stats.emission.size)
    stats.ll += float(np.log(p).sum())
    stats.n += float(p.shape[0])


def m_step(stats, sigma2):
    key_num, key_mass, emission, _, _ = stats.value()
    K = key_num / np.maximum(key_mass, KEY_MASS_FLOOR)[:, :, None]
    B = emission + EMISSION_SMOOTHING
    B /= B.sum(axis=1, keepdims=True)
    return K, B, sigma2


class Baseline:
    """Data-set encoding shared by both variants (not timed): flat scatter indices per row."""

    def __init__(self, data, n_symbols, n_targets, chunk):
        keys, vals, q, t = data
        self.keys, self.vals, self.q, self.t = keys, vals, q, t
        self.S, self.T, self.chunk = n_symbols, n_targets, chunk
        self.hop0_index = keys * n_symbols + q[:, None]                         # key_num[0][k_i, q]
        self.pair_index = keys[:, None, :] * n_symbols + vals[:, :, None]       # key_num[ℓ][k_j, v_i]
        self.emission_index = vals * n_targets + t[:, None]                     # emission[v_j, t]

    def iteration(self, model):
        K, B, sigma2 = model
        L = K.shape[0]
        stats = Stats(L, self.S, self.T)
        Bf = B.ravel()
        tables = self.prepare(K, sigma2)
        n = self.keys.shape[0]
        for lo in range(0, n, self.chunk):
            hi = min(lo + self.chunk, n)
            alpha0, trans = self.gates(tables, lo, hi)
            idx = {"hop0": self.hop0_index[lo:hi].ravel(), "keys": self.keys[lo:hi].ravel(),
                   "pairs": self.pair_index[lo:hi].ravel(), "emission": self.emission_index[lo:hi].ravel()}
            f = np.take(Bf, self.emission_index[lo:hi])
            forward_backward_scatter(alpha0, trans, f, idx, stats)
        return m_step(stats, sigma2), stats


class Materialised(Baseline):
    name = "materialised"

    def __init__(self, data, n_symbols, n_targets, chunk):
        super().__init__(data, n_symbols, n_targets, chunk)
        self.eye = np.eye(n_symbols)

    def prepare(self, K, sigma2):
        return K, -1.0 / (2.0 * sigma2)

    def gates(self, tables, lo, hi):
        K, scale = tables
        keys, vals = self.keys[lo:hi], self.vals[lo:hi]
        c, n_pos = keys.shape
        d = self.eye[self.q[lo:hi]][:, None, :] - K[0][keys]                   # (c, N, S)
        alpha0 = softmax_(np.einsum("nis,nis->ni", d, d) * scale)
        val_oh = self.eye[vals][:, :, None, :]                                 # (c, N, 1, S)
        trans = []
        dd = np.empty((c, n_pos, n_pos, self.S))
        for ell in range(1, K.shape[0]):
            np.subtract(val_oh, K[ell][keys][:, None, :, :], out=dd)           # (c, i, j, S)
            trans.append(softmax_(np.einsum("nijs,nijs->nij", dd, dd) * scale))
        return alpha0, trans


class OneHot(Baseline):
    name = "onehot"

    def __init__(self, data, n_symbols, n_targets, chunk):
        super().__init__(data, n_symbols, n_targets, chunk)
        keys, vals, q, _ = data
        self.query_gather = q[:, None] * n_symbols + keys                      # G[q, k_j]
        self.trans_gather = vals[:, :, None] * n_symbols + keys[:, None, :]    # G[v_i, k_j]

    def prepare(self, K, sigma2):
        rho = np.einsum("lsu,lsu->ls", K, K)
        G = (2.0 * K.transpose(0, 2, 1) - rho[:, None, :]) / (2.0 * sigma2)   # [ℓ][u, s]
        return [g.ravel() for g in G]

    def gates(self, G, lo, hi):
        alpha0 = softmax_(np.take(G[0], self.query_gather[lo:hi]))
        trans = [softmax_(np.take(G[ell], self.trans_gather[lo:hi])) for ell in range(1, len(G))]
        return alpha0, trans


class Reference:
    """The reference design's formulation (seed 001, mixle), written out here: the whole batch at once, the
    (n, N, N, S) difference tensor squared and summed, einsum recursions, and statistics scattered with np.add.at
    as dense one-hot rows (the expected incoming one-hot of each position). Same iteration as the two variants
    above (checked on every run)."""
    name = "reference"

    def __init__(self, data, n_symbols, n_targets, chunk):
        self.keys, self.vals, self.q, self.t = data
        self.S, self.T = n_symbols, n_targets
        self.eye = np.eye(n_symbols)

    def iteration(self, model):
        K, B, sigma2 = model
        L = K.shape[0]
        keys, vals, q, t = self.keys, self.vals, self.q, self.t
        d = self.eye[q][:, None, :] - K[0][keys]                                          # (n, N, S)
        alpha = [softmax_(-np.sum(d * d, axis=2) / (2.0 * sigma2))]
        trans = []
        for ell in range(1, L):
            dd = self.eye[vals][:, :, None, :] - K[ell][keys][:, None, :, :]              # (n, N, N, S)
            trans.append(softmax_(-np.sum(dd * dd, axis=3) / (2.0 * sigma2)))
            alpha.append(np.einsum("ni,nij->nj", alpha[-1], trans[-1]))
        f = B[vals, t[:, None]]
        p = np.einsum("nk,nk->n", alpha[L - 1], f)
        beta = [None] * L
        beta[L - 1] = f
        for ell in range(L - 2, -1, -1):
            beta[ell] = np.einsum("nij,nj->ni", trans[ell], beta[ell + 1])
        gamma = [alpha[ell] * beta[ell] / p[:, None] for ell in range(L)]
        stats = Stats(L, self.S, self.T)
        key_num = np.zeros((L, self.S, self.S))
        key_mass = np.zeros((L, self.S))
        emission = np.zeros((self.S, self.T))
        flat_keys = keys.reshape(-1)
        np.add.at(key_num[0], flat_keys, (gamma[0][:, :, None] * self.eye[q][:, None, :]).reshape(-1, self.S))
        np.add.at(key_mass[0], flat_keys, gamma[0].reshape(-1))
        for ell in range(1, L):
            xi = alpha[ell - 1][:, :, None] * trans[ell - 1] * beta[ell][:, None, :] / p[:, None, None]
            incoming = np.einsum("nij,nis->njs", xi, self.eye[vals])                       # (n, N, S)
            np.add.at(key_num[ell], flat_keys, incoming.reshape(-1, self.S))
            np.add.at(key_mass[ell], flat_keys, xi.sum(axis=1).reshape(-1))
        np.add.at(emission, (vals.reshape(-1), np.repeat(t, vals.shape[1])), gamma[L - 1].reshape(-1))
        stats.key_num[:] = key_num.reshape(L, -1)
        stats.key_mass[:] = key_mass
        stats.emission[:] = emission.reshape(-1)
        stats.ll = float(np.log(p).sum())
        stats.n = float(p.shape[0])
        return m_step(stats, sigma2), stats


# ----------------------------------------------------------------------------------------------
# Check against C++ on a case defined by closed formulas (identical in bench_chained.cpp).

CHECK = {"S": 7, "T": 5, "N": 6, "rows": 64, "sigma2": 0.3}


def check_case(L):
    S_, T_, N_, n = CHECK["S"], CHECK["T"], CHECK["N"], CHECK["rows"]
    r = np.arange(n)[:, None]
    i = np.arange(N_)[None, :]
    keys = (5 * r + 3 * i + (r * i) % 4) % S_
    vals = (3 * r + i * i + 1) % S_
    q = (2 * np.arange(n) + 1) % S_
    t = (7 * np.arange(n) + 2) % T_
    K = np.sin(1.0 + np.arange(L * S_ * S_)).reshape(L, S_, S_)
    B = 1.5 + np.sin(3.0 + np.arange(S_ * T_)).reshape(S_, T_)
    B /= B.sum(axis=1, keepdims=True)
    return (keys, vals, q, t), (K, B, CHECK["sigma2"])


def checksum(x):
    x = np.asarray(x, dtype=float).ravel()
    return float(x @ np.cos(np.arange(x.size)))


def brute_force_ll(data, model):
    """Σ_n log Σ over all N^L hop paths of Π gates · B[v_last, t] (docs/mechanisms.md#chained-attention by
    enumeration)."""
    keys, vals, q, t = data
    K, B, sigma2 = model
    L = K.shape[0]

    def gate(hop, u, row):
        d = np.eye(K.shape[1])[u][None, :] - K[hop][keys[row]]
        logit = -np.sum(d * d, axis=1) / (2.0 * sigma2)
        w = np.exp(logit - logit.max())
        return w / w.sum()

    total = 0.0
    for row in range(keys.shape[0]):
        p = 0.0
        for path in itertools.product(range(keys.shape[1]), repeat=L):
            pr = gate(0, q[row], row)[path[0]]
            for hop in range(1, L):
                pr *= gate(hop, vals[row, path[hop - 1]], row)[path[hop]]
            p += pr * B[vals[row, path[-1]], t[row]]
        total += np.log(p)
    return total


def summary(model, stats):
    K, B, _ = model
    key_num, key_mass, emission, ll, n = stats.value()
    return {"ll": ll, "n": n, "chk_key_num": checksum(key_num), "chk_key_mass": checksum(key_mass),
            "chk_emission_count": checksum(emission), "chk_keys": checksum(K), "chk_emission": checksum(B)}


def check_cpp(bench):
    out = subprocess.run([bench, "--benchmark_filter=BM_ChainedCheckCase", "--benchmark_format=json",
                          "--benchmark_min_time=0.01"], capture_output=True, text=True, check=True).stdout
    cpp = {int(b["hops"]): b for b in json.loads(out)["benchmarks"]}
    report = {}
    worst = 0.0
    for L in sorted(cpp):
        data, model = check_case(L)
        sums = {}
        for cls in (Materialised, OneHot):
            impl = cls(data, CHECK["S"], CHECK["T"], chunk=17)  # chunks of unequal size on purpose
            sums[cls.name] = summary(*impl.iteration(model))
        brute = brute_force_ll(data, model)
        rows = {}
        for key in sums["onehot"]:
            ref = cpp[L][key]
            errs = {name: abs(s[key] - ref) / max(abs(ref), 1.0) for name, s in sums.items()}
            if key == "ll":
                errs["brute_force"] = abs(brute - ref) / max(abs(ref), 1.0)
            worst = max(worst, *errs.values())
            rows[key] = {"cpp": ref, **{n: s[key] for n, s in sums.items()}, "rel_err": errs}
        rows["ll"]["brute_force"] = brute
        report[L] = rows
    print(json.dumps({"check": "numpy_chained_em vs C++ (BM_ChainedCheckCase)", "case": CHECK,
                      "by_hops": report, "worst_rel_err": worst, "pass": worst < 1e-9}, indent=1))
    return worst < 1e-9


# ----------------------------------------------------------------------------------------------

def time_variant(cls, data, model, reps, chunk):
    t0 = time.perf_counter()
    impl = cls(data, S, T, chunk)
    setup = time.perf_counter() - t0
    impl.iteration(model)  # warm-up
    times = []
    result = None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = impl.iteration(model)
        times.append(time.perf_counter() - t0)
    return {"setup_s": setup, "chunk_rows": chunk, "times_s": times, "median_s": statistics.median(times),
            "min_s": min(times)}, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--hops", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=20240611)
    parser.add_argument("--variant", choices=["all", "both", "reference", "materialised", "onehot"],
                        default="all")
    parser.add_argument("--chunk-materialised", type=int, default=64)
    parser.add_argument("--chunk-onehot", type=int, default=2048)
    parser.add_argument("--check-cpp", metavar="BENCH", help="compare with the C++ check case and exit")
    args = parser.parse_args()
    if args.check_cpp:
        sys.exit(0 if check_cpp(args.check_cpp) else 1)

    rng = np.random.default_rng(args.seed)
    model = random_model(args.hops, rng)
    data = transitive_task(args.rows, rng)
    chunks = {"reference": args.rows, "materialised": args.chunk_materialised, "onehot": args.chunk_onehot}
    classes = {"reference": [Reference], "materialised": [Materialised], "onehot": [OneHot],
               "both": [Materialised, OneHot], "all": [Reference, Materialised, OneHot]}[args.variant]
    variants, results = {}, {}
    for cls in classes:
        variants[cls.name], results[cls.name] = time_variant(cls, data, model, args.reps, chunks[cls.name])
    (m1, s1), *others = results.values()  # every variant computes the same iteration
    for m2, s2 in others:
        for a, b in zip(list(m1[:2]) + list(s1.value()), list(m2[:2]) + list(s2.value())):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
    any_stats = next(iter(results.values()))[1]
    print(json.dumps({
        "benchmark": "numpy_chained_em",
        "rows": args.rows, "N": N, "S": S, "T": T, "L": args.hops, "sigma2": SIGMA2,
        "median_s": {name: v["median_s"] for name, v in variants.items()},
        "variants": variants,
        "log_likelihood": any_stats.ll,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "threads_env": {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
        "blas": blas.loaded_blas(),
    }, indent=1))


if __name__ == "__main__":
    main()
