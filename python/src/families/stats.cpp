// SPDX-License-Identifier: Apache-2.0
// The combinators and classical leaves in Python (docs/mechanisms.md#building-blocks): Mixture{Distribution, Estimator,
// Accumulator, DataEncoder}, Composite{…}, Categorical{…, Sampler} and DiagonalGaussian{…,
// Sampler}. Constructors convert and call the library's validating constructors; the generic role
// methods come from bind_core.cpp.
#include <pybind11/stl.h>

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "attnmix/core/rng.hpp"
#include "attnmix/inference/reduce.hpp"
#include "attnmix/stats/categorical.hpp"
#include "attnmix/stats/composite.hpp"
#include "attnmix/stats/gaussian.hpp"
#include "attnmix/stats/mixture.hpp"
#include "bindings.hpp"
#include "convert.hpp"
#include "distribution_class.hpp"
#include "docstrings.hpp"
#include "encoders.hpp"
#include "estimator_class.hpp"
#include "roles.hpp"
#include "samplers.hpp"

namespace attnmix::python {

namespace {

using namespace pybind11::literals;

// ---- arguments that are lists of other role objects ---------------------------------------------

template <class Handle>
std::vector<py::object> handles_arg(py::object seq, const char* where, const char* name,
                                    const char* kind) {
  if (!is_sequence(seq) || is_ndarray(seq))
    throw TypeError(std::string(where) + ": " + name + " must be a list of " + kind + " (got " +
                    type_name(seq) + ")");
  std::vector<py::object> out;
  for (const py::object item : py::reinterpret_borrow<py::sequence>(seq)) {
    if (!py::isinstance<Handle>(item))
      throw TypeError(std::string(where) + ": " + name + " must be a list of " + kind +
                      " (got an element of type " + type_name(item) + ")");
    out.push_back(py::reinterpret_borrow<py::object>(item));
  }
  return out;
}

std::vector<AnyDistribution> distributions_arg(py::object seq, const char* where,
                                               const char* name) {
  std::vector<AnyDistribution> out;
  for (const py::object& d :
       handles_arg<DistributionHandle>(seq, where, name, "attnmix distributions"))
    out.push_back(d.cast<const DistributionHandle&>().any);
  return out;
}

std::vector<AnyEstimator> estimators_arg(py::object seq, const char* where) {
  std::vector<AnyEstimator> out;
  for (const py::object& e :
       handles_arg<EstimatorHandle>(seq, where, "estimators", "attnmix estimators"))
    out.push_back(e.cast<const EstimatorHandle&>().any);
  return out;
}

std::vector<AnyAccumulator> accumulators_arg(py::object seq, const char* where) {
  std::vector<AnyAccumulator> out;
  for (const py::object& a :
       handles_arg<AccumulatorHandle>(seq, where, "accumulators", "attnmix accumulators"))
    out.push_back(
        a.cast<const AccumulatorHandle&>().get());  // copies: the new accumulator owns its children
  return out;
}

std::vector<std::shared_ptr<DataEncoder>> encoders_arg(py::object seq, const char* where) {
  std::vector<std::shared_ptr<DataEncoder>> out;
  for (const py::object& e :
       handles_arg<DataEncoder>(seq, where, "encoders", "attnmix data encoders"))
    out.push_back(e.cast<std::shared_ptr<DataEncoder>>());
  return out;
}

py::list wrap_all(const std::vector<AnyDistribution>& models) {
  py::list out;
  for (const AnyDistribution& d : models) out.append(wrap_distribution(d));
  return out;
}

py::list children_of(const AccumulatorHandle& h) {
  py::list out;
  for (AccumulatorHandle child : h.children()) out.append(wrap_accumulator(std::move(child)));
  return out;
}

/// The constructor of a combinator's estimator class (Mixture, Composite): (estimators, pseudo_count=None, keys=None,
/// name=None), and its pickling as that call (the component estimators pickled in turn).
template <class CombinatorEstimator>
void def_combinator_estimator_init(py::class_<EstimatorOf<CombinatorEstimator>, EstimatorHandle>& cls,
                                   const char* where) {
  cls.def(py::init([where](py::object estimators, py::object pseudo_count, py::object keys, py::object name) {
            return EstimatorOf<CombinatorEstimator>(
                AnyEstimator(CombinatorEstimator(estimators_arg(estimators, where),
                                                 optional_str(keys, where, "keys"), name_arg(name, where))),
                pseudo_count_arg(pseudo_count, where));
          }),
          "estimators"_a, "pseudo_count"_a = py::none(), "keys"_a = py::none(), "name"_a = py::none())
      .def(
          "__reduce__",
          [](py::handle self) {
            const auto& handle = self.cast<const EstimatorOf<CombinatorEstimator>&>();
            const CombinatorEstimator& estimator = handle.estimator();
            py::list estimators;
            for (const AnyEstimator& child : estimator.estimators())
              estimators.append(wrap_estimator(child, py::none()));
            py::dict kwargs;
            kwargs["estimators"] = estimators;
            kwargs["pseudo_count"] = handle.pseudo_count;
            kwargs["keys"] = py::cast(estimator.keys());
            kwargs["name"] = name_to_python(estimator.name());
            return called_again(self, kwargs);
          },
          "Pickling: the class called again with the estimators (pickled in turn), pseudo_count, keys and name.");
}

/// The constructor of a combinator's accumulator class (Mixture, Composite): (accumulators, keys=None, name=None),
/// `accumulators`, its components' accumulators as views (described by `children`), and its pickling.
template <class CombinatorAccumulator>
void def_combinator_accumulator(py::class_<AccumulatorOf<CombinatorAccumulator>, AccumulatorHandle>& cls,
                                const char* where, const char* children) {
  cls.def(py::init([where](py::object accumulators, py::object keys, py::object name) {
            py::object nm = name_to_python(name_arg(name, where));
            return AccumulatorOf<CombinatorAccumulator>(AccumulatorHandle(
                AnyAccumulator(CombinatorAccumulator(accumulators_arg(accumulators, where),
                                                     optional_str(keys, where, "keys"))),
                std::move(nm)));
          }),
          "accumulators"_a, "keys"_a = py::none(), "name"_a = py::none())
      .def_property_readonly("accumulators", &children_of, children)
      .def(
          "__reduce__",
          [](py::handle self) {
            const auto& h = self.cast<const AccumulatorOf<CombinatorAccumulator>&>();
            py::dict kwargs;
            kwargs["accumulators"] = children_of(h);
            kwargs["keys"] = py::cast(h.acc().keys());
            kwargs["name"] = h.name();
            return reduce_accumulator(self, kwargs);
          },
          "Pickling: the class called again with the accumulators (pickled in turn), keys and name, then "
          "from_value.");
}

// ---- samplers of the combinators: they draw through their components' own Python samplers ----------

// A mixture's draws (docs/mechanisms.md#building-blocks): every observation's component z ~ w from one stream, then
// component k's observations, in order, from its own sampler seeded derive_seed(seed, sampler, k + 1); z comes from
// derive_seed(seed, sampler, 0). These are the rows `attnmix sample` writes for the same model and seed, and a call of
// sample(m) continues where the previous call stopped, so sample(a) + sample(b) == sample(a + b) when the components'
// samplers draw one observation after another (every family's but a composite's).
struct MixtureSamplerPy {
  Rng pick;                          // the components z ~ w
  std::vector<py::object> samplers;  // one per component
  py::object dist;
};

MixtureSamplerPy make_mixture_sampler(py::object dist, py::object seed, const py::kwargs& options,
                                      const char* where) {
  if (!py::isinstance<DistributionOf<Mixture>>(dist))
    throw TypeError(std::string(where) + ": dist must be a MixtureDistribution (got " + type_name(dist) + ")");
  const uint64_t root = sampler_seed(seed, where);
  MixtureSamplerPy s{Rng(derive_seed(root, SeedPurpose::kSampler, 0)), {}, dist};
  const auto& components = dist.cast<const DistributionOf<Mixture>&>().model().components();
  for (size_t k = 0; k < components.size(); ++k)
    s.samplers.push_back(wrap_distribution(components[k])
                             .attr("sampler")(derive_seed(root, SeedPurpose::kSampler, k + 1), **options));
  return s;
}

py::object sample_mixture(MixtureSamplerPy& s, py::object size, py::object batched) {
  const std::optional<int64_t> m = sample_size(size, batched, "MixtureSampler.sample");
  const Vector& w = s.dist.cast<const DistributionOf<Mixture>&>().model().weights();
  const std::span<const double> p(w.data(), static_cast<size_t>(w.size()));
  if (!m) return s.samplers[static_cast<size_t>(s.pick.categorical(p))].attr("sample")();
  std::vector<size_t> z(static_cast<size_t>(*m)), count(s.samplers.size(), 0);
  for (size_t& zi : z) ++count[zi = static_cast<size_t>(s.pick.categorical(p))];
  std::vector<py::list> drawn;
  for (size_t k = 0; k < s.samplers.size(); ++k) drawn.emplace_back(s.samplers[k].attr("sample")(count[k]));
  std::vector<size_t> next(s.samplers.size(), 0);
  py::list out;
  for (const size_t zi : z) out.append(drawn[zi][next[zi]++]);
  return out;
}

// A composite's draws: every call takes one seed per field from Rng(seed), all first, and each field's
// observations come from a fresh sampler of its component with that seed; observation i is the tuple of the
// fields' i-th draws (as the library's CompositeSampler draws them).
struct CompositeSamplerPy {
  Rng seeds;  // one seed per field and call
  py::object dist;
};

CompositeSamplerPy make_composite_sampler(py::object dist, py::object seed, const char* where) {
  if (!py::isinstance<DistributionOf<Composite>>(dist))
    throw TypeError(std::string(where) + ": dist must be a CompositeDistribution (got " + type_name(dist) + ")");
  return {Rng(sampler_seed(seed, where)), std::move(dist)};
}

py::object sample_composite(CompositeSamplerPy& s, py::object size, py::object batched) {
  const std::optional<int64_t> m = sample_size(size, batched, "CompositeSampler.sample");
  const auto& components = s.dist.cast<const DistributionOf<Composite>&>().model().components();
  const std::vector<uint64_t> field_seeds = composite_field_seeds(s.seeds, components.size());
  std::vector<py::object> fields;
  for (size_t f = 0; f < components.size(); ++f)
    fields.push_back(wrap_distribution(components[f]).attr("sampler")(field_seeds[f]).attr("sample")(size));
  const auto row = [&fields](const std::function<py::object(const py::object&)>& draw) {
    py::tuple out(fields.size());
    for (size_t f = 0; f < fields.size(); ++f) out[f] = draw(fields[f]);
    return out;
  };
  if (!m) return row([](const py::object& one) { return one; });
  py::list out;
  for (int64_t i = 0; i < *m; ++i) out.append(row([i](const py::object& draws) { return draws[py::int_(i)]; }));
  return out;
}

// ---- mixture ------------------------------------------------------------------------------------

void bind_mixture(py::module_& m) {
  using Dist = DistributionOf<Mixture>;
  constexpr const char* kDist = "MixtureDistribution";
  const auto make = [](py::object components, py::object w, py::object name) {
    std::vector<AnyDistribution> parts = distributions_arg(components, kDist, "components");
    Vector weights = reals_1d(w, kDist, "w");
    return Dist(
        AnyDistribution(Mixture(std::move(parts), std::move(weights), name_arg(name, kDist))));
  };
  // Registered first, so that the distribution's sampler() signature names it.
  py::class_<MixtureSamplerPy> sampler_class(
      m, "MixtureSampler",
      "Draws observations from a MixtureDistribution: each observation's component z ~ w, then an observation of "
      "component z from that component's own sampler (docs/mechanisms.md#building-blocks). Keyword options are "
      "passed to every component's sampler() (context_length for chained attention). One call of sample(m) gives "
      "the rows `attnmix sample` writes for the same model and seed, and calls continue one another: sample(a) "
      "followed by sample(b) draws what sample(a + b) would (when the components' samplers draw one observation "
      "after another, as every family's does but a composite's)."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.MixtureDistribution([attnmix.CategoricalDistribution([0.9, 0.1]),
...                                      attnmix.CategoricalDistribution([0.2, 0.8])], [0.25, 0.75])
>>> draws = attnmix.MixtureSampler(model, seed=3).sample(4000)
>>> round(model.density(1), 12)  # 0.25 * 0.1 + 0.75 * 0.8
0.625
>>> bool(abs(np.mean(draws) - 0.625) < 0.025)
True
>>> sampler = attnmix.MixtureSampler(model, seed=3)
>>> sampler.sample(1500) + sampler.sample(2500) == draws
True
)doc");
  py::class_<Dist, DistributionHandle> cls(
      m, kDist,
      "A finite mixture of components of any family on the same data "
      "(docs/mechanisms.md#building-blocks): log p(x) = LSE_k(log w_k + log p_k(x))."
      R"doc(

Example:

>>> import math
>>> import attnmix
>>> a = attnmix.CategoricalDistribution([0.9, 0.1])
>>> b = attnmix.CategoricalDistribution([0.2, 0.8])
>>> model = attnmix.MixtureDistribution([a, b], [0.25, 0.75])
>>> math.isclose(model.density(1), 0.25 * 0.1 + 0.75 * 0.8)
True
>>> model.seq_posterior([0, 1]).round(3).tolist()
[[0.6, 0.4], [0.04, 0.96]]
)doc");
  cls.def(py::init(make), "components"_a, "w"_a, "name"_a = py::none())
      .def_property_readonly(
          "w", [](py::object self) { return readonly_view(self.cast<const Dist&>().model().weights(), self); },
          "Mixture weights w, a read-only float64 array of shape (K,) that sums to 1: w[k] is "
          "the prior probability of component k.")
      .def_property_readonly("components",
                             [](const Dist& d) { return wrap_all(d.model().components()); },
                             "The K component distributions, a new list in the order of w.")
      .def_property_readonly(
          "num_components",
          [](const Dist& d) { return static_cast<Index>(d.model().components().size()); },
          "Number of components K, an int.")
      .def_property_readonly("name", [](const Dist& d) { return name_to_python(d.model().name()); }, doc::kName)
      .def(
          "sampler",
          [](py::object self, py::object seed, const py::kwargs& options) {
            return make_mixture_sampler(std::move(self), seed, options, kDist);
          },
          "seed"_a = py::none(), "A MixtureSampler of this model; keyword options go to every component's sampler().");
  def_rows_matrix(
      cls, "seq_posterior", [](const Mixture& model, const AnyBatch& rows) { return model.responsibilities(rows); },
      "Component responsibilities rho (n, K) of the rows x (anything the model's encoder accepts, or an encoded "
      "batch).");
  def_text_and_pickle(
      cls,
      [](const Mixture& model) {
        return "MixtureDistribution(" + std::to_string(model.components().size()) +
               " components, name=" + py::repr(name_to_python(model.name())).cast<std::string>() + ")";
      },
      [](const Mixture& model) {
        const Vector& w = model.weights();
        return py::make_tuple(wrap_all(model.components()), copy_reals(w.data(), {w.size()}),
                              name_to_python(model.name()));
      },
      make);

  using Est = EstimatorOf<MixtureEstimator>;
  py::class_<Est, EstimatorHandle> estimator_class(
      m, "MixtureEstimator",
      "The mixture M-step: w = comp_count / sum, each component from its own statistics."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> x = np.concatenate([rng.normal(-3, 1, 150), rng.normal(3, 1, 50)]).reshape(-1, 1)
>>> estimator = attnmix.MixtureEstimator([attnmix.DiagonalGaussianEstimator(1)] * 2)
>>> model = attnmix.optimize(x, estimator, max_its=30, rng=1, out=None)
>>> order = np.argsort([c.mu[0] for c in model.components])
>>> np.round([model.components[k].mu[0] for k in order]).tolist(), model.w[order].round(1).tolist()
([-3.0, 3.0], [0.8, 0.2])
)doc");
  def_combinator_estimator_init(estimator_class, "MixtureEstimator");

  using Acc = AccumulatorOf<MixtureAccumulator>;
  py::class_<Acc, AccumulatorHandle> accumulator_class(
      m, "MixtureAccumulator",
      "Statistics, value() = (comp_count (K,), (component statistics ...))."
      R"doc(

Example:

>>> import attnmix
>>> model = attnmix.MixtureDistribution([attnmix.CategoricalDistribution([1.0, 0.0]),
...                                      attnmix.CategoricalDistribution([0.5, 0.5])], [0.5, 0.5])
>>> acc = attnmix.MixtureAccumulator([attnmix.CategoricalAccumulator(2), attnmix.CategoricalAccumulator(2)])
>>> acc.seq_update([0, 1, 1], [1.0, 1.0, 1.0], model)
>>> comp_count, (first, second) = acc.value()
>>> comp_count.round(3).tolist(), first[0].round(3).tolist(), second[0].round(3).tolist()
([0.667, 2.333], [0.667, 0.0], [0.333, 2.0])
)doc");
  def_combinator_accumulator(accumulator_class, "MixtureAccumulator",
                             "The component accumulators (views into this one).");

  py::class_<MixtureDataEncoderPy, DataEncoder, std::shared_ptr<MixtureDataEncoderPy>>(
      m, "MixtureDataEncoder",
      "Encodes the data of a mixture: what its component encoder accepts (every component reads the same data)."
      R"doc(

Example:

>>> import attnmix
>>> encoder = attnmix.MixtureDataEncoder(attnmix.CategoricalDataEncoder(2))
>>> model = attnmix.MixtureDistribution([attnmix.CategoricalDistribution([0.5, 0.5])] * 2, [0.5, 0.5])
>>> model.dist_to_encoder() == encoder, encoder.encoder
(True, CategoricalDataEncoder)
>>> encoder.seq_encode([0, 1, 1]).n_rows
3
)doc")
      .def(py::init([](std::shared_ptr<DataEncoder> encoder) {
             if (!encoder)
               throw TypeError("MixtureDataEncoder: encoder must be an attnmix data encoder");
             return std::make_shared<MixtureDataEncoderPy>(std::move(encoder));
           }),
           "encoder"_a)
      .def_property_readonly("encoder", &MixtureDataEncoderPy::component,
                             "The encoder of the components' data, which this one delegates to.");

  sampler_class
      .def(py::init([](py::object dist, py::object seed, const py::kwargs& options) {
             return make_mixture_sampler(std::move(dist), seed, options, "MixtureSampler");
           }),
           "dist"_a, "seed"_a = py::none())
      .def("sample", &sample_mixture, "size"_a = py::none(), py::kw_only(), "batched"_a = true,
           "One observation (size=None) or a list of size observations, each in its component's form.")
      .def_property_readonly("dist", [](const MixtureSamplerPy& s) { return s.dist; }, doc::kSamplerDist);
}

// ---- composite ----------------------------------------------------------------------------------

void bind_composite(py::module_& m) {
  using Dist = DistributionOf<Composite>;
  constexpr const char* kDist = "CompositeDistribution";
  const auto make = [](py::object dists, py::object name) {
    return Dist(AnyDistribution(
        Composite(distributions_arg(dists, kDist, "dists"), name_arg(name, kDist))));
  };
  // Registered first, so that the distribution's sampler() signature names it.
  py::class_<CompositeSamplerPy> sampler_class(
      m, "CompositeSampler",
      "Draws tuple observations from a CompositeDistribution: field f from the sampler of component f "
      "(docs/mechanisms.md#building-blocks). Every call of sample() seeds the fields' samplers afresh from this "
      "sampler's own stream, so sample(m) is deterministic given the seed and the calls before it, but is not the "
      "same draws as m calls of sample()."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.CompositeDistribution([attnmix.CategoricalDistribution([0.25, 0.75]),
...                                        attnmix.DiagonalGaussianDistribution([5.0], [1.0])])
>>> draws = attnmix.CompositeSampler(model, seed=0).sample(3000)
>>> label, x = draws[0]
>>> label in (0, 1), len(x)
(True, 1)
>>> ids = np.array([d[0] for d in draws])
>>> xs = np.array([d[1][0] for d in draws])
>>> bool(abs(ids.mean() - 0.75) < 0.03), bool(abs(xs.mean() - 5.0) < 0.1)
(True, True)
)doc");
  py::class_<Dist, DistributionHandle> cls(
      m, kDist,
      "The product of independent components over the fields of a tuple observation "
      "(docs/mechanisms.md#building-blocks): log p(x) = sum_f log p_f(x_f)."
      R"doc(

Example:

>>> import math
>>> import attnmix
>>> model = attnmix.CompositeDistribution([attnmix.CategoricalDistribution([0.25, 0.75]),
...                                        attnmix.DiagonalGaussianDistribution([0.0], [1.0])])
>>> x = (1, [0.0])
>>> math.isclose(model.log_density(x), math.log(0.75) - 0.5 * math.log(2 * math.pi))
True
)doc");
  cls.def(py::init(make), "dists"_a, "name"_a = py::none())
      .def_property_readonly("dists",
                             [](const Dist& d) { return wrap_all(d.model().components()); },
                             "The component distributions, a new list with one per field of an observation.")
      .def_property_readonly("name", [](const Dist& d) { return name_to_python(d.model().name()); }, doc::kName)
      .def(
          "sampler", [](py::object self, py::object seed) { return make_composite_sampler(std::move(self), seed, kDist); },
          "seed"_a = py::none(), "A CompositeSampler of this model.");
  def_text_and_pickle(
      cls,
      [](const Composite& model) {
        return "CompositeDistribution(" + std::to_string(model.components().size()) +
               " fields, name=" + py::repr(name_to_python(model.name())).cast<std::string>() + ")";
      },
      [](const Composite& model) { return py::make_tuple(wrap_all(model.components()), name_to_python(model.name())); },
      make);

  using Est = EstimatorOf<CompositeEstimator>;
  py::class_<Est, EstimatorHandle> estimator_class(m, "CompositeEstimator",
                                   "Each field's component estimated from its statistics."
                                   R"doc(

Example:

>>> import attnmix
>>> fields = [attnmix.CategoricalEstimator(2), attnmix.DiagonalGaussianEstimator(1)]
>>> estimator = attnmix.CompositeEstimator(fields)
>>> data = [(0, [1.0]), (1, [3.0]), (1, [2.0])]
>>> acc = estimator.accumulator_factory().make()
>>> start = attnmix.CompositeDistribution([attnmix.CategoricalDistribution([0.5, 0.5]),
...                                        attnmix.DiagonalGaussianDistribution([0.0], [1.0])])
>>> acc.seq_update(data, [1.0] * 3, start)
>>> ids, values = estimator.estimate(None, acc.value()).dists
>>> ids.p.round(3).tolist(), values.mu.tolist()
([0.333, 0.667], [2.0])
)doc");
  def_combinator_estimator_init(estimator_class, "CompositeEstimator");

  using Acc = AccumulatorOf<CompositeAccumulator>;
  py::class_<Acc, AccumulatorHandle> accumulator_class(m, "CompositeAccumulator",
                                     "Statistics, value() = (field statistics ...)."
                                     R"doc(

Example:

>>> import attnmix
>>> model = attnmix.CompositeDistribution([attnmix.CategoricalDistribution([0.5, 0.5]),
...                                        attnmix.DiagonalGaussianDistribution([0.0], [1.0])])
>>> fields = [attnmix.CategoricalAccumulator(2), attnmix.DiagonalGaussianAccumulator(1)]
>>> acc = attnmix.CompositeAccumulator(fields)
>>> acc.seq_update([(0, [1.0]), (1, [3.0])], [1.0, 1.0], model)
>>> (counts,), (total, squares, n) = acc.value()
>>> counts.tolist(), total.tolist(), squares.tolist(), n
([1.0, 1.0], [4.0], [10.0], 2.0)
)doc");
  def_combinator_accumulator(accumulator_class, "CompositeAccumulator",
                             "The field accumulators (views into this one).");

  py::class_<CompositeDataEncoderPy, DataEncoder, std::shared_ptr<CompositeDataEncoderPy>>(
      m, "CompositeDataEncoder",
      "Encodes tuple observations field by field, each field with its own encoder, into one EncodedBatch."
      R"doc(

Example:

>>> import attnmix
>>> fields = [attnmix.CategoricalDataEncoder(2), attnmix.DiagonalGaussianDataEncoder(1)]
>>> encoder = attnmix.CompositeDataEncoder(fields)
>>> batch = encoder.seq_encode([(0, [1.5]), (1, [-2.0])])
>>> batch.n_rows, [str(e) for e in encoder.encoders]
(2, ['CategoricalDataEncoder', 'DiagonalGaussianDataEncoder'])
)doc")
      .def(py::init([](py::object encoders) {
             return std::make_shared<CompositeDataEncoderPy>(
                 encoders_arg(encoders, "CompositeDataEncoder"));
           }),
           "encoders"_a)
      .def_property_readonly("encoders",
                             [](const CompositeDataEncoderPy& e) { return e.fields(); },
                             "The field encoders, a list with one per field of an observation.");

  sampler_class
      .def(py::init([](py::object dist, py::object seed) {
             return make_composite_sampler(std::move(dist), seed, "CompositeSampler");
           }),
           "dist"_a, "seed"_a = py::none())
      .def("sample", &sample_composite, "size"_a = py::none(), py::kw_only(), "batched"_a = true,
           "One tuple observation (size=None) or a list of size tuples, field f in component f's form.")
      .def_property_readonly("dist", [](const CompositeSamplerPy& s) { return s.dist; }, doc::kSamplerDist);
}

// ---- categorical --------------------------------------------------------------------------------

using CategoricalSamplerPy = SamplerOf<CategoricalSampler>;

void bind_categorical(py::module_& m) {
  using Dist = DistributionOf<Categorical>;
  constexpr const char* kDist = "CategoricalDistribution";
  const auto make = [](py::object p, py::object name) {
    return Dist(AnyDistribution(Categorical({reals_1d(p, kDist, "p"), name_arg(name, kDist)})));
  };
  // Registered first, so that the distribution's sampler() signature names it.
  py::class_<CategoricalSamplerPy> sampler_class(m, "CategoricalSampler",
                                   "Draws ids k ~ p from a CategoricalDistribution."
                                   R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.CategoricalDistribution([0.2, 0.3, 0.5])
>>> draws = attnmix.CategoricalSampler(model, seed=1).sample(2000)
>>> draws[:5] == attnmix.CategoricalSampler(model, seed=1).sample(5)
True
>>> bool(np.allclose(np.bincount(draws, minlength=3) / 2000, model.p, atol=0.03))
True
)doc");
  py::class_<Dist, DistributionHandle> cls(
      m, kDist,
      "A categorical distribution over ids [0, K) (docs/mechanisms.md#building-blocks)."
      R"doc(

Example:

>>> import math
>>> import attnmix
>>> model = attnmix.CategoricalDistribution([0.2, 0.3, 0.5], name='die')
>>> model.num_categories, float(model.p.sum())
(3, 1.0)
>>> math.isclose(model.log_density(2), math.log(0.5))
True
)doc");
  cls.def(py::init(make), "p"_a, "name"_a = py::none())
      .def_property_readonly(
          "p", [](py::object self) { return readonly_view(self.cast<const Dist&>().model().params().p, self); },
          "Category probabilities p, a read-only float64 array of shape (K,) that sums to 1: "
          "p[k] is the probability of id k.")
      .def_property_readonly("num_categories",
                             [](const Dist& d) { return d.model().n_categories(); },
                             "Number of categories K, an int: observations are the ids 0 .. K-1.")
      .def_property_readonly("name",
                             [](const Dist& d) { return name_to_python(d.model().params().name); }, doc::kName);
  def_text_and_pickle(
      cls,
      [](const Categorical& model) {
        return "CategoricalDistribution(K=" + std::to_string(model.n_categories()) +
               ", name=" + py::repr(name_to_python(model.params().name)).cast<std::string>() + ")";
      },
      [](const Categorical& model) {
        const Vector& p = model.params().p;
        return py::make_tuple(copy_reals(p.data(), {p.size()}), name_to_python(model.params().name));
      },
      make);

  def_leaf_sampler(
      cls, sampler_class, [](const Categorical& model, uint64_t seed) { return CategoricalSampler(model, seed); },
      [](int64_t id) { return py::int_(id); });

  bind_estimator_class<CategoricalEstimator>(m, categorical_family(), "CategoricalEstimator",
                                             "p = (counts + smoothing) / sum."
                                             R"doc(

Example:

>>> import attnmix
>>> estimator = attnmix.CategoricalEstimator(3, smoothing=1.0)
>>> acc = estimator.accumulator_factory().make()
>>> acc.seq_update([0, 1, 1, 1], [1.0] * 4, attnmix.CategoricalDistribution([1/3, 1/3, 1/3]))
>>> estimator.estimate(None, acc.value()).p.round(3).tolist()
[0.286, 0.571, 0.143]
)doc");
  bind_accumulator_classes<CategoricalAccumulator>(m, categorical_family(), "CategoricalAccumulator",
                                                   "CategoricalAccumulatorFactory",
                                                   "Statistics, value() = (counts (K,),)."
                                                   R"doc(

Example:

>>> import attnmix
>>> model = attnmix.CategoricalDistribution([0.5, 0.5])
>>> acc = attnmix.CategoricalAccumulator(2)
>>> acc.update(1, 2.0, model)
>>> acc.seq_update([0, 1], [1.0, 1.0], model)
>>> acc.counts.tolist(), acc.value()[0].tolist()
([1.0, 3.0], [1.0, 3.0])
)doc",
                                                   R"doc(

Example:

>>> import attnmix
>>> factory = attnmix.CategoricalAccumulatorFactory(4, name='ids')
>>> acc = factory.make()
>>> factory.num_categories, acc.name, acc.counts.tolist()
(4, 'ids', [0.0, 0.0, 0.0, 0.0])
)doc");

