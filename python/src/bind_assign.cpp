// SPDX-License-Identifier: Apache-2.0
// attnmix.assign (docs/mechanisms.md#assignment-tree-attention): the building blocks of assignment-tree attention and
// the seed-004 experiment, as the submodule _core.assign (re-exported by python/attnmix/assign.py). Arguments go
// through the strict conversion layer; the calls that sample (frequency estimates, the experiment)
// run with the GIL released.
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "attnmix/assign/assignment_tree.hpp"
#include "attnmix/assign/experiment.hpp"
#include "attnmix/assign/lap.hpp"
#include "bindings.hpp"
#include "convert.hpp"

namespace attnmix::python {

namespace {

using namespace pybind11::literals;

py::array_t<double> matrix_out(const Matrix& m) {
  return copy_reals(m.data(), {m.rows(), m.cols()});
}

py::array_t<bool> mask_out(const assign::Mask& m) {
  return copy_bools(m.data(), {m.rows(), m.cols()});
}

py::array_t<int64_t> index_out(const std::vector<Index>& v) {
  static_assert(sizeof(Index) == sizeof(int64_t));
  return copy_ids(reinterpret_cast<const int64_t*>(v.data()), {static_cast<Index>(v.size())});
}

/// estimate(cost, tau, K, rng) of a sampled estimator on its validated (cost, tau, K, rng) arguments, run without
/// the GIL.
template <class Estimate>
auto sampled(const char* where, py::handle cost, py::handle tau, py::handle K, py::handle rng, Estimate estimate) {
  const Matrix c = reals_2d(cost, where, "cost");
  const double t = real_number(tau, where, "tau");
  const int64_t n_samples = positive_int(K, where, "K");
  RngSource source = rng_source(rng, 0, where);
  const py::gil_scoped_release release;
  return estimate(c, t, n_samples, source.get());
}

}  // namespace

void bind_assign(py::module_& m) {
  py::module_ a = m.def_submodule(
      "assign",
      "Assignment-tree attention (docs/mechanisms.md#assignment-tree-attention): perturb-and-MAP "
      "assignment frequencies, their maximum spanning tree as a sparse attention support, and the "
      "assignment-tree experiment.");

  a.def(
      "linear_sum_assignment",
      [](py::object cost) {
        const Matrix c = reals_2d(cost, "linear_sum_assignment", "cost");
        const assign::Assignment result = assign::linear_sum_assignment(c);
        return py::make_tuple(index_out(result.rows), index_out(result.cols));
      },
      "cost"_a,
      "Exact minimum-cost rectangular assignment, as scipy.optimize.linear_sum_assignment: "
      "returns (rows, cols), int64 arrays of min(nq, nk) matched pairs sorted by row. +inf "
      "entries are forbidden pairs; NaN, -inf or an infeasible problem raise ValueError.\n\n"
      "Example:\n\n"
      ">>> import numpy as np\n"
      ">>> from attnmix.assign import linear_sum_assignment\n"
      ">>> rows, cols = linear_sum_assignment(np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]]))\n"
      ">>> rows.tolist(), cols.tolist()\n"
      "([0, 1, 2], [1, 0, 2])\n");

  a.def(
      "assignment_sample",
      [](py::object cost, py::object tau, py::object rng) {
        const char* where = "assignment_sample";
        const Matrix c = reals_2d(cost, where, "cost");
        const double t = real_number(tau, where, "tau");
        RngSource source = rng_source(rng, 0, where);
        const assign::Assignment result = assign::assignment_sample(c, t, source.get());
        py::list pairs;
        for (size_t k = 0; k < result.rows.size(); ++k)
          pairs.append(py::make_tuple(result.rows[k], result.cols[k]));
        return pairs;
      },
      "cost"_a, "tau"_a, "rng"_a,
      "One perturb-and-MAP sample: adds tau * Gumbel(0, 1) noise (one (nq, nk) table drawn "
      "row-major from rng) to cost and solves the assignment. Returns the matched (i, j) pairs. "
      "rng: an attnmix.Rng (advanced in place), an int seed or a numpy Generator.\n\n"
      "Example (tau = 0 adds no noise: the exact assignment):\n\n"
      ">>> import numpy as np\n"
      ">>> from attnmix.assign import assignment_sample\n"
      ">>> assignment_sample(np.array([[4.0, 1.0, 3.0], [2.0, 0.0, 5.0], [3.0, 2.0, 2.0]]), 0.0, 7)\n"
      "[(0, 1), (1, 0), (2, 2)]\n");

  a.def(
      "frequency_estimate",
      [](py::object cost, py::object tau, py::object K, py::object rng) {
        return matrix_out(sampled("frequency_estimate", cost, tau, K, rng, [](auto&&... args) {
          return assign::frequency_estimate(args...);
        }));
      },
      "cost"_a, "tau"_a, "K"_a, "rng"_a,
      "The mean of K assignment indicator matrices (nq, nk); every column sums to 1 when "
      "nq >= nk. Draws one seed from rng; the result does not depend on the thread count.\n\n"
      "Example:\n\n"
      ">>> import numpy as np\n"
      ">>> from attnmix.assign import frequency_estimate\n"
      ">>> freq = frequency_estimate(np.array([[4.0, 1.0], [2.0, 0.0], [3.0, 2.0]]), 1.0, 200, 7)\n"
      ">>> freq.shape, freq.sum(axis=0).tolist()\n"
      "((3, 2), [1.0, 1.0])\n");

  a.def(
      "kruskal_tree",
      [](py::object score) {
        const Matrix s = reals_2d(score, "kruskal_tree", "score");
        return mask_out(assign::kruskal_tree(s));
      },
      "score"_a,
      "Maximum spanning tree of the complete bipartite graph (query i = node i, key j = node "
      "nq + j) weighted by score: a bool (nq, nk) array with nq + nk - 1 True entries. Ties "
      "follow the order (-score, i, nq + j).\n\n"
      "Example:\n\n"
      ">>> import numpy as np\n"
      ">>> from attnmix.assign import kruskal_tree\n"
      ">>> kruskal_tree(np.array([[3.0, 1.0], [2.0, 0.5]])).tolist()\n"
      "[[True, True], [True, False]]\n");

  a.def(
      "assignment_tree",
      [](py::object cost, py::object tau, py::object K, py::object rng) {
        const assign::AssignmentTree tree = sampled("assignment_tree", cost, tau, K, rng, [](auto&&... args) {
          return assign::assignment_tree(args...);
        });
        return py::make_tuple(matrix_out(tree.tree_freq), mask_out(tree.tree),
                              matrix_out(tree.freq));
      },
      "cost"_a, "tau"_a, "K"_a, "rng"_a,
      "frequency_estimate then kruskal_tree: returns (freq * tree, tree, freq).\n\n"
      "Example:\n\n"
      ">>> import numpy as np\n"
      ">>> from attnmix.assign import assignment_tree\n"
      ">>> tree_freq, tree, freq = assignment_tree(np.arange(12.0).reshape(3, 4) % 5, 1.0, 100, 7)\n"
      ">>> int(tree.sum()), bool(np.array_equal(tree_freq, freq * tree))  # nq + nk - 1 edges\n"
      "(6, True)\n");

  a.def(
      "sparse_attention",
      [](py::object q, py::object k, py::object v, py::object tree_freq, py::object alpha,
         py::object eps, py::object return_report) {
        const char* where = "sparse_attention";
        const Matrix qm = reals_2d(q, where, "q");
        const Matrix km = reals_2d(k, where, "k");
        const Matrix vm = reals_2d(v, where, "v");
        const Matrix f = reals_2d(tree_freq, where, "tree_freq");
        const double al = real_number(alpha, where, "alpha");
        const double ep = real_number(eps, where, "eps");
        const bool report = flag(return_report, where, "return_report");
        const assign::SparseAttentionResult r = assign::sparse_attention(qm, km, vm, f, al, ep);
        if (!report) return py::make_tuple(matrix_out(r.out), matrix_out(r.p));
        py::list repaired;
        for (Index i : r.repaired_rows) repaired.append(i);
        py::dict info;
        info["repaired_rows"] = repaired;
        return py::make_tuple(matrix_out(r.out), matrix_out(r.p), info);
      },
      "q"_a, "k"_a, "v"_a, "tree_freq"_a, "alpha"_a = 1.0, "eps"_a = 1e-6, py::kw_only(),
      "return_report"_a = false,
      "Attention restricted to the support tree_freq > 0: logits q k^T / sqrt(d) + "
      "alpha * log(eps + tree_freq), -inf off the support, softmax, p v. A query row with empty "
      "support is repaired with its first argmax of tree_freq. Returns (out, p), or with "
      "return_report=True (out, p, {'repaired_rows': [i, ...]}).\n\n"
      "Example (each query may attend only to its own key):\n\n"
      ">>> import numpy as np\n"
      ">>> from attnmix.assign import sparse_attention\n"
      ">>> out, p = sparse_attention(np.eye(3), np.eye(3), np.arange(6.0).reshape(3, 2), np.eye(3))\n"
      ">>> p.tolist(), out.tolist()\n"
      "([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])\n");

  a.def(
      "dense_attention",
      [](py::object q, py::object k, py::object v) {
        const char* where = "dense_attention";
        const assign::AttentionResult r = assign::dense_attention(
            reals_2d(q, where, "q"), reals_2d(k, where, "k"), reals_2d(v, where, "v"));
        return py::make_tuple(matrix_out(r.out), matrix_out(r.p));
      },
      "q"_a, "k"_a, "v"_a,
      "Standard softmax attention with logits q k^T / sqrt(d): returns (out, p).\n\n"
      "Example:\n\n"
      ">>> import numpy as np\n"
      ">>> from attnmix.assign import dense_attention\n"
      ">>> out, p = dense_attention(np.zeros((2, 3)), np.ones((4, 3)), np.arange(8.0).reshape(4, 2))\n"
      ">>> p.tolist(), out.tolist()  # equal logits: uniform weights\n"
      "([[0.25, 0.25, 0.25, 0.25], [0.25, 0.25, 0.25, 0.25]], [[3.0, 4.0], [3.0, 4.0]])\n");

  a.def(
      "zero_frequency_tree_edges",
      [](py::object tree, py::object freq) {
        const char* where = "zero_frequency_tree_edges";
        const BoolMatrix t = bools_2d(tree, where, "tree");
        const Matrix f = reals_2d(freq, where, "freq");
        return static_cast<int64_t>(assign::zero_frequency_tree_edges(t, f));
      },
      "tree"_a, "freq"_a,
      "The number of tree edges whose frequency is zero (they are left out of sparse_attention's "
      "support).\n\n"
      "Example:\n\n"
      ">>> import numpy as np\n"
      ">>> from attnmix.assign import zero_frequency_tree_edges\n"
      ">>> zero_frequency_tree_edges(np.eye(2, dtype=bool), np.array([[0.5, 0.5], [0.5, 0.0]]))\n"
      "1\n");

  a.def(
      "run_assignment_tree_experiment",
      [](py::object seed) {
        const auto s =
            seed_int(seed, "run_assignment_tree_experiment", "seed");
        nlohmann::ordered_json doc;
        {
          const py::gil_scoped_release release;
          doc = assign::run_assignment_tree_experiment(s).to_json();
        }
        return json_to_python(doc);
      },
      "seed"_a = 1234,
      "The assignment-tree experiment: returns the results document as a dict whose keys "
      "are in the order of results.json (what `attnmix assign-tree` writes). Takes seconds.\n\n"
      "Example:\n\n"
      ">>> from attnmix.assign import run_assignment_tree_experiment\n"
      ">>> results = run_assignment_tree_experiment(seed=1234)\n"
      ">>> len(results['prediction_3_tree_edges'])  # a spanning tree of 16 queries and 15 keys\n"
      "30\n");
}

}  // namespace attnmix::python
