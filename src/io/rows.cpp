// SPDX-License-Identifier: Apache-2.0
// Data files read by a family's schema (io/rows.hpp): one JSON Lines reader and one .npz reader for every family,
// written with the located field parsers of io/fields.hpp.
#include "attnmix/io/rows.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "attnmix/core/errors.hpp"
#include "attnmix/io/jsonl.hpp"
#include "attnmix/io/npz.hpp"
#include "row_table_impl.hpp"

namespace attnmix {

using nlohmann::json;

const DataField& RowSchema::field(std::string_view name) const {
  for (const DataField& f : fields)
    if (f.name == name) return f;
  throw ValueError("RowSchema: no field '" + std::string(name) + "'");
}

std::string RowSchema::savez_arguments() const {
  std::string out;
  for (const DataField& f : fields) out += (out.empty() ? "" : ", ") + std::string(f.name) + "=...";
  return out;
}

Index Rows::n_rows() const {
  return columns.empty() ? 0 : std::max(columns.front().ids.rows(), columns.front().reals.rows());
}

IdVector id_vector(const Column& column) { return column.ids.col(0); }

namespace {

/// The sizes being settled while a file is read: every width and bound of the schema, declared or not yet known.
class SizeSlots {
 public:
  SizeSlots(const RowSchema& schema, const Dims& declared) {
    for (const DataField& f : schema.fields)
      for (std::string_view symbol : {f.width, f.bound})
        if (!symbol.empty()) {
          const auto it = declared.find(symbol);
          slots_[std::string(symbol)] = it == declared.end() ? std::nullopt : std::optional<Dim>(it->second);
        }
  }
  /// The size `symbol` of the schema. @throws std::logic_error for a symbol the schema does not name.
  std::optional<Dim>& operator[](std::string_view symbol) {
    const auto it = slots_.find(symbol);
    if (it == slots_.end()) throw std::logic_error("RowSchema: no size '" + std::string(symbol) + "'");
    return it->second;
  }

 private:
  std::map<std::string, std::optional<Dim>, std::less<>> slots_;
};

std::vector<std::string> field_names(const RowSchema& schema, bool required_only) {
  std::vector<std::string> names;
  for (const DataField& f : schema.fields)
    if (!required_only || !f.target) names.emplace_back(f.name);
  return names;
}

const DataField* target_field(const RowSchema& schema) {
  for (const DataField& f : schema.fields)
    if (f.target) return &f;
  return nullptr;
}

/// Where the rows go (row_table_impl.hpp): one table per field, allocated when its width is known.
struct Sink {
  std::vector<RowTable<IdMatrix>> ids;
  std::vector<RowTable<Matrix>> reals;
  std::vector<char> symbols;  // per field: whether its rows give symbols (DataField::symbols)
  Index capacity = 0;  // the rows of the stripe, counted before parsing
  Index n_rows = 0;

  explicit Sink(size_t fields) : ids(fields), reals(fields), symbols(fields, 0) {}

  void allocate(const DataField& f, size_t k, Index width) {
    if (f.kind == DataKind::kIds)
      ids[k].allocate(capacity, width);
    else
      reals[k].allocate(capacity, width);
  }
  /// Field k's rows give symbols: one id each.
  void allocate_symbols(size_t k) {
    symbols[k] = 1;
    ids[k].allocate(capacity, 1);
  }

