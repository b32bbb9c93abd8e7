#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Run the C++ EM-iteration benchmark and the NumPy baseline back to back, print the ratios, save the
result (machine and revision recorded), or diff a saved result against another (STYLE.md §12).

  /usr/bin/python3 bench/compare.py run  [--bench build-bench/bench/attnmix_bench] [--rounds 3] [--out FILE]
  /usr/bin/python3 bench/compare.py diff BASELINE.json CURRENT.json
  /usr/bin/python3 bench/compare.py chained [--bench build-bench/bench/attnmix_bench] [--rounds 3] [--out FILE]
  /usr/bin/python3 bench/compare.py assign [--bench build-bench/bench/attnmix_bench] [--rounds 3] [--out FILE]
  /usr/bin/python3 bench/compare.py variational [--bench build-bench/bench/attnmix_bench] [--rounds 3] [--out FILE]
  /usr/bin/python3 bench/compare.py mpi [--bench-mpi build-bench/bench/attnmix_bench_mpi] [--rounds 5] [--out FILE]
  /usr/bin/python3 bench/compare.py spine [--bench-spine build-bench/bench/attnmix_bench_spine] [--rounds 5]
                                          [--rss-tokens 100000 1000000] [--rss-pytorch] [--out FILE]
  /usr/bin/python3 bench/compare.py moment-closure [--bench-mca build-mca-bench/bench/attnmix_bench_moment_closure]
                                                   [--rounds 5] [--pytorch-window] [--retain-freed-memory] [--out FILE]
  /usr/bin/python3 bench/compare.py torch-module [--bench-mca build/bench/attnmix_bench_moment_closure]
                                                 [--python-build build/python] [--d-model 32 128] [--rounds 3]
  /usr/bin/python3 bench/compare.py allreduce [--bench-mpi build-bench/bench/attnmix_bench_mpi] [--ranks 1 2]
                                              [--pieces] [--mca KEY=VALUE] [--out FILE]

Every subcommand but `diff` also takes --peer-blas {openblas,reference}.

Both sides of a comparison run in one environment (bench/blas.py): the peers (NumPy, PyTorch, scipy) on Debian's
OpenBLAS by default, single-threaded (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS = 1, or --threads
where a subcommand has it), with every processor-specific OpenBLAS/BLAS tuning variable unset so that OpenBLAS picks
its kernels for this processor. --peer-blas reference puts Debian's reference BLAS and LAPACK first on
LD_LIBRARY_PATH instead, for the peers and the C++ program alike. attnmix's own hot kernels are hand-written; its
programs use the BLAS only through libtorch operations (attnmix_bench_spine, attnmix_bench_moment_closure). Every
result records under "blas" the choice, what the peers reported loading, what each C++ program loads and the unset
variables, and the summary names each side's BLAS and kernel in one line.

A two-thread or two-rank figure needs two free cores: `run`, `chained`, `assign`, `variational`, `mpi` and
`allreduce` run blas.two_cores_available() before each round (a busy loop alone, then two at once) and, in a round
where the two ran at under 90 % of full speed, report that round's two-thread and two-rank figures as not measurable;
their medians are over the other rounds, and the summary says in how many rounds two cores were free.

`run` alternates the C++ program and the peers `--rounds` times (the machine is shared and noisy, so only ratios
measured in the same run are compared) and reports, per program, the median over rounds of each round's figure: the
C++ figures are Google Benchmark's median real times of BM_EmIteration/threads:k and BM_EmIterationMixed/threads:k
(the float64 and the mixed-precision E-step) over its repetitions, the peers' are numpy_ra_em.py's two variants and
pytorch_ra_em.py's float64 and float32 iterations, each the median over --numpy-reps repetitions. The ratios (peer
over C++ one thread, per precision; the slowest of them; float64 over mixed; one thread over two) are medians of the
per-round ratios.

`mpi` (docs/SCALING.md) runs, in each round, BM_MpiEmIteration under `mpirun -np 1` and `-np 2` (one E-step thread
per rank, OMP_NUM_THREADS=1) and the single-process BM_EmIteration/threads:1 and /threads:2, and prints the
1-rank/2-rank and 1-thread/2-thread ratios (medians of the per-round ratios), the CPU busy fraction before each
round and the load average.

`spine` (issue 8, docs/PERFORMANCE.md) first compares the first training losses of attnmix_bench_spine and
pytorch_spine.py (same seed and data; they agree when the relative difference is at most 1e-4), then runs, in each
round, BM_SpineTrainStep and pytorch_spine.py back to back at d_model 32, 128, 256 and 512 (which program goes first
alternates), and BM_SpineStream (E1-3), and prints the C++/PyTorch tokens-per-second ratios, by wall clock and by
process CPU time, and the 80/40-chunk ratio (medians of per-round ratios); finally the peak RSS of a streaming
evaluation over each --rss-tokens count, each in a fresh process.

`moment-closure` (issue 9, docs/PERFORMANCE.md) first compares the first training losses, births/merges and bank
fingerprints of attnmix_bench_moment_closure and pytorch_moment_closure.py (float32 and float64; documented defaults and
a birth/merge-heavy setting), then runs, in each round, BM_MomentClosureTrainStep, BM_MomentClosureTrainStepBusy and
BM_WindowTrainStep (chunks 64 and 16) and the PyTorch implementation at the same settings (order alternating), and
prints the C++/PyTorch and MCA/window tokens-per-second ratios (medians of per-round ratios, wall and CPU time);
finally one streaming evaluation to 1e6 tokens: per-token time after 1e4 and 1e6 tokens (both ends stepped
alternately in the same process), state bytes and RSS at both ends.

`torch-module` (issue 19, docs/PERFORMANCE.md) checks that attnmix.torch's MomentClosureAttention, trained from
Python by pytorch_moment_closure.py's driver (--implementation attnmix), reproduces the C++ step's first losses
exactly, then times, per round and --d-model, BM_MomentClosureTrainStep, that Python-driven module and the PyTorch
implementation (order alternating), and prints attnmix.torch/C++, attnmix.torch/PyTorch and C++/PyTorch
tokens-per-second ratios (medians of per-round ratios).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import blas

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "loadavg": load}


def revision():
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def fmt(value, suffix=""):
    """A figure with two decimals (and `suffix`), or the text that stands in for it (not measurable ...)."""
    return f"{value:.2f}{suffix}" if isinstance(value, (int, float)) else str(value)


# ---- One environment for both sides, and the BLAS each side loaded (bench/blas.py) ---------------------------------

# glibc's allocator told to keep freed memory (core/allocator.hpp, what the attnmix CLI sets at start-up); the
# variational, spine and moment-closure comparisons can run BOTH programs with this setting.
RETAIN_FREED_MEMORY = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295"


def bench_env(args, threads=1, retain=False):
    """The environment of both sides of a comparison: blas.peer_env(threads, --peer-blas), glibc's allocator keeping
    freed memory when `retain`."""
    env = blas.peer_env(threads, args.peer_blas)
    env.pop("GLIBC_TUNABLES", None)
    if retain:
        env["GLIBC_TUNABLES"] = RETAIN_FREED_MEMORY
    return env


PEER_BLAS = {}  # "loaded": the BLAS the first peer of this run reported (blas.loaded_blas()); the others must agree


def run_peer(script, options, env):
    """The JSON output of the peer bench/<script> run under `env`; the BLAS it reports loading is kept for the
    result (record_blas)."""
    data = json.loads(subprocess.run(["/usr/bin/python3", os.path.join(HERE, script), *options],
                                     capture_output=True, text=True, check=True, env=env).stdout)
    first = PEER_BLAS.setdefault("loaded", data["blas"])
    if data["blas"] != first:
        raise RuntimeError(f"the peers of one run loaded different BLAS: {first} and {data['blas']}")
    return data


def blas_line(record):
    """The BLAS and kernel of each side of a result's "blas" record, in one line."""
    peers = f"peers ({record['selected']}) {blas.describe(record['peer'])}" if record["peer"] else "no peers"
    cpp = "; ".join(f"{name} {blas.describe(r)}" for name, r in record["cpp"].items())
    return f"{peers}; {cpp}"


def record_blas(result, args, env, *binaries):
    """result["blas"]: the --peer-blas choice, what the peers reported loading, what each C++ binary loads under
    `env` and the tuning variables unset for both sides; printed in one line (stderr)."""
    result["blas"] = {"selected": args.peer_blas, "peer": PEER_BLAS.get("loaded"),
                      "cpp": {os.path.basename(b): blas.binary_blas(b, env) for b in binaries},
                      "unset_variables": blas.tuning_variables()}
    print(f"BLAS: {blas_line(result['blas'])}", file=sys.stderr)


# ---- Two-thread and two-rank figures need two free cores (blas.two_cores_available, before each round) -------------

