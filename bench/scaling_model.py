#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Cost model of one distributed responsibility-attention EM iteration (docs/SCALING.md): prints the tables.

  T(P) = T_rows(n/P) + T_fixed + T_AR(M, P) + T_M + T_small(P)

  T_rows(r) = r·c_row + (ceil(r / chunk_rows) − 1)·c_chunk      the E-step work that shrinks with P (one thread)
  T_fixed   = c_fixed + c_chunk                                  the E-step's per-call work on the statistics
                                                                 (zeroing, first chunk's merge, final merge): O(M)
  (measured inputs: bench_mpi.cpp BM_LargeEStep; T_E(r) = T_rows(r) + T_fixed)
  T_AR      ring:               2(P−1)/P · 8M/B + 2(P−1)·α + (P−1)/P · M·γ
            recursive doubling: log2(P) · (α + 8M/B + M·γ)
            (γ: the local additions of the reduction, per entry; measured as the reducer's merge, BM_LargeMergeAndClear)
  T_M       the M-step on the full statistics, run by every rank (BM_LargeMStep); not divided by P
  T_small   the failure agreement (an allgather of P int64) and the score's allreduce: ≈ 2·log2(P)·α + 8P/B
  M         = S·D + S + S·T + N + 1 doubles (key_sum, key_mass, emission_count, position_count, query_sq)

T_fixed, T_AR and T_M are all proportional to M and none shrinks with P.
The per-chunk and fixed E-step costs and the M-step grow with M; when T changes they are scaled by M / M_measured.

  /usr/bin/python3 bench/scaling_model.py                       # the tables of docs/SCALING.md (markdown)
  /usr/bin/python3 bench/scaling_model.py --t-mstep 0.15        # e.g. an M-step brought to a few passes over M
"""
import argparse
import math

NETWORKS = {
    # name: (alpha seconds, B bytes/second) — assumptions, see docs/SCALING.md
    "IB 100 Gb/s": (2e-6, 12e9),
    "25 GbE (TCP)": (25e-6, 2.8e9),
    # measured on the development VM between 2 ranks (compare.py allreduce), applied to P ranks as if every link
    # had it: not a measurement at P > 2
    "shared memory (2-rank figures)": (0.5e-6, 7.4e9),
}


def stats_size(S, D, T, N):
    return S * D + S + S * T + N + 1


def t_rows(rows, a):
    """The E-step seconds of one rank with `rows` rows that grow with the rows (chunk_rows 0: one chunk per rank)."""
    chunk = a.chunk_rows if a.chunk_rows else max(rows, 1)
    chunks = max(1, math.ceil(rows / chunk))
    return rows * a.c_row + (chunks - 1) * a.c_chunk * a.m_scale


def t_fixed(a):
    """The E-step seconds per call that do not depend on the rows: O(M) work on the statistics."""
    return (a.c_fixed + a.c_chunk) * a.m_scale


BYTES = 8  # bytes per statistics entry on the wire (--bytes-per-entry 4: float32 transport)


def t_ring(M, P, alpha, B, gamma):
    """Ring allreduce = reduce-scatter + allgather; with --sharded-mstep the same traffic carries the statistics
    (reduce-scatter) and the new parameters (allgather), so the cost is the same."""
    if P == 1:
        return 0.0
    return 2 * (P - 1) / P * BYTES * M / B + 2 * (P - 1) * alpha + (P - 1) / P * M * gamma


def t_recursive_doubling(M, P, alpha, B, gamma):
    if P == 1:
        return 0.0
    return math.log2(P) * (alpha + BYTES * M / B + M * gamma)


def t_small(P, alpha, B):
    return 0.0 if P == 1 else 2 * math.log2(P) * alpha + 8 * P / B


def fmt(seconds):
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--S", type=int, default=50000)
    p.add_argument("--D", type=int, default=256)
    p.add_argument("--T", type=int, default=256)
    p.add_argument("--N", type=int, default=16)
    # Defaults: measured on the development VM (docs/SCALING.md, BM_LargeEStep / BM_LargeMStep /
    # BM_LargeMergeAndClear, 4 KiB pages); with glibc.malloc.hugetlb=1: c_row 9 µs, c_fixed 42 ms, T_M 0.16 s.
    p.add_argument("--c-row", type=float, default=12e-6, help="E-step seconds per row")
    p.add_argument("--c-chunk", type=float, default=30e-3, help="E-step seconds per chunk at M = 25.65 M")
    p.add_argument("--c-fixed", type=float, default=56e-3, help="E-step seconds per call at M = 25.65 M")
    p.add_argument("--chunk-rows", type=int, default=1024, help="0: one chunk per rank")
    p.add_argument("--t-mstep", type=float, default=1.33, help="M-step seconds at M = 25.65 M")
    p.add_argument("--gamma", type=float, default=0.64e-9, help="seconds per entry of the reduction's additions")
    p.add_argument("--networks", default=",".join(NETWORKS), help="comma-separated subset of: " + ", ".join(NETWORKS))
    p.add_argument("--rows", default="1e6,1e7,1e8")
    p.add_argument("--ranks", default="8,64,512")
    p.add_argument("--t-sweep", default="256,1000,5000,50000", help="targets T of the M(T) table")
    p.add_argument("--sharded-mstep", action="store_true",
                   help="reduce-scatter + M-step on S/P symbols + allgather of the parameters: T_M / P")
    p.add_argument("--bytes-per-entry", type=int, default=8, help="4: float32 statistics on the wire")
    a = p.parse_args()
    global BYTES
    BYTES = a.bytes_per_entry
    M = stats_size(a.S, a.D, a.T, a.N)
    a.m_scale = M / stats_size(50000, 256, 256, 16)
    t_m_full = a.t_mstep * a.m_scale
    rows_list = [int(float(x)) for x in a.rows.split(",")]
    ranks_list = [int(x) for x in a.ranks.split(",")]

    print(f"M = S·D + S + S·T + N + 1 = {M:,} entries = {BYTES * M / 1e6:,.1f} MB "
          f"(S = {a.S}, D = {a.D}, T = {a.T}, N = {a.N})")
    print(f"c_row = {a.c_row * 1e6:g} µs, T_fixed = {fmt(t_fixed(a))}, T_M = {fmt(t_m_full)} "
          f"({'divided by P: sharded' if a.sharded_mstep else 'replicated'}), γ = {a.gamma * 1e9:g} ns, "
          f"{BYTES} bytes per entry; chunk_rows = {a.chunk_rows or 'one chunk per rank'}\n")

    alpha_ib, b_ib = NETWORKS["IB 100 Gb/s"]
    print("| T | M (doubles) | bytes | emission_count share | ring allreduce, P = 64, IB | T_M (scaled) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for T in (int(x) for x in a.t_sweep.split(",")):
        m = stats_size(a.S, a.D, T, a.N)
        print(f"| {T:,} | {m:,} | {BYTES * m / 1e9:.2f} GB | {100 * a.S * T / m:.0f} % | "
              f"{fmt(t_ring(m, 64, alpha_ib, b_ib, a.gamma))} | "
              f"{fmt(a.t_mstep * m / stats_size(50000, 256, 256, 16))} |")
    print()

    print("| P | network | ring allreduce | recursive doubling |")
    print("|---:|---|---:|---:|")
    for P in ranks_list:
        for net, (alpha, B) in NETWORKS.items():
            print(f"| {P} | {net} | {fmt(t_ring(M, P, alpha, B, a.gamma))} | "
                  f"{fmt(t_recursive_doubling(M, P, alpha, B, a.gamma))} |")
    print()

    for net in a.networks.split(","):
        alpha, B = NETWORKS[net]
        def t_mstep(P):
            return t_m_full / P if a.sharded_mstep else t_m_full

        ring = lambda P: t_ring(M, P, alpha, B, a.gamma) + t_small(P, alpha, B)  # noqa: E731
        rdbl = lambda P: t_recursive_doubling(M, P, alpha, B, a.gamma) + t_small(P, alpha, B)  # noqa: E731
        print(f"**{net}** (α = {alpha * 1e6:g} µs, B = {B / 1e9:g} GB/s):\n")
        print("| n | P | rows/rank | T_rows | T_fixed | T_AR ring | T_AR rec. dbl. | T_M | T(P), ring | "
              "O(M) share | speed-up |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        tf = t_fixed(a)
        for n in rows_list:
            t1 = t_rows(n, a) + tf + t_m_full
            for P in ranks_list:
                r = math.ceil(n / P)
                tr = t_rows(r, a)
                total = tr + tf + ring(P) + t_mstep(P)
                print(f"| 10^{round(math.log10(n))} | {P} | {r:,} | {fmt(tr)} | {fmt(tf)} | {fmt(ring(P))} | "
                      f"{fmt(rdbl(P))} | {fmt(t_mstep(P))} | {fmt(total)} | {100 * (total - tr) / total:.0f} % | "
                      f"{t1 / total:.0f}× |")
        print()
        print("Smallest power-of-two P at which each cost reaches the row work T_rows(n/P):\n")
        print("| n | T_AR ring | T_AR rec. doubling | T_M | T_fixed + T_AR ring + T_M |")
        print("|---:|---:|---:|---:|---:|")
        for n in rows_list:
            cross = []
            for cost in (ring, rdbl, t_mstep, lambda P: tf + ring(P) + t_mstep(P)):
                P = 2
                while P <= 1 << 24 and cost(P) < t_rows(math.ceil(n / P), a):
                    P *= 2
                cross.append(f"{P:,}" if P <= 1 << 24 else "never")
            print(f"| 10^{round(math.log10(n))} | " + " | ".join(cross) + " |")
        print()

if __name__ == "__main__":
    main()
