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

/// The starting value of one stream: a SplitMix64 mix of seed, then purpose, then index (an iteration, a
/// component, a block), so that each purpose and index of one run gets its own, statistically unrelated stream.
/// A pure function, the same on every platform. O(1).
[[nodiscard]] uint64_t derive_seed(uint64_t seed, SeedPurpose purpose, uint64_t index);

/// One random stream: std::mt19937_64 with the in-house distributions of the file comment, so that its draws are
/// the same with every standard library. Not thread-safe; each thread or chunk that draws uses its own stream.
class Rng {
 public:
  /// A stream started from seed (usually a derive_seed value).
  explicit Rng(uint64_t seed = 0) : engine_(seed) {}

  /// The next raw 64-bit output of the engine.
  [[nodiscard]] uint64_t next_u64() { return engine_(); }
  /// Uniform on [0, 1) with 53 random bits.
  [[nodiscard]] double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  /// Uniform on (0, 1): never 0, so log is finite.
  [[nodiscard]] double uniform_open();
  /// A standard normal N(0, 1) draw by the Marsaglia polar method: each pair of uniforms gives two normals, the
  /// second of which is kept for the next call.
  [[nodiscard]] double normal();
  /// An Exponential(1) draw, −log U with U = uniform_open(), so it is finite and ≥ 0.
  [[nodiscard]] double exponential();
  /// A standard Gumbel draw, −log(−log U) with U = uniform_open().
  [[nodiscard]] double gumbel();
  /// true with probability p (one uniform() draw): always false for p ≤ 0, always true for p ≥ 1.
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
