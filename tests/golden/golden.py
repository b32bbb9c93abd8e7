#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Golden transcripts of the `attnmix` program's model commands: every case's exit code, stdout, stderr and the
files it writes, compared with tests/golden/expected/<case>.txt after three substitutions (the data directories
become $DATA and $GOLDEN, the scratch directory $OUT, and measured seconds become T). Text must match exactly;
integers too; other numbers match when they agree to one unit in the last digit printed, to 1e-9 relative or to
1e-12: the Debug and sanitizer builds round differently (other vectorisation and instruction selection), and a
transcript pins what the program says, not its last bit.

The cases pin what `attnmix fit`, `score`, `predict` and `sample` print and write for every family, from valid data
and from bad data, so that a change to how the commands are put together (the adapters) can be shown to change
nothing a user sees. A case whose output should change is regenerated on purpose, and the diff is the review:

  /usr/bin/python3 tests/golden/golden.py --cli build/cli/attnmix --data tests/data            # check (ctest)
  /usr/bin/python3 tests/golden/golden.py --cli build/cli/attnmix --data tests/data --update   # rewrite
  ... --only fit_ra_jsonl score_ca                                                               # some cases
"""
import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile

GOLDEN = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(GOLDEN, "expected")

# The data files of each family's rows ({D}: tests/data) and its model fixture; variational multi-hop attention reads
# the chained rows.
ROWS = {"ra": "ra_small", "ca": "ca_small", "vea": "vea_small", "vmha": "ca_small"}
FAMILY_FLAG = {"ra": "responsibility", "ca": "chained", "vea": "variational", "vmha": "variational-multihop"}


def cases():
    """(name, arguments, files the case writes under $OUT). {D}: tests/data, {G}: tests/golden/data, {O}: $OUT."""
    out = [
        ("help", ["--help"], []),
        ("help_fit", ["fit", "--help"], []),
        ("help_score", ["score", "--help"], []),
        ("help_predict", ["predict", "--help"], []),
        ("help_sample", ["sample", "--help"], []),
    ]
    for f, rows in ROWS.items():
        family = ["fit", "--family", FAMILY_FLAG[f]]
        model = "{D}/" + f + "_model.json"
        out += [
            (f"fit_{f}_jsonl", family + ["--data", "{D}/" + rows + ".jsonl", "--out", "{O}/m.json", "--max-its", "3",
                                         "--seed", "5"], ["m.json"]),
            (f"fit_{f}_npz_valid", family + ["--data", "{D}/" + rows + ".npz", "--valid", "{D}/" + rows + ".jsonl",
                                             "--out", "{O}/m.json", "--max-its", "2", "--delta", "1e-9"], ["m.json"]),
            (f"fit_{f}_init", family + ["--data", "{D}/" + rows + "_stored.npz", "--init", model, "--out", "{O}/m.json",
                                        "--max-its", "2"], ["m.json"]),
            (f"fit_{f}_bool_ids", family + ["--data", "{D}/" + f + "_bool_ids.npz", "--out", "{O}/m.json"], []),
            (f"score_{f}", ["score", "--model", model, "--data", "{D}/" + rows + ".jsonl", "--per-row"], []),
            (f"score_{f}_npz", ["score", "--model", model, "--data", "{D}/" + rows + "_stored.npz"], []),
            (f"predict_{f}", ["predict", "--model", model, "--data", "{D}/" + rows + ".jsonl"], []),
            (f"predict_{f}_proba", ["predict", "--model", model, "--data", "{D}/" + rows + "_no_target.npz",
                                    "--proba"], []),
            (f"sample_{f}", ["sample", "--model", model, "-n", "4", "--seed", "7"], []),
        ]
    out = [c for c in out if c[0] != "fit_vmha_bool_ids"]  # vmha reads the chained rows: fit_ca_bool_ids covers them
    out += [
        ("fit_ra_text", ["fit", "--text", "{G}/tiny.txt", "--context-length", "2", "--out", "{O}/m.json",
                         "--max-its", "2"], ["m.json"]),
        ("fit_ra_text_words", ["fit", "--text", "{G}/tiny.txt", "--tokens", "words", "--context-length", "2",
                               "--out", "{O}/m.json", "--max-its", "2", "--estimate-sigma2"], ["m.json"]),
        ("fit_ra_flags", ["fit", "--data", "{D}/ra_small.jsonl", "--out", "{O}/m.json", "--symbols", "5",
                          "--targets", "6", "--sigma2", "0.25", "--emission-smoothing", "0.5", "--max-its", "2",
                          "--precision", "mixed", "--threads", "2"], ["m.json"]),
        ("fit_ca_hops", ["fit", "--family", "ca", "--data", "{D}/ca_small.jsonl", "--out", "{O}/m.json", "--hops", "3",
                         "--max-its", "2"], ["m.json"]),
        ("fit_vea_options", ["fit", "--family", "vea", "--data", "{D}/vea_small.jsonl", "--out", "{O}/m.json",
                             "--embed-dim", "3", "--lr", "0.02", "--mc", "2", "--prior-strength", "0.5",
                             "--max-its", "2"], ["m.json"]),
        ("fit_vmha_options", ["fit", "--family", "vmha", "--data", "{D}/ca_small.jsonl", "--out", "{O}/m.json",
                              "--anneal-iters", "3", "--max-its", "2"], ["m.json"]),
        ("fit_unknown_family", ["fit", "--family", "poisson", "--data", "{D}/ra_small.jsonl", "--out", "{O}/m.json"],
         []),
        ("fit_flag_of_other_family", ["fit", "--family", "ca", "--data", "{D}/ca_small.jsonl", "--out", "{O}/m.json",
                                      "--embed-dim", "3"], []),
        ("fit_init_other_family", ["fit", "--family", "ca", "--data", "{D}/ca_small.jsonl", "--init",
                                   "{D}/ra_model.json", "--out", "{O}/m.json"], []),
        ("fit_init_dim_mismatch", ["fit", "--data", "{D}/ra_small.jsonl", "--init", "{D}/ra_model.json", "--symbols",
                                   "7", "--out", "{O}/m.json"], []),
        ("fit_text_and_data", ["fit", "--data", "{D}/ra_small.jsonl", "--text", "{G}/tiny.txt", "--out",
                               "{O}/m.json"], []),
        ("fit_missing_file", ["fit", "--data", "{G}/no_such_file.jsonl", "--out", "{O}/m.json"], []),
        ("fit_ra_fractional_npz", ["fit", "--data", "{D}/ra_fractional_ids.npz", "--out", "{O}/m.json"], []),
        ("fit_ca_fractional_npz", ["fit", "--family", "ca", "--data", "{D}/ca_fractional_ids.npz", "--out",
                                   "{O}/m.json"], []),
        ("fit_ca_mismatched_npz", ["fit", "--family", "ca", "--data", "{D}/ca_mismatched.npz", "--out",
                                   "{O}/m.json"], []),
        ("fit_vea_fractional_npz", ["fit", "--family", "vea", "--data", "{D}/vea_fractional_ids.npz", "--out",
                                    "{O}/m.json"], []),
        ("fit_vea_vector_query_npz", ["fit", "--family", "vea", "--data", "{D}/vea_vector_query.npz", "--out",
                                      "{O}/m.json"], []),
        ("score_mixture", ["score", "--model", "{G}/ra_mixture_model.json", "--data", "{D}/ra_small.jsonl",
                           "--per-row"], []),
        ("predict_mixture", ["predict", "--model", "{G}/ra_mixture_model.json", "--data", "{D}/ra_small.npz",
                             "--proba"], []),
        ("sample_mixture", ["sample", "--model", "{G}/ra_mixture_model.json", "-n", "5", "--seed", "2"], []),
        ("score_composite", ["score", "--model", "{G}/composite_model.json", "--data", "{G}/composite.jsonl",
                             "--per-row"], []),
        ("score_composite_missing_field", ["score", "--model", "{G}/composite_model.json", "--data",
                                           "{G}/composite_missing_field.jsonl"], []),
        ("predict_composite", ["predict", "--model", "{G}/composite_model.json", "--data", "{G}/composite.jsonl"], []),
        ("sample_composite", ["sample", "--model", "{G}/composite_model.json", "-n", "3", "--seed", "4"], []),
        ("sample_composite_context_length", ["sample", "--model", "{G}/composite_model.json", "-n", "3", "--seed",
                                             "4", "--context-length", "3"], []),
        ("score_wrong_family_data", ["score", "--model", "{D}/ca_model.json", "--data", "{D}/ra_small.jsonl"], []),
        ("predict_some_targets", ["predict", "--model", "{D}/vea_model.json", "--data", "{G}/vea_some_targets.jsonl"],
         []),
        ("sample_ca_context_length", ["sample", "--model", "{D}/ca_model.json", "-n", "2", "--seed", "1",
                                      "--context-length", "3"], []),
        ("sample_ra_context_length", ["sample", "--model", "{D}/ra_model.json", "-n", "2", "--seed", "1",
                                      "--context-length", "5"], []),
        ("sample_categorical_context_length", ["sample", "--model", "{G}/categorical_model.json", "-n", "2",
                                               "--seed", "1", "--context-length", "3"], []),
        ("score_vea_vector_query", ["score", "--model", "{D}/vea_model.json", "--data", "{G}/vea_vector_query.jsonl"],
         []),
        ("score_ca_mismatched", ["score", "--model", "{D}/ca_model.json", "--data", "{G}/ca_mismatched.jsonl"], []),
        ("score_ca_bool_query", ["score", "--model", "{D}/ca_model.json", "--data", "{G}/ca_bool_query.jsonl"], []),
    ]
    # Responsibility attention with sparse tables: symbol queries (the rows of the variational family's files).
    out += [
        ("fit_ra_sparse_jsonl", ["fit", "--family", "ra-sparse", "--data", "{D}/vea_small.jsonl", "--out", "{O}/m.json",
                                 "--max-its", "3", "--seed", "5", "--estimate-sigma2"], ["m.json"]),
        ("fit_ra_sparse_text", ["fit", "--family", "ra-sparse", "--text", "{G}/tiny.txt", "--tokens", "words",
                                "--context-length", "2", "--out", "{O}/m.json", "--max-its", "2"], ["m.json"]),
        ("fit_ra_sparse_vector_query", ["fit", "--family", "ra-sparse", "--data", "{D}/ra_small.jsonl", "--out",
                                        "{O}/m.json"], []),
        ("score_ra_sparse", ["score", "--model", "{G}/ra_sparse_model.json", "--data", "{D}/vea_small.jsonl",
                             "--per-row"], []),
        ("predict_ra_sparse_proba", ["predict", "--model", "{G}/ra_sparse_model.json", "--data",
                                     "{D}/vea_small_no_target.npz", "--proba"], []),
        ("sample_ra_sparse", ["sample", "--model", "{G}/ra_sparse_model.json", "-n", "2", "--seed", "1"], []),
    ]
    # The families without a context: a value per row.
    for f, flags in (("categorical", ["--smoothing", "0.5"]), ("gaussian", ["--min-sigma2", "0.01"])):
        out += [
            (f"fit_{f}", ["fit", "--family", f, "--data", "{G}/" + f + ".jsonl", "--out", "{O}/m.json"] + flags,
             ["m.json"]),
            (f"score_{f}", ["score", "--model", "{G}/" + f + "_model.json", "--data", "{G}/" + f + ".jsonl",
                            "--per-row"], []),
            (f"predict_{f}", ["predict", "--model", "{G}/" + f + "_model.json", "--data", "{G}/" + f + ".jsonl"], []),
            (f"sample_{f}", ["sample", "--model", "{G}/" + f + "_model.json", "-n", "4", "--seed", "7"], []),
        ]
    out += [
        ("fit_categorical_fractional", ["fit", "--family", "categorical", "--data", "{G}/categorical_fractional.jsonl",
                                        "--out", "{O}/m.json"], ["m.json"]),
        ("fit_gaussian_ragged", ["fit", "--family", "gaussian", "--data", "{G}/gaussian_ragged.jsonl", "--out",
                                 "{O}/m.json"], ["m.json"]),
        ("fit_gaussian_dim_mismatch", ["fit", "--family", "gaussian", "--data", "{G}/gaussian.jsonl", "--dim", "3",
                                       "--out", "{O}/m.json"], ["m.json"]),
        ("fit_categorical_too_few", ["fit", "--family", "categorical", "--data", "{G}/categorical.jsonl",
                                     "--categories", "2", "--out", "{O}/m.json"], ["m.json"]),
        ("score_categorical_out_of_model", ["score", "--model", "{G}/categorical_model.json", "--data",
                                            "{G}/categorical_out_of_model.jsonl"], []),
    ]
    for bad in ("ragged", "missing_target", "unknown_field", "negative_id", "string_query", "fractional_target",
                "not_json"):
        out.append((f"fit_ra_{bad}", ["fit", "--data", "{G}/ra_" + bad + ".jsonl", "--out", "{O}/m.json"], []))
    for bad in ("id_out_of_model", "wrong_query_dim", "ragged"):
        out.append((f"score_ra_{bad}", ["score", "--model", "{D}/ra_model.json", "--data", "{G}/ra_" + bad + ".jsonl"],
                    []))
    return out


def normalise(text, data, out):
    text = text.replace(out, "$OUT").replace(GOLDEN + "/data", "$GOLDEN").replace(data, "$DATA")
    text = re.sub(r"\((\d+\.\d+) s\)", "(T s)", text)  # per-iteration seconds
    return re.sub(r"(\n  time +)\d+\.\d+ s", r"\1T s", text)  # the summary's wall-clock time


NUMBER = re.compile(r"-?\d+(?:\.(\d+))?(?:[eE]([-+]?\d+))?")


def last_digit(match):
    """The value of one unit in the last digit a number was printed with; integers (counts, exit codes) must match."""
    if match.group(1) is None and match.group(2) is None:
        return 0.0
    return 10.0 ** (int(match.group(2) or 0) - len(match.group(1) or ""))


def same(want, got):
    """Whether two transcripts say the same thing: equal text between the numbers, numbers within rounding."""
    if want == got:
        return True
    if NUMBER.sub("#", want) != NUMBER.sub("#", got):
        return False
    for w, g in zip(NUMBER.finditer(want), NUMBER.finditer(got)):
        a, b = float(w.group(0)), float(g.group(0))
        exact = last_digit(w) == 0.0 and last_digit(g) == 0.0
        allowed = max(1e-9 * max(abs(a), abs(b)), 1e-12, 1.01 * max(last_digit(w), last_digit(g)))
        if a != b and (exact or abs(a - b) > allowed):
            return False
    return True


def transcript(cli, data, name, args, files):
    with tempfile.TemporaryDirectory(prefix="golden-") as out:
        fill = {"D": data, "G": os.path.join(GOLDEN, "data"), "O": out}
        argv = [cli] + [a.format(**fill) for a in args]
        run = subprocess.run(argv, capture_output=True, env=dict(os.environ, LC_ALL="C"), cwd=out, timeout=300)
        parts = [f"$ attnmix {' '.join(args)}", f"exit {run.returncode}", "--- stdout", run.stdout.decode(),
                 "--- stderr", run.stderr.decode()]
        for f in files:
            path = os.path.join(out, f)
            parts += [f"--- file {f}", open(path).read() if os.path.exists(path) else "(not written)\n"]
        return normalise("\n".join(parts), data, out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cli", required=True)
    parser.add_argument("--data", required=True, help="tests/data")
    parser.add_argument("--update", action="store_true", help="rewrite the expected transcripts")
    parser.add_argument("--only", nargs="*", help="these cases alone")
    a = parser.parse_args()
    data = os.path.abspath(a.data)
    chosen = [c for c in cases() if not a.only or c[0] in a.only]
    if a.update and not a.only:
        shutil.rmtree(EXPECTED, ignore_errors=True)
    os.makedirs(EXPECTED, exist_ok=True)
    failed = []
    for name, args, files in chosen:
        got = transcript(os.path.abspath(a.cli), data, name, args, files)
        path = os.path.join(EXPECTED, name + ".txt")
        if a.update:
            with open(path, "w") as f:
                f.write(got)
            continue
        want = open(path).read() if os.path.exists(path) else ""
        if not same(want, got):
            failed.append(name)
            sys.stdout.writelines(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                                       f"expected/{name}.txt", "now"))
    if a.update:
        print(f"golden: wrote {len(chosen)} transcripts to {EXPECTED}")
        return 0
    print(f"golden: {len(chosen) - len(failed)} of {len(chosen)} cases unchanged"
          + (f"; changed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
