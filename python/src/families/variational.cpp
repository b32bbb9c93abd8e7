// SPDX-License-Identifier: Apache-2.0
// The variational families in Python: AttentionOptimizerState (docs/mechanisms.md#variational-embedding-attention),
// variational embedding attention VariationalEmbeddingAttention{Distribution, Estimator, Accumulator,
// AccumulatorFactory, DataEncoder, Sampler} (docs/mechanisms.md#variational-embedding-attention) and variational
// multi-hop attention VariationalMultiHopAttention{…} (docs/mechanisms.md#variational-multi-hop-attention).
// Constructors convert their arguments (convert.hpp) and call the library's validating constructors; the generic role
// methods come from bind_core.cpp, and the statistics tuples (whose last entry is the optimizer state) from
// families.cpp.
#include <pybind11/stl.h>

#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
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

using State = AttentionOptimizerState;
using VeaDist = DistributionOf<VariationalEmbeddingAttention>;
using VeaEncoder = VariationalEmbeddingAttentionDataEncoderPy;
using VmhaDist = DistributionOf<VariationalMultiHopAttention>;
using VmhaEncoder = VariationalMultiHopAttentionDataEncoderPy;

constexpr const char* kState = "AttentionOptimizerState";
constexpr const char* kVeaDist = "VariationalEmbeddingAttentionDistribution";
constexpr const char* kVmhaDist = "VariationalMultiHopAttentionDistribution";
// ---- shared conversions -------------------------------------------------------------------------

py::array_t<double> matrix_copy(const Matrix& m) {
  return copy_reals(m.data(), {m.rows(), m.cols()});
}

/// The ids of a predict_proba call: C context arrays (1-D for one example, 2-D for a batch, all of
/// one shape) and the query ids (a scalar for one example, (n,) for a batch).
struct PredictIds {
  std::vector<IdMatrix> contexts;  // [n, N] each
  IdVector queries;                // [n]
  bool single = false;
};

PredictIds predict_ids(const std::string& where,
                       std::initializer_list<std::pair<const char*, py::handle>> contexts,
                       const char* query_name, py::handle query) {
  std::vector<std::pair<const char*, NdArray<int64_t>>> arrays;
  for (const auto& [name, obj] : contexts) arrays.emplace_back(name, read_ids(obj, where, name));
  NdArray<int64_t> q = read_ids(query, where, query_name);
  const auto& [first_name, first] = arrays.front();
  if (first.ndim() != 1 && first.ndim() != 2)
    throw TypeError(where + ": " + first_name +
                    " must be 1-D (one example) or 2-D (a batch), got shape " +
                    shape_text(first.shape));
  PredictIds out;
  out.single = first.ndim() == 1;
  for (auto& [name, a] : arrays) {
    if (a.ndim() != first.ndim())
      throw TypeError(where + ": " + name + " must have the dimensions of " + first_name + " (" +
                      std::to_string(first.ndim()) + "-D), got shape " + shape_text(a.shape));
    if (a.shape != first.shape)
      throw ValueError(where + ": " + name + " must have the shape of " + first_name + " (got " +
                       shape_text(first.shape) + " and " + shape_text(a.shape) + ")");
  }
  if (q.ndim() != first.ndim() - 1)
    throw TypeError(where + ": " + query_name + " must be " +
                    (out.single ? std::string("one id for 1-D ") + first_name
                                : std::string("a 1-D array of ids for 2-D ") + first_name) +
                    ", got shape " + shape_text(q.shape));
  if (out.single) q.shape.insert(q.shape.begin(), 1);
  const Index n = out.single ? 1 : first.shape[0];
  const Index N = first.shape.back();
  if (q.shape[0] != n)
    throw ValueError(where + ": " + query_name + " must have one id per row of " + first_name +
                     " (" + std::to_string(n) + " rows, " + std::to_string(q.shape[0]) + " ids)");
  for (auto& [name, a] : arrays) {
    IdMatrix m(n, N);
    std::copy(a.values.begin(), a.values.end(), m.data());
    out.contexts.push_back(std::move(m));
  }
  out.queries.resize(n);
  std::copy(q.values.begin(), q.values.end(), out.queries.data());
  return out;
}

/// predict_proba's result: (T,) for one example, (n, T) for a batch.
py::array proba_result(const Matrix& proba, bool single) {
  if (single) return copy_reals(proba.data(), {proba.cols()});
  return copy_reals(proba.data(), {proba.rows(), proba.cols()});
}

/// The optimizer_state argument of a distribution: None, or a copy of the given state.
std::optional<State> state_arg(py::handle obj, const char* where) {
  const std::shared_ptr<const State> state =
      optimizer_state_from_python(obj, where, "optimizer_state");
  if (!state) return std::nullopt;
  return *state;
}

