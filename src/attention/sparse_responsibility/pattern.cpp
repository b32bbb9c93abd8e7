// SPDX-License-Identifier: Apache-2.0
// The cells a sparse table lists (SparsePattern) and the patterns of a data set (sparse_responsibility.hpp).
#include <algorithm>
#include <string>
#include <utility>

#include "attnmix/attention/sparse_responsibility.hpp"
#include "attnmix/core/errors.hpp"

namespace attnmix {

namespace {
constexpr const char* kWhere = "SparsePattern";

void check_shape(Index rows, Index cols) {
  if (rows < 1 || cols < 1)
    throw ValueError(std::string(kWhere) + ": a table of " + std::to_string(rows) + " x " + std::to_string(cols) +
                     " cells has none (both sizes must be positive)");
}
}  // namespace

SparsePattern SparsePattern::of_cells(Index rows, Index cols, std::span<const int64_t> cell_rows,
                                     std::span<const int64_t> cell_cols) {
  check_shape(rows, cols);
  if (cell_rows.size() != cell_cols.size())
    throw ValueError(std::string(kWhere) + ": " + std::to_string(cell_rows.size()) + " cell rows but " +
                     std::to_string(cell_cols.size()) + " cell columns");
  std::vector<std::pair<int64_t, int64_t>> cells(cell_rows.size());
  for (size_t k = 0; k < cells.size(); ++k) {
    if (cell_rows[k] < 0 || cell_rows[k] >= rows || cell_cols[k] < 0 || cell_cols[k] >= cols)
      throw ValueError(std::string(kWhere) + ": cell " + std::to_string(k) + " (" + std::to_string(cell_rows[k]) +
                       ", " + std::to_string(cell_cols[k]) + ") lies outside the " + std::to_string(rows) + " x " +
                       std::to_string(cols) + " table");
    cells[k] = {cell_rows[k], cell_cols[k]};
  }
  std::sort(cells.begin(), cells.end());
  cells.erase(std::unique(cells.begin(), cells.end()), cells.end());
  std::vector<int64_t> row_begin(static_cast<size_t>(rows) + 1, 0);
  std::vector<int64_t> columns;
  columns.reserve(cells.size());
  for (const auto& [r, c] : cells) {
    ++row_begin[static_cast<size_t>(r) + 1];
    columns.push_back(c);
  }
  for (size_t r = 0; r < static_cast<size_t>(rows); ++r) row_begin[r + 1] += row_begin[r];
  return {rows, cols, std::move(row_begin), std::move(columns)};
}

SparsePattern::SparsePattern(Index rows, Index cols, std::vector<int64_t> row_begin, std::vector<int64_t> columns)
    : rows_(rows), cols_(cols), row_begin_(std::move(row_begin)), columns_(std::move(columns)) {
  check_shape(rows, cols);
  if (row_begin_.size() != static_cast<size_t>(rows) + 1 || row_begin_.front() != 0 ||
      row_begin_.back() != static_cast<int64_t>(columns_.size()))
    throw ValueError(std::string(kWhere) + ": row_begin must hold rows + 1 = " + std::to_string(rows + 1) +
                     " offsets from 0 to the number of columns listed, " + std::to_string(columns_.size()));
  for (Index r = 0; r < rows; ++r) {
    if (end(r) < begin(r))
      throw ValueError(std::string(kWhere) + ": row_begin decreases at row " + std::to_string(r));
    for (Index k = begin(r); k < end(r); ++k)
      if (column(k) < 0 || column(k) >= cols || (k > begin(r) && column(k) <= column(k - 1)))
        throw ValueError(std::string(kWhere) + ": the columns of row " + std::to_string(r) +
                         " must increase strictly within [0, " + std::to_string(cols) + ") (entry " +
                         std::to_string(k) + " is " + std::to_string(column(k)) + ")");
  }
}

Index SparsePattern::find(Index r, int64_t c) const noexcept {
  const auto first = columns_.begin() + begin(r);
  const auto last = columns_.begin() + end(r);
  const auto it = std::lower_bound(first, last, c);
  return it != last && *it == c ? static_cast<Index>(it - columns_.begin()) : -1;
}

bool SparsePatterns::operator==(const SparsePatterns& other) const {
  const auto same = [](const std::shared_ptr<const SparsePattern>& x, const std::shared_ptr<const SparsePattern>& y) {
    return x == y || (x && y && *x == *y);
  };
  return same(keys, other.keys) && same(emission, other.emission);
}

void SparsePatterns::check(const char* where) const {
  if (!keys || !emission) throw ValueError(std::string(where) + ": both patterns (keys and emission) are required");
  if (keys->rows() != emission->rows())
    throw ValueError(std::string(where) + ": the key pattern has " + std::to_string(keys->rows()) +
                     " rows but the emission pattern " + std::to_string(emission->rows()) +
                     " (both have one per context symbol)");
}

SparsePatterns data_patterns(const ResponsibilityAttentionBatch& batch, Index S, Index D, Index T) {
  constexpr const char* where = "data_patterns";
  if (batch.n_rows() > 0 && !batch.has_symbol_queries())
    throw ValueError(std::string(where) + ": sparse tables need symbol queries (got real-valued ones)");
  const Index n = batch.n_rows();
  const Index N = batch.context_length();
  std::vector<int64_t> rows(static_cast<size_t>(n * N));
  std::vector<int64_t> queries(rows.size());
  std::vector<int64_t> targets(rows.size());
  for (Index r = 0; r < n; ++r)
    for (Index i = 0; i < N; ++i) {
      const auto k = static_cast<size_t>(r * N + i);
      rows[k] = batch.context(r)[i];
      queries[k] = batch.query_symbol(r);
      targets[k] = batch.target(r);
    }
  return {std::make_shared<const SparsePattern>(SparsePattern::of_cells(S, D, rows, queries)),
          std::make_shared<const SparsePattern>(SparsePattern::of_cells(S, T, rows, targets))};
}

}  // namespace attnmix
