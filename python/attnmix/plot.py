# SPDX-License-Identifier: Apache-2.0
"""attnmix.plot: pictures of what a model attends to and what it learned (matplotlib).

Every function returns a ``matplotlib.figure.Figure`` and never calls ``show()`` or touches pyplot's global state, so
it works in scripts, notebooks and on machines without a display; save a figure with ``fig.savefig("a.png")`` (or
``.svg``, ``.pdf``). ::

    import attnmix
    from attnmix import plot

    model = attnmix.optimize(rows, attnmix.ResponsibilityAttentionEstimator(16, 4, 8, 16), out=None)
    plot.responsibilities(model, rows[:8]).savefig("responsibilities.png")
    plot.attention_tables(model).savefig("tables.svg")

What each picture shows (the mechanisms: docs/mechanisms.md):

* ``responsibilities(model, rows)``: responsibility attention's posterior over context positions, one row per
  observation, each cell labelled with its context symbol; the row labels give the target and the prediction.
* ``attention_tables(model)``: responsibility attention's key table K (S × D), emission table B (S × T) and position
  prior π.
* ``hop_posteriors(model, rows)``: chained attention's posterior over positions at every hop (one panel per hop), cells
  labelled key→value, so a transitive path shows as a diagonal walk from panel to panel.
* ``key_tables(model)``: chained attention's key table of every hop (S × S).
* ``embeddings(model)``: the variational families' posterior-mean embeddings in the plane of their first two principal
  components, each with its posterior spread as an ellipse (one standard deviation).
* ``fit_history(history)``: the log-likelihood (and validation score) per EM iteration.
* ``lm_history(history)``: a streaming language model's training loss in bits per byte per step, its held-out bits
  per byte, its training speed and, for moment closure, each layer's live clusters, bank mass and far-field share of
  the attention.
* ``assignment_frequencies(freq, tree)``: the matching-frequency matrix of the assignment tree with its spanning tree
  drawn over it.
* ``assignment_scaling(results)``: the assignment-tree experiment's frequency RMSE against the number of samples K
  (log-log, with the K^(-1/2) law) and the union of matched edges against its occupancy prediction.

Large vocabularies: the tables show the ``top_k`` symbols whose emission rows are most peaked (the symbols the model
has most to say about), in id order, and say so in the title.
"""
import json
import os

import numpy as np

try:
    from matplotlib.figure import Figure
    from matplotlib.patches import Ellipse
except ImportError as error:  # pragma: no cover - Debian's python3-matplotlib is a test dependency
    raise ImportError("attnmix.plot needs matplotlib (Debian: apt install python3-matplotlib)") from error

__all__ = [
    "assignment_frequencies",
    "assignment_scaling",
    "attention_tables",
    "embeddings",
    "fit_history",
    "hop_posteriors",
    "key_tables",
    "lm_history",
    "responsibilities",
]

_CELL_TEXT_LIMIT = 24  # label cells only while the grid has at most this many columns


def _figure(panels, width_per_panel=4.5, height=3.8, columns=None):
    """A figure of `panels` axes, `columns` to a row (all in one row by default)."""
    columns = min(panels, columns or panels)
    rows = -(-panels // columns)
    fig = Figure(figsize=(width_per_panel * columns, height * rows), layout="constrained")
    return fig, [fig.add_subplot(rows, columns, i + 1) for i in range(panels)]


def _heatmap(fig, ax, values, title, xlabel, ylabel, vmin=None, vmax=None, cmap="viridis"):
    image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap=cmap, vmin=vmin, vmax=vmax)
    rows, cols = np.shape(values)
    if cols <= _CELL_TEXT_LIMIT:  # integer ticks: one per column (row) of a small grid
        ax.set_xticks(range(cols))
    if rows <= _CELL_TEXT_LIMIT:
        ax.set_yticks(range(rows))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.colorbar(image, ax=ax, shrink=0.85)
    return image


