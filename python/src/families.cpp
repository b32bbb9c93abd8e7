// SPDX-License-Identifier: Apache-2.0
// The family table of the bindings (roles.hpp): which Python class, encoder and statistics tuple
// belong to a type-erased model, estimator or accumulator. Adding a family to the Python module
// means one branch per function here, plus its classes in a bind_*.cpp file.
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stats/categorical.hpp"
#include "attnmix/stats/composite.hpp"
#include "attnmix/stats/gaussian.hpp"
#include "attnmix/stats/mixture.hpp"
#include "bindings.hpp"
#include "convert.hpp"
#include "encoders.hpp"
#include "roles.hpp"

namespace attnmix::python {

using RaAccumulator = ResponsibilityAttentionAccumulator;
using CaAccumulator = ChainedAttentionAccumulator;
using VeaAccumulator = VariationalEmbeddingAttentionAccumulator;
using VmhaAccumulator = VariationalMultiHopAttentionAccumulator;

namespace {

/// The children of a combinator's accumulator (empty for a leaf).
std::span<AnyAccumulator> children_of(AnyAccumulator& acc) {
  if (auto* mixture = acc.get_if<MixtureAccumulator>()) return mixture->children();
  if (auto* composite = acc.get_if<CompositeAccumulator>()) return composite->children();
  return {};
}

/// Calls f(leaf) with the concrete leaf accumulator (a FlatAccumulator family), const when `acc`
/// is; false for combinators.
template <class Any, class F>
bool with_leaf(Any& acc, F&& f) {
  if (auto* a = acc.template get_if<RaAccumulator>()) return f(*a), true;
  if (auto* a = acc.template get_if<CaAccumulator>()) return f(*a), true;
  if (auto* a = acc.template get_if<VeaAccumulator>()) return f(*a), true;
  if (auto* a = acc.template get_if<VmhaAccumulator>()) return f(*a), true;
  if (auto* a = acc.template get_if<CategoricalAccumulator>()) return f(*a), true;
  if (auto* a = acc.template get_if<DiagonalGaussianAccumulator>()) return f(*a), true;
  return false;
}

/// Leaves whose statistics carry an optimizer state (SPEC.md §4.3): their value() tuple ends with
/// it (an AttentionOptimizerState or None), after the flat fields.
template <class A>
constexpr bool kCarriesState = requires(const A& a) {
  a.optimizer_state();
};

using StateList = std::vector<std::shared_ptr<const AttentionOptimizerState>>;

[[noreturn]] void unknown_family(std::string_view what) {
  throw TypeError(std::string("attnmix: ") + std::string(what) +
                  " of a family that has no Python class");
}

/// The items of a statistics tuple of exactly `arity` entries (a list is accepted too).
std::vector<py::object> statistic_items(py::handle value, size_t arity, std::string_view where,
                                        const std::string& layout) {
  if (!(PyTuple_Check(value.ptr()) || PyList_Check(value.ptr())))
    throw TypeError(std::string(where) + ": statistics must be a tuple (" + layout + "), got " +
                    type_name(value));
  const size_t n = py::len(value);
  if (n != arity)
    throw ValueError(std::string(where) + ": statistics must be a tuple of " +
                     std::to_string(arity) + " entries (" + layout + "), got " + std::to_string(n));
  std::vector<py::object> out;
  for (const py::handle item : py::reinterpret_borrow<py::sequence>(value))
    out.push_back(py::reinterpret_borrow<py::object>(item));
  return out;
}

/// Appends the flat statistics of `value`, laid out like `like`, to out (SPEC.md §1.3 order), and
/// the optimizer states of its stateful leaves, depth first, to states.
void flatten_statistics(py::handle value, const AnyAccumulator& like, std::string_view where,
                        std::vector<double>& out, StateList& states) {
  const bool leaf = with_leaf(like, [&](const auto& acc) {
    constexpr bool stateful = kCarriesState<std::remove_cvref_t<decltype(acc)>>;
    const auto& fields = acc.layout().fields();
    std::string layout = acc.layout().describe();
    if (stateful) layout += ", optimizer_state or None";
    const std::vector<py::object> items =
        statistic_items(value, fields.size() + (stateful ? 1 : 0), where, layout);
    for (size_t i = 0; i < fields.size(); ++i)
      reals_of_shape(items[i], fields[i].shape, where, fields[i].name, out);
    if constexpr (stateful)
      states.push_back(optimizer_state_from_python(items.back(), where, "optimizer_state"));
  });
  if (leaf) return;
  if (const auto* mixture = like.get_if<MixtureAccumulator>()) {
    const size_t K = mixture->components().size();
    const std::vector<py::object> items = statistic_items(
        value, 2, where, "comp_count (" + std::to_string(K) + ",), (component statistics ...)");
    reals_of_shape(items[0], {static_cast<Index>(K)}, where, "comp_count", out);
    const std::vector<py::object> children =
        statistic_items(items[1], K, where, std::to_string(K) + " component statistics");
    for (size_t k = 0; k < K; ++k)
      flatten_statistics(children[k], mixture->components()[k], where, out, states);
    return;
  }
  if (const auto* composite = like.get_if<CompositeAccumulator>()) {
    const size_t F = composite->components().size();
    const std::vector<py::object> children =
        statistic_items(value, F, where, std::to_string(F) + " field statistics");
    for (size_t f = 0; f < F; ++f)
      flatten_statistics(children[f], composite->components()[f], where, out, states);
    return;
  }
  unknown_family("statistics");
}

/// Attaches states (from flatten_statistics) to the stateful leaves of acc, depth first.
void attach_states(AnyAccumulator& acc, const StateList& states, size_t& next) {
  const bool leaf = with_leaf(acc, [&](auto& a) {
    if constexpr (kCarriesState<std::remove_cvref_t<decltype(a)>>)
      a.set_optimizer_state(states.at(next++));
  });
  if (leaf) return;
  for (AnyAccumulator& child : children_of(acc)) attach_states(child, states, next);
}

}  // namespace

// ---- accumulator sites --------------------------------------------------------------------------

AnyAccumulator& AccumulatorHandle::get() const {
  AnyAccumulator* site = root_.get();
  for (size_t k : path_) {
    const std::span<AnyAccumulator> children = children_of(*site);
    ATTNMIX_ASSERT(k < children.size(), "accumulator view: the child index is out of range");
    site = &children[k];
  }
  return *site;
}

std::vector<AccumulatorHandle> AccumulatorHandle::children() const {
  std::vector<AccumulatorHandle> out;
  const size_t n = children_of(get()).size();
  for (size_t k = 0; k < n; ++k) {
    AccumulatorHandle child = *this;
    child.path_.push_back(k);
    child.name_ = py::none();
    out.push_back(std::move(child));
  }
  return out;
}

// ---- Python objects of type-erased handles ------------------------------------------------------

py::object wrap_distribution(AnyDistribution m) {
  if (m.get_if<ResponsibilityAttention>())
    return py::cast(DistributionOf<ResponsibilityAttention>(std::move(m)));
  if (m.get_if<ChainedAttention>()) return py::cast(DistributionOf<ChainedAttention>(std::move(m)));
  if (m.get_if<VariationalEmbeddingAttention>())
    return py::cast(DistributionOf<VariationalEmbeddingAttention>(std::move(m)));
  if (m.get_if<VariationalMultiHopAttention>())
    return py::cast(DistributionOf<VariationalMultiHopAttention>(std::move(m)));
  if (m.get_if<Mixture>()) return py::cast(DistributionOf<Mixture>(std::move(m)));
  if (m.get_if<Composite>()) return py::cast(DistributionOf<Composite>(std::move(m)));
  if (m.get_if<Categorical>()) return py::cast(DistributionOf<Categorical>(std::move(m)));
  if (m.get_if<DiagonalGaussian>()) return py::cast(DistributionOf<DiagonalGaussian>(std::move(m)));
  unknown_family("a model");
}

py::object wrap_estimator(AnyEstimator e, py::object pseudo_count) {
  if (e.get_if<ResponsibilityAttentionEstimator>())
    return py::cast(
        EstimatorOf<ResponsibilityAttentionEstimator>(std::move(e), std::move(pseudo_count)));
  if (e.get_if<ChainedAttentionEstimator>())
    return py::cast(EstimatorOf<ChainedAttentionEstimator>(std::move(e), std::move(pseudo_count)));
  if (e.get_if<VariationalEmbeddingAttentionEstimator>())
    return py::cast(
        EstimatorOf<VariationalEmbeddingAttentionEstimator>(std::move(e), std::move(pseudo_count)));
  if (e.get_if<VariationalMultiHopAttentionEstimator>())
    return py::cast(
        EstimatorOf<VariationalMultiHopAttentionEstimator>(std::move(e), std::move(pseudo_count)));
  if (e.get_if<MixtureEstimator>())
    return py::cast(EstimatorOf<MixtureEstimator>(std::move(e), std::move(pseudo_count)));
  if (e.get_if<CompositeEstimator>())
    return py::cast(EstimatorOf<CompositeEstimator>(std::move(e), std::move(pseudo_count)));
  if (e.get_if<CategoricalEstimator>())
    return py::cast(EstimatorOf<CategoricalEstimator>(std::move(e), std::move(pseudo_count)));
  if (e.get_if<DiagonalGaussianEstimator>())
    return py::cast(EstimatorOf<DiagonalGaussianEstimator>(std::move(e), std::move(pseudo_count)));
  unknown_family("an estimator");
}

py::object wrap_accumulator(AccumulatorHandle site) {
  const AnyAccumulator& a = site.get();
  if (a.get_if<RaAccumulator>()) return py::cast(AccumulatorOf<RaAccumulator>(std::move(site)));
  if (a.get_if<CaAccumulator>()) return py::cast(AccumulatorOf<CaAccumulator>(std::move(site)));
  if (a.get_if<VeaAccumulator>()) return py::cast(AccumulatorOf<VeaAccumulator>(std::move(site)));
  if (a.get_if<VmhaAccumulator>()) return py::cast(AccumulatorOf<VmhaAccumulator>(std::move(site)));
  if (a.get_if<MixtureAccumulator>())
    return py::cast(AccumulatorOf<MixtureAccumulator>(std::move(site)));
  if (a.get_if<CompositeAccumulator>())
    return py::cast(AccumulatorOf<CompositeAccumulator>(std::move(site)));
  if (a.get_if<CategoricalAccumulator>())
    return py::cast(AccumulatorOf<CategoricalAccumulator>(std::move(site)));
  if (a.get_if<DiagonalGaussianAccumulator>())
    return py::cast(AccumulatorOf<DiagonalGaussianAccumulator>(std::move(site)));
  unknown_family("an accumulator");
}

py::object wrap_factory(AnyAccumulator prototype, py::object name) {
  if (prototype.get_if<RaAccumulator>())
    return py::cast(FactoryOf<RaAccumulator>(std::move(prototype), std::move(name)));
  if (prototype.get_if<CaAccumulator>())
    return py::cast(FactoryOf<CaAccumulator>(std::move(prototype), std::move(name)));
  if (prototype.get_if<VeaAccumulator>())
    return py::cast(FactoryOf<VeaAccumulator>(std::move(prototype), std::move(name)));
  if (prototype.get_if<VmhaAccumulator>())
    return py::cast(FactoryOf<VmhaAccumulator>(std::move(prototype), std::move(name)));
  return py::cast(FactoryHandle(std::move(prototype), std::move(name)));
}

// ---- encoders -----------------------------------------------------------------------------------

std::shared_ptr<DataEncoder> encoder_of(const AnyDistribution& m) {
  if (const auto* ra = m.get_if<ResponsibilityAttention>())
    return std::make_shared<ResponsibilityAttentionDataEncoderPy>(ra->encoder());
  if (const auto* ca = m.get_if<ChainedAttention>())
    return std::make_shared<ChainedAttentionDataEncoderPy>(ca->encoder());
  if (const auto* vea = m.get_if<VariationalEmbeddingAttention>())
    return std::make_shared<VariationalEmbeddingAttentionDataEncoderPy>(vea->encoder());
  if (const auto* vmha = m.get_if<VariationalMultiHopAttention>())
    return std::make_shared<VariationalMultiHopAttentionDataEncoderPy>(vmha->encoder());
  if (const auto* mixture = m.get_if<Mixture>())
    return std::make_shared<MixtureDataEncoderPy>(encoder_of(mixture->components().front()));
  if (const auto* composite = m.get_if<Composite>()) {
    std::vector<std::shared_ptr<DataEncoder>> fields;
    for (const AnyDistribution& c : composite->components()) fields.push_back(encoder_of(c));
    return std::make_shared<CompositeDataEncoderPy>(std::move(fields));
  }
  if (const auto* categorical = m.get_if<Categorical>())
    return std::make_shared<CategoricalDataEncoderPy>(categorical->encoder());
  if (const auto* gaussian = m.get_if<DiagonalGaussian>())
    return std::make_shared<DiagonalGaussianDataEncoderPy>(gaussian->encoder());
  unknown_family("the encoder of a model");
}

std::shared_ptr<DataEncoder> encoder_of(const AnyAccumulator& acc) {
  if (const auto* ra = acc.get_if<RaAccumulator>())
    return std::make_shared<ResponsibilityAttentionDataEncoderPy>(ra->encoder());
  if (const auto* ca = acc.get_if<CaAccumulator>())
    return std::make_shared<ChainedAttentionDataEncoderPy>(ca->encoder());
  if (const auto* vea = acc.get_if<VeaAccumulator>())
    return std::make_shared<VariationalEmbeddingAttentionDataEncoderPy>(vea->encoder());
  if (const auto* vmha = acc.get_if<VmhaAccumulator>())
    return std::make_shared<VariationalMultiHopAttentionDataEncoderPy>(vmha->encoder());
  if (const auto* mixture = acc.get_if<MixtureAccumulator>())
    return std::make_shared<MixtureDataEncoderPy>(encoder_of(mixture->components().front()));
  if (const auto* composite = acc.get_if<CompositeAccumulator>()) {
    std::vector<std::shared_ptr<DataEncoder>> fields;
    for (const AnyAccumulator& c : composite->components()) fields.push_back(encoder_of(c));
    return std::make_shared<CompositeDataEncoderPy>(std::move(fields));
  }
  if (const auto* categorical = acc.get_if<CategoricalAccumulator>())
    return std::make_shared<CategoricalDataEncoderPy>(categorical->encoder());
  if (const auto* gaussian = acc.get_if<DiagonalGaussianAccumulator>())
    return std::make_shared<DiagonalGaussianDataEncoderPy>(gaussian->encoder());
  unknown_family("the encoder of an accumulator");
}

// ---- statistics tuples --------------------------------------------------------------------------

py::object statistics_to_python(const AnyAccumulator& acc) {
  py::object out;
  const bool leaf = with_leaf(acc, [&](const auto& a) {
    constexpr bool stateful = kCarriesState<std::remove_cvref_t<decltype(a)>>;
    const auto& fields = a.layout().fields();
    py::tuple values(fields.size() + (stateful ? 1 : 0));
    for (size_t i = 0; i < fields.size(); ++i) {
      const double* p = a.flat().data() + fields[i].offset;
      values[i] = fields[i].shape.empty() ? py::object(py::float_(*p))
                                          : py::object(copy_reals(p, fields[i].shape));
    }
    if constexpr (stateful) values[fields.size()] = optimizer_state_to_python(a.optimizer_state());
    out = std::move(values);
  });
  if (leaf) return out;
  if (const auto* mixture = acc.get_if<MixtureAccumulator>()) {
    py::tuple children(mixture->components().size());
    for (size_t k = 0; k < mixture->components().size(); ++k)
      children[k] = statistics_to_python(mixture->components()[k]);
    const Vector& counts = mixture->comp_count();
    return py::make_tuple(copy_reals(counts.data(), {counts.size()}), children);
  }
  if (const auto* composite = acc.get_if<CompositeAccumulator>()) {
    py::tuple children(composite->components().size());
    for (size_t f = 0; f < composite->components().size(); ++f)
      children[f] = statistics_to_python(composite->components()[f]);
    return children;
  }
  unknown_family("statistics");
}

AnyAccumulator statistics_from_python(py::handle value, const AnyAccumulator& like,
                                      std::string_view where) {
  std::vector<double> flat;
  flat.reserve(static_cast<size_t>(like.flat_size()));
  StateList states;
  flatten_statistics(value, like, where, flat, states);
  AnyAccumulator out = like;
  out.unpack(flat);  // validates finiteness, counts >= 0 and the mass laws; atomic
  size_t next = 0;
  attach_states(out, states, next);  // the value's own states (None included), not like's
  return out;
}

}  // namespace attnmix::python
