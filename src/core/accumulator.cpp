// SPDX-License-Identifier: Apache-2.0
#include "attnmix/core/accumulator.hpp"

#include <cmath>
#include <sstream>

#include "attnmix/core/sizes.hpp"

namespace attnmix {

StatLayout::StatLayout(std::string_view where, std::vector<FieldSpec> fields) : fields_(std::move(fields)) {
  for (FieldSpec& f : fields_) {
    f.size = checked_product(where, "statistic " + f.name, f.shape.data(), f.shape.size());
    f.offset = flat_size_;
    flat_size_ = checked_product(where, "the statistics", {flat_size_ + f.size});
  }
}

bool StatLayout::operator==(const StatLayout& other) const {
  if (fields_.size() != other.fields_.size()) return false;
  for (size_t i = 0; i < fields_.size(); ++i)
    if (fields_[i].name != other.fields_[i].name || fields_[i].shape != other.fields_[i].shape ||
        fields_[i].kind != other.fields_[i].kind)
      return false;
  return true;
}

std::string StatLayout::describe() const {
  std::ostringstream os;
  for (size_t i = 0; i < fields_.size(); ++i) {
    os << (i ? ", " : "") << fields_[i].name << " (";
    for (size_t d = 0; d < fields_[i].shape.size(); ++d) os << (d ? "," : "") << fields_[i].shape[d];
    if (fields_[i].shape.size() == 1) os << ",";
    os << ")";
  }
  return os.str();
}

FlatStats::FlatStats(std::shared_ptr<const StatLayout> layout)
    : layout_(std::move(layout)), data_(static_cast<size_t>(layout_->flat_size()), 0.0) {}

void FlatStats::set_zero() { std::fill(data_.begin(), data_.end(), 0.0); }

bool FlatStats::operator==(const FlatStats& other) const {
  if (!(*layout_ == *other.layout_)) return false;
  for (size_t i = 0; i < data_.size(); ++i)
    if (!(data_[i] == other.data_[i]) && !(std::isnan(data_[i]) && std::isnan(other.data_[i]))) return false;
  return true;
}

void FlatStats::check_same_layout(std::string_view where, const StatLayout& other) const {
  if (!(*layout_ == other))
    throw ValueError(std::string(where) + ": statistics must have the layout [" + layout_->describe() + "] (got [" +
                     other.describe() + "])");
}

void FlatStats::check_entries(std::string_view where, const StatsSplit* split) const {
  std::vector<std::pair<Index, Index>> skipped;  // the other ranks' entries, [first, end), increasing
  if (split)
    for (const StatsSplit::Run& run : split->runs) {
      Index at = run.offset;
      for (size_t q = 0; q < run.blocks.size(); ++q) {
        if (static_cast<int>(q) != split->rank && run.blocks[q] > 0) skipped.emplace_back(at, at + run.blocks[q]);
        at += run.blocks[q];
      }
    }
  size_t next = 0;
  for (const FieldSpec& f : layout_->fields()) {
    for (Index j = f.offset; j < f.offset + f.size; ++j) {
      while (next < skipped.size() && skipped[next].second <= j) ++next;
      if (next < skipped.size() && j >= skipped[next].first) {
        j = skipped[next].second - 1;
        continue;
      }
      const double v = data_[static_cast<size_t>(j)];
      const Index k = j - f.offset;
      if (!std::isfinite(v)) {
        std::ostringstream os;
        os << where << ": statistic " << f.name << " entry " << k << " must be finite (got " << v << ")";
        throw ValueError(os.str());
      }
      if (f.kind == FieldKind::kCount && v < 0.0) {
        std::ostringstream os;
        os.precision(17);
        os << where << ": count statistic " << f.name << " entry " << k << " must be >= 0 (got " << v << ")";
        throw ValueError(os.str());
      }
    }
  }
}

void FlatStats::add_unchecked(std::span<const double> values) {
  double* __restrict dst = data_.data();
  const double* __restrict src = values.data();
  const size_t n = data_.size();
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

void FlatStats::scale_unchecked(double c) {
  for (double& v : data_) v *= c;
}

void FlatStats::assign_unchecked(std::span<const double> values) {
  std::copy(values.begin(), values.end(), data_.begin());
}

}  // namespace attnmix
