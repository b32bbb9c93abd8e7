// SPDX-License-Identifier: Apache-2.0
// Distributed EM (issue 6), run under mpirun with 2 and 3 ranks (tests/CMakeLists.txt). Every rank builds the same
// data set from a fixed seed, keeps its shard (uneven; with 3 ranks the first shard is empty), and fits it with an
// MpiCommunicator. Each rank also fits the whole data set alone, as the oracle: the distributed model must equal it
// to 1e-12 (max absolute parameter difference), and every rank must hold the same model bit for bit (rank 0's is
// broadcast and compared). A row that no position can explain on one rank makes every rank throw, the failing rank
// its own ImpossibleEvidenceError and the others RemoteRankError naming it. Mixtures of heads are fitted the same way.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/mpi/mpi.hpp"
#include "attnmix/stats/categorical.hpp"
#include "attnmix/stats/mixture.hpp"

namespace attnmix {
namespace {

constexpr Index kRows = 300;

/// Rows [begin, end) of rank r out of P: uneven shards; with P = 3 the first shard is empty.
std::pair<Index, Index> shard_of(int rank, int size, Index rows) {
  std::vector<Index> cuts;
  if (size == 1) cuts = {0, rows};
  else if (size == 2) cuts = {0, 37, rows};
  else if (size == 3) cuts = {0, 0, 121, rows};
  else
    for (int r = 0; r <= size; ++r) cuts.push_back(rows * r / size);
  return {cuts[static_cast<size_t>(rank)], cuts[static_cast<size_t>(rank) + 1]};
}

void append(std::vector<double>& out, const Matrix& m) { out.insert(out.end(), m.data(), m.data() + m.size()); }
void append(std::vector<double>& out, const Vector& v) { out.insert(out.end(), v.data(), v.data() + v.size()); }

std::vector<double> parameters(const ResponsibilityAttention& m) {
  std::vector<double> out;
  append(out, m.params().key_means);
  append(out, m.params().emission);
  append(out, m.params().position_prior);
  out.push_back(m.params().sigma2);
  return out;
}
std::vector<double> parameters(const ChainedAttention& m) {
  std::vector<double> out;
  for (const Matrix& K : m.params().key_tables) append(out, K);
  append(out, m.params().emission);
  return out;
}
void append_state(std::vector<double>& out, const AttentionOptimizerState& s) {
  for (const Matrix* a : {&s.mean, &s.log_var, &s.mean_first_moment, &s.mean_second_moment, &s.log_var_first_moment,
                          &s.log_var_second_moment})
    append(out, *a);
  out.push_back(static_cast<double>(s.iteration));
}
std::vector<double> parameters(const VariationalEmbeddingAttention& m) {
  std::vector<double> out;
  append(out, m.emission());
  append(out, m.position_prior());
  append_state(out, m.optimizer_state());
  return out;
}
std::vector<double> parameters(const VariationalMultiHopAttention& m) {
  std::vector<double> out;
  append(out, m.emission());
  append_state(out, m.optimizer_state());
  return out;
}

std::vector<double> parameters(const Mixture& m) {
  std::vector<double> out;
  append(out, m.weights());
  for (const AnyDistribution& component : m.components()) {
    const auto* head = component.get_if<ResponsibilityAttention>();
    if (head == nullptr) throw std::logic_error("the test mixes responsibility-attention heads only");
    const std::vector<double> head_parameters = parameters(*head);
    out.insert(out.end(), head_parameters.begin(), head_parameters.end());
  }
  return out;
}

/// Fits the shard of this rank distributed and the whole batch alone; checks equality and agreement across ranks.
template <class E>
void expect_distributed_equals_single(const typename E::distribution_type::batch_type& full, const E& estimator,
                                      OptimizeOptions options) {
  const MpiCommunicator comm;
  const auto [begin, end] = shard_of(comm.rank(), comm.size(), full.n_rows());
  const auto local = full.slice(begin, end - begin);
  const auto single = optimize(full, estimator, options).model;
  options.communicator = &comm;
  const auto distributed = optimize(local, estimator, options).model;

  const std::vector<double> a = parameters(distributed);
  const std::vector<double> b = parameters(single);
  ASSERT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::fabs(a[k] - b[k]));
  EXPECT_LT(worst, 1e-12) << "rank " << comm.rank() << " of " << comm.size();

