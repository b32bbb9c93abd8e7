# SPDX-License-Identifier: Apache-2.0
"""The BLAS environment of benchmark processes: which BLAS the NumPy/PyTorch/scipy peers and the C++ benchmark
programs load, how many threads it runs, and what each process actually loaded.

Debian's libblas.so.3 / liblapack.so.3 are alternatives: OpenBLAS (libopenblas0-pthread, priority 100) is what a
process loads by default; Debian's reference (netlib) BLAS and LAPACK stay in their own directories, and a process
started with those first on LD_LIBRARY_PATH loads them instead (libtorch too: its sgemm_ binds to libblas.so.3, and
libopenblas.so.0 is only loaded as a dependency of the OpenBLAS libblas.so.3). The dynamic loader reads
LD_LIBRARY_PATH once, when a process starts, so the BLAS is chosen by whoever starts the process (peer_env).

attnmix's E-step kernels are hand-written (vector code, no BLAS). Its binaries that link libtorch use the BLAS for
libtorch's operations and for the spine's and moment closure's dense products, which call CBLAS directly when the
BLAS is OpenBLAS and run on Eigen otherwise (src/stream/dense_products_impl.hpp): attnmix_bench_spine,
attnmix_bench_moment_closure, attnmix.torch; attnmix_bench links none.
"""
import ctypes
import json
import os
import subprocess
import sys
import sysconfig
import time

LIBDIR = os.path.join("/usr/lib", sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu")
REFERENCE_DIRS = (os.path.join(LIBDIR, "blas"), os.path.join(LIBDIR, "lapack"))  # Debian's netlib BLAS, LAPACK
CHOICES = ("openblas", "reference")
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# Processor-specific OpenBLAS/BLAS settings (OPENBLAS_CORETYPE, OPENBLAS_VERBOSE, GOTOBLAS_*, this machine's
# NVPL_BLAS_DEBUG_CPU_TYPE, ...): unset, so that OpenBLAS picks its kernels for this processor by itself.
TUNING_PREFIXES = ("OPENBLAS_", "GOTOBLAS_", "GOTO_", "NVPL_BLAS_")
KERNELS = ("attnmix's E-step kernels are hand-written; the BLAS serves libtorch operations and the dense products of "
           "the spine and moment closure (CBLAS on OpenBLAS, Eigen otherwise)")
TWO_CORES_THRESHOLD = 0.9  # two busy processes each at >= 90 % of one alone: two cores are free


# ---- The environment ----------------------------------------------------------------------------------------------

def tuning_variables(environ=os.environ):
    """The names in `environ` that peer_env removes: every processor-specific BLAS tuning variable."""
    return sorted(name for name in environ if name.startswith(TUNING_PREFIXES) and name not in THREAD_VARIABLES)


def library_path(current, blas):
    """LD_LIBRARY_PATH that selects `blas`: the reference directories first for "reference", absent for "openblas"."""
    if blas not in CHOICES:
        raise ValueError(f"unknown BLAS {blas!r} (one of {', '.join(CHOICES)})")
    kept = [d for d in current.split(":") if d and d not in REFERENCE_DIRS]
    return ":".join((list(REFERENCE_DIRS) if blas == "reference" else []) + kept)


def peer_env(threads=1, blas="openblas"):
    """A copy of os.environ for a benchmark process: `threads` BLAS/OpenMP threads, no tuning variables, and `blas`
    ("openblas": Debian's default alternative; "reference": the netlib BLAS and LAPACK)."""
    unset = tuning_variables()
    env = {name: value for name, value in os.environ.items() if name not in unset}
    env.update({name: str(threads) for name in THREAD_VARIABLES})
    path = library_path(env.get("LD_LIBRARY_PATH", ""), blas)
    if path:
        env["LD_LIBRARY_PATH"] = path
    else:
        env.pop("LD_LIBRARY_PATH", None)
    return env


def prepare_peer_process(threads=1):
    """Called by a peer script before it imports numpy or torch (their BLAS reads these variables when it loads):
    thread variables the caller left unset default to `threads` (compare.py sets them: peer_env), and the tuning
    variables are removed. The BLAS library itself was chosen when this process started (LD_LIBRARY_PATH)."""
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, str(threads))
    for name in tuning_variables():
        del os.environ[name]


# ---- What a process loads -----------------------------------------------------------------------------------------

def is_blas_library(path):
    """True for a BLAS, LAPACK or OpenBLAS shared library (not, e.g., scipy's _fblas extension module)."""
    name = os.path.basename(path)
    return name.startswith("lib") and ("blas" in name or "lapack" in name)


