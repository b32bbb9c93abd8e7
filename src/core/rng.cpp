// SPDX-License-Identifier: Apache-2.0
#include "attnmix/core/rng.hpp"

#include <cmath>
#include <numeric>

#include "attnmix/core/errors.hpp"

namespace attnmix {

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t derive_seed(uint64_t seed, SeedPurpose purpose, uint64_t index) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ static_cast<uint64_t>(purpose));
  return splitmix64(h ^ index);
}

double Rng::uniform_open() {
  for (;;) {
    const double u = uniform();
    if (u > 0.0) return u;
  }
}

double Rng::normal() {
  if (has_spare_normal_) {
    has_spare_normal_ = false;
    return spare_normal_;
  }
  double u, v, s;
  do {
    u = 2.0 * uniform() - 1.0;
    v = 2.0 * uniform() - 1.0;
    s = u * u + v * v;
  } while (s >= 1.0 || s == 0.0);
  const double factor = std::sqrt(-2.0 * std::log(s) / s);
  spare_normal_ = v * factor;
  has_spare_normal_ = true;
  return u * factor;
}

double Rng::exponential() { return -std::log(uniform_open()); }

double Rng::gumbel() { return -std::log(-std::log(uniform_open())); }

uint64_t Rng::uniform_int(uint64_t n) {
  ATTNMIX_ASSERT(n >= 1, "uniform_int needs n >= 1");
  // Reject the top partial block so every residue is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (;;) {
    const uint64_t x = engine_();
    if (x < limit) return x % n;
  }
}

int64_t Rng::categorical(std::span<const double> p) {
  double total = 0.0;
  for (double v : p) total += v;
  ATTNMIX_ASSERT(total > 0.0, "categorical needs positive total mass");
  const double u = uniform() * total;
  double running = 0.0;
  int64_t last_positive = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0.0) continue;
    running += p[i];
    last_positive = static_cast<int64_t>(i);
    if (u < running) return last_positive;
  }
  return last_positive;  // u landed in the rounding gap at the top
}

void Rng::dirichlet_ones(std::span<double> out) {
  double total = 0.0;
  for (double& v : out) {
    v = exponential();
    total += v;
  }
  for (double& v : out) v /= total;
}

void Rng::discard_dirichlet_ones(int64_t count, int64_t dim) {
  ATTNMIX_ASSERT(count >= 0 && dim >= 0, "discard_dirichlet_ones needs count, dim >= 0");
  for (int64_t k = 0; k < count * dim; ++k) static_cast<void>(uniform_open());
}

std::vector<int64_t> Rng::sample_without_replacement(int64_t n, int64_t k) {
  ATTNMIX_ASSERT(k >= 0 && k <= n, "sample_without_replacement needs 0 <= k <= n");
  std::vector<int64_t> pool(static_cast<size_t>(n));
  std::iota(pool.begin(), pool.end(), int64_t{0});
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = i + static_cast<int64_t>(uniform_int(static_cast<uint64_t>(n - i)));
    std::swap(pool[static_cast<size_t>(i)], pool[static_cast<size_t>(j)]);
  }
  pool.resize(static_cast<size_t>(k));
  return pool;
}

}  // namespace attnmix