/// The distribution attributes both variational families share: the embedding posterior, its
/// optimizer state, the emission, sigma2, name and dimensions.
template <class Class>
void def_shared_distribution_attributes(Class& cls) {
  using D = typename Class::type;
  using Model = std::decay_t<decltype(std::declval<const D&>().model())>;
  def_model_view(cls, "mean", &Model::mean, "Posterior means m (S, D), read-only.");
  def_model_view(cls, "log_var", &Model::log_var, "Posterior log variances log v (S, D), read-only.");
  def_model_view(cls, "emission", &Model::emission, doc::kEmission);
  cls.def_property_readonly("sigma2", [](const D& d) { return d.model().sigma2(); }, doc::kEmbeddingSigma2)
      .def_property_readonly("name",
                             [](const D& d) { return name_to_python(d.model().params().name); }, doc::kName)
      .def_property_readonly(
          "optimizer_state",
          [](const D& d) {
            return optimizer_state_to_python(
                std::make_shared<const State>(d.model().optimizer_state()));
          },
          "The Adam state carried by this model.")
      .def_property_readonly("num_symbols", [](const D& d) { return d.model().n_symbols(); }, doc::kNumSymbols)
      .def_property_readonly("embed_dim", [](const D& d) { return d.model().embed_dim(); }, doc::kEmbedDim)
      .def_property_readonly("num_targets", [](const D& d) { return d.model().n_targets(); }, doc::kNumTargets)
      .def(
          "embeddings",
          [](py::object self) { return readonly_view(self.cast<const D&>().model().embeddings(), self); },
          "The learned (posterior-mean) tied embedding table m (S, D), read-only.");
}

// ---- AttentionOptimizerState --------------------------------------------------------------------

/// The Python AttentionOptimizerState: an immutable, validated state shared with the library.
struct OptimizerStatePy {
  std::shared_ptr<const State> state;
};

OptimizerStatePy make_state(py::handle family, py::handle mean, py::handle log_var,
                            py::handle mean_m1, py::handle mean_m2, py::handle log_var_m1,
                            py::handle log_var_m2, py::handle iteration, py::handle seed,
                            py::handle schema_version, py::handle algorithm) {
  const std::optional<std::string> fam = optional_str(family, kState, "family");
  if (!fam) throw TypeError(std::string(kState) + ": family must be a str (got None)");
  if (positive_int(schema_version, kState, "schema_version") != State::kSchemaVersion)
    throw ValueError(std::string(kState) + ": unsupported schema_version " +
                     py::repr(schema_version).cast<std::string>() + " (this build reads 1)");
  const std::optional<std::string> alg = optional_str(algorithm, kState, "algorithm");
  if (alg != std::string(State::kAlgorithm))
    throw ValueError(std::string(kState) + ": unsupported algorithm " +
                     py::repr(algorithm).cast<std::string>() + " (this build reads 'adam')");
  State s;
  s.family = *fam;
  s.mean = reals_2d(mean, kState, "mean");
  s.log_var = reals_2d(log_var, kState, "log_var");
  s.mean_first_moment = reals_2d(mean_m1, kState, "mean_first_moment");
  s.mean_second_moment = reals_2d(mean_m2, kState, "mean_second_moment");
  s.log_var_first_moment = reals_2d(log_var_m1, kState, "log_var_first_moment");
  s.log_var_second_moment = reals_2d(log_var_m2, kState, "log_var_second_moment");
  s.iteration = nonnegative_int(iteration, kState, "iteration");
  s.seed = seed_int(seed, kState, "seed");
  s.validate(kState);
  return {std::make_shared<const State>(std::move(s))};
}

/// to_dict(): the library's JSON form (optimizer_state_to_json) as Python objects.
py::object state_to_dict(const State& s) {
  return py::module_::import("json").attr("loads")(optimizer_state_to_json(s).dump());
}

/// from_dict(d): d through JSON text into the library's validating reader. numpy arrays and scalars
/// are accepted (as their tolist()); a non-finite number is a ValueError.
OptimizerStatePy state_from_dict(const py::object& d) {
  constexpr const char* where = "AttentionOptimizerState.from_dict";
  if (!PyDict_Check(d.ptr()))
    throw TypeError(std::string(where) + ": d must be a dict (got " + type_name(d) + ")");
  const py::cpp_function tolist([](py::handle o) -> py::object {
    if (py::hasattr(o, "tolist")) return o.attr("tolist")();
    throw TypeError(std::string(where) + ": a " + type_name(o) + " is not JSON serialisable");
  });
  const std::string text = py::module_::import("json")
                               .attr("dumps")(d, "allow_nan"_a = false, "default"_a = tolist)
                               .cast<std::string>();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ValueError(std::string(where) + ": " + e.what());
  }
  return {std::make_shared<const State>(optimizer_state_from_json(doc, where))};
}

std::string describe_state(const State& s) {
  const py::str format("AttentionOptimizerState(family=%r, S=%d, D=%d, iteration=%d, seed=%d)");
  return py::str(format.attr("__mod__")(
      py::make_tuple(s.family, s.mean.rows(), s.mean.cols(), s.iteration, s.seed)));
}

