// SPDX-License-Identifier: Apache-2.0
// Responsibility attention in Python (docs/mechanisms.md#responsibility-attention):
// ResponsibilityAttention{Distribution, Estimator, Accumulator, AccumulatorFactory, DataEncoder, Sampler} and
// sequence_to_triples.
// Constructors convert their arguments (convert.hpp) and call the library's validating
// constructors; the generic role methods come from bind_core.cpp.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
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
using Dist = DistributionOf<ResponsibilityAttention>;
using Encoder = ResponsibilityAttentionDataEncoderPy;

constexpr const char* kDist = "ResponsibilityAttentionDistribution";

Dist make_distribution(py::object key_means, py::object emission, py::object position_prior,
                       py::object sigma2, py::object name, py::object precision) {
  ResponsibilityAttentionParams p;
  p.key_means = reals_2d(key_means, kDist, "key_means");
  p.emission = reals_2d(emission, kDist, "emission");
  if (!position_prior.is_none())
    p.position_prior = reals_1d(position_prior, kDist, "position_prior");
  p.sigma2 = real_number(sigma2, kDist, "sigma2");
  p.name = name_arg(name, kDist);
  const Precision arithmetic = precision_arg(precision, kDist);
  return Dist(AnyDistribution(ResponsibilityAttention(std::move(p), arithmetic)));  // validates
}

/// key_means, emission, position_prior, sigma2, name, precision: the constructor's arguments (pickling).
py::tuple params_of(const ResponsibilityAttention& m) {
  const ResponsibilityAttentionParams& p = m.params();
  return py::make_tuple(copy_reals(p.key_means.data(), {p.key_means.rows(), p.key_means.cols()}),
                        copy_reals(p.emission.data(), {p.emission.rows(), p.emission.cols()}),
                        copy_reals(p.position_prior.data(), {p.position_prior.size()}),
                        py::float_(p.sigma2), name_to_python(p.name),
                        py::str(std::string(precision_name(m.precision()))));
}

std::string describe(const ResponsibilityAttention& m) {
  const py::str format(
      "ResponsibilityAttentionDistribution(S=%d, N=%d, D=%d, T=%d, sigma2=%r, name=%r%s)");
  const std::string precision = m.precision() == Precision::kMixed ? ", precision='mixed'" : "";
  return py::str(format.attr("__mod__")(
      py::make_tuple(m.n_symbols(), m.context_length(), m.query_dim(), m.n_targets(),
                     py::float_(m.sigma2()), name_to_python(m.params().name), precision)));
}

/// predict_proba(context, query): (T,) for a 1-D context, (n, T) for a batch.
py::array predict_proba(const ResponsibilityAttention& m, py::object context, py::object query) {
  constexpr const char* where = "ResponsibilityAttentionDistribution.predict_proba";
  NdArray<int64_t> c = read_ids(context, where, "context");
  NdArray<double> y = read_reals(query, where, "query");
  const bool single = c.ndim() == 1;
  if (c.ndim() != 1 && c.ndim() != 2)
    throw TypeError(std::string(where) +
                    ": context must be 1-D (one example) or 2-D (a batch), got shape " +
                    shape_text(c.shape));
  if (y.ndim() != 1 && y.ndim() != 2)
    throw ValueError(std::string(where) +
                     ": query must be 1-D (one example) or 2-D (a batch), got shape " +
                     shape_text(y.shape));
  if (c.ndim() == 1) c.shape.insert(c.shape.begin(), 1);
  if (y.ndim() == 1) y.shape.insert(y.shape.begin(), 1);
  IdMatrix contexts(c.shape[0], c.shape[1]);
  std::copy(c.values.begin(), c.values.end(), contexts.data());
  Matrix queries(y.shape[0], y.shape[1]);
  std::copy(y.values.begin(), y.values.end(), queries.data());
  Matrix proba;
  {
    const py::gil_scoped_release release;
    proba = m.predict_proba(contexts, queries);
  }
  if (single) return copy_reals(proba.data(), {proba.cols()});
  return copy_reals(proba.data(), {proba.rows(), proba.cols()});
}