  std::vector<double> root = a;  // rank 0's model, bit for bit on every rank
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  EXPECT_EQ(std::memcmp(root.data(), a.data(), a.size() * sizeof(double)), 0) << "rank " << comm.rank();
}

OptimizeOptions fit_options(int threads) {
  OptimizeOptions o;
  o.max_its = 6;
  o.delta = std::nullopt;
  o.seed = 11;
  o.init_p = 0.5;
  o.n_threads = threads;
  o.chunk_rows = 64;
  return o;
}

/// The responsibility-attention tests' dimensions, and a head with N(0, 1) keys, uniform emission and prior.
constexpr Index kS = 6, kN = 4, kD = 3, kT = 5;
ResponsibilityAttention random_head(uint64_t seed) {
  Rng rng(seed);
  ResponsibilityAttentionParams p;
  p.key_means.resize(kS, kD);
  for (Index k = 0; k < p.key_means.size(); ++k) p.key_means.data()[k] = rng.normal();
  p.emission = Matrix::Constant(kS, kT, 1.0 / kT);
  p.position_prior = Vector::Constant(kN, 1.0 / kN);
  return ResponsibilityAttention(p);
}

TEST(DistributedFitTest, ResponsibilityAttentionEqualsSingleProcess) {
  const auto full = random_head(1).sampler(3).sample(kRows);
  for (int threads : {1, 2})
    expect_distributed_equals_single(full, ResponsibilityAttentionEstimator(kS, kN, kD, kT), fit_options(threads));
}

/// What rank r adds to entry i in the communicator tests: values whose sum depends on the order of the additions.
double contribution(int r, size_t i) {
  const double big = (i + static_cast<size_t>(r)) % 3 == 0 ? 1e16 : 0.0;
  return (r % 2 == 0 ? big : -big) + 0.1 * (r + 1) * static_cast<double>(i % 11);
}
double rank_order_sum(int ranks, size_t i) {
  double total = contribution(0, i);
  for (int r = 1; r < ranks; ++r) total += contribution(r, i);
  return total;
}

TEST(CommunicatorTest, SumAddsInRankOrderInEveryPiece) {
  const MpiCommunicator comm;
  const size_t n = (size_t{1} << 20) + 7;  // more than one piece of sum()
  std::vector<double> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = contribution(comm.rank(), i);
  comm.sum(values);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += values[i] != rank_order_sum(comm.size(), i);
  EXPECT_EQ(wrong, 0u) << "rank " << comm.rank();
}

TEST(CommunicatorTest, OwnBlockThenGatherIsTheSum) {
  const MpiCommunicator comm;
  // Uneven blocks, an empty one, and one longer than a round (2^20 / P entries).
  std::vector<int64_t> blocks(static_cast<size_t>(comm.size()));
  for (int q = 0; q < comm.size(); ++q)
    blocks[static_cast<size_t>(q)] = q == 0 ? (int64_t{1} << 20) / comm.size() + 5 : (q == 1 ? 0 : 17 * q);
  int64_t n = 0, own_begin = 0;
  for (int q = 0; q < comm.size(); ++q) {
    if (q < comm.rank()) own_begin += blocks[static_cast<size_t>(q)];
    n += blocks[static_cast<size_t>(q)];
  }
  std::vector<double> values(static_cast<size_t>(n));
  for (size_t i = 0; i < values.size(); ++i) values[i] = contribution(comm.rank(), i);
  comm.sum_own_block(values, blocks);
  size_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool own = i >= own_begin && i < own_begin + blocks[static_cast<size_t>(comm.rank())];
    const auto k = static_cast<size_t>(i);
    wrong += values[k] != (own ? rank_order_sum(comm.size(), k) : contribution(comm.rank(), k));
  }
  EXPECT_EQ(wrong, 0u) << "sum_own_block, rank " << comm.rank();
  comm.gather_blocks(values, blocks);
  wrong = 0;
  for (size_t i = 0; i < values.size(); ++i) wrong += values[i] != rank_order_sum(comm.size(), i);
  EXPECT_EQ(wrong, 0u) << "gather_blocks, rank " << comm.rank();
}