void bind_optimizer_state(py::module_& m) {
  py::class_<OptimizerStatePy>(m, kState,
                               "The Adam state of a variational model "
                               "(docs/mechanisms.md#variational-embedding-attention): the "
                               "embedding posterior (mean, log_var), "
                               "the four Adam moments, the number of Adam steps applied "
                               "(iteration) and the Monte-Carlo seed. "
                               "Immutable; the arrays are read-only."
                               R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> state = attnmix.AttentionOptimizerState.fresh('variational_embedding_attention', np.ones((3, 2)),
...                                               np.zeros((3, 2)), seed=5)
>>> state.iteration, state.seed, state.mean.shape, float(abs(state.mean_first_moment).sum())
(0, 5, (3, 2), 0.0)
>>> back = attnmix.AttentionOptimizerState.from_dict(state.to_dict())
>>> back.family, bool((back.mean == state.mean).all())
('variational_embedding_attention', True)
)doc")
      .def(py::init(&make_state), "family"_a, "mean"_a, "log_var"_a, "mean_first_moment"_a,
           "mean_second_moment"_a, "log_var_first_moment"_a, "log_var_second_moment"_a,
           "iteration"_a = 0, "seed"_a = 0, "schema_version"_a = State::kSchemaVersion,
           "algorithm"_a = State::kAlgorithm)
      .def_static(
          "fresh",
          [](py::object family, py::object mean, py::object log_var, py::object seed) {
            const std::optional<std::string> fam = optional_str(family, kState, "family");
            if (!fam) throw TypeError(std::string(kState) + ": family must be a str (got None)");
            State s = State::fresh(*fam, reals_2d(mean, kState, "mean"),
                                   reals_2d(log_var, kState, "log_var"),
                                   seed_int(seed, kState, "seed"));
            s.validate(kState);
            return OptimizerStatePy{std::make_shared<const State>(std::move(s))};
          },
          "family"_a, "mean"_a, "log_var"_a, "seed"_a = 0,
          "A state with zero Adam moments and iteration 0.")
      .def_property_readonly("family", [](const OptimizerStatePy& s) { return s.state->family; },
                             "The variational family this state belongs to, a str: "
                             "'variational_embedding_attention' or 'variational_multihop_attention'.")
      .def_property_readonly("mean",
                             [](py::object self) {
                               return readonly_view(self.cast<const OptimizerStatePy&>().state->mean,
                                                  self);
                             },
                             "Posterior means m, a read-only float64 array of shape (S, D): row s is the mean "
                             "of symbol s's embedding.")
      .def_property_readonly("log_var",
                             [](py::object self) {
                               return readonly_view(
                                   self.cast<const OptimizerStatePy&>().state->log_var, self);
                             },
                             "Posterior log variances log v, a read-only float64 array of shape (S, D).")
      .def_property_readonly(
          "mean_first_moment",
          [](py::object self) {
            return readonly_view(self.cast<const OptimizerStatePy&>().state->mean_first_moment, self);
          },
          "Adam's first moment of the mean, a read-only float64 array of shape (S, D).")
      .def_property_readonly("mean_second_moment",
                             [](py::object self) {
                               return readonly_view(
                                   self.cast<const OptimizerStatePy&>().state->mean_second_moment,
                                   self);
                             },
                             "Adam's second moment of the mean, a read-only float64 array of shape (S, D).")
      .def_property_readonly("log_var_first_moment",
                             [](py::object self) {
                               return readonly_view(
                                   self.cast<const OptimizerStatePy&>().state->log_var_first_moment,
                                   self);
                             },
                             "Adam's first moment of the log variance, a read-only float64 array of shape "
                             "(S, D).")
      .def_property_readonly(
          "log_var_second_moment",
          [](py::object self) {
            return readonly_view(self.cast<const OptimizerStatePy&>().state->log_var_second_moment,
                               self);
          },
          "Adam's second moment of the log variance, a read-only float64 array of shape (S, D).")
      .def_property_readonly("iteration",
                             [](const OptimizerStatePy& s) { return s.state->iteration; },
                             "The number of Adam steps already applied, an int >= 0.")
      .def_property_readonly("seed", [](const OptimizerStatePy& s) { return s.state->seed; },
                             "The seed of the Monte-Carlo noise, an int >= 0.")
      .def_property_readonly("schema_version",
                             [](const OptimizerStatePy&) { return State::kSchemaVersion; },
                             "The version of the to_dict() layout, an int (always 1).")
      .def_property_readonly("algorithm",
                             [](const OptimizerStatePy&) { return std::string(State::kAlgorithm); },
                             "The optimizer, a str (always 'adam').")
      .def(
          "to_dict", [](const OptimizerStatePy& s) { return state_to_dict(*s.state); },
          "A JSON-serialisable dict (arrays as nested lists; doubles round-trip exactly).")
      .def_static(
          "from_dict", &state_from_dict, "d"_a,
          "The state of a to_dict() dict, validated (an unknown schema_version or algorithm "
          "is a ValueError).")
      .def("__eq__",
           [](const OptimizerStatePy& a, py::handle b) {
             return py::isinstance<OptimizerStatePy>(b) &&
                    *a.state == *b.cast<const OptimizerStatePy&>().state;
           })
      .def("__ne__",
           [](const OptimizerStatePy& a, py::handle b) {
             return !(py::isinstance<OptimizerStatePy>(b) &&
                      *a.state == *b.cast<const OptimizerStatePy&>().state);
           })
      .def("__repr__", [](const OptimizerStatePy& s) { return describe_state(*s.state); })
      .def(py::pickle(
          [](const OptimizerStatePy& p) {
            const State& s = *p.state;
            return py::make_tuple(s.family, matrix_copy(s.mean), matrix_copy(s.log_var),
                                  matrix_copy(s.mean_first_moment),
                                  matrix_copy(s.mean_second_moment),
                                  matrix_copy(s.log_var_first_moment),
                                  matrix_copy(s.log_var_second_moment), s.iteration, s.seed);
          },
          [](const py::tuple& t) {
            if (t.size() != 9) throw ValueError(std::string(kState) + ": bad pickle state");
            return make_state(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8],
                              py::int_(State::kSchemaVersion), py::str(State::kAlgorithm));
          }));
}

