// SPDX-License-Identifier: Apache-2.0
// The conversion layer (convert.hpp): Python / numpy values → ids, reals, weights, scalars,
// generators, and the library's arrays → numpy. One reader walks numpy arrays (any numeric dtype,
// byte order and layout) and nested sequences element by element and hands each element to a sink
// that applies the id or the real rules.
#include "convert.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>

#include "attnmix/core/check.hpp"
#include "attnmix/core/errors.hpp"

namespace attnmix::python {

namespace {

/// numpy's scalar and generator types, looked up once (at module import, under the GIL) and never
/// released.
struct NumpyTypes {
  py::object bool_, integer, floating, random_state, generator;
};
const NumpyTypes& numpy_types() {
  static const NumpyTypes* types = [] {
    auto* t = new NumpyTypes;
    const py::module_ np = py::module_::import("numpy");
    const py::module_ random = py::module_::import("numpy.random");
    t->bool_ = np.attr("bool_");
    t->integer = np.attr("integer");
    t->floating = np.attr("floating");
    t->random_state = random.attr("RandomState");
    t->generator = random.attr("Generator");
    return t;
  }();
  return *types;
}

bool isinstance_of(py::handle obj, const py::object& type) {
  const int r = PyObject_IsInstance(obj.ptr(), type.ptr());
  if (r < 0) throw py::error_already_set();
  return r == 1;
}

bool is_bool(py::handle obj) {
  return PyBool_Check(obj.ptr()) || isinstance_of(obj, numpy_types().bool_);
}

std::string prefix(std::string_view where, std::string_view name) {
  return std::string(where) + ": " + std::string(name);
}

/// What the reader is reading, for messages and for the kind of error a ragged nesting raises.
struct Target {
  std::string_view where;
  std::string_view name;
  bool ids;  // ids: ragged → TypeError; reals: ragged → ValueError
  [[noreturn]] void ragged() const {
    const std::string msg =
        prefix(where, name) + " must be a rectangular array (the nesting is ragged)";
    if (ids) throw TypeError(msg);
    throw ValueError(msg);
  }
  [[noreturn]] void boolean() const {
    throw TypeError(prefix(where, name) +
                    (ids ? " must be integer ids, not bool" : " must be real numbers, not bool"));
  }
  [[noreturn]] void non_numeric(const std::string& what) const {
    throw TypeError(prefix(where, name) + (ids ? " must be integer ids" : " must be real numbers") +
                    " (got " + what + ")");
  }
};

/// Exact integer ids (docs/mechanisms.md#building-blocks): integers pass, integral finite reals pass, everything else
/// is rejected. Writes into a buffer sized from the shape.
struct IdSink {
  using value_type = int64_t;
  const Target& target;
  int64_t* out;
  void integer(int64_t v) { *out++ = v; }
  void unsigned_integer(uint64_t v) {
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw ValueError(std::string(target.where) + ": out-of-range ID in " +
                       std::string(target.name) + " (got " + std::to_string(v) + ")");
    *out++ = static_cast<int64_t>(v);
  }
  void big_integer() {
    throw ValueError(std::string(target.where) + ": out-of-range ID in " +
                     std::string(target.name) + " (an integer beyond 64 bits)");
  }
  void real(double x) { *out++ = check::exact_id(target.where, target.name, x, std::nullopt); }
  /// n entries already of the right type (any int64 is an id here; ranges are the encoder's).
  void bulk(const int64_t* p, Index n) {
    if (n > 0) std::memcpy(out, p, static_cast<size_t>(n) * sizeof(int64_t));
    out += n;
  }
};

/// Real numbers: integers and reals of every width become doubles.
struct RealSink {
  using value_type = double;
  const Target& target;
  double* out;
  void integer(int64_t v) { *out++ = static_cast<double>(v); }
  void unsigned_integer(uint64_t v) { *out++ = static_cast<double>(v); }
  void big_integer() {
    *out++ = std::numeric_limits<double>::quiet_NaN();
  }  // not finite: rejected later
  void real(double x) { *out++ = x; }
  void bulk(const double* p, Index n) {
    if (n > 0) std::memcpy(out, p, static_cast<size_t>(n) * sizeof(double));
    out += n;
  }
};

/// Calls f(value) for every element of a in C order (any strides, any alignment).
template <class T, class F>
void visit_elements(const py::array& a, F&& f) {
  const Index n = static_cast<Index>(a.size());
  if (n == 0) return;
  const auto* base = static_cast<const char*>(a.data());
  if (a.flags() & py::array::c_style) {
    for (Index k = 0; k < n; ++k) {
      T v;
      std::memcpy(&v, base + k * static_cast<Index>(sizeof(T)), sizeof(T));
      f(v);
    }
    return;
  }
  const Index nd = a.ndim();
  std::vector<Index> idx(static_cast<size_t>(nd), 0);
  for (Index k = 0; k < n; ++k) {
    Index offset = 0;
    for (Index d = 0; d < nd; ++d)
      offset += idx[static_cast<size_t>(d)] * static_cast<Index>(a.strides(d));
    T v;
    std::memcpy(&v, base + offset, sizeof(T));
    f(v);
    for (Index d = nd - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < a.shape(d)) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
}

template <class Sink>
void read_scalar(py::handle x, const Target& target, Sink& sink);

/// Every element of a numpy array, by dtype.
template <class Sink>
void read_array(py::array a, const Target& target, Sink& sink) {
  py::dtype dt = a.dtype();
  const char kind = dt.kind();
  if (kind == 'b') target.boolean();
  if (kind == 'O') {
    visit_elements<PyObject*>(a,
                              [&](PyObject* item) { read_scalar(py::handle(item), target, sink); });
    return;
  }
  if (kind != 'i' && kind != 'u' && kind != 'f')
    target.non_numeric("an array of dtype " + py::str(dt).cast<std::string>());
  const auto size = dt.itemsize();
  const bool native = dt.attr("isnative").cast<bool>();
  if (!native ||
      (kind == 'f' && size != 4 && size != 8)) {  // byte-swapped, float16 or long double: via numpy
    a = a.attr("astype")(kind == 'f' ? "float64" : (kind == 'i' ? "int64" : "uint64"));
    read_array(std::move(a), target, sink);
    return;
  }
  using T = typename Sink::value_type;
  if ((a.flags() & py::array::c_style) && size == sizeof(T) &&
      kind == (std::is_same_v<T, double> ? 'f' : 'i')) {  // the fast path: one copy
    sink.bulk(static_cast<const T*>(a.data()), static_cast<Index>(a.size()));
    return;
  }
  const auto as_int = [&](auto v) { sink.integer(static_cast<int64_t>(v)); };
  const auto as_uint = [&](auto v) { sink.unsigned_integer(static_cast<uint64_t>(v)); };
  const auto as_real = [&](auto v) { sink.real(static_cast<double>(v)); };
  if (kind == 'i') {
    switch (size) {
      case 1:
        visit_elements<int8_t>(a, as_int);
        return;
      case 2:
        visit_elements<int16_t>(a, as_int);
        return;
      case 4:
        visit_elements<int32_t>(a, as_int);
        return;
      default:
        visit_elements<int64_t>(a, as_int);
        return;
    }
  }
  if (kind == 'u') {
    switch (size) {
      case 1:
        visit_elements<uint8_t>(a, as_uint);
        return;
      case 2:
        visit_elements<uint16_t>(a, as_uint);
        return;
      case 4:
        visit_elements<uint32_t>(a, as_uint);
        return;
      default:
        visit_elements<uint64_t>(a, as_uint);
        return;
    }
  }
  if (size == 4)
    visit_elements<float>(a, as_real);
  else
    visit_elements<double>(a, as_real);
}

/// A Python int (any size) into the sink.
template <class Sink>
void read_python_int(PyObject* p, Sink& sink) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(p, &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow == 0) {
    sink.integer(static_cast<int64_t>(v));
    return;
  }
  if (overflow > 0) {
    const unsigned long long u = PyLong_AsUnsignedLongLong(p);
    if (!(u == static_cast<unsigned long long>(-1) && PyErr_Occurred())) {
      sink.unsigned_integer(static_cast<uint64_t>(u));
      return;
    }
    PyErr_Clear();
  }
  sink.big_integer();
}

/// One element that is not a sequence: bool → TypeError; ints and reals (Python or numpy) pass; a
/// 0-d array is read as its element; anything else → TypeError.
template <class Sink>
void read_scalar(py::handle x, const Target& target, Sink& sink) {
  PyObject* p = x.ptr();
  if (is_bool(x)) target.boolean();
  if (PyLong_Check(p)) return read_python_int(p, sink);
  if (PyFloat_Check(p)) return sink.real(PyFloat_AS_DOUBLE(p));
  const NumpyTypes& np = numpy_types();
  if (isinstance_of(x, np.integer)) {
    const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(p));
    if (!index) throw py::error_already_set();
    return read_python_int(index.ptr(), sink);
  }
  if (isinstance_of(x, np.floating)) {
    const double v = PyFloat_AsDouble(p);
    if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    return sink.real(v);
  }
  if (is_ndarray(x)) {
    const auto a = py::reinterpret_borrow<py::array>(x);
    if (a.ndim() != 0) target.ragged();
    return read_array(a, target, sink);
  }
  target.non_numeric(type_name(x));
}

/// The shape implied by the first element at every depth (arrays contribute their whole shape).
void discover_shape(py::handle x, std::vector<Index>& shape) {
  py::object keep = py::reinterpret_borrow<py::object>(x);
  for (;;) {
    if (is_ndarray(keep)) {
      const auto a = py::reinterpret_borrow<py::array>(keep);
      for (Index d = 0; d < a.ndim(); ++d) shape.push_back(static_cast<Index>(a.shape(d)));
      return;
    }
    if (!is_sequence(keep)) return;
    const Py_ssize_t n = PySequence_Size(keep.ptr());
    if (n < 0) throw py::error_already_set();
    shape.push_back(static_cast<Index>(n));
    if (n == 0) return;
    keep = py::reinterpret_steal<py::object>(PySequence_GetItem(keep.ptr(), 0));
    if (!keep) throw py::error_already_set();
  }
}

/// Reads x, which must have shape[depth:], into the sink.
template <class Sink>
void fill(py::handle x, const std::vector<Index>& shape, size_t depth, const Target& target,
          Sink& sink) {
  const size_t rest = shape.size() - depth;
  if (is_ndarray(x)) {
    const auto a = py::reinterpret_borrow<py::array>(x);
    if (static_cast<size_t>(a.ndim()) != rest) target.ragged();
    for (size_t d = 0; d < rest; ++d)
      if (static_cast<Index>(a.shape(static_cast<py::ssize_t>(d))) != shape[depth + d])
        target.ragged();
    return read_array(a, target, sink);
  }
  if (rest == 0) {
    if (is_sequence(x)) target.ragged();
    return read_scalar(x, target, sink);
  }
  if (!is_sequence(x)) target.ragged();
  const Py_ssize_t n = PySequence_Size(x.ptr());
  if (n < 0) throw py::error_already_set();
  if (static_cast<Index>(n) != shape[depth]) target.ragged();
  PyObject* p = x.ptr();
  if (PyList_Check(p) || PyTuple_Check(p)) {
    for (Py_ssize_t k = 0; k < n; ++k)
      fill(py::handle(PyList_Check(p) ? PyList_GET_ITEM(p, k) : PyTuple_GET_ITEM(p, k)), shape,
           depth + 1, target, sink);
    return;
  }
  for (Py_ssize_t k = 0; k < n; ++k) {
    const py::object item = py::reinterpret_steal<py::object>(PySequence_GetItem(p, k));
    if (!item) throw py::error_already_set();
    fill(item, shape, depth + 1, target, sink);
  }
}

/// Reads obj into the buffer that allocate(shape) returns (sized for the shape); returns the shape.
template <class Sink, class Allocate>
std::vector<Index> read_numeric(py::handle obj, const Target& target, Allocate&& allocate) {
  std::vector<Index> shape;
  discover_shape(obj, shape);
  Sink sink{target, allocate(shape)};
  fill(obj, shape, 0, target, sink);
  return shape;
}

template <class T>
NdArray<T> read_nd(py::handle obj, const Target& target) {
  NdArray<T> out;
  using Sink = std::conditional_t<std::is_same_v<T, double>, RealSink, IdSink>;
  out.shape = read_numeric<Sink>(obj, target, [&](const std::vector<Index>& shape) {
    Index total = 1;
    for (Index d : shape) total *= d;
    out.values.resize(static_cast<size_t>(total));
    return out.values.data();
  });
  return out;
}

/// A 2-D array read straight into an Eigen matrix; another ndim raises Error(message).
template <class M, class Error>
M read_matrix(py::handle obj, const Target& target, const char* what) {
  M out;
  using Sink = std::conditional_t<std::is_same_v<typename M::Scalar, double>, RealSink, IdSink>;
  read_numeric<Sink>(obj, target, [&](const std::vector<Index>& shape) {
    if (shape.size() != 2)
      throw Error(prefix(target.where, target.name) + " must be a 2-D array" + what +
                  " (got shape " + shape_text(shape) + ")");
    out.resize(shape[0], shape[1]);
    return out.data();
  });
  return out;
}

void require_shape(const NdArray<double>& a, const std::vector<Index>& shape,
                   std::string_view where, std::string_view name) {
  if (a.shape != shape)
    throw ValueError(prefix(where, name) + " must have shape " + shape_text(shape) + " (got " +
                     shape_text(a.shape) + ")");
}

/// A Python int or numpy integer (not bool, not float) as a Python int; other kinds → TypeError.
py::object python_index(py::handle obj, std::string_view where, std::string_view name) {
  if (is_bool(obj)) throw TypeError(prefix(where, name) + " must be an integer, not bool");
  if (!PyLong_Check(obj.ptr()) && !isinstance_of(obj, numpy_types().integer))
    throw TypeError(prefix(where, name) + " must be an integer (got " + type_name(obj) + ")");
  py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!index) throw py::error_already_set();
  return index;
}