/// The rows of a VJP call, validated by the model's encoder (targets 0 when the function has none).
ResponsibilityAttentionBatch vjp_batch(const ResponsibilityAttention& m, py::handle context,
                                       py::handle query, py::handle target, const char* where) {
  IdMatrix contexts = ids_2d(context, where, "context");
  Matrix queries = reals_2d(query, where, "query");
  IdVector targets = target.is_none() ? IdVector(IdVector::Zero(contexts.rows()))
                                      : ids_1d(target, where, "target");
  return m.encoder().encode(std::move(contexts), std::move(queries), std::move(targets));
}

/// (∂L/∂query (n, D), ∂L/∂key_means (S, D)) as new arrays.
py::tuple vjp_out(const ResponsibilityAttentionVjp& v) {
  return py::make_tuple(copy_reals(v.queries.data(), {v.queries.rows(), v.queries.cols()}),
                        copy_reals(v.key_means.data(), {v.key_means.rows(), v.key_means.cols()}));
}

/// _log_density_vjp(context (n,N), query (n,D), target (n,), grad (n,)).
py::tuple log_density_vjp(const ResponsibilityAttention& m, py::handle context, py::handle query,
                          py::handle target, py::handle grad) {
  constexpr const char* where = "ResponsibilityAttentionDistribution._log_density_vjp";
  if (target.is_none()) throw TypeError(std::string(where) + ": target must be a 1-D id array");
  const ResponsibilityAttentionBatch batch = vjp_batch(m, context, query, target, where);
  const Vector g = reals_1d(grad, where, "grad");
  ResponsibilityAttentionVjp v;
  {
    const py::gil_scoped_release release;
    v = m.log_density_vjp(batch, {g.data(), static_cast<size_t>(g.size())});
  }
  return vjp_out(v);
}

/// _predict_proba_vjp(context (n,N), query (n,D), grad (n,T)).
py::tuple predict_proba_vjp(const ResponsibilityAttention& m, py::handle context, py::handle query,
                            py::handle grad) {
  constexpr const char* where = "ResponsibilityAttentionDistribution._predict_proba_vjp";
  const ResponsibilityAttentionBatch batch = vjp_batch(m, context, query, py::none(), where);
  const Matrix g = reals_2d(grad, where, "grad");
  ResponsibilityAttentionVjp v;
  {
    const py::gil_scoped_release release;
    v = m.predict_proba_vjp(batch, g);
  }
  return vjp_out(v);
}

Matrix responsibilities(const ResponsibilityAttention& m, const AnyBatch& rows) {
  constexpr const char* where = "ResponsibilityAttentionDistribution.responsibilities";
  return m.responsibilities(rows.get<ResponsibilityAttentionBatch>(where));
}

using SamplerPy = SamplerOf<ResponsibilityAttentionSampler>;

