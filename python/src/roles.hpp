// SPDX-License-Identifier: Apache-2.0
/// @file roles.hpp
/// The C++ objects behind the Python role classes (SPEC.md §1.1) and the family dispatch between
/// them.
///
/// Every Python distribution, estimator and accumulator holds the library's type-erased handle
/// (STYLE.md §4), so Mixture and Composite take components of any family and one set of generic
/// methods (bind_core.cpp) serves all families. Each family has its own Python class, i.e. its own
/// C++ type: DistributionOf<D>, EstimatorOf<E>, AccumulatorOf<A>. families.cpp is the one place
/// that maps a type-erased handle to its family's Python class, encoder and statistics tuple.
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
#include <vector>

#include "attnmix/core/any.hpp"

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

/// Turns Python data into a batch of one family (SPEC.md §1.1 "Data encoder").
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

/// The Python object of a model (its family's class). @throws TypeError for a family without a
/// Python class.
[[nodiscard]] py::object wrap_distribution(AnyDistribution model);
[[nodiscard]] py::object wrap_estimator(AnyEstimator estimator, py::object pseudo_count);
[[nodiscard]] py::object wrap_accumulator(AccumulatorHandle site);
[[nodiscard]] py::object wrap_factory(AnyAccumulator prototype, py::object name);
/// The encoder of a model's data (dist_to_encoder) and of an accumulator's data (acc_to_encoder).
[[nodiscard]] std::shared_ptr<DataEncoder> encoder_of(const AnyDistribution& model);
[[nodiscard]] std::shared_ptr<DataEncoder> encoder_of(const AnyAccumulator& acc);
/// value(): the statistics as the family's tuple of numpy arrays (SPEC.md §1.3 layouts), deep
/// copies.
[[nodiscard]] py::object statistics_to_python(const AnyAccumulator& acc);
/// The statistics of `value` (arity and exact shapes checked here, entries and mass laws by the
/// library) in a copy of `like`'s layout. @throws TypeError / ValueError.
[[nodiscard]] AnyAccumulator statistics_from_python(py::handle value, const AnyAccumulator& like,
                                                    std::string_view where);

}  // namespace attnmix::python