def two_core_figure(value, cores):
    """A round's two-thread or two-rank figure, or why it is not measurable in that round."""
    if cores["available"]:
        return value
    return f"not measurable (two busy processes ran at {cores['ratio']:.2f} of full speed)"


def median_two_core_figure(figures):
    """The median of the rounds' two_core_figure values that were measured, or why there is none."""
    measured = [f for f in figures if not isinstance(f, str)]
    return statistics.median(measured) if measured else "not measurable in any round"


def median_two_core_ratio(rounds, cores_by_round, num, den):
    """median_two_core_figure of the rounds' rd[num] / rd[den] (a two-thread or two-rank figure)."""
    return median_two_core_figure([two_core_figure(rd[num] / rd[den], cores)
                                   for rd, cores in zip(rounds, cores_by_round)])


def record_two_cores(result, cores_by_round):
    """result["two_cores"]: each round's blas.two_cores_available(); in how many rounds two cores were free is
    printed (stderr)."""
    available = sum(c["available"] for c in cores_by_round)
    result["two_cores"] = {"rounds_available": available, "rounds": len(cores_by_round), "by_round": cores_by_round}
    print(f"two cores available in {available} of {len(cores_by_round)} rounds (two-thread and two-rank figures "
          f"from the others: not measurable)", file=sys.stderr)


# ---- Responsibility attention (bench_em_iteration.cpp vs numpy_ra_em.py) -------------------------------------------

def run_cpp(bench, repetitions, env):
    """{"float64": {threads: s}, "mixed": {threads: s}}: BM_EmIteration and BM_EmIterationMixed medians."""
    out = subprocess.run(
        [bench, "--benchmark_filter=^BM_EmIteration(Mixed)?/", "--benchmark_format=json",
         f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true"],
        capture_output=True, text=True, check=True, env=env).stdout
    result = {"float64": {}, "mixed": {}}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            precision = "mixed" if b["run_name"].startswith("BM_EmIterationMixed/") else "float64"
            threads = int(b["run_name"].split("threads:")[1].split("/")[0])
            unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
            result[precision][threads] = b["real_time"] * unit
    return result


def run_ra_peers(reps, env):
    """{peer: median seconds per iteration}: numpy_ra_em.py's variants and pytorch_ra_em.py's dtypes."""
    numpy = run_peer("numpy_ra_em.py", ["--reps", str(reps)], env)
    torch = run_peer("pytorch_ra_em.py", ["--reps", str(reps)], env)
    peers = {f"numpy_{name}": v["median_s"] for name, v in numpy["variants"].items()}
    peers.update({f"pytorch_{name}": v["median_s"] for name, v in torch["variants"].items()})
    return peers


def cmd_run(args):
    env = bench_env(args)
    cpp_rounds, peer_rounds, cores_rounds, two_thread = [], [], [], []
    for r in range(args.rounds):
        cores_rounds.append(blas.two_cores_available())
        cpp_rounds.append(run_cpp(args.bench, args.repetitions, env))
        peer_rounds.append(run_ra_peers(args.numpy_reps, env))
        two_thread.append({p: two_core_figure(cpp_rounds[-1][p][1] / cpp_rounds[-1][p][2], cores_rounds[-1])
                           for p in ("float64", "mixed")})
        print(f"round {r + 1}: C++ {cpp_rounds[-1]}  peers {peer_rounds[-1]}  C++ 1 thread / 2 threads "
              f"{ {p: fmt(v) for p, v in two_thread[-1].items()} }", file=sys.stderr)
    cpp = {p: {k: statistics.median(rd[p][k] for rd in cpp_rounds) for k in cpp_rounds[0][p]}
           for p in ("float64", "mixed")}
    peers = {k: statistics.median(rd[k] for rd in peer_rounds) for k in peer_rounds[0]}
    # Ratios: median over rounds of each round's peer / C++ one-thread time.
    ratios = {f"{peer}_over_cpp_{p}_1_thread": statistics.median(rd[peer] / cd[p][1]
                                                                  for rd, cd in zip(peer_rounds, cpp_rounds))
              for peer in peers for p in ("float64", "mixed")}
    for p in ("float64", "mixed"):
        ratios[f"slowest_peer_ratio_{p}"] = min(v for k, v in ratios.items() if k.endswith(f"_cpp_{p}_1_thread"))
        ratios[f"cpp_{p}_1_thread_over_2_threads"] = median_two_core_figure([t[p] for t in two_thread])
    ratios["cpp_float64_over_mixed_1_thread"] = statistics.median(cd["float64"][1] / cd["mixed"][1]
                                                                  for cd in cpp_rounds)
    result = {
        "machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpp_seconds_by_precision_and_threads": cpp, "peer_seconds": peers,
        "rounds": {"cpp": cpp_rounds, "peers": peer_rounds, "cpp_1_thread_over_2_threads": two_thread},
        "ratios": ratios,
    }
    record_two_cores(result, cores_rounds)
    record_blas(result, args, env, args.bench)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def run_seconds(result):
    """{name: seconds} of a saved `run` result: the C++ figures by precision and threads, then the peers'."""
    seconds = {f"cpp_{p}_{k}_threads": v for p, by_threads in result["cpp_seconds_by_precision_and_threads"].items()
               for k, v in by_threads.items()}
    seconds.update(result["peer_seconds"])
    return seconds


def cmd_diff(args):
    with open(args.baseline) as f:
        base = json.load(f)
    with open(args.current) as f:
        cur = json.load(f)
    print(f"baseline {base['revision']} on {base['machine']['cpu']} ({base['date']})")
    print(f"current  {cur['revision']} on {cur['machine']['cpu']} ({cur['date']})")
    for label, res in (("baseline", base), ("current ", cur)):
        print(f"{label} BLAS: {blas_line(res['blas']) if 'blas' in res else 'not recorded'}")
    base_seconds, cur_seconds = run_seconds(base), run_seconds(cur)
    for name in sorted(set(base_seconds) | set(cur_seconds)):
        b, c = base_seconds.get(name), cur_seconds.get(name)
        if b is None or c is None:
            print(f"  {name}: {b} -> {c}")
        else:
            print(f"  {name}: {b * 1e3:9.2f} ms -> {c * 1e3:9.2f} ms  ({c / b:5.2f}x)")
    for name in sorted(set(base["ratios"]) | set(cur["ratios"])):
        print(f"  ratio {name}: {fmt(base['ratios'].get(name, float('nan')))} -> "
              f"{fmt(cur['ratios'].get(name, float('nan')))}")


# ---- Chained attention (bench_chained.cpp vs numpy_chained_em.py) -------------------------------------------------

def run_cpp_chained(bench, repetitions, env):
    """{(hops, threads): median seconds of BM_ChainedEmIteration} from one Google Benchmark run."""
    out = subprocess.run(
        [bench, "--benchmark_filter=^BM_ChainedEmIteration/", "--benchmark_format=json",
         f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true"],
        capture_output=True, text=True, check=True, env=env).stdout
    result = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            name = b["run_name"]
            hops = int(name.split("hops:")[1].split("/")[0])
            threads = int(name.split("threads:")[1].split("/")[0])
            unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
            result[f"L{hops}_t{threads}"] = b["real_time"] * unit
    return result


def run_numpy_chained(hops, reps, env):
    data = run_peer("numpy_chained_em.py", ["--hops", str(hops), "--reps", str(reps)], env)
    return {f"L{hops}_{name}": v for name, v in data["median_s"].items()}


def cmd_chained(args):
    env = bench_env(args)
    check = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "numpy_chained_em.py"), "--check-cpp",
                            args.bench], capture_output=True, text=True, env=env)
    check_ok = check.returncode == 0
    print(f"check against C++: {'pass' if check_ok else 'FAIL'}", file=sys.stderr)
    cpp_rounds, np_rounds, cores_rounds = [], [], []
    for r in range(args.rounds):
        cores_rounds.append(blas.two_cores_available())
        cpp_rounds.append(run_cpp_chained(args.bench, args.repetitions, env))
        npy = {}
        for hops in (2, 3):
            npy.update(run_numpy_chained(hops, args.numpy_reps, env))
        np_rounds.append(npy)
        print(f"round {r + 1}: C++ {cpp_rounds[-1]}  NumPy {np_rounds[-1]}  two-thread figures "
              f"{two_core_figure('measured', cores_rounds[-1])}", file=sys.stderr)
    cpp = {k: statistics.median(rd[k] for rd in cpp_rounds) for k in cpp_rounds[0]}
    npy = {k: statistics.median(rd[k] for rd in np_rounds) for k in np_rounds[0]}
    ratios = {}
    for hops in (2, 3):
        for variant in ("reference", "materialised", "onehot"):
            key = f"L{hops}_{variant}"
            per_round = [rn[key] / rc[f"L{hops}_t1"] for rc, rn in zip(cpp_rounds, np_rounds)]
            ratios[f"numpy_{variant}_over_cpp_1_thread_L{hops}"] = statistics.median(per_round)
            per_round = [two_core_figure(rn[key] / rc[f"L{hops}_t2"], cores)
                         for rc, rn, cores in zip(cpp_rounds, np_rounds, cores_rounds)]
            ratios[f"numpy_{variant}_over_cpp_2_threads_L{hops}"] = median_two_core_figure(per_round)
        ratios[f"cpp_1_thread_over_2_threads_L{hops}"] = median_two_core_ratio(cpp_rounds, cores_rounds,
                                                                              f"L{hops}_t1", f"L{hops}_t2")
    result = {
        "machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "check_against_cpp": check_ok,
        "cpp_seconds": cpp, "numpy_seconds": npy, "ratios_median_of_rounds": ratios,
        "rounds": {"cpp": cpp_rounds, "numpy": np_rounds},
    }
    record_two_cores(result, cores_rounds)
    record_blas(result, args, env, args.bench)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