/// Python int or numpy integer (not bool, not float) as int64; other kinds → TypeError.
int64_t integer_scalar(py::handle obj, std::string_view where, std::string_view name) {
  const py::object index = python_index(obj, where, name);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0) throw ValueError(prefix(where, name) + " is out of range (beyond 64 bits)");
  return static_cast<int64_t>(v);
}

/// One 31-bit seed drawn from a numpy RandomState or Generator, or nullopt for other objects.
std::optional<uint64_t> numpy_seed(py::handle rng) {
  const NumpyTypes& np = numpy_types();
  constexpr int64_t kBound = (int64_t{1} << 31) - 1;
  if (isinstance_of(rng, np.random_state)) return rng.attr("randint")(0, kBound).cast<uint64_t>();
  if (isinstance_of(rng, np.generator)) return rng.attr("integers")(0, kBound).cast<uint64_t>();
  return std::nullopt;
}

[[noreturn]] void bad_rng(py::handle rng, std::string_view where) {
  throw TypeError(
      std::string(where) +
      ": rng must be None, an int, an attnmix.Rng or a numpy RandomState / Generator (got " +
      type_name(rng) + ")");
}

std::vector<py::ssize_t> ssize_shape(const std::vector<Index>& shape) {
  return {shape.begin(), shape.end()};
}

}  // namespace

