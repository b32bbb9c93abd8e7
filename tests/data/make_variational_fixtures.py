#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Regenerates the variational fixtures of tests/data (run: /usr/bin/python3 tests/data/make_variational_fixtures.py).

vea_model.json: a variational-embedding-attention model, S = 6 symbols in 3 synonym pairs (2c, 2c+1 share an
embedding direction), N = 3, D = 2, T = 3; emission: symbol s favours target s // 2; prior [1/4, 1/4, 1/2];
sigma2 = 0.5; an optimizer state after 3 Adam steps (seed 11) whose mean and log_var repeat params bit for bit.
vmha_model.json: a variational multi-hop model, S = 6, D = 2, T = 6 (each value symbol's emission favours itself),
sigma2 = 0.25, iteration 5, seed 3; it reads the chained-attention rows of ca_small.jsonl.
vea_small.jsonl and the .npz archives hold six literal VEA rows (no randomness) in different dtypes and zip
compressions, so the CLI test can check that all three score identically; the other archives are invalid on purpose.
Every number is exact in binary.
"""
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

CONTEXT = [[0, 2, 4], [1, 3, 5], [2, 5, 0], [4, 1, 3], [5, 0, 2], [3, 4, 1]]
QUERY = [0, 3, 5, 4, 1, 2]
TARGET = [0, 1, 2, 2, 0, 1]


def path(name):
    return os.path.join(HERE, name)


def state(family, mean, log_var, moment, iteration, seed):
    zeros = [[0.0] * len(mean[0]) for _ in mean]
    return {
        "schema_version": 1,
        "algorithm": "adam",
        "family": family,
        "mean": mean,
        "log_var": log_var,
        "mean_first_moment": moment,
        "mean_second_moment": [[abs(x) for x in row] for row in moment],
        "log_var_first_moment": zeros,
        "log_var_second_moment": zeros,
        "iteration": iteration,
        "seed": seed,
    }


def layout(value, indent=0):
    """Objects indented, one matrix row per line (the layout attnmix's own writer uses)."""
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(value, dict):
        items = [inner + json.dumps(k) + ": " + layout(v, indent + 2) for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and value and isinstance(value[0], list):
        return "[\n" + ",\n".join(inner + layout(v, indent + 2) for v in value) + "\n" + pad + "]"
    return json.dumps(value)


def write_model(name, doc):
    with open(path(name), "w") as f:
        f.write(layout(doc) + "\n")


def main():
    mean = [[2.0, 0.0], [1.5, 0.5], [0.0, 2.0], [0.5, 1.5], [-2.0, -2.0], [-1.5, -2.0]]
    log_var = [[-1.0, -1.0]] * 6
    moment = [[0.125, -0.25], [0.0, 0.5], [0.25, 0.0], [-0.125, 0.0], [0.0, 0.0], [0.5, 0.25]]
    emission = [[0.5, 0.25, 0.25], [0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.5, 0.25],
                [0.25, 0.25, 0.5], [0.25, 0.25, 0.5]]
    write_model("vea_model.json", {
        "format": "attnmix-model",
        "schema_version": 1,
        "family": "variational_embedding_attention",
        "name": "fixture",
        "params": {"mean": mean, "log_var": log_var, "emission": emission,
                   "position_prior": [0.25, 0.25, 0.5], "sigma2": 0.5},
        "optimizer_state": state("variational_embedding_attention", mean, log_var, moment, 3, 11),
    })
    mh_mean = [[2.0, 0.0], [0.0, 2.0], [-2.0, 0.0], [0.0, -2.0], [1.0, 1.0], [-1.0, -1.0]]
    mh_emission = [[0.375 if t == s else 0.125 for t in range(6)] for s in range(6)]
    write_model("vmha_model.json", {
        "format": "attnmix-model",
        "schema_version": 1,
        "family": "variational_multihop_attention",
        "params": {"mean": mh_mean, "log_var": log_var, "emission": mh_emission, "sigma2": 0.25},
        "optimizer_state": state("variational_multihop_attention", mh_mean, log_var, moment, 5, 3),
    })

    context = np.array(CONTEXT, dtype="<i8")
    query = np.array(QUERY, dtype="<i8")
    target = np.array(TARGET, dtype="<i8")
    np.savez_compressed(path("vea_small.npz"), context=context, query=query, target=target)
    # Stored members, int32 context/target, integral float64 query (accepted as exact ids).
    np.savez(path("vea_small_stored.npz"), context=context.astype("<i4"), query=query.astype("<f8"),
             target=target.astype("<i4"))
    np.savez(path("vea_small_no_target.npz"), context=context, query=query)
    # Invalid: a bool context; a fractional query at [3]; a 2-D (one-hot style) query.
    np.savez(path("vea_bool_ids.npz"), context=context.astype(bool), query=query, target=target)
    fractional = query.astype("<f8")
    fractional[3] = 1.5
    np.savez(path("vea_fractional_ids.npz"), context=context, query=fractional, target=target)
    np.savez(path("vea_vector_query.npz"), context=context, query=np.eye(6)[QUERY], target=target)
    with open(path("vea_small.jsonl"), "w") as f:
        for c, q, t in zip(CONTEXT, QUERY, TARGET):
            f.write(json.dumps({"context": c, "query": q, "target": t}) + "\n")


if __name__ == "__main__":
    main()
