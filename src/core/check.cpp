// SPDX-License-Identifier: Apache-2.0
#include "attnmix/core/check.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <sstream>

#include "attnmix/core/errors.hpp"
#include "attnmix/stats/log_math.hpp"

namespace attnmix::check {

namespace {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  os.precision(17);
  (os << ... << parts);
  return os.str();
}

/// The shortest text that reads back as x ("1e+50", not "1.0000000000000001e+50"), for quoting bounds.
std::string shortest(double x) {
  std::array<char, 32> buf{};
  const auto result = std::to_chars(buf.data(), buf.data() + buf.size(), x);
  return {buf.data(), result.ptr};
}
}  // namespace

void positive_real(std::string_view where, std::string_view name, double value) {
  if (!(std::isfinite(value) && value > 0.0))
    throw ValueError(concat(where, ": ", name, " must be a positive finite real (got ", value, ")"));
}

void variance(std::string_view where, std::string_view name, double value) {
  if (!(std::isfinite(value) && value >= kMinVariance))
    throw ValueError(concat(where, ": ", name, " must be a finite real >= ", shortest(kMinVariance), " (got ", value, ")"));
}

void bounded_reals(std::string_view where, std::string_view name, std::span<const double> values) {
  if (values.empty()) throw ValueError(concat(where, ": ", name, " must be non-empty"));
  for (size_t i = 0; i < values.size(); ++i)
    if (!(std::fabs(values[i]) <= kMaxMagnitude))
      throw ValueError(concat(where, ": ", name, " entry ", i, " must be finite with magnitude at most ", shortest(kMaxMagnitude),
                              " (got ", values[i], ")"));
}

void bounded_rows(std::string_view where, std::string_view row_name, const Matrix& values) {
  for (Index k = 0; k < values.size(); ++k)
    if (!(std::fabs(values.data()[k]) <= kMaxMagnitude))
      throw ValueError(concat(where, ": ", row_name, " row ", k / values.cols(), " must be finite with magnitude at most ",
                              shortest(kMaxMagnitude), " (column ", k % values.cols(), " is ", values.data()[k], ")"));
}

void log_variances(std::string_view where, std::string_view name, std::span<const double> values) {
  const double bound = 2.0 * std::log(kMaxMagnitude);
  if (values.empty()) throw ValueError(concat(where, ": ", name, " must be non-empty"));
  for (size_t i = 0; i < values.size(); ++i)
    if (!(std::fabs(values[i]) <= bound))
      throw ValueError(concat(where, ": ", name, " entry ", i, " must be finite with magnitude at most ", bound,
                              " = 2 ln ", shortest(kMaxMagnitude), " (got ", values[i], ")"));
}

void nonnegative_real(std::string_view where, std::string_view name, double value) {
  if (!(std::isfinite(value) && value >= 0.0))
    throw ValueError(concat(where, ": ", name, " must be a finite real >= 0 (got ", value, ")"));
}

void positive_int(std::string_view where, std::string_view name, int64_t value) {
  if (value <= 0) throw ValueError(concat(where, ": ", name, " must be a positive integer (got ", value, ")"));
}

void finite_nonempty(std::string_view where, std::string_view name, std::span<const double> values) {
  if (values.empty()) throw ValueError(concat(where, ": ", name, " must be non-empty"));
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i]))
      throw ValueError(concat(where, ": ", name, " must be finite (entry ", i, " is ", values[i], ")"));
}

void simplex(std::string_view where, std::string_view name, std::span<const double> p) {
  if (p.empty()) throw ValueError(concat(where, ": ", name, " must be a non-empty probability vector"));
  for (size_t i = 0; i < p.size(); ++i)
    if (!std::isfinite(p[i]) || p[i] < 0.0)
      throw ValueError(concat(where, ": ", name, " entry ", i, " must be finite and >= 0 (got ", p[i], ")"));
  const double total = accurate_sum(p);
  if (!(std::fabs(total - 1.0) <= 1e-12))
    throw ValueError(concat(where, ": ", name, " must sum to 1 within 1e-12 (sum ", total, ")"));
}

void row_simplex(std::string_view where, std::string_view name, const Matrix& p,
                 std::optional<Index> expected_rows) {
  if (p.rows() == 0 || p.cols() == 0)
    throw ValueError(concat(where, ": ", name, " must be a non-empty 2-D array (got ", p.rows(), "x", p.cols(), ")"));
  if (expected_rows && p.rows() != *expected_rows)
    throw ValueError(concat(where, ": ", name, " must have ", *expected_rows, " rows (got ", p.rows(), ")"));
  for (Index r = 0; r < p.rows(); ++r) {
    const std::span<const double> row(p.data() + r * p.cols(), static_cast<size_t>(p.cols()));
    for (Index c = 0; c < p.cols(); ++c)
      if (!std::isfinite(row[c]) || row[c] < 0.0)
        throw ValueError(concat(where, ": ", name, " entry [", r, ", ", c, "] must be finite and >= 0 (got ",
                                row[c], ")"));
    const double total = accurate_sum(row);
    if (!(std::fabs(total - 1.0) <= 1e-12))
      throw ValueError(concat(where, ": ", name, " row ", r, " must sum to 1 within 1e-12 (sum ", total, ")"));
  }
}

void dimension(std::string_view where, std::string_view name, Index expected, Index seen) {
  if (expected != seen)
    throw ValueError(concat(where, ": ", name, " must be ", expected, " (got ", seen, ")"));
}

void ids(std::string_view where, std::string_view name, std::span<const int64_t> values,
         std::optional<int64_t> bound) {
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t v = values[i];
    if (v < 0 || (bound && v >= *bound))
      throw ValueError(concat(where, ": out-of-range ID in ", name, " (entry ", i, " is ", v, "; must be in [0, ",
                              bound ? std::to_string(*bound) : std::string("inf"), "))"));
  }
}

int64_t exact_id(std::string_view where, std::string_view name, double value, std::optional<int64_t> bound) {
  if (!std::isfinite(value) || value != std::floor(value))
    throw ValueError(concat(where, ": ", name, " must be an exact integer id (got ", value, ")"));
  if (value < 0.0 || (bound && value >= static_cast<double>(*bound)) || value > 9.0e15)
    throw ValueError(concat(where, ": out-of-range ID in ", name, " (got ", value, "; must be in [0, ",
                            bound ? std::to_string(*bound) : std::string("inf"), "))"));
  return static_cast<int64_t>(value);
}

void weights(std::string_view where, std::span<const double> w, Index n_rows) {
  if (static_cast<Index>(w.size()) != n_rows)
    throw ValueError(concat(where, ": weights must have shape (", n_rows, ",) (got ", w.size(), ")"));
  for (size_t i = 0; i < w.size(); ++i)
    if (!std::isfinite(w[i]) || w[i] < 0.0)
      throw ValueError(concat(where, ": weight ", i, " must be finite and >= 0 (got ", w[i], ")"));
}

}  // namespace attnmix::check
