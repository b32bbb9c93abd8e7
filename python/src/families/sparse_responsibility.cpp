// SPDX-License-Identifier: Apache-2.0
// Responsibility attention with sparse tables in Python (docs/mechanisms.md#sparse-tables-real-vocabularies):
// SparseResponsibilityAttention{Distribution, Estimator, Accumulator, AccumulatorFactory}. Its rows are those of
// responsibility attention with symbol queries (ResponsibilityAttentionDataEncoder); its estimator and statistics
// take their cells from the training rows (`rows=`). A table crosses the boundary as a dict of compressed rows:
//   {"shape": (R, C), "row_begin": int64 (R + 1,), "columns": int64 (k,), "values": float64 (k,),
//    "default": float64 (R,)}
// row r lists the cells columns[row_begin[r]:row_begin[r+1]] (increasing) with their values; every other cell of
// row r holds default[r] (0 for key_means, β_r for emission).
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "attnmix/attention/sparse_responsibility.hpp"
#include "bindings.hpp"
#include "convert.hpp"
#include "distribution_class.hpp"
#include "docstrings.hpp"
#include "encoders.hpp"
#include "estimator_class.hpp"
#include "roles.hpp"

namespace attnmix::python {

namespace {

using namespace pybind11::literals;
using Model = SparseResponsibilityAttention;
using Dist = DistributionOf<Model>;

constexpr const char* kDist = "SparseResponsibilityAttentionDistribution";

/// A table's compressed rows as Python sees them (the layout above): new arrays.
py::dict table_to_python(const SparsePattern& pattern, const Vector& values, const Vector& defaults) {
  const auto& row_begin = pattern.row_begin();
  const auto& columns = pattern.columns();
  return py::dict("shape"_a = py::make_tuple(pattern.rows(), pattern.cols()),
                  "row_begin"_a = copy_ids(row_begin.data(), {static_cast<Index>(row_begin.size())}),
                  "columns"_a = copy_ids(columns.data(), {static_cast<Index>(columns.size())}),
                  "values"_a = copy_reals(values.data(), {values.size()}),
                  "default"_a = copy_reals(defaults.data(), {defaults.size()}));
}

/// A table's pattern, values and defaults, as a constructor argument gives them.
struct TableArg {
  std::shared_ptr<const SparsePattern> pattern;
  Vector values;
  Vector defaults;
};

/// A table given as compressed rows: its pattern (checked by SparsePattern), values and defaults. `defaults_zero`:
/// the default may be left out and must be 0 in every row (key_means). @throws TypeError / ValueError naming the
/// argument and its entry.
TableArg table_from_python(py::handle obj, const char* name, bool defaults_zero) {
  const std::string arg(name);
  if (!PyDict_Check(obj.ptr()))
    throw TypeError(std::string(kDist) + ": " + arg +
                    " must be a dict of compressed rows {'shape', 'row_begin', 'columns', 'values', 'default'}, got " +
                    type_name(obj));
  const py::dict table = py::reinterpret_borrow<py::dict>(obj);
  for (const auto& [key, value] : table) {
    const std::string k = py::str(key);
    if (k != "shape" && k != "row_begin" && k != "columns" && k != "values" && k != "default")
      throw ValueError(std::string(kDist) + ": " + arg + " has an unknown entry '" + k +
                       "' (the entries are shape, row_begin, columns, values and default)");
  }
  const auto entry = [&](const char* key) -> py::object {
    if (!table.contains(key)) throw ValueError(std::string(kDist) + ": " + arg + " has no '" + key + "' entry");
    return table[key];
  };
  const std::string field = arg + "['";
  const IdVector shape = ids_1d(entry("shape"), kDist, field + "shape']");
  if (shape.size() != 2)
    throw ValueError(std::string(kDist) + ": " + arg + "['shape'] must be (rows, columns), got " +
                     std::to_string(shape.size()) + " entries");
  const IdVector row_begin = ids_1d(entry("row_begin"), kDist, field + "row_begin']");
  const IdVector columns = ids_1d(entry("columns"), kDist, field + "columns']");
  TableArg out;
  out.values = reals_1d(entry("values"), kDist, field + "values']");
  if (out.values.size() != columns.size())
    throw ValueError(std::string(kDist) + ": " + arg + "['values'] has " + std::to_string(out.values.size()) +
                     " entries but " + arg + "['columns'] has " + std::to_string(columns.size()));
  out.pattern = std::make_shared<const SparsePattern>(
      shape[0], shape[1], std::vector<int64_t>(row_begin.begin(), row_begin.end()),
      std::vector<int64_t>(columns.begin(), columns.end()));  // validates
  if (defaults_zero && !table.contains("default")) {
    out.defaults = Vector::Zero(shape[0]);
    return out;
  }
  out.defaults = reals_1d(entry("default"), kDist, field + "default']");
  if (out.defaults.size() != shape[0])
    throw ValueError(std::string(kDist) + ": " + arg + "['default'] must have one entry per row (" +
                     std::to_string(shape[0]) + "), got " + std::to_string(out.defaults.size()));
  if (defaults_zero)
    for (Index r = 0; r < out.defaults.size(); ++r)
      if (out.defaults[r] != 0.0)
        throw ValueError(std::string(kDist) + ": " + arg + "['default'] must be 0 in every row (K is 0 off its " +
                         "listed cells; row " + std::to_string(r) + " has " + std::to_string(out.defaults[r]) + ")");
  return out;
}

Dist make_distribution(py::object key_means, py::object emission, py::object position_prior, py::object sigma2,
                       py::object name) {
  TableArg keys = table_from_python(key_means, "key_means", true);
  TableArg cells = table_from_python(emission, "emission", false);
  SparseResponsibilityAttentionParams p;
  p.patterns = {keys.pattern, cells.pattern};
  p.key_values = std::move(keys.values);
  p.emission_values = std::move(cells.values);
  p.emission_default = std::move(cells.defaults);
  p.position_prior = reals_1d(position_prior, kDist, "position_prior");
  p.sigma2 = real_number(sigma2, kDist, "sigma2");
  p.name = name_arg(name, kDist);
  return Dist(AnyDistribution(Model(std::move(p))));  // validates
}

py::dict key_means_of(const Model& m) {
  const auto& p = m.params();
  return table_to_python(*p.patterns.keys, p.key_values, Vector::Zero(m.n_symbols()));
}

py::dict emission_of(const Model& m) {
  const auto& p = m.params();
  return table_to_python(*p.patterns.emission, p.emission_values, p.emission_default);
}

/// key_means, emission, position_prior, sigma2, name: the constructor's arguments (pickling).
py::tuple params_of(const Model& m) {
  const auto& p = m.params();
  return py::make_tuple(key_means_of(m), emission_of(m), copy_reals(p.position_prior.data(), {p.position_prior.size()}),
                        py::float_(p.sigma2), name_to_python(p.name));
}

std::string describe(const Model& m) {
  const py::str format("SparseResponsibilityAttentionDistribution(S=%d, N=%d, D=%d, T=%d, key cells=%d, "
                       "emission cells=%d, sigma2=%r, name=%r)");
  const auto& p = m.params();
  return py::str(format.attr("__mod__")(py::make_tuple(m.n_symbols(), m.context_length(), m.query_dim(),
                                                       m.n_targets(), p.patterns.keys->size(),
                                                       p.patterns.emission->size(), py::float_(m.sigma2()),
                                                       name_to_python(p.name))));
}

/// predict_proba(context, query): (T,) for a 1-D context and an int query, (n, T) for a batch.
py::array predict_proba(const Model& m, py::handle context, py::handle query) {
  constexpr const char* where = "SparseResponsibilityAttentionDistribution.predict_proba";
  NdArray<int64_t> c = read_ids(context, where, "context");
  NdArray<int64_t> q = read_ids(query, where, "query");
  const bool single = c.ndim() == 1;
  if (c.ndim() != 1 && c.ndim() != 2)
    throw TypeError(std::string(where) + ": context must be 1-D (one example) or 2-D (a batch), got shape " +
                    shape_text(c.shape));
  if (q.ndim() != (single ? 0 : 1))
    throw TypeError(std::string(where) + ": query must be " +
                    (single ? "one symbol id (an int) for a 1-D context" : "a 1-D array of symbol ids for a batch") +
                    ", got shape " + shape_text(q.shape));
  if (single) c.shape.insert(c.shape.begin(), 1);
  IdMatrix contexts(c.shape[0], c.shape[1]);
  std::copy(c.values.begin(), c.values.end(), contexts.data());
  IdVector symbols = Eigen::Map<const IdVector>(q.values.data(), static_cast<Index>(q.values.size()));
  const ResponsibilityAttentionBatch batch =
      m.encoder().encode_symbols(std::move(contexts), std::move(symbols), IdVector::Zero(c.shape[0]));
  Matrix proba;
  {
    const py::gil_scoped_release release;
    proba = m.predict_proba(batch);
  }
  if (single) return copy_reals(proba.data(), {proba.cols()});
  return copy_reals(proba.data(), {proba.rows(), proba.cols()});
}

/// The training rows of the estimator and statistics classes: encoded for their sizes, symbol queries.
AnyBatch training_rows(py::handle data, const Dims& sizes) {
  const ResponsibilityAttentionDataEncoderPy encoder(
      {sizes.at("S").value, sizes.at("N").value, sizes.at("D").value, sizes.at("T").value});
  return batch_of(data, encoder);
}

constexpr const char* kExampleModel = R"doc(
>>> import attnmix
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> contexts = rng.integers(0, 50, size=(2000, 3))
>>> queries = rng.integers(0, 50, size=2000)  # symbol ids: the one-hot query e_q, never built
>>> targets = (contexts[:, 0] + queries) % 50
>>> rows = (contexts, queries, targets)
>>> estimator = attnmix.SparseResponsibilityAttentionEstimator(50, 3, 50, 50, rows=rows)
>>> model = attnmix.optimize(rows, estimator, max_its=5, rng=1, out=None)
>>> model.num_symbols, model.key_means["shape"], len(model.emission["columns"]) < 50 * 50
(50, (50, 50), True)
)doc";

void bind_distribution(py::module_& m) {
  py::class_<Dist, DistributionHandle> cls(
      m, kDist,
      (std::string("Responsibility attention whose key table K (S, D) and emission table B (S, T) hold only the cells "
                   "that training rows touched: the (context symbol, query symbol) and (context symbol, target) "
                   "pairs. Every other key entry is 0 and every other emission entry of row s is the smoothed "
                   "default beta_s, exactly as the dense model would estimate them, so memory grows with the pairs "
                   "the data hold, not with S*D and S*T. Queries are symbol ids (docs/mechanisms.md"
                   "#sparse-tables-real-vocabularies). The tables are dicts of compressed rows: {'shape': (R, C), "
                   "'row_begin': (R+1,), 'columns': (k,), 'values': (k,), 'default': (R,)}; row r lists "
                   "columns[row_begin[r]:row_begin[r+1]] with their values and holds default[r] elsewhere.\n\n"
                   "Example:\n") +
       kExampleModel + R"doc(>>> dense = model.dense()  # the same model with full tables
>>> bool(np.allclose(dense.seq_log_density(rows), model.seq_log_density(rows)))
True
>>> model.predict_proba([1, 2, 3], 4).shape
(50,)
)doc")
          .c_str());
  cls.def(py::init(&make_distribution), "key_means"_a, "emission"_a, "position_prior"_a,
          "sigma2"_a = SparseResponsibilityAttentionParams{}.sigma2, "name"_a = py::none())
      .def_property_readonly(
          "key_means", [](const Dist& d) { return key_means_of(d.model()); },
          "The key table K (S, D) as compressed rows (a dict of new arrays; default 0 in every row): the key means at "
          "the (context symbol, query symbol) pairs of the training rows.")
      .def_property_readonly(
          "emission", [](const Dist& d) { return emission_of(d.model()); },
          "The emission table B (S, T) as compressed rows (a dict of new arrays): B at the (context symbol, target) "
          "pairs of the training rows, and each row's default beta_s at every other target.")
      .def_property_readonly("sigma2", [](const Dist& d) { return d.model().sigma2(); },
                             "Gate variance sigma2 > 0, a float.")
      .def_property_readonly("gate_const", [](const Dist& d) { return d.model().gate_const(); },
                             "The gate's log normaliser -(D/2) log(2 pi sigma2), a float.")
      .def_property_readonly("name", [](const Dist& d) { return name_to_python(d.model().params().name); },
                             doc::kName)
      .def_property_readonly("num_symbols", [](const Dist& d) { return d.model().n_symbols(); }, doc::kNumSymbols)
      .def_property_readonly("context_length", [](const Dist& d) { return d.model().context_length(); },
                             doc::kContextLength)
      .def_property_readonly("query_dim", [](const Dist& d) { return d.model().query_dim(); },
                             "Query dimension D, an int: query symbols are the ids 0 .. D-1.")
      .def_property_readonly("num_targets", [](const Dist& d) { return d.model().n_targets(); }, doc::kNumTargets)
      .def(
          "dense",
          [](const Dist& d) {
            return DistributionOf<ResponsibilityAttention>(AnyDistribution(d.model().dense()));
          },
          "The ResponsibilityAttentionDistribution with the same tables written out in full (S*D + S*T numbers): the "
          "same log densities, responsibilities and predictions, with one-hot or symbol queries.")
      .def(
          "predict_proba", [](const Dist& d, py::object c, py::object q) { return predict_proba(d.model(), c, q); },
          "context"_a, "query"_a,
          "p(target | context, query) = sum_i a_i B[c_i] with the target-blind attention a: (T,) for one example (a "
          "1-D context and an int query symbol), (n, T) for a batch (contexts (n, N), query symbols (n,)).");
  def_rows_matrix(
      cls, "responsibilities",
      [](const Model& model, const AnyBatch& rows) {
        return model.responsibilities(rows.get<ResponsibilityAttentionBatch>(kDist));
      },
      doc::kResponsibilities);
  def_model_view(
      cls, "position_prior", [](const Model& d) -> const Vector& { return d.params().position_prior; },
      doc::kPositionPrior);
  def_text_and_pickle(cls, describe, params_of, make_distribution);
}

}  // namespace