/// The parameters of the responsibility-attention or variational-embedding model held.
std::vector<double> parameters(const AnyDistribution& m) {
  if (const auto* ra = m.get_if<ResponsibilityAttention>()) return parameters(*ra);
  if (const auto* vea = m.get_if<VariationalEmbeddingAttention>()) return parameters(*vea);
  throw std::logic_error("the test reads responsibility and variational embedding attention only");
}

/// optimize() of this rank's rows under comm, with and without options.sharded_mstep: the two models' parameters must
/// be the same bits.
template <class Batch, class Estimator>
void expect_sharded_mstep_equals_allreduce(const Batch& local, const Estimator& estimator,
                                           OptimizeOptions options, const Communicator& comm) {
  options.communicator = &comm;
  options.sharded_mstep = false;
  const std::vector<double> reduced = parameters(optimize(local, estimator, options).model);
  options.sharded_mstep = true;
  const std::vector<double> sharded = parameters(optimize(local, estimator, options).model);
  EXPECT_EQ(sharded.size(), reduced.size());
  if (sharded.size() == reduced.size()) {
    EXPECT_EQ(std::memcmp(sharded.data(), reduced.data(), reduced.size() * sizeof(double)), 0)
        << "rank " << comm.rank();
  }
}

/// The sharded M-step's model has the bits of the allreduce path's, through the concrete and the type-erased
/// estimator, with σ² estimated (a sum over all symbols) and a symbol count that does not divide evenly.
TEST(DistributedFitTest, ShardedMStepEqualsAllreduceBitForBit) {
  const MpiCommunicator comm;
  Rng rng(21);
  ResponsibilityAttentionParams p;
  const Index S = 7;
  p.key_means.resize(S, kD);
  for (Index k = 0; k < p.key_means.size(); ++k) p.key_means.data()[k] = rng.normal();
  p.emission = Matrix::Constant(S, kT, 1.0 / kT);
  p.position_prior = Vector::Constant(kN, 1.0 / kN);
  const auto full = ResponsibilityAttention(p).sampler(5).sample(kRows);
  const auto [begin, end] = shard_of(comm.rank(), comm.size(), full.n_rows());
  const auto local = full.slice(begin, end - begin);
  ResponsibilityAttentionEstimatorOptions estimator_options;
  estimator_options.estimate_sigma2 = true;
  estimator_options.emission_smoothing = 0.25;
  const ResponsibilityAttentionEstimator estimator(S, kN, kD, kT, estimator_options);
  expect_sharded_mstep_equals_allreduce(local, estimator, fit_options(2), comm);
  ASSERT_TRUE(has_sharded_mstep(AnyEstimator(estimator)));
  SCOPED_TRACE("through AnyEstimator");
  expect_sharded_mstep_equals_allreduce(AnyBatch(local), AnyEstimator(estimator), fit_options(2), comm);
}

/// Chained attention's sharded M-step (per-hop key tables split by rows) has the bits of the allreduce path.
TEST(DistributedFitTest, ChainedShardedMStepEqualsAllreduceBitForBit) {
  const MpiCommunicator comm;
  Rng rng(8);
  ChainedAttentionParams p;
  const Index S = 7;
  for (int hop = 0; hop < 2; ++hop) {
    Matrix K(S, S);
    for (Index k = 0; k < K.size(); ++k) K.data()[k] = rng.normal();
    p.key_tables.push_back(K);
  }
  p.emission = Matrix::Constant(S, S, 1.0 / S);
  const auto full = ChainedAttention(p).sampler(6, 5).sample(kRows);
  const auto [begin, end] = shard_of(comm.rank(), comm.size(), full.n_rows());
  const auto local = full.slice(begin, end - begin);
  expect_sharded_mstep_equals_allreduce(local, ChainedAttentionEstimator(2, S, S), fit_options(2), comm);
}

