// SPDX-License-Identifier: Apache-2.0
// Chained attention in Python (docs/mechanisms.md#chained-attention): ChainedAttention{Distribution, Estimator,
// Accumulator, AccumulatorFactory, DataEncoder, Sampler}. Constructors convert their arguments
// (convert.hpp) and call the library's validating constructors; the generic role methods come from
// bind_core.cpp.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "attnmix/attention/chained.hpp"
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
using Dist = DistributionOf<ChainedAttention>;
using Encoder = ChainedAttentionDataEncoderPy;

constexpr const char* kDist = "ChainedAttentionDistribution";

/// keys (L, S, S): a real 3-D array, split into the L hop tables. The library checks the rest
/// (L, S ≥ 1, square tables with S rows, finiteness).
std::vector<Matrix> key_tables_arg(py::handle keys) {
  const NdArray<double> a = read_reals(keys, kDist, "keys");
  if (a.ndim() != 3)
    throw ValueError(std::string(kDist) + ": keys must be a 3-D (L, S, S) array (got shape " +
                     shape_text(a.shape) + ")");
  const Index L = a.shape[0];
  const Index rows = a.shape[1];
  const Index cols = a.shape[2];
  std::vector<Matrix> tables;
  tables.reserve(static_cast<size_t>(L));
  for (Index hop = 0; hop < L; ++hop) {
    Matrix K(rows, cols);
    std::copy_n(a.values.begin() + hop * rows * cols, rows * cols, K.data());
    tables.push_back(std::move(K));
  }
  return tables;
}

Dist make_distribution(py::object keys, py::object emission, py::object sigma2, py::object name) {
  ChainedAttentionParams p;
  p.key_tables = key_tables_arg(keys);
  p.emission = reals_2d(emission, kDist, "emission");
  p.sigma2 = real_number(sigma2, kDist, "sigma2");
  p.name = name_arg(name, kDist);
  return Dist(AnyDistribution(ChainedAttention(std::move(p))));  // validates (docs/mechanisms.md#chained-attention)
}

/// The hop tables as one new (L, S, S) array.
py::array_t<double> key_tables_of(const ChainedAttention& m) {
  const Index L = m.n_hops();
  const Index S = m.n_symbols();
  std::vector<double> flat;
  flat.reserve(static_cast<size_t>(L * S * S));
  for (const Matrix& K : m.params().key_tables)
    flat.insert(flat.end(), K.data(), K.data() + K.size());
  return copy_reals(flat.data(), {L, S, S});
}

/// keys, emission, sigma2, name: the constructor's arguments (pickling).
py::tuple params_of(const ChainedAttention& m) {
  const Matrix& b = m.params().emission;
  return py::make_tuple(key_tables_of(m), copy_reals(b.data(), {b.rows(), b.cols()}),
                        py::float_(m.sigma2()), name_to_python(m.params().name));
}

std::string describe(const ChainedAttention& m) {
  const py::str format("ChainedAttentionDistribution(L=%d, S=%d, T=%d, sigma2=%r, name=%r)");
  return py::str(format.attr("__mod__")(py::make_tuple(m.n_hops(), m.n_symbols(), m.n_targets(),
                                                       py::float_(m.sigma2()),
                                                       name_to_python(m.params().name))));
}

/// predict_proba(context_keys, context_values, query): (T,) for 1-D keys (one example, a scalar
/// query), (n, T) for 2-D keys (a batch, queries (n,)).
py::array predict_proba(const ChainedAttention& m, py::object context_keys,
                        py::object context_values, py::object query) {
  constexpr const char* where = "ChainedAttentionDistribution.predict_proba";
  NdArray<int64_t> k = read_ids(context_keys, where, "context_keys");
  NdArray<int64_t> v = read_ids(context_values, where, "context_values");
  NdArray<int64_t> q = read_ids(query, where, "query");
  if (k.ndim() != 1 && k.ndim() != 2)
    throw TypeError(std::string(where) +
                    ": context_keys must be 1-D (one example) or 2-D (a batch), got shape " +
                    shape_text(k.shape));
  const bool single = k.ndim() == 1;
  if (v.ndim() != k.ndim())
    throw TypeError(std::string(where) + ": context_values must have the dimensions of " +
                    "context_keys (" + std::to_string(k.ndim()) + "-D), got shape " +
                    shape_text(v.shape));
  if (q.ndim() != k.ndim() - 1)
    throw TypeError(std::string(where) + ": query must be " +
                    (single ? std::string("one id for 1-D context_keys")
                            : std::string("a 1-D array of ids for 2-D context_keys")) +
                    ", got shape " + shape_text(q.shape));
  if (single) {
    k.shape.insert(k.shape.begin(), 1);
    v.shape.insert(v.shape.begin(), 1);
    q.shape.insert(q.shape.begin(), 1);
  }
  if (v.shape != k.shape)
    throw ValueError(std::string(where) + ": context_keys and context_values must have the same " +
                     "shape (got " + shape_text(k.shape) + " and " + shape_text(v.shape) + ")");
  if (q.shape[0] != k.shape[0])
    throw ValueError(std::string(where) + ": query must have one id per row of context_keys (" +
                     std::to_string(k.shape[0]) + " rows, " + std::to_string(q.shape[0]) +
                     " queries)");
  IdMatrix keys(k.shape[0], k.shape[1]);
  std::copy(k.values.begin(), k.values.end(), keys.data());
  IdMatrix values(v.shape[0], v.shape[1]);
  std::copy(v.values.begin(), v.values.end(), values.data());
  IdVector queries(q.shape[0]);
  std::copy(q.values.begin(), q.values.end(), queries.data());
  Matrix proba;
  {
    const py::gil_scoped_release release;
    proba = m.predict_proba(keys, values, queries);  // validates the ids against S
  }
  if (single) return copy_reals(proba.data(), {proba.cols()});
  return copy_reals(proba.data(), {proba.rows(), proba.cols()});
}

