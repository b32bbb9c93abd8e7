// SPDX-License-Identifier: Apache-2.0
/// @file convert.hpp
/// The one conversion layer between Python values and the library's types: every binding reads its
/// arguments through these functions, so the strict rules of docs/mechanisms.md#building-blocks hold at every Python
/// entry point.
///
///   ids       bool dtype / bool element, ragged nesting, non-numeric value, wrong ndim →
///   TypeError;
///             non-finite or fractional value → ValueError (2.0 is accepted); negative → ValueError
///             "out-of-range ID" (the upper bounds S, T are checked by the library's encoders)
///   reals     bool or non-real → TypeError; a wrong ndim or shape, a ragged nesting → ValueError
///             (finiteness is checked by the library, which knows what the array is)
///   weights   real, non-bool, shape (n,) (or a scalar for update), finite, ≥ 0
///   scalars   positive / non-negative reals reject bool (TypeError); integers reject bool and
///   float (TypeError);
///             flags must be actual bools (TypeError); names and keys are None or str
///   rng       None, an int ≥ 0, an attnmix.Rng (used in place) or a numpy RandomState / Generator
///   (one 31-bit
///             seed is drawn from it, once)
/// Inputs may be numpy arrays of any numeric dtype, byte order and memory layout (C, Fortran,
/// strided), nested lists / tuples, or Python / numpy scalars. Nothing here does arithmetic on the
/// data beyond exactness checks.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnmix/core/precision.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"
#include "attnmix/stream/cluster_rule.hpp"

namespace attnmix::python {

namespace py = pybind11;

/// Entries of a numeric input in C (row-major) order, with its shape ({} for a scalar).
template <class T>
struct NdArray {
  std::vector<Index> shape;
  std::vector<T> values;
  [[nodiscard]] Index ndim() const noexcept { return static_cast<Index>(shape.size()); }
};

/// Looks up numpy's types once; module.cpp calls it at import, under the GIL.
void init_conversions();

/// "(3, 4)" for messages.
[[nodiscard]] std::string shape_text(const std::vector<Index>& shape);
/// The Python type name of obj, for messages.
[[nodiscard]] std::string type_name(py::handle obj);
/// True for lists, tuples and other non-string sequences (numpy arrays included).
[[nodiscard]] bool is_sequence(py::handle obj);
/// True for numpy arrays.
[[nodiscard]] bool is_ndarray(py::handle obj);

// ---- exact integer ids --------------------------------------------------------------------------
/// Ids of any dimensionality. @throws TypeError / ValueError per the rules above.
[[nodiscard]] NdArray<int64_t> read_ids(py::handle obj, std::string_view where,
                                        std::string_view name);
/// A 2-D id array [rows, cols]; another ndim → TypeError.
[[nodiscard]] IdMatrix ids_2d(py::handle obj, std::string_view where, std::string_view name);
/// A 1-D id array; another ndim → TypeError.
[[nodiscard]] IdVector ids_1d(py::handle obj, std::string_view where, std::string_view name);
/// One id (a scalar); an array → TypeError.
[[nodiscard]] int64_t id_scalar(py::handle obj, std::string_view where, std::string_view name);

// ---- real arrays --------------------------------------------------------------------------------
/// Reals of any dimensionality. @throws TypeError (bool / non-real) or ValueError (ragged).
[[nodiscard]] NdArray<double> read_reals(py::handle obj, std::string_view where,
                                         std::string_view name);
/// A 2-D real array; another ndim → ValueError.
[[nodiscard]] Matrix reals_2d(py::handle obj, std::string_view where, std::string_view name);
/// A 1-D real array; another ndim → ValueError.
[[nodiscard]] Vector reals_1d(py::handle obj, std::string_view where, std::string_view name);
/// A real array of exactly `shape` ({} = a scalar, also accepted as a 0-d array); appended to out.
void reals_of_shape(py::handle obj, const std::vector<Index>& shape, std::string_view where,
                    std::string_view name, std::vector<double>& out);

// ---- boolean masks ------------------------------------------------------------------------------
/// A row-major boolean matrix (the type of attnmix::assign::Mask).
using BoolMatrix = Eigen::Matrix<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A 2-D mask of actual bools (a numpy bool array or nested Python / numpy bools); any other
/// dtype, 0/1 integers included → TypeError; another ndim or a ragged nesting → ValueError.
[[nodiscard]] BoolMatrix bools_2d(py::handle obj, std::string_view where, std::string_view name);

// ---- weights ------------------------------------------------------------------------------------
/// Observation weights of shape (n_rows,): real, non-bool, finite, ≥ 0.
[[nodiscard]] std::vector<double> weights(py::handle obj, Index n_rows, std::string_view where);
/// One observation weight (update / initialize).
[[nodiscard]] double weight_scalar(py::handle obj, std::string_view where);

// ---- scalars ------------------------------------------------------------------------------------
/// Any real number (not bool); range checks are the caller's.
[[nodiscard]] double real_number(py::handle obj, std::string_view where, std::string_view name);
/// σ², min_sigma2, …: a positive finite real.
[[nodiscard]] double positive_real(py::handle obj, std::string_view where, std::string_view name);
/// emission_smoothing, …: a finite real ≥ 0.
[[nodiscard]] double nonnegative_real(py::handle obj, std::string_view where,
                                      std::string_view name);
/// S, N, D, T, print_iter, …: an integer > 0 (bool and float → TypeError).
[[nodiscard]] int64_t positive_int(py::handle obj, std::string_view where, std::string_view name);
/// max_its, size: an integer ≥ 0 (bool and float → TypeError).
[[nodiscard]] int64_t nonnegative_int(py::handle obj, std::string_view where,
                                      std::string_view name);
/// A seed: an integer in [0, 2**64), as the library's seeds (bool and float → TypeError).
[[nodiscard]] uint64_t seed_int(py::handle obj, std::string_view where, std::string_view name);
/// None, or positive_int.
[[nodiscard]] std::optional<int64_t> optional_positive_int(py::handle obj, std::string_view where,
                                                           std::string_view name);
/// An actual bool (Python or numpy); anything else → TypeError.
[[nodiscard]] bool flag(py::handle obj, std::string_view where, std::string_view name);
/// None or a str (name, keys).
[[nodiscard]] std::optional<std::string> optional_str(py::handle obj, std::string_view where,
                                                      std::string_view name);
/// precision: the str "float64" or "mixed" (anything else → TypeError or ValueError).
[[nodiscard]] Precision precision_arg(py::handle obj, std::string_view where);
/// cluster_rule: the str "threshold" or "budget" (anything else → TypeError or ValueError).
[[nodiscard]] stream::ClusterRule cluster_rule_arg(py::handle obj, std::string_view where);
/// The library stores "no name" as the empty string.
[[nodiscard]] std::string name_arg(py::handle obj, std::string_view where);
[[nodiscard]] py::object name_to_python(const std::string& name);
/// pseudo_count: None or a real number ≥ 0 (accepted and ignored by the attention families).
[[nodiscard]] py::object pseudo_count_arg(py::handle obj, std::string_view where);

// ---- randomness ---------------------------------------------------------------------------------
/// The generator a call draws from: the caller's attnmix.Rng (advanced in place) or a fresh one.
class RngSource {
 public:
  explicit RngSource(uint64_t seed) : owned_(seed), rng_(&*owned_) {}
  explicit RngSource(Rng& borrowed) : rng_(&borrowed) {}
  RngSource(const RngSource&) = delete;
  RngSource& operator=(const RngSource&) = delete;
  [[nodiscard]] Rng& get() noexcept { return *rng_; }

