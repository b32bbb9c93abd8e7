// SPDX-License-Identifier: Apache-2.0
// Distributed EM (issue 6): strong scaling of one responsibility-attention EM iteration over MPI ranks, the allreduce
// it relies on, and the single-process inputs of the cost model in docs/SCALING.md (STYLE.md §12).
//
// Foundation workload (bench/ra_workload.hpp, the same model and rows as bench_em_iteration.cpp): n = 200000 rows,
// N = 16, D = 32, S = T = 256. Rank r of P holds rows [n·r/P, n·(r+1)/P) in storage of its own.
//
//   BM_MpiEmIteration              EmStepper::step with an MpiCommunicator on this rank's shard (E-step, failure
//                                  agreement, one MPI_Allreduce of the 74001 statistics, M-step on every rank) plus
//                                  the score's allreduce: one iteration of optimize()'s fused loop. Real time on
//                                  rank 0; the collectives make it the slowest rank's time.
//   BM_MpiEmIterationPhases        the same steps written out, timed one by one on every rank (counters, ms per
//                                  iteration): estep, agree (the failure agreement; it absorbs the wait for the
//                                  slowest rank's E-step), allreduce, mstep, score; estep_min/max over ranks.
//   BM_MpiAllreduce/entries:k      MpiCommunicator::sum of k doubles (in place): latency and bandwidth of this
//                                  machine's allreduce; k = 1 … 2^24, 74001 (foundation M), 25650017 (the model's M
//                                  for S = 50000, D = 256, T = 256, N = 16: 205 MB).
//   BM_MpiAllreducePieces/entries:k/piece:q  the same k doubles by the MPI library's MPI_Allreduce, one call per
//                                  piece of q entries (the baseline of MpiCommunicator::sum)
//   BM_LargeEStep/rows:r/chunk_rows:c  (local, run with -np 1) the E-step without a communicator at S = 50000,
//                                  D = 256, T = 256, N = 16: the per-row, per-chunk and fixed costs of the model
//   BM_LargeMStep                  (local) the M-step alone at that size
//   BM_MpiReduceAndMStep/sharded:s the statistics' sum over ranks plus the M-step at that size: the allreduce path
//                                  (s = 0) against the sharded M-step (s = 1, OptimizeOptions::sharded_mstep)
//   BM_MpiReduceAndMStepVariational/sharded:s  the same for variational embedding attention at S = T = 5000,
//                                  D = 32, N = 16 (the emission's 25 M entries split, the Adam step whole)
//   BM_LargeMergeAndClear          (local) one merge of a chunk's partial into the total (the reducer's loop)
//
// Every rank must run the same benchmarks with the same number of iterations, or the collectives deadlock: every
// benchmark has a fixed ->Iterations(k); never pass --benchmark_min_time, --benchmark_min_warmup_time or
// --benchmark_enable_random_interleaving. Repetitions come from --benchmark_repetitions (the same on every rank).
// Only rank 0 reports (and writes --benchmark_out).
//
// Run (each rank one E-step thread; --em_threads=k for more):
//   OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/attnmix_bench_mpi
//       --benchmark_filter='^BM_MpiEmIteration/' --benchmark_repetitions=5     (one command line)
//   /usr/bin/python3 bench/compare.py mpi --rounds 5          # 1 and 2 ranks, 1 and 2 threads, back to back
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/inference/reduce.hpp"
#include "attnmix/mpi/mpi.hpp"
#include "attnmix/stats/log_math.hpp"
#include "ra_workload.hpp"

