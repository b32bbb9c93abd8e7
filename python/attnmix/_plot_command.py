# SPDX-License-Identifier: Apache-2.0
"""`attnmix plot`: the figures of attnmix.plot for a saved model, a fit history or the assignment-tree results, written
as PNG and SVG files (and, with --html, one page showing them all). The attnmix program runs this module in the Python
the build used; ``python3 -m attnmix._plot_command --help`` is the same command."""
import argparse
import html
import json
import os
import sys
import tempfile

import numpy as np

EXIT_USAGE, EXIT_DATA = 1, 2

# The data fields of the families whose rows have a picture, in observation order.
ROW_FIELDS = {
    "ResponsibilityAttentionDistribution": ("context", "query", "target"),
    "ChainedAttentionDistribution": ("keys", "values", "query", "target"),
}


class CommandError(Exception):
    """A message for the user, printed as 'attnmix: error: …' with exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # usage errors exit with the program's usage code, not argparse's 2
        self.print_usage(sys.stderr)
        sys.stderr.write(f"attnmix plot: error: {message}\n")
        sys.exit(EXIT_USAGE)


def parser():
    p = Parser(prog="attnmix plot", description="Draw a saved model, a training history or the assignment-tree results "
               "(attnmix.plot, matplotlib) as PNG and SVG files.",
               epilog="Figures by model family: responsibility attention: its tables, and with --data the "
               "responsibilities of the first --rows rows; chained attention: its key tables, and with --data the "
               "per-hop posteriors; the variational families: their embeddings. --history adds the log-likelihood "
               "curve of 'attnmix fit --history' or the loss curve of 'attnmix lm train --history'; --assign-tree "
               "(attnmix assign-tree --out) the experiment's scaling laws and its matching frequencies with their "
               "spanning tree. Files are written to --out DIR (created "
               "if missing), each atomically; the summary lists them.")
    p.add_argument("model", nargs="?", metavar="MODEL", help="a model file written by 'attnmix fit'")
    p.add_argument("--data", metavar="FILE", help="rows of the model's family (JSON Lines) to draw the posterior of")
    p.add_argument("--rows", type=int, default=8, metavar="N", help="how many rows of --data to draw (default 8)")
    p.add_argument("--history", metavar="FILE",
                   help="a history written by 'attnmix fit --history' or 'attnmix lm train --history'")
    p.add_argument("--assign-tree", metavar="FILE", help="results written by 'attnmix assign-tree --out'")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder the figures are written to")
    p.add_argument("--html", action="store_true", help="also write DIR/index.html: every figure with its caption")
    return p


def read_rows(path, fields, count):
    """The first `count` observations of a JSON Lines file, as tuples of the family's fields."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if len(rows) == count:
                    break
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise CommandError(f"{path}: line {number}: not JSON ({error.msg})") from None
                if not isinstance(record, dict):
                    raise CommandError(f"{path}: line {number}: expected a JSON object")
                missing = [name for name in fields if name not in record]
                if missing:
                    raise CommandError(f"{path}: line {number}: missing field '{missing[0]}' (this model's rows "
                                       f"have {', '.join(fields)})")
                rows.append(tuple(np.asarray(record[name]) for name in fields))
    except OSError as error:
        raise CommandError(f"{path}: cannot read the data ({error.strerror})") from None
    if not rows:
        raise CommandError(f"{path}: contains no rows")
    return rows