  Rows finish(const RowSchema& schema, Rows rows, SizeSlots& sizes, const RowStripe& stripe) {
    if (n_rows == 0 && !stripe.shard) throw ValueError(rows.source + ": contains no observations (the file is empty)");
    for (size_t k = 0; k < schema.fields.size(); ++k) {
      const DataField& f = schema.fields[k];
      Column column;
      Index width = 1;
      if (!f.width.empty()) width = sizes[f.width] ? sizes[f.width]->value : 0;
      if (n_rows == 0) {  // an empty shard: the widths known so far (the fit settles the rest)
        column.ids.resize(0, f.kind == DataKind::kIds ? width : 0);
        column.reals.resize(0, f.kind == DataKind::kReals ? width : 0);
      } else if (f.target && !rows.has_targets) {
        column.ids = IdMatrix::Zero(n_rows, 1);
      } else if (f.kind == DataKind::kIds || symbols[k]) {
        column.ids = std::move(ids[k]).take(n_rows);
      } else {
        column.reals = std::move(reals[k]).take(n_rows);
      }
      rows.columns.push_back(std::move(column));
    }
    return rows;
  }
};

// ---- JSON Lines ------------------------------------------------------------------------------------------------

Rows read_jsonl(const std::string& path, const RowSchema& schema, SizeSlots& sizes, TargetPolicy policy,
                const RowStripe& stripe) {
  Rows rows;
  rows.source = path;
  Sink sink(schema.fields.size());
  TargetPresence targets_seen(policy);
  const DataField* target = target_field(schema);
  const std::vector<std::string> known = field_names(schema, false), required = field_names(schema, true);
  const auto on_row_count = [&](int64_t count) {
    sink.capacity = count;
    rows.line_of_row.reserve(static_cast<size_t>(count));
  };
  const auto visit = [&](int64_t line, const json& object) {
    const std::string where = path + ": line " + std::to_string(line);
    check_json_fields(object, where, known, required);
    const bool has_target = target && object.contains(target->name);
    if (target) targets_seen.see(has_target, where);
    const std::string first_row = "line " + std::to_string(sink.n_rows == 0 ? line : rows.line_of_row.front());
    for (size_t k = 0; k < schema.fields.size(); ++k) {
      const DataField& f = schema.fields[k];
      if (f.target && !has_target) continue;
      const std::string name(f.name), bound(f.bound);
      const json& v = object[name];
      const bool ids = f.kind == DataKind::kIds;
      if (f.width.empty()) {
        sink.allocate(f, k, 1);
        if (ids) {
          sink.ids[k].push_back(json_id(v, where, name, bound.c_str(), sizes[f.bound]));
        } else {
          if (!v.is_number()) throw TypeError(where + ": " + name + ": must be a finite number (got " + json_kind(v) + ")");
          sink.reals[k].push_back(bounded_real(v.get<double>(), where, name));
        }
        continue;
      }
      if (f.symbols) {  // one way for every row: the first row's
        const bool symbol = !v.is_array();
        if (sink.n_rows > 0 && symbol != (sink.symbols[k] != 0))
          throw ValueError(where + ": " + name + ": " + (symbol ? "a symbol id" : "an array") + " here but " +
                           (symbol ? "arrays" : "symbol ids") + " from " + first_row +
                           " on (every row gives it the same way)");
        if (symbol) {
          if (!v.is_number())
            throw TypeError(where + ": " + name + ": must be an array of numbers or one symbol id (got " +
                            json_kind(v) + ")");
          sink.allocate_symbols(k);
          sink.ids[k].push_back(json_id(v, where, name, std::string(f.width).c_str(), sizes[f.width]));
          continue;
        }
      }
      if (!v.is_array())
        throw TypeError(where + ": " + name + (ids ? ": must be an array of integer ids (got " : ": must be an array of numbers (got ") +
                        json_kind(v) + ")");
      if (!f.pairs_with.empty()) {
        const std::string partner(f.pairs_with);
        const size_t expected = object[partner].size();
        if (v.size() != expected)
          throw ValueError(where + ": " + name + " has " + std::to_string(v.size()) + " entries but " + partner + " has " +
                           std::to_string(expected) + " (position j pairs " + partner + "[j] with " + name + "[j])");
      } else {
        check_width(name.c_str(), std::string(f.width).c_str(), sizes[f.width], v.size(), where, first_row);
      }
      sink.allocate(f, k, static_cast<Index>(v.size()));
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string element = name + "[" + std::to_string(i) + "]";
        if (ids) {
          sink.ids[k].push_back(json_id(v[i], where, element, bound.c_str(), sizes[f.bound]));
        } else {
          if (!v[i].is_number())
            throw TypeError(where + ": " + element + ": must be a finite number (got " + json_kind(v[i]) + ")");
          sink.reals[k].push_back(bounded_real(v[i].get<double>(), where, element));
        }
      }
    }
    rows.line_of_row.push_back(line);
    ++sink.n_rows;
  };
  for_each_json_line(path, stripe, visit, on_row_count);
  rows.has_targets = target && targets_seen.has_targets();
  return sink.finish(schema, std::move(rows), sizes, stripe);
}

// ---- .npz --------------------------------------------------------------------------------------------------------

/// Whether array a gives field f as symbols: a DataField::symbols field as a 1-D integer array (n,).
bool symbols_array(const NpyArray& a, const DataField& f) {
  return f.symbols && a.shape.size() == 1 && a.kind == NpyArray::Kind::kInt;
}

/// An archive's array for field f: ids that are not bools, or reals; 1-D (n,) or 2-D (n, width) (or symbols, (n,));
/// n rows as the first field's. @throws TypeError / ValueError naming the file and the array.
void check_array(const NpyArray& a, const DataField& f, int64_t n, const std::string& first, const std::string& path) {
  const std::string name(f.name);
  if (a.kind == NpyArray::Kind::kBool)
    throw TypeError(path + ": " + name +
                    (f.kind == DataKind::kIds ? ": ids must be integers, not bools (dtype " : ": must be real numbers, not bools (dtype ") +
                    a.descr + ")");
  const size_t dims = f.width.empty() || symbols_array(a, f) ? 1 : 2;
  if (a.shape.size() != dims)
    throw ValueError(path + ": " + name + ": must be " + std::to_string(dims) + "-D " +
                     (dims == 2 ? "(n, " + std::string(f.width) + ")" : std::string("(n,)")) + " (got shape " +
                     a.shape_text() + ")");
  if (n >= 0 && a.shape[0] != n)
    throw ValueError(path + ": " + name + ": has " + std::to_string(a.shape[0]) + " rows but " + first + " has " +
                     std::to_string(n));
}

Rows read_npz_rows(const std::string& path, const RowSchema& schema, SizeSlots& sizes, TargetPolicy policy,
                   const RowStripe& stripe) {
  Rows rows;
  rows.source = path;
  rows.is_npz = true;
  std::map<std::string, NpyArray> arrays = read_npz(path, stripe.part, stripe.parts);
  std::vector<std::string> names;
  for (const auto& [name, array] : arrays) names.push_back(name);
  check_npz_arrays(names, path, field_names(schema, false), field_names(schema, true));
  const DataField* target = target_field(schema);
  rows.has_targets = target && arrays.count(std::string(target->name)) > 0;
  if (target && policy == TargetPolicy::kRequired && !rows.has_targets)
    throw ValueError(path + ": missing array '" + std::string(target->name) + "'");

  const std::string first(schema.fields.front().name);
  int64_t n = -1;
  for (const DataField& f : schema.fields) {
    if (f.target && !rows.has_targets) continue;
    const NpyArray& a = arrays[std::string(f.name)];
    check_array(a, f, n, first, path);
    if (n < 0) n = a.shape[0];
    if (!f.pairs_with.empty()) {
      const NpyArray& partner = arrays[std::string(f.pairs_with)];
      if (a.shape[1] != partner.shape[1])
        throw ValueError(path + ": " + std::string(f.name) + ": has shape " + a.shape_text() + " but " +
                         std::string(f.pairs_with) + " has " + partner.shape_text() + " (position j pairs " +
                         std::string(f.pairs_with) + "[r, j] with " + std::string(f.name) + "[r, j])");
    }
  }
  if (n > 0)
    for (const DataField& f : schema.fields)
      if (!f.width.empty() && f.pairs_with.empty() && !symbols_array(arrays[std::string(f.name)], f)) {
        const std::string name(f.name);
        check_width(name.c_str(), std::string(f.width).c_str(), sizes[f.width],
                    static_cast<size_t>(arrays[name].shape[1]), path + ": " + name, "the " + name + " array");
      }
  // read_npz decoded only the stripe's rows; they are validated and kept (messages give their index in the file).
  const auto [begin, end] = stripe.range(n);
  rows.first_row = begin;
  Sink sink(schema.fields.size());
  sink.capacity = end - begin;
  for (size_t k = 0; k < schema.fields.size(); ++k) {
    const DataField& f = schema.fields[k];
    if (f.target && !rows.has_targets) continue;
    const NpyArray& a = arrays[std::string(f.name)];
    if (symbols_array(a, f))
      sink.allocate_symbols(k);
    else
      sink.allocate(f, k, f.width.empty() || n == 0 ? 1 : a.shape[1]);
  }
  for (int64_t r = begin; r < end; ++r) {
    for (size_t k = 0; k < schema.fields.size(); ++k) {
      const DataField& f = schema.fields[k];
      if (f.target && !rows.has_targets) continue;
      const std::string name(f.name), bound(f.bound);
      const NpyArray& a = arrays[name];
      if (sink.symbols[k]) {
        sink.ids[k].push_back(npz_id(a, a.at(r, 0), path, index_text(name.c_str(), r, -1),
                                     std::string(f.width).c_str(), sizes[f.width]));
        continue;
      }
      const int64_t width = f.width.empty() ? 1 : a.shape[1];
      for (int64_t c = 0; c < width; ++c) {
        const std::string element = index_text(name.c_str(), r, f.width.empty() ? -1 : c);
        const size_t at = a.at(r, c);
        if (f.kind == DataKind::kIds) {
          sink.ids[k].push_back(npz_id(a, at, path, element, bound.c_str(), sizes[f.bound]));
        } else {
          const double x = a.kind == NpyArray::Kind::kFloat ? a.reals[at] : static_cast<double>(a.ints[at]);
          sink.reals[k].push_back(bounded_real(x, path, element));
        }
      }
    }
    ++sink.n_rows;
  }
  return sink.finish(schema, std::move(rows), sizes, stripe);
}

/// "the largest key, value or query id" (the nouns of the fields bounded by a size), or "the largest target".
std::string largest_what(const std::vector<const DataField*>& fields) {
  if (std::all_of(fields.begin(), fields.end(), [](const DataField* f) { return f->target; }))
    return "the largest target";
  std::string text = "the largest ";
  for (size_t i = 0; i < fields.size(); ++i)
    text += (i == 0 ? "" : i + 1 == fields.size() ? " or " : ", ") + std::string(fields[i]->noun);
  return text + " id";
}

}  // namespace