// ---- variational embedding attention (docs/mechanisms.md#variational-embedding-attention) -------

VeaDist make_vea(py::handle mean, py::handle log_var, py::handle emission,
                 py::handle position_prior, py::handle sigma2, py::handle name,
                 py::handle optimizer_state, py::handle precision) {
  VariationalEmbeddingAttentionParams p;
  p.mean = reals_2d(mean, kVeaDist, "mean");
  p.log_var = reals_2d(log_var, kVeaDist, "log_var");
  p.emission = reals_2d(emission, kVeaDist, "emission");
  p.position_prior = reals_1d(position_prior, kVeaDist, "position_prior");
  p.sigma2 = real_number(sigma2, kVeaDist, "sigma2");
  p.name = name_arg(name, kVeaDist);
  p.optimizer_state = state_arg(optimizer_state, kVeaDist);
  const Precision arithmetic = precision_arg(precision, kVeaDist);
  return VeaDist(AnyDistribution(VariationalEmbeddingAttention(std::move(p), arithmetic)));  // validates
}

/// mean, log_var, emission, position_prior, sigma2, name, optimizer_state, precision (pickling).
py::tuple vea_params(const VariationalEmbeddingAttention& m) {
  const Vector& prior = m.position_prior();
  return py::make_tuple(
      matrix_copy(m.mean()), matrix_copy(m.log_var()), matrix_copy(m.emission()),
      copy_reals(prior.data(), {prior.size()}), py::float_(m.sigma2()),
      name_to_python(m.params().name),
      optimizer_state_to_python(std::make_shared<const State>(m.optimizer_state())),
      py::str(std::string(precision_name(m.precision()))));
}

std::string describe_vea(const VariationalEmbeddingAttention& m) {
  const py::str format(
      "VariationalEmbeddingAttentionDistribution(S=%d, N=%d, D=%d, T=%d, sigma2=%r, name=%r%s)");
  const std::string precision = m.precision() == Precision::kMixed ? ", precision='mixed'" : "";
  return py::str(format.attr("__mod__")(
      py::make_tuple(m.n_symbols(), m.context_length(), m.embed_dim(), m.n_targets(),
                     py::float_(m.sigma2()), name_to_python(m.params().name), precision)));
}

py::array vea_predict_proba(const VariationalEmbeddingAttention& m, py::handle context,
                            py::handle query) {
  const PredictIds ids = predict_ids(std::string(kVeaDist) + ".predict_proba",
                                     {{"context", context}}, "query_symbols", query);
  Matrix proba;
  {
    const py::gil_scoped_release release;
    proba = m.predict_proba(ids.contexts[0], ids.queries);  // validates the ids against S and N
  }
  return proba_result(proba, ids.single);
}

using VeaSampler = SamplerOf<VariationalEmbeddingAttentionSampler>;

