// SPDX-License-Identifier: Apache-2.0
/// @file roles.hpp
/// The C++ objects behind the Python role classes (docs/mechanisms.md#building-blocks) and the family dispatch between
/// them.
///
/// Every Python distribution, estimator and accumulator holds the library's type-erased handle
/// (STYLE.md §4), so Mixture and Composite take components of any family and one set of generic
/// methods (bind_core.cpp) serves all families. Each family has its own Python class, i.e. its own
/// C++ type: DistributionOf<D>, EstimatorOf<E>, AccumulatorOf<A>. families.cpp maps a type-erased handle to its
/// family's Python class, encoder and statistics tuple through the entries the families register (PythonFamily).
///
///   DistributionHandle   AnyDistribution (immutable, shared)
///   EstimatorHandle      AnyEstimator (immutable, shared) + pseudo_count (accepted and ignored)
///   AccumulatorHandle    a site in a tree of accumulators: the root (shared by every Python view
///   of the tree)
///                        and the path of child indices to this site (Mixture / Composite children)
///   FactoryHandle        a zeroed prototype accumulator; make() copies it
///   DataEncoder          Python data → AnyBatch; presents a batch as the reference's tuple of
///   arrays EncodedBatch         an immutable, validated AnyBatch and the encoder that made it
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "attnmix/core/any.hpp"

namespace attnmix {
struct AttentionOptimizerState;
}  // namespace attnmix

namespace attnmix::python {

namespace py = pybind11;

class DataEncoder;

// ---- encoded data -------------------------------------------------------------------------------

/// A validated batch. Python: EncodedBatch, which unpacks and indexes like the encoder's tuple of
/// arrays.
struct EncodedBatch {
  AnyBatch batch;
  std::shared_ptr<DataEncoder>
      encoder;  // immutable; non-const only because pybind11 holders cannot be const
};

/// Turns Python data into a batch of one family (docs/mechanisms.md#building-blocks "Data encoder").
class DataEncoder : public std::enable_shared_from_this<DataEncoder> {
 public:
  virtual ~DataEncoder() = default;
  /// A list of observations or a tuple of arrays, validated into a batch. @throws TypeError /
  /// ValueError.
  [[nodiscard]] virtual AnyBatch encode(py::handle data) const = 0;
  /// The batch as the reference's tuple (read-only numpy views kept alive by `owner`, or child
  /// EncodedBatch objects for a composite).
  [[nodiscard]] virtual py::tuple parts(const AnyBatch& batch, py::handle owner) const = 0;
  /// Same family and same declared dimensions.
  [[nodiscard]] virtual bool equals(const DataEncoder& other) const = 0;
  /// The Python class name ("ResponsibilityAttentionDataEncoder").
  [[nodiscard]] virtual std::string class_name() const = 0;

  /// An EncodedBatch passes through unchanged (it is validated already; the model checks that it
  /// fits); anything else is encoded.
  [[nodiscard]] EncodedBatch seq_encode(py::handle data) const;
};

/// The batch behind data: an EncodedBatch's own, otherwise encoder.encode(data).
[[nodiscard]] AnyBatch batch_of(py::handle data, const DataEncoder& encoder);

// ---- distributions, estimators, accumulators ----------------------------------------------------

struct DistributionHandle {
  explicit DistributionHandle(AnyDistribution m) : any(std::move(m)) {}
  virtual ~DistributionHandle() = default;
  AnyDistribution any;
};
template <class D>
struct DistributionOf final : DistributionHandle {
  using DistributionHandle::DistributionHandle;
  [[nodiscard]] const D& model() const { return *any.get_if<D>(); }
};

struct EstimatorHandle {
  EstimatorHandle(AnyEstimator e, py::object pseudo)
      : any(std::move(e)), pseudo_count(std::move(pseudo)) {}
  virtual ~EstimatorHandle() = default;
  AnyEstimator any;
  py::object pseudo_count;
};
template <class E>
struct EstimatorOf final : EstimatorHandle {
  using EstimatorHandle::EstimatorHandle;
  [[nodiscard]] const E& estimator() const { return *any.get_if<E>(); }
};

class AccumulatorHandle {
 public:
  AccumulatorHandle(AnyAccumulator root, py::object name)
      : root_(std::make_shared<AnyAccumulator>(std::move(root))), name_(std::move(name)) {}
  virtual ~AccumulatorHandle() = default;
  /// This site (resolved from the root on every call, so it stays valid when a parent replaces its
  /// children).
  [[nodiscard]] AnyAccumulator& get() const;
  /// The children of this site (Mixture components, Composite fields), as views into the same tree.
  [[nodiscard]] std::vector<AccumulatorHandle> children() const;
  [[nodiscard]] const py::object& name() const noexcept { return name_; }