Rows read_rows(const std::string& path, const RowSchema& schema, const Dims& declared, TargetPolicy policy,
               const RowStripe& stripe) {
  SizeSlots sizes(schema, declared);
  return data_file_kind(path, schema.savez_arguments()) == DataFileKind::kNpz
             ? read_npz_rows(path, schema, sizes, policy, stripe)
             : read_jsonl(path, schema, sizes, policy, stripe);
}

namespace {
/// The width of symbols field k (infer_dims): the widest of its real rows and 1 + its largest symbol over every row set
/// and process (collective).
Dim symbols_width(const DataField& f, size_t k, const std::vector<const Rows*>& row_sets, const Communicator* comm) {
  const std::string name(f.name);
  LargestId largest("the largest " + name + " symbol");
  int64_t widest = 0;
  std::string widest_source;
  int64_t own_symbols = 0;
  for (const Rows* rows : row_sets) {
    const Column& c = rows->columns[k];
    if (c.holds_symbols()) {
      own_symbols = 1;
      largest.see(c.ids, *rows, name.c_str());
    } else if (c.reals.rows() > 0 && c.reals.cols() > widest) {
      widest = c.reals.cols();
      widest_source = rows->source;
    }
  }
  const bool any_symbols = max_over_ranks(comm, own_symbols) > 0;
  const Dim from_symbols = largest.dim(comm);
  const int64_t widest_anywhere = max_over_ranks(comm, widest);
  if (any_symbols && from_symbols.value >= widest_anywhere) return from_symbols;
  return Dim{widest_anywhere, widest == widest_anywhere ? widest_source : "the rows of another process"};
}
}  // namespace

