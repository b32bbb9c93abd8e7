#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Overhead of fitting through Python: attnmix.optimize() on pre-encoded numpy arrays against the C++ path
(`attnmix fit` on an .npz of the same data with the same options), per EM iteration.

Workload (the foundation's benchmark, bench/bench_em_iteration.cpp): responsibility attention with n = 200000 rows,
N = 16, D = 32, S = 256, T = 256; uniform contexts, query = K[c_z] + N(0, 1) for a uniform position z, uniform
targets; K ~ N(0, 1). Both paths fit with sigma2 = 1 (fixed), seed 0, init_p 0.1, delta None (every iteration runs)
and the same thread count (default: all cores). The two paths produce the same model bit for bit
(tests/python/test_models.py), so they do the same work; the question is what the Python layer adds.

Two estimates of the time per iteration, each repetition running both sides back to back (alternating which goes
first), so that the two sides of a pair see the same machine load:

  totals    print interval larger than the run (no progress line is written):
            (t(k2) - t(k1)) / (k2 - k1) from two fits of k1 and k2 iterations, so encoding, the initialisation and
            the final scoring pass cancel. Python: time.perf_counter() around optimize(); C++: the `time` line of
            `attnmix fit` (its optimize() call alone, reading the .npz excluded). CPU time (all threads) likewise:
            time.process_time() and the child's rusage.
  lines     one fit of k2 iterations with a progress line per iteration: the mean of the middle half of the
            per-iteration times of iterations 2..k2. Python: the time between consecutive writes to `out`
            (the write itself, a few microseconds, included); C++: the seconds `attnmix fit` prints per line.
            Robust against short bursts of other load on a shared machine.

`ratio` is the median over repetitions of the paired python / cli ratio of the `lines` estimate; `ratio_totals` and
`ratio_cpu` are the same for the `totals` estimate. Target: ratio <= 1.05.

Usage: /usr/bin/python3 bench/python_overhead.py [--build build] [--rows 200000] [--k1 2] [--k2 32] [--reps 5]
       [--threads T]
Prints one JSON object.
"""
import argparse
import io
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

N, D, S, T = 16, 32, 256, 256


def make_data(n, seed=20240611):
    rng = np.random.default_rng(seed)
    K = rng.standard_normal((S, D))
    contexts = rng.integers(0, S, size=(n, N))
    z = rng.integers(0, N, size=n)
    queries = K[contexts[np.arange(n), z]] + rng.standard_normal((n, D))
    targets = rng.integers(0, T, size=n)
    return contexts, queries, targets


def trimmed_mean(values):
    """The mean of the middle half."""
    values = sorted(values)
    quarter = len(values) // 4
    middle = values[quarter:len(values) - quarter] or values
    return sum(middle) / len(middle)


class LineClock:
    """An `out` for optimize() that records when each progress line arrives."""

    def __init__(self):
        self.times = []

    def write(self, line):
        self.times.append(time.perf_counter())


def python_fit(attnmix, batch, iterations, threads, lines):
    """Totals: (wall, cpu) seconds of one optimize() call. Lines: the per-iteration seconds of iterations 2.."""
    est = attnmix.ResponsibilityAttentionEstimator(S, N, D, T, sigma2=1.0)
    out = LineClock() if lines else io.StringIO()
    wall, cpu = time.perf_counter(), time.process_time()
    attnmix.optimize(batch, est, max_its=iterations, delta=None, rng=0, init_p=0.1, out=out,
                     print_iter=1 if lines else 10**9, num_threads=threads)
    if lines:
        return [b - a for a, b in zip(out.times, out.times[1:])]
    return time.perf_counter() - wall, time.process_time() - cpu


def cli_fit(cli, data_path, model_path, iterations, threads, lines):
    """Totals: (wall seconds of the fit as `attnmix fit` reports them, cpu seconds of the whole process).
    Lines: the per-iteration seconds `attnmix fit` prints, iterations 2.."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        [cli, "fit", "--data", data_path, "--out", model_path, "--symbols", str(S), "--targets", str(T),
         "--context-length", str(N), "--query-dim", str(D), "--sigma2", "1", "--seed", "0", "--init-p", "0.1",
         "--delta", "none", "--max-its", str(iterations), "--print-iter", "1" if lines else str(10**9),
         "--threads", str(threads or 0)],
        capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if lines:
        seconds = [float(x) for x in re.findall(r"^Iteration \d+: .* \(([0-9.]+) s\)$", result.stdout, re.MULTILINE)]
        if len(seconds) != iterations:
            raise RuntimeError("expected one progress line per iteration from attnmix fit:\n" + result.stdout)
        return seconds[1:]
    match = re.search(r"^\s*time\s+([0-9.]+) s$", result.stdout, re.MULTILINE)
    if not match:
        raise RuntimeError("no time line in the output of attnmix fit:\n" + result.stdout)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(match.group(1)), cpu


