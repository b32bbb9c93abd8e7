// SPDX-License-Identifier: Apache-2.0
// The families that declare kInitializesRowByRow: initialize() over consecutive pieces of a batch (with zero-weight
// rows among them) equals one call over the whole batch, bit for bit, and leaves the random stream in the same
// state. A distributed fit relies on it when it replays other ranks' rows in blocks (inference/optimize.hpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <span>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/rng.hpp"

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

/// Weights with zeros (rows that only consume draws), as a distributed fit's stand-ins and unsampled rows are.
std::vector<double> weights(Rng& rng) {
  std::vector<double> w(static_cast<size_t>(kRows));
  for (double& v : w) v = rng.uniform() < 0.3 ? 0.0 : 0.5 + rng.uniform();
  return w;
}

/// One call over every row against calls over [0, 5), [5, 6), [6, 20), [20, kRows) with the same stream.
template <class Acc, class Batch>
void expect_pieces_equal_whole(const Acc& prototype, const Batch& batch, const std::vector<double>& w) {
  Acc whole = prototype;
  Rng rng_whole(99);
  whole.initialize(batch, w, rng_whole);
  Acc pieces = prototype;
  Rng rng_pieces(99);
  const Index cuts[] = {0, 5, 6, 20, kRows};
  for (size_t k = 0; k + 1 < std::size(cuts); ++k)
    pieces.initialize(batch.slice(cuts[k], cuts[k + 1] - cuts[k]),
                      std::span<const double>(w).subspan(static_cast<size_t>(cuts[k]),
                                                         static_cast<size_t>(cuts[k + 1] - cuts[k])),
                      rng_pieces);
  EXPECT_TRUE(pieces == whole);
  EXPECT_EQ(rng_pieces.uniform(), rng_whole.uniform());  // the same number of draws
  double mass = 0.0;
  for (double v : whole.flat()) mass += v < 0.0 ? -v : v;
  EXPECT_GT(mass, 0.0);  // the rows did add something
}

TEST(InitializePiecesTest, ResponsibilityAttention) {
  static_assert(ResponsibilityAttentionAccumulator::kInitializesRowByRow);
  Rng rng(1);
  Matrix queries(kRows, kD);
  for (Index k = 0; k < queries.size(); ++k) queries.data()[k] = rng.normal();
  const auto batch = ResponsibilityAttentionEncoder{kS, kN, kD, kT}.encode(random_ids(kRows, kN, kS, rng), queries,
                                                                           random_ids(kRows, kT, rng));
  expect_pieces_equal_whole(ResponsibilityAttentionAccumulator(kS, kN, kD, kT), batch, weights(rng));
}

TEST(InitializePiecesTest, VariationalEmbeddingAttention) {
  static_assert(VariationalEmbeddingAttentionAccumulator::kInitializesRowByRow);
  Rng rng(2);
  const auto batch = VariationalEmbeddingAttentionEncoder{kS, kN, kT}.encode(
      random_ids(kRows, kN, kS, rng), random_ids(kRows, kS, rng), random_ids(kRows, kT, rng));
  expect_pieces_equal_whole(VariationalEmbeddingAttentionAccumulator(kS, kN, kD, kT), batch, weights(rng));
}

TEST(InitializePiecesTest, VariationalMultiHopAttention) {
  static_assert(VariationalMultiHopAttentionAccumulator::kInitializesRowByRow);
  Rng rng(3);
  const auto batch = ChainedAttentionEncoder{kS, kT}.encode(random_ids(kRows, kN, kS, rng),
                                                            random_ids(kRows, kN, kS, rng),
                                                            random_ids(kRows, kS, rng), random_ids(kRows, kT, rng));
  expect_pieces_equal_whole(VariationalMultiHopAttentionAccumulator(kS, kD, kT), batch, weights(rng));
}

}  // namespace
}  // namespace attnmix