  py::class_<CategoricalDataEncoderPy, DataEncoder, std::shared_ptr<CategoricalDataEncoderPy>> encoder_class(
      m, "CategoricalDataEncoder", "Encodes a list (or 1-D array) of ids."
      R"doc(

Example:

>>> import attnmix
>>> encoder = attnmix.CategoricalDataEncoder(3)
>>> (ids,) = encoder.seq_encode([2, 0, 1])
>>> ids.tolist()
[2, 0, 1]
>>> try:
...     encoder.seq_encode([3])
... except ValueError as error:
...     print(error)
CategoricalDataEncoder: out-of-range ID in ids (entry 0 is 3; must be in [0, 3))
)doc");
  def_declared_sizes(encoder_class, "CategoricalDataEncoder",
                     std::array<DeclaredSize<CategoricalEncoder>, 1>{
                         {{"num_categories", &CategoricalEncoder::n_categories,
                           "The declared number of categories K, an int, or None: ids must lie in 0 .. K-1 "
                           "(unchecked when None)."}}});
}

// ---- diagonal Gaussian --------------------------------------------------------------------------

using GaussianSamplerPy = SamplerOf<DiagonalGaussianSampler>;

void bind_gaussian(py::module_& m) {
  using Dist = DistributionOf<DiagonalGaussian>;
  constexpr const char* kDist = "DiagonalGaussianDistribution";
  const auto make = [](py::object mu, py::object sigma2, py::object name) {
    return Dist(AnyDistribution(DiagonalGaussian(
        {reals_1d(mu, kDist, "mu"), reals_1d(sigma2, kDist, "sigma2"), name_arg(name, kDist)})));
  };
  // Registered first, so that the distribution's sampler() signature names it.
  py::class_<GaussianSamplerPy> sampler_class(
      m, "DiagonalGaussianSampler",
      "Draws vectors x = mu + sqrt(sigma2) * N(0, I) from a DiagonalGaussianDistribution (a reproducible stream per "
      "seed)."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.DiagonalGaussianDistribution([0.0, 1.0], [1.0, 4.0])
>>> x = np.array(attnmix.DiagonalGaussianSampler(model, seed=3).sample(2000))
>>> x.shape
(2000, 2)
>>> bool(np.allclose(x.mean(axis=0), model.mu, atol=0.15))
True
>>> bool(np.allclose(x.var(axis=0), model.sigma2, rtol=0.1))
True
)doc");
  py::class_<Dist, DistributionHandle> cls(
      m, kDist,
      "A Gaussian with diagonal covariance over real vectors (docs/mechanisms.md#building-blocks)."
      R"doc(

Example:

>>> import math
>>> import attnmix
>>> model = attnmix.DiagonalGaussianDistribution([0.0, 1.0], [1.0, 4.0])
>>> model.dim, round(model.log_density([0.0, 1.0]), 4)
(2, -2.531)
>>> round(-math.log(2 * math.pi) - 0.5 * math.log(4.0), 4)
-2.531
)doc");
  cls.def(py::init(make), "mu"_a, "sigma2"_a, "name"_a = py::none())
      .def_property_readonly(
          "mu", [](py::object self) { return readonly_view(self.cast<const Dist&>().model().params().mu, self); },
          "Means mu, a read-only float64 array of shape (D,).")
      .def_property_readonly(
          "sigma2",
          [](py::object self) {
            return readonly_view(self.cast<const Dist&>().model().params().sigma2, self);
          },
          "Variances sigma2 > 0, a read-only float64 array of shape (D,): the diagonal of the "
          "covariance.")
      .def_property_readonly("dim", [](const Dist& d) { return d.model().dim(); },
                             "Dimension D of the values, an int.")
      .def_property_readonly("name",
                             [](const Dist& d) { return name_to_python(d.model().params().name); }, doc::kName);
  def_text_and_pickle(
      cls,
      [](const DiagonalGaussian& model) {
        return "DiagonalGaussianDistribution(D=" + std::to_string(model.dim()) +
               ", name=" + py::repr(name_to_python(model.params().name)).cast<std::string>() + ")";
      },
      [](const DiagonalGaussian& model) {
        const DiagonalGaussianParams& p = model.params();
        return py::make_tuple(copy_reals(p.mu.data(), {p.mu.size()}), copy_reals(p.sigma2.data(), {p.sigma2.size()}),
                              name_to_python(p.name));
      },
      make);

  def_leaf_sampler(
      cls, sampler_class,
      [](const DiagonalGaussian& model, uint64_t seed) { return DiagonalGaussianSampler(model, seed); },
      [](const std::vector<double>& x) { return copy_reals(x.data(), {static_cast<Index>(x.size())}); });

  bind_estimator_class<DiagonalGaussianEstimator>(
      m, diagonal_gaussian_family(), "DiagonalGaussianEstimator",
      "mu = sum / count, sigma2 = max(sum_sq / count - mu^2, min_sigma2)."
      R"doc(

Example:

>>> import attnmix
>>> estimator = attnmix.DiagonalGaussianEstimator(2)
>>> acc = estimator.accumulator_factory().make()
>>> start = attnmix.DiagonalGaussianDistribution([0.0, 0.0], [1.0, 1.0])
>>> acc.seq_update([[1.0, 2.0], [3.0, 2.0]], [1.0, 1.0], start)
>>> model = estimator.estimate(None, acc.value())
>>> model.mu.tolist(), model.sigma2.tolist()
([2.0, 2.0], [1.0, 1e-06])
)doc");
  bind_accumulator_classes<DiagonalGaussianAccumulator>(m, diagonal_gaussian_family(), "DiagonalGaussianAccumulator",
                                                        "DiagonalGaussianAccumulatorFactory",
                                                        "Statistics, value() = (sum (D,), sum_sq (D,), count)."
                                                        R"doc(

Example:

>>> import attnmix
>>> model = attnmix.DiagonalGaussianDistribution([0.0], [1.0])
>>> acc = attnmix.DiagonalGaussianAccumulator(1)
>>> acc.seq_update([[1.0], [3.0]], [1.0, 0.5], model)
>>> acc.sum.tolist(), acc.sum_sq.tolist(), acc.count
([2.5], [5.5], 1.5)
)doc",
                                                        R"doc(

Example:

>>> import attnmix
>>> factory = attnmix.DiagonalGaussianAccumulatorFactory(3)
>>> acc = factory.make()
>>> factory.dim, acc.sum.shape, acc.count
(3, (3,), 0.0)
)doc");