def openblas_info(path):
    """OpenBLAS's own account of itself, from the library at `path` (loaded already, or loaded now)."""
    lib = ctypes.CDLL(path)
    lib.openblas_get_config.restype = ctypes.c_char_p
    lib.openblas_get_corename.restype = ctypes.c_char_p
    return {"library": path, "config": lib.openblas_get_config().decode(),
            "corename": lib.openblas_get_corename().decode(), "num_threads": lib.openblas_get_num_threads()}


def mapped_libraries():
    """The resolved paths of the BLAS/LAPACK libraries mapped into this process (/proc/self/maps)."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/") and is_blas_library(fields[5].strip()):
                paths.add(os.path.realpath(fields[5].strip()))
    return sorted(paths)


def blas_record(libraries, openblas_of):
    """{"libraries": paths, "openblas": openblas_of(the OpenBLAS library) or None when none is among them}."""
    openblas = next((p for p in libraries if "openblas" in os.path.basename(p)), None)
    return {"libraries": libraries, "openblas": openblas_of(openblas) if openblas else None}


def loaded_blas():
    """The BLAS this process loaded: for a peer script to call after importing numpy or torch, and to include in
    its JSON output under "blas"."""
    return blas_record(mapped_libraries(), openblas_info)


def linked_libraries(binary, env):
    """{soname: resolved path} of the libraries `binary` loads under `env`, from ldd (the binary is not run)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True, env=env).stdout
    libraries = {}
    for line in out.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        path = rest.split(" (")[0]
        if arrow and path.startswith("/"):
            libraries[name] = os.path.realpath(path)
    return libraries


def openblas_info_under(env):
    """openblas_info as a function of the path, each call in a short subprocess under `env` (the thread count and
    kernel OpenBLAS picks there): this file run as a script."""
    def info(path):
        return json.loads(subprocess.run([sys.executable, os.path.abspath(__file__), path], capture_output=True,
                                         text=True, check=True, env=env).stdout)
    return info


def binary_blas(binary, env):
    """The BLAS a C++ benchmark binary loads under `env`, determined without running it: the resolved BLAS/LAPACK
    libraries ldd finds, OpenBLAS's core name and config when it is one of them, and what uses it."""
    linked = linked_libraries(binary, env)
    record = blas_record(sorted(p for p in linked.values() if is_blas_library(p)), openblas_info_under(env))
    uses_torch = any(name.startswith("libtorch") for name in linked)
    used_by = "libtorch operations and dense products" if uses_torch else "none"
    return {"binary": os.path.abspath(binary), "used_by": used_by, "kernels": KERNELS, **record}


def describe(record):
    """One phrase naming the BLAS and kernel of a record (loaded_blas or binary_blas)."""
    openblas = record["openblas"]
    if openblas:
        version = openblas["config"].split()[1]
        threads = f"{openblas['num_threads']} {'thread' if openblas['num_threads'] == 1 else 'threads'}"
        text = f"OpenBLAS {version}, {openblas['corename']} kernels, {threads}"
    elif record["libraries"] and all(os.path.dirname(p) in REFERENCE_DIRS for p in record["libraries"]):
        text = "reference BLAS/LAPACK"
    else:
        text = ", ".join(record["libraries"]) or "no BLAS"
    if "used_by" not in record:
        return text
    return f"{text} in {record['used_by']}" if record["used_by"] != "none" else f"{text} (hand-written kernels only)"


# ---- Thread honesty -----------------------------------------------------------------------------------------------

# A pure-Python busy loop (no BLAS, no numpy): waits until the wall-clock time argv[1], counts loop turns until
# argv[1] + argv[2], prints the turns per second of its own loop time (0 for a process that started too late).
BUSY_LOOP = """import sys, time
start, seconds = float(sys.argv[1]), float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
begin, turns = time.time(), 0
while time.time() < start + seconds:
    turns += 1
print(turns / max(time.time() - begin, 1e-9))
"""


def busy_rates(processes, seconds):
    """The loop rates of `processes` copies of BUSY_LOOP started together and run over the same `seconds`."""
    start = time.time() + 0.5  # every process started and waiting before the loops begin
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(start), str(seconds)], stdout=subprocess.PIPE,
                              text=True) for _ in range(processes)]
    return [float(p.communicate()[0]) for p in procs]


def two_cores_available(seconds=1.0):
    """Whether two cores are free now: a busy loop alone, then two at once; "ratio" is the slower concurrent rate
    over the solo rate, "available" whether it is at least TWO_CORES_THRESHOLD."""
    (solo,) = busy_rates(1, seconds)
    concurrent = busy_rates(2, seconds)
    ratio = min(concurrent) / solo
    return {"ratio": ratio, "available": ratio >= TWO_CORES_THRESHOLD, "solo_per_s": solo,
            "concurrent_per_s": concurrent, "seconds": seconds}


if __name__ == "__main__":  # blas.py LIBRARY: openblas_info(LIBRARY) as JSON (for openblas_info_under)
    print(json.dumps(openblas_info(sys.argv[1])))
