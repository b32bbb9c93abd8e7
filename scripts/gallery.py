#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the figures of docs/gallery.md (docs/gallery/*.png) from small fits made here, with fixed seeds:

  PYTHONPATH=build/python /usr/bin/python3 scripts/gallery.py --cli build/cli/attnmix

Each figure is drawn by attnmix.plot; the page shows the call or the command that made it."""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np

import attnmix
from attnmix import plot
from attnmix.assign import run_assignment_tree_experiment

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "docs", "gallery")


def recall_rows(rng, S=16, N=6, n=4000):
    """The README's task: the query is a noisy one-hot of one context symbol, the target that symbol's successor."""
    context = np.argsort(rng.random((n, S)), axis=1)[:, :N]
    attended = context[np.arange(n), rng.integers(0, N, n)]
    query = np.eye(S)[attended] + 0.3 * rng.standard_normal((n, S))
    return context, query, (attended + 1) % S


def transitive_rows(rng, S=12, N=5, n=3000):
    """Two-hop lookup: the context holds pairs key→value with a chain q→b→c; the target is c."""
    rows = []
    for _ in range(n):
        q, b, c, *others = rng.permutation(S)[: N + 2]
        keys = [q, b] + list(rng.permutation([k for k in range(S) if k not in (q, b)])[: N - 2])
        values = [b, c] + list(rng.integers(0, S, N - 2))
        order = rng.permutation(N)
        rows.append((np.array(keys)[order], np.array(values)[order], int(q), int(c)))
    return rows


def save(fig, name):
    fig.savefig(os.path.join(OUT, name + ".png"), dpi=72)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", required=True, help="the attnmix program (build/cli/attnmix)")
    args = parser.parse_args()
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(0)

    context, query, target = recall_rows(rng)
    ra = attnmix.optimize((context, query, target), attnmix.ResponsibilityAttentionEstimator(16, 6, 16, 16, sigma2=0.5),
                          max_its=40, rng=np.random.RandomState(0), out=None)
    save(plot.responsibilities(ra, (context[:8], query[:8], target[:8])), "responsibilities")
    save(plot.attention_tables(ra), "attention_tables")

    rows = transitive_rows(rng)
    ca = attnmix.optimize(rows, attnmix.ChainedAttentionEstimator(2, 12, 12, sigma2=0.1), max_its=30, delta=None,
                          rng=np.random.RandomState(1), out=None)
    save(plot.hop_posteriors(ca, rows[:6]), "hop_posteriors")
    save(plot.key_tables(ca), "key_tables")

    with tempfile.TemporaryDirectory() as scratch:
        data = os.path.join(scratch, "ra.jsonl")
        with open(data, "w") as f:
            for c, y, t in zip(context[:1000], query[:1000], target[:1000]):
                f.write(json.dumps({"context": c.tolist(), "query": y.tolist(), "target": int(t)}) + "\n")
        history = os.path.join(scratch, "history.jsonl")
        subprocess.run([args.cli, "fit", "--data", data, "--out", os.path.join(scratch, "m.json"), "--sigma2", "0.5",
                        "--max-its", "25", "--history", history], check=True, capture_output=True)
        save(plot.fit_history(history), "fit_history")

    experiment = run_assignment_tree_experiment(1234)
    save(plot.assignment_scaling(experiment), "assignment_scaling")
    freq = np.array(experiment["prediction_3_frequencies"])
    tree = np.zeros(freq.shape, dtype=bool)
    tree[tuple(np.array(experiment["prediction_3_tree_edges"]).T)] = True
    save(plot.assignment_frequencies(freq, tree), "assignment_frequencies")

    with tempfile.TemporaryDirectory() as scratch:  # moment closure's bank filling up as the window evicts
        history = os.path.join(scratch, "lm.jsonl")
        subprocess.run([args.cli, "lm", "train", "--mechanism", "moment-closure", "--window", "16", "--chunk", "16",
                        "--max-clusters", "4", "--steps", "200", "--batch", "4", "--d-model", "32",
                        "--eval-every", "20", "--history", history], check=True, capture_output=True)
        save(plot.lm_history(history), "lm_history")

    with tempfile.TemporaryDirectory() as scratch:  # the demo's variational fit: synonyms share a concept
        subprocess.run([args.cli, "demo", "--plots", scratch], check=True, capture_output=True)
        save(plot.embeddings(attnmix.load_model(os.path.join(scratch, "variational", "model.json"))), "embeddings")
    print(f"gallery: wrote {len(os.listdir(OUT))} figures to {OUT}")


if __name__ == "__main__":
    main()