/// The variational families' sharded M-step (emission rows split, the Adam step of the embeddings whole on every
/// rank) has the bits of the allreduce path over six iterations, the optimizer state included, with S = 7 split
/// unevenly and smoothing on.
TEST(DistributedFitTest, VariationalShardedMStepEqualsAllreduceBitForBit) {
  const MpiCommunicator comm;
  Rng rng(9);
  const Index S = 7, N = 4, D = 3, T = 5;
  Matrix mean(S, D);
  for (Index k = 0; k < mean.size(); ++k) mean.data()[k] = rng.normal();
  {
    VariationalEmbeddingAttentionParams p;
    p.mean = mean;
    p.log_var = Matrix::Constant(S, D, std::log(0.3));
    p.emission = Matrix::Constant(S, T, 1.0 / T);
    p.position_prior = Vector::Constant(N, 1.0 / N);
    const auto full = VariationalEmbeddingAttention(p).sampler(5).sample(kRows);
    const auto [begin, end] = shard_of(comm.rank(), comm.size(), full.n_rows());
    VariationalEmbeddingAttentionEstimatorOptions o;
    o.mc = 2;
    o.emission_smoothing = 0.25;
    const VariationalEmbeddingAttentionEstimator estimator(S, N, D, T, o);
    ASSERT_TRUE(has_sharded_mstep(estimator));
    SCOPED_TRACE("variational embedding attention");
    expect_sharded_mstep_equals_allreduce(full.slice(begin, end - begin), estimator, fit_options(2), comm);
    SCOPED_TRACE("through AnyEstimator");
    expect_sharded_mstep_equals_allreduce(AnyBatch(full.slice(begin, end - begin)), AnyEstimator(estimator),
                                          fit_options(1), comm);
  }
  VariationalMultiHopAttentionParams p;
  p.mean = mean;
  p.log_var = Matrix::Constant(S, D, std::log(0.3));
  p.emission = Matrix::Constant(S, T, 1.0 / T);
  const auto full = VariationalMultiHopAttention(p).sampler(6, 4).sample(kRows);
  const auto [begin, end] = shard_of(comm.rank(), comm.size(), full.n_rows());
  VariationalMultiHopAttentionEstimatorOptions o;
  o.mc = 2;
  o.emission_smoothing = 0.25;
  SCOPED_TRACE("variational multi-hop attention");
  expect_sharded_mstep_equals_allreduce(full.slice(begin, end - begin), VariationalMultiHopAttentionEstimator(S, D, T, o),
                                        fit_options(2), comm);
}

TEST(DistributedFitTest, ShardedMStepNeedsAFamilyThatHasOne) {
  const MpiCommunicator comm;
  CategoricalParams p;
  p.p = Vector::Constant(kT, 1.0 / kT);
  const auto full = Categorical(p).sampler(3).sample(20);
  const CategoricalEstimator estimator(kT);
  OptimizeOptions options = fit_options(1);
  options.communicator = &comm;
  options.sharded_mstep = true;
  EXPECT_FALSE(has_sharded_mstep(estimator));
  try {
    static_cast<void>(optimize(full, estimator, options));
    ADD_FAILURE() << "rank " << comm.rank() << " fitted without a sharded M-step";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no sharded M-step"), std::string::npos) << e.what();
  }
}

TEST(DistributedFitTest, ChainedAttentionEqualsSingleProcess) {
  Rng rng(2);
  ChainedAttentionParams p;
  const Index S = 7, T = 7;
  for (int hop = 0; hop < 2; ++hop) {
    Matrix K(S, S);
    for (Index k = 0; k < K.size(); ++k) K.data()[k] = rng.normal();
    p.key_tables.push_back(K);
  }
  p.emission = Matrix::Constant(S, T, 1.0 / T);
  p.sigma2 = 0.5;
  const ChainedAttention truth(p);
  const auto full = truth.sampler(4, 5).sample(kRows);
  expect_distributed_equals_single(full, ChainedAttentionEstimator(2, S, T), fit_options(2));
}

