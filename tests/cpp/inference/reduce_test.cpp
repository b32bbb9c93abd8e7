// SPDX-License-Identifier: Apache-2.0
// The chunked parallel E-step (docs/mechanisms.md#training): chunking only reassociates, impossible rows of every chunk
// are reported with global indices before anything changes, and thread counts give bitwise-identical results.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/inference/reduce.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

ResponsibilityAttention sparse_model() {
  // Symbol 2 never emits target 1, so rows whose context is all 2s with target 1 are impossible.
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Zero(3, 2);
  p.key_means(1, 0) = 1.0;
  p.emission.resize(3, 2);
  p.emission << 0.5, 0.5, 0.25, 0.75, 1.0, 0.0;
  p.position_prior = Vector::Constant(2, 0.5);
  return ResponsibilityAttention(p);
}

ResponsibilityAttentionBatch rows_with_impossible(Index n, const std::vector<Index>& bad_rows) {
  IdMatrix ctx(n, 2);
  Matrix y(n, 2);
  IdVector t(n);
  Rng rng(3);
  for (Index k = 0; k < n; ++k) {
    ctx(k, 0) = static_cast<int64_t>(rng.uniform_int(2));
    ctx(k, 1) = static_cast<int64_t>(rng.uniform_int(3));
    y(k, 0) = rng.normal();
    y(k, 1) = rng.normal();
    t[k] = static_cast<int64_t>(rng.uniform_int(2));
  }
  for (Index k : bad_rows) {
    ctx.row(k) << 2, 2;
    t[k] = 1;
  }
  return ResponsibilityAttentionEncoder{3, 2, 2, 2}.encode(ctx, y, t);
}

TEST(ParallelAccumulateTest, ReportsImpossibleRowsOfAllChunksAndChangesNothing) {
  const ResponsibilityAttention model = sparse_model();
  const auto batch = rows_with_impossible(300, {5, 130, 299});
  auto acc = model.make_accumulator();
  model.accumulate(batch.slice(0, 4), std::vector<double>(4, 1.0), acc);
  const auto before = acc.value();
  for (int threads : {1, 2, 3}) {
    try {
      parallel_accumulate(model, batch, std::vector<double>(300, 1.0), acc, {}, {threads, 64});
      FAIL() << "impossible rows accepted";
    } catch (const ImpossibleEvidenceError& e) {
      EXPECT_EQ(e.rows(), (std::vector<int64_t>{5, 130, 299}));
    }
    EXPECT_TRUE(acc == before);
  }
  std::vector<double> w(300, 1.0);
  w[5] = w[130] = w[299] = 0.0;  // zero-weight impossible rows are fine
  std::vector<double> log_p(300);
  parallel_accumulate(model, batch, w, acc, log_p, {2, 64});
  EXPECT_EQ(log_p[130], -INFINITY);
  EXPECT_TRUE(std::isfinite(log_p[131]));
}

/// Rows [begin, begin + count) of a batch that holds only its size.
struct RowRange {
  Index begin = 0, count = 0;
  [[nodiscard]] Index n_rows() const { return count; }
  [[nodiscard]] RowRange slice(Index b, Index c) const { return {begin + b, c}; }
};

