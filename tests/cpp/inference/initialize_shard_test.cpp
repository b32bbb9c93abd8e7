// SPDX-License-Identifier: Apache-2.0
// initialize_shard (what each rank of a distributed fit runs, inference/optimize.hpp), for every family and for
// mixtures and composites (whose children replay their own draws), against an independent formulation: one initialize() call over every row of the data set with zero weight on the rows outside the shard.
// Rows of weight 0 add nothing, so the statistics must be equal bit for bit, and the random stream must be left in
// the same state (the same number of draws), for shards at the start, in the middle, at the end, empty and whole.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stats/categorical.hpp"
#include "attnmix/stats/composite.hpp"
#include "attnmix/stats/gaussian.hpp"
#include "attnmix/stats/mixture.hpp"

namespace attnmix {
namespace {

constexpr Index kRows = 37;
constexpr int64_t kS = 7, kN = 4, kD = 3, kT = 5;

IdMatrix random_ids(Index rows, Index cols, int64_t bound, Rng& rng) {
  IdMatrix m(rows, cols);
  for (Index k = 0; k < m.size(); ++k) m.data()[k] = static_cast<int64_t>(rng.uniform_int(static_cast<uint64_t>(bound)));
  return m;
}
IdVector random_ids(Index rows, int64_t bound, Rng& rng) { return random_ids(rows, 1, bound, rng).col(0); }

/// Weights with zeros among them, as a fit's unsampled rows are.
std::vector<double> weights(Rng& rng) {
  std::vector<double> w(static_cast<size_t>(kRows));
  for (double& v : w) v = rng.uniform() < 0.3 ? 0.0 : 0.5 + rng.uniform();
  return w;
}

/// The statistics in layout order.
template <class Acc>
std::vector<double> packed(const Acc& acc) {
  std::vector<double> out(static_cast<size_t>(acc.flat_size()));
  acc.pack(out);
  return out;
}

/// For every shard [begin, end) of the rows: initialize_shard(shard, its weights, begin, kRows − end) equals
/// initialize(all rows, weights zeroed outside the shard), statistics and stream alike.
template <class Acc, class Batch>
void expect_shards_equal_zero_weighted_whole(const Acc& prototype, const Batch& batch, const std::vector<double>& w) {
  const Index shards[][2] = {{0, kRows}, {0, 5}, {5, 6}, {6, 20}, {20, kRows}, {11, 11}, {0, 0}, {kRows, kRows}};
  for (const auto& [begin, end] : shards) {
    std::vector<double> zeroed(static_cast<size_t>(kRows), 0.0);
    for (Index r = begin; r < end; ++r) zeroed[static_cast<size_t>(r)] = w[static_cast<size_t>(r)];
    Acc whole = prototype;
    Rng rng_whole(99);
    whole.initialize(batch, zeroed, rng_whole);

    Acc shard = prototype;
    Rng rng_shard(99);
    shard.initialize_shard(batch.slice(begin, end - begin),
                           std::span<const double>(w).subspan(static_cast<size_t>(begin),
                                                              static_cast<size_t>(end - begin)),
                           rng_shard, begin, kRows - end);
    EXPECT_TRUE(shard == whole) << "shard [" << begin << ", " << end << ")";
    EXPECT_EQ(rng_shard.next_u64(), rng_whole.next_u64()) << "shard [" << begin << ", " << end << ")";
    double mass = 0.0;
    for (double v : packed(shard)) mass += v < 0.0 ? -v : v;
    if (end - begin > 1) {
      EXPECT_GT(mass, 0.0) << "shard [" << begin << ", " << end << ")";  // the rows added something
    }
  }
}

Matrix random_normals(Index rows, Index cols, Rng& rng) {
  Matrix m(rows, cols);
  for (Index k = 0; k < m.size(); ++k) m.data()[k] = rng.normal();
  return m;
}

ResponsibilityAttentionBatch attention_batch(Rng& rng) {
  return ResponsibilityAttentionEncoder{kS, kN, kD, kT}.encode(random_ids(kRows, kN, kS, rng),
                                                               random_normals(kRows, kD, rng),
                                                               random_ids(kRows, kT, rng));
}

TEST(InitializeShardTest, ResponsibilityAttention) {
  Rng rng(1);
  const auto batch = attention_batch(rng);
  expect_shards_equal_zero_weighted_whole(ResponsibilityAttentionAccumulator(kS, kN, kD, kT), batch, weights(rng));
}

/// Mixture: every row's component weights are drawn first, then each component's own draws over every row.
TEST(InitializeShardTest, MixtureOfAttentionHeads) {
  Rng rng(9);
  const AnyBatch batch(attention_batch(rng));
  const AnyAccumulator head(ResponsibilityAttentionAccumulator(kS, kN, kD, kT));
  expect_shards_equal_zero_weighted_whole(MixtureAccumulator({head, head, head}), batch, weights(rng));
}

/// Composite: children in field order, draw-free leaves beside a mixture that draws.
TEST(InitializeShardTest, CompositeWithANestedMixture) {
  Rng rng(10);
  const CompositeBatch batch({AnyBatch(CategoricalEncoder{kT}.encode(random_ids(kRows, kT, rng))),
                              AnyBatch(DiagonalGaussianEncoder{2}.encode(random_normals(kRows, 2, rng))),
                              AnyBatch(attention_batch(rng))});
  const AnyAccumulator head(ResponsibilityAttentionAccumulator(kS, kN, kD, kT));
  const CompositeAccumulator prototype({AnyAccumulator(CategoricalAccumulator(kT)),
                                        AnyAccumulator(DiagonalGaussianAccumulator(2)),
                                        AnyAccumulator(MixtureAccumulator({head, head}))});
  expect_shards_equal_zero_weighted_whole(prototype, batch, weights(rng));
}

TEST(InitializeShardTest, VariationalEmbeddingAttention) {
  Rng rng(2);
  const auto batch = VariationalEmbeddingAttentionEncoder{kS, kN, kT}.encode(
      random_ids(kRows, kN, kS, rng), random_ids(kRows, kS, rng), random_ids(kRows, kT, rng));
  expect_shards_equal_zero_weighted_whole(VariationalEmbeddingAttentionAccumulator(kS, kN, kD, kT), batch,
                                          weights(rng));
}

ChainedAttentionBatch chained_batch(Rng& rng) {
  return ChainedAttentionEncoder{kS, kT}.encode(random_ids(kRows, kN, kS, rng), random_ids(kRows, kN, kS, rng),
                                                random_ids(kRows, kS, rng), random_ids(kRows, kT, rng));
}

TEST(InitializeShardTest, VariationalMultiHopAttention) {
  Rng rng(3);
  const auto batch = chained_batch(rng);
  expect_shards_equal_zero_weighted_whole(VariationalMultiHopAttentionAccumulator(kS, kD, kT), batch, weights(rng));
}

// Chained attention draws hop-major (every row's γ_0, then every row's γ_1, ..., then the ξ hops), so the other
// rows' draws are interleaved with the shard's: one to four hops cover no ξ, only the row-by-row last ξ hop, and
// stored ξ hops before it.
TEST(InitializeShardTest, ChainedAttentionEveryHopCount) {
  for (int64_t hops = 1; hops <= 4; ++hops) {
    SCOPED_TRACE("L = " + std::to_string(hops));
    Rng rng(static_cast<uint64_t>(4 + hops));
    const auto batch = chained_batch(rng);
    expect_shards_equal_zero_weighted_whole(ChainedAttentionAccumulator(hops, kS, kT), batch, weights(rng));
  }
}

}  // namespace
}  // namespace attnmix
