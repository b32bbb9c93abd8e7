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
  /usr/bin/python3 bench/compare.py allreduce [--bench-mpi build-bench/bench/attnmix_bench_mpi] [--ranks 1 2]
                                              [--pieces] [--mca KEY=VALUE] [--out FILE]

`run` alternates the two programs `--rounds` times (the machine is shared and noisy, so only ratios
measured in the same run are compared) and reports, per program, the median over rounds of each
round's figure: the C++ figure is Google Benchmark's median real time of BM_EmIteration/threads:k over
its repetitions, the NumPy figure is numpy_ra_em.py's median over its repetitions.

`mpi` (docs/SCALING.md) runs, in each round, BM_MpiEmIteration under `mpirun -np 1` and `-np 2` (one E-step thread
per rank, OMP_NUM_THREADS=1) and the single-process BM_EmIteration/threads:1 and /threads:2, and prints the
1-rank/2-rank and 1-thread/2-thread ratios (medians of the per-round ratios), the CPU busy fraction before each
round and the load average.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

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


def run_cpp(bench, repetitions):
    out = subprocess.run(
        [bench, "--benchmark_filter=^BM_EmIteration/", "--benchmark_format=json",
         f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true"],
        capture_output=True, text=True, check=True).stdout
    result = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            threads = int(b["run_name"].split("threads:")[1].split("/")[0])
            unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
            result[threads] = b["real_time"] * unit
    return result


def run_numpy(reps):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "numpy_ra_em.py"), "--reps", str(reps)],
                         capture_output=True, text=True, check=True, env=env).stdout
    data = json.loads(out)
    return {name: v["median_s"] for name, v in data["variants"].items()}


def cmd_run(args):
    cpp_rounds, np_rounds = [], []
    for r in range(args.rounds):
        cpp_rounds.append(run_cpp(args.bench, args.repetitions))
        np_rounds.append(run_numpy(args.numpy_reps))
        print(f"round {r + 1}: C++ {cpp_rounds[-1]}  NumPy {np_rounds[-1]}", file=sys.stderr)
    cpp = {k: statistics.median(rd[k] for rd in cpp_rounds) for k in cpp_rounds[0]}
    npy = {k: statistics.median(rd[k] for rd in np_rounds) for k in np_rounds[0]}
    best_np = min(npy.values())
    result = {
        "machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpp_seconds_by_threads": cpp, "numpy_seconds_by_variant": npy,
        "rounds": {"cpp": cpp_rounds, "numpy": np_rounds},
        "ratios": {
            "numpy_chunked_over_cpp_1_thread": npy.get("chunked", float("nan")) / cpp[1],
            "numpy_presorted_over_cpp_1_thread": npy.get("presorted", float("nan")) / cpp[1],
            "numpy_best_over_cpp_1_thread": best_np / cpp[1],
            "cpp_1_thread_over_2_threads": cpp[1] / cpp[2] if 2 in cpp else float("nan"),
        },
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def cmd_diff(args):
    with open(args.baseline) as f:
        base = json.load(f)
    with open(args.current) as f:
        cur = json.load(f)
    print(f"baseline {base['revision']} on {base['machine']['cpu']} ({base['date']})")
    print(f"current  {cur['revision']} on {cur['machine']['cpu']} ({cur['date']})")
    for key in ("cpp_seconds_by_threads", "numpy_seconds_by_variant"):
        for name in sorted(set(base[key]) | set(cur[key])):
            b, c = base[key].get(name), cur[key].get(name)
            if b is None or c is None:
                print(f"  {key}[{name}]: {b} -> {c}")
            else:
                print(f"  {key}[{name}]: {b * 1e3:9.2f} ms -> {c * 1e3:9.2f} ms  ({c / b:5.2f}x)")
    for name in sorted(set(base["ratios"]) | set(cur["ratios"])):
        print(f"  ratio {name}: {base['ratios'].get(name, float('nan')):.2f} -> "
              f"{cur['ratios'].get(name, float('nan')):.2f}")


# ---- Chained attention (bench_chained.cpp vs numpy_chained_em.py) -------------------------------------------------

def run_cpp_chained(bench, repetitions):
    """{(hops, threads): median seconds of BM_ChainedEmIteration} from one Google Benchmark run."""
    out = subprocess.run(
        [bench, "--benchmark_filter=^BM_ChainedEmIteration/", "--benchmark_format=json",
         f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true"],
        capture_output=True, text=True, check=True).stdout
    result = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            name = b["run_name"]
            hops = int(name.split("hops:")[1].split("/")[0])
            threads = int(name.split("threads:")[1].split("/")[0])
            unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
            result[f"L{hops}_t{threads}"] = b["real_time"] * unit
    return result


def run_numpy_chained(hops, reps):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "numpy_chained_em.py"), "--hops", str(hops),
                          "--reps", str(reps)], capture_output=True, text=True, check=True, env=env).stdout
    return {f"L{hops}_{name}": v for name, v in json.loads(out)["median_s"].items()}


