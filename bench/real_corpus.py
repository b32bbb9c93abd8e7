#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Responsibility attention on a real corpus: the King James Bible of Debian's bible-kjv packages, split into words,
fitted by `attnmix fit --text` on prefixes of growing size, with dense tables (--family ra) and with sparse ones
(--family ra-sparse). For each prefix and family: the words, the word types S, the distinct (context symbol, target)
and (context symbol, query symbol) pairs the data hold, the EM iteration's seconds (the median of the fit's
iterations, from --history), the peak resident memory of the whole command and the model file's size. A dense fit
whose tables (S × S keys, S × S emission) would not fit in --max-gb is not run, and the table says what it would need.

Run: make bench-corpus (installs bible-kjv, builds attnmix), or
    /usr/bin/python3 bench/real_corpus.py --cli build/cli/attnmix [--sizes 100000,200000,...] [--families ra,ra-sparse]
        [--json out.json]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

CONTEXT = 4        # N: the current word and the three before it
ITERATIONS = 3     # EM iterations per fit
DENSE_TABLES = 15  # S × S tables alive at the peak (keys, emission, log emission, statistics, partial statistics, models)


def kjv_text():
    """The whole King James Bible as plain text: `bible` (bible-kjv) prints it; chapter headings and verse numbers
    are removed, one verse per line."""
    raw = subprocess.run(["bible", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    verses = []
    for line in raw.splitlines():
        if not line.strip() or (not line.startswith(" ") and re.fullmatch(r"\S.* \d+", line)):
            continue  # blank lines and headings such as "Genesis 1"
        verses.append(re.sub(r"^\s*\d+\s", "", line).strip())
    return "\n".join(verses) + "\n"


def pair_counts(words, context):
    """The distinct (context word, target) and (context word, current word) pairs of the fit's rows."""
    ids = {w: k for k, w in enumerate(dict.fromkeys(words))}
    tokens = [ids[w] for w in words]
    emission, keys = set(), set()
    for p in range(context - 1, len(tokens) - 1):
        window = tokens[p - context + 1:p + 1]
        for s in window:
            emission.add((s, tokens[p + 1]))
            keys.add((s, tokens[p]))
    return len(ids), len(emission), len(keys)


def fit(cli, family, text_path, directory):
    """Runs the fit; returns (peak RSS bytes, median iteration seconds, model bytes)."""
    model, history = os.path.join(directory, "m.json"), os.path.join(directory, "h.jsonl")
    command = [cli, "fit", "--family", family, "--text", text_path, "--tokens", "words", "--context-length",
               str(CONTEXT), "--max-its", str(ITERATIONS), "--delta", "none", "--threads", "1", "--out", model,
               "--history", history]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {process.stderr.read()}")
    with open(history) as f:
        seconds = [json.loads(line)["seconds"] for line in f]
    return usage.ru_maxrss * 1024, statistics.median(seconds), os.path.getsize(model)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cli", default="build/cli/attnmix")
    parser.add_argument("--sizes", default="100000,200000,400000,2000000,4500000",
                        help="prefix sizes in bytes (whole lines), comma-separated")
    parser.add_argument("--families", default="ra,ra-sparse", help="the families fitted, comma-separated")
    parser.add_argument("--max-gb", type=float, default=8.0, help="skip dense fits whose tables need more")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    text = kjv_text()
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for size in (int(s) for s in args.sizes.split(",")):
            prefix = text[:text.rfind("\n", 0, size) + 1]
            words = prefix.split()
            types, emission_pairs, key_pairs = pair_counts(words, CONTEXT)
            path = os.path.join(directory, "prefix.txt")
            with open(path, "w") as f:
                f.write(prefix)
            for family in args.families.split(","):
                row = {"family": family, "bytes": len(prefix.encode()), "words": len(words), "types": types,
                       "emission_pairs": emission_pairs, "key_pairs": key_pairs,
                       "dense_gb": DENSE_TABLES * types * types * 8 / 1e9}
                if family == "ra" and row["dense_gb"] > args.max_gb:
                    row["skipped"] = f"dense tables need about {row['dense_gb']:.0f} GB (> --max-gb {args.max_gb:g})"
                else:
                    rss, seconds, model = fit(args.cli, family, path, directory)
                    row.update(peak_rss_mb=rss / 1e6, iteration_s=seconds, model_mb=model / 1e6)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print("| family | corpus bytes | words | word types S | (context, target) pairs | (context, query) pairs | "
          "peak RSS | EM iteration | model file |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        measured = (f"{r['peak_rss_mb']:.0f} MB | {r['iteration_s']:.2f} s | {r['model_mb']:.2f} MB"
                    if "skipped" not in r else f"not run: {r['skipped']} | | ")
        print(f"| {r['family']} | {r['bytes']} | {r['words']} | {r['types']} | {r['emission_pairs']} | "
              f"{r['key_pairs']} | {measured} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"context_length": CONTEXT, "iterations": ITERATIONS, "threads": 1, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