void bind_vea_distribution(py::module_& m) {
  // Registered first, so that the distribution's sampler() signature names it.
  py::class_<VeaSampler> sampler_class(
      m, "VariationalEmbeddingAttentionSampler",
      "Draws (context, query, target) observations: a context of N symbols (without replacement "
      "when N <= S), q uniform, z ~ a (the gate with pi), t ~ B[c_z]."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.VariationalEmbeddingAttentionDistribution(
...     mean=[[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], log_var=np.full((3, 2), -2.0),
...     emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]], position_prior=[0.5, 0.5], sigma2=0.5)
>>> rows = attnmix.VariationalEmbeddingAttentionSampler(model, seed=0).sample(50)
>>> context, query, target = rows[0]
>>> context.shape, 0 <= query < 3, target in (0, 1)
((2,), True, True)
>>> [r[0].tolist() for r in model.sampler(seed=0).sample(3)] == [r[0].tolist() for r in rows[:3]]
True
)doc");
  py::class_<VeaDist, DistributionHandle> cls(
      m, kVeaDist,
      "Responsibility attention over tied latent embeddings with a mean-field Gaussian posterior "
      "q(e_s) = N(m_s, diag(exp(log_var_s))) (docs/mechanisms.md#variational-embedding-attention): "
      "a_i = softmax_i(log pi_i - ||E[q] - E[c_i]||^2 / (2 sigma2)), t ~ sum_i a_i B[c_i]; scoring "
      "and prediction use E = m."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.VariationalEmbeddingAttentionDistribution(
...     mean=[[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], log_var=np.full((3, 2), -2.0),
...     emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]], position_prior=[0.5, 0.5], sigma2=0.5)
>>> model.num_symbols, model.context_length, model.embed_dim, model.num_targets
(3, 2, 2, 2)
>>> p = model.predict_proba([0, 1], 0)
>>> round(float(p.sum()), 9), bool(p[0] > p[1])
(1.0, True)
>>> model.embeddings().tolist() == model.mean.tolist(), model.optimizer_state.iteration
(True, 0)
)doc");
  cls.def(py::init(&make_vea), "mean"_a, "log_var"_a, "emission"_a, "position_prior"_a,
          "sigma2"_a = VariationalEmbeddingAttentionParams{}.sigma2, "name"_a = py::none(),
          "optimizer_state"_a = py::none(), py::kw_only(), "precision"_a = "float64");
  def_shared_distribution_attributes(cls);
  cls.def_property_readonly(
      "position_prior",
      [](py::object self) {
        return readonly_view(self.cast<const VeaDist&>().model().position_prior(), self);
      },
      doc::kPositionPrior)
      .def_property_readonly("context_length",
                             [](const VeaDist& d) { return d.model().context_length(); }, doc::kContextLength)
      .def_property_readonly(
          "precision",
          [](const VeaDist& d) { return std::string(precision_name(d.model().precision())); },
          "The arithmetic of the gate in scoring and the E-step: 'float64' or 'mixed' (float "
          "distances and exponentials, double sums).")
      .def(
          "predict_proba",
          [](const VeaDist& d, py::object context, py::object query_symbols) {
            return vea_predict_proba(d.model(), context, query_symbols);
          },
          "context"_a, "query_symbols"_a,
          "p(target | context, query) = sum_i a_i B[c_i] at E = m: (T,) for one example (1-D "
          "context, one query id), (n, T) for a batch.")
      .def(
          "posterior_predictive_sampler",
          [](py::object self, py::object seed) {
            return VeaSampler{self.cast<const VeaDist&>().model().posterior_predictive_sampler(
                                  sampler_seed(seed, kVeaDist)),
                              self};
          },
          "seed"_a = py::none(), "Draws a fresh embedding table from q for every event.");
  def_text_and_pickle(cls, describe_vea, vea_params, make_vea, py::make_tuple("float64"));

  def_leaf_sampler(
      cls, sampler_class,
      [](const VariationalEmbeddingAttention& model, uint64_t seed) { return model.sampler(seed); }, vea_observation,
      "The plug-in sampler (embeddings m; independent of log_var).");
}


void bind_vea_encoder(py::module_& m) {
  py::class_<VeaEncoder, DataEncoder, std::shared_ptr<VeaEncoder>> cls(
      m, "VariationalEmbeddingAttentionDataEncoder",
      "Encodes (context, query, target) triples of ids, or a (contexts (n,N), queries (n,), "
      "targets "
      "(n,)) tuple of numpy arrays, into an EncodedBatch; declared dimensions are checked."
      R"doc(

Example:

>>> import attnmix
>>> encoder = attnmix.VariationalEmbeddingAttentionDataEncoder(num_symbols=3, context_length=2, num_targets=2)
>>> contexts, queries, targets = encoder.seq_encode([([0, 2], 1, 1), ([1, 1], 0, 0)])
>>> contexts.tolist(), queries.tolist(), targets.tolist()
([[0, 2], [1, 1]], [1, 0], [1, 0])
>>> try:
...     encoder.seq_encode([([0, 2, 1], 1, 1)])
... except ValueError as error:
...     print(error)
VariationalEmbeddingAttentionDataEncoder: context length N must be 2 (got 3)
)doc");
  using Spec = VariationalEmbeddingAttentionEncoder;
  def_declared_sizes(cls, "VariationalEmbeddingAttentionDataEncoder",
                     std::array<DeclaredSize<Spec>, 3>{{{"num_symbols", &Spec::n_symbols, doc::kEncoderNumSymbols},
                                                        {"context_length", &Spec::context_length,
                                                         doc::kEncoderContextLength},
                                                        {"num_targets", &Spec::n_targets, doc::kEncoderNumTargets}}});
}