def cmd_chained(args):
    check = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "numpy_chained_em.py"), "--check-cpp",
                            args.bench], capture_output=True, text=True)
    check_ok = check.returncode == 0
    print(f"check against C++: {'pass' if check_ok else 'FAIL'}", file=sys.stderr)
    cpp_rounds, np_rounds = [], []
    for r in range(args.rounds):
        cpp_rounds.append(run_cpp_chained(args.bench, args.repetitions))
        npy = {}
        for hops in (2, 3):
            npy.update(run_numpy_chained(hops, args.numpy_reps))
        np_rounds.append(npy)
        print(f"round {r + 1}: C++ {cpp_rounds[-1]}  NumPy {np_rounds[-1]}", file=sys.stderr)
    cpp = {k: statistics.median(rd[k] for rd in cpp_rounds) for k in cpp_rounds[0]}
    npy = {k: statistics.median(rd[k] for rd in np_rounds) for k in np_rounds[0]}
    ratios = {}
    for hops in (2, 3):
        for variant in ("reference", "materialised", "onehot"):
            key = f"L{hops}_{variant}"
            per_round = [rn[key] / rc[f"L{hops}_t1"] for rc, rn in zip(cpp_rounds, np_rounds)]
            ratios[f"numpy_{variant}_over_cpp_1_thread_L{hops}"] = statistics.median(per_round)
            per_round = [rn[key] / rc[f"L{hops}_t2"] for rc, rn in zip(cpp_rounds, np_rounds)]
            ratios[f"numpy_{variant}_over_cpp_2_threads_L{hops}"] = statistics.median(per_round)
        ratios[f"cpp_1_thread_over_2_threads_L{hops}"] = statistics.median(
            rc[f"L{hops}_t1"] / rc[f"L{hops}_t2"] for rc in cpp_rounds)
    result = {
        "machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "check_against_cpp": check_ok,
        "cpp_seconds": cpp, "numpy_seconds": npy, "ratios_median_of_rounds": ratios,
        "rounds": {"cpp": cpp_rounds, "numpy": np_rounds},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


# ---- Assignment-tree attention (bench_assign.cpp vs scipy_lap.py and the seed-004 script) ------------------------

SEED_004 = "/work/shared/seeds/004_assignment_tree_experiment.py"


def run_cpp_assign(bench, repetitions):
    """{name: median seconds} and {lap shape: optimal cost} from one Google Benchmark run of BM_Assign*."""
    out = subprocess.run(
        [bench, "--benchmark_filter=^BM_Assign", "--benchmark_format=json",
         f"--benchmark_repetitions={repetitions}"],
        capture_output=True, text=True, check=True).stdout
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


def run_python_assign(seed_script, min_time):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = ["/usr/bin/python3", os.path.join(HERE, "scipy_lap.py"), "--min-time", str(min_time)]
    if seed_script:
        cmd += ["--seed-script", seed_script]
    data = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout)
    seconds = {f"lap_{k}": v["seconds"] for k, v in data["lap"].items()}
    seconds["frequency_estimate_K128"] = data["frequency_estimate_K128_s"]
    if data["seed_script_s"] is not None:
        seconds["experiment"] = data["seed_script_s"]
    return seconds, {k: v["cost"] for k, v in data["lap"].items()}