TEST(DistributedFitTest, VariationalEmbeddingAttentionEqualsSingleProcess) {
  Rng rng(3);
  const Index S = 8, N = 4, D = 3, T = 4;
  VariationalEmbeddingAttentionParams p;
  p.mean.resize(S, D);
  for (Index k = 0; k < p.mean.size(); ++k) p.mean.data()[k] = rng.normal();
  p.log_var = Matrix::Constant(S, D, std::log(0.3));
  p.emission = Matrix::Constant(S, T, 1.0 / T);
  p.position_prior = Vector::Constant(N, 1.0 / N);
  const VariationalEmbeddingAttention truth(p);
  const auto full = truth.sampler(5).sample(kRows);
  VariationalEmbeddingAttentionEstimatorOptions o;
  o.mc = 3;
  o.lr = 0.08;
  expect_distributed_equals_single(full, VariationalEmbeddingAttentionEstimator(S, N, D, T, o), fit_options(2));
}

TEST(DistributedFitTest, VariationalMultiHopAttentionEqualsSingleProcess) {
  Rng rng(4);
  const Index S = 9, D = 3;
  VariationalMultiHopAttentionParams p;
  p.mean.resize(S, D);
  for (Index k = 0; k < p.mean.size(); ++k) p.mean.data()[k] = rng.normal();
  p.log_var = Matrix::Constant(S, D, std::log(0.3));
  p.emission = Matrix::Constant(S, S, 1.0 / S);
  const VariationalMultiHopAttention truth(p);
  const auto full = truth.sampler(6, 4).sample(kRows);
  VariationalMultiHopAttentionEstimatorOptions o;
  o.mc = 2;
  expect_distributed_equals_single(full, VariationalMultiHopAttentionEstimator(S, D, S, o), fit_options(1));
}

/// A mixture of two responsibility-attention heads and a keyed (tied) pair: the mixture's component weights and each
/// head's initialisation draws are replayed for the other ranks' rows (MixtureAccumulator::initialize_shard).
TEST(DistributedFitTest, MixtureOfAttentionHeadsEqualsSingleProcess) {
  const AnyBatch full(random_head(7).sampler(8).sample(kRows));
  const AnyEstimator head(ResponsibilityAttentionEstimator(kS, kN, kD, kT));
  ResponsibilityAttentionEstimatorOptions keyed;
  keyed.keys = "shared";
  const AnyEstimator tied(ResponsibilityAttentionEstimator(kS, kN, kD, kT, keyed));
  for (int threads : {1, 2}) {
    expect_distributed_equals_single(full, MixtureEstimator({head, head}), fit_options(threads));
    expect_distributed_equals_single(full, MixtureEstimator({tied, tied, head}), fit_options(threads));
  }
}

/// Impossible evidence on the last rank only: the model's emission gives target 0 probability 0 from every symbol,
/// and only the last rank's shard contains a target-0 row. Every rank must throw, and nobody may hang.
TEST(DistributedFitTest, ImpossibleRowOnOneRankFailsEveryRank) {
  const MpiCommunicator comm;
  const Index S = 4, N = 3, D = 2, T = 3;
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Zero(S, D);
  p.emission = Matrix::Constant(S, T, 0.5);
  p.emission.col(0).setZero();
  p.position_prior = Vector::Constant(N, 1.0 / N);
  const ResponsibilityAttention model(p);
  const bool last = comm.rank() == comm.size() - 1;
  const Index rows = 10;
  IdMatrix contexts = IdMatrix::Constant(rows, N, 1);
  Matrix queries = Matrix::Zero(rows, D);
  IdVector targets = IdVector::Constant(rows, 1);
  if (last) targets[7] = 0;
  const auto batch = ResponsibilityAttentionEncoder{S, N, D, T}.encode(contexts, queries, targets);
  OptimizeOptions options = fit_options(1);
  options.communicator = &comm;
  bool threw = false;
  try {
    (void)optimize(batch, ResponsibilityAttentionEstimator(S, N, D, T), options, model);
  } catch (const ImpossibleEvidenceError& e) {
    threw = true;
    EXPECT_TRUE(last) << "rank " << comm.rank() << " has no impossible row";
    EXPECT_EQ(e.rows(), std::vector<int64_t>{7});
  } catch (const RemoteRankError& e) {
    threw = true;
    EXPECT_FALSE(last);
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(comm.size() - 1) + ":"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(threw) << "rank " << comm.rank() << " went on";
}

}  // namespace
}  // namespace attnmix

int main(int argc, char** argv) {
  const attnmix::MpiSession session(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {  // one report: the other ranks' failures still fail the run through the exit code
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
