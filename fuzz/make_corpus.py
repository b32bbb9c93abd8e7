#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the seed corpus of the fuzz targets (docs/fuzzing.md) into fuzz/corpus/<target>/.

Run: /usr/bin/python3 fuzz/make_corpus.py [--checkpoint-tool build-fuzz/fuzz/make_checkpoint_seed]

The seeds are the fixtures of tests/data (small valid and invalid data files and model files) plus a few small
generated files that reach the corners of the formats: every .npy dtype and version, Fortran order, scalars and
empty arrays, stored and deflated members, and JSON Lines with blank lines, CRLF and integral floats. Data-file
seeds start with the mode byte of fuzz/data_rows.hpp (family, declared dimensions, target policy, stripe). The
checkpoint seeds come from the real writer (make_checkpoint_seed, built with ATTNMIX_BUILD_FUZZERS and libtorch);
without --checkpoint-tool the existing ones are kept. Everything is literal, so the output is the same on every
machine (numpy's zip timestamps aside).
"""
import argparse
import io
import os
import shutil
import subprocess
import tempfile
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data")
CORPUS = os.path.join(HERE, "corpus")

RA, CA, VEA, FORMAT = 0, 1, 2, 3  # bits 0-1 of the mode byte
DECLARED, OPTIONAL_TARGETS = 4, 8
TWO_PARTS, THREE_PARTS = 2 << 4, 3 << 4


def part(k):
    return k << 6


def fixture(name):
    with open(os.path.join(DATA, name), "rb") as f:
        return f.read()


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def npz_bytes(compressed=False, **arrays):
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def npy_bytes(array, version=None):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version)
    return buf.getvalue()


def jsonl_seeds():
    for family, name in ((RA, "ra"), (CA, "ca"), (VEA, "vea")):
        text = fixture(f"{name}_small.jsonl")
        write("fuzz_jsonl", f"{name}_small", bytes([family]) + text)
        write("fuzz_jsonl", f"{name}_small_declared", bytes([family | DECLARED]) + text)
        write("fuzz_jsonl", f"{name}_small_stripe", bytes([family | THREE_PARTS | part(1)]) + text)
        no_target = b"\n".join(line.rsplit(b', "target"', 1)[0] + b"}" for line in text.splitlines() if line)
        write("fuzz_jsonl", f"{name}_no_target", bytes([family | OPTIONAL_TARGETS]) + no_target + b"\n")
    write("fuzz_jsonl", "ra_blank_crlf_floats",
          bytes([RA]) + b'\r\n{"context": [0, 1.0, 2], "query": [1e-3, -0.0], "target": 1}\r\n\n'
          b'  {"target": 0, "query": [2, 3], "context": [2, 1, 0]}  \r\n')
    symbol_queries = (b'{"context": [0, 1, 2], "query": 3, "target": 1}\n{"context": [2, 2, 0], "query": 0, "target": 0}\n'
                      b'{"context": [1, 0, 1], "query": 1.0, "target": 2}\n')
    write("fuzz_jsonl", "ra_symbol_queries", bytes([RA]) + symbol_queries)
    write("fuzz_jsonl", "ra_symbol_queries_stripe", bytes([RA | DECLARED | TWO_PARTS | part(1)]) + symbol_queries)
    write("fuzz_jsonl", "ca_two_parts",
          bytes([CA | TWO_PARTS | part(1)]) + b'{"keys": [0, 1], "values": [1, 0], "query": 0, "target": 1}\n'
          b'{"keys": [1, 1], "values": [0, 0], "query": 1, "target": 0}\n'
          b'{"keys": [0, 0], "values": [1, 1], "query": 0, "target": 1}\n')
    write("fuzz_jsonl", "lines_only",
          bytes([FORMAT | TWO_PARTS]) + b'{"a": [1, {"b": null}], "c": "\\u00e9"}\n\n{"d": true}\n[1]\n')


def npz_seeds():
    for family, name in ((RA, "ra"), (CA, "ca"), (VEA, "vea")):
        for suffix in ("small", "small_stored", "small_no_target", "bool_ids", "fractional_ids"):
            data = fixture(f"{name}_{suffix}.npz")
            mode = family | (OPTIONAL_TARGETS if suffix == "small_no_target" else 0)
            write("fuzz_npz", f"{name}_{suffix}", bytes([mode]) + data)
        write("fuzz_npz", f"{name}_small_stripe", bytes([family | DECLARED | THREE_PARTS | part(2)]) +
              fixture(f"{name}_small_stored.npz"))
    write("fuzz_npz", "ca_mismatched", bytes([CA]) + fixture("ca_mismatched.npz"))
    write("fuzz_npz", "vea_vector_query", bytes([VEA]) + fixture("vea_vector_query.npz"))
    write("fuzz_npz", "ra_symbol_queries", bytes([RA]) + npz_bytes(
        context=np.array([[0, 1, 2], [2, 2, 0]], dtype="<i8"), query=np.array([3, 0], dtype="<i4"),
        target=np.array([1, 0], dtype="<i8")))
    # The format layer alone (mode family 3): every dtype, versions 1-3, Fortran order, scalars, empty arrays.
    dtypes = ["|b1", "<i1", "<i2", "<i4", "<i8", "<u1", "<u2", "<u4", "<u8", "<f4", "<f8"]
    arrays = {f"a{k}": np.arange(6).reshape(2, 3).astype(dt) for k, dt in enumerate(dtypes)}
    write("fuzz_npz", "all_dtypes", bytes([FORMAT | TWO_PARTS]) + npz_bytes(**arrays))
    write("fuzz_npz", "fortran_deflated", bytes([FORMAT | THREE_PARTS | part(1)]) + npz_bytes(
        compressed=True, f=np.asfortranarray(np.arange(24, dtype="<f8").reshape(4, 3, 2)),
        s=np.array(7, dtype="<i8"), e=np.zeros((0, 3), dtype="<i4")))
    for version in ((1, 0), (2, 0), (3, 0)):
        member = npy_bytes(np.arange(5, dtype="<i4"), version=version)
        write("fuzz_npz", f"npy_v{version[0]}", bytes([FORMAT]) + member)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr(zipfile.ZipInfo("context.npy", date_time=(1980, 1, 1, 0, 0, 0)), member)  # reproducible
        write("fuzz_npz", f"npz_v{version[0]}", bytes([FORMAT]) + buf.getvalue())


def model_seeds():
    for name in ("ra_model", "ca_model", "vea_model", "vmha_model"):
        write("fuzz_model", name, fixture(f"{name}.json"))
    write("fuzz_model", "mixture", b"""{
  "format": "attnmix-model", "schema_version": 1, "family": "mixture", "name": "two heads",
  "params": {
    "components": [
      {"schema_version": 1, "family": "responsibility_attention",
       "params": {"key_means": [[0.0]], "emission": [[0.5, 0.5]], "position_prior": [1.0], "sigma2": 1.0}},
      {"family": "responsibility_attention",
       "params": {"key_means": [[1.0]], "emission": [[0.25, 0.75]], "position_prior": [1.0], "sigma2": 1e-3}}
    ],
    "w": [0.5, 0.5]
  }
}
""")
    write("fuzz_model", "sparse_rows", SPARSE_ROWS_MODEL)


SPARSE_ROWS_MODEL = b"""{
  "format": "attnmix-model", "schema_version": 2, "family": "responsibility_attention",
  "params": {
    "key_means": {"layout": "sparse_rows", "shape": [2, 3], "default": [0.0, -0.5],
                  "columns": [[1], []], "values": [[0.25], []]},
    "emission": {"layout": "sparse_rows", "shape": [2, 2], "default": [0.5, 0.0], "columns": [[], [0]], "values": [[], [1]]},
    "position_prior": [0.5, 0.5], "sigma2": 1.0
  }
}
"""


def checkpoint_seeds(tool):
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([tool, tmp], check=True)
        for name in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, name), "rb") as f:
                write("fuzz_checkpoint", os.path.splitext(name)[0], f.read())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-tool", help="make_checkpoint_seed of a fuzz build (writes checkpoint seeds)")
    args = parser.parse_args()
    for target in ("fuzz_jsonl", "fuzz_npz", "fuzz_model"):
        shutil.rmtree(os.path.join(CORPUS, target), ignore_errors=True)
    jsonl_seeds()
    npz_seeds()
    model_seeds()
    if args.checkpoint_tool:
        shutil.rmtree(os.path.join(CORPUS, "fuzz_checkpoint"), ignore_errors=True)
        checkpoint_seeds(args.checkpoint_tool)


if __name__ == "__main__":
    main()
