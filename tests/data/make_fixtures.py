#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Regenerates the small .npz fixtures of tests/data (run: /usr/bin/python3 tests/data/make_fixtures.py).

The arrays are literal (no randomness), so the output is the same on every machine. ra_small.npz and
ra_small_stored.npz hold the same six observations as ra_small.jsonl, in different dtypes, layouts and zip
compressions, so the CLI test can check that all three score identically.
"""
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

CONTEXT = [[0, 1, 2], [3, 2, 1], [1, 0, 3], [2, 3, 0], [0, 2, 3], [1, 3, 2]]
QUERY = [[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.5, 2.0], [0.25, 1.75, 0.0, 0.0],
         [0.0, 0.0, 2.0, 0.0], [1.5, 0.0, 0.0, 0.25], [0.0, 2.0, 0.0, -0.5]]
TARGET = [1, 3, 2, 3, 1, 2]


def path(name):
    return os.path.join(HERE, name)


def main():
    context = np.array(CONTEXT, dtype="<i8")
    query = np.array(QUERY, dtype="<f8")
    target = np.array(TARGET, dtype="<i8")
    # Deflated members, int64 / float64, C order.
    np.savez_compressed(path("ra_small.npz"), context=context, query=query, target=target)
    # Stored members, int32 / float32 (the values are exact in float32), a Fortran-order query.
    np.savez(path("ra_small_stored.npz"), context=context.astype("<i4"),
             query=np.asfortranarray(query.astype("<f4")), target=target.astype("<i4"))
    # Without targets (for predict).
    np.savez(path("ra_small_no_target.npz"), context=context, query=query)
    # Invalid: bool ids; fractional float ids.
    np.savez(path("ra_bool_ids.npz"), context=context.astype(bool), query=query, target=target)
    fractional = context.astype("<f8")
    fractional[2, 1] = 1.5
    np.savez(path("ra_fractional_ids.npz"), context=fractional, query=query, target=target)
    with open(path("ra_small.jsonl"), "w") as f:
        for c, q, t in zip(CONTEXT, QUERY, TARGET):
            f.write(json.dumps({"context": c, "query": q, "target": t}) + "\n")


if __name__ == "__main__":
    main()
