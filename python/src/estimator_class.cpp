// SPDX-License-Identifier: Apache-2.0
// The estimator classes generated from the family descriptors (estimator_class.hpp).
#include "estimator_class.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "convert.hpp"

namespace attnmix::python {

namespace {

std::vector<const SizeSpec*> estimator_sizes(const FamilySpec& family) {
  std::vector<const SizeSpec*> out;
  for (const SizeSpec& size : family.fit.sizes)
    if (size.fixed_by_model) out.push_back(&size);
  return out;
}

/// A keyword's value as its option's type, checked. @throws TypeError / ValueError.
OptionValue option_from_python(const OptionSpec& spec, py::handle obj, const std::string& where) {
  const std::string name(spec.name);
  OptionValue value;
  if (std::holds_alternative<bool>(spec.fallback)) {
    value = flag(obj, where, name);
  } else if (std::holds_alternative<int64_t>(spec.fallback)) {
    value = spec.check == OptionCheck::kPositive ? positive_int(obj, where, name) : nonnegative_int(obj, where, name);
  } else if (std::holds_alternative<double>(spec.fallback)) {
    value = spec.check == OptionCheck::kPositive      ? positive_real(obj, where, name)
            : spec.check == OptionCheck::kNonNegative ? nonnegative_real(obj, where, name)
                                                      : real_number(obj, where, name);
  } else {
    if (!PyUnicode_Check(obj.ptr()))
      throw TypeError(where + ": " + name + " must be " + choices_text(spec) + " (got " + type_name(obj) + ")");
    value = obj.cast<std::string>();
  }
  check_option(spec, value, where);
  return value;
}

/// The rows of a constructor call: `data` encoded for the call's sizes, pointed to by the call's settings.
void take_rows(ConstructorCall& call, RowsEncoder rows, const py::object& data, const std::string& where) {
  if (data.is_none()) throw TypeError(where + "() missing required argument 'rows' (the training rows, whose pairs "
                                              "are the cells of its sparse tables)");
  call.rows = std::make_shared<const AnyBatch>(rows(data, call.settings.sizes));
  call.settings.rows = call.rows.get();
}

}  // namespace

void check_rows_encoder(const FamilySpec& family, RowsEncoder rows) {
  if (family.fit.shaped_by_data != (rows != nullptr))
    throw std::logic_error("attnmix bindings: " + std::string(family.name) +
                           (rows ? " takes no training rows" : " needs a RowsEncoder for its training rows"));
}

ConstructorCall estimator_call(const FamilySpec& family, RowsEncoder rows, const std::string& where,
                               const py::args& args, const py::kwargs& kwargs) {
  const std::vector<const SizeSpec*> sizes = estimator_sizes(family);
  if (args.size() > sizes.size())
    throw TypeError(where + "() takes " + std::to_string(sizes.size()) + " positional arguments (its sizes) but " +
                    std::to_string(args.size()) + " were given; the options are keyword-only");
  std::map<std::string, py::object> given;
  for (size_t i = 0; i < args.size(); ++i) given[std::string(sizes[i]->keyword)] = args[i];
  for (const auto& [key, value] : kwargs) {
    const std::string k = key.cast<std::string>();
    if (!given.emplace(k, py::reinterpret_borrow<py::object>(value)).second)
      throw TypeError(where + "() got multiple values for argument '" + k + "'");
  }
  const auto take = [&](const std::string& key) -> py::object {
    const auto it = given.find(key);
    if (it == given.end()) return py::none();
    py::object out = it->second;
    given.erase(it);
    return out;
  };
  ConstructorCall call;
  EstimatorSettings& settings = call.settings;
  for (const SizeSpec* size : sizes) {
    const std::string keyword(size->keyword);
    if (!given.count(keyword)) throw TypeError(where + "() missing required argument '" + keyword + "'");
    settings.sizes[std::string(size->symbol)] = Dim{positive_int(take(keyword), where, keyword), ""};
  }
  for (const OptionSpec& spec : family.fit.options)
    if (given.count(std::string(spec.name)))
      settings.options[std::string(spec.name)] = option_from_python(spec, take(std::string(spec.name)), where);
  if (family.fit.stochastic && given.count("seed"))
    settings.seed = seed_int(take("seed"), where, "seed");
  settings.name = name_arg(take("name"), where);
  settings.keys = optional_str(take("keys"), where, "keys");
  call.pseudo_count = pseudo_count_arg(take("pseudo_count"), where);
  py::object data = rows ? take("rows") : py::none();
  if (!given.empty()) throw TypeError(where + "() got an unexpected keyword argument '" + given.begin()->first + "'");
  if (rows) take_rows(call, rows, data, where);
  return call;
}

AnyAccumulator accumulator_of(const FamilySpec& family, RowsEncoder rows, const std::string& where,
                              const py::args& args, const py::kwargs& kwargs, py::object& name) {
  const std::vector<const SizeSpec*> sizes = estimator_sizes(family);
  std::vector<std::string> order;  // the positional arguments' names
  for (const SizeSpec* size : sizes) order.emplace_back(size->keyword);
  for (const OptionSpec& spec : family.fit.options)
    if (spec.shapes_statistics) order.emplace_back(spec.name);
  order.emplace_back("keys");
  order.emplace_back("name");
  if (args.size() > order.size())
    throw TypeError(where + "() takes at most " + std::to_string(order.size()) + " arguments (" +
                    std::to_string(args.size()) + " given)");
  std::map<std::string, py::object> given;
  for (size_t i = 0; i < args.size(); ++i) given[order[i]] = args[i];
  for (const auto& [key, value] : kwargs) {
    const std::string k = key.cast<std::string>();
    if (std::find(order.begin(), order.end(), k) == order.end() && !(rows && k == "rows"))
      throw TypeError(where + "() got an unexpected keyword argument '" + k + "'");
    if (!given.emplace(k, py::reinterpret_borrow<py::object>(value)).second)
      throw TypeError(where + "() got multiple values for argument '" + k + "'");
  }
  ConstructorCall call;
  EstimatorSettings& settings = call.settings;
  for (const SizeSpec* size : sizes) {
    const std::string keyword(size->keyword);
    if (!given.count(keyword)) throw TypeError(where + "() missing required argument '" + keyword + "'");
    settings.sizes[std::string(size->symbol)] = Dim{positive_int(given[keyword], where, keyword), ""};
  }
  for (const OptionSpec& spec : family.fit.options)
    if (spec.shapes_statistics && given.count(std::string(spec.name)))
      settings.options[std::string(spec.name)] = option_from_python(spec, given[std::string(spec.name)], where);
  settings.keys = optional_str(given.count("keys") ? given["keys"] : py::none(), where, "keys");
  name = name_to_python(name_arg(given.count("name") ? given["name"] : py::none(), where));
  if (rows) take_rows(call, rows, given.count("rows") ? given["rows"] : py::none(), where);
  return family.fit.make_estimator(settings, nullptr).make_accumulator();
}

AnyAccumulator smallest_statistics(const FamilySpec& family) {
  EstimatorSettings smallest;
  for (const SizeSpec& size : family.fit.sizes)
    if (size.fixed_by_model) smallest.sizes[std::string(size.symbol)] = Dim{1, ""};
  AnyBatch no_rows;
  if (family.fit.shaped_by_data) {
    Rows empty;  // no rows, each field as wide as its size (1) says
    for (const DataField& field : family.schema->fields) {
      const Index width = field.width.empty() ? 1 : smallest.sizes.at(std::string(field.width)).value;
      Column& column = empty.columns.emplace_back();
      if (field.kind == DataKind::kIds) column.ids.resize(0, width);
      else column.reals.resize(0, width);
    }
    no_rows = family.encode(std::move(empty), smallest.sizes);
    smallest.rows = &no_rows;
  }
  return family.fit.make_estimator(smallest, nullptr).make_accumulator();
}

py::object statistics_field(const AnyAccumulator& acc, size_t index) {
  const FlatStats& stats = *acc.flat_stats();
  const FieldSpec& field = stats.layout().fields()[index];
  const double* p = stats.flat().data() + field.offset;
  return field.shape.empty() ? py::object(py::float_(*p)) : py::object(copy_reals(p, field.shape));
}

std::string estimator_signature(const FamilySpec& family) {
  std::string out = "(";
  for (const SizeSpec* size : estimator_sizes(family)) out += std::string(size->keyword) + ", ";
  out += family.fit.shaped_by_data ? "*, rows" : "*";
  for (const OptionSpec& spec : family.fit.options)
    out += ", " + std::string(spec.name) + "=" + py::repr(option_to_python(spec.fallback)).cast<std::string>();
  if (family.fit.stochastic) out += ", seed=0";
  return out + ", pseudo_count=None, name=None, keys=None)";
}

namespace {

std::vector<std::pair<std::string, const FamilySpec*>>& estimator_classes() {
  static std::vector<std::pair<std::string, const FamilySpec*>> classes;
  return classes;
}

}  // namespace

void record_estimator_class(const char* class_name, const FamilySpec& family) {
  estimator_classes().emplace_back(class_name, &family);
}

void bind_estimator_table(py::module_& m) {
  m.def(
      "_estimator_classes",
      [] {
        py::list out;
        for (const auto& [name, family] : estimator_classes()) {
          py::list sizes, options;
          for (const SizeSpec* size : estimator_sizes(*family))
            sizes.append(py::dict(py::arg("keyword") = std::string(size->keyword),
                                  py::arg("symbol") = std::string(size->symbol), py::arg("help") = std::string(size->help)));
          for (const OptionSpec& spec : family->fit.options) {
            py::list choices;
            for (std::string_view c : spec.choices) choices.append(std::string(c));
            options.append(py::dict(py::arg("name") = std::string(spec.name), py::arg("help") = std::string(spec.help),
                                    py::arg("default") = option_to_python(spec.fallback), py::arg("choices") = choices,
                                    py::arg("from_model") = spec.from_model));
          }
          out.append(py::dict(py::arg("class") = name, py::arg("family") = std::string(family->name),
                              py::arg("sizes") = sizes, py::arg("options") = options,
                              py::arg("seeded") = family->fit.stochastic,
                              py::arg("rows") = family->fit.shaped_by_data));
        }
        return out;
      },
      "Private: the generated estimator classes, with their sizes and option tables (scripts/generate_stubs.py).");
}

namespace {

/// "Gate variance sigma^2, fixed unless estimate_sigma2": an option's help as Python names the options it mentions
/// (in braces in the table), with a capital first letter.

/// "A float, default 1.0", "'float64' or 'mixed', default 'float64'".
std::string type_and_default(const OptionSpec& spec) {
  std::string type;
  if (!spec.choices.empty()) type = choices_text(spec);
  else if (std::holds_alternative<bool>(spec.fallback)) type = "A bool";
  else if (std::holds_alternative<int64_t>(spec.fallback)) type = "An int";
  else if (std::holds_alternative<double>(spec.fallback)) type = "A float";
  else type = "A str";
  if (spec.check == OptionCheck::kPositive) type += " > 0";
  else if (spec.check == OptionCheck::kNonNegative) type += " >= 0";
  return type + ", default " + py::repr(option_to_python(spec.fallback)).cast<std::string>();
}

}  // namespace

std::string size_doc(const SizeSpec& size, bool of_statistics) {
  return "The size " + std::string(size.symbol) + " (" + std::string(size.help) + "), an int, " +
         (of_statistics ? "that the statistics are sized for." : "of the models it estimates.");
}

std::string option_doc(const OptionSpec& spec, bool of_statistics) {
  return option_help(spec.help, [](std::string_view option) { return std::string(option); }) + ". " + type_and_default(spec) +
         (of_statistics ? "; an estimator option that these statistics depend on." : ".");
}

std::string factory_doc(const std::string& accumulator_name) {
  return "Makes empty " + accumulator_name +
         " objects (zero statistics) of the sizes and statistics-shaping options it was built with; make() returns a "
         "new one.";
}

namespace {
/// The keyword arguments of a constructor call with `settings`: the sizes, the options (only those that shape the
/// statistics when `statistics_only`) and keys. @throws TypeError naming `where` for a family shaped by its data.
py::dict settings_kwargs(const FamilySpec& family, const std::string& where, const EstimatorSettings& settings,
                         bool statistics_only) {
  if (family.fit.shaped_by_data)
    throw TypeError(where + " objects cannot be pickled: they hold the cells of the training rows they were given; "
                    "pickle the rows and construct the object again");
  py::dict kwargs;
  for (const SizeSpec* size : estimator_sizes(family))
    kwargs[py::str(std::string(size->keyword))] = settings.sizes.at(std::string(size->symbol)).value;
  for (const OptionSpec& option : family.fit.options)
    if (!statistics_only || option.shapes_statistics)
      kwargs[py::str(std::string(option.name))] = option_to_python(settings.options.at(std::string(option.name)));
  kwargs["keys"] = py::cast(settings.keys);
  return kwargs;
}
}  // namespace

py::tuple reduce_estimator(const FamilySpec& family, const std::string& where, py::handle self,
                           const EstimatorHandle& estimator) {
  const EstimatorSettings settings = family.fit.settings_of(estimator.any);
  py::dict kwargs = settings_kwargs(family, where, settings, /*statistics_only=*/false);
  if (family.fit.stochastic) kwargs["seed"] = settings.seed;
  kwargs["name"] = name_to_python(settings.name);
  kwargs["pseudo_count"] = estimator.pseudo_count;
  return called_again(self, kwargs);
}

py::dict accumulator_kwargs(const FamilySpec& family, const std::string& where, const AnyAccumulator& statistics,
                           const py::object& name) {
  py::dict kwargs = settings_kwargs(family, where, family.fit.accumulator_settings(statistics), true);
  kwargs["name"] = name;
  return kwargs;
}

py::tuple reduce_accumulator(py::handle self, const py::dict& kwargs) {
  const py::module_ unpickle = py::module_::import("attnmix._unpickle");
  return py::make_tuple(unpickle.attr("accumulator_with_statistics"),
                        py::make_tuple(called_again(self, kwargs)[0], self.attr("value")()));
}

py::tuple called_again(py::handle self, const py::dict& kwargs) {
  const py::object partial = py::module_::import("functools").attr("partial");
  return py::make_tuple(partial(py::type::of(self), **kwargs), py::tuple());
}

py::object option_to_python(const OptionValue& value) {
  if (const auto* b = std::get_if<bool>(&value)) return py::bool_(*b);
  if (const auto* i = std::get_if<int64_t>(&value)) return py::int_(*i);
  if (const auto* d = std::get_if<double>(&value)) return py::float_(*d);
  return py::str(std::get<std::string>(value));
}

}  // namespace attnmix::python