void bind_sparse_attention(py::module_& m) {
  register_leaf_family<Model, SparseResponsibilityAttentionEstimator, SparseResponsibilityAttentionAccumulator,
                       ResponsibilityAttentionDataEncoderPy>();
  bind_distribution(m);
  bind_estimator_class<SparseResponsibilityAttentionEstimator>(
      m, sparse_responsibility_attention_family(), "SparseResponsibilityAttentionEstimator",
      (std::string("The closed-form M-step of responsibility attention over the cells of the training rows `rows` "
                   "(docs/mechanisms.md#sparse-tables-real-vocabularies): the dense M-step's values at those cells, "
                   "and the exact value of every other cell implied. The rows fix the cells: fit the same rows (or "
                   "rows whose pairs they contain).\n\nExample:\n") +
       kExampleModel)
          .c_str(),
      &training_rows);
  bind_accumulator_classes<SparseResponsibilityAttentionAccumulator>(
      m, sparse_responsibility_attention_family(), "SparseResponsibilityAttentionAccumulator",
      "SparseResponsibilityAttentionAccumulatorFactory",
      "Statistics over the cells of the training rows, value() = (key_sum (one per key cell), key_mass (S,), "
      "emission_count (one per emission cell), position_count (N,), query_sq): the dense statistics at those cells, in "
      "the order of the tables' compressed rows."
      R"doc(

Example:

>>> import attnmix
>>> rows = [([0, 1], 2, 1), ([1, 1], 0, 0)]
>>> acc = attnmix.SparseResponsibilityAttentionAccumulator(3, 2, 3, 2, rows=rows)
>>> acc.key_sum.shape, acc.emission_count.shape  # (0, 2), (1, 2), (1, 0): three key cells; three emission cells
((3,), (3,))
)doc",
      R"doc(

Example:

>>> import attnmix
>>> factory = attnmix.SparseResponsibilityAttentionAccumulatorFactory(3, 2, 3, 2, rows=[([0, 1], 2, 1)])
>>> factory.make().key_mass.shape
(3,)
)doc",
      &training_rows);
}

}  // namespace attnmix::python