def _label_cells(ax, labels, values, threshold=0.5):
    """Writes labels[i][j] in every cell of a grid of at most _CELL_TEXT_LIMIT columns, dark on light cells."""
    if values.shape[1] > _CELL_TEXT_LIMIT:
        return
    for (i, j), text in np.ndenumerate(np.asarray(labels, dtype=object)):
        ax.text(j, i, str(text), ha="center", va="center", fontsize=7,
                color="black" if values[i, j] > threshold else "white")


def _top_symbols(emission, top_k):
    """The ids of the top_k symbols with the most peaked emission rows, in id order (all when S <= top_k)."""
    S = emission.shape[0]
    if top_k is None or S <= top_k:
        return np.arange(S)
    return np.sort(np.argsort(-emission.max(axis=1), kind="stable")[:top_k])


def _shown(symbols, S):
    return "" if len(symbols) == S else f" ({len(symbols)} of {S} symbols)"


def _rows(data, fields, where):
    """The observations of data (a sequence of tuples, or a tuple of per-field arrays) as a list of tuples."""
    if isinstance(data, tuple) and len(data) == fields and all(hasattr(a, "shape") for a in data):
        return list(zip(*data))
    rows = list(data)
    if any(len(row) != fields for row in rows):
        raise ValueError(f"{where}: every observation must have {fields} fields")
    return rows


def responsibilities(model, rows):
    """Responsibility attention's posterior r[n, i] over context positions for each observation (context, query,
    target): a heatmap of observations × positions, each cell labelled with its context symbol, each row with its
    target t and the predicted target (the argmax of predict_proba).

    Example: fit a small model to 200 rows drawn from a known one, then draw its posterior on six of them:

    >>> import numpy as np
    >>> import attnmix
    >>> from attnmix import plot
    >>> rng = np.random.default_rng(0)  # 5 symbols, 3-dimensional queries, 4 targets, 4 positions
    >>> truth = attnmix.ResponsibilityAttentionDistribution(
    ...     rng.standard_normal((5, 3)), rng.dirichlet(np.ones(4), size=5), np.full(4, 0.25), sigma2=0.5)
    >>> rows = truth.sampler(seed=1).sample(200)  # (context, query, target)
    >>> model = attnmix.optimize(rows, truth.estimator(), max_its=3, rng=0, out=None)
    >>> fig = plot.responsibilities(model, rows[:6])
    >>> fig.axes[0].get_images()[0].get_array().shape  # observations × positions
    (6, 4)
    """
    rows = _rows(rows, 3, "plot.responsibilities")
    contexts = np.array([row[0] for row in rows], dtype=np.int64)
    queries = np.array([row[1] for row in rows], dtype=np.float64)
    targets = [int(row[2]) for row in rows]
    r = model.responsibilities((contexts, queries, np.array(targets, dtype=np.int64)))
    predicted = model.predict_proba(contexts, queries).argmax(axis=1)
    fig, (ax,) = _figure(1, width_per_panel=max(5.5, 0.5 * contexts.shape[1] + 3),
                         height=max(3.0, 0.4 * len(rows) + 1.5))
    _heatmap(fig, ax, r, "p(position | context, query, target)", "position", "observation", 0.0, 1.0)
    _label_cells(ax, contexts, r)
    ax.set_yticks(range(len(rows)), [f"t={t} pred={p}" for t, p in zip(targets, predicted)])
    return fig