def one_side(fit, k1, k2):
    """{'lines', 'wall', 'cpu'} seconds per iteration of one side in one repetition."""
    (wall1, cpu1), (wall2, cpu2) = fit(k1, False), fit(k2, False)
    return {"lines": trimmed_mean(fit(k2, True)), "wall": (wall2 - wall1) / (k2 - k1),
            "cpu": (cpu2 - cpu1) / (k2 - k1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build", help="the CMake build directory (with python/ and cli/)")
    parser.add_argument("--rows", type=int, default=200000)
    parser.add_argument("--k1", type=int, default=2)
    parser.add_argument("--k2", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="E-step threads (default: all cores)")
    args = parser.parse_args()
    if args.k2 <= args.k1:
        parser.error("--k2 must exceed --k1")

    sys.path.insert(0, os.path.join(args.build, "python"))
    import attnmix  # noqa: E402  (the build tree's package)

    cli = os.path.join(args.build, "cli", "attnmix")
    contexts, queries, targets = make_data(args.rows)
    encoder = attnmix.ResponsibilityAttentionDataEncoder(S, N, D, T)
    start = time.perf_counter()
    batch = encoder.seq_encode((contexts, queries, targets))
    encode_seconds = time.perf_counter() - start

    python_runs, cli_runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        data_path = os.path.join(tmp, "data.npz")
        model_path = os.path.join(tmp, "model.json")
        np.savez(data_path, context=contexts, query=queries, target=targets)

        def python_side():
            return one_side(lambda k, lines: python_fit(attnmix, batch, k, args.threads, lines), args.k1, args.k2)

        def cli_side():
            return one_side(lambda k, lines: cli_fit(cli, data_path, model_path, k, args.threads, lines),
                            args.k1, args.k2)

        for rep in range(args.reps):
            if rep % 2 == 0:  # alternate which side goes first
                python_runs.append(python_side())
                cli_runs.append(cli_side())
            else:
                cli_runs.append(cli_side())
                python_runs.append(python_side())

    def side(runs):
        return {key: {"median": statistics.median(r[key] for r in runs), "min": min(r[key] for r in runs),
                      "runs": [r[key] for r in runs]} for key in ("lines", "wall", "cpu")}

    def paired(key):
        return statistics.median(p[key] / c[key] for p, c in zip(python_runs, cli_runs))

    print(json.dumps({
        "workload": {"rows": args.rows, "N": N, "D": D, "S": S, "T": T, "sigma2": 1.0,
                     "iterations": [args.k1, args.k2], "threads": args.threads or os.cpu_count()},
        "ratio": paired("lines"),
        "ratio_totals": paired("wall"),
        "ratio_cpu": paired("cpu"),
        "seconds_per_iteration": {"python": side(python_runs), "cli": side(cli_runs)},
        "python_encode_seconds": encode_seconds,
        "load_average": os.getloadavg(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "attnmix": attnmix.__version__},
    }, indent=2))


if __name__ == "__main__":
    main()