Dims infer_dims(const RowSchema& schema, const Dims& declared, const std::vector<const Rows*>& row_sets,
                const Communicator* comm) {
  Dims dims = declared;
  for (size_t k = 0; k < schema.fields.size(); ++k)  // before the widths of the first rows, which may be symbols
    if (schema.fields[k].symbols && !dims.count(schema.fields[k].width))
      dims[std::string(schema.fields[k].width)] = symbols_width(schema.fields[k], k, row_sets, comm);
  const Rows& first = *row_sets.front();
  for (const auto& [symbol, width] : row_widths(schema, first))
    if (!dims.count(symbol)) dims[std::string(symbol)] = Dim{width, first.source};
  std::vector<std::string_view> bounds;
  for (const DataField& f : schema.fields)
    if (!f.bound.empty() && std::find(bounds.begin(), bounds.end(), f.bound) == bounds.end()) bounds.push_back(f.bound);
  for (std::string_view symbol : bounds) {
    if (dims.count(symbol)) continue;
    std::vector<const DataField*> fields;
    for (const DataField& f : schema.fields)
      if (f.bound == symbol) fields.push_back(&f);
    LargestId largest(largest_what(fields));
    for (const Rows* rows : row_sets)
      for (size_t k = 0; k < schema.fields.size(); ++k) {
        const DataField& f = schema.fields[k];
        if (f.bound != symbol || (f.target && !rows->has_targets)) continue;
        largest.see(rows->columns[k].ids, *rows, std::string(f.name).c_str());
      }
    dims[std::string(symbol)] = largest.dim(comm);
  }
  return dims;
}