def attention_tables(model, top_k=32):
    """Responsibility attention's parameters: the key table K (symbols × query dimensions), the emission table B
    (symbols × targets) and the position prior π.

    Example: a model built from its parameters, 3 symbols with one-hot keys and emissions and 2 positions:

    >>> import numpy as np
    >>> import attnmix
    >>> from attnmix import plot
    >>> model = attnmix.ResponsibilityAttentionDistribution(np.eye(3), np.eye(3), np.full(2, 0.5))
    >>> fig = plot.attention_tables(model)
    >>> [ax.get_title() for ax in fig.axes[:3]]  # the three panels (then their colour bars)
    ['key table K', 'emission B = p(target | symbol)', 'position prior π']
    """
    S = model.num_symbols
    shown = _top_symbols(model.emission, top_k)
    fig, (keys, emission, prior) = _figure(3)
    _heatmap(fig, keys, model.key_means[shown], "key table K" + _shown(shown, S), "query dimension", "symbol",
             cmap="coolwarm")
    _heatmap(fig, emission, model.emission[shown], "emission B = p(target | symbol)", "target", "symbol", 0.0, 1.0)
    for ax in (keys, emission):
        if len(shown) <= _CELL_TEXT_LIMIT:
            ax.set_yticks(range(len(shown)), [str(s) for s in shown])
    prior.bar(range(model.context_length), model.position_prior, color="tab:blue")
    prior.set_xticks(range(model.context_length))
    prior.set_title("position prior π")
    prior.set_xlabel("position")
    prior.set_ylabel("probability")
    return fig


def hop_posteriors(model, rows):
    """Chained attention's posterior over positions at every hop for each observation (keys, values, query, target):
    one panel per hop, observations × positions, cells labelled key→value.

    Example: a two-hop model over 6 symbols built from random parameters, on four rows it samples:

    >>> import numpy as np
    >>> import attnmix
    >>> from attnmix import plot
    >>> rng = np.random.default_rng(7)  # key tables (hops × symbols × symbols), emission (symbols × targets)
    >>> model = attnmix.ChainedAttentionDistribution(rng.standard_normal((2, 6, 6)), rng.dirichlet(np.ones(6), size=6))
    >>> rows = model.sampler(seed=2, context_length=5).sample(4)  # (keys, values, query, target)
    >>> fig = plot.hop_posteriors(model, rows)
    >>> [ax.get_title() for ax in fig.axes[:2]]  # one panel per hop (then their colour bars)
    ['hop 1: p(position | row)', 'hop 2: p(position | row)']
    """
    rows = _rows(rows, 4, "plot.hop_posteriors")
    keys = np.array([row[0] for row in rows], dtype=np.int64)
    values = np.array([row[1] for row in rows], dtype=np.int64)
    queries = np.array([int(row[2]) for row in rows], dtype=np.int64)
    targets = np.array([int(row[3]) for row in rows], dtype=np.int64)
    gamma = model.posterior((keys, values, queries, targets))  # (n, L, N)
    labels = np.array([[f"{k}→{v}" for k, v in zip(kr, vr)] for kr, vr in zip(keys, values)], dtype=object)
    fig, axes = _figure(model.n_hops, width_per_panel=max(4.5, 0.6 * keys.shape[1] + 2.5),
                        height=max(3.0, 0.4 * len(rows) + 1.5))
    for hop, ax in enumerate(axes):
        _heatmap(fig, ax, gamma[:, hop, :], f"hop {hop + 1}: p(position | row)", "position", "observation", 0.0, 1.0)
        _label_cells(ax, labels, gamma[:, hop, :])
        ax.set_yticks(range(len(rows)), [f"q={q} t={t}" for q, t in zip(queries, targets)])
    return fig


def key_tables(model, top_k=32):
    """Chained attention's key table of every hop: row u is the point a query (or value) u is compared against.

    Example: a two-hop model over 4 symbols whose hops both match a symbol with itself:

    >>> import numpy as np
    >>> import attnmix
    >>> from attnmix import plot
    >>> model = attnmix.ChainedAttentionDistribution(np.stack([np.eye(4), np.eye(4)]), np.eye(4))
    >>> fig = plot.key_tables(model)
    >>> [ax.get_title() for ax in fig.axes[:2]]  # one heatmap per hop (then their colour bars)
    ['hop 1 key table', 'hop 2 key table']
    """
    S = model.num_symbols
    shown = _top_symbols(model.emission, top_k)
    tables = model.key_tables
    fig, axes = _figure(model.n_hops)
    for hop, ax in enumerate(axes):
        _heatmap(fig, ax, tables[hop][np.ix_(shown, shown)], f"hop {hop + 1} key table" + _shown(shown, S),
                 "symbol", "symbol", cmap="coolwarm")
    return fig


