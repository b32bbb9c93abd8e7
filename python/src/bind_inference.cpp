// SPDX-License-Identifier: Apache-2.0
// optimize() and score() in Python (docs/mechanisms.md#training). The arguments are converted with the GIL
// held; the fit itself (encoding aside) runs in the library with the GIL released, and the progress
// callback takes the GIL back only to write one line to `out` (and to append it to `history`).
#include <pybind11/eval.h>
#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/progress.hpp"
#include "attnmix/inference/reduce.hpp"
#include "bindings.hpp"
#include "convert.hpp"
#include "roles.hpp"

namespace attnmix::python {

namespace {

using namespace pybind11::literals;

constexpr const char* kOptimize = "optimize";

/// The default of optimize(out=...): an object whose repr is "sys.stdout", replaced by sys.stdout
/// at call time (so that a redirected sys.stdout, e.g. pytest's capture, receives the lines).
py::handle stdout_default() {
  static const py::handle sentinel = [] {
    py::dict scope;
    scope["__builtins__"] = py::module_::import("builtins");
    py::exec(R"(
class _DefaultOut:
    """optimize(out=sys.stdout): the sys.stdout of the moment of the call."""
    def __repr__(self):
        return "sys.stdout"
default_out = _DefaultOut()
)",
             scope);
    return py::object(scope["default_out"]).release();  // lives as long as the process
  }();
  return sentinel;
}

int int_option(py::object obj, const char* name, bool positive) {
  const int64_t v =
      positive ? positive_int(obj, kOptimize, name) : nonnegative_int(obj, kOptimize, name);
  if (v > std::numeric_limits<int>::max())
    throw ValueError(std::string(kOptimize) + ": " + name + " is too large (got " +
                     std::to_string(v) + ")");
  return static_cast<int>(v);
}

const DistributionHandle& distribution_arg(py::object obj, const char* where, const char* name) {
  if (!py::isinstance<DistributionHandle>(obj))
    throw TypeError(std::string(where) + ": " + name + " must be an attnmix distribution (got " +
                    type_name(obj) + ")");
  return obj.cast<const DistributionHandle&>();
}

py::object optimize_py(py::object data, py::object estimator, py::object max_its, py::object delta,
                       py::object init_p, py::object rng, py::object prev_estimate,
                       py::object vdata, py::object out, py::object print_iter,
                       py::object reuse_estep_ll, py::object num_threads, py::object history) {
  if (!py::isinstance<EstimatorHandle>(estimator))
    throw TypeError(std::string(kOptimize) + ": estimator must be an attnmix estimator (got " +
                    type_name(estimator) + ")");
  const AnyEstimator& est = estimator.cast<const EstimatorHandle&>().any;
  OptimizeOptions options;
  options.max_its = int_option(max_its, "max_its", false);
  if (delta.is_none())
    options.delta = std::nullopt;
  else
    options.delta = real_number(delta, kOptimize, "delta");
  options.init_p = real_number(init_p, kOptimize, "init_p");
  options.print_iter = int_option(print_iter, "print_iter", true);
  options.reuse_estep_ll = flag(reuse_estep_ll, kOptimize, "reuse_estep_ll");
  options.n_threads = num_threads.is_none() ? 0 : int_option(num_threads, "num_threads", true);
  options.validate();

  // Encoding (docs/mechanisms.md#training): one encoder for data and vdata, the model's when restarting.
  std::optional<AnyDistribution> prev;
  if (!prev_estimate.is_none())
    prev = distribution_arg(prev_estimate, kOptimize, "prev_estimate").any;
  const std::shared_ptr<DataEncoder> encoder =
      prev ? encoder_of(*prev) : encoder_of(est.make_accumulator());
  const AnyBatch batch = batch_of(data, *encoder);
  std::optional<AnyBatch> valid;
  if (!vdata.is_none()) valid = batch_of(vdata, *encoder);

  const py::object writer = out.is(stdout_default()) ? py::module_::import("sys").attr("stdout")
                                                     : py::reinterpret_borrow<py::object>(out);
  if (!history.is_none() && !py::isinstance<py::list>(history))
    throw TypeError(std::string(kOptimize) + ": history must be None or a list (got " + type_name(history) + ")");
  if (!writer.is_none() || !history.is_none())
    options.on_iteration = [&writer, &history](const IterationReport& report) {
      const py::gil_scoped_acquire gil;
      if (!writer.is_none()) writer.attr("write")(format_progress_line(report));
      if (!history.is_none()) {
        py::dict line;
        line["iteration"] = report.iteration;
        line["log_likelihood"] = report.log_likelihood;
        line["delta"] = std::isfinite(report.delta_log_likelihood) ? py::object(py::float_(report.delta_log_likelihood))
                                                                   : py::object(py::none());
        line["seconds"] = report.seconds;
        if (report.valid_log_likelihood) line["validation"] = *report.valid_log_likelihood;
        history.cast<py::list>().append(line);
      }
      if (PyErr_CheckSignals() != 0)
        throw py::error_already_set();  // Ctrl-C stops a long fit between lines
    };

  // The initialisation of optimize() (docs/mechanisms.md#training) draws from rng only when there is no previous
  // estimate.
  RngSource source = prev ? RngSource(0) : rng_source(rng, 0, kOptimize);
  AnyDistribution fitted;
  {
    const py::gil_scoped_release release;
    AnyDistribution start = prev ? *prev : initialize_model(batch, est, options, source.get());
    fitted = optimize(batch, est, options, std::move(start), valid ? &*valid : nullptr).model;
  }
  return wrap_distribution(std::move(fitted));
}

}  // namespace

