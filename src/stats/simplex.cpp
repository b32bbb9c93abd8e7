// SPDX-License-Identifier: Apache-2.0
#include "attnmix/stats/simplex.hpp"

#include "attnmix/stats/log_math.hpp"

namespace attnmix {

Matrix smoothed_row_normalise(const ConstMatrixMap& counts, double eps) {
  const Index T = counts.cols();
  Matrix out = counts.array() + eps;
  for (Index s = 0; s < out.rows(); ++s) {
    auto row = out.row(s);
    const double total = accurate_sum({row.data(), static_cast<size_t>(T)});
    if (total > 0.0)
      row /= total;
    else
      row.setConstant(1.0 / static_cast<double>(T));
  }
  return out;
}

}  // namespace attnmix
