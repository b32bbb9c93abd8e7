// SPDX-License-Identifier: Apache-2.0
/// @file encoders.hpp
/// The Python data encoders of every family (docs/mechanisms.md#building-blocks and docs/model-format.md): Python data
/// → the library's validated batch, through the conversion layer (convert.hpp) and the library's own encoders.
///
/// Accepted data (seq_encode):
///   responsibility attention  a list of (context, query, target) triples, or the fast path: a
///   tuple of numpy
///                             arrays (contexts (n, N) ids, queries (n, D) reals, targets (n,) ids)
///   chained attention         a list of (keys, values, query, target) observations, or the fast
///                             path: a tuple of numpy arrays (keys (n, N), values (n, N), queries
///                             (n,), targets (n,), all ids)
///   variational multi-hop     as chained attention (the same batch type, its own Python class)
///   variational embedding     a list of (context, query, target) triples of ids, or the fast path:
///                             a tuple of numpy arrays (contexts (n, N), queries (n,), targets
///                             (n,))
///   categorical               a list of ids or an (n,) array (also as the 1-tuple (ids,))
///   diagonal Gaussian         a list of vectors or an (n, D) array (also as the 1-tuple (values,))
///   mixture                   whatever its component encoder accepts
///   composite                 a list of F-tuples (one field per component), or a tuple of F
///   EncodedBatch objects
/// An EncodedBatch passes through every encoder unchanged (roles.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/stats/categorical.hpp"
#include "attnmix/stats/gaussian.hpp"
#include "convert.hpp"
#include "docstrings.hpp"
#include "roles.hpp"

namespace attnmix::python {

class ResponsibilityAttentionDataEncoderPy final : public DataEncoder {
 public:
  explicit ResponsibilityAttentionDataEncoderPy(ResponsibilityAttentionEncoder spec)
      : spec_(spec) {}
  [[nodiscard]] const ResponsibilityAttentionEncoder& spec() const noexcept { return spec_; }
  [[nodiscard]] AnyBatch encode(py::handle data) const override;
  [[nodiscard]] py::tuple parts(const AnyBatch& batch, py::handle owner) const override;
  [[nodiscard]] bool equals(const DataEncoder& other) const override;
  [[nodiscard]] std::string class_name() const override {
    return "ResponsibilityAttentionDataEncoder";
  }

 private:
  ResponsibilityAttentionEncoder spec_;
};

/// Chained attention's encoder; variational multi-hop attention derives from it (same observations
/// and batch, another Python class). Two encoders are equal only when of the same class.
class ChainedAttentionDataEncoderPy : public DataEncoder {
 public:
  explicit ChainedAttentionDataEncoderPy(ChainedAttentionEncoder spec) : spec_(spec) {}
  [[nodiscard]] const ChainedAttentionEncoder& spec() const noexcept { return spec_; }
  [[nodiscard]] AnyBatch encode(py::handle data) const override;
  [[nodiscard]] py::tuple parts(const AnyBatch& batch, py::handle owner) const override;
  [[nodiscard]] bool equals(const DataEncoder& other) const override;
  [[nodiscard]] std::string class_name() const override { return "ChainedAttentionDataEncoder"; }

 private:
  ChainedAttentionEncoder spec_;
};

class VariationalMultiHopAttentionDataEncoderPy final : public ChainedAttentionDataEncoderPy {
 public:
  using ChainedAttentionDataEncoderPy::ChainedAttentionDataEncoderPy;
  [[nodiscard]] std::string class_name() const override {
    return "VariationalMultiHopAttentionDataEncoder";
  }
};

class VariationalEmbeddingAttentionDataEncoderPy final : public DataEncoder {
 public:
  explicit VariationalEmbeddingAttentionDataEncoderPy(VariationalEmbeddingAttentionEncoder spec)
      : spec_(spec) {}
  [[nodiscard]] const VariationalEmbeddingAttentionEncoder& spec() const noexcept { return spec_; }
  [[nodiscard]] AnyBatch encode(py::handle data) const override;
  [[nodiscard]] py::tuple parts(const AnyBatch& batch, py::handle owner) const override;
  [[nodiscard]] bool equals(const DataEncoder& other) const override;
  [[nodiscard]] std::string class_name() const override {
    return "VariationalEmbeddingAttentionDataEncoder";
  }

 private:
  VariationalEmbeddingAttentionEncoder spec_;
};

class CategoricalDataEncoderPy final : public DataEncoder {
 public:
  explicit CategoricalDataEncoderPy(CategoricalEncoder spec) : spec_(spec) {}
  [[nodiscard]] const CategoricalEncoder& spec() const noexcept { return spec_; }
  [[nodiscard]] AnyBatch encode(py::handle data) const override;
  [[nodiscard]] py::tuple parts(const AnyBatch& batch, py::handle owner) const override;
  [[nodiscard]] bool equals(const DataEncoder& other) const override;
  [[nodiscard]] std::string class_name() const override { return "CategoricalDataEncoder"; }