def figures(args):
    """(name, caption, figure) of everything the arguments ask for."""
    import attnmix
    from attnmix import plot

    out = []
    if args.model:
        try:
            model = attnmix.load_model(args.model)
        except (OSError, ValueError, TypeError) as error:
            raise CommandError(error.strerror if isinstance(error, OSError) and error.strerror else str(error)) \
                from None
        kind = type(model).__name__
        rows = read_rows(args.data, ROW_FIELDS[kind], args.rows) if args.data and kind in ROW_FIELDS else None
        if args.data and kind not in ROW_FIELDS:
            raise CommandError(f"--data: a {kind} has no per-row picture; leave --data out")
        try:
            if kind == "ResponsibilityAttentionDistribution":
                out.append(("tables", "Key table K, emission table B and position prior π.",
                            plot.attention_tables(model)))
                if rows:
                    out.append(("responsibilities", f"Which position each of the first {len(rows)} rows of "
                                f"{args.data} attends to (cells: context symbols; rows: target and prediction).",
                                plot.responsibilities(model, rows)))
            elif kind == "ChainedAttentionDistribution":
                out.append(("key_tables", "The key table of every hop.", plot.key_tables(model)))
                if rows:
                    out.append(("hop_posteriors", f"The position attended at each hop by the first {len(rows)} "
                                f"rows of {args.data} (cells: key→value).", plot.hop_posteriors(model, rows)))
            elif kind in ("VariationalEmbeddingAttentionDistribution", "VariationalMultiHopAttentionDistribution"):
                out.append(("embeddings", "Posterior-mean embeddings in their principal plane, with their "
                            "posterior spread (one standard deviation).", plot.embeddings(model)))
            else:
                raise CommandError(f"{args.model}: a {kind} has no picture (pictures exist for responsibility, "
                                   "chained and the variational attention families)")
        except (ValueError, TypeError, IndexError) as error:
            raise CommandError(f"{args.data or args.model}: {error}") from None
    if args.history:
        try:
            with open(args.history, encoding="utf-8") as f:
                first = f.readline()
            if '"step"' in first:  # attnmix lm train --history
                out.append(("history", f"Training loss and speed per step ({args.history}).",
                            plot.lm_history(args.history)))
            else:
                out.append(("history", f"Log-likelihood per EM iteration ({args.history}).",
                            plot.fit_history(args.history)))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise CommandError(f"{args.history}: not a history of attnmix fit or lm train ({error})") from None
    if args.assign_tree:
        try:
            with open(args.assign_tree, encoding="utf-8") as f:
                results = json.load(f)
            if not isinstance(results, dict) or not {"prediction_1_rmse", "prediction_3_frequencies"} & set(results):
                raise ValueError("it has neither prediction_1_rmse nor prediction_3_frequencies")
            if "prediction_1_rmse" in results:  # the demo's document has the frequencies only
                out.append(("assign_tree", "Assignment-tree experiment: frequency RMSE against K, and the union of "
                            "matched edges against its prediction.", plot.assignment_scaling(results)))
            if "prediction_3_frequencies" in results:  # results written before they were recorded lack them
                freq = np.array(results["prediction_3_frequencies"], dtype=np.float64)
                tree = np.zeros(freq.shape, dtype=bool)
                for query, key in results["prediction_3_tree_edges"]:
                    if not (0 <= query < freq.shape[0] and 0 <= key < freq.shape[1]):
                        raise ValueError(f"tree edge ({query}, {key}) lies outside the {freq.shape} frequencies")
                    tree[query, key] = True
                out.append(("assign_tree_frequencies", "Assignment-tree experiment: the matching frequencies of "
                            "prediction 3 (128 samples, queries × keys) with their maximum spanning tree circled.",
                            plot.assignment_frequencies(freq, tree)))
        except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
            raise CommandError(f"{args.assign_tree}: not assign-tree results ({error})") from None
    return out


def write_atomically(path, data):
    folder = os.path.dirname(path)
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=".plot-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def rendered(fig, fmt):
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt)
    return buffer.getvalue()


def html_page(items):
    """One self-contained page: every figure's SVG inline, with its caption."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8"><title>attnmix plot</title>',
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto}figure{margin:2em 0}"
             "svg{max-width:100%;height:auto}</style></head><body><h1>attnmix plot</h1>"]
    for name, caption, svg in items:
        body = svg.decode("utf-8")
        body = body[body.index("<svg"):]  # drop the XML declaration and doctype
        parts.append(f'<figure id="{name}">{body}<figcaption>{html.escape(caption)}</figcaption></figure>')
    parts.append("</body></html>")
    return "\n".join(parts).encode("utf-8")


def main(argv=None):
    args = parser().parse_args(argv)
    if not (args.model or args.history or args.assign_tree):
        parser().error("give a MODEL, --history or --assign-tree")
    if args.data and not args.model:
        parser().error("--data needs a MODEL")
    if args.rows <= 0:
        parser().error(f"--rows must be positive (got {args.rows})")
    try:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CommandError("attnmix plot needs matplotlib (Debian: apt install python3-matplotlib)") from None
        if os.path.exists(args.out) and not os.path.isdir(args.out):
            raise CommandError(f"--out {args.out} is not a folder")
        items = figures(args)
        os.makedirs(args.out, exist_ok=True)
        written, pages = [], []
        for name, caption, fig in items:
            svg = rendered(fig, "svg")
            write_atomically(os.path.join(args.out, name + ".png"), rendered(fig, "png"))
            write_atomically(os.path.join(args.out, name + ".svg"), svg)
            written.append(name)
            pages.append((name, caption, svg))
        if args.html:
            write_atomically(os.path.join(args.out, "index.html"), html_page(pages))
    except CommandError as error:
        sys.stderr.write(f"attnmix: error: {error}\n")
        return EXIT_DATA
    except OSError as error:
        sys.stderr.write(f"attnmix: error: {error.filename or args.out}: cannot write ({error.strerror})\n")
        return EXIT_DATA
    print(f"wrote {len(written)} figure{'s' if len(written) != 1 else ''} to {args.out} (PNG and SVG): "
          + ", ".join(written) + ("; the page index.html shows them all" if args.html else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
