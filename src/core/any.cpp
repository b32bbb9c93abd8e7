// SPDX-License-Identifier: Apache-2.0
// Keyed parameter tying over type-erased accumulators (docs/mechanisms.md#building-blocks): depth-first, this site
// before its children.
#include "attnmix/core/any.hpp"

namespace attnmix {

void AnyAccumulator::key_merge(KeyPool& pool) {
  if (const std::optional<std::string> key = keys()) {
    const auto it = pool.find(*key);
    if (it == pool.end())
      pool.emplace(*key, this);  // the first site becomes the pool
    else
      it->second->combine(*this);
  }
  for (AnyAccumulator& child : self_->children()) child.key_merge(pool);
}

void AnyAccumulator::key_replace(const KeyPool& pool) {
  if (const std::optional<std::string> key = keys()) {
    const auto it = pool.find(*key);
    if (it != pool.end() && it->second != this) from_value(*it->second);
  }
  for (AnyAccumulator& child : self_->children()) child.key_replace(pool);
}

}  // namespace attnmix