 private:
  CategoricalEncoder spec_;
};

class DiagonalGaussianDataEncoderPy final : public DataEncoder {
 public:
  explicit DiagonalGaussianDataEncoderPy(DiagonalGaussianEncoder spec) : spec_(spec) {}
  [[nodiscard]] const DiagonalGaussianEncoder& spec() const noexcept { return spec_; }
  [[nodiscard]] AnyBatch encode(py::handle data) const override;
  [[nodiscard]] py::tuple parts(const AnyBatch& batch, py::handle owner) const override;
  [[nodiscard]] bool equals(const DataEncoder& other) const override;
  [[nodiscard]] std::string class_name() const override { return "DiagonalGaussianDataEncoder"; }

 private:
  DiagonalGaussianEncoder spec_;
};

/// A mixture's rows are its components' rows: the component encoder does the work.
class MixtureDataEncoderPy final : public DataEncoder {
 public:
  explicit MixtureDataEncoderPy(std::shared_ptr<DataEncoder> component)
      : component_(std::move(component)) {}
  [[nodiscard]] const std::shared_ptr<DataEncoder>& component() const noexcept {
    return component_;
  }
  [[nodiscard]] AnyBatch encode(py::handle data) const override { return component_->encode(data); }
  [[nodiscard]] py::tuple parts(const AnyBatch& batch, py::handle owner) const override {
    return component_->parts(batch, owner);
  }
  [[nodiscard]] bool equals(const DataEncoder& other) const override;
  [[nodiscard]] std::string class_name() const override { return "MixtureDataEncoder"; }

 private:
  std::shared_ptr<DataEncoder> component_;
};

/// One encoder per field of a tuple observation.
class CompositeDataEncoderPy final : public DataEncoder {
 public:
  explicit CompositeDataEncoderPy(std::vector<std::shared_ptr<DataEncoder>> fields)
      : fields_(std::move(fields)) {}
  [[nodiscard]] const std::vector<std::shared_ptr<DataEncoder>>& fields() const noexcept {
    return fields_;
  }
  [[nodiscard]] AnyBatch encode(py::handle data) const override;
  [[nodiscard]] py::tuple parts(const AnyBatch& batch, py::handle owner) const override;
  [[nodiscard]] bool equals(const DataEncoder& other) const override;
  [[nodiscard]] std::string class_name() const override { return "CompositeDataEncoder"; }

 private:
  std::vector<std::shared_ptr<DataEncoder>> fields_;
};

/// One size a data encoder may declare: its keyword (also the attribute), the spec's member and the attribute's
/// docstring.
template <class Spec>
struct DeclaredSize {
  const char* name;
  std::optional<int64_t> Spec::*member;
  const char* doc;
};

namespace detail {
template <class Class, class Spec, size_t... I>
void def_declared_sizes(Class& cls, const char* where, std::array<DeclaredSize<Spec>, sizeof...(I)> sizes,
                        std::index_sequence<I...>) {
  using Encoder = typename Class::type;
  cls.def(py::init([where, sizes](decltype((void)I, py::object())... declared) {
            Spec spec;
            ((spec.*(sizes[I].member) = optional_positive_int(declared, where, sizes[I].name)), ...);
            return std::make_shared<Encoder>(std::move(spec));
          }),
          py::arg_v(sizes[I].name, py::none())...);
  (cls.def_property_readonly(
       sizes[I].name,
       [member = sizes[I].member](const Encoder& e) -> py::object {
         const std::optional<int64_t>& size = e.spec().*member;
         return size ? py::object(py::int_(*size)) : py::none();
       },
       sizes[I].doc),
   ...);
}
}  // namespace detail

/// The constructor and attributes of a data encoder class whose spec is its declared sizes: __init__ takes each size
/// as a keyword (positional too, in this order; None or a positive int: undeclared sizes are taken from the data),
/// and each is a read-only attribute (an int, or None).
template <class Class, class Spec, size_t K>
void def_declared_sizes(Class& cls, const char* where, const std::array<DeclaredSize<Spec>, K>& sizes) {
  detail::def_declared_sizes(cls, where, sizes, std::make_index_sequence<K>{});
}

/// The declared sizes of chained attention's data, shared by the variational multi-hop encoder (the same rows).
inline constexpr std::array<DeclaredSize<ChainedAttentionEncoder>, 2> kChainedSizes{
    {{"num_symbols", &ChainedAttentionEncoder::n_symbols, doc::kEncoderNumSymbols},
     {"num_targets", &ChainedAttentionEncoder::n_targets, doc::kEncoderNumTargets}}};

/// One RA observation as the reference returns it: (context int64 (N,), query float64 (D,), int
/// target).
[[nodiscard]] py::tuple ra_observation(const int64_t* context, Index N, const double* query,
                                       Index D, int64_t target);

/// One CA (and variational multi-hop) observation: (keys int64 (N,), values int64 (N,), int query, int target).
[[nodiscard]] py::tuple ca_observation(const ChainedAttentionObservation& obs);

/// One VEA observation: (context int64 (N,), int query, int target).
[[nodiscard]] py::tuple vea_observation(const VariationalEmbeddingAttentionObservation& obs);

}  // namespace attnmix::python