def cmd_assign(args):
    cpp_rounds, py_rounds, cost_ok = [], [], True
    seed_script = args.seed_script if os.path.exists(args.seed_script) else None
    for r in range(args.rounds):
        cpp, cpp_cost = run_cpp_assign(args.bench, args.repetitions)
        py, py_cost = run_python_assign(seed_script, args.min_time)
        for shape, c in py_cost.items():
            if cpp_cost.get(shape) is None or abs(cpp_cost[shape] - c) > 1e-9 * max(1.0, abs(c)):
                cost_ok = False
        cpp_rounds.append(cpp)
        py_rounds.append(py)
        print(f"round {r + 1}: C++ {cpp}  Python {py}", file=sys.stderr)
    ratios = {}
    for key in cpp_rounds[0]:
        if key.startswith("lap_") or key == "frequency_estimate_K128":
            ratios[f"scipy_over_cpp_{key}"] = statistics.median(p[key] / c[key] for c, p in zip(cpp_rounds, py_rounds))
    if "experiment" in py_rounds[0]:
        for key in cpp_rounds[0]:
            if key.startswith("experiment_t"):
                ratios[f"seed_script_over_cpp_{key}"] = statistics.median(
                    p["experiment"] / c[key] for c, p in zip(cpp_rounds, py_rounds))
    result = {
        "machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "optimal_costs_agree": cost_ok,
        "cpp_seconds": {k: statistics.median(rd[k] for rd in cpp_rounds) for k in cpp_rounds[0]},
        "python_seconds": {k: statistics.median(rd[k] for rd in py_rounds) for k in py_rounds[0]},
        "ratios_median_of_rounds": ratios,
        "rounds": {"cpp": cpp_rounds, "python": py_rounds},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


# ---- Variational embedding attention (bench_variational.cpp vs numpy_variational_em.py) ----------------------------

# glibc's allocator told to keep freed memory (core/allocator.hpp, what the attnmix CLI sets at start-up); the
# comparison is run both with the default allocator and with this setting for BOTH programs.
RETAIN_FREED_MEMORY = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967295"


def allocator_env(retain):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("GLIBC_TUNABLES", None)
    if retain:
        env["GLIBC_TUNABLES"] = RETAIN_FREED_MEMORY
    return env


def run_cpp_variational(bench, repetitions, retain):
    """{"t1": s, "t2": s}: median real time of BM_VariationalEmIteration/threads:k from one run."""
    out = subprocess.run(
        [bench, "--benchmark_filter=^BM_VariationalEmIteration/", "--benchmark_format=json",
         f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true"],
        capture_output=True, text=True, check=True, env=allocator_env(retain)).stdout
    result = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            threads = int(b["run_name"].split("threads:")[1].split("/")[0])
            unit = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b["time_unit"]]
            result[f"t{threads}"] = b["real_time"] * unit
    return result


def run_numpy_variational(reps, retain):
    out = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "numpy_variational_em.py"), "--reps", str(reps)],
                         capture_output=True, text=True, check=True, env=allocator_env(retain)).stdout
    return json.loads(out)["median_s"]