 private:
  std::shared_ptr<AnyAccumulator> root_;
  std::vector<size_t> path_;
  py::object name_ = py::none();
};
template <class A>
struct AccumulatorOf final : AccumulatorHandle {
  explicit AccumulatorOf(AccumulatorHandle h) : AccumulatorHandle(std::move(h)) {}
  [[nodiscard]] A& acc() const { return *get().template get_if<A>(); }
};

struct FactoryHandle {
  FactoryHandle(AnyAccumulator proto, py::object nm)
      : prototype(std::move(proto)), name(std::move(nm)) {}
  virtual ~FactoryHandle() = default;
  AnyAccumulator prototype;
  py::object name;
};
template <class A>
struct FactoryOf final : FactoryHandle {
  using FactoryHandle::FactoryHandle;
  [[nodiscard]] const A& acc() const { return *prototype.template get_if<A>(); }
};

// ---- the family table (families.cpp) ------------------------------------------------------------

/// A family's Python classes and encoder, found by the C++ type that a type-erased handle holds (never by a chain
/// of casts). Each family's binding file registers its entry once (python_family below, register_python_family).
struct PythonFamily {
  py::object (*distribution)(AnyDistribution model) = nullptr;
  py::object (*estimator)(AnyEstimator estimator, py::object pseudo_count) = nullptr;
  py::object (*accumulator)(AccumulatorHandle site) = nullptr;
  /// The family's accumulator factory class; null: the generic AccumulatorFactory.
  py::object (*factory)(AnyAccumulator prototype, py::object name) = nullptr;
  std::shared_ptr<DataEncoder> (*model_encoder)(const AnyDistribution& model) = nullptr;
  std::shared_ptr<DataEncoder> (*accumulator_encoder)(const AnyAccumulator& acc) = nullptr;
  /// A combinator's value() tuple around its children's values (a leaf's is its flat fields: null).
  py::object (*value_out)(const AnyAccumulator& acc, py::tuple children) = nullptr;
  /// The inverse: appends the combinator's own numbers of `value` to `out` and returns its children's values.
  py::tuple (*value_in)(py::handle value, const AnyAccumulator& like, std::string_view where,
                        std::vector<double>& out) = nullptr;
  /// A leaf whose statistics carry an optimizer state (docs/mechanisms.md#variational-embedding-attention): its value()
  /// tuple ends with it.
  std::shared_ptr<const AttentionOptimizerState> (*state_of)(const AnyAccumulator& acc) = nullptr;
  void (*set_state)(AnyAccumulator& acc, std::shared_ptr<const AttentionOptimizerState> state) = nullptr;
};

/// The items of a statistics tuple (or list) of exactly `arity` entries, described by `layout` in messages.
/// @throws TypeError for another kind of object, ValueError for another number of entries.
[[nodiscard]] py::tuple statistics_tuple(py::handle value, size_t arity, std::string_view where,
                                         const std::string& layout);

/// Registers a family's entry under the types of its distribution, estimator and accumulator.
void register_python_family(const std::type_info& distribution, const std::type_info& estimator,
                            const std::type_info& accumulator, const PythonFamily& family);

/// The standard entry of a leaf family: DistributionOf<D>, EstimatorOf<E>, AccumulatorOf<A>, FactoryOf<A>, and the
/// Python encoder `Encoder` built from the model's or accumulator's encoder().
template <class D, class E, class A, class Encoder>
void register_leaf_family(PythonFamily extra = {}) {
  PythonFamily f = extra;
  f.distribution = [](AnyDistribution m) { return py::cast(DistributionOf<D>(std::move(m))); };
  f.estimator = [](AnyEstimator e, py::object pseudo) { return py::cast(EstimatorOf<E>(std::move(e), std::move(pseudo))); };
  f.accumulator = [](AccumulatorHandle site) { return py::cast(AccumulatorOf<A>(std::move(site))); };
  f.factory = [](AnyAccumulator prototype, py::object name) {
    return py::cast(FactoryOf<A>(std::move(prototype), std::move(name)));
  };
  f.model_encoder = [](const AnyDistribution& m) -> std::shared_ptr<DataEncoder> {
    return std::make_shared<Encoder>(m.get_if<D>()->encoder());
  };
  f.accumulator_encoder = [](const AnyAccumulator& a) -> std::shared_ptr<DataEncoder> {
    return std::make_shared<Encoder>(a.get_if<A>()->encoder());
  };
  register_python_family(typeid(D), typeid(E), typeid(A), f);
}

/// The Python object of a model (its family's class). @throws TypeError for a family without a
/// Python class.
[[nodiscard]] py::object wrap_distribution(AnyDistribution model);
[[nodiscard]] py::object wrap_estimator(AnyEstimator estimator, py::object pseudo_count);
[[nodiscard]] py::object wrap_accumulator(AccumulatorHandle site);
[[nodiscard]] py::object wrap_factory(AnyAccumulator prototype, py::object name);
/// The encoder of a model's data (dist_to_encoder) and of an accumulator's data (acc_to_encoder).
[[nodiscard]] std::shared_ptr<DataEncoder> encoder_of(const AnyDistribution& model);
[[nodiscard]] std::shared_ptr<DataEncoder> encoder_of(const AnyAccumulator& acc);
/// value(): the statistics as the family's tuple of numpy arrays (docs/mechanisms.md#building-blocks layouts), deep
/// copies.
[[nodiscard]] py::object statistics_to_python(const AnyAccumulator& acc);
/// The statistics of `value` (arity and exact shapes checked here, entries and mass laws by the
/// library) in a copy of `like`'s layout. @throws TypeError / ValueError.
[[nodiscard]] AnyAccumulator statistics_from_python(py::handle value, const AnyAccumulator& like,
                                                    std::string_view where);

}  // namespace attnmix::python