// ---- variational multi-hop attention (docs/mechanisms.md#variational-multi-hop-attention) -------

VmhaDist make_vmha(py::handle mean, py::handle log_var, py::handle emission, py::handle sigma2,
                   py::handle name, py::handle optimizer_state) {
  VariationalMultiHopAttentionParams p;
  p.mean = reals_2d(mean, kVmhaDist, "mean");
  p.log_var = reals_2d(log_var, kVmhaDist, "log_var");
  p.emission = reals_2d(emission, kVmhaDist, "emission");
  p.sigma2 = real_number(sigma2, kVmhaDist, "sigma2");
  p.name = name_arg(name, kVmhaDist);
  p.optimizer_state = state_arg(optimizer_state, kVmhaDist);
  return VmhaDist(AnyDistribution(VariationalMultiHopAttention(std::move(p))));  // validates
}

/// mean, log_var, emission, sigma2, name, optimizer_state (pickling).
py::tuple vmha_params(const VariationalMultiHopAttention& m) {
  return py::make_tuple(
      matrix_copy(m.mean()), matrix_copy(m.log_var()), matrix_copy(m.emission()),
      py::float_(m.sigma2()), name_to_python(m.params().name),
      optimizer_state_to_python(std::make_shared<const State>(m.optimizer_state())));
}

std::string describe_vmha(const VariationalMultiHopAttention& m) {
  const py::str format(
      "VariationalMultiHopAttentionDistribution(S=%d, D=%d, T=%d, sigma2=%r, name=%r)");
  return py::str(format.attr("__mod__")(py::make_tuple(m.n_symbols(), m.embed_dim(), m.n_targets(),
                                                       py::float_(m.sigma2()),
                                                       name_to_python(m.params().name))));
}

py::array vmha_predict_proba(const VariationalMultiHopAttention& m, py::handle keys,
                             py::handle values, py::handle query) {
  const PredictIds ids =
      predict_ids(std::string(kVmhaDist) + ".predict_proba",
                  {{"context_keys", keys}, {"context_values", values}}, "query_symbols", query);
  Matrix proba;
  {
    const py::gil_scoped_release release;
    proba = m.predict_proba(ids.contexts[0], ids.contexts[1],
                            ids.queries);  // validates the ids against S
  }
  return proba_result(proba, ids.single);
}

using VmhaSampler = SamplerOf<VariationalMultiHopAttentionSampler>;

void bind_vmha_distribution(py::module_& m) {
  // Registered first, so that the distribution's sampler() signature names it.
  py::class_<VmhaSampler> sampler_class(
      m, "VariationalMultiHopAttentionSampler",
      "Draws (keys, values, query, target) observations: keys and values iid uniform over [S] "
      "(context_length each), q uniform, z1 ~ a1, z2 ~ a2[z1], t ~ B[v_z2]."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.VariationalMultiHopAttentionDistribution(
...     mean=[[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], log_var=np.full((3, 2), -2.0),
...     emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]], sigma2=0.3)
>>> rows = attnmix.VariationalMultiHopAttentionSampler(model, seed=0, context_length=4).sample(20)
>>> keys, values, query, target = rows[0]
>>> keys.shape, values.shape, 0 <= query < 3, target in (0, 1)
((4,), (4,), True, True)
>>> bool(np.isfinite(model.seq_log_density(rows)).all())
True
)doc");
  py::class_<VmhaDist, DistributionHandle> cls(
      m, kVmhaDist,
      "A 2-hop attention chain over tied latent embeddings (docs/mechanisms.md#variational-multi-hop-attention): "
      "z1 ~ softmax(-||E[q] - E[k_i]||^2 / (2 sigma2)), z2 | z1 = i ~ softmax(-||E[v_i] - E[k_j]||^2 "
      "/ (2 sigma2)), t ~ B[v_z2]; scoring and prediction use E = m."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.VariationalMultiHopAttentionDistribution(
...     mean=[[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], log_var=np.full((3, 2), -2.0),
...     emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]], sigma2=0.3)
>>> model.num_symbols, model.embed_dim, model.num_targets
(3, 2, 2)
>>> p = model.predict_proba([0, 1, 2], [1, 2, 0], 0)
>>> round(float(p.sum()), 9), p.shape
(1.0, (2,))
>>> bool(np.isfinite(model.log_density(([0, 1, 2], [1, 2, 0], 0, 1))))
True
)doc");
  cls.def(py::init(&make_vmha), "mean"_a, "log_var"_a, "emission"_a,
          "sigma2"_a = VariationalMultiHopAttentionParams{}.sigma2, "name"_a = py::none(),
          "optimizer_state"_a = py::none());
  def_shared_distribution_attributes(cls);
  cls.def(
         "predict_proba",
         [](const VmhaDist& d, py::object keys, py::object values, py::object query_symbols) {
           return vmha_predict_proba(d.model(), keys, values, query_symbols);
         },
         "context_keys"_a, "context_values"_a, "query_symbols"_a,
         "p(target | keys, values, query) = sum_ij a1_i a2_ij B[v_j] at E = m: (T,) for one "
         "example (1-D keys), (n, T) for a batch.")
      .def(
          "posterior_predictive_sampler",
          [](py::object self, py::object seed, py::object context_length) {
            const int64_t n = positive_int(context_length, kVmhaDist, "context_length");
            const VariationalMultiHopAttention& model = self.cast<const VmhaDist&>().model();
            return VmhaSampler{model.posterior_predictive_sampler(sampler_seed(seed, kVmhaDist), n), std::move(self)};
          },
          "seed"_a = py::none(), py::kw_only(), "context_length"_a = kDefaultContextLength,
          "Draws a fresh embedding table from q for every event.");
  def_text_and_pickle(cls, describe_vmha, vmha_params, make_vmha);

  def_leaf_sampler(
      cls, sampler_class,
      [](const VariationalMultiHopAttention& model, uint64_t seed, int64_t n) { return model.sampler(seed, n); },
      ca_observation, "The plug-in sampler (embeddings m).");
}