def cmd_variational(args):
    check = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "numpy_variational_em.py"), "--check-cpp",
                            args.bench], capture_output=True, text=True)
    check_ok = check.returncode == 0
    print(f"check against C++: {'pass' if check_ok else 'FAIL'}", file=sys.stderr)
    rounds = []
    for r in range(args.rounds):
        rd = {}
        for retain in (False, True):
            tag = "retain" if retain else "default"
            cpp = run_cpp_variational(args.bench, args.repetitions, retain)
            rd[f"cpp_t1_{tag}"], rd[f"cpp_t2_{tag}"] = cpp["t1"], cpp["t2"]
            rd[f"numpy_{tag}"] = run_numpy_variational(args.numpy_reps, retain)
        rounds.append(rd)
        print(f"round {r + 1}: {rd}", file=sys.stderr)
    seconds = {k: statistics.median(rd[k] for rd in rounds) for k in rounds[0]}
    ratios = {}
    for tag in ("default", "retain"):
        for t in ("t1", "t2"):
            ratios[f"numpy_over_cpp_{t}_{tag}"] = statistics.median(rd[f"numpy_{tag}"] / rd[f"cpp_{t}_{tag}"]
                                                                   for rd in rounds)
        ratios[f"cpp_t1_over_t2_{tag}"] = statistics.median(rd[f"cpp_t1_{tag}"] / rd[f"cpp_t2_{tag}"] for rd in rounds)
    result = {
        "machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "check_against_cpp": check_ok, "seconds": seconds, "ratios_median_of_rounds": ratios, "rounds": rounds,
    }
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
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = os.path.join(args.tmpdir, f"mpi_np{ranks}.json")
    cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "-x", "OMP_NUM_THREADS"]
    if args.bind:
        cmd += ["--bind-to", args.bind]
    for opt in args.mca or []:
        key, _, value = opt.partition("=")
        cmd += ["--mca", key, value]
    cmd += [args.bench_mpi, f"--benchmark_filter={bench_filter}", f"--benchmark_repetitions={args.repetitions}",
            f"--benchmark_out={out}", "--benchmark_out_format=json", "--benchmark_format=console", *extra]
    run = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    if not os.path.getsize(out):
        raise RuntimeError(f"{' '.join(cmd)} wrote no results:\n{run.stdout}{run.stderr}")
    return gbench_medians(out)