  py::class_<DiagonalGaussianDataEncoderPy, DataEncoder, std::shared_ptr<DiagonalGaussianDataEncoderPy>>
      encoder_class(m, "DiagonalGaussianDataEncoder", "Encodes a list of vectors (or an (n, D) array)."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> encoder = attnmix.DiagonalGaussianDataEncoder(2)
>>> (x,) = encoder.seq_encode(np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
>>> x.shape, encoder.dim
((3, 2), 2)
)doc");
  def_declared_sizes(encoder_class, "DiagonalGaussianDataEncoder",
                     std::array<DeclaredSize<DiagonalGaussianEncoder>, 1>{
                         {{"dim", &DiagonalGaussianEncoder::dim,
                           "The declared dimension D, an int, or None: every vector must have D entries (unchecked "
                           "when None)."}}});
}

}  // namespace

namespace {

/// The entries of the two combinators: their encoders and value() tuples are their children's.
void register_combinators() {
  PythonFamily mixture;
  mixture.distribution = [](AnyDistribution d) { return py::cast(DistributionOf<Mixture>(std::move(d))); };
  mixture.estimator = [](AnyEstimator e, py::object pseudo) {
    return py::cast(EstimatorOf<MixtureEstimator>(std::move(e), std::move(pseudo)));
  };
  mixture.accumulator = [](AccumulatorHandle site) { return py::cast(AccumulatorOf<MixtureAccumulator>(std::move(site))); };
  mixture.model_encoder = [](const AnyDistribution& d) -> std::shared_ptr<DataEncoder> {
    return std::make_shared<MixtureDataEncoderPy>(encoder_of(d.get_if<Mixture>()->components().front()));
  };
  mixture.accumulator_encoder = [](const AnyAccumulator& a) -> std::shared_ptr<DataEncoder> {
    return std::make_shared<MixtureDataEncoderPy>(encoder_of(a.get_if<MixtureAccumulator>()->components().front()));
  };
  // (comp_count (K,), (component statistics …))
  mixture.value_out = [](const AnyAccumulator& a, py::tuple children) -> py::object {
    const Vector& counts = a.get_if<MixtureAccumulator>()->comp_count();
    return py::make_tuple(copy_reals(counts.data(), {counts.size()}), std::move(children));
  };
  mixture.value_in = [](py::handle value, const AnyAccumulator& like, std::string_view where,
                        std::vector<double>& out) {
    const auto K = static_cast<Index>(like.children().size());
    const py::tuple items = statistics_tuple(
        value, 2, where, "comp_count (" + std::to_string(K) + ",), (component statistics ...)");
    reals_of_shape(items[0], {K}, where, "comp_count", out);
    return statistics_tuple(items[1], static_cast<size_t>(K), where, std::to_string(K) + " component statistics");
  };
  register_python_family(typeid(Mixture), typeid(MixtureEstimator), typeid(MixtureAccumulator), mixture);

  PythonFamily composite;
  composite.distribution = [](AnyDistribution d) { return py::cast(DistributionOf<Composite>(std::move(d))); };
  composite.estimator = [](AnyEstimator e, py::object pseudo) {
    return py::cast(EstimatorOf<CompositeEstimator>(std::move(e), std::move(pseudo)));
  };
  composite.accumulator = [](AccumulatorHandle site) {
    return py::cast(AccumulatorOf<CompositeAccumulator>(std::move(site)));
  };
  composite.model_encoder = [](const AnyDistribution& d) -> std::shared_ptr<DataEncoder> {
    std::vector<std::shared_ptr<DataEncoder>> fields;
    for (const AnyDistribution& c : d.get_if<Composite>()->components()) fields.push_back(encoder_of(c));
    return std::make_shared<CompositeDataEncoderPy>(std::move(fields));
  };
  composite.accumulator_encoder = [](const AnyAccumulator& a) -> std::shared_ptr<DataEncoder> {
    std::vector<std::shared_ptr<DataEncoder>> fields;
    for (const AnyAccumulator& c : a.children()) fields.push_back(encoder_of(c));
    return std::make_shared<CompositeDataEncoderPy>(std::move(fields));
  };
  // (field statistics …)
  composite.value_out = [](const AnyAccumulator&, py::tuple children) -> py::object { return children; };
  composite.value_in = [](py::handle value, const AnyAccumulator& like, std::string_view where,
                          std::vector<double>&) {
    const size_t F = like.children().size();
    return statistics_tuple(value, F, where, std::to_string(F) + " field statistics");
  };
  register_python_family(typeid(Composite), typeid(CompositeEstimator), typeid(CompositeAccumulator), composite);
}

}  // namespace

void bind_stats(py::module_& m) {
  register_combinators();
  register_leaf_family<Categorical, CategoricalEstimator, CategoricalAccumulator, CategoricalDataEncoderPy>();
  register_leaf_family<DiagonalGaussian, DiagonalGaussianEstimator, DiagonalGaussianAccumulator,
                       DiagonalGaussianDataEncoderPy>();
  bind_mixture(m);
  bind_composite(m);
  bind_categorical(m);
  bind_gaussian(m);
}

}  // namespace attnmix::python