void bind_vmha_encoder(py::module_& m) {
  py::class_<VmhaEncoder, DataEncoder, std::shared_ptr<VmhaEncoder>> cls(
      m, "VariationalMultiHopAttentionDataEncoder",
      "Encodes (keys, values, query, target) observations (as chained attention), or a (keys "
      "(n,N), "
      "values (n,N), queries (n,), targets (n,)) tuple of numpy arrays, into an EncodedBatch; "
      "declared bounds are checked."
      R"doc(

Example:

>>> import attnmix
>>> encoder = attnmix.VariationalMultiHopAttentionDataEncoder(num_symbols=3, num_targets=2)
>>> keys, values, queries, targets = encoder.seq_encode([([0, 1, 2], [1, 2, 0], 2, 1)])
>>> keys.tolist(), values.tolist(), queries.tolist(), targets.tolist()
([[0, 1, 2]], [[1, 2, 0]], [2], [1])
>>> try:
...     encoder.seq_encode([([0, 1, 3], [1, 2, 0], 2, 1)])
... except ValueError as error:
...     print(error)
VariationalMultiHopAttentionDataEncoder: out-of-range ID in keys (entry 2 is 3; must be in [0, 3))
)doc");
  def_declared_sizes(cls, "VariationalMultiHopAttentionDataEncoder", kChainedSizes);
}

}  // namespace

// ---- the statistics attachment (bindings.hpp) ---------------------------------------------------

py::object optimizer_state_to_python(const std::shared_ptr<const AttentionOptimizerState>& state) {
  if (!state) return py::none();
  return py::cast(OptimizerStatePy{state});
}

py::object optimizer_state_to_dict(const std::shared_ptr<const AttentionOptimizerState>& state) {
  if (!state) return py::none();
  return state_to_dict(*state);
}

std::shared_ptr<const AttentionOptimizerState> optimizer_state_from_python(py::handle obj,
                                                                           std::string_view where,
                                                                           std::string_view name) {
  if (obj.is_none()) return nullptr;
  if (PyDict_Check(obj.ptr())) return state_from_dict(py::reinterpret_borrow<py::object>(obj)).state;  // the to_dict() form that value() gives
  if (!py::isinstance<OptimizerStatePy>(obj))
    throw TypeError(std::string(where) + ": " + std::string(name) +
                    " must be an AttentionOptimizerState, its to_dict() dict, or None (got " + type_name(obj) + ")");
  return obj.cast<const OptimizerStatePy&>().state;
}

namespace {

/// The entry of a variational family: its statistics carry the optimizer state
/// (docs/mechanisms.md#variational-embedding-attention).
template <class D, class E, class A, class Encoder>
void register_variational_family() {
  PythonFamily state;
  state.state_of = [](const AnyAccumulator& acc) { return acc.get_if<A>()->optimizer_state(); };
  state.set_state = [](AnyAccumulator& acc, std::shared_ptr<const AttentionOptimizerState> s) {
    acc.get_if<A>()->set_optimizer_state(std::move(s));
  };
  register_leaf_family<D, E, A, Encoder>(state);
}

}  // namespace