void bind_distribution(py::module_& m) {
  // Registered first, so that the distribution's sampler() signature names it.
  py::class_<SamplerPy> sampler_class(
      m, "ResponsibilityAttentionSampler",
      "Draws (context, query, target) observations: a context (without replacement when N <= S), z "
      "~ pi, y = K[c_z] + sqrt(sigma2) N(0, I), t ~ B[c_z]."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.ResponsibilityAttentionDistribution(
...     key_means=[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]],
...     position_prior=[0.5, 0.5], sigma2=0.5)
>>> rows = attnmix.ResponsibilityAttentionSampler(model, seed=0).sample(100)
>>> context, query, target = rows[0]
>>> context.shape, query.shape, type(target).__name__
((2,), (2,), 'int')
>>> model.sampler(seed=0).sample(1)[0][0].tolist() == context.tolist()
True
>>> bool(np.isfinite(model.seq_log_density(rows)).all())
True
)doc");
  py::class_<Dist, DistributionHandle> cls(
      m, kDist,
      "One attention head as a mixture over context positions with a generative gate "
      "(docs/mechanisms.md#responsibility-attention): "
      "z ~ pi, y ~ N(K[c_z], sigma2 I), t ~ B[c_z]."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.ResponsibilityAttentionDistribution(
...     key_means=[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]],
...     position_prior=[0.5, 0.5], sigma2=0.5)
>>> model.num_symbols, model.context_length, model.query_dim, model.num_targets
(3, 2, 2, 2)
>>> p = model.predict_proba([0, 1], [1.0, 0.0])
>>> round(float(p.sum()), 9), bool(p[0] > p[1])
(1.0, True)
>>> r = model.responsibilities([([0, 1], [1.0, 0.0], 0)])
>>> r.shape, round(float(r.sum()), 9)
((1, 2), 1.0)
)doc");
  using Model = ResponsibilityAttention;
  def_model_view(
      cls, "key_means", [](const Model& d) -> const Matrix& { return d.params().key_means; },
      "Key means K, a read-only float64 array of shape (S, D): row s is the mean query that attends to symbol s.");
  def_model_view(
      cls, "emission", [](const Model& d) -> const Matrix& { return d.params().emission; }, doc::kEmission);
  def_model_view(
      cls, "position_prior", [](const Model& d) -> const Vector& { return d.params().position_prior; },
      doc::kPositionPrior);
  def_model_view(cls, "log_position_prior", &Model::log_position_prior,
                 "log pi, a read-only float64 array of shape (N,): the logarithm of position_prior, as the gate adds "
                 "it.");
  cls.def(py::init(&make_distribution), "key_means"_a, "emission"_a,
           "position_prior"_a = py::none(), "sigma2"_a = ResponsibilityAttentionParams{}.sigma2,
           "name"_a = py::none(), py::kw_only(), "precision"_a = "float64")
      .def_property_readonly("sigma2", [](const Dist& d) { return d.model().sigma2(); },
                             "Gate variance sigma2 > 0, a float: the isotropic variance of a query around the key "
                             "mean of the attended symbol.")
      .def_property_readonly("gate_const", [](const Dist& d) { return d.model().gate_const(); },
                             "The gate's log normaliser -(D/2) log(2 pi sigma2), a float, added to every "
                             "position's log score.")
      .def_property_readonly("precision",
                             [](const Dist& d) { return std::string(precision_name(d.model().precision())); },
                             doc::kPrecision)
      .def_property_readonly("name",
                             [](const Dist& d) { return name_to_python(d.model().params().name); }, doc::kName)
      .def_property_readonly("num_symbols", [](const Dist& d) { return d.model().n_symbols(); }, doc::kNumSymbols)
      .def_property_readonly("context_length",
                             [](const Dist& d) { return d.model().context_length(); }, doc::kContextLength)
      .def_property_readonly("query_dim", [](const Dist& d) { return d.model().query_dim(); }, doc::kQueryDim)
      .def_property_readonly("num_targets", [](const Dist& d) { return d.model().n_targets(); }, doc::kNumTargets)
      .def(
          "predict_proba",
          [](const Dist& d, py::object c, py::object y) { return predict_proba(d.model(), c, y); },
          "context"_a, "query"_a,
          "p(target | context, query) = sum_i a_i B[c_i] with the target-blind attention a: (T,) "
          "for one example, (n, T) for a batch.")
      .def(
          "_log_density_vjp",
          [](const Dist& d, py::object c, py::object y, py::object t, py::object g) {
            return log_density_vjp(d.model(), c, y, t, g);
          },
          "context"_a, "query"_a, "target"_a, "grad"_a,
          "Private (used by attnmix.torch.em_heads): the vector-Jacobian product of the batch log "
          "density. For L = sum_n grad[n] log p(query_n, target_n | context_n), returns (dL/dquery "
          "(n, D), dL/dkey_means (S, D)); context (n, N), query (n, D), target (n,), grad (n,). "
          "Rows with log p = -inf (impossible evidence) contribute zero.")
      .def(
          "_predict_proba_vjp",
          [](const Dist& d, py::object c, py::object y, py::object g) {
            return predict_proba_vjp(d.model(), c, y, g);
          },
          "context"_a, "query"_a, "grad"_a,
          "Private (used by attnmix.torch.em_heads): the vector-Jacobian product of predict_proba. "
          "For L = sum_{n,t} grad[n, t] p(t | context_n, query_n), returns (dL/dquery (n, D), "
          "dL/dkey_means (S, D)); context (n, N), query (n, D), grad (n, T).");
  def_rows_matrix(cls, "responsibilities", responsibilities, doc::kResponsibilities);
  def_text_and_pickle(cls, describe, params_of, make_distribution, py::make_tuple("float64"));

  def_leaf_sampler(
      cls, sampler_class,
      [](const ResponsibilityAttention& model, uint64_t seed) { return ResponsibilityAttentionSampler(model, seed); },
      [](const ResponsibilityAttentionObservation& obs) {
        return ra_observation(obs.context.data(), static_cast<Index>(obs.context.size()), obs.query.data(),
                              static_cast<Index>(obs.query.size()), obs.target);
      });
}