# ---- Assignment-tree attention (bench_assign.cpp vs scipy_lap.py and the seed-004 script) ------------------------

SEED_004 = "/work/shared/seeds/004_assignment_tree_experiment.py"


def run_cpp_assign(bench, repetitions, env):
    """{name: median seconds} and {lap shape: optimal cost} from one Google Benchmark run of BM_Assign*."""
    out = subprocess.run(
        [bench, "--benchmark_filter=^BM_Assign", "--benchmark_format=json",
         f"--benchmark_repetitions={repetitions}"],
        capture_output=True, text=True, check=True, env=env).stdout
    runs, costs = {}, {}  # the median over repetitions is taken here (works with 1 repetition too)
    for b in json.loads(out)["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue
        name = b["run_name"]
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        if name.startswith("BM_AssignLap/"):
            shape = name.split("nq:")[1].split("/")[0] + "x" + name.split("nk:")[1].split("/")[0]
            key = f"lap_{shape}"
            costs[shape] = b.get("cost")
        elif name.startswith("BM_AssignFrequencyEstimate"):
            key = "frequency_estimate_K128"
        elif name.startswith("BM_AssignTreeExperiment/"):
            key = "experiment_t" + name.split("threads:")[1].split("/")[0]
        else:
            continue
        runs.setdefault(key, []).append(b["real_time"] * unit)
    return {k: statistics.median(v) for k, v in runs.items()}, costs


def run_python_assign(seed_script, min_time, env):
    seed = ["--seed-script", seed_script] if seed_script else []
    data = run_peer("scipy_lap.py", ["--min-time", str(min_time), *seed], env)
    seconds = {f"lap_{k}": v["seconds"] for k, v in data["lap"].items()}
    seconds["frequency_estimate_K128"] = data["frequency_estimate_K128_s"]
    if data["seed_script_s"] is not None:
        seconds["experiment"] = data["seed_script_s"]
    return seconds, {k: v["cost"] for k, v in data["lap"].items()}


def cmd_assign(args):
    env = bench_env(args)
    cpp_rounds, py_rounds, cores_rounds, cost_ok = [], [], [], True
    seed_script = args.seed_script if os.path.exists(args.seed_script) else None
    for r in range(args.rounds):
        cores_rounds.append(blas.two_cores_available())
        cpp, cpp_cost = run_cpp_assign(args.bench, args.repetitions, env)
        py, py_cost = run_python_assign(seed_script, args.min_time, env)
        for shape, c in py_cost.items():
            if cpp_cost.get(shape) is None or abs(cpp_cost[shape] - c) > 1e-9 * max(1.0, abs(c)):
                cost_ok = False
        cpp_rounds.append(cpp)
        py_rounds.append(py)
        print(f"round {r + 1}: C++ {cpp}  Python {py}  two-thread figures "
              f"{two_core_figure('measured', cores_rounds[-1])}", file=sys.stderr)
    ratios = {}
    for key in cpp_rounds[0]:
        if key.startswith("lap_") or key == "frequency_estimate_K128":
            ratios[f"scipy_over_cpp_{key}"] = statistics.median(p[key] / c[key] for c, p in zip(cpp_rounds, py_rounds))
    if "experiment" in py_rounds[0]:
        for key in cpp_rounds[0]:
            if key == "experiment_t1":
                ratios[f"seed_script_over_cpp_{key}"] = statistics.median(
                    p["experiment"] / c[key] for c, p in zip(cpp_rounds, py_rounds))
            elif key.startswith("experiment_t"):
                ratios[f"seed_script_over_cpp_{key}"] = median_two_core_figure(
                    [two_core_figure(p["experiment"] / c[key], cores)
                     for c, p, cores in zip(cpp_rounds, py_rounds, cores_rounds)])
    result = {
        "machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "optimal_costs_agree": cost_ok,
        "cpp_seconds": {k: statistics.median(rd[k] for rd in cpp_rounds) for k in cpp_rounds[0]},
        "python_seconds": {k: statistics.median(rd[k] for rd in py_rounds) for k in py_rounds[0]},
        "ratios_median_of_rounds": ratios,
        "rounds": {"cpp": cpp_rounds, "python": py_rounds},
    }
    record_two_cores(result, cores_rounds)
    record_blas(result, args, env, args.bench)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


# ---- Variational embedding attention (bench_variational.cpp vs numpy_variational_em.py) ----------------------------

# The comparison is run both with the default allocator and with RETAIN_FREED_MEMORY for BOTH programs.

def run_cpp_variational(bench, repetitions, env):
    """{"t1": s, "t2": s, "mixed_t1": s, "mixed_t2": s}: median real times of BM_VariationalEmIteration/threads:k
    (float64) and BM_VariationalEmIterationMixed/threads:k from one run."""
    out = subprocess.run(
        [bench, "--benchmark_filter=^BM_VariationalEmIteration(Mixed)?/", "--benchmark_format=json",
         f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true"],
        capture_output=True, text=True, check=True, env=env).stdout
    result = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            threads = int(b["run_name"].split("threads:")[1].split("/")[0])
            unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
            prefix = "mixed_" if b["run_name"].startswith("BM_VariationalEmIterationMixed/") else ""
            result[f"{prefix}t{threads}"] = b["real_time"] * unit
    return result


def run_numpy_variational(reps, env):
    return run_peer("numpy_variational_em.py", ["--reps", str(reps)], env)["median_s"]


def cmd_variational(args):
    check = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "numpy_variational_em.py"), "--check-cpp",
                            args.bench], capture_output=True, text=True, env=bench_env(args))
    check_ok = check.returncode == 0
    print(f"check against C++: {'pass' if check_ok else 'FAIL'}", file=sys.stderr)
    rounds, cores_rounds = [], []
    for r in range(args.rounds):
        cores_rounds.append(blas.two_cores_available())
        rd = {}
        for retain in (False, True):
            tag = "retain" if retain else "default"
            env = bench_env(args, retain=retain)
            cpp = run_cpp_variational(args.bench, args.repetitions, env)
            rd[f"cpp_t1_{tag}"], rd[f"cpp_t2_{tag}"] = cpp["t1"], cpp["t2"]
            rd[f"cpp_mixed_t1_{tag}"], rd[f"cpp_mixed_t2_{tag}"] = cpp["mixed_t1"], cpp["mixed_t2"]
            rd[f"numpy_{tag}"] = run_numpy_variational(args.numpy_reps, env)
        rounds.append(rd)
        print(f"round {r + 1}: {rd}  two-thread figures {two_core_figure('measured', cores_rounds[-1])}",
              file=sys.stderr)
    seconds = {k: statistics.median(rd[k] for rd in rounds) for k in rounds[0]}
    ratios = {}
    for tag in ("default", "retain"):
        ratios[f"numpy_over_cpp_t1_{tag}"] = statistics.median(rd[f"numpy_{tag}"] / rd[f"cpp_t1_{tag}"]
                                                              for rd in rounds)
        ratios[f"numpy_over_cpp_t2_{tag}"] = median_two_core_ratio(rounds, cores_rounds, f"numpy_{tag}",
                                                                   f"cpp_t2_{tag}")
        ratios[f"cpp_t1_over_t2_{tag}"] = median_two_core_ratio(rounds, cores_rounds, f"cpp_t1_{tag}", f"cpp_t2_{tag}")
        ratios[f"numpy_over_cpp_mixed_t1_{tag}"] = statistics.median(rd[f"numpy_{tag}"] / rd[f"cpp_mixed_t1_{tag}"]
                                                                    for rd in rounds)
        ratios[f"cpp_t1_over_mixed_t1_{tag}"] = statistics.median(rd[f"cpp_t1_{tag}"] / rd[f"cpp_mixed_t1_{tag}"]
                                                                 for rd in rounds)
    result = {
        "machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "check_against_cpp": check_ok, "seconds": seconds, "ratios_median_of_rounds": ratios, "rounds": rounds,
    }
    record_two_cores(result, cores_rounds)
    record_blas(result, args, bench_env(args), args.bench)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


