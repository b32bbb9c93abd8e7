// SPDX-License-Identifier: Apache-2.0
// The family table of the bindings (roles.hpp): the Python class, encoder and statistics tuple of a type-erased
// model, estimator or accumulator, from the entries the families register by C++ type (register_python_family).
// A leaf's value() tuple is its flat statistics fields in layout order (and, for a family that carries one, its
// optimizer state); a combinator's is what its entry makes of its children's.
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <typeindex>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "bindings.hpp"
#include "convert.hpp"
#include "encoders.hpp"
#include "roles.hpp"

namespace attnmix::python {

namespace {

std::map<std::type_index, const PythonFamily*>& entries() {
  static std::map<std::type_index, const PythonFamily*> table;
  return table;
}

[[noreturn]] void unknown_family(std::string_view what) {
  throw TypeError(std::string("attnmix: ") + std::string(what) + " of a family that has no Python class");
}

const PythonFamily& family_of(const std::type_info& type, std::string_view what) {
  const auto it = entries().find(type);
  if (it == entries().end()) unknown_family(what);
  return *it->second;
}

using StateList = std::vector<std::shared_ptr<const AttentionOptimizerState>>;

/// Appends the flat statistics of `value`, laid out like `like`, to out (docs/mechanisms.md#building-blocks order), and
/// the optimizer states of its stateful leaves, depth first, to states.
void flatten_statistics(py::handle value, const AnyAccumulator& like, std::string_view where,
                        std::vector<double>& out, StateList& states) {
  const PythonFamily& family = family_of(like.type(), "statistics");
  if (const FlatStats* leaf = like.flat_stats()) {
    const bool stateful = family.state_of != nullptr;
    const auto& fields = leaf->layout().fields();
    std::string layout = leaf->layout().describe();
    if (stateful) layout += ", optimizer_state (a dict or an AttentionOptimizerState) or None";
    const py::tuple items = statistics_tuple(value, fields.size() + (stateful ? 1 : 0), where, layout);
    for (size_t i = 0; i < fields.size(); ++i) reals_of_shape(items[i], fields[i].shape, where, fields[i].name, out);
    if (stateful) states.push_back(optimizer_state_from_python(items[fields.size()], where, "optimizer_state"));
    return;
  }
  const py::tuple children = family.value_in(value, like, where, out);
  const std::span<const AnyAccumulator> likes = like.children();
  for (size_t k = 0; k < likes.size(); ++k) flatten_statistics(children[k], likes[k], where, out, states);
}

/// Attaches states (from flatten_statistics) to the stateful leaves of acc, depth first.
void attach_states(AnyAccumulator& acc, const StateList& states, size_t& next) {
  if (acc.flat_stats()) {
    if (const PythonFamily& family = family_of(acc.type(), "statistics"); family.set_state)
      family.set_state(acc, states.at(next++));
    return;
  }
  for (AnyAccumulator& child : acc.children()) attach_states(child, states, next);
}

}  // namespace

py::tuple statistics_tuple(py::handle value, size_t arity, std::string_view where, const std::string& layout) {
  if (!(PyTuple_Check(value.ptr()) || PyList_Check(value.ptr())))
    throw TypeError(std::string(where) + ": statistics must be a tuple (" + layout + "), got " + type_name(value));
  const size_t n = py::len(value);
  if (n != arity)
    throw ValueError(std::string(where) + ": statistics must be a tuple of " + std::to_string(arity) + " entries (" +
                     layout + "), got " + std::to_string(n));
  return py::tuple(py::reinterpret_borrow<py::sequence>(value));
}

void register_python_family(const std::type_info& distribution, const std::type_info& estimator,
                            const std::type_info& accumulator, const PythonFamily& family) {
  static std::deque<PythonFamily> registered;  // as long as the module: the classes the entries make live as long
  registered.push_back(family);
  for (const std::type_info* type : {&distribution, &estimator, &accumulator}) entries()[*type] = &registered.back();
}

// ---- accumulator sites --------------------------------------------------------------------------

AnyAccumulator& AccumulatorHandle::get() const {
  AnyAccumulator* site = root_.get();
  for (size_t k : path_) {
    const std::span<AnyAccumulator> children = site->children();
    ATTNMIX_ASSERT(k < children.size(), "accumulator view: the child index is out of range");
    site = &children[k];
  }
  return *site;
}

std::vector<AccumulatorHandle> AccumulatorHandle::children() const {
  std::vector<AccumulatorHandle> out;
  const size_t n = get().children().size();
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
  const PythonFamily& family = family_of(m.type(), "a model");
  return family.distribution(std::move(m));
}

py::object wrap_estimator(AnyEstimator e, py::object pseudo_count) {
  const PythonFamily& family = family_of(e.type(), "an estimator");
  return family.estimator(std::move(e), std::move(pseudo_count));
}

py::object wrap_accumulator(AccumulatorHandle site) {
  const PythonFamily& family = family_of(site.get().type(), "an accumulator");
  return family.accumulator(std::move(site));
}

py::object wrap_factory(AnyAccumulator prototype, py::object name) {
  const PythonFamily& family = family_of(prototype.type(), "an accumulator factory");
  if (family.factory) return family.factory(std::move(prototype), std::move(name));
  return py::cast(FactoryHandle(std::move(prototype), std::move(name)));
}

// ---- encoders -----------------------------------------------------------------------------------

std::shared_ptr<DataEncoder> encoder_of(const AnyDistribution& m) {
  return family_of(m.type(), "the encoder of a model").model_encoder(m);
}

std::shared_ptr<DataEncoder> encoder_of(const AnyAccumulator& acc) {
  return family_of(acc.type(), "the encoder of an accumulator").accumulator_encoder(acc);
}

// ---- statistics tuples --------------------------------------------------------------------------

py::object statistics_to_python(const AnyAccumulator& acc) {
  const PythonFamily& family = family_of(acc.type(), "statistics");
  if (const FlatStats* leaf = acc.flat_stats()) {
    const auto& fields = leaf->layout().fields();
    const bool stateful = family.state_of != nullptr;
    py::tuple values(fields.size() + (stateful ? 1 : 0));
    for (size_t i = 0; i < fields.size(); ++i) {
      const double* p = leaf->flat().data() + fields[i].offset;
      values[i] = fields[i].shape.empty() ? py::object(py::float_(*p)) : py::object(copy_reals(p, fields[i].shape));
    }
    if (stateful) values[fields.size()] = optimizer_state_to_dict(family.state_of(acc));
    return values;
  }
  const std::span<const AnyAccumulator> children = acc.children();
  py::tuple values(children.size());
  for (size_t k = 0; k < children.size(); ++k) values[k] = statistics_to_python(children[k]);
  return family.value_out(acc, values);
}

AnyAccumulator statistics_from_python(py::handle value, const AnyAccumulator& like, std::string_view where) {
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
