// SPDX-License-Identifier: Apache-2.0
// The Python data encoders (encoders.hpp): observation lists and tuples of arrays → validated
// batches, and batches → the reference's tuples of read-only arrays. Only conversion; the library's
// encoders validate.
#include "encoders.hpp"

#include <typeinfo>

#include "attnmix/core/errors.hpp"
#include "attnmix/stats/composite.hpp"
#include "convert.hpp"

namespace attnmix::python {

namespace {

constexpr const char* kTripleMessage =
    "attention observations must be context/query/target triples";
constexpr const char* kChainedMessage =
    "chained attention observations must be keys/values/query/target tuples";
constexpr const char* kVariationalEmbeddingMessage =
    "variational embedding attention observations must be context/query/target triples";

/// The fast path: `data` is a tuple of `arity` elements whose first is a numpy array of
/// `first_ndim` dimensions.
bool is_array_tuple(py::handle data, size_t arity, Index first_ndim) {
  if (!PyTuple_Check(data.ptr()) || static_cast<size_t>(PyTuple_GET_SIZE(data.ptr())) != arity)
    return false;
  const py::handle first(PyTuple_GET_ITEM(data.ptr(), 0));
  return is_ndarray(first) && py::reinterpret_borrow<py::array>(first).ndim() == first_ndim;
}

/// The elements of a list (or other sequence) of observations. @throws TypeError for a
/// non-sequence.
std::vector<py::object> observations_of(py::handle data, const std::string& where) {
  if (!is_sequence(data) || is_ndarray(data))
    throw TypeError(where + ": seq_encode takes a list of observations (got " + type_name(data) +
                    ")");
  const py::sequence seq = py::reinterpret_borrow<py::sequence>(data);
  std::vector<py::object> out;
  out.reserve(seq.size());
  for (const py::handle item : seq) out.push_back(py::reinterpret_borrow<py::object>(item));
  return out;
}

/// A list / tuple observation of exactly `arity` fields; anything else raises TypeError(message).
std::vector<py::object> fields_of(py::handle obs, size_t arity, const std::string& message) {
  if (!(PyTuple_Check(obs.ptr()) || PyList_Check(obs.ptr())) ||
      static_cast<size_t>(py::len(obs)) != arity)
    throw TypeError(message);
  std::vector<py::object> out;
  for (const py::handle item : py::reinterpret_borrow<py::sequence>(obs))
    out.push_back(py::reinterpret_borrow<py::object>(item));
  return out;
}

/// Whether a query is given as a symbol: a Python or numpy integer (not a bool), or a 1-D numpy integer array for a
/// whole batch (`ndim` 1).
bool is_symbol_query(py::handle query, Index ndim) {
  if (ndim == 0) {
    if (PyBool_Check(query.ptr())) return false;
    if (PyLong_Check(query.ptr())) return true;
    // A row's query vector (a list, an array) is the common case: only a lone scalar asks numpy for its type.
    if (PySequence_Check(query.ptr()) || is_ndarray(query)) return false;
    return py::isinstance(query, py::module_::import("numpy").attr("integer"));
  }
  if (!is_ndarray(query)) return false;
  const py::array a = py::reinterpret_borrow<py::array>(query);
  return a.ndim() == ndim && a.dtype().kind() != 'b' && (a.dtype().kind() == 'i' || a.dtype().kind() == 'u');
}

template <class B>
const B& batch_as_family(const AnyBatch& batch, const std::string& where) {
  return batch.get<B>(where);
}

}  // namespace

// ---- responsibility attention -------------------------------------------------------------------

AnyBatch ResponsibilityAttentionDataEncoderPy::encode(py::handle data) const {
  const std::string where = class_name();
  if (is_array_tuple(data, 3, 2)) {
    const py::tuple arrays = py::reinterpret_borrow<py::tuple>(data);
    IdMatrix contexts = ids_2d(arrays[0], where, "context");
    IdVector targets = ids_1d(arrays[2], where, "target");
    if (is_symbol_query(arrays[1], 1))
      return AnyBatch(spec_.encode_symbols(std::move(contexts), ids_1d(arrays[1], where, "query"), std::move(targets)));
    Matrix queries = reals_2d(arrays[1], where, "query");
    return AnyBatch(spec_.encode(std::move(contexts), std::move(queries), std::move(targets)));
  }
  const std::vector<py::object> rows = observations_of(data, where);
  const Index n = static_cast<Index>(rows.size());
  Index N = spec_.context_length.value_or(0);
  Index D = spec_.query_dim.value_or(0);
  std::vector<int64_t> contexts;
  std::vector<double> queries;
  IdVector symbols(n);
  bool symbol_queries = false;
  IdVector targets(n);
  for (Index row = 0; row < n; ++row) {
    const std::vector<py::object> obs =
        fields_of(rows[static_cast<size_t>(row)], 3, kTripleMessage);
    NdArray<int64_t> ctx = read_ids(obs[0], where, "context");
    if (ctx.ndim() != 1)
      throw TypeError(where + ": context of row " + std::to_string(row) +
                      " must be a 1-D sequence of ids (got shape " + shape_text(ctx.shape) + ")");
    const bool symbol = is_symbol_query(obs[1], 0);  // one way for every row: row 0's
    if (row == 0) symbol_queries = symbol;
    if (symbol != symbol_queries)
      throw ValueError(where + ": query of row " + std::to_string(row) + " is " +
                       (symbol ? "a symbol id but row 0's is an array" : "an array but row 0's is a symbol id") +
                       " (every row gives its query the same way)");
    if (symbol) {
      if (row == 0) {
        N = ctx.shape[0];
        contexts.reserve(static_cast<size_t>(n * N));
      }
      if (ctx.shape[0] != N)
        throw ValueError(where + ": contexts must all have the same length (row 0 has " + std::to_string(N) +
                         ", row " + std::to_string(row) + " has " + std::to_string(ctx.shape[0]) + ")");
      contexts.insert(contexts.end(), ctx.values.begin(), ctx.values.end());
      symbols[row] = id_scalar(obs[1], where, "query");
      targets[row] = id_scalar(obs[2], where, "target");
      continue;
    }
    NdArray<double> y = read_reals(obs[1], where, "query");
    if (y.ndim() != 1)
      throw ValueError(where + ": query of row " + std::to_string(row) +
                       " must be a 1-D sequence of reals (got shape " + shape_text(y.shape) + ")");
    if (row == 0) {
      N = ctx.shape[0];
      D = y.shape[0];
      contexts.reserve(static_cast<size_t>(n * N));
      queries.reserve(static_cast<size_t>(n * D));
    }
    // Rows of different widths are a shape mismatch (ValueError, like the queries'); a ragged
    // nesting inside one context is read_ids' TypeError (docs/mechanisms.md#building-blocks). A declared N is checked
    // by the library's encoder.
    if (ctx.shape[0] != N)
      throw ValueError(where + ": contexts must all have the same length (row 0 has " +
                       std::to_string(N) + ", row " + std::to_string(row) + " has " +
                       std::to_string(ctx.shape[0]) + ")");
    if (y.shape[0] != D)
      throw ValueError(where + ": queries must all have the same length (row 0 has " +
                       std::to_string(D) + ", row " + std::to_string(row) + " has " +
                       std::to_string(y.shape[0]) + ")");
    contexts.insert(contexts.end(), ctx.values.begin(), ctx.values.end());
    queries.insert(queries.end(), y.values.begin(), y.values.end());
    targets[row] = id_scalar(obs[2], where, "target");
  }
  IdMatrix c(n, N);
  std::copy(contexts.begin(), contexts.end(), c.data());
  if (symbol_queries) return AnyBatch(spec_.encode_symbols(std::move(c), std::move(symbols), std::move(targets)));
  Matrix q(n, D);
  std::copy(queries.begin(), queries.end(), q.data());
  return AnyBatch(spec_.encode(std::move(c), std::move(q), std::move(targets)));
}

py::tuple ResponsibilityAttentionDataEncoderPy::parts(const AnyBatch& any, py::handle owner) const {
  const auto& batch = batch_as_family<ResponsibilityAttentionBatch>(any, class_name());
  const Index n = batch.n_rows();
  if (batch.has_symbol_queries())
    return py::make_tuple(readonly_view(batch.context(0), {n, batch.context_length()}, owner),
                          readonly_view(batch.query_symbol_data(), {n}, owner),
                          readonly_view(batch.target_data(), {n}, owner));
  return py::make_tuple(readonly_view(batch.context(0), {n, batch.context_length()}, owner),
                        readonly_view(batch.query(0), {n, batch.query_dim()}, owner),
                        readonly_view(batch.target_data(), {n}, owner));
}

bool ResponsibilityAttentionDataEncoderPy::equals(const DataEncoder& other) const {
  const auto* o = dynamic_cast<const ResponsibilityAttentionDataEncoderPy*>(&other);
  return o && o->spec_ == spec_;
}

py::tuple ra_observation(const int64_t* context, Index N, const double* query, Index D,
                         int64_t target) {
  return py::make_tuple(copy_ids(context, {N}), copy_reals(query, {D}), py::int_(target));
}

// ---- chained attention --------------------------------------------------------------------------

AnyBatch ChainedAttentionDataEncoderPy::encode(py::handle data) const {
  const std::string where = class_name();
  if (is_array_tuple(data, 4, 2)) {
    const py::tuple arrays = py::reinterpret_borrow<py::tuple>(data);
    IdMatrix keys = ids_2d(arrays[0], where, "keys");
    IdMatrix values = ids_2d(arrays[1], where, "values");
    IdVector queries = ids_1d(arrays[2], where, "query");
    IdVector targets = ids_1d(arrays[3], where, "target");
    return AnyBatch(
        spec_.encode(std::move(keys), std::move(values), std::move(queries), std::move(targets), where));
  }
  const std::vector<py::object> rows = observations_of(data, where);
  const Index n = static_cast<Index>(rows.size());
  Index N = 0;
  std::vector<int64_t> keys;
  std::vector<int64_t> values;
  IdVector queries(n);
  IdVector targets(n);
  for (Index row = 0; row < n; ++row) {
    const std::vector<py::object> obs =
        fields_of(rows[static_cast<size_t>(row)], 4, kChainedMessage);
    NdArray<int64_t> k = read_ids(obs[0], where, "keys");
    if (k.ndim() != 1)
      throw TypeError(where + ": keys of row " + std::to_string(row) +
                      " must be a 1-D sequence of ids (got shape " + shape_text(k.shape) + ")");
    NdArray<int64_t> v = read_ids(obs[1], where, "values");
    if (v.ndim() != 1)
      throw TypeError(where + ": values of row " + std::to_string(row) +
                      " must be a 1-D sequence of ids (got shape " + shape_text(v.shape) + ")");
    if (row == 0) {
      N = k.shape[0];
      keys.reserve(static_cast<size_t>(n * N));
      values.reserve(static_cast<size_t>(n * N));
    }
    if (k.shape[0] != N)  // rows of different widths: a shape mismatch, as in the RA encoder
      throw ValueError(where + ": keys must all have the same length (row 0 has " +
                       std::to_string(N) + ", row " + std::to_string(row) + " has " +
                       std::to_string(k.shape[0]) + ")");
    if (v.shape[0] != k.shape[0])
      throw ValueError(where + ": keys and values of row " + std::to_string(row) +
                       " must have the same length (got " + std::to_string(k.shape[0]) + " and " +
                       std::to_string(v.shape[0]) + ")");
    keys.insert(keys.end(), k.values.begin(), k.values.end());
    values.insert(values.end(), v.values.begin(), v.values.end());
    queries[row] = id_scalar(obs[2], where, "query");
    targets[row] = id_scalar(obs[3], where, "target");
  }
  IdMatrix k(n, N);
  std::copy(keys.begin(), keys.end(), k.data());
  IdMatrix v(n, N);
  std::copy(values.begin(), values.end(), v.data());
  return AnyBatch(spec_.encode(std::move(k), std::move(v), std::move(queries), std::move(targets), where));
}

py::tuple ChainedAttentionDataEncoderPy::parts(const AnyBatch& any, py::handle owner) const {
  const auto& batch = batch_as_family<ChainedAttentionBatch>(any, class_name());
  const Index n = batch.n_rows();
  const auto readonly_copy = [n](const IdVector& ids) {
    py::array out = copy_ids(ids.data(), {n});
    out.attr("setflags")(py::arg("write") = false);
    return out;
  };
  return py::make_tuple(readonly_view(batch.keys(0), {n, batch.context_length()}, owner),
                        readonly_view(batch.values(0), {n, batch.context_length()}, owner),
                        readonly_copy(batch.queries()), readonly_copy(batch.targets()));
}

bool ChainedAttentionDataEncoderPy::equals(const DataEncoder& other) const {
  if (typeid(other) != typeid(*this)) return false;  // a multi-hop encoder is another family's
  return static_cast<const ChainedAttentionDataEncoderPy&>(other).spec_ == spec_;
}

py::tuple ca_observation(const ChainedAttentionObservation& obs) {
  const Index N = static_cast<Index>(obs.keys.size());
  return py::make_tuple(copy_ids(obs.keys.data(), {N}), copy_ids(obs.values.data(), {N}), py::int_(obs.query),
                        py::int_(obs.target));
}

// ---- variational embedding attention ------------------------------------------------------------

AnyBatch VariationalEmbeddingAttentionDataEncoderPy::encode(py::handle data) const {
  const std::string where = class_name();
  if (is_array_tuple(data, 3, 2)) {
    const py::tuple arrays = py::reinterpret_borrow<py::tuple>(data);
    IdMatrix contexts = ids_2d(arrays[0], where, "context");
    IdVector queries = ids_1d(arrays[1], where, "query");
    IdVector targets = ids_1d(arrays[2], where, "target");
    return AnyBatch(spec_.encode(std::move(contexts), std::move(queries), std::move(targets)));
  }
  const std::vector<py::object> rows = observations_of(data, where);
  const Index n = static_cast<Index>(rows.size());
  Index N = spec_.context_length.value_or(0);
  std::vector<int64_t> contexts;
  IdVector queries(n);
  IdVector targets(n);
  for (Index row = 0; row < n; ++row) {
    const std::vector<py::object> obs =
        fields_of(rows[static_cast<size_t>(row)], 3, kVariationalEmbeddingMessage);
    NdArray<int64_t> ctx = read_ids(obs[0], where, "context");
    if (ctx.ndim() != 1)
      throw TypeError(where + ": context of row " + std::to_string(row) +
                      " must be a 1-D sequence of ids (got shape " + shape_text(ctx.shape) + ")");
    if (row == 0) {
      N = ctx.shape[0];
      contexts.reserve(static_cast<size_t>(n * N));
    }
    // A shape mismatch, as in the RA encoder (a declared N is the library's check).
    if (ctx.shape[0] != N)
      throw ValueError(where + ": contexts must all have the same length (row 0 has " +
                       std::to_string(N) + ", row " + std::to_string(row) + " has " +
                       std::to_string(ctx.shape[0]) + ")");
    contexts.insert(contexts.end(), ctx.values.begin(), ctx.values.end());
    queries[row] = id_scalar(obs[1], where, "query");
    targets[row] = id_scalar(obs[2], where, "target");
  }
  IdMatrix c(n, N);
  std::copy(contexts.begin(), contexts.end(), c.data());
  return AnyBatch(spec_.encode(std::move(c), std::move(queries), std::move(targets)));
}

py::tuple VariationalEmbeddingAttentionDataEncoderPy::parts(const AnyBatch& any,
                                                            py::handle owner) const {
  const auto& batch = batch_as_family<VariationalEmbeddingAttentionBatch>(any, class_name());
  const Index n = batch.n_rows();
  const auto readonly_copy = [n](const IdVector& ids) {
    py::array out = copy_ids(ids.data(), {n});
    out.attr("setflags")(py::arg("write") = false);
    return out;
  };
  return py::make_tuple(readonly_view(batch.context(0), {n, batch.context_length()}, owner),
                        readonly_copy(batch.queries()), readonly_copy(batch.targets()));
}

bool VariationalEmbeddingAttentionDataEncoderPy::equals(const DataEncoder& other) const {
  const auto* o = dynamic_cast<const VariationalEmbeddingAttentionDataEncoderPy*>(&other);
  return o && o->spec_ == spec_;
}

py::tuple vea_observation(const VariationalEmbeddingAttentionObservation& obs) {
  return py::make_tuple(copy_ids(obs.context.data(), {static_cast<Index>(obs.context.size())}), py::int_(obs.query),
                        py::int_(obs.target));
}

// ---- categorical --------------------------------------------------------------------------------

AnyBatch CategoricalDataEncoderPy::encode(py::handle data) const {
  const std::string where = class_name();
  py::handle ids = data;
  if (is_array_tuple(data, 1, 1)) ids = py::reinterpret_borrow<py::tuple>(data)[0];
  if (!is_sequence(ids))
    throw TypeError(where + ": seq_encode takes a list or 1-D array of ids (got " + type_name(ids) +
                    ")");
  return AnyBatch(spec_.encode(ids_1d(ids, where, "ids")));
}

py::tuple CategoricalDataEncoderPy::parts(const AnyBatch& any, py::handle /*owner*/) const {
  const auto& batch = batch_as_family<CategoricalBatch>(any, class_name());
  const IdVector ids = batch.ids();
  py::array out = copy_ids(ids.data(), {batch.n_rows()});
  out.attr("setflags")(py::arg("write") = false);
  return py::make_tuple(out);
}

bool CategoricalDataEncoderPy::equals(const DataEncoder& other) const {
  const auto* o = dynamic_cast<const CategoricalDataEncoderPy*>(&other);
  return o && o->spec_ == spec_;
}

// ---- diagonal Gaussian --------------------------------------------------------------------------

AnyBatch DiagonalGaussianDataEncoderPy::encode(py::handle data) const {
  const std::string where = class_name();
  py::handle values = data;
  if (is_array_tuple(data, 1, 2)) values = py::reinterpret_borrow<py::tuple>(data)[0];
  if (!is_sequence(values))
    throw TypeError(where + ": seq_encode takes a list of vectors or an (n, D) array (got " +
                    type_name(values) + ")");
  if (py::len(values) == 0) return AnyBatch(spec_.encode(Matrix(0, spec_.dim.value_or(0))));
  return AnyBatch(spec_.encode(reals_2d(values, where, "values")));
}

py::tuple DiagonalGaussianDataEncoderPy::parts(const AnyBatch& any, py::handle owner) const {
  const auto& batch = batch_as_family<DiagonalGaussianBatch>(any, class_name());
  return py::make_tuple(readonly_view(batch.row(0), {batch.n_rows(), batch.dim()}, owner));
}

bool DiagonalGaussianDataEncoderPy::equals(const DataEncoder& other) const {
  const auto* o = dynamic_cast<const DiagonalGaussianDataEncoderPy*>(&other);
  return o && o->spec_ == spec_;
}

// ---- mixture ------------------------------------------------------------------------------------

bool MixtureDataEncoderPy::equals(const DataEncoder& other) const {
  const auto* o = dynamic_cast<const MixtureDataEncoderPy*>(&other);
  return o && o->component_->equals(*component_);
}

// ---- composite ----------------------------------------------------------------------------------

AnyBatch CompositeDataEncoderPy::encode(py::handle data) const {
  const std::string where = class_name();
  const size_t F = fields_.size();
  std::vector<AnyBatch> batches;
  if (PyTuple_Check(data.ptr()) && static_cast<size_t>(PyTuple_GET_SIZE(data.ptr())) == F &&
      py::isinstance<EncodedBatch>(py::reinterpret_borrow<py::tuple>(data)[0])) {
    const py::tuple given = py::reinterpret_borrow<py::tuple>(data);
    for (size_t f = 0; f < F; ++f) batches.push_back(batch_of(given[f], *fields_[f]));
    return AnyBatch(CompositeBatch(std::move(batches)));
  }
  const std::vector<py::object> rows = observations_of(data, where);
  std::vector<py::list> columns(F);
  const std::string message =
      "composite observations must be tuples of " + std::to_string(F) + " fields";
  for (const py::object& row : rows) {
    const std::vector<py::object> obs = fields_of(row, F, message);
    for (size_t f = 0; f < F; ++f) columns[f].append(obs[f]);
  }
  for (size_t f = 0; f < F; ++f) batches.push_back(fields_[f]->encode(columns[f]));
  return AnyBatch(CompositeBatch(std::move(batches)));
}

py::tuple CompositeDataEncoderPy::parts(const AnyBatch& any, py::handle /*owner*/) const {
  const auto& batch = batch_as_family<CompositeBatch>(any, class_name());
  py::tuple out(fields_.size());
  for (size_t f = 0; f < fields_.size(); ++f)
    out[f] = py::cast(EncodedBatch{batch.field(static_cast<Index>(f)), fields_[f]});
  return out;
}

bool CompositeDataEncoderPy::equals(const DataEncoder& other) const {
  const auto* o = dynamic_cast<const CompositeDataEncoderPy*>(&other);
  if (!o || o->fields_.size() != fields_.size()) return false;
  for (size_t f = 0; f < fields_.size(); ++f)
    if (!o->fields_[f]->equals(*fields_[f])) return false;
  return true;
}

// ---- shared -------------------------------------------------------------------------------------

EncodedBatch DataEncoder::seq_encode(py::handle data) const {
  if (py::isinstance<EncodedBatch>(data)) return data.cast<EncodedBatch>();
  return EncodedBatch{encode(data), std::const_pointer_cast<DataEncoder>(shared_from_this())};
}

AnyBatch batch_of(py::handle data, const DataEncoder& encoder) {
  if (py::isinstance<EncodedBatch>(data)) return data.cast<const EncodedBatch&>().batch;
  return encoder.encode(data);
}

}  // namespace attnmix::python