using SamplerPy = SamplerOf<ChainedAttentionSampler>;

void bind_distribution(py::module_& m) {
  // Registered first, so that the distribution's sampler() signature names it.
  py::class_<SamplerPy> sampler_class(
      m, "ChainedAttentionSampler",
      "Draws (keys, values, query, target) observations: keys and values iid uniform over [S] "
      "(context_length each), q uniform, the L hop positions from their gates, t ~ B[v_pos]."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.ChainedAttentionDistribution(keys=np.stack([np.eye(3), np.eye(3)]),
...                                              emission=[[0.8, 0.2], [0.2, 0.8], [0.5, 0.5]], sigma2=0.1)
>>> rows = attnmix.ChainedAttentionSampler(model, seed=0, context_length=4).sample(50)
>>> keys, values, query, target = rows[0]
>>> keys.shape, values.shape, 0 <= query < 3, target in (0, 1)
((4,), (4,), True, True)
>>> bool(np.isfinite(model.seq_log_density(rows)).all())
True
)doc");
  py::class_<Dist, DistributionHandle> cls(
      m, kDist,
      "L content-addressed attention hops whose attended positions form a chain "
      "(docs/mechanisms.md#chained-attention): "
      "z_0 ~ g(q, K0), z_l | z_(l-1) = i ~ g(v_i, K_l), t ~ B[v_(z_(L-1))]."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.ChainedAttentionDistribution(keys=np.stack([np.eye(3), np.eye(3)]),
...                                              emission=[[0.8, 0.2], [0.2, 0.8], [0.5, 0.5]], sigma2=0.1)
>>> model.n_hops, model.num_symbols, model.num_targets
(2, 3, 2)
>>> p = model.predict_proba([0, 1, 2], [1, 2, 0], 0)
>>> round(float(p.sum()), 9)
1.0
>>> gamma = model.posterior([([0, 1, 2], [1, 2, 0], 0, 1)])
>>> gamma.shape, gamma.sum(axis=2).round(9).tolist()
((1, 2, 3), [[1.0, 1.0]])
)doc");
  cls.def(py::init(&make_distribution), "keys"_a, "emission"_a,
           "sigma2"_a = ChainedAttentionParams{}.sigma2, "name"_a = py::none())
      .def_property_readonly(
          "key_tables", [](const Dist& d) { return key_tables_of(d.model()); },
          "The hop key tables, a new (L, S, S) array.")
      .def_property_readonly(
          "emission", [](py::object self) { return readonly_view(self.cast<const Dist&>().model().emission(), self); },
          "Emission table B, a read-only float64 array of shape (S, T): row s is p(target | "
          "the last hop attends a position whose value is s) and sums to 1.")
      .def_property_readonly("sigma2", [](const Dist& d) { return d.model().sigma2(); },
                             "Gate variance sigma2 > 0, a float (fixed, not fitted): the temperature of every "
                             "hop's gate.")
      .def_property_readonly("name",
                             [](const Dist& d) { return name_to_python(d.model().params().name); }, doc::kName)
      .def_property_readonly("n_hops", [](const Dist& d) { return d.model().n_hops(); },
                             "Number of attention hops L, an int.")
      .def_property_readonly("num_symbols", [](const Dist& d) { return d.model().n_symbols(); }, doc::kNumSymbols)
      .def_property_readonly("num_targets", [](const Dist& d) { return d.model().n_targets(); }, doc::kNumTargets)
      .def(
          "predict_proba",
          [](const Dist& d, py::object k, py::object v, py::object q) {
            return predict_proba(d.model(), k, v, q);
          },
          "context_keys"_a, "context_values"_a, "query"_a,
          "p(target | keys, values, query) = sum_j alpha_(L-1)(j) B[v_j] (the forward pass without "
          "the target): (T,) for one example (1-D keys), (n, T) for a batch.")
      .def(
          "posterior",
          [](const Dist& d, py::object x) {
            const AnyBatch any = batch_of(x, *encoder_of(d.any));
            const auto& batch = any.get<ChainedAttentionBatch>("ChainedAttentionDistribution.posterior");
            const Index L = d.model().n_hops(), N = batch.context_length(), n = batch.n_rows();
            Matrix gamma(n, L * N);  // row r: the hops' gamma rows, one after another
            {
              const py::gil_scoped_release release;
              for (Index r = 0; r < n; ++r) {
                const Matrix g = d.model().posterior(batch, r).gamma;  // [L, N], row-major
                gamma.row(r) = Eigen::Map<const Eigen::RowVectorXd>(g.data(), L * N);
              }
            }
            return copy_reals(gamma.data(), {n, L, N});
          },
          "x"_a,
          "The posterior over the position attended at each hop given the row's target, gamma[n, hop, j] (each "
          "(n, hop) row sums to 1; a row impossible under the model is all zeros): (n, L, N). x: rows the model's "
          "encoder accepts, or an encoded batch.");
  def_text_and_pickle(cls, describe, params_of, make_distribution);

  def_leaf_sampler(
      cls, sampler_class,
      [](const ChainedAttention& model, uint64_t seed, int64_t n) { return ChainedAttentionSampler(model, seed, n); },
      ca_observation);
}