 private:
  std::optional<Rng> owned_;
  Rng* rng_;
};
/// An rng argument: None → Rng(none_seed); an int → Rng(int); attnmix.Rng → itself; numpy
/// RandomState / Generator → Rng(one 31-bit seed drawn from it). The Python object must outlive the
/// source.
[[nodiscard]] RngSource rng_source(py::handle rng, uint64_t none_seed, std::string_view where);
/// A seed argument of samplers: None → fresh OS entropy; otherwise as rng_source (a seed drawn from
/// an Rng).
[[nodiscard]] uint64_t sampler_seed(py::handle seed, std::string_view where);

// ---- numpy out ----------------------------------------------------------------------------------
/// A new array holding a copy of data with the given shape (C order).
[[nodiscard]] py::array_t<double> copy_reals(const double* data, const std::vector<Index>& shape);
[[nodiscard]] py::array_t<int64_t> copy_ids(const int64_t* data, const std::vector<Index>& shape);
[[nodiscard]] py::array_t<bool> copy_bools(const bool* data, const std::vector<Index>& shape);
/// A read-only C-order view of data kept alive by `base`.
[[nodiscard]] py::array readonly_view(const double* data, const std::vector<Index>& shape,
                                      py::handle base);
[[nodiscard]] py::array readonly_view(const int64_t* data, const std::vector<Index>& shape,
                                      py::handle base);
/// A read-only view of a matrix (its rows × columns) or vector kept alive by `base`.
[[nodiscard]] py::array readonly_view(const Matrix& m, py::handle base);
[[nodiscard]] py::array readonly_view(const Vector& v, py::handle base);

/// The read-only attribute `name` of a distribution class: get(model), a matrix or vector the model holds, as a
/// read-only view that keeps the distribution alive.
template <class Class, class Get>
void def_model_view(Class& cls, const char* name, Get get, const char* doc) {
  using Handle = typename Class::type;
  using Model = std::decay_t<decltype(std::declval<const Handle&>().model())>;
  static_assert(std::is_lvalue_reference_v<std::invoke_result_t<Get, const Model&>>,
                "get must return a reference to the model's own array, not a copy");
  cls.def_property_readonly(
      name,
      [get](py::object self) { return readonly_view(std::invoke(get, self.cast<const Handle&>().model()), self); },
      doc);
}
/// A JSON document as Python values: objects become dicts in the document's key order, arrays lists, null None.
[[nodiscard]] py::object json_to_python(const nlohmann::ordered_json& j);

}  // namespace attnmix::python
