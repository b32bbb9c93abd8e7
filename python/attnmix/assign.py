# SPDX-License-Identifier: Apache-2.0
"""attnmix.assign: assignment-tree attention (docs/mechanisms.md#assignment-tree-attention).

Perturb-and-MAP matchings of queries to keys, their edge frequencies, a maximum spanning tree of the bipartite graph,
and attention restricted to that tree, with the assignment-tree experiment::

    from attnmix import Rng
    from attnmix.assign import assignment_tree, sparse_attention

    tree_freq, tree, freq = assignment_tree(cost, 1.7, 128, Rng(777))
    out, p = sparse_attention(q, k, v, tree_freq, alpha=1.0)

``run_assignment_tree_experiment(seed=1234)`` returns what ``attnmix assign-tree`` writes to results.json, as a dict
with the keys in file order. Everything runs in the compiled module ``attnmix._core``.
"""
from attnmix import _core

linear_sum_assignment = _core.assign.linear_sum_assignment
assignment_sample = _core.assign.assignment_sample
frequency_estimate = _core.assign.frequency_estimate
kruskal_tree = _core.assign.kruskal_tree
assignment_tree = _core.assign.assignment_tree
sparse_attention = _core.assign.sparse_attention
dense_attention = _core.assign.dense_attention
zero_frequency_tree_edges = _core.assign.zero_frequency_tree_edges
run_assignment_tree_experiment = _core.assign.run_assignment_tree_experiment

__all__ = [
    "assignment_sample",
    "assignment_tree",
    "dense_attention",
    "frequency_estimate",
    "kruskal_tree",
    "linear_sum_assignment",
    "run_assignment_tree_experiment",
    "sparse_attention",
    "zero_frequency_tree_edges",
]
