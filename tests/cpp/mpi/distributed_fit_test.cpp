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