def run_single_process(args):
    """{"t1": s, "t2": s}: median real time of BM_EmIteration/threads:k (attnmix_bench, one process)."""
    out = os.path.join(args.tmpdir, "single.json")
    subprocess.run([args.bench, "--benchmark_filter=^BM_EmIteration/", f"--benchmark_repetitions={args.repetitions}",
                    f"--benchmark_out={out}", "--benchmark_out_format=json"],
                   capture_output=True, text=True, check=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
    medians = gbench_medians(out)
    return {f"t{int(name.split('threads:')[1].split('/')[0])}": m["real_time"] for name, m in medians.items()}


def cmd_mpi(args):
    import tempfile
    args.tmpdir = tempfile.mkdtemp(prefix="attnmix_mpi_")
    em_filter = "^BM_MpiEmIteration(Phases)?/" if args.phases else "^BM_MpiEmIteration/"
    rounds = []
    for r in range(args.rounds):
        busy = wait_until_idle(args.idle_below, args.max_wait) if args.idle_below < 1.0 else cpu_busy(2.0)
        rd = {"busy_before": busy, "loadavg_before": os.getloadavg()}
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
                 for k, v in rd.items() if not k.startswith("phases")}
        print(f"round {r + 1}: {shown}", file=sys.stderr)

    def med(key):
        return statistics.median(rd[key] for rd in rounds)

    ratios = {"np1_over_np2": statistics.median(rd["np1"] / rd["np2"] for rd in rounds)}
    seconds = {"np1": med("np1"), "np2": med("np2")}
    if not args.no_threads:
        ratios["t1_over_t2"] = statistics.median(rd["t1"] / rd["t2"] for rd in rounds)
        ratios["t1_over_np2"] = statistics.median(rd["t1"] / rd["np2"] for rd in rounds)
        ratios["np1_over_t1"] = statistics.median(rd["np1"] / rd["t1"] for rd in rounds)
        seconds.update({"t1": med("t1"), "t2": med("t2")})
    result = {
        "machine": machine(), "revision": revision(), "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "mpirun": subprocess.run([args.mpirun, "--version"], capture_output=True, text=True).stdout.splitlines()[0],
        "bind": args.bind or "mpirun default", "repetitions": args.repetitions,
        "seconds_median_of_rounds": seconds, "ratios_median_of_rounds": ratios,
        "target_np1_over_np2": 1.7, "met": ratios["np1_over_np2"] >= 1.7, "rounds": rounds,
    }
    if args.allreduce:
        sweep = {}
        for ranks in (1, 2):
            for name, m in run_mpi_bench(args, ranks, "^BM_MpiAllreduce/").items():
                entries = int(name.split("entries:")[1].split("/")[0])
                sweep.setdefault(f"np{ranks}", {})[entries] = m["real_time"]
        result["allreduce_seconds_by_entries"] = sweep
    text = json.dumps(result, indent=1)
    print(text)
    print(f"1 rank / 2 ranks: {ratios['np1_over_np2']:.2f}x (median of {args.rounds} rounds; target 1.7x: "
          f"{'met' if result['met'] else 'NOT met'})", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def cmd_allreduce(args):
    """BM_MpiAllreduce (and BM_MpiAllreducePieces) at each rank count; a fit t = a + bytes / B over 2^14 … 2^20
    entries."""
    import tempfile
    args.tmpdir = tempfile.mkdtemp(prefix="attnmix_allreduce_")
    busy = cpu_busy(2.0)
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
    text = json.dumps(result, indent=1)
    print(text)
    for key, curve in result["seconds"].items():
        print(key, " ".join(f"{k}:{t * 1e6:.1f}us({8 * k / t / 1e9:.2f}GB/s)" for k, t in sorted(curve.items())),
              file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run C++ and NumPy back to back")
    run.add_argument("--bench", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench"))
    run.add_argument("--rounds", type=int, default=3)
    run.add_argument("--repetitions", type=int, default=5, help="Google Benchmark repetitions per round")
    run.add_argument("--numpy-reps", type=int, default=5)
    run.add_argument("--out", help="save the result as JSON (a baseline for `diff`)")
    run.set_defaults(func=cmd_run)
    diff = sub.add_parser("diff", help="compare two saved results")
    diff.add_argument("baseline")
    diff.add_argument("current")
    diff.set_defaults(func=cmd_diff)
    chained = sub.add_parser("chained", help="chained attention: C++ vs both NumPy baselines, back to back")
    chained.add_argument("--bench", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench"))
    chained.add_argument("--rounds", type=int, default=3)
    chained.add_argument("--repetitions", type=int, default=3, help="Google Benchmark repetitions per round")
    chained.add_argument("--numpy-reps", type=int, default=3)
    chained.add_argument("--out", help="save the result as JSON")
    chained.set_defaults(func=cmd_chained)
    assign = sub.add_parser("assign", help="assignment tree: C++ vs scipy's LAP and the seed-004 script")
    assign.add_argument("--bench", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench"))
    assign.add_argument("--rounds", type=int, default=3)
    assign.add_argument("--repetitions", type=int, default=3, help="Google Benchmark repetitions per round")
    assign.add_argument("--min-time", type=float, default=0.3, help="scipy_lap.py seconds of timing per figure")
    assign.add_argument("--seed-script", default=SEED_004, help="seed-004 script (skipped when missing)")
    assign.add_argument("--out", help="save the result as JSON")
    assign.set_defaults(func=cmd_assign)
    variational = sub.add_parser("variational", help="variational embedding attention: C++ vs NumPy, back to back")
    variational.add_argument("--bench", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench"))
    variational.add_argument("--rounds", type=int, default=3)
    variational.add_argument("--repetitions", type=int, default=3, help="Google Benchmark repetitions per round")
    variational.add_argument("--numpy-reps", type=int, default=3)
    variational.add_argument("--out", help="save the result as JSON")
    variational.set_defaults(func=cmd_variational)
    mpi = sub.add_parser("mpi", help="distributed EM: 1 vs 2 MPI ranks and 1 vs 2 threads, back to back")
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
    allreduce = sub.add_parser("allreduce", help="this machine's MPI_Allreduce: latency and bandwidth by size")
    allreduce.add_argument("--bench-mpi", default=os.path.join(ROOT, "build-bench", "bench", "attnmix_bench_mpi"))
    allreduce.add_argument("--mpirun", default="mpirun")
    allreduce.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    allreduce.add_argument("--repetitions", type=int, default=3)
    allreduce.add_argument("--bind", choices=["core", "none"])
    allreduce.add_argument("--mca", action="append", metavar="KEY=VALUE", help="an mpirun --mca setting (repeatable)")
    allreduce.add_argument("--pieces", action="store_true", help="also BM_MpiAllreducePieces")
    allreduce.add_argument("--out", help="save the result as JSON")
    allreduce.set_defaults(func=cmd_allreduce)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
