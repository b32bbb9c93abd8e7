// SPDX-License-Identifier: Apache-2.0
/// @file random_responsibility.hpp
/// A random valid responsibility-attention model for tests: standard normal key means, Dirichlet(1) emission rows
/// and position prior (every entry positive).
#pragma once

#include <cstddef>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/rng.hpp"

namespace attnmix::testing {

inline ResponsibilityAttentionParams random_responsibility_params(Index S, Index N, Index D, Index T, Rng& rng,
                                                                  double sigma2) {
  ResponsibilityAttentionParams p;
  p.key_means.resize(S, D);
  for (Index k = 0; k < p.key_means.size(); ++k) p.key_means.data()[k] = rng.normal();
  p.emission.resize(S, T);
  for (Index s = 0; s < S; ++s) rng.dirichlet_ones({p.emission.data() + s * T, static_cast<size_t>(T)});
  p.position_prior.resize(N);
  rng.dirichlet_ones({p.position_prior.data(), static_cast<size_t>(N)});
  p.sigma2 = sigma2;
  return p;
}

}  // namespace attnmix::testing