void bind_encoder(py::module_& m) {
  py::class_<Encoder, DataEncoder, std::shared_ptr<Encoder>> cls(
      m, "ChainedAttentionDataEncoder",
      "Encodes (keys, values, query, target) observations, or a (keys (n,N), values (n,N), "
      "queries (n,), targets (n,)) tuple of numpy arrays, into an EncodedBatch; declared bounds "
      "are checked."
      R"doc(

Example:

>>> import attnmix
>>> encoder = attnmix.ChainedAttentionDataEncoder(num_symbols=3, num_targets=2)
>>> keys, values, queries, targets = encoder.seq_encode([([0, 1, 2], [1, 2, 0], 2, 1)])
>>> keys.tolist(), values.tolist(), queries.tolist(), targets.tolist()
([[0, 1, 2]], [[1, 2, 0]], [2], [1])
>>> try:
...     encoder.seq_encode([([0, 1, 2], [1, 2, 0], 2, 5)])
... except ValueError as error:
...     print(error)
ChainedAttentionDataEncoder: out-of-range ID in target (entry 0 is 5; must be in [0, 2))
)doc");
  def_declared_sizes(cls, "ChainedAttentionDataEncoder", kChainedSizes);
}

}  // namespace

void bind_chained(py::module_& m) {
  register_leaf_family<ChainedAttention, ChainedAttentionEstimator, ChainedAttentionAccumulator,
                       ChainedAttentionDataEncoderPy>();
  bind_distribution(m);
  bind_estimator_class<ChainedAttentionEstimator>(
      m, chained_attention_family(), "ChainedAttentionEstimator",
      "The M-step of chained attention (docs/mechanisms.md#chained-attention): "
      "K_l[s] = key_num[l][s] / max(key_mass[l][s], 1e-9), B = "
      "(emission_count + emission_smoothing) row-normalised, sigma2 fixed."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.ChainedAttentionDistribution(keys=np.stack([np.eye(3), np.eye(3)]),
...                                              emission=[[0.8, 0.2], [0.2, 0.8], [0.5, 0.5]], sigma2=0.1)
>>> rows = model.sampler(seed=1, context_length=4).sample(3000)
>>> estimator = attnmix.ChainedAttentionEstimator(2, 3, 2, sigma2=0.1)
>>> acc = estimator.accumulator_factory().make()
>>> acc.seq_update(rows, np.ones(len(rows)), model)
>>> refit = estimator.estimate(None, acc.value())
>>> bool(np.allclose(refit.emission, model.emission, atol=0.05)), refit.n_hops
(True, 2)
)doc");
  bind_accumulator_classes<ChainedAttentionAccumulator>(
      m, chained_attention_family(), "ChainedAttentionAccumulator", "ChainedAttentionAccumulatorFactory",
      "Statistics, value() = (key_num (L,S,S), key_mass (L,S), emission_count (S,T), ll, n)."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.ChainedAttentionDistribution(keys=np.stack([np.eye(3), np.eye(3)]),
...                                              emission=[[0.8, 0.2], [0.2, 0.8], [0.5, 0.5]], sigma2=0.1)
>>> acc = attnmix.ChainedAttentionAccumulator(2, 3, 2)
>>> rows = model.sampler(seed=2, context_length=4).sample(10)
>>> acc.seq_update(rows, np.ones(10), model)
>>> acc.n, round(float(acc.emission_count.sum()), 9), acc.key_num.shape
(10.0, 10.0, (2, 3, 3))
>>> bool(np.isclose(acc.ll, model.seq_log_density(rows).sum()))
True
)doc",
      R"doc(

Example:

>>> import attnmix
>>> factory = attnmix.ChainedAttentionAccumulatorFactory(2, 3, 2)
>>> acc = factory.make()
>>> factory.n_hops, acc.key_mass.shape, acc.n
(2, (2, 3), 0.0)
)doc");
  bind_encoder(m);
}

}  // namespace attnmix::python
