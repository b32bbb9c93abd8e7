// SPDX-License-Identifier: Apache-2.0
/// @file estimator_class.hpp
/// A family's Python estimator, accumulator and accumulator-factory classes, generated from its descriptor
/// (family/spec.hpp), so that the family's option table is the one source of their keywords, defaults, checks and
/// attributes (the CLI's flags come from the same table):
///   XEstimator(<the sizes its models fix, positional or by keyword>, *, [rows,] <options>=<defaults>, [seed=0],
///              pseudo_count=None, name=None, keys=None)
///   XAccumulator(<sizes>, <the options that shape its statistics>=<defaults>, keys=None, name=None, [*, rows]), and
///   XAccumulatorFactory with the same arguments: the statistics the estimator of those settings accumulates
/// with one read-only attribute per size, option, seed (families with a Monte-Carlo objective), name and keys; an
/// accumulator also has one per field of its statistics (key_sum, …, ll, n: copies, as the reference's attributes).
/// `rows` (required) are the training rows of a family whose statistics take their shape from them
/// (FitSpec::shaped_by_data: the cells of sparse tables).
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <type_traits>

#include "attnmix/family/spec.hpp"
#include "roles.hpp"

namespace attnmix::python {

/// The batch of the training rows `data` (anything the family's encoder of these sizes accepts, or an EncodedBatch) of
/// a family whose statistics take their shape from them (FitSpec::shaped_by_data): its classes' `rows` argument.
/// @throws TypeError / ValueError naming the rows.
using RowsEncoder = AnyBatch (*)(py::handle data, const Dims& sizes);

/// An estimator or accumulator constructor call: its settings (sizes, options, seed, name, keys), its pseudo_count,
/// and the rows that settings.rows points to (families shaped by their data).
struct ConstructorCall {
  EstimatorSettings settings;
  py::object pseudo_count = py::none();
  std::shared_ptr<const AnyBatch> rows;
};

/// The estimator constructor call of `args` and `kwargs`.
/// @throws TypeError (a missing, repeated or unknown argument, a value of the wrong type) or ValueError (a value the
///         option's check refuses), naming `where` and the argument.
[[nodiscard]] ConstructorCall estimator_call(const FamilySpec& family, RowsEncoder rows, const std::string& where,
                                             const py::args& args, const py::kwargs& kwargs);

/// The constructor's signature, for its docstring: "(num_symbols, …, *, [rows,] sigma2=1.0, …, keys=None)".
[[nodiscard]] std::string estimator_signature(const FamilySpec& family);

/// A value of an option as Python sees it.
[[nodiscard]] py::object option_to_python(const OptionValue& value);

/// The docstrings of the generated attributes, composed from the descriptor so that every family's classes get them
/// (`of_statistics`: the attribute of an accumulator or factory rather than an estimator):
///   size_doc     "The size S (number of symbols), an int, of the models it estimates."
///   option_doc   "Gate variance sigma^2, fixed unless estimate_sigma2. A float > 0, default 1.0."
///   factory_doc  "Makes empty XAccumulator objects: …" (the class docstring of XAccumulatorFactory)
[[nodiscard]] std::string size_doc(const SizeSpec& size, bool of_statistics);
[[nodiscard]] std::string option_doc(const OptionSpec& spec, bool of_statistics);
[[nodiscard]] std::string factory_doc(const std::string& accumulator_name);
inline constexpr const char* kSeedDoc =
    "The seed of a fresh start (the initial embeddings and the Monte-Carlo noise), an int >= 0; a fit continued "
    "from a model's optimizer state uses that state's seed.";
inline constexpr const char* kEstimatorNameDoc = "The name given at construction, a str or None.";
inline constexpr const char* kKeysDoc =
    "The key of keyed tying, a str or None: after the E-step every site with the same key reads the pooled "
    "statistics.";

/// The accumulator of a constructor call: the statistics of the estimator of (sizes, the options that shape the
/// statistics, keys) — positional in that order, then name; rows by keyword (families shaped by their data) — and
/// its name. @throws TypeError / ValueError.
[[nodiscard]] AnyAccumulator accumulator_of(const FamilySpec& family, RowsEncoder rows, const std::string& where,
                                            const py::args& args, const py::kwargs& kwargs, py::object& name);

/// @throws std::logic_error unless a RowsEncoder is given exactly for a family shaped by its data.
void check_rows_encoder(const FamilySpec& family, RowsEncoder rows);

/// What __reduce__ returns to pickle `self` as its class called again with `kwargs`:
/// (functools.partial(type(self), **kwargs), ()).
[[nodiscard]] py::tuple called_again(py::handle self, const py::dict& kwargs);

/// Pickling of a generated estimator `self` of `family`: called_again with its sizes, options, seed, name, keys and
/// pseudo_count. @throws TypeError for a family shaped by its data (its estimators hold their training rows' cells).
[[nodiscard]] py::tuple reduce_estimator(const FamilySpec& family, const std::string& where, py::handle self,
                                         const EstimatorHandle& estimator);

/// The keyword arguments that make an accumulator like `statistics` of `family` (its sizes, the options that shape
/// its statistics, keys) named `name`. @throws TypeError naming `where` for a family shaped by its data (its
/// accumulators hold their training rows' cells).
[[nodiscard]] py::dict accumulator_kwargs(const FamilySpec& family, const std::string& where,
                                          const AnyAccumulator& statistics, const py::object& name);

/// Pickling of an accumulator `self` as `kwargs` make it with the statistics it holds:
/// (attnmix._unpickle.accumulator_with_statistics, (functools.partial(type(self), **kwargs), self.value())).
[[nodiscard]] py::tuple reduce_accumulator(py::handle self, const py::dict& kwargs);

/// Records that `class_name` is the generated estimator class of `family` (for _estimator_classes()).
void record_estimator_class(const char* class_name, const FamilySpec& family);

/// `_core._estimator_classes()`: each generated estimator class with its family's sizes and option table, from
/// which scripts/generate_stubs.py writes their stubs in _core.pyi.
void bind_estimator_table(py::module_& m);

/// Binds `class_name`, the Python class of the estimators of `family` (C++ type E); `rows` encodes the training rows
/// of a family shaped by its data (null for every other).
template <class E>
void bind_estimator_class(py::module_& m, const FamilySpec& family, const char* class_name, const char* doc,
                          RowsEncoder rows = nullptr) {
  using Est = EstimatorOf<E>;
  check_rows_encoder(family, rows);
  record_estimator_class(class_name, family);
  py::class_<Est, EstimatorHandle> cls(m, class_name, doc);
  const std::string where = class_name;
  cls.def(py::init([&family, rows, where](const py::args& args, const py::kwargs& kwargs) {
            ConstructorCall call = estimator_call(family, rows, where, args, kwargs);
            return Est(family.fit.make_estimator(call.settings, nullptr), std::move(call.pseudo_count));
          }),
          (std::string(class_name) + estimator_signature(family)).c_str());
  for (const SizeSpec& size : family.fit.sizes) {
    if (!size.fixed_by_model) continue;
    const std::string symbol(size.symbol);
    cls.def_property_readonly(
        std::string(size.keyword).c_str(),
        [&family, symbol](const Est& e) { return family.fit.settings_of(e.any).sizes.at(symbol).value; },
        size_doc(size, false).c_str());
  }
  for (const OptionSpec& option : family.fit.options) {
    const std::string name(option.name);
    cls.def_property_readonly(
        name.c_str(),
        [&family, name](const Est& e) { return option_to_python(family.fit.settings_of(e.any).options.at(name)); },
        option_doc(option, false).c_str());
  }
  if (family.fit.stochastic)
    cls.def_property_readonly(
        "seed", [&family](const Est& e) { return family.fit.settings_of(e.any).seed; }, kSeedDoc);
  cls.def_property_readonly(
         "name", [&family](const Est& e) { return name_to_python(family.fit.settings_of(e.any).name); },
         kEstimatorNameDoc)
      .def_property_readonly(
          "keys",
          [&family](const Est& e) -> py::object {
            const auto keys = family.fit.settings_of(e.any).keys;
            return keys ? py::object(py::str(*keys)) : py::none();
          },
          kKeysDoc)
      .def(
          "__reduce__",
          [&family, where](py::handle self) {
            return reduce_estimator(family, where, self, self.cast<const Est&>());  // names the class when uninitialised
          },
          "Pickling: the class called again with the sizes, options, seed, name, keys and pseudo_count of this one.");
}

/// The field `index` of a leaf's statistics as value() gives it: a float (a scalar field) or a new array.
[[nodiscard]] py::object statistics_field(const AnyAccumulator& acc, size_t index);

/// The statistics of the family's smallest estimator (every size 1; no rows for a family shaped by its data).
[[nodiscard]] AnyAccumulator smallest_statistics(const FamilySpec& family);

/// One read-only attribute per field of the statistics of the family's accumulators (their layout's names).
template <class Class>
void def_statistics_attributes(Class& cls, const FamilySpec& family) {
  using H = typename Class::type;
  const AnyAccumulator example = smallest_statistics(family);
  const auto& fields = example.flat_stats()->layout().fields();
  for (size_t i = 0; i < fields.size(); ++i)
    cls.def_property_readonly(fields[i].name.c_str(), [i](const H& h) { return statistics_field(h.get(), i); },
                              ("The statistic " + fields[i].name + " (a copy, as in value()).").c_str());
}

/// Binds the Python classes of the accumulators of `family` (C++ type A) and of their factories. factory_example is
/// appended to the factory's generated docstring (factory_doc): the family's "\n\nExample:\n\n>>> ..." paragraph.
template <class A>
void bind_accumulator_classes(py::module_& m, const FamilySpec& family, const char* accumulator_name,
                              const char* factory_name, const char* doc, const char* factory_example,
                              RowsEncoder rows = nullptr) {
  check_rows_encoder(family, rows);
  py::class_<AccumulatorOf<A>, AccumulatorHandle> acc(m, accumulator_name, doc);
  const std::string where_acc = accumulator_name, where_factory = factory_name;
  acc.def(py::init([&family, rows, where_acc](const py::args& args, const py::kwargs& kwargs) {
    py::object name;
    AnyAccumulator statistics = accumulator_of(family, rows, where_acc, args, kwargs, name);
    return AccumulatorOf<A>(AccumulatorHandle(std::move(statistics), std::move(name)));
  }));
  acc.def(
      "__reduce__",
      [&family, where_acc](py::handle self) {
        const auto& h = self.cast<const AccumulatorOf<A>&>();  // names the class when uninitialised
        return reduce_accumulator(self, accumulator_kwargs(family, where_acc, h.get(), h.name()));
      },
      "Pickling: the class called again with the sizes, options, keys and name of this one, then from_value.");
  py::class_<FactoryOf<A>, FactoryHandle> factory(m, factory_name,
                                                  (factory_doc(accumulator_name) + factory_example).c_str());
  factory.def(
      "__reduce__",
      [&family, where_factory](py::handle self) {
        const auto& h = self.cast<const FactoryOf<A>&>();
        return called_again(self, accumulator_kwargs(family, where_factory, h.prototype, h.name));
      },
      "Pickling: the class called again with the sizes, options, keys and name of this one.");
  factory.def(py::init([&family, rows, where_factory](const py::args& args, const py::kwargs& kwargs) {
    py::object name;
    AnyAccumulator prototype = accumulator_of(family, rows, where_factory, args, kwargs, name);
    return FactoryOf<A>(std::move(prototype), std::move(name));
  }));
  const auto attributes = [&family](auto& cls, auto statistics) {
    using H = typename std::remove_reference_t<decltype(cls)>::type;
    for (const SizeSpec& size : family.fit.sizes) {
      if (!size.fixed_by_model) continue;
      const std::string symbol(size.symbol);
      cls.def_property_readonly(
          std::string(size.keyword).c_str(),
          [&family, symbol, statistics](const H& h) {
            return family.fit.accumulator_settings(statistics(h)).sizes.at(symbol).value;
          },
          size_doc(size, true).c_str());
    }
    for (const OptionSpec& option : family.fit.options) {
      if (!option.shapes_statistics) continue;
      const std::string name(option.name);
      cls.def_property_readonly(
          name.c_str(),
          [&family, name, statistics](const H& h) {
            return option_to_python(family.fit.accumulator_settings(statistics(h)).options.at(name));
          },
          option_doc(option, true).c_str());
    }
  };
  attributes(acc, [](const AccumulatorOf<A>& h) -> const AnyAccumulator& { return h.get(); });
  def_statistics_attributes(acc, family);
  attributes(factory, [](const FactoryOf<A>& h) -> const AnyAccumulator& { return h.prototype; });
}

}  // namespace attnmix::python