void bind_encoder(py::module_& m) {
  py::class_<Encoder, DataEncoder, std::shared_ptr<Encoder>> cls(
      m, "ResponsibilityAttentionDataEncoder",
      "Encodes (context, query, target) triples, or a (contexts (n,N), queries (n,D), targets "
      "(n,)) tuple of numpy arrays, into an EncodedBatch; declared dimensions are checked. A query may be a "
      "symbol q in [0, D) standing for the one-hot row e_q: an int per triple, or a 1-D integer array (n,) in the "
      "tuple (every row the same way); the model computes with the symbol, never with the vector."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> encoder = attnmix.ResponsibilityAttentionDataEncoder(num_symbols=3, context_length=2)
>>> arrays = (np.array([[0, 2], [1, 1]]), np.zeros((2, 4)), np.array([1, 0]))
>>> contexts, queries, targets = encoder.seq_encode(arrays)
>>> contexts.shape, queries.shape, targets.tolist()
((2, 2), (2, 4), [1, 0])
>>> try:
...     encoder.seq_encode([([0, 3], [0.0], 0)])
... except ValueError as error:
...     print(error)
ResponsibilityAttentionDataEncoder: out-of-range ID in context (entry 1 is 3; must be in [0, 3))
>>> contexts, symbols, targets = encoder.seq_encode([([0, 2], 3, 1), ([1, 1], 0, 0)])  # symbol queries
>>> symbols.tolist()
[3, 0]
)doc");
  using Spec = ResponsibilityAttentionEncoder;
  def_declared_sizes(cls, "ResponsibilityAttentionDataEncoder",
                     std::array<DeclaredSize<Spec>, 4>{{{"num_symbols", &Spec::n_symbols, doc::kEncoderNumSymbols},
                                                        {"context_length", &Spec::context_length,
                                                         doc::kEncoderContextLength},
                                                        {"query_dim", &Spec::query_dim, doc::kEncoderQueryDim},
                                                        {"num_targets", &Spec::n_targets, doc::kEncoderNumTargets}}});
}

