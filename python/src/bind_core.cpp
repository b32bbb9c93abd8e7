// SPDX-License-Identifier: Apache-2.0
// attnmix.Rng, EncodedBatch, the role base classes every family inherits (Distribution, Estimator,
// Accumulator, AccumulatorFactory, DataEncoder) with their generic methods (docs/mechanisms.md#building-blocks), and
// the model files (docs/model-format.md). Calls that run an E-step or a scoring pass release the GIL.
#include <pybind11/stl.h>

#include <cmath>
#include <string>

#include "attnmix/io/model_file.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/reduce.hpp"
#include "bindings.hpp"
#include "convert.hpp"
#include "docstrings.hpp"
#include "roles.hpp"

namespace attnmix::python {

namespace {

using namespace pybind11::literals;

std::string class_of(py::object self) {
  return py::type::handle_of(self).attr("__name__").cast<std::string>();
}

py::list single(py::object x) {
  py::list rows;
  rows.append(x);
  return rows;
}

const DistributionHandle& model_arg(py::object obj, const std::string& where) {
  if (!py::isinstance<DistributionHandle>(obj))
    throw TypeError(where + ": estimate must be an attnmix distribution (got " + type_name(obj) +
                    ")");
  return obj.cast<const DistributionHandle&>();
}

/// The E-step of `model` on `batch` into acc (docs/mechanisms.md#building-blocks seq_update), atomic, without the GIL.
void accumulate(AnyAccumulator& acc, const AnyBatch& batch, const std::vector<double>& w,
                const AnyDistribution& model) {
  // Adding an empty accumulator of the model's family checks family and layout before any work.
  acc.merge_trusted(model.make_accumulator());
  const py::gil_scoped_release release;
  parallel_accumulate(model, batch, w, acc, {}, ParallelOptions{});
}

/// seq_initialize: the family's random responsibilities from rng, times w.
void initialize(AnyAccumulator& acc, const AnyBatch& batch, const std::vector<double>& w,
                py::object rng, const std::string& where) {
  RngSource source = rng_source(rng, 0, where);
  const py::gil_scoped_release release;
  acc.initialize(batch, w, source.get());
}

/// The statistics behind a combine / from_value / estimate argument: a value() tuple, or an
/// accumulator.
AnyAccumulator statistics_arg(py::object value, const AnyAccumulator& like,
                              const std::string& where) {
  if (py::isinstance<AccumulatorHandle>(value))
    return value.cast<const AccumulatorHandle&>().get();  // a copy
  return statistics_from_python(value, like, where);
}

std::string path_arg(py::object path) {
  const py::object fspath = py::module_::import("os").attr("fspath")(path);
  if (!PyUnicode_Check(fspath.ptr()))
    throw TypeError("model files: the path must be a str or os.PathLike of str");
  return fspath.cast<std::string>();
}

void bind_rng(py::module_& m) {
  py::class_<Rng>(
      m, "Rng",
      "attnmix's own random stream (docs/mechanisms.md#training): std::mt19937_64 and in-house "
      "distributions, so a seed gives the same draws on every platform. Accepted wherever an rng or "
      "seed is taken."
      R"doc(

Example:

>>> import attnmix
>>> a, b = attnmix.Rng(7), attnmix.Rng(7)
>>> [a.uniform() for _ in range(3)] == [b.uniform() for _ in range(3)]
True
>>> draws = attnmix.Rng(1).sample_without_replacement(5, 3)
>>> len(set(draws.tolist())), bool(((0 <= draws) & (draws < 5)).all())
(3, True)
>>> round(float(attnmix.Rng(2).dirichlet_ones(4).sum()), 12)
1.0
)doc")
      .def(py::init([](py::object seed) {
             return Rng(seed_int(seed, "Rng", "seed"));
           }),
           "seed"_a = 0)
      .def("next_u64", &Rng::next_u64, "64 random bits.")
      .def("uniform", &Rng::uniform, "Uniform on [0, 1) with 53 random bits.")
      .def("uniform_open", &Rng::uniform_open, "Uniform on (0, 1).")
      .def("normal", &Rng::normal, "Standard normal (Marsaglia polar method).")
      .def("exponential", &Rng::exponential, "Exponential(1).")
      .def("gumbel", &Rng::gumbel, "Gumbel(0, 1).")
      .def(
          "bernoulli",
          [](Rng& r, py::object p) { return r.bernoulli(real_number(p, "Rng.bernoulli", "p")); },
          "p"_a)
      .def(
          "uniform_int",
          [](Rng& r, py::object n) {
            return r.uniform_int(static_cast<uint64_t>(positive_int(n, "Rng.uniform_int", "n")));
          },
          "n"_a, "Uniform integer in [0, n).")
      .def(
          "dirichlet_ones",
          [](Rng& r, py::object n) {
            std::vector<double> out(
                static_cast<size_t>(positive_int(n, "Rng.dirichlet_ones", "n")));
            r.dirichlet_ones(out);
            return copy_reals(out.data(), {static_cast<Index>(out.size())});
          },
          "n"_a, "A Dirichlet(1, ..., 1) draw of length n.")
      .def(
          "sample_without_replacement",
          [](Rng& r, py::object n_obj, py::object k_obj) {
            const int64_t n = positive_int(n_obj, "Rng.sample_without_replacement", "n");
            const int64_t k = nonnegative_int(k_obj, "Rng.sample_without_replacement", "k");
            if (k > n) throw ValueError("Rng.sample_without_replacement: k must be <= n");
            const std::vector<int64_t> out = r.sample_without_replacement(n, k);
            return copy_ids(out.data(), {k});
          },
          "n"_a, "k"_a, "k distinct values of [0, n) (partial Fisher-Yates).")
      .def("__copy__", [](const Rng& r) { return Rng(r); })
      .def(
          "__deepcopy__", [](const Rng& r, py::handle) { return Rng(r); }, "memo"_a);
}

void bind_encoded_batch(py::module_& m) {
  const auto parts = [](py::object self) {
    const auto& e = self.cast<const EncodedBatch&>();
    return e.encoder->parts(e.batch, self);
  };
  py::class_<EncodedBatch>(
      m, "EncodedBatch",
      "An immutable, validated batch (what seq_encode returns). It unpacks and indexes like the "
      "reference's tuple of arrays, e.g. (contexts, queries, targets), as read-only numpy arrays; "
      "seq_* methods accept it without validating it again."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> encoder = attnmix.ResponsibilityAttentionDataEncoder(num_symbols=3, context_length=2, query_dim=2,
...                                                      num_targets=2)
>>> batch = encoder.seq_encode([([0, 2], [0.5, 1.0], 1), ([1, 0], [0.0, -1.0], 0)])
>>> batch.n_rows, len(batch)
(2, 3)
>>> contexts, queries, targets = batch
>>> contexts.tolist(), queries.shape, targets.tolist(), contexts.flags.writeable
([[0, 2], [1, 0]], (2, 2), [1, 0], False)
)doc")
      .def("__len__", [parts](py::object self) { return py::len(parts(self)); })
      .def("__getitem__",
           [parts](py::object self, py::object i) { return parts(self).attr("__getitem__")(i); })
      .def("__iter__", [parts](py::object self) { return py::iter(parts(self)); })
      .def_property_readonly("n_rows", [](const EncodedBatch& e) { return e.batch.n_rows(); },
                             "The number of rows (observations) n, an int.")
      .def("__repr__", [](const EncodedBatch& e) {
        return "EncodedBatch(" + e.encoder->class_name() +
               ", n_rows=" + std::to_string(e.batch.n_rows()) + ")";
      });
}

void bind_encoder_base(py::module_& m) {
  py::class_<DataEncoder, std::shared_ptr<DataEncoder>>(
      m, "DataEncoder", "Base class of the data encoders."
      R"doc(

Example:

>>> import attnmix
>>> encoder = attnmix.CategoricalDistribution([0.5, 0.5]).dist_to_encoder()
>>> isinstance(encoder, attnmix.DataEncoder), encoder == attnmix.CategoricalDataEncoder(2)
(True, True)
>>> batch = encoder.seq_encode([1, 0, 1])
>>> batch.n_rows, encoder.row_count([1, 0, 1])
(3, 3)
)doc")
      .def(
          "seq_encode",
          [](const DataEncoder& e, py::object data) -> py::object {
            if (py::isinstance<EncodedBatch>(data)) return data;
            return py::cast(e.seq_encode(data));
          },
          "x"_a,
          "Validates a list of observations (or a tuple of arrays) into an immutable EncodedBatch.")
      .def(
          "row_count", [](const DataEncoder& e, py::object x) { return batch_of(x, e).n_rows(); },
          "x"_a)
      .def("__eq__",
           [](const DataEncoder& a, py::object b) {
             return py::isinstance<DataEncoder>(b) && a.equals(b.cast<const DataEncoder&>());
           })
      .def("__ne__",
           [](const DataEncoder& a, py::object b) {
             return !(py::isinstance<DataEncoder>(b) && a.equals(b.cast<const DataEncoder&>()));
           })
      .def("__str__", &DataEncoder::class_name)
      .def("__repr__", &DataEncoder::class_name);
}

void bind_distribution_base(py::module_& m) {
  py::class_<DistributionHandle>(m, "Distribution",
                                 "Base class of the distributions."
                                 R"doc(

Example:

>>> import math
>>> import attnmix
>>> model = attnmix.CategoricalDistribution([0.2, 0.8])
>>> isinstance(model, attnmix.Distribution)
True
>>> round(model.log_density(1), 6) == round(math.log(0.8), 6), round(model.density(1), 6)
(True, 0.8)
>>> model.seq_log_density([0, 1]).round(4).tolist()
[-1.6094, -0.2231]
)doc")
      .def(
          "log_density",
          [](const DistributionHandle& d, py::object x) {
            const AnyBatch batch = encoder_of(d.any)->encode(single(x));
            double out = 0.0;
            d.any.log_density(batch, {&out, 1});
            return out;
          },
          "x"_a, "log p(x) of one observation (exact: -inf for impossible evidence).")
      .def(
          "density",
          [](const DistributionHandle& d, py::object x) {
            const AnyBatch batch = encoder_of(d.any)->encode(single(x));
            double out = 0.0;
            d.any.log_density(batch, {&out, 1});
            return std::exp(out);
          },
          "x"_a, "p(x) of one observation.")
      .def(
          "seq_log_density",
          [](const DistributionHandle& d, py::object x) {
            const AnyBatch batch = batch_of(x, *encoder_of(d.any));
            py::array_t<double> out(batch.n_rows());
            const std::span<double> log_p(out.mutable_data(), static_cast<size_t>(batch.n_rows()));
            {
              const py::gil_scoped_release release;
              parallel_log_density(d.any, batch, log_p, ParallelOptions{});
            }
            return out;
          },
          "x"_a,
          "log p of every row of an encoded batch (or of data the model's encoder accepts) -> "
          "(n,).")
      .def(
          "estimator",
          [](const DistributionHandle& d, py::object pseudo_count) {
            return wrap_estimator(d.any.estimator(), pseudo_count_arg(pseudo_count, "estimator"));
          },
          "pseudo_count"_a = py::none(),
          "An estimator of this family with this model's dimensions.")
      .def(
          "dist_to_encoder", [](const DistributionHandle& d) { return encoder_of(d.any); },
          "The encoder of this model's data.");
}

void bind_estimator_base(py::module_& m) {
  py::class_<EstimatorHandle>(m, "Estimator",
                              "Base class of the estimators (the M-step)."
                              R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> estimator = attnmix.CategoricalEstimator(2)
>>> isinstance(estimator, attnmix.Estimator)
True
>>> estimator.estimate(None, (np.array([1.0, 3.0]),)).p.tolist()
[0.25, 0.75]
)doc")
      .def(
          "accumulator_factory",
          [](py::object self) {
            return wrap_factory(self.cast<const EstimatorHandle&>().any.make_accumulator(),
                                py::getattr(self, "name", py::none()));
          },
          "A factory of empty accumulators of this estimator's family.")
      .def(
          "estimate",
          [](py::object self, py::object nobs, py::object value) {
            const auto& e = self.cast<const EstimatorHandle&>();
            const std::string where = class_of(self);
            std::optional<double> n;
            if (!nobs.is_none()) n = nonnegative_real(nobs, where, "nobs");
            const AnyAccumulator stats = statistics_arg(value, e.any.make_accumulator(), where);
            return wrap_distribution(e.any.estimate(n, stats));
          },
          "nobs"_a, "value"_a,
          "The M-step from value() statistics (validated: arity, shapes, finiteness, counts, mass "
          "laws). nobs is None on ordinary E-steps and the initial weight mass on the "
          "initialisation call.")
      .def_property_readonly("pseudo_count",
                             [](const EstimatorHandle& e) { return e.pseudo_count; },
                             "The pseudo_count given at construction, a float or None: accepted for "
                             "compatibility and ignored.");
}

void bind_accumulator_base(py::module_& m) {
  py::class_<AccumulatorHandle>(
      m, "Accumulator",
      "Base class of the accumulators: additive sufficient statistics."
      R"doc(

Example:

>>> import attnmix
>>> acc = attnmix.CategoricalAccumulator(2)
>>> isinstance(acc, attnmix.Accumulator)
True
>>> model = attnmix.CategoricalDistribution([0.5, 0.5])
>>> acc.seq_update([0, 1, 1], [1.0, 1.0, 2.0], model)
>>> acc.value()[0].tolist()
[1.0, 3.0]
>>> acc.combine(acc.value()).scale(0.5).value()[0].tolist()
[1.0, 3.0]
)doc")
      .def(
          "seq_update",
          [](py::object self, py::object x, py::object weights, py::object estimate) {
            const std::string where = class_of(self);
            AnyAccumulator& acc = self.cast<const AccumulatorHandle&>().get();
            const AnyBatch batch = batch_of(x, *encoder_of(acc));
            const DistributionHandle& model = model_arg(estimate, where);
            accumulate(acc, batch, python::weights(weights, batch.n_rows(), where), model.any);
          },
          "x"_a, "weights"_a, "estimate"_a,
          "The E-step of `estimate` on an encoded batch (or data), with observation weights; "
          "atomic.")
      .def(
          "update",
          [](py::object self, py::object x, py::object weight, py::object estimate) {
            const std::string where = class_of(self);
            AnyAccumulator& acc = self.cast<const AccumulatorHandle&>().get();
            const AnyBatch batch = encoder_of(acc)->encode(single(x));
            const DistributionHandle& model = model_arg(estimate, where);
            accumulate(acc, batch, {weight_scalar(weight, where)}, model.any);
          },
          "x"_a, "weight"_a, "estimate"_a,
          "update(x, w, est) == seq_update(encode([x]), [w], est).")
      .def(
          "seq_initialize",
          [](py::object self, py::object x, py::object weights, py::object rng) {
            const std::string where = class_of(self);
            AnyAccumulator& acc = self.cast<const AccumulatorHandle&>().get();
            const AnyBatch batch = batch_of(x, *encoder_of(acc));
            initialize(acc, batch, python::weights(weights, batch.n_rows(), where), rng, where);
          },
          "x"_a, "weights"_a, "rng"_a,
          "Random initial statistics, as EM's initialisation draws them "
          "(docs/mechanisms.md#training). rng: an attnmix.Rng (advanced in place), an int seed, "
          "None (seed 0) or a numpy RandomState / Generator.")
      .def(
          "initialize",
          [](py::object self, py::object x, py::object weight, py::object rng) {
            const std::string where = class_of(self);
            AnyAccumulator& acc = self.cast<const AccumulatorHandle&>().get();
            const AnyBatch batch = encoder_of(acc)->encode(single(x));
            initialize(acc, batch, {weight_scalar(weight, where)}, rng, where);
          },
          "x"_a, "weight"_a, "rng"_a)
      .def(
          "combine",
          [](py::object self, py::object value) {
            AnyAccumulator& acc = self.cast<const AccumulatorHandle&>().get();
            acc.combine(statistics_arg(value, acc, class_of(self)));
            return self;
          },
          "value"_a, "Validates value() statistics, then adds them.")
      .def(
          "from_value",
          [](py::object self, py::object value) {
            AnyAccumulator& acc = self.cast<const AccumulatorHandle&>().get();
            acc.from_value(statistics_arg(value, acc, class_of(self)));
            return self;
          },
          "value"_a, "Validates value() statistics, then overwrites these.")
      .def(
          "value", [](const AccumulatorHandle& h) { return statistics_to_python(h.get()); },
          "A snapshot of the statistics (deep copies) in the family's tuple layout.")
      .def(
          "scale",
          [](py::object self, py::object c) {
            self.cast<const AccumulatorHandle&>().get().scale(real_number(c, class_of(self), "c"));
            return self;
          },
          "c"_a, "Multiplies every statistic by c (finite, >= 0).")
      .def(
          "key_merge",
          [](py::object self, py::object pool) {
            const auto& h = self.cast<const AccumulatorHandle&>();
            if (const auto key = h.get().keys()) {
              const py::str k(*key);
              if (pool.contains(k))
                pool[k].attr("combine")(self.attr("value")());
              else
                pool[k] = self;
            }
            for (AccumulatorHandle child : h.children())
              wrap_accumulator(std::move(child)).attr("key_merge")(pool);
          },
          "stats_dict"_a,
          "Keyed tying: the first site with a key becomes the pool, later sites add "
          "into it.")
      .def(
          "key_replace",
          [](py::object self, py::object pool) {
            const auto& h = self.cast<const AccumulatorHandle&>();
            if (const auto key = h.get().keys())
              self.attr("from_value")(pool[py::str(*key)].attr("value")());
            for (AccumulatorHandle child : h.children())
              wrap_accumulator(std::move(child)).attr("key_replace")(pool);
          },
          "stats_dict"_a, "Keyed tying: every site with a key reads the pooled statistics.")
      .def(
          "acc_to_encoder", [](const AccumulatorHandle& h) { return encoder_of(h.get()); },
          "The encoder of this accumulator's data.")
      .def_property_readonly("keys",
                             [](const AccumulatorHandle& h) -> py::object {
                               const auto key = h.get().keys();
                               return key ? py::object(py::str(*key)) : py::none();
                             },
                             doc::kKeys)
      .def_property_readonly("name", [](const AccumulatorHandle& h) { return h.name(); },
                             "The name this accumulator was made with (by its constructor or factory), a str or "
                             "None.");

  py::class_<FactoryHandle>(m, "AccumulatorFactory", "Makes empty accumulators of one family."
  R"doc(

Example:

>>> import attnmix
>>> factory = attnmix.DiagonalGaussianEstimator(2).accumulator_factory()
>>> isinstance(factory, attnmix.AccumulatorFactory)
True
>>> a, b = factory.make(), factory.make()
>>> a is b, a.count, a.sum.tolist()
(False, 0.0, [0.0, 0.0])
)doc")
      .def(
          "make",
          [](const FactoryHandle& f) {
            return wrap_accumulator(AccumulatorHandle(f.prototype, f.name));
          },
          "A new, empty accumulator.");
}

void bind_model_files(py::module_& m) {
  m.def(
      "save_model",
      [](const DistributionHandle& model, py::object path) {
        const std::string p = path_arg(path);
        const py::gil_scoped_release release;
        save_model(model.any, p);
      },
      "dist"_a, "path"_a,
      "Writes the model as the CLI's JSON model file (docs/model-format.md), atomically. Every "
      "family has a model-file format: the four attention families, categorical, diagonal "
      "Gaussian, and mixtures and composites of them.\n\n"
      "Example:\n\n"
      ">>> import os, tempfile\n"
      ">>> import attnmix\n"
      ">>> model = attnmix.CategoricalDistribution([0.25, 0.75], name='coin')\n"
      ">>> with tempfile.TemporaryDirectory() as folder:\n"
      "...     path = os.path.join(folder, 'coin.json')\n"
      "...     attnmix.save_model(model, path)\n"
      "...     back = attnmix.load_model(path)\n"
      ">>> back.p.tolist(), back.name\n"
      "([0.25, 0.75], 'coin')\n");
  m.def(
      "load_model",
      [](py::object path) {
        const std::string p = path_arg(path);
        AnyDistribution model;
        {
          const py::gil_scoped_release release;
          model = load_model(p);
        }
        return wrap_distribution(std::move(model));
      },
      "path"_a,
      "Reads and validates a JSON model file (written by save_model or `attnmix fit`): returns the model, an "
      "instance of its family's distribution class. ValueError (naming the file and the field) for a missing, "
      "malformed or invalid file.\n\n"
      "Example:\n\n"
      ">>> import os, tempfile\n"
      ">>> import attnmix\n"
      ">>> with tempfile.TemporaryDirectory() as folder:\n"
      "...     path = os.path.join(folder, 'model.json')\n"
      "...     attnmix.save_model(attnmix.CategoricalDistribution([0.5, 0.5]), path)\n"
      "...     model = attnmix.load_model(path)\n"
      ">>> type(model).__name__, model.p.tolist()\n"
      "('CategoricalDistribution', [0.5, 0.5])\n");
}

}  // namespace

void bind_core(py::module_& m) {
  bind_rng(m);
  bind_encoded_batch(m);
  bind_encoder_base(m);
  bind_distribution_base(m);
  bind_estimator_base(m);
  bind_accumulator_base(m);
  bind_model_files(m);
}

}  // namespace attnmix::python