void bind_inference(py::module_& m) {
  const OptimizeOptions defaults;
  m.def("optimize", &optimize_py, "data"_a, "estimator"_a, "max_its"_a = defaults.max_its,
        "delta"_a = defaults.delta, "init_p"_a = defaults.init_p, "rng"_a = py::none(),
        "prev_estimate"_a = py::none(), "vdata"_a = py::none(), "out"_a = stdout_default(),
        "print_iter"_a = defaults.print_iter, "reuse_estep_ll"_a = defaults.reuse_estep_ll,
        "num_threads"_a = py::none(), py::kw_only(), "history"_a = py::none(),
        R"(Fits `estimator`'s family to `data` by EM; returns the best-scoring model (docs/mechanisms.md#training).

data, vdata
    A list of observations, a tuple of numpy arrays (the fast path) or an EncodedBatch; encoded once with the
    estimator's encoder (or prev_estimate's). vdata, when given, is scored after every iteration.
max_its, delta
    At most max_its iterations; stop when the log-likelihood improves by less than delta or decreases
    (delta=None runs every iteration).
init_p
    The fraction of rows in the random initialisation (<= 0 means 0.1).
rng
    None (seed 0), an int seed, an attnmix.Rng (drawn from in place) or a numpy RandomState / Generator (one
    31-bit seed is drawn from it).
prev_estimate
    Continue from this model instead of initialising.
out, print_iter
    Where each progress line goes (None: silent); write every print_iter-th line.
reuse_estep_ll
    The fused loop (True) or the classic loop (False).
num_threads
    E-step threads (None: all cores); results are identical for every thread count.
history
    A list to append one dict per reported iteration to (iteration, log_likelihood, delta (None on the first),
    seconds, validation with vdata): the lines of `attnmix fit --history`, for attnmix.plot.fit_history.

Raises ValueError (with the row and field) for data the estimator's encoder rejects and ImpossibleEvidenceError
for rows the model gives probability zero. The GIL is released while the fit runs.

Example (a categorical fit is the observed frequencies):

>>> import attnmix
>>> model = attnmix.optimize([0, 1, 1, 2, 1, 1], attnmix.CategoricalEstimator(3), max_its=3, out=None)
>>> model.p.round(3).tolist()
[0.167, 0.667, 0.167]
)");
  m.def(
      "score",
      [](py::object dist, py::object data, py::object num_threads) {
        const DistributionHandle& d = distribution_arg(dist, "score", "dist");
        const AnyBatch batch = batch_of(data, *encoder_of(d.any));
        ParallelOptions options;
        options.n_threads =
            num_threads.is_none() ? 0 : int_option(num_threads, "num_threads", true);
        const py::gil_scoped_release release;
        return score(d.any, batch, options);
      },
      "dist"_a, "data"_a, py::kw_only(), "num_threads"_a = py::none(),
      "sum_n log p(x_n) over every row, summed in the library's fixed pairwise order: the score "
      "optimize() reports and the total `attnmix score` prints.\n\n"
      "Example:\n\n"
      ">>> import attnmix\n"
      ">>> from attnmix.inference import score\n"
      ">>> model = attnmix.CategoricalDistribution([0.25, 0.5, 0.25])\n"
      ">>> round(score(model, [1, 1, 0]), 6)  # 2 log 0.5 + log 0.25\n"
      "-2.772589\n");
}

}  // namespace attnmix::python
