// SPDX-License-Identifier: Apache-2.0
/// @file rng.hpp
/// attnmix's own random streams (`docs/mechanisms.md#training`): std::mt19937_64 plus in-house distributions, so a seed
/// gives the same draws with every standard library. Never std::*_distribution (implementation-defined output).
///   uniform()        53 random bits × 2⁻⁵³ ∈ [0, 1);  uniform_open() ∈ (0, 1)
///   normal()         Marsaglia polar method (the spare value is cached)
///   exponential()    −log U, U ∈ (0, 1)
///   gumbel()         −log(−log U)
///   dirichlet_ones() normalised Exponential(1) draws
///   categorical(p)   inverse CDF over the running sum
///   uniform_int(n)   unbiased rejection on 64-bit draws
///   sample_without_replacement(n, k)  partial Fisher–Yates
/// derive_seed(seed, purpose, index): SplitMix64 over the three inputs, each mixed in turn.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace attnmix {

/// Purposes for derive_seed: distinct purposes give independent streams.
enum class SeedPurpose : uint64_t { kInit = 1, kMcNoise = 2, kSampler = 3, kInitWeights = 4, kData = 5 };

[[nodiscard]] uint64_t derive_seed(uint64_t seed, SeedPurpose purpose, uint64_t index);

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : engine_(seed) {}

  [[nodiscard]] uint64_t next_u64() { return engine_(); }
  /// Uniform on [0, 1) with 53 random bits.
  [[nodiscard]] double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  /// Uniform on (0, 1): never 0, so log is finite.
  [[nodiscard]] double uniform_open();
  [[nodiscard]] double normal();
  [[nodiscard]] double exponential();
  [[nodiscard]] double gumbel();
  [[nodiscard]] bool bernoulli(double p) { return uniform() < p; }
  /// Uniform integer in [0, n), n ≥ 1.
  [[nodiscard]] uint64_t uniform_int(uint64_t n);
  /// Index drawn with probability p[i] / Σ p (p ≥ 0, Σ p > 0).
  [[nodiscard]] int64_t categorical(std::span<const double> p);
  /// Fills out with a Dirichlet(1, …, 1) draw.
  void dirichlet_ones(std::span<double> out);
  /// Advances the stream exactly as `count` calls of dirichlet_ones with `dim` entries would (the uniforms are drawn,
  /// the logs are not taken). For the draws a distributed initialisation makes for other processes' rows.
  void discard_dirichlet_ones(int64_t count, int64_t dim);
  /// k distinct values of [0, n) in draw order (k ≤ n).
  [[nodiscard]] std::vector<int64_t> sample_without_replacement(int64_t n, int64_t k);

 private:
  std::mt19937_64 engine_;
  bool has_spare_normal_ = false;
  double spare_normal_ = 0.0;
};

}  // namespace attnmix
