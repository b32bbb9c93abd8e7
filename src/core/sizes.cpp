// SPDX-License-Identifier: Apache-2.0
#include "attnmix/core/sizes.hpp"

#include <string>

#include "attnmix/core/errors.hpp"

namespace attnmix {

namespace {
std::string extents_text(const int64_t* extents, size_t n) {
  std::string text;
  for (size_t k = 0; k < n; ++k) text += (k ? " x " : "") + std::to_string(extents[k]);
  return text;
}
}  // namespace

int64_t checked_product(std::string_view where, std::string_view what, const int64_t* extents, size_t n_extents) {
  for (size_t k = 0; k < n_extents; ++k) {
    if (extents[k] < 0)
      throw ValueError(std::string(where) + ": " + std::string(what) + ": extent " + std::to_string(k) +
                       " is negative (got " + std::to_string(extents[k]) + ")");
    if (extents[k] == 0) return 0;  // an empty array, whatever the other extents are
  }
  int64_t product = 1;
  for (size_t k = 0; k < n_extents; ++k) {
    if (extents[k] > kMaxElements / product)  // product · e > kMaxElements, without overflowing
      throw ValueError(std::string(where) + ": " + std::string(what) + " (" + extents_text(extents, n_extents) +
                       ") must have at most 2^48 elements");
    product *= extents[k];
  }
  return product;
}

int64_t checked_product(std::string_view where, std::string_view what, std::initializer_list<int64_t> extents) {
  return checked_product(where, what, extents.begin(), extents.size());
}

}  // namespace attnmix