void bind_sequence_to_triples(py::module_& m) {
  m.def(
      "sequence_to_triples",
      [](py::object tokens, py::object context_length, py::object num_symbols, py::object embeddings,
         py::object symbol_queries) {
        constexpr const char* where = "sequence_to_triples";
        const NdArray<int64_t> ids = read_ids(tokens, where, "tokens");
        if (ids.ndim() != 1) throw ValueError("tokens must be a 1-D sequence.");
        const int64_t N = positive_int(context_length, where, "context_length");
        const std::optional<int64_t> S = optional_positive_int(num_symbols, where, "num_symbols");
        std::optional<Matrix> table;
        if (!embeddings.is_none()) table = reals_2d(embeddings, where, "embeddings");
        const bool symbols = flag(symbol_queries, where, "symbol_queries");
        if (symbols && table) throw ValueError("sequence_to_triples: symbol_queries and embeddings exclude each other");
        const ResponsibilityAttentionBatch batch =
            sequence_to_triples(ids.values, N, S, table ? &*table : nullptr);
        py::list out;
        if (symbols) {
          for (Index row = 0; row < batch.n_rows(); ++row)
            out.append(py::make_tuple(copy_ids(batch.context(row), {N}), py::int_(batch.query_symbol(row)),
                                      py::int_(batch.target(row))));
          return out;
        }
        std::vector<double> one_hot(static_cast<size_t>(batch.has_symbol_queries() ? batch.query_dim() : 0));
        for (Index row = 0; row < batch.n_rows(); ++row) {
          const double* query = batch.has_symbol_queries() ? one_hot.data() : batch.query(row);
          if (batch.has_symbol_queries()) {
            std::fill(one_hot.begin(), one_hot.end(), 0.0);
            one_hot[static_cast<size_t>(batch.query_symbol(row))] = 1.0;
          }
          out.append(ra_observation(batch.context(row), batch.context_length(), query, batch.query_dim(),
                                    batch.target(row)));
        }
        return out;
      },
      "tokens"_a, "context_length"_a, py::kw_only(), "num_symbols"_a = py::none(),
      "embeddings"_a = py::none(), "symbol_queries"_a = false,
      "The (context, query, target) triples of a token sequence: for p in [N-1, "
      "len-2], context tokens[p-N+1..p], query embeddings[tokens[p]] (one-hot of length S without "
      "embeddings; the int tokens[p] itself with symbol_queries=True, which both responsibility families take and "
      "which needs no n x S matrix), target tokens[p+1].\n\n"
      "Example:\n\n"
      ">>> from attnmix import sequence_to_triples\n"
      ">>> for context, query, target in sequence_to_triples([0, 1, 2, 0], 2, num_symbols=3):\n"
      "...     print(context.tolist(), query.tolist(), target)\n"
      "[0, 1] [0.0, 1.0, 0.0] 2\n"
      "[1, 2] [0.0, 0.0, 1.0] 0\n"
      ">>> sequence_to_triples([0, 1, 2, 0], 2, symbol_queries=True)[0][1:]\n"
      "(1, 2)\n");
}

}  // namespace

void bind_attention(py::module_& m) {
  register_leaf_family<ResponsibilityAttention, ResponsibilityAttentionEstimator, ResponsibilityAttentionAccumulator,
                       Encoder>();
  bind_distribution(m);
  bind_estimator_class<ResponsibilityAttentionEstimator>(
      m, responsibility_attention_family(), "ResponsibilityAttentionEstimator",
      "The closed-form M-step of responsibility attention "
      "(docs/mechanisms.md#responsibility-attention)."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.ResponsibilityAttentionDistribution(
...     key_means=[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]],
...     position_prior=[0.5, 0.5], sigma2=0.5)
>>> rows = model.sampler(seed=1).sample(4000)
>>> estimator = attnmix.ResponsibilityAttentionEstimator(3, 2, 2, 2, sigma2=0.5)
>>> acc = estimator.accumulator_factory().make()
>>> acc.seq_update(rows, np.ones(len(rows)), model)
>>> refit = estimator.estimate(None, acc.value())
>>> bool(np.allclose(refit.emission, model.emission, atol=0.05))
True
>>> bool(np.allclose(refit.key_means, model.key_means, atol=0.1))
True
)doc");
  bind_accumulator_classes<ResponsibilityAttentionAccumulator>(
      m, responsibility_attention_family(), "ResponsibilityAttentionAccumulator",
      "ResponsibilityAttentionAccumulatorFactory",
      "Statistics, value() = (key_sum (S,D), key_mass (S,), emission_count (S,T), position_count (N,), query_sq)."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.ResponsibilityAttentionDistribution(
...     key_means=[[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]],
...     position_prior=[0.5, 0.5], sigma2=0.5)
>>> acc = attnmix.ResponsibilityAttentionAccumulator(3, 2, 2, 2)
>>> rows = model.sampler(seed=2).sample(10)
>>> acc.seq_update(rows, np.ones(10), model)
>>> round(float(acc.position_count.sum()), 9), round(float(acc.emission_count.sum()), 9)
(10.0, 10.0)
>>> [a.shape for a in acc.value()[:4]]
[(3, 2), (3,), (3, 2), (2,)]
)doc",
      R"doc(

Example:

>>> import attnmix
>>> factory = attnmix.ResponsibilityAttentionAccumulatorFactory(3, 2, 2, 2)
>>> acc = factory.make()
>>> factory.num_symbols, acc.key_sum.shape, float(acc.query_sq)
(3, (3, 2), 0.0)
)doc");
  bind_encoder(m);
  bind_sequence_to_triples(m);
}

}  // namespace attnmix::python
