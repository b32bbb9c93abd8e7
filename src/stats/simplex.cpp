// SPDX-License-Identifier: Apache-2.0
#include "attnmix/stats/simplex.hpp"

#include "attnmix/stats/log_math.hpp"

namespace attnmix {

void smoothed_row_normalise_rows(const ConstMatrixMap& counts, double eps, Index begin, Index end, Matrix& out) {
  const Index T = counts.cols();
  for (Index s = begin; s < end; ++s) {
    auto row = out.row(s);
    row = counts.row(s).array() + eps;
    const double total = accurate_sum({row.data(), static_cast<size_t>(T)});
    if (total > 0.0)
      row /= total;
    else
      row.setConstant(1.0 / static_cast<double>(T));
  }
}

}  // namespace attnmix