// ---- helpers ------------------------------------------------------------------------------------

void init_conversions() { (void)numpy_types(); }

std::string shape_text(const std::vector<Index>& shape) {
  std::string out = "(";
  for (size_t d = 0; d < shape.size(); ++d) out += (d ? ", " : "") + std::to_string(shape[d]);
  if (shape.size() == 1) out += ",";
  return out + ")";
}

std::string type_name(py::handle obj) {
  return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

bool is_ndarray(py::handle obj) { return py::isinstance<py::array>(obj); }

bool is_sequence(py::handle obj) {
  PyObject* p = obj.ptr();
  if (PyList_Check(p) || PyTuple_Check(p)) return true;
  if (PyUnicode_Check(p) || PyBytes_Check(p) || PyByteArray_Check(p) || PyDict_Check(p))
    return false;
  return is_ndarray(obj) || PySequence_Check(p) == 1;
}

// ---- ids ----------------------------------------------------------------------------------------

NdArray<int64_t> read_ids(py::handle obj, std::string_view where, std::string_view name) {
  numpy_types();
  const Target target{where, name, /*ids=*/true};
  return read_nd<int64_t>(obj, target);
}

IdMatrix ids_2d(py::handle obj, std::string_view where, std::string_view name) {
  numpy_types();
  const Target target{where, name, /*ids=*/true};
  return read_matrix<IdMatrix, TypeError>(obj, target, " of integer ids");
}

IdVector ids_1d(py::handle obj, std::string_view where, std::string_view name) {
  NdArray<int64_t> a = read_ids(obj, where, name);
  if (a.ndim() != 1)
    throw TypeError(prefix(where, name) + " must be a 1-D array of integer ids (got shape " +
                    shape_text(a.shape) + ")");
  IdVector out(a.shape[0]);
  std::copy(a.values.begin(), a.values.end(), out.data());
  return out;
}

int64_t id_scalar(py::handle obj, std::string_view where, std::string_view name) {
  NdArray<int64_t> a = read_ids(obj, where, name);
  if (a.ndim() != 0)
    throw TypeError(prefix(where, name) + " must be a single integer id (got shape " +
                    shape_text(a.shape) + ")");
  return a.values[0];
}

// ---- reals --------------------------------------------------------------------------------------

NdArray<double> read_reals(py::handle obj, std::string_view where, std::string_view name) {
  numpy_types();
  const Target target{where, name, /*ids=*/false};
  return read_nd<double>(obj, target);
}

Matrix reals_2d(py::handle obj, std::string_view where, std::string_view name) {
  numpy_types();
  const Target target{where, name, /*ids=*/false};
  return read_matrix<Matrix, ValueError>(obj, target, "");
}

Vector reals_1d(py::handle obj, std::string_view where, std::string_view name) {
  NdArray<double> a = read_reals(obj, where, name);
  if (a.ndim() != 1)
    throw ValueError(prefix(where, name) + " must be a 1-D array (got shape " +
                     shape_text(a.shape) + ")");
  Vector out(a.shape[0]);
  std::copy(a.values.begin(), a.values.end(), out.data());
  return out;
}

void reals_of_shape(py::handle obj, const std::vector<Index>& shape, std::string_view where,
                    std::string_view name, std::vector<double>& out) {
  NdArray<double> a = read_reals(obj, where, name);
  require_shape(a, shape, where, name);
  out.insert(out.end(), a.values.begin(), a.values.end());
}

// ---- boolean masks ------------------------------------------------------------------------------

BoolMatrix bools_2d(py::handle obj, std::string_view where, std::string_view name) {
  numpy_types();
  if (!is_ndarray(obj) && !is_sequence(obj))
    throw TypeError(prefix(where, name) + " must be a 2-D bool array (got " + type_name(obj) + ")");
  // numpy turns nested bools into a bool array and rejects a ragged nesting (ValueError).
  const py::module_ np = py::module_::import("numpy");
  const auto a = py::reinterpret_borrow<py::array>(np.attr("asarray")(obj));
  if (a.dtype().kind() != 'b')
    throw TypeError(prefix(where, name) + " must be a 2-D bool array (got dtype " +
                    py::str(a.dtype()).cast<std::string>() + ")");
  if (a.ndim() != 2)
    throw ValueError(prefix(where, name) + " must be a 2-D bool array (got " +
                     std::to_string(a.ndim()) + " dimensions)");
  BoolMatrix out(static_cast<Index>(a.shape(0)), static_cast<Index>(a.shape(1)));
  visit_elements<bool>(a, [p = out.data()](bool v) mutable { *p++ = v; });
  return out;
}

// ---- weights ------------------------------------------------------------------------------------

std::vector<double> weights(py::handle obj, Index n_rows, std::string_view where) {
  NdArray<double> a = read_reals(obj, where, "weights");
  require_shape(a, {n_rows}, where, "weights");
  check::weights(where, a.values, n_rows);
  return std::move(a.values);
}

double weight_scalar(py::handle obj, std::string_view where) {
  NdArray<double> a = read_reals(obj, where, "weight");
  if (a.ndim() != 0)
    throw ValueError(std::string(where) + ": weight must be a single real number (got shape " +
                     shape_text(a.shape) + ")");
  check::weights(where, a.values, 1);
  return a.values[0];
}

// ---- scalars ------------------------------------------------------------------------------------

double real_number(py::handle obj, std::string_view where, std::string_view name) {
  if (is_sequence(obj) && !(is_ndarray(obj) && py::reinterpret_borrow<py::array>(obj).ndim() == 0))
    throw TypeError(prefix(where, name) + " must be a real number (got " + type_name(obj) + ")");
  return read_reals(obj, where, name).values[0];
}

double positive_real(py::handle obj, std::string_view where, std::string_view name) {
  const double v = real_number(obj, where, name);
  check::positive_real(where, name, v);
  return v;
}

double nonnegative_real(py::handle obj, std::string_view where, std::string_view name) {
  const double v = real_number(obj, where, name);
  check::nonnegative_real(where, name, v);
  return v;
}

int64_t positive_int(py::handle obj, std::string_view where, std::string_view name) {
  const int64_t v = integer_scalar(obj, where, name);
  check::positive_int(where, name, v);
  return v;
}

int64_t nonnegative_int(py::handle obj, std::string_view where, std::string_view name) {
  const int64_t v = integer_scalar(obj, where, name);
  if (v < 0)
    throw ValueError(prefix(where, name) + " must be an integer >= 0 (got " + std::to_string(v) +
                     ")");
  return v;
}

std::optional<int64_t> optional_positive_int(py::handle obj, std::string_view where,
                                             std::string_view name) {
  if (obj.is_none()) return std::nullopt;
  return positive_int(obj, where, name);
}

uint64_t seed_int(py::handle obj, std::string_view where, std::string_view name) {
  const py::object index = python_index(obj, where, name);
  if (PyObject_RichCompareBool(index.ptr(), py::int_(0).ptr(), Py_LT) == 1)
    throw ValueError(prefix(where, name) + " must be an integer >= 0 (got " + py::str(index).cast<std::string>() +
                     ")");
  const unsigned long long v = PyLong_AsUnsignedLongLong(index.ptr());
  if (PyErr_Occurred()) {
    PyErr_Clear();
    throw ValueError(prefix(where, name) + " is out of range (beyond 64 bits)");
  }
  return static_cast<uint64_t>(v);
}

bool flag(py::handle obj, std::string_view where, std::string_view name) {
  if (!is_bool(obj))
    throw TypeError(prefix(where, name) + " must be a bool (got " + type_name(obj) + ")");
  return PyObject_IsTrue(obj.ptr()) == 1;
}

std::optional<std::string> optional_str(py::handle obj, std::string_view where,
                                        std::string_view name) {
  if (obj.is_none()) return std::nullopt;
  if (!PyUnicode_Check(obj.ptr()))
    throw TypeError(prefix(where, name) + " must be None or a str (got " + type_name(obj) + ")");
  return obj.cast<std::string>();
}

Precision precision_arg(py::handle obj, std::string_view where) {
  if (!PyUnicode_Check(obj.ptr()))
    throw TypeError(prefix(where, "precision") + " must be 'float64' or 'mixed' (got " + type_name(obj) + ")");
  return parse_precision(obj.cast<std::string>(), where);
}

stream::ClusterRule cluster_rule_arg(py::handle obj, std::string_view where) {
  if (!PyUnicode_Check(obj.ptr()))
    throw TypeError(prefix(where, "cluster_rule") + " must be 'threshold' or 'budget' (got " + type_name(obj) + ")");
  return stream::parse_cluster_rule(obj.cast<std::string>(), std::string(where));
}

std::string name_arg(py::handle obj, std::string_view where) {
  return optional_str(obj, where, "name").value_or("");
}

py::object name_to_python(const std::string& name) {
  return name.empty() ? py::object(py::none()) : py::object(py::str(name));
}

py::object pseudo_count_arg(py::handle obj, std::string_view where) {
  if (obj.is_none()) return py::none();
  return py::float_(nonnegative_real(obj, where, "pseudo_count"));
}

// ---- randomness ---------------------------------------------------------------------------------

RngSource rng_source(py::handle rng, uint64_t none_seed, std::string_view where) {
  if (rng.is_none()) return RngSource(none_seed);
  if (py::isinstance<Rng>(rng)) return RngSource(rng.cast<Rng&>());
  if (const auto seed = numpy_seed(rng)) return RngSource(*seed);
  if (is_bool(rng) || !(PyLong_Check(rng.ptr()) || isinstance_of(rng, numpy_types().integer)))
    bad_rng(rng, where);
  return RngSource(seed_int(rng, where, "rng"));
}

uint64_t sampler_seed(py::handle seed, std::string_view where) {
  if (seed.is_none()) {
    std::random_device entropy;
    return (static_cast<uint64_t>(entropy()) << 32) ^ static_cast<uint64_t>(entropy());
  }
  if (py::isinstance<Rng>(seed)) return seed.cast<Rng&>().next_u64();
  if (const auto drawn = numpy_seed(seed)) return *drawn;
  if (is_bool(seed) || !(PyLong_Check(seed.ptr()) || isinstance_of(seed, numpy_types().integer)))
    throw TypeError(
        std::string(where) +
        ": seed must be None, an int, an attnmix.Rng or a numpy RandomState / Generator (got " +
        type_name(seed) + ")");
  return seed_int(seed, where, "seed");
}

// ---- numpy out ----------------------------------------------------------------------------------

py::array_t<double> copy_reals(const double* data, const std::vector<Index>& shape) {
  return py::array_t<double>(ssize_shape(shape), data);  // no base: numpy copies
}

py::array_t<int64_t> copy_ids(const int64_t* data, const std::vector<Index>& shape) {
  return py::array_t<int64_t>(ssize_shape(shape), data);
}

py::array_t<bool> copy_bools(const bool* data, const std::vector<Index>& shape) {
  return py::array_t<bool>(ssize_shape(shape), data);
}

namespace {
template <class T>
py::array view_of(const T* data, const std::vector<Index>& shape, py::handle base) {
  py::array_t<T> out(ssize_shape(shape), data, base);
  out.attr("setflags")(py::arg("write") = false);
  return out;
}
}  // namespace

py::array readonly_view(const double* data, const std::vector<Index>& shape, py::handle base) {
  return view_of(data, shape, base);
}
py::array readonly_view(const int64_t* data, const std::vector<Index>& shape, py::handle base) {
  return view_of(data, shape, base);
}

py::array readonly_view(const Matrix& m, py::handle base) {
  return readonly_view(m.data(), {m.rows(), m.cols()}, base);
}
py::array readonly_view(const Vector& v, py::handle base) { return readonly_view(v.data(), {v.size()}, base); }

py::object json_to_python(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::object: {
      py::dict d;
      for (const auto& [key, value] : j.items()) d[py::str(key)] = json_to_python(value);
      return d;
    }
    case nlohmann::ordered_json::value_t::array: {
      py::list l;
      for (const auto& value : j) l.append(json_to_python(value));
      return l;
    }
    case nlohmann::ordered_json::value_t::boolean:
      return py::bool_(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return py::int_(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return py::int_(j.get<uint64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return py::float_(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return py::str(j.get<std::string>());
    default:
      return py::none();
  }
}

}  // namespace attnmix::python