namespace attnmix {
namespace {

using Clock = std::chrono::steady_clock;

constexpr Index kRows = 200000;
constexpr uint64_t kSeed = 20240611;  // bench_em_iteration.cpp's seed: the same model and rows
constexpr int kEmIterations = 30;     // per repetition (≈ 1 s on one rank)

// The cost model's statistics size (docs/SCALING.md): S = 50000, D = 256, T = 256, N = 16.
constexpr bench::RaShape kLargeShape{16, 256, 50000, 256};
constexpr uint64_t kLargeSeed = 20240612;

const MpiCommunicator* g_comm = nullptr;
int g_em_threads = 1;

const MpiCommunicator& comm() { return *g_comm; }

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// The foundation model and this rank's shard of the 200000 rows, built once (every rank draws all rows from the
/// same seed, keeps its own in storage of their own, and drops the rest).
struct MpiProblem {
  ResponsibilityAttention model;
  ResponsibilityAttentionBatch shard;
  ResponsibilityAttentionEstimator estimator;
  Index begin = 0;
};

const MpiProblem& mpi_problem() {
  static const MpiProblem p = [] {
    Rng rng(kSeed);
    ResponsibilityAttention model = bench::make_ra_model(bench::kFoundationShape, rng);
    const Index P = comm().size();
    const Index r = comm().rank();
    const Index begin = kRows * r / P;
    const Index end = kRows * (r + 1) / P;
    ResponsibilityAttentionBatch shard;
    {
      const ResponsibilityAttentionBatch all = bench::make_ra_batch(model, kRows, rng);
      shard = bench::own_rows(model, all, begin, end - begin);
    }
    ResponsibilityAttentionEstimator estimator = model.estimator();
    return MpiProblem{std::move(model), std::move(shard), std::move(estimator), begin};
  }();
  return p;
}

void add_rank_counters(benchmark::State& state) {
  state.counters["ranks"] = comm().size();
  state.counters["em_threads"] = g_em_threads;
}

void BM_MpiEmIteration(benchmark::State& state) {
  const MpiProblem& p = mpi_problem();
  const ParallelOptions parallel{g_em_threads, 1024};
  std::vector<double> log_p(static_cast<size_t>(p.shard.n_rows()));
  EmStepper stepper(p.estimator, p.shard.n_rows(), &comm());  // as optimize() runs its iterations
  {
    // One untimed step: every rank's buffers are faulted in before the clock starts.
    ResponsibilityAttention warm = stepper.step(p.model, p.shard, log_p, parallel);
    benchmark::DoNotOptimize(warm.params().key_means.data());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) {
    ResponsibilityAttention next = stepper.step(p.model, p.shard, log_p, parallel);
    double ll = pairwise_sum(log_p);  // the fused loop's score of the model, summed over ranks
    comm().sum({&ll, 1});
    benchmark::DoNotOptimize(next.params().key_means.data());
    benchmark::DoNotOptimize(ll);
  }
  state.SetItemsProcessed(state.iterations() * kRows);  // global rows per second
  add_rank_counters(state);
}
BENCHMARK(BM_MpiEmIteration)->Iterations(kEmIterations)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MpiEmIterationPhases(benchmark::State& state) {
  const MpiProblem& p = mpi_problem();
  const ParallelOptions parallel{g_em_threads, 1024};
  const Index rows = p.shard.n_rows();
  std::vector<double> log_p(static_cast<size_t>(rows));
  const std::vector<double> ones(static_cast<size_t>(rows), 1.0);
  auto acc = p.estimator.make_accumulator();
  ReduceScratch<ResponsibilityAttentionAccumulator> scratch;
  double t_estep = 0.0, t_agree = 0.0, t_allreduce = 0.0, t_mstep = 0.0, t_score = 0.0;
  const auto one_step = [&](bool timed) {
    auto t0 = Clock::now();
    acc.set_zero();
    parallel_accumulate(p.model, p.shard, ones, acc, log_p, parallel, scratch);
    const double e = seconds_since(t0);
    t0 = Clock::now();
    const std::string failure = comm().first_failure("");
    const double a = seconds_since(t0);
    t0 = Clock::now();
    comm().sum(acc.flat());
    const double r = seconds_since(t0);
    t0 = Clock::now();
    ResponsibilityAttention next = p.estimator.estimate(std::nullopt, acc);
    const double m = seconds_since(t0);
    t0 = Clock::now();
    double ll = pairwise_sum(log_p);
    comm().sum({&ll, 1});
    const double s = seconds_since(t0);
    benchmark::DoNotOptimize(next.params().key_means.data());
    benchmark::DoNotOptimize(ll);
    if (!failure.empty()) throw std::runtime_error(failure);
    if (timed) {
      t_estep += e;
      t_agree += a;
      t_allreduce += r;
      t_mstep += m;
      t_score += s;
    }
  };
  one_step(false);
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) one_step(true);
  // Outside the timed loop: the spread of the E-step over ranks (load imbalance, or a rank sharing its core).
  double estep_max = t_estep, estep_min = t_estep;
  MPI_Allreduce(MPI_IN_PLACE, &estep_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &estep_min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  const auto ms = [&](double total) {
    return benchmark::Counter(total * 1e3, benchmark::Counter::kAvgIterations);
  };
  state.counters["estep_ms"] = ms(t_estep);
  state.counters["estep_min_ms"] = ms(estep_min);
  state.counters["estep_max_ms"] = ms(estep_max);
  state.counters["agree_ms"] = ms(t_agree);
  state.counters["allreduce_ms"] = ms(t_allreduce);
  state.counters["mstep_ms"] = ms(t_mstep);
  state.counters["score_ms"] = ms(t_score);
  state.SetItemsProcessed(state.iterations() * kRows);
  add_rank_counters(state);
}
BENCHMARK(BM_MpiEmIterationPhases)->Iterations(kEmIterations)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MpiAllreduce(benchmark::State& state) {
  std::vector<double> buffer(static_cast<size_t>(state.range(0)), 1.0);
  comm().sum(buffer);  // faulted in, and the transport's buffers set up, before the clock starts
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) {
    comm().sum(buffer);
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * static_cast<int64_t>(sizeof(double)));
  state.counters["ranks"] = comm().size();
  state.counters["MB"] = static_cast<double>(state.range(0)) * 8e-6;
}

void register_allreduce_sweep() {
  std::vector<int64_t> sizes = {1, 16, 128};
  for (int64_t k = int64_t{1} << 10; k <= int64_t{1} << 24; k *= 4) sizes.push_back(k);
  sizes.push_back(74001);     // foundation statistics: S·D + S + S·T + N + 1 at N = 16, D = 32, S = T = 256
  sizes.push_back(25650017);  // model statistics at N = 16, D = 256, S = 50000, T = 256
  std::sort(sizes.begin(), sizes.end());
  for (const int64_t k : sizes) {
    // ≈ 2^27 doubles moved per repetition, between 5 and 20000 calls: fixed, so every rank makes the same calls.
    const int64_t iterations = std::min<int64_t>(20000, std::max<int64_t>(5, (int64_t{1} << 27) / k));
    benchmark::RegisterBenchmark("BM_MpiAllreduce", BM_MpiAllreduce)
        ->ArgName("entries")
        ->Arg(k)
        ->Iterations(iterations)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  }
}

/// The MPI library's own MPI_Allreduce (MPI_SUM) of k doubles, one call per piece of at most `piece` entries: the
/// baseline of MpiCommunicator::sum, which adds in rank order by messages of its own. Large single calls make Open MPI
/// allocate (and, on this VM, fault in) a temporary buffer of the whole message on every call (docs/SCALING.md).
void BM_MpiAllreducePieces(benchmark::State& state) {
  std::vector<double> buffer(static_cast<size_t>(state.range(0)), 1.0);
  const size_t piece = static_cast<size_t>(state.range(1));
  const auto sum = [&] {
    for (size_t begin = 0; begin < buffer.size(); begin += piece)
      MPI_Allreduce(MPI_IN_PLACE, buffer.data() + begin, static_cast<int>(std::min(piece, buffer.size() - begin)),
                    MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  };
  sum();
  MPI_Barrier(MPI_COMM_WORLD);
  for (auto _ : state) {
    sum();
    benchmark::DoNotOptimize(buffer.data());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * static_cast<int64_t>(sizeof(double)));
  state.counters["ranks"] = comm().size();
  state.counters["MB"] = static_cast<double>(state.range(0)) * 8e-6;
}
BENCHMARK(BM_MpiAllreducePieces)
    ->ArgNames({"entries", "piece"})
    ->ArgsProduct({{int64_t{1} << 22, int64_t{1} << 24, 25650017},
                   {int64_t{1} << 16, int64_t{1} << 18, int64_t{1} << 20}})
    ->Iterations(5)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// ---- Inputs of the cost model at S = 50000, D = 256, T = 256 (local: no collectives) --------------------------

struct LargeProblem {
  Rng rng{kLargeSeed};
  ResponsibilityAttention model = bench::make_ra_model(kLargeShape, rng);
  ResponsibilityAttentionBatch batch = bench::make_ra_batch(model, 16384, rng);
  ResponsibilityAttentionEstimator estimator = model.estimator();
};

const LargeProblem& large_problem() {
  static const LargeProblem p;
  return p;
}

/// The E-step alone (parallel_accumulate into zeroed statistics with reused scratch, as EmStepper runs it) on the
/// first r rows at chunk_rows c, one thread. With statistics this large the per-call and per-chunk reducer work
/// (zeroing and merging M entries per chunk, and the kernel's S·D key_sum scratch) shows next to the per-row work.
void BM_LargeEStep(benchmark::State& state) {
  const LargeProblem& p = large_problem();
  const Index rows = state.range(0);
  const ResponsibilityAttentionBatch batch = p.batch.slice(0, rows);
  const ParallelOptions parallel{1, state.range(1)};
  std::vector<double> log_p(static_cast<size_t>(rows));
  const std::vector<double> ones(static_cast<size_t>(rows), 1.0);
  auto acc = p.estimator.make_accumulator();
  ReduceScratch<ResponsibilityAttentionAccumulator> scratch;
  const auto estep = [&] {
    acc.set_zero();
    parallel_accumulate(p.model, batch, ones, acc, log_p, parallel, scratch);
    benchmark::DoNotOptimize(acc.flat().data());
  };
  estep();
  for (auto _ : state) estep();
  state.SetItemsProcessed(state.iterations() * rows);
  state.counters["chunks"] = static_cast<double>((rows + state.range(1) - 1) / state.range(1));
}
BENCHMARK(BM_LargeEStep)
    ->ArgNames({"rows", "chunk_rows"})
    ->Args({1024, 1024})
    ->Args({4096, 4096})
    ->Args({16384, 16384})
    ->Args({16384, 4096})
    ->Args({16384, 1024})
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_LargeMStep(benchmark::State& state) {
  const LargeProblem& p = large_problem();
  auto acc = p.model.make_accumulator();
  const std::vector<double> w(static_cast<size_t>(p.batch.n_rows()), 1.0);
  parallel_accumulate(p.model, p.batch, w, acc, {}, ParallelOptions{1, p.batch.n_rows()});
  {
    ResponsibilityAttention warm = p.estimator.estimate(std::nullopt, acc);
    benchmark::DoNotOptimize(warm.params().key_means.data());
  }
  for (auto _ : state) {
    ResponsibilityAttention next = p.estimator.estimate(std::nullopt, acc);
    benchmark::DoNotOptimize(next.params().key_means.data());
  }
  state.counters["entries"] = static_cast<double>(acc.flat_size());
}
BENCHMARK(BM_LargeMStep)->Iterations(5)->Unit(benchmark::kMillisecond)->UseRealTime();

/// Variational embedding attention at S = T = 5000, D = 32, N = 16 (M = 25.3 M entries, 202 MB, nearly all of it the
/// emission), with 16384 rows drawn from a random model.
struct LargeVariationalProblem {
  static constexpr Index kS = 5000, kN = 16, kD = 32;
  VariationalEmbeddingAttention model = make_model();
  VariationalEmbeddingAttentionBatch batch = model.sampler(kLargeSeed).sample(16384);
  VariationalEmbeddingAttentionEstimator estimator = model.estimator();

  static VariationalEmbeddingAttention make_model() {
    Rng rng{kLargeSeed};
    VariationalEmbeddingAttentionParams p;
    p.mean.resize(kS, kD);
    for (Index k = 0; k < p.mean.size(); ++k) p.mean.data()[k] = rng.normal();
    p.log_var = Matrix::Constant(kS, kD, -2.0);
    p.emission = Matrix::Constant(kS, kS, 1.0 / static_cast<double>(kS));
    p.position_prior = Vector::Constant(kN, 1.0 / static_cast<double>(kN));
    return VariationalEmbeddingAttention(std::move(p));
  }
};

const LargeVariationalProblem& large_variational_problem() {
  static const LargeVariationalProblem p;
  return p;
}

/// The statistics' sum over ranks plus the M-step of problem p: the allreduce path (MpiCommunicator::sum, then
/// estimate() of all symbols on every rank) against the sharded M-step (estimate_sharded: sum of this rank's rows,
/// estimate of its S/P symbols, allgather of the parameter rows). Each rank's statistics are those of its share of
/// the rows, restored (untimed) before every iteration.
template <class Problem>
void reduce_and_mstep(benchmark::State& state, const Problem& p) {
  const bool sharded = state.range(0) != 0;
  const Index P = comm().size(), r = comm().rank(), n = p.batch.n_rows();
  const auto own = p.batch.slice(n * r / P, n * (r + 1) / P - n * r / P);
  auto partial = p.model.make_accumulator();
  const std::vector<double> w(static_cast<size_t>(own.n_rows()), 1.0);
  parallel_accumulate(p.model, own, w, partial, {}, ParallelOptions{1, std::max<Index>(1, own.n_rows())});
  auto acc = partial;
  const auto step = [&] {
    if (sharded) return p.estimator.estimate_sharded(acc, comm());
    comm().sum(acc.flat());
    return p.estimator.estimate(std::nullopt, acc);
  };
  for (auto _ : state) {
    state.PauseTiming();
    acc = partial;
    MPI_Barrier(MPI_COMM_WORLD);
    state.ResumeTiming();
    const auto next = step();
    benchmark::DoNotOptimize(&next);
  }
  state.counters["ranks"] = comm().size();
  state.counters["entries"] = static_cast<double>(acc.flat_size());
}

/// Responsibility attention at S = 50000, D = 256, T = 256 (M = 25.65 M entries, 205 MB; the allgather carries K and
/// B).
void BM_MpiReduceAndMStep(benchmark::State& state) { reduce_and_mstep(state, large_problem()); }
BENCHMARK(BM_MpiReduceAndMStep)->ArgName("sharded")->Arg(0)->Arg(1)->Iterations(4)->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_MpiReduceAndMStepVariational(benchmark::State& state) {
  reduce_and_mstep(state, large_variational_problem());
}
BENCHMARK(BM_MpiReduceAndMStepVariational)->ArgName("sharded")->Arg(0)->Arg(1)->Iterations(4)
    ->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LargeMergeAndClear(benchmark::State& state) {
  auto total = large_problem().model.make_accumulator();
  auto partial = large_problem().model.make_accumulator();
  detail::merge_and_clear(total, partial);
  for (auto _ : state) {
    detail::merge_and_clear(total, partial);
    benchmark::DoNotOptimize(total.flat().data());
  }
  state.SetBytesProcessed(state.iterations() * 4 * partial.flat_size() * static_cast<int64_t>(sizeof(double)));
}
BENCHMARK(BM_LargeMergeAndClear)->Iterations(10)->Unit(benchmark::kMillisecond)->UseRealTime();

/// Rank 0 reports; the others run the same benchmarks silently.
class SilentReporter final : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace
}  // namespace attnmix

int main(int argc, char** argv) {
  attnmix::MpiSession session(argc, argv);
  try {
    const attnmix::MpiCommunicator world;
    attnmix::g_comm = &world;
    // Our flag (--em_threads=k), and on ranks other than 0 the output-file flags (only rank 0 writes the file).
    std::vector<char*> args;
    for (int i = 0; i < argc; ++i) {
      const std::string_view arg(argv[i]);
      if (i > 0 && arg.starts_with("--em_threads=")) {
        attnmix::g_em_threads = std::atoi(argv[i] + std::strlen("--em_threads="));
        if (attnmix::g_em_threads < 1) {
          std::fprintf(stderr, "--em_threads must be >= 1\n");
          return 2;
        }
        continue;
      }
      if (i > 0 && world.rank() != 0 && arg.starts_with("--benchmark_out")) continue;
      args.push_back(argv[i]);
    }
    int n_args = static_cast<int>(args.size());
    args.push_back(nullptr);
    char** arg_v = args.data();
    benchmark::Initialize(&n_args, arg_v);
    if (benchmark::ReportUnrecognizedArguments(n_args, arg_v)) return 1;
    attnmix::register_allreduce_sweep();
    benchmark::AddCustomContext("mpi_ranks", std::to_string(world.size()));
    benchmark::AddCustomContext("em_threads_per_rank", std::to_string(attnmix::g_em_threads));
    char library[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(library, &length);
    std::string lib(library, static_cast<size_t>(length));
    benchmark::AddCustomContext("mpi_library", lib.substr(0, lib.find_first_of(",\n")));
    if (world.rank() == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      attnmix::SilentReporter silent;
      benchmark::RunSpecifiedBenchmarks(&silent);
    }
    benchmark::Shutdown();
    attnmix::g_comm = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnmix_bench_mpi: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}