# ---- Distributed EM: strong scaling over MPI ranks (bench_mpi.cpp, docs/SCALING.md) ------------------------------

def cpu_busy(seconds=1.0):
    """Fraction of the machine's CPU time not idle over `seconds` (all cores, from /proc/stat)."""
    def snapshot():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait
    t0, i0 = snapshot()
    time.sleep(seconds)
    t1, i1 = snapshot()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_until_idle(threshold, max_wait):
    """Waits (up to max_wait s) until the busy fraction over 2 s is below threshold; returns the last fraction."""
    start = time.time()
    busy = cpu_busy(2.0)
    while busy > threshold and time.time() - start < max_wait:
        busy = cpu_busy(2.0)
    return busy


def gbench_medians(path):
    """{run_name: {"real_time": s, counters...}}: the median aggregates of a Google Benchmark JSON file (or the
    single run when there is one repetition)."""
    with open(path) as f:
        data = json.load(f)
    runs, medians = {}, {}
    for b in data["benchmarks"]:
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        entry = {k: v for k, v in b.items() if isinstance(v, (int, float)) and k not in ("real_time", "cpu_time")}
        entry["real_time"] = b["real_time"] * unit
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[b["run_name"]] = entry
        else:
            runs.setdefault(b["run_name"], []).append(entry)
    for name, entries in runs.items():
        if name not in medians:
            medians[name] = entries[0] if len(entries) == 1 else {
                k: statistics.median(e[k] for e in entries) for k in entries[0]}
    return medians


def run_mpi_bench(args, ranks, bench_filter, extra=()):
    """Median figures of attnmix_bench_mpi under mpirun -np ranks (one E-step thread per rank)."""
    out = os.path.join(args.tmpdir, f"mpi_np{ranks}.json")
    cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "-x", "OMP_NUM_THREADS"]
    if args.bind:
        cmd += ["--bind-to", args.bind]
    for opt in args.mca or []:
        key, _, value = opt.partition("=")
        cmd += ["--mca", key, value]
    cmd += [args.bench_mpi, f"--benchmark_filter={bench_filter}", f"--benchmark_repetitions={args.repetitions}",
            f"--benchmark_out={out}", "--benchmark_out_format=json", "--benchmark_format=console", *extra]
    run = subprocess.run(cmd, capture_output=True, text=True, check=True, env=bench_env(args))
    if not os.path.getsize(out):
        raise RuntimeError(f"{' '.join(cmd)} wrote no results:\n{run.stdout}{run.stderr}")
    return gbench_medians(out)


def run_single_process(args):
    """{"t1": s, "t2": s}: median real time of BM_EmIteration/threads:k (attnmix_bench, one process)."""
    out = os.path.join(args.tmpdir, "single.json")
    subprocess.run([args.bench, "--benchmark_filter=^BM_EmIteration/", f"--benchmark_repetitions={args.repetitions}",
                    f"--benchmark_out={out}", "--benchmark_out_format=json"],
                   capture_output=True, text=True, check=True, env=bench_env(args, threads=2))
    medians = gbench_medians(out)
    return {f"t{int(name.split('threads:')[1].split('/')[0])}": m["real_time"] for name, m in medians.items()}