std::vector<std::pair<std::string_view, Index>> row_widths(const RowSchema& schema, const Rows& rows) {
  std::vector<std::pair<std::string_view, Index>> out;
  for (size_t k = 0; k < schema.fields.size(); ++k) {
    const DataField& f = schema.fields[k];
    if (f.width.empty() || !f.pairs_with.empty()) continue;
    const Column& c = rows.columns[k];
    const bool symbols = f.symbols && c.holds_symbols();  // rows of symbol ids show no width
    out.emplace_back(f.width, f.kind == DataKind::kIds ? c.ids.cols() : symbols ? 0 : c.reals.cols());
  }
  return out;
}

void set_empty_width(const RowSchema& schema, Rows& rows, std::string_view symbol, Index width) {
  for (size_t k = 0; k < schema.fields.size(); ++k) {
    const DataField& f = schema.fields[k];
    if (f.width != symbol) continue;
    if (f.kind == DataKind::kIds)
      rows.columns[k].ids.resize(0, width);
    else
      rows.columns[k].reals.resize(0, width);
  }
}

void write_json_lines(const RowSchema& schema, const Rows& rows, const std::function<void(const std::string&)>& write) {
  for (Index r = 0; r < rows.n_rows(); ++r) {
    nlohmann::ordered_json object = nlohmann::ordered_json::object();
    for (size_t k = 0; k < schema.fields.size(); ++k) {
      const DataField& f = schema.fields[k];
      if (f.target && !rows.has_targets) continue;
      const Column& c = rows.columns[k];
      const std::string name(f.name);
      if (f.kind == DataKind::kIds || (f.symbols && c.holds_symbols())) {
        if (f.width.empty() || f.kind == DataKind::kReals) {
          object[name] = c.ids(r, 0);
        } else {
          object[name] = std::vector<int64_t>(c.ids.row(r).begin(), c.ids.row(r).end());
        }
      } else if (f.width.empty()) {
        object[name] = c.reals(r, 0);
      } else {
        object[name] = std::vector<double>(c.reals.row(r).begin(), c.reals.row(r).end());
      }
    }
    write(object.dump());
  }
}

}  // namespace attnmix
