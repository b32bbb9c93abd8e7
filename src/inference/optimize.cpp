// SPDX-License-Identifier: Apache-2.0
#include "attnmix/inference/optimize.hpp"

#include "attnmix/core/check.hpp"

namespace attnmix {

void OptimizeOptions::validate() const {
  constexpr const char* kWhere = "optimize";
  if (max_its < 0) throw ValueError("optimize: max_its must be >= 0 (got " + std::to_string(max_its) + ")");
  if (delta && std::isnan(*delta)) throw ValueError("optimize: delta must be a number or None");
  if (std::isnan(init_p)) throw ValueError("optimize: init_p must be a number");
  check::positive_int(kWhere, "print_iter", print_iter);
  parallel().validate();
}

void detail::require_rows(Index local_rows, const Communicator* comm) {
  if (sum_over_ranks(static_cast<double>(local_rows), comm) == 0.0)
    throw ValueError("optimize: the data has no rows (an empty batch leaves nothing to fit)");
}

}  // namespace attnmix