/// A model whose log_density throws at the given rows, the first of them after a pause (so that, with several threads,
/// a later chunk fails first in time).
struct FailingModel {
  using batch_type = RowRange;
  std::vector<Index> failing;
  void log_density(const RowRange& rows, std::span<double> out) const {
    for (Index k = 0; k < rows.count; ++k) {
      const Index row = rows.begin + k;
      if (row == failing.front()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (std::find(failing.begin(), failing.end(), row) != failing.end())
        throw ValueError("row " + std::to_string(row));
      out[static_cast<size_t>(k)] = 0.0;
    }
  }
};

TEST(ParallelLogDensityTest, ThrowsTheFirstFailingChunksErrorForEveryThreadCount) {
  const FailingModel model{{5, 60, 61}};
  std::vector<double> out(64);
  for (int threads : {1, 2, 4}) {
    try {
      parallel_log_density(model, RowRange{0, 64}, out, {threads, 8});
      FAIL() << "no error with " << threads << " threads";
    } catch (const ValueError& e) {
      EXPECT_STREQ(e.what(), "row 5") << threads << " threads";
    }
  }
}

TEST(ParallelAccumulateTest, ChunkingOnlyReassociatesAndThreadsAreBitwiseEqual) {
  const ResponsibilityAttention model = sparse_model();
  const auto batch = rows_with_impossible(1000, {});
  std::vector<double> w(1000);
  Rng rng(5);
  for (double& v : w) v = rng.uniform();
  auto serial = model.make_accumulator();
  model.accumulate(batch, w, serial);
  std::vector<double> serial_pack(static_cast<size_t>(serial.flat_size()));
  serial.pack(serial_pack);

  auto reference = model.make_accumulator();
  std::vector<double> ref_log_p(1000);
  parallel_accumulate(model, batch, w, reference, ref_log_p, {1, 64});
  std::vector<double> ref_pack(serial_pack.size());
  reference.pack(ref_pack);
  testing::ExpectAllClose(ref_pack, serial_pack, 1e-12, 1e-13);

  for (int threads : {2, 3, 8}) {
    auto acc = model.make_accumulator();
    std::vector<double> log_p(1000);
    parallel_accumulate(model, batch, w, acc, log_p, {threads, 64});
    EXPECT_TRUE(acc == reference) << threads << " threads";
    EXPECT_EQ(log_p, ref_log_p) << threads << " threads";
    EXPECT_EQ(score(model, batch, {threads, 64}), score(model, batch, {1, 64}));
  }
}

/// chunk_rows = 0 (the default) chooses the chunk from the statistics' size alone: the largest power of two ≤ entries
/// / 16, within [1024, 65536]. The E-step then equals, bit for bit and on every thread count, the one run with that
/// chunk written out, and differs from chunks of 1024 (so the choice is really made).
TEST(ParallelAccumulateTest, DefaultChunkComesFromTheStatisticsSize) {
  EXPECT_EQ(chunk_rows_for({}, 0), 1024);
  EXPECT_EQ(chunk_rows_for({}, 16 * 2048 - 1), 1024);
  EXPECT_EQ(chunk_rows_for({}, 16 * 2048), 2048);
  EXPECT_EQ(chunk_rows_for({}, 16 * 8192 - 1), 4096);
  EXPECT_EQ(chunk_rows_for({}, size_t{1} << 40), 65536);
  EXPECT_EQ(chunk_rows_for({4, 7}, size_t{1} << 40), 7);  // an explicit chunk is kept
  EXPECT_THROW((ParallelOptions{1, -1}.validate()), ValueError);

  // S = T = 256, N = 4, D = 2: S·D + S + S·T + N + 1 = 66 309 entries, so chunks of 4096 rows (3 for 10 000 rows).
  constexpr Index kS = 256, kN = 4, kD = 2, kRows = 10000;
  Rng rng(11);
  ResponsibilityAttentionParams p;
  p.key_means = Matrix(kS, kD);
  for (Index k = 0; k < p.key_means.size(); ++k) p.key_means.data()[k] = rng.normal();
  p.emission = Matrix(kS, kS);
  for (Index k = 0; k < p.emission.size(); ++k) p.emission.data()[k] = 0.05 + rng.uniform();
  for (Index s = 0; s < kS; ++s) p.emission.row(s) /= p.emission.row(s).sum();
  p.position_prior = Vector::Constant(kN, 1.0 / kN);
  const ResponsibilityAttention model(p);
  IdMatrix ctx(kRows, kN);
  Matrix y(kRows, kD);
  IdVector t(kRows);
  for (Index k = 0; k < kRows; ++k) {
    for (Index i = 0; i < kN; ++i) ctx(k, i) = static_cast<int64_t>(rng.uniform_int(kS));
    for (Index d = 0; d < kD; ++d) y(k, d) = rng.normal();
    t[k] = static_cast<int64_t>(rng.uniform_int(kS));
  }
  const auto batch = ResponsibilityAttentionEncoder{kS, kN, kD, kS}.encode(ctx, y, t);
  const std::vector<double> w(kRows, 1.0);
  auto explicit_4096 = model.make_accumulator();
  ASSERT_EQ(explicit_4096.flat_size(), 66309);
  parallel_accumulate(model, batch, w, explicit_4096, {}, {1, 4096});
  auto chunks_of_1024 = model.make_accumulator();
  parallel_accumulate(model, batch, w, chunks_of_1024, {}, {1, 1024});
  EXPECT_FALSE(chunks_of_1024 == explicit_4096);  // another association of the sums: some entry differs in its bits
  for (int threads : {1, 2, 3}) {
    auto acc = model.make_accumulator();
    parallel_accumulate(model, batch, w, acc, {}, {threads, 0});
    EXPECT_TRUE(acc == explicit_4096) << threads << " threads";
  }
}

/// The ordered merge of the multi-threaded reducer under stress: many chunks of one or a few rows, more threads than
/// cores, and impossible rows; every thread count gives the one-thread statistics bit for bit, and a failing call
/// reports the rows of all chunks and changes nothing.
TEST(ParallelAccumulateTest, OrderedMergeIsBitwiseEqualUnderManySmallChunks) {
  const ResponsibilityAttention model = sparse_model();
  const auto batch = rows_with_impossible(400, {});
  const auto bad = rows_with_impossible(400, {0, 133, 399});
  std::vector<double> w(400);
  Rng rng(6);
  for (double& v : w) v = rng.uniform();
  for (const Index chunk_rows : {Index{1}, Index{7}, Index{64}}) {
    auto reference = model.make_accumulator();
    std::vector<double> ref_log_p(400);
    parallel_accumulate(model, batch, w, reference, ref_log_p, {1, chunk_rows});
    for (int threads : {2, 3, 4, 7, 16}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, chunks of " + std::to_string(chunk_rows));
      auto acc = model.make_accumulator();
      std::vector<double> log_p(400);
      parallel_accumulate(model, batch, w, acc, log_p, {threads, chunk_rows});
      EXPECT_TRUE(acc == reference);
      EXPECT_EQ(log_p, ref_log_p);
      const auto before = acc.value();
      try {
        parallel_accumulate(model, bad, w, acc, {}, {threads, chunk_rows});
        ADD_FAILURE() << "impossible rows were not reported";
      } catch (const ImpossibleEvidenceError& e) {
        EXPECT_EQ(e.rows(), (std::vector<int64_t>{0, 133, 399}));
      }
      EXPECT_TRUE(acc == before);
    }
  }
}

TEST(ParallelAccumulateTest, WorksThroughTypeErasedHandles) {
  const AnyDistribution model(sparse_model());
  const AnyBatch batch(rows_with_impossible(500, {}));
  AnyAccumulator direct = model.make_accumulator();
  auto typed = sparse_model().make_accumulator();
  parallel_accumulate(sparse_model(), batch.get<ResponsibilityAttentionBatch>("test"), std::vector<double>(500, 1.0),
                      typed, {}, {2, 100});
  parallel_accumulate(model, batch, std::vector<double>(500, 1.0), direct, {}, {2, 100});
  EXPECT_TRUE(direct == AnyAccumulator(typed));
  EXPECT_THROW(parallel_accumulate(model, batch, std::vector<double>(499, 1.0), direct, {}, {2, 100}), ValueError);
}

/// A ReduceScratch reused across calls (other thread counts, a failed call in between) gives the statistics of
/// fresh buffers bit for bit, and a failed call still changes nothing.
TEST(ParallelAccumulateTest, ReusedScratchEqualsFreshBuffers) {
  const ResponsibilityAttention model = sparse_model();
  const auto good = rows_with_impossible(300, {});
  const auto bad = rows_with_impossible(300, {7, 200});
  const std::vector<double> w(300, 1.0);
  ReduceScratch<ResponsibilityAttentionAccumulator> scratch;
  for (int threads : {2, 1, 3, 2}) {
    const ParallelOptions options{threads, 16};
    auto fresh = model.make_accumulator();
    parallel_accumulate(model, good, w, fresh, {}, options);
    auto reused = model.make_accumulator();
    parallel_accumulate(model, good, w, reused, {}, options, scratch);
    EXPECT_TRUE(reused == fresh) << threads << " threads";
    const auto before = reused.value();
    EXPECT_THROW(parallel_accumulate(model, bad, w, reused, {}, options, scratch), ImpossibleEvidenceError);
    EXPECT_TRUE(reused == before) << threads << " threads";
  }
}

}  // namespace
}  // namespace attnmix
