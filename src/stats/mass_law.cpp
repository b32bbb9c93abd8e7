// SPDX-License-Identifier: Apache-2.0
#include "attnmix/stats/mass_law.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "attnmix/core/errors.hpp"

namespace attnmix {

double tol_mass(double a, double b) {
  return 64.0 * 0x1.0p-23 * std::max({1.0, std::fabs(a), std::fabs(b)});
}

void check_mass_law(std::string_view where, std::string_view declared_name, double declared,
                    std::string_view assigned_name, double assigned) {
  const double tol = tol_mass(declared, assigned);
  std::ostringstream os;
  os.precision(17);
  if (!std::isfinite(declared) || !std::isfinite(assigned)) {
    os << where << ": " << assigned_name << " (" << assigned << ") and " << declared_name << " (" << declared
       << ") must be finite";
    throw ValueError(os.str());
  }
  if (assigned > declared + tol) {
    os << where << ": " << assigned_name << " (" << assigned << ") cannot exceed " << declared_name << " ("
       << declared << ")";
    throw ValueError(os.str());
  }
  if (declared - assigned > tol) {
    os << where << ": " << assigned_name << " (" << assigned << ") must equal " << declared_name << " ("
       << declared << ")";
    throw ValueError(os.str());
  }
}

}  // namespace attnmix