def cmd_mpi(args):
    import tempfile
    args.tmpdir = tempfile.mkdtemp(prefix="attnmix_mpi_")
    em_filter = "^BM_MpiEmIteration(Phases)?/" if args.phases else "^BM_MpiEmIteration/"
    rounds = []
    for r in range(args.rounds):
        busy = wait_until_idle(args.idle_below, args.max_wait) if args.idle_below < 1.0 else cpu_busy(2.0)
        rd = {"busy_before": busy, "loadavg_before": os.getloadavg(), "two_cores": blas.two_cores_available()}
        order = (1, 2) if r % 2 == 0 else (2, 1)  # alternate, so a slow stretch does not always hit one of them
        for ranks in order:
            medians = run_mpi_bench(args, ranks, em_filter)
            for name, m in medians.items():
                if name.startswith("BM_MpiEmIterationPhases"):
                    rd[f"phases_np{ranks}"] = {k: m[k] for k in m if k.endswith("_ms")}
                    rd[f"phases_np{ranks}"]["real_time_ms"] = m["real_time"] * 1e3
                elif name.startswith("BM_MpiEmIteration"):
                    rd[f"np{ranks}"] = m["real_time"]
        if not args.no_threads:
            for k, v in run_single_process(args).items():
                rd[k] = v
        rd["busy_after"] = cpu_busy(1.0)
        rd["loadavg_after"] = os.getloadavg()
        rounds.append(rd)
        shown = {k: (round(v * 1e3, 2) if isinstance(v, float) and k[:2] in ("np", "t1", "t2") else v)
                 for k, v in rd.items() if not k.startswith(("phases", "two_cores"))}
        print(f"round {r + 1}: {shown}  two-thread and two-rank figures "
              f"{two_core_figure('measured', rd['two_cores'])}", file=sys.stderr)

    def med(key):
        return statistics.median(rd[key] for rd in rounds)

    cores_rounds = [rd["two_cores"] for rd in rounds]
    ratios = {"np1_over_np2": median_two_core_ratio(rounds, cores_rounds, "np1", "np2")}
    seconds = {"np1": med("np1"), "np2": med("np2")}
    if not args.no_threads:
        ratios["t1_over_t2"] = median_two_core_ratio(rounds, cores_rounds, "t1", "t2")
        ratios["t1_over_np2"] = median_two_core_ratio(rounds, cores_rounds, "t1", "np2")
        ratios["np1_over_t1"] = statistics.median(rd["np1"] / rd["t1"] for rd in rounds)
        seconds.update({"t1": med("t1"), "t2": med("t2")})
    met = not isinstance(ratios["np1_over_np2"], str) and ratios["np1_over_np2"] >= 1.7
    result = {
        "machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "mpirun": subprocess.run([args.mpirun, "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "bind": args.bind or "mpirun default", "repetitions": args.repetitions,
        "seconds_median_of_rounds": seconds, "ratios_median_of_rounds": ratios,
        "target_np1_over_np2": 1.7, "met": met, "rounds": rounds,
    }
    if args.allreduce:
        sweep = {}
        for ranks in (1, 2):
            for name, m in run_mpi_bench(args, ranks, "^BM_MpiAllreduce/").items():
                entries = int(name.split("entries:")[1].split("/")[0])
                sweep.setdefault(f"np{ranks}", {})[entries] = m["real_time"]
        result["allreduce_seconds_by_entries"] = sweep
    record_two_cores(result, cores_rounds)
    record_blas(result, args, bench_env(args), args.bench_mpi, *([] if args.no_threads else [args.bench]))
    text = json.dumps(result, indent=1)
    print(text)
    print(f"1 rank / 2 ranks: {fmt(ratios['np1_over_np2'], 'x')} (median of the measurable of {args.rounds} rounds; "
          f"target 1.7x: {'met' if met else 'NOT met'})", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def cmd_allreduce(args):
    """BM_MpiAllreduce (and BM_MpiAllreducePieces) at each rank count; a fit t = a + bytes / B over 2^14 … 2^20
    entries."""
    import tempfile
    args.tmpdir = tempfile.mkdtemp(prefix="attnmix_allreduce_")
    busy = cpu_busy(2.0)
    cores = blas.two_cores_available()
    result = {"machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "busy_before": busy, "mca": args.mca or [], "seconds": {}, "pieces_seconds": {}, "fit": {}}
    for ranks in args.ranks:
        filt = "^BM_MpiAllreduce(Pieces)?/" if args.pieces else "^BM_MpiAllreduce/"
        for name, m in run_mpi_bench(args, ranks, filt).items():
            entries = int(name.split("entries:")[1].split("/")[0])
            if name.startswith("BM_MpiAllreducePieces"):
                piece = int(name.split("piece:")[1].split("/")[0])
                result["pieces_seconds"].setdefault(f"np{ranks}", {})[f"{entries}/{piece}"] = m["real_time"]
            else:
                result["seconds"].setdefault(f"np{ranks}", {})[entries] = m["real_time"]
        # Fit below the large-message cliff (see docs/SCALING.md): 2^14 ... 2^20 entries.
        pts = [(8 * k, t) for k, t in result["seconds"].get(f"np{ranks}", {}).items() if 1 << 14 <= k <= 1 << 20]
        if ranks > 1 and len(pts) >= 2:
            n = len(pts)
            mx = sum(x for x, _ in pts) / n
            my = sum(y for _, y in pts) / n
            slope = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
            result["fit"][f"np{ranks}"] = {"intercept_s": my - slope * mx, "bytes_per_s": 1.0 / slope}
        small = result["seconds"].get(f"np{ranks}", {}).get(1)
        if small is not None:
            result["fit"].setdefault(f"np{ranks}", {})["one_double_s"] = small
    result["busy_after"] = cpu_busy(1.0)
    result["loadavg_after"] = os.getloadavg()
    multi_rank = [f"np{ranks}" for ranks in args.ranks if ranks > 1]
    for key in multi_rank:
        if key in result["fit"]:
            result["fit"][key] = two_core_figure(result["fit"][key], cores)
    record_two_cores(result, [cores])
    record_blas(result, args, bench_env(args), args.bench_mpi)
    text = json.dumps(result, indent=1)
    print(text)
    for key, curve in result["seconds"].items():
        line = " ".join(f"{k}:{t * 1e6:.1f}us({8 * k / t / 1e9:.2f}GB/s)" for k, t in sorted(curve.items()))
        print(key, two_core_figure(line, cores) if key in multi_rank else line, file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


# ---- Streaming LM spine (bench_spine.cpp vs pytorch_spine.py, issue 8) --------------------------------------------

SPINE_D_MODELS = (32, 128, 256, 512)


def torch_env(args):
    """bench_env with --threads intra-op threads and --retain-freed-memory (spine, moment-closure, torch-module)."""
    return bench_env(args, args.threads, args.retain_freed_memory)


def run_google_benchmark(cmd, tag, env, counters=(), name_of=lambda name: name):
    """{name_of(run_name): {"real_time": s, "cpu_time": s, "items_per_second": ..., each of `counters` present}}: the
    medians over the repetitions of one Google Benchmark program run (`cmd`, which sets the filter and repetitions)
    under `env`. The process's CPU time per iteration is kept too: on a shared machine it moves less."""
    import tempfile
    out = os.path.join(tempfile.gettempdir(), f"attnmix_bench_{os.getpid()}_{tag}.json")
    subprocess.run([*cmd, f"--benchmark_out={out}", "--benchmark_out_format=json"],
                   capture_output=True, text=True, check=True, env=env)
    try:
        with open(out) as f:
            data = json.load(f)
    finally:
        os.remove(out)
    runs = {}
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") != "iteration":
            continue
        unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
        entry = {"real_time": b["real_time"] * unit, "cpu_time": b["cpu_time"] * unit,
                 "items_per_second": b.get("items_per_second", 0.0)}
        entry.update({key: b[key] for key in counters if key in b})
        runs.setdefault(name_of(b["run_name"]), []).append(entry)
    return {name: {k: statistics.median(e[k] for e in entries) for k in entries[0]} for name, entries in runs.items()}


def run_cpp_spine(args, bench_filter, tag):
    """run_google_benchmark of attnmix_bench_spine: medians over --repetitions, keyed by run name."""
    return run_google_benchmark([args.bench_spine, f"--benchmark_filter={bench_filter}",
                                 f"--spine_threads={args.threads}", f"--benchmark_repetitions={args.repetitions}"],
                                f"spine_{tag}", torch_env(args))


def run_pytorch_spine(args, *extra):
    foreach = ["--foreach"] if args.foreach else []
    return run_peer("pytorch_spine.py", ["--threads", str(args.threads), *extra, *foreach], torch_env(args))


def spine_check(args, d_model):
    """The first --check-steps training losses of both implementations; max relative difference."""
    cpp = json.loads(subprocess.run([args.bench_spine, f"--spine_check_losses={args.check_steps}",
                                     f"--spine_d_model={d_model}", f"--spine_threads={args.threads}"],
                                    capture_output=True, text=True, check=True,
                                    env=torch_env(args)).stdout)
    py = run_pytorch_spine(args, "--check", str(args.check_steps), "--d-model", str(d_model))
    rel = max(abs(a - b) / abs(b) for a, b in zip(cpp["losses"], py["losses"]))
    param_rel = abs(cpp["param_sum"] - py["param_sum"]) / max(1e-12, abs(py["param_sum"]))
    return {"cpp_losses": cpp["losses"], "pytorch_losses": py["losses"], "max_rel_loss_difference": rel,
            "param_sum_rel_difference": param_rel, "agree": rel <= 1e-4 and param_rel <= 1e-6}


class SpineServer:
    """One lock-step training server (attnmix_bench_spine --spine_serve=d or pytorch_spine.py --serve)."""

    def __init__(self, cmd, env):
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{' '.join(cmd)} did not start")

    def run(self, steps):
        self.proc.stdin.write(f"{steps}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def spine_lockstep(args, d_model, steps):
    """Both training steps alive at once and alternated `steps` steps at a time (which goes first alternates), so
    that each pair of blocks sees the same load; per pair the C++/PyTorch ratio of tokens/s (wall and CPU)."""
    env = torch_env(args)
    cpp = SpineServer([args.bench_spine, f"--spine_serve={d_model}", f"--spine_threads={args.threads}"], env)
    py_cmd = ["/usr/bin/python3", os.path.join(HERE, "pytorch_spine.py"), "--serve", "--d-model", str(d_model),
              "--threads", str(args.threads)] + (["--foreach"] if args.foreach else [])
    py = SpineServer(py_cmd, env)
    pairs = []
    try:
        for i in range(args.pairs):
            first, second = (cpp, py) if i % 2 == 0 else (py, cpp)
            a, b = first.run(steps), second.run(steps)
            c, p = (a, b) if first is cpp else (b, a)
            pairs.append({"cpp_tokens_per_s": c["tokens_per_s"], "pytorch_tokens_per_s": p["tokens_per_s"],
                          "ratio": p["wall_s"] / c["wall_s"], "ratio_cpu": p["cpu_s"] / c["cpu_s"],
                          "loadavg": os.getloadavg()[0]})
    finally:
        cpp.close()
        py.close()
    ratios = [x["ratio"] for x in pairs]
    return {"steps_per_block": steps, "pairs": pairs, "median_ratio": statistics.median(ratios),
            "median_ratio_cpu": statistics.median(x["ratio_cpu"] for x in pairs),
            "quartiles_ratio": statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios,
            "cpp_tokens_per_s_median": statistics.median(x["cpp_tokens_per_s"] for x in pairs),
            "pytorch_tokens_per_s_median": statistics.median(x["pytorch_tokens_per_s"] for x in pairs)}


def spine_rss(args, implementation, tokens):
    """Peak RSS (KiB) of a streaming evaluation over `tokens` tokens, in a fresh process."""
    if implementation == "cpp":
        return json.loads(subprocess.run([args.bench_spine, f"--spine_rss_tokens={tokens}",
                                          f"--spine_threads={args.threads}"], capture_output=True, text=True,
                                         check=True, env=torch_env(args)).stdout)
    return run_pytorch_spine(args, "--rss-tokens", str(tokens))


def cmd_spine(args):
    result = {"machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "threads": args.threads, "adamw_foreach_in_pytorch": args.foreach,
              "retain_freed_memory": args.retain_freed_memory}
    if args.check_steps > 0:
        result["check"] = {f"d{d}": spine_check(args, d) for d in SPINE_D_MODELS}
        for d in SPINE_D_MODELS:
            c = result["check"][f"d{d}"]
            print(f"loss check d_model {d}: max rel difference {c['max_rel_loss_difference']:.2e} over "
                  f"{args.check_steps} steps ({'agree' if c['agree'] else 'DISAGREE'})", file=sys.stderr)
    ratios = {}
    if args.pairs > 0:
        lockstep = {}
        for d in SPINE_D_MODELS:
            lockstep[f"d{d}"] = spine_lockstep(args, d, args.steps_d32 if d == 32 else args.steps_d256)
            ls = lockstep[f"d{d}"]
            ratios[f"lockstep_cpp_over_pytorch_d{d}"] = ls["median_ratio"]
            ratios[f"lockstep_cpp_over_pytorch_cpu_time_d{d}"] = ls["median_ratio_cpu"]
            print(f"lock-step d_model {d}: C++ {ls['cpp_tokens_per_s_median']:.0f} tokens/s, PyTorch "
                  f"{ls['pytorch_tokens_per_s_median']:.0f} tokens/s; C++/PyTorch median {ls['median_ratio']:.2f} "
                  f"(quartiles {', '.join(f'{q:.2f}' for q in ls['quartiles_ratio'])}; CPU time "
                  f"{ls['median_ratio_cpu']:.2f}) over {args.pairs} pairs", file=sys.stderr)
        result["lockstep"] = lockstep
    rounds = []
    for r in range(args.rounds):
        rd = {"loadavg_before": os.getloadavg()}
        order = ("cpp", "pytorch") if r % 2 == 0 else ("pytorch", "cpp")  # alternate the order of the programs
        for d in SPINE_D_MODELS:  # the two programs back to back at each size, so that both see the same load
            for side in order:
                if side == "cpp":
                    (m,) = run_cpp_spine(args, f"^BM_SpineTrainStep/d_model:{d}/", "train").values()
                    rd[f"cpp_d{d}"] = m["items_per_second"]
                    rd[f"cpp_cpu_d{d}"] = m["items_per_second"] * m["real_time"] / m["cpu_time"]
                else:
                    py = run_pytorch_spine(args, "--d-model", str(d), "--reps", str(args.pytorch_reps),
                                           "--min-time", str(args.min_time))
                    rd[f"pytorch_d{d}"] = py["tokens_per_s"]
                    rd[f"pytorch_cpu_d{d}"] = py["tokens_per_cpu_s"]
        if not args.no_stream:
            for name, m in run_cpp_spine(args, "^BM_SpineStream/", "stream").items():
                n = int(name.split('chunks:')[1].split('/')[0])
                rd[f"stream_{n}_s"], rd[f"stream_{n}_cpu_s"] = m["real_time"], m["cpu_time"]
        rd["loadavg_after"] = os.getloadavg()
        rounds.append(rd)
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rd.items()}
        print(f"round {r + 1}: {shown}", file=sys.stderr)

    def med(key):
        return statistics.median(rd[key] for rd in rounds)

    if rounds:
        ratios.update({f"cpp_over_pytorch_d{d}": statistics.median(rd[f"cpp_d{d}"] / rd[f"pytorch_d{d}"]
                                                                   for rd in rounds) for d in SPINE_D_MODELS})
        ratios.update({f"cpp_over_pytorch_cpu_time_d{d}": statistics.median(
            rd[f"cpp_cpu_d{d}"] / rd[f"pytorch_cpu_d{d}"] for rd in rounds) for d in SPINE_D_MODELS})
        if not args.no_stream:
            ratios["stream_80_over_40"] = statistics.median(rd["stream_80_s"] / rd["stream_40_s"] for rd in rounds)
            ratios["stream_80_over_40_cpu_time"] = statistics.median(rd["stream_80_cpu_s"] / rd["stream_40_cpu_s"]
                                                                     for rd in rounds)
            result["stream_seconds_median_of_rounds"] = {"40": med("stream_40_s"), "80": med("stream_80_s")}
        result["tokens_per_s_median_of_rounds"] = {f"{side}_d{d}": med(f"{side}_d{d}")
                                                   for side in ("cpp", "pytorch", "cpp_cpu", "pytorch_cpu")
                                                   for d in SPINE_D_MODELS}
    result["rounds"] = rounds
    if args.rss_tokens:
        rss = {}
        for implementation in (("cpp", "pytorch") if args.rss_pytorch else ("cpp",)):
            for tokens in args.rss_tokens:
                rss[f"{implementation}_{tokens}"] = spine_rss(args, implementation, tokens)
                print(f"rss {implementation} {tokens} tokens: {rss[f'{implementation}_{tokens}']['max_rss_kib']} KiB",
                      file=sys.stderr)
        result["rss"] = rss
        lo, hi = min(args.rss_tokens), max(args.rss_tokens)
        for implementation in (("cpp", "pytorch") if args.rss_pytorch else ("cpp",)):
            ratios[f"rss_{implementation}_{hi}_over_{lo}"] = (rss[f"{implementation}_{hi}"]["max_rss_kib"] /
                                                              rss[f"{implementation}_{lo}"]["max_rss_kib"])
    result["ratios_median_of_rounds"] = ratios
    result["targets"] = {"cpp_over_pytorch_d32": ">= 1.5", "cpp_over_pytorch_d256": ">= 1.0",
                         "lockstep_cpp_over_pytorch_d32": ">= 1.5", "lockstep_cpp_over_pytorch_d256": ">= 1.0",
                         "stream_80_over_40": "<= 2.3", "rss_cpp_1e6_over_1e5": "<= 1.10"}
    record_blas(result, args, torch_env(args), args.bench_spine)
    text = json.dumps(result, indent=1)
    print(text)
    print("  ".join(f"{k} {v:.3f}" for k, v in ratios.items()), file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


# ---- Moment-closure attention (bench_moment_closure.cpp vs pytorch_moment_closure.py, issue 9) --------------------

MCA_CHUNKS = (64, 16)
MCA_VARIANTS = {"mca": ("BM_MomentClosureTrainStep", []),  # documented defaults: birth_threshold -2, default merge rule
                "busy": ("BM_MomentClosureTrainStepBusy", ["--birth-threshold", "10", "--merge-threshold", "0.2"]),
                "window": ("BM_WindowTrainStep", ["--mechanism", "window"])}
MCA_CHECKS = {"default": ([], []),
              "busy": (["--mca_birth_threshold=10", "--mca_merge_threshold=0.2"],
                       ["--birth-threshold", "10", "--merge-threshold", "0.2"])}


def run_cpp_mca(args, bench_filter, tag, repetitions):
    """{run_name: {"real_time": s, "cpu_time": s, "items_per_second": ..., counters...}}: medians over the
    repetitions of one attnmix_bench_moment_closure run, randomly interleaved."""
    return run_google_benchmark(
        [args.bench_mca, f"--benchmark_filter={bench_filter}", f"--mca_threads={args.threads}",
         f"--benchmark_repetitions={repetitions}", "--benchmark_enable_random_interleaving=true"],
        f"mca_{tag}", torch_env(args),
        counters=("state_bytes", "clusters", "births_per_step", "merges_per_step", "position"),
        name_of=lambda name: name.split("/min_time")[0])


def run_pytorch_mca(args, *extra):
    return run_peer("pytorch_moment_closure.py", ["--threads", str(args.threads), *extra], torch_env(args))


def mca_check(args, dtype, variant):
    """The first --check-steps training losses, events and bank fingerprints of both implementations."""
    cpp_extra, py_extra = MCA_CHECKS[variant]
    cpp = json.loads(subprocess.run([args.bench_mca, f"--mca_check_losses={args.check_steps}", f"--mca_dtype={dtype}",
                                     f"--mca_threads={args.threads}", *cpp_extra],
                                    capture_output=True, text=True, check=True, env=torch_env(args)).stdout)
    py = run_pytorch_mca(args, "--check", str(args.check_steps), "--dtype", dtype, *py_extra)
    rel = max(abs(a - b) / abs(b) for a, b in zip(cpp["losses"], py["losses"]))
    bank_rel = max(abs(a - b) / max(1.0, abs(b)) for la, lb in zip(cpp["bank_sums"], py["bank_sums"])
                   for a, b in zip(la, lb))
    same_events = (cpp["births"] == py["births"] and cpp["merges"] == py["merges"]
                   and cpp["n_clusters"] == py["n_clusters"])
    tol = 1e-4 if dtype == "float32" else 1e-9
    return {"cpp_losses": cpp["losses"], "pytorch_losses": py["losses"], "max_rel_loss_difference": rel,
            "max_bank_sum_difference": bank_rel, "births": py["births"], "merges": py["merges"],
            "same_births_merges_clusters": same_events,
            "param_sum_rel_difference": abs(cpp["param_sum"] - py["param_sum"]) / abs(py["param_sum"]),
            "agree": rel <= tol and bank_rel <= 100 * tol and same_events}


def cmd_moment_closure(args):
    result = {"machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "threads": args.threads, "batch": 8, "window": 16, "chunks": list(MCA_CHUNKS),
              "retain_freed_memory": args.retain_freed_memory}
    if args.check_steps > 0:
        result["check"] = {}
        for dtype in ("float32", "float64"):
            for variant in MCA_CHECKS:
                c = mca_check(args, dtype, variant)
                result["check"][f"{variant}_{dtype}"] = c
                print(f"loss check {variant} {dtype}: max rel loss difference {c['max_rel_loss_difference']:.2e}, "
                      f"bank sums {c['max_bank_sum_difference']:.2e}, births {sum(c['births'])}, merges "
                      f"{sum(c['merges'])} over {args.check_steps} steps "
                      f"({'agree' if c['agree'] else 'DISAGREE'})", file=sys.stderr)
    rounds = []
    for r in range(args.rounds):
        rd = {"busy_before": wait_until_idle(args.idle_below, args.max_wait) if args.idle_below < 1.0 else None,
              "loadavg_before": os.getloadavg()}
        # Per chunk length, the C++ benchmarks (MCA, busy MCA and window interleaved in one process) and the PyTorch
        # figures back to back, the order alternating between rounds: a load change on this shared machine then
        # moves both sides of a ratio.
        for chunk in MCA_CHUNKS:
            for side in (("cpp", "pytorch") if r % 2 == 0 else ("pytorch", "cpp")):
                if side == "cpp":
                    bench_filter = (f"^BM_(MomentClosureTrainStep|MomentClosureTrainStepBusy|WindowTrainStep)"
                                    f"/chunk:{chunk}/")
                    for name, m in run_cpp_mca(args, bench_filter, "train", args.repetitions).items():
                        variant = next(v for v, (bm, _) in MCA_VARIANTS.items() if name.startswith(bm + "/"))
                        rd[f"cpp_{variant}_t{chunk}"] = m["items_per_second"]
                        rd[f"cpp_cpu_{variant}_t{chunk}"] = m["items_per_second"] * m["real_time"] / m["cpu_time"]
                        if variant != "window":
                            rd[f"cpp_births_{variant}_t{chunk}"] = m.get("births_per_step", 0.0)
                            rd[f"cpp_merges_{variant}_t{chunk}"] = m.get("merges_per_step", 0.0)
                else:
                    for variant, (_, extra) in MCA_VARIANTS.items():
                        if variant == "window" and not args.pytorch_window:
                            continue
                        py = run_pytorch_mca(args, "--chunk", str(chunk), "--reps", str(args.pytorch_reps),
                                             "--min-time", str(args.min_time), *extra)
                        rd[f"pytorch_{variant}_t{chunk}"] = py["tokens_per_s"]
                        rd[f"pytorch_cpu_{variant}_t{chunk}"] = py["tokens_per_cpu_s"]
        rd["loadavg_after"] = os.getloadavg()
        rounds.append(rd)
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in rd.items()}
        print(f"round {r + 1}: {shown}", file=sys.stderr)

    def ratio(num, den):
        return statistics.median(rd[num] / rd[den] for rd in rounds)

    ratios = {}
    for chunk in MCA_CHUNKS:
        for variant in ("mca", "busy"):
            ratios[f"cpp_over_pytorch_{variant}_t{chunk}"] = ratio(f"cpp_{variant}_t{chunk}",
                                                                   f"pytorch_{variant}_t{chunk}")
            ratios[f"cpp_over_pytorch_cpu_time_{variant}_t{chunk}"] = ratio(f"cpp_cpu_{variant}_t{chunk}",
                                                                           f"pytorch_cpu_{variant}_t{chunk}")
            ratios[f"cpp_{variant}_over_cpp_window_t{chunk}"] = ratio(f"cpp_{variant}_t{chunk}", f"cpp_window_t{chunk}")
            ratios[f"cpp_{variant}_over_cpp_window_cpu_time_t{chunk}"] = ratio(f"cpp_cpu_{variant}_t{chunk}",
                                                                             f"cpp_cpu_window_t{chunk}")
        if args.pytorch_window:
            ratios[f"cpp_window_over_pytorch_window_t{chunk}"] = ratio(f"cpp_window_t{chunk}",
                                                                       f"pytorch_window_t{chunk}")
            ratios[f"pytorch_mca_over_pytorch_window_t{chunk}"] = ratio(f"pytorch_mca_t{chunk}",
                                                                        f"pytorch_window_t{chunk}")
    result["tokens_per_s_median_of_rounds"] = {
        k: statistics.median(rd[k] for rd in rounds) for k in rounds[0] if k.startswith(("cpp", "pytorch"))}
    result["rounds"] = rounds
    if not args.no_stream:
        # One process streams --stream-tokens tokens (batch 1, no grad), keeps the state after 1e4 tokens and then
        # steps the next chunk from both states alternately: both ends are timed under the same load.
        stream = json.loads(subprocess.run([args.bench_mca, f"--mca_stream_tokens={args.stream_tokens}",
                                            "--mca_stream_early=10000", f"--mca_threads={args.threads}"],
                                           capture_output=True, text=True, check=True,
                                           env=torch_env(args)).stdout)
        result["stream"] = stream
        print(f"stream: {stream}", file=sys.stderr)
        ratios["stream_s_per_token_late_over_early"] = stream["late_over_early"]
        ratios["stream_cpu_s_per_token_late_over_early"] = stream["late_over_early_cpu"]
        ratios["stream_state_bytes_late_over_early"] = stream["state_bytes_late"] / stream["state_bytes_early"]
        ratios["stream_rss_end_over_early"] = stream["rss_end_kib"] / stream["rss_early_kib"]
    result["ratios_median_of_rounds"] = ratios
    result["targets"] = {"cpp_over_pytorch_*": ">= 2.0", "cpp_mca_over_cpp_window_*": ">= 0.5",
                         "stream_*_late_over_early": "within 1.10"}
    record_blas(result, args, torch_env(args), args.bench_mca)
    text = json.dumps(result, indent=1)
    print(text)
    print("  ".join(f"{k} {v:.3f}" for k, v in ratios.items()), file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def cmd_torch_module(args):
    """attnmix.torch's MomentClosureAttention trained from Python against the C++ training step and the PyTorch
    implementation, at each --d-model (issue 19)."""
    os.environ["PYTHONPATH"] = os.path.abspath(args.python_build)
    result = {"machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "threads": args.threads, "batch": 8, "window": 16, "chunk": args.chunk, "d_models": args.d_model,
              "retain_freed_memory": args.retain_freed_memory, "check": {}}
    for d in args.d_model:
        # The same seed, data and settings: the Python-driven module must reproduce the C++ losses exactly.
        cpp = json.loads(subprocess.run([args.bench_mca, f"--mca_check_losses={args.check_steps}",
                                         f"--mca_d_model={d}", f"--mca_chunk={args.chunk}",
                                         f"--mca_threads={args.threads}"], capture_output=True, text=True,
                                        check=True, env=torch_env(args)).stdout)
        py = run_pytorch_mca(args, "--check", str(args.check_steps), "--implementation", "attnmix", "--d-model",
                             str(d), "--chunk", str(args.chunk))
        result["check"][f"d{d}"] = {"cpp": cpp["losses"], "attnmix_torch": py["losses"],
                                    "identical": cpp["losses"] == py["losses"]}
        print(f"d_model {d}: losses of the C++ step and attnmix.torch "
              f"{'identical' if cpp['losses'] == py['losses'] else 'DIFFER'}", file=sys.stderr)
    sides = ("cpp", "attnmix", "pytorch")
    rounds = []
    for r in range(args.rounds):
        rd = {"loadavg_before": os.getloadavg()}
        for d in args.d_model:
            for side in (sides if r % 2 == 0 else sides[::-1]):
                if side == "cpp":
                    bench_filter = f"^BM_MomentClosureTrainStep/chunk:{args.chunk}/"
                    runs = run_google_benchmark(
                        [args.bench_mca, f"--benchmark_filter={bench_filter}", f"--mca_threads={args.threads}",
                         f"--mca_d_model={d}", f"--benchmark_repetitions={args.repetitions}"],
                        "torch_module", torch_env(args), name_of=lambda name: name.split("/min_time")[0])
                    rd[f"cpp_d{d}"] = next(iter(runs.values()))["items_per_second"]
                else:
                    py = run_pytorch_mca(args, "--implementation", side, "--d-model", str(d), "--chunk",
                                         str(args.chunk), "--reps", str(args.pytorch_reps), "--min-time",
                                         str(args.min_time))
                    rd[f"{side}_d{d}"] = py["tokens_per_s"]
        rd["loadavg_after"] = os.getloadavg()
        rounds.append(rd)
        print(f"round {r + 1}: {({k: round(v) if isinstance(v, float) else v for k, v in rd.items()})}",
              file=sys.stderr)
    ratios = {}
    for d in args.d_model:
        for num, den in (("attnmix", "cpp"), ("attnmix", "pytorch"), ("cpp", "pytorch")):
            ratios[f"{num}_over_{den}_d{d}"] = statistics.median(rd[f"{num}_d{d}"] / rd[f"{den}_d{d}"] for rd in rounds)
    result.update(rounds=rounds, ratios=ratios)
    record_blas(result, args, torch_env(args), args.bench_mca)
    print(json.dumps(ratios, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    peer_blas = argparse.ArgumentParser(add_help=False)  # every subcommand that runs programs
    peer_blas.add_argument("--peer-blas", choices=blas.CHOICES, default="openblas",
                           help="the BLAS of the peers and of the C++ program: Debian's OpenBLAS (default) or the "
                                "reference BLAS and LAPACK (first on LD_LIBRARY_PATH)")
    run = sub.add_parser("run", parents=[peer_blas], help="run C++ and its NumPy and PyTorch peers back to back")
    run.add_argument("--bench", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench"))
    run.add_argument("--rounds", type=int, default=3)
    run.add_argument("--repetitions", type=int, default=5, help="Google Benchmark repetitions per round")
    run.add_argument("--numpy-reps", type=int, default=5, help="repetitions of each peer per round")
    run.add_argument("--out", help="save the result as JSON (a baseline for `diff`)")
    run.set_defaults(func=cmd_run)
    diff = sub.add_parser("diff", help="compare two saved results")
    diff.add_argument("baseline")
    diff.add_argument("current")
    diff.set_defaults(func=cmd_diff)
    chained = sub.add_parser("chained", parents=[peer_blas],
                             help="chained attention: C++ vs both NumPy baselines, back to back")
    chained.add_argument("--bench", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench"))
    chained.add_argument("--rounds", type=int, default=3)
    chained.add_argument("--repetitions", type=int, default=3, help="Google Benchmark repetitions per round")
    chained.add_argument("--numpy-reps", type=int, default=3)
    chained.add_argument("--out", help="save the result as JSON")
    chained.set_defaults(func=cmd_chained)
    assign = sub.add_parser("assign", parents=[peer_blas],
                            help="assignment tree: C++ vs scipy's LAP and the seed-004 script")
    assign.add_argument("--bench", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench"))
    assign.add_argument("--rounds", type=int, default=3)
    assign.add_argument("--repetitions", type=int, default=3, help="Google Benchmark repetitions per round")
    assign.add_argument("--min-time", type=float, default=0.3, help="scipy_lap.py seconds of timing per figure")
    assign.add_argument("--seed-script", default=SEED_004, help="seed-004 script (skipped when missing)")
    assign.add_argument("--out", help="save the result as JSON")
    assign.set_defaults(func=cmd_assign)
    variational = sub.add_parser("variational", parents=[peer_blas],
                                 help="variational embedding attention: C++ vs NumPy, back to back")
    variational.add_argument("--bench", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench"))
    variational.add_argument("--rounds", type=int, default=3)
    variational.add_argument("--repetitions", type=int, default=3, help="Google Benchmark repetitions per round")
    variational.add_argument("--numpy-reps", type=int, default=3)
    variational.add_argument("--out", help="save the result as JSON")
    variational.set_defaults(func=cmd_variational)
    mpi = sub.add_parser("mpi", parents=[peer_blas],
                         help="distributed EM: 1 vs 2 MPI ranks and 1 vs 2 threads, back to back")
    mpi.add_argument("--bench-mpi", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench_mpi"))
    mpi.add_argument("--bench", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench"))
    mpi.add_argument("--mpirun", default="mpirun")
    mpi.add_argument("--rounds", type=int, default=5)
    mpi.add_argument("--repetitions", type=int, default=3, help="Google Benchmark repetitions per program and round")
    mpi.add_argument("--bind", choices=["core", "none"], help="mpirun --bind-to (default: mpirun's own: core)")
    mpi.add_argument("--mca", action="append", metavar="KEY=VALUE", help="an mpirun --mca setting (repeatable)")
    mpi.add_argument("--phases", action="store_true", help="also time the phases (BM_MpiEmIterationPhases)")
    mpi.add_argument("--allreduce", action="store_true", help="also sweep BM_MpiAllreduce at 1 and 2 ranks")
    mpi.add_argument("--no-threads", action="store_true", help="skip the single-process BM_EmIteration runs")
    mpi.add_argument("--idle-below", type=float, default=1.0,
                     help="before each round wait until the CPU busy fraction over 2 s is below this (0-1)")
    mpi.add_argument("--max-wait", type=float, default=300.0, help="longest wait for --idle-below, seconds")
    mpi.add_argument("--out", help="save the result as JSON")
    mpi.set_defaults(func=cmd_mpi)
    allreduce = sub.add_parser("allreduce", parents=[peer_blas],
                               help="this machine's MPI_Allreduce: latency and bandwidth by size")
    allreduce.add_argument("--bench-mpi", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench_mpi"))
    allreduce.add_argument("--mpirun", default="mpirun")
    allreduce.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    allreduce.add_argument("--repetitions", type=int, default=3)
    allreduce.add_argument("--bind", choices=["core", "none"])
    allreduce.add_argument("--mca", action="append", metavar="KEY=VALUE", help="an mpirun --mca setting (repeatable)")
    allreduce.add_argument("--pieces", action="store_true", help="also BM_MpiAllreducePieces")
    allreduce.add_argument("--out", help="save the result as JSON")
    allreduce.set_defaults(func=cmd_allreduce)
    spine = sub.add_parser("spine", parents=[peer_blas],
                           help="streaming LM spine: C++ vs PyTorch training tokens/s, E1-3, peak RSS")
    spine.add_argument("--bench-spine",
                       default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench_spine"))
    spine.add_argument("--pairs", type=int, default=15, help="lock-step block pairs per d_model (0: none)")
    spine.add_argument("--steps-d32", type=int, default=10, help="training steps per lock-step block at d_model 32")
    spine.add_argument("--steps-d256", type=int, default=1,
                       help="training steps per lock-step block at d_model 128 and above")
    spine.add_argument("--rounds", type=int, default=3, help="rounds of the Google Benchmark programs (0: none)")
    spine.add_argument("--repetitions", type=int, default=3, help="Google Benchmark repetitions per round")
    spine.add_argument("--pytorch-reps", type=int, default=3, help="pytorch_spine.py timed blocks per round")
    spine.add_argument("--min-time", type=float, default=1.0, help="pytorch_spine.py seconds per timed block")
    spine.add_argument("--threads", type=int, default=1, help="intra-op threads of both (default 1)")
    spine.add_argument("--retain-freed-memory", action="store_true",
                       help="run both programs with glibc told to keep freed memory (what the attnmix CLI sets)")
    spine.add_argument("--foreach", action="store_true", help="PyTorch AdamW(foreach=True)")
    spine.add_argument("--check-steps", type=int, default=8, help="training losses compared (0: no check)")
    spine.add_argument("--no-stream", action="store_true", help="skip BM_SpineStream (E1-3)")
    spine.add_argument("--rss-tokens", type=int, nargs="*", default=[100000, 1000000],
                       help="token counts of the peak-RSS evaluation, one fresh process each (none: skip)")
    spine.add_argument("--rss-pytorch", action="store_true", help="also measure pytorch_spine.py's peak RSS")
    spine.add_argument("--out", help="save the result as JSON")
    spine.set_defaults(func=cmd_spine)
    mca = sub.add_parser("moment-closure", parents=[peer_blas],
                         help="moment-closure attention: C++ vs PyTorch and vs the window-only spine, stream 1e4/1e6")
    mca.add_argument("--bench-mca", default=os.path.join(ROOT, "build-mca-bench", "bench",
                                                         "attnmix_bench_moment_closure"))
    mca.add_argument("--rounds", type=int, default=5)
    mca.add_argument("--repetitions", type=int, default=3, help="Google Benchmark repetitions per round")
    mca.add_argument("--pytorch-reps", type=int, default=3, help="pytorch_moment_closure.py timed blocks per figure")
    mca.add_argument("--min-time", type=float, default=1.0, help="pytorch_moment_closure.py seconds per timed block")
    mca.add_argument("--threads", type=int, default=1, help="intra-op threads of both (default 1)")
    mca.add_argument("--retain-freed-memory", action="store_true",
                     help="run both programs with glibc told to keep freed memory (what the attnmix CLI sets)")
    mca.add_argument("--check-steps", type=int, default=10, help="training losses compared (0: no check)")
    mca.add_argument("--pytorch-window", action="store_true", help="also time the PyTorch window-only spine")
    mca.add_argument("--idle-below", type=float, default=1.0,
                     help="before each round wait until the CPU busy fraction over 2 s is below this (0-1)")
    mca.add_argument("--max-wait", type=float, default=120.0, help="longest wait for --idle-below, seconds")
    mca.add_argument("--no-stream", action="store_true", help="skip the streaming evaluation (1e4 vs 1e6 tokens)")
    mca.add_argument("--stream-tokens", type=int, default=1000000,
                     help="tokens of the streaming evaluation (its early end is 1e4 tokens)")
    mca.add_argument("--out", help="save the result as JSON")
    mca.set_defaults(func=cmd_moment_closure)
    tm = sub.add_parser("torch-module", parents=[peer_blas],
                        help="attnmix.torch's module trained from Python vs the C++ step and PyTorch")
    tm.add_argument("--bench-mca", default=os.path.join(ROOT, "build", "bench", "attnmix_bench_moment_closure"))
    tm.add_argument("--python-build", default=os.path.join(ROOT, "build", "python"),
                    help="the build tree's python directory (holds the attnmix package with attnmix._torch)")
    tm.add_argument("--d-model", type=int, nargs="+", default=[32, 128])
    tm.add_argument("--chunk", type=int, default=64)
    tm.add_argument("--rounds", type=int, default=3)
    tm.add_argument("--repetitions", type=int, default=3, help="Google Benchmark repetitions per round")
    tm.add_argument("--pytorch-reps", type=int, default=3, help="timed blocks per Python figure")
    tm.add_argument("--min-time", type=float, default=1.0, help="seconds per timed Python block")
    tm.add_argument("--threads", type=int, default=1, help="intra-op threads of every side (default 1)")
    tm.add_argument("--check-steps", type=int, default=10, help="training losses compared")
    tm.add_argument("--retain-freed-memory", action="store_true",
                    help="run every program with glibc told to keep freed memory (what the attnmix CLI sets)")
    tm.add_argument("--out", help="save the result as JSON")
    tm.set_defaults(func=cmd_torch_module)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