void bind_variational(py::module_& m) {
  register_variational_family<VariationalEmbeddingAttention, VariationalEmbeddingAttentionEstimator,
                              VariationalEmbeddingAttentionAccumulator, VeaEncoder>();
  register_variational_family<VariationalMultiHopAttention, VariationalMultiHopAttentionEstimator,
                              VariationalMultiHopAttentionAccumulator, VmhaEncoder>();
  bind_optimizer_state(m);
  bind_vea_distribution(m);
  bind_estimator_class<VariationalEmbeddingAttentionEstimator>(
      m, variational_embedding_attention_family(), "VariationalEmbeddingAttentionEstimator",
      "The stateless variational M-step (docs/mechanisms.md#variational-embedding-attention): one Adam "
      "ascent step on the embedding posterior carried by the statistics' optimizer state (or the initial "
      "embeddings when there is none), then B and pi in closed form."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.VariationalEmbeddingAttentionDistribution(
...     mean=[[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], log_var=np.full((3, 2), -2.0),
...     emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]], position_prior=[0.5, 0.5], sigma2=0.5)
>>> rows = model.sampler(seed=1).sample(3000)
>>> estimator = attnmix.VariationalEmbeddingAttentionEstimator(3, 2, 2, 2, sigma2=0.5, seed=4)
>>> acc = estimator.accumulator_factory().make()
>>> acc.seq_update(rows, np.ones(len(rows)), model)
>>> refit = estimator.estimate(None, acc.value())
>>> bool(np.allclose(refit.emission, model.emission, atol=0.05)), refit.optimizer_state.iteration
(True, 1)
)doc");
  bind_accumulator_classes<VariationalEmbeddingAttentionAccumulator>(
      m, variational_embedding_attention_family(), "VariationalEmbeddingAttentionAccumulator",
      "VariationalEmbeddingAttentionAccumulatorFactory",
      "Statistics, value() = (grad_m (S,D), grad_logv (S,D), emission_count (S,T), position_count (N,), ll, n, "
      "optimizer_state or None); the E-step averages mc Monte-Carlo samples."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.VariationalEmbeddingAttentionDistribution(
...     mean=[[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], log_var=np.full((3, 2), -2.0),
...     emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]], position_prior=[0.5, 0.5], sigma2=0.5)
>>> acc = attnmix.VariationalEmbeddingAttentionAccumulator(3, 2, 2, 2, 4)
>>> rows = model.sampler(seed=2).sample(10)
>>> acc.seq_update(rows, np.ones(10), model)
>>> acc.mc, acc.n, acc.grad_m.shape, round(float(acc.position_count.sum()), 9)
(4, 10.0, (3, 2), 10.0)
)doc",
      R"doc(

Example:

>>> import attnmix
>>> factory = attnmix.VariationalEmbeddingAttentionAccumulatorFactory(3, 2, 2, 2, mc=2)
>>> acc = factory.make()
>>> factory.mc, acc.emission_count.shape, acc.n, acc.value()[-1] is None
(2, (3, 2), 0.0, True)
)doc");
  bind_vea_encoder(m);
  bind_vmha_distribution(m);
  bind_estimator_class<VariationalMultiHopAttentionEstimator>(
      m, variational_multihop_attention_family(), "VariationalMultiHopAttentionEstimator",
      "The stateless variational M-step of multi-hop attention "
      "(docs/mechanisms.md#variational-multi-hop-attention): one Adam ascent step with the annealed KL "
      "weight prior_strength * min(1, tau / anneal_iters), then B in closed form."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.VariationalMultiHopAttentionDistribution(
...     mean=[[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], log_var=np.full((3, 2), -2.0),
...     emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]], sigma2=0.3)
>>> rows = model.sampler(seed=1, context_length=4).sample(3000)
>>> estimator = attnmix.VariationalMultiHopAttentionEstimator(3, 2, 2, sigma2=0.3, seed=4)
>>> acc = estimator.accumulator_factory().make()
>>> acc.seq_update(rows, np.ones(len(rows)), model)
>>> refit = estimator.estimate(None, acc.value())
>>> bool(np.allclose(refit.emission, model.emission, atol=0.05)), refit.optimizer_state.iteration
(True, 1)
)doc");
  bind_accumulator_classes<VariationalMultiHopAttentionAccumulator>(
      m, variational_multihop_attention_family(), "VariationalMultiHopAttentionAccumulator",
      "VariationalMultiHopAttentionAccumulatorFactory",
      "Statistics, value() = (grad_m (S,D), grad_logv (S,D), emission_count (S,T), ll, n, optimizer_state or None); "
      "the E-step averages mc Monte-Carlo samples."
      R"doc(

Example:

>>> import attnmix
>>> import numpy as np
>>> model = attnmix.VariationalMultiHopAttentionDistribution(
...     mean=[[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]], log_var=np.full((3, 2), -2.0),
...     emission=[[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]], sigma2=0.3)
>>> acc = attnmix.VariationalMultiHopAttentionAccumulator(3, 2, 2, 2)
>>> rows = model.sampler(seed=2, context_length=4).sample(10)
>>> acc.seq_update(rows, np.ones(10), model)
>>> acc.mc, acc.n, acc.grad_logv.shape, round(float(acc.emission_count.sum()), 9)
(2, 10.0, (3, 2), 10.0)
)doc",
      R"doc(

Example:

>>> import attnmix
>>> factory = attnmix.VariationalMultiHopAttentionAccumulatorFactory(3, 2, 2, mc=3)
>>> acc = factory.make()
>>> factory.mc, factory.embed_dim, acc.grad_m.shape, acc.ll
(3, 2, (3, 2), 0.0)
)doc");
  bind_vmha_encoder(m);
}

}  // namespace attnmix::python
