#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Regenerates the chained-attention fixtures of tests/data (run: /usr/bin/python3 tests/data/make_chained_fixtures.py).

Six transitive-lookup rows over S = 6 symbols (2 pairs a -> b, b -> c; N = 4), literal (no randomness), read by
ca_model.json (written by hand: identity key tables, each value symbol's emission favours itself). ca_small.npz
and ca_small_stored.npz hold the same rows as ca_small.jsonl in different dtypes and zip compressions, so the CLI
test can check that all three score identically; the other archives are invalid on purpose.
"""
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

KEYS = [[0, 1, 2, 3], [0, 1, 3, 2], [1, 0, 2, 3], [4, 5, 0, 1], [2, 3, 5, 4], [3, 2, 4, 5]]
VALUES = [[2, 3, 4, 5], [2, 3, 4, 5], [3, 2, 5, 4], [0, 1, 2, 3], [5, 4, 0, 1], [4, 5, 1, 0]]
QUERY = [0, 0, 1, 5, 2, 3]
TARGET = [4, 5, 4, 3, 0, 1]


def path(name):
    return os.path.join(HERE, name)


def main():
    keys = np.array(KEYS, dtype="<i8")
    values = np.array(VALUES, dtype="<i8")
    query = np.array(QUERY, dtype="<i8")
    target = np.array(TARGET, dtype="<i8")
    # Deflated members, int64.
    np.savez_compressed(path("ca_small.npz"), keys=keys, values=values, query=query, target=target)
    # Stored members, int32 keys/target, integral float64 values and query (accepted as exact ids).
    np.savez(path("ca_small_stored.npz"), keys=keys.astype("<i4"), values=values.astype("<f8"),
             query=query.astype("<f8"), target=target.astype("<i4"))
    # Without targets (for predict).
    np.savez(path("ca_small_no_target.npz"), keys=keys, values=values, query=query)
    # Invalid: bool values; a fractional key at [2, 1]; values narrower than keys.
    np.savez(path("ca_bool_ids.npz"), keys=keys, values=values.astype(bool), query=query, target=target)
    fractional = keys.astype("<f8")
    fractional[2, 1] = 1.5
    np.savez(path("ca_fractional_ids.npz"), keys=fractional, values=values, query=query, target=target)
    np.savez(path("ca_mismatched.npz"), keys=keys, values=values[:, :3], query=query, target=target)
    with open(path("ca_small.jsonl"), "w") as f:
        for k, v, q, t in zip(KEYS, VALUES, QUERY, TARGET):
            f.write(json.dumps({"keys": k, "values": v, "query": q, "target": t}) + "\n")


if __name__ == "__main__":
    main()