def embeddings(model, labels=None):
    """The variational families' posterior-mean embeddings m (S × D) projected on their first two principal
    components, each drawn with the projection of its posterior covariance diag(exp(log_var)) as a one-standard-
    deviation ellipse and labelled with its symbol id (or labels[s]).

    Example: 6 symbols embedded in 4 dimensions, each with posterior variance e^-2 on every axis:

    >>> import numpy as np
    >>> import attnmix
    >>> from attnmix import plot
    >>> rng = np.random.default_rng(3)  # mean, log_var (symbols × D), emission (symbols × targets), position prior
    >>> model = attnmix.VariationalEmbeddingAttentionDistribution(
    ...     rng.standard_normal((6, 4)), np.full((6, 4), -2.0), rng.dirichlet(np.ones(4), size=6), np.full(3, 1 / 3))
    >>> fig = plot.embeddings(model, labels="abcdef")
    >>> len(fig.axes[0].patches), [text.get_text() for text in fig.axes[0].texts]  # an ellipse and a label each
    (6, ['a', 'b', 'c', 'd', 'e', 'f'])
    """
    mean, variance = np.asarray(model.mean), np.exp(np.asarray(model.log_var))
    S, D = mean.shape
    labels = [str(s) for s in range(S)] if labels is None else [str(x) for x in labels]
    if len(labels) != S:
        raise ValueError(f"plot.embeddings: {len(labels)} labels for {S} symbols")
    centred = mean - mean.mean(axis=0)
    if D == 1:
        axes_2d = np.array([[1.0], [0.0]])
    else:
        axes_2d = np.linalg.svd(centred, full_matrices=False)[2][:2]  # (2, D), rows orthonormal
    points = centred @ axes_2d.T
    fig, (ax,) = _figure(1, width_per_panel=6.0, height=5.5)
    for s in range(S):
        covariance = (axes_2d * variance[s]) @ axes_2d.T  # P diag(v_s) Pᵀ
        eigenvalues, eigenvectors = np.linalg.eigh(covariance)
        angle = np.degrees(np.arctan2(eigenvectors[1, 1], eigenvectors[0, 1]))
        ax.add_patch(Ellipse(points[s], 2 * np.sqrt(eigenvalues[1]), 2 * np.sqrt(eigenvalues[0]), angle=angle,
                             alpha=0.15, color="tab:blue"))
        ax.annotate(labels[s], points[s], fontsize=7, ha="center", va="center")
    ax.scatter(points[:, 0], points[:, 1], s=8, color="tab:blue")
    ax.set_title(f"posterior-mean embeddings ({S} symbols, D = {D})\nin their first two principal components")
    ax.set_xlabel("component 1")
    ax.set_ylabel("component 2")
    ax.autoscale_view()
    return fig


def _history_records(history):
    if isinstance(history, (str, os.PathLike)):
        with open(history, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    return list(history)


def fit_history(history):
    """The log-likelihood per EM iteration (and the validation score where recorded). history: a JSON Lines file
    (``attnmix fit --history``), a sequence of dicts with "iteration", "log_likelihood" and optionally "validation",
    or a sequence of log-likelihoods (iterations 1, 2, ...).

    Example: the history that attnmix.optimize records of a three-iteration fit with a validation set:

    >>> import attnmix
    >>> from attnmix import plot
    >>> rows = attnmix.CategoricalDistribution([0.2, 0.3, 0.5]).sampler(seed=1).sample(100)
    >>> history = []
    >>> model = attnmix.optimize(rows, attnmix.CategoricalEstimator(3), max_its=3, delta=None, vdata=rows[:20],
    ...                          rng=0, out=None, history=history)
    >>> fig = plot.fit_history(history)
    >>> [(line.get_label(), len(line.get_xdata())) for line in fig.axes[0].get_lines()]
    [('training log-likelihood', 3), ('validation log-likelihood', 3)]
    """
    history = _history_records(history)
    if not history:
        raise ValueError("plot.fit_history: the history is empty")
    if not isinstance(history[0], dict):
        history = [{"iteration": i + 1, "log_likelihood": float(v)} for i, v in enumerate(history)]
    iterations = [h["iteration"] for h in history]
    fig, (ax,) = _figure(1, width_per_panel=6.0, height=4.0)
    ax.plot(iterations, [h["log_likelihood"] for h in history], marker="o", label="training log-likelihood")
    validation = [(h["iteration"], h["validation"]) for h in history if h.get("validation") is not None]
    if validation:
        ax.plot(*zip(*validation), marker="s", label="validation log-likelihood")
    ax.set_title("EM fit")
    ax.set_xlabel("iteration")
    ax.set_ylabel("log-likelihood")
    ax.legend()
    return fig


def lm_history(history):
    """A streaming language model's training (``attnmix lm train --history``: a JSON Lines file or its records):
    the loss per step in bits per byte, with the held-out bits per byte wherever the records have them (every
    ``--eval-every`` steps and the final model's last line), the
    training speed in tokens per second and, for moment closure, per layer as the far field's bank fills up: the
    live clusters (mean over the streams), the bank mass (the evicted tokens the clusters summarise, mean over
    streams and heads) and the far field's share of the attention (the softmax weight on clusters and stored
    tokens). Histories written before the bank mass and the share were recorded get the clusters panel only.

    Example: the records of four training steps (loss in nats) and the final model's held-out line, as
    ``attnmix lm train --history`` writes them:

    >>> from attnmix import plot
    >>> records = [{"step": s, "loss": 2.0 / s, "tokens_per_second": 1000.0} for s in (1, 2, 3, 4)]
    >>> records.append({"step": 4, "heldout_bits_per_byte": 1.5})
    >>> fig = plot.lm_history(records)
    >>> [ax.get_title() for ax in fig.axes]  # no far-field panels: these records have no "clusters"
    ['loss', 'training speed']
    """
    records = _history_records(history)
    steps = [r for r in records if "loss" in r]
    if not steps:
        raise ValueError("plot.lm_history: the history has no training steps")
    heldout = [r for r in records if "heldout_bits_per_byte" in r]
    far_panels = [(key, title, ylabel) for key, title, ylabel in (
        ("clusters", "far field: live clusters", "clusters (mean over streams)"),
        ("bank_mass", "far field: bank mass", "tokens summarised (per stream and head)"),
        ("far_share", "far field: share of attention", "softmax weight on the far field"),
    ) if key in steps[0]]
    fig, axes = _figure(2 + len(far_panels), columns=3)
    loss, speed = axes[:2]
    step_axis = [r["step"] for r in steps]
    loss.plot(step_axis, [r["loss"] / np.log(2) for r in steps], label="training")
    if heldout:
        loss.plot([r["step"] for r in heldout], [r["heldout_bits_per_byte"] for r in heldout], color="tab:red",
                  marker="o", zorder=3, label=f"held out (last: {heldout[-1]['heldout_bits_per_byte']:.3f})")
    loss.set_title("loss")
    loss.set_xlabel("step")
    loss.set_ylabel("bits per byte")
    loss.legend()
    speed.plot(step_axis, [r["tokens_per_second"] for r in steps])
    speed.set_title("training speed")
    speed.set_xlabel("step")
    speed.set_ylabel("tokens per second")
    for ax, (key, title, ylabel) in zip(axes[2:], far_panels):
        values = np.array([r[key] for r in steps], dtype=float)  # (steps, layers)
        for layer in range(values.shape[1]):
            ax.plot(step_axis, values[:, layer], label=f"layer {layer}")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.legend()
    if any(key == "far_share" for key, _, _ in far_panels):
        axes[-1].set_ylim(0.0, 1.0)
    return fig


def assignment_frequencies(freq, tree):
    """The matching frequencies of the assignment tree (queries × keys, from attnmix.assign.frequency_estimate) with
    the maximum spanning tree's edges (attnmix.assign.kruskal_tree) drawn as red outlines.

    Example: 6 queries and 5 keys with random costs, K = 64 sampled assignments at temperature 1.7:

    >>> import numpy as np
    >>> import attnmix
    >>> from attnmix import plot
    >>> from attnmix.assign import frequency_estimate, kruskal_tree
    >>> freq = frequency_estimate(np.random.default_rng(0).standard_normal((6, 5)), 1.7, 64, attnmix.Rng(11))
    >>> fig = plot.assignment_frequencies(freq, kruskal_tree(freq))
    >>> fig.axes[0].get_title()  # a spanning tree of 6 + 5 nodes has 10 edges
    'matching frequencies and spanning tree (10 edges)'
    """
    freq, tree = np.asarray(freq), np.asarray(tree, dtype=bool)
    if freq.shape != tree.shape:
        raise ValueError(f"plot.assignment_frequencies: freq {freq.shape} and tree {tree.shape} differ in shape")
    fig, (ax,) = _figure(1, width_per_panel=6.0, height=5.0)
    _heatmap(fig, ax, freq, f"matching frequencies and spanning tree ({int(tree.sum())} edges)", "key", "query",
             0.0, max(float(freq.max()), 1e-12), cmap="Greys")
    rows, cols = np.nonzero(tree)
    ax.scatter(cols, rows, s=60, facecolors="none", edgecolors="tab:red", linewidths=1.2, label="tree edge")
    ax.legend(loc="upper right", fontsize=7)
    return fig


def assignment_scaling(results):
    """The assignment-tree experiment (a dict from run_assignment_tree_experiment or a results.json path): the
    frequency RMSE against K on log-log axes with the K^(-1/2) law through its first point, and the union of matched
    edges against the occupancy prediction.

    Example: a hand-written results document with the keys the figure reads
    (attnmix.assign.run_assignment_tree_experiment(1234) gives the real one, in a few seconds):

    >>> from attnmix import plot
    >>> results = {"prediction_1_rmse": {"4": 0.1, "16": 0.05, "64": 0.025}, "prediction_1_rmse_slope_observed": -0.5,
    ...            "prediction_2_union_edges": [{"K": 4, "observed": 30, "predicted": 31},
    ...                                         {"K": 16, "observed": 50, "predicted": 49}]}
    >>> fig = plot.assignment_scaling(results)
    >>> [ax.get_title() for ax in fig.axes]
    ['frequency RMSE, slope -0.500', 'union of matched edges']
    """
    if isinstance(results, (str, os.PathLike)):
        with open(results, encoding="utf-8") as f:
            results = json.load(f)
    rmse = {int(k): v for k, v in results["prediction_1_rmse"].items()}
    K = np.array(sorted(rmse), dtype=np.float64)
    observed = np.array([rmse[int(k)] for k in K])
    fig, (left, right) = _figure(2)
    left.loglog(K, observed, marker="o", label="observed RMSE")
    left.loglog(K, observed[0] * np.sqrt(K[0] / K), linestyle="--", label="K^(-1/2)")
    left.set_title(f"frequency RMSE, slope {results['prediction_1_rmse_slope_observed']:.3f}")
    left.set_xlabel("samples K")
    left.set_ylabel("RMSE")
    left.legend()
    union = results["prediction_2_union_edges"]
    right.plot([u["K"] for u in union], [u["observed"] for u in union], marker="o", label="observed")
    right.plot([u["K"] for u in union], [u["predicted"] for u in union], linestyle="--", label="predicted")
    right.set_xscale("log")
    right.set_title("union of matched edges")
    right.set_xlabel("samples K")
    right.set_ylabel("edges")
    right.legend()
    return fig
