// SPDX-License-Identifier: Apache-2.0
/// @file optimize.hpp
/// The EM driver (`docs/mechanisms.md#training`): random-subset initialisation, the fused loop (default) or the
/// classic loop, the best-scoring iterate returned. Written once for every family: concrete families (static
/// kernels) and the type-erased AnyEstimator alike.
///
///   init:  w_n ~ Bernoulli(init_p) (from Rng(seed).uniform_int(2³¹−1)); acc.initialize(batch, w, rng);
///          model = estimate(Σ w, acc)
///   EM_step(model) = estimate(None, E-step statistics of all rows under model)
///   fused: each iteration runs one E-step of `model`, which yields both the next model and score(model).
/// The library never prints: each report goes to options.on_iteration.
/// Checkpoints (OptimizeCheckpoints): the loop's state goes out every K iterations, and a run can start from one and
/// end where the run that saved it would have ended.
/// Distributed (options.communicator, communicator.hpp): every rank runs this same loop on its shard; after each
/// E-step the flat statistics and the score are summed over ranks, so every rank computes the same model. A failure
/// on any rank (a bad row, impossible evidence) is agreed on before the sum, and every rank throws.
/// Cost per iteration: one E-step (the family's cost, parallel over chunks) plus one M-step, plus one sum of the
/// statistics over ranks when distributed.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/communicator.hpp"
#include "attnmix/inference/progress.hpp"
#include "attnmix/inference/reduce.hpp"
#include "attnmix/stats/log_math.hpp"

namespace attnmix {

/// How optimize() ended: kConverged when an iteration's score improvement fell below OptimizeOptions::delta (a
/// decrease included); kMaxIterations when max_its iterations ran without that (also for max_its = 0).
enum class OptimizeStatus { kConverged, kMaxIterations };

/// The single source of optimize()'s defaults (C++, CLI flags and Python keywords).
struct OptimizeOptions {
  /// The most EM iterations (≥ 0; CLI --max-its). 0 returns the starting model unscored.
  int max_its = 10;
  /// The convergence threshold: the loop stops at the first iteration whose score improvement is below delta, so a
  /// decrease stops it too. nullopt runs every iteration (and the classic loop then accepts every finite step).
  /// Must not be NaN.
  std::optional<double> delta = 1e-9;  // nullopt: run every iteration
  /// The probability with which each row takes part in the random initialisation (w_n ~ Bernoulli(init_p)). Must
  /// not be NaN.
  double init_p = 0.1;                 // ≤ 0 behaves as 0.1; clamped to [0, 1]
  /// The seed of the random initialisation (Rng(seed)); not used when optimize() is given a starting model.
  uint64_t seed = 0;
  /// The reporting period (> 0): which iterations reach on_iteration.
  int print_iter = 1;                  // report iteration i when i % print_iter == 0 (or on convergence)
  /// True: the fused loop, which scores each model in the pass that runs its E-step; false: the classic loop, which
  /// scores every new model in a pass of its own (CLI --classic).
  bool reuse_estep_ll = true;          // fused loop; false: classic loop
  /// The E-step and scoring threads (≥ 0); the results do not depend on it.
  int n_threads = 0;                   // 0: all hardware threads
  /// Rows per parallel chunk (> 0), or 0 to choose them from the statistics' size (chunk_rows_for); the results
  /// change with it only at rounding level (reduce.hpp).
  Index chunk_rows = 0;
  /// The processes of a distributed fit (not owned; nullptr: this process alone). Every rank passes equal options.
  const Communicator* communicator = nullptr;
  /// A distributed fit's M-step split over the ranks (sharded_mstep.hpp): each rank sums and estimates only its
  /// symbols' rows, then gathers the others'. The model has the same bits either way. Only for estimators with an
  /// estimate_sharded() (responsibility attention, dense or sparse, and chained attention; has_sharded_mstep()); no
  /// effect on a single process.
  bool sharded_mstep = false;
  /// Receives the report of every print_iter-th iteration and of the converged one, on the calling thread (on every
  /// rank of a distributed fit); empty: no reports.
  std::function<void(const IterationReport&)> on_iteration;
  /// @throws ValueError naming the field.
  void validate() const;
  /// The options of the E-step and scoring passes: {n_threads, chunk_rows}.
  [[nodiscard]] ParallelOptions parallel() const { return {n_threads, chunk_rows}; }
};

/// What optimize() returns (`docs/mechanisms.md#training`): the best-scoring model of distribution type D and how
/// the loop ended.
template <class D>
struct OptimizeResult {
  /// The returned model: the best-scoring iterate (ties go to the later one); in the classic loop with validation
  /// data, the accepted iterate with the best validation score.
  D model;
  /// Whether the loop stopped on delta (kConverged) or ran out of iterations (kMaxIterations).
  OptimizeStatus status = OptimizeStatus::kMaxIterations;
  /// The iterations run (0 when max_its = 0).
  int n_iterations = 0;
  /// The iteration whose report line scored the returned model; max_its + 1: the final model of a fused loop that did
  /// not converge; 0: the starting model (max_its = 0, or a classic loop that accepted no step).
  int best_iteration = 0;       // the report line whose model was returned (max_its + 1: the final model)
  /// The training score of every iteration's reported model, reported to on_iteration or not: scores[i − 1] is
  /// iteration i's. The score of the final model, scored after a fused loop that did not converge, is not included.
  std::vector<double> scores{};  // score of each reported model, by iteration
};

/// Where optimize() stands after an iteration: everything its loop carries into the next one. optimize() given this
/// state (OptimizeCheckpoints::resume) goes on to the result of the run that saved it, bit for bit, for any number
/// of threads (`docs/mechanisms.md#training`, "Checkpoints").
template <class D>
struct OptimizeState {
  /// The iterations run.
  int iteration = 0;
  /// The model the next iteration starts from.
  D model;
  /// The returned model so far, its report line and every score so far (n_iterations = iteration).
  OptimizeResult<D> result;
  /// The fused loop's best training score so far; the classic loop's best validation score (with validation data).
  std::optional<double> best = std::nullopt;
  /// The fused loop's last finite score, which the next iteration's delta is taken against; the classic loop's score
  /// of the last accepted model.
  std::optional<double> previous = std::nullopt;
};

/// Saving optimize()'s state as it runs, and starting it from a saved state.
template <class D>
struct OptimizeCheckpoints {
  /// Receives the state after every `every`-th iteration that does not end the loop by converging (the last
  /// iteration of max_its included: a later run may raise max_its), on the calling thread of every rank.
  std::function<void(const OptimizeState<D>&)> save = {};
  /// The period of save (> 0).
  int every = 1;
  /// A state to go on from (not owned; null: start afresh). Its iteration must not exceed max_its; the starting model
  /// that optimize() is given is then not used.
  const OptimizeState<D>* resume = nullptr;
};

/// Key tying pass, depth first. A concrete top-level site can only tie with itself (a no-op), so
/// for concrete accumulators the pass starts at their type-erased children (Mixture, Composite).
template <class A>
void tie_keys(A& acc) {
  if constexpr (requires { acc.children(); }) {
    KeyPool pool;
    for (AnyAccumulator& child : acc.children()) child.key_merge(pool);
    for (AnyAccumulator& child : acc.children()) child.key_replace(pool);
  }
}
/// Key tying pass over a type-erased accumulator, depth first from the accumulator itself: the first site with a key
/// holds the pool, later sites add into it, then every site reads the pooled statistics
/// (`docs/mechanisms.md#building-blocks`).
inline void tie_keys(AnyAccumulator& acc) {
  KeyPool pool;
  acc.key_merge(pool);
  acc.key_replace(pool);
}

/// Whether estimator has a sharded M-step (an estimate_sharded(); for AnyEstimator, the family it holds).
template <class E>
[[nodiscard]] bool has_sharded_mstep(const E& estimator) {
  if constexpr (std::is_same_v<E, AnyEstimator>)
    return estimator.has_sharded_mstep();
  else
    return ShardedEstimator<E>;
}

namespace detail {
/// acc ← Σ over ranks (in place, same bits on every rank).
template <class A>
void sum_over_ranks(A& acc, const Communicator& comm) {
  if constexpr (std::is_base_of_v<FlatStats, A>) {
    comm.sum(acc.flat());
  } else {
    std::vector<double> flat(static_cast<size_t>(acc.flat_size()));
    acc.pack(flat);
    comm.sum(flat);
    acc.unpack(flat);
  }
}

inline double sum_over_ranks(double x, const Communicator* comm) {
  if (!comm) return x;
  comm->sum({&x, 1});
  return x;
}

/// @throws ValueError "optimize: the data has no rows …" when no rank holds a row (EM would return a model fitted
/// to nothing). Collective over comm: every rank throws, or none does.
void require_rows(Index local_rows, const Communicator* comm);
}  // namespace detail

/// score() of a sharded batch: Σ log p over every rank's rows (agreeing on failures).
template <class D>
[[nodiscard]] double global_score(const D& model, const typename D::batch_type& batch,
                                  const ParallelOptions& parallel, const Communicator* comm) {
  double local = 0.0;
  detail::on_every_rank(comm, [&] { local = score(model, batch, parallel); });
  return detail::sum_over_ranks(local, comm);
}

/// The random initial model of optimize() (single-threaded), drawing from the caller's rng (which advances):
/// rng_w = Rng(rng.uniform_int(2³¹ − 1)), w_n ~ Bernoulli(init_p) from rng_w, responsibilities from rng.
/// options.seed is not used; optimize(batch, estimator, options, initialize_model(…, rng)) equals optimize() with a
/// seed whenever rng = Rng(seed). The Python binding uses it for an rng object supplied by the caller.
/// @throws ValueError when the data has no rows (detail::require_rows).
template <class E>
[[nodiscard]] typename E::distribution_type initialize_model(const typename E::distribution_type::batch_type& batch,
                                                             const E& estimator, const OptimizeOptions& options,
                                                             Rng& rng) {
  const Communicator* comm = options.communicator;
  detail::require_rows(batch.n_rows(), comm);
  double p = options.init_p > 0.0 ? options.init_p : 0.1;
  p = std::min(1.0, p);
  Rng rng_w(rng.uniform_int((uint64_t{1} << 31) - 1));
  const Index rows = batch.n_rows();
  auto acc = estimator.make_accumulator();
  double nobs = 0.0;
  std::vector<double> w(static_cast<size_t>(rows));
  if (!comm) {
    for (double& wn : w) wn = rng_w.bernoulli(p) ? 1.0 : 0.0;
    acc.initialize(batch, w, rng);
    for (double wn : w) nobs += wn;
  } else {
    // Replay the single-process draws over all global rows: the subset weights of the rows before this shard are
    // drawn and dropped (those after it are never needed), and the family's initialisation draws for other ranks'
    // rows are made and dropped in their single-process order (initialize_shard), without the rows.
    const RowShard shard = row_shard(*comm, rows);
    for (int64_t g = 0; g < shard.offset; ++g) static_cast<void>(rng_w.bernoulli(p));
    for (double& wn : w) wn = rng_w.bernoulli(p) ? 1.0 : 0.0;
    detail::on_every_rank(
        comm, [&] { initialize_shard(acc, batch, w, rng, shard.offset, shard.total - shard.offset - rows); });
    for (double wn : w) nobs += wn;
    detail::sum_over_ranks(acc, *comm);
    nobs = detail::sum_over_ranks(nobs, comm);
  }
  tie_keys(acc);
  return estimator.estimate(nobs, acc);
}

/// The random initial model of optimize() (`docs/mechanisms.md#training`) from Rng(options.seed).
template <class E>
[[nodiscard]] typename E::distribution_type initialize_model(const typename E::distribution_type::batch_type& batch,
                                                             const E& estimator, const OptimizeOptions& options) {
  Rng rng(options.seed);
  return initialize_model(batch, estimator, options, rng);
}

/// EM steps over one batch with reusable storage: the unit weights, the accumulator and the reducer's partials are
/// allocated once and reused by every step(), so an iteration allocates only the new model. (Large buffers freed
/// every iteration go back to the system and fault in again; on a VM that costs a quarter of a
/// responsibility-attention iteration, docs/PERFORMANCE.md.) The statistics are zeroed before each E-step, so step()
/// equals a fresh em_step bit for bit.
template <class E>
class EmStepper {
 public:
  /// The distribution type E estimates.
  using D = typename E::distribution_type;
  /// comm: the processes of a distributed fit (not owned; nullptr: this process alone); sharded: the M-step split
  /// over them (OptimizeOptions::sharded_mstep; estimator must have one, has_sharded_mstep).
  EmStepper(const E& estimator, Index n_rows, const Communicator* comm = nullptr, bool sharded = false)
      : estimator_(estimator),
        ones_(static_cast<size_t>(n_rows), 1.0),
        acc_(estimator.make_accumulator()),
        comm_(comm),
        sharded_(comm && sharded) {
    if (sharded && !has_sharded_mstep(estimator))
      throw ValueError("optimize: sharded_mstep: this family has no sharded M-step (the attention families have one: "
                       "responsibility, dense or sparse, chained, variational and variational multi-hop)");
  }

  /// One EM step of model: E-step over all rows with unit weights, key tying, M-step. log_p_out (empty, or one
  /// entry per row) receives the per-row log densities of `model` (the fused loop's score).
  [[nodiscard]] D step(const D& model, const typename D::batch_type& batch, std::span<double> log_p_out,
                       const ParallelOptions& parallel) {
    acc_.set_zero();
    detail::on_every_rank(comm_,
                          [&] { parallel_accumulate(model, batch, ones_, acc_, log_p_out, parallel, scratch_); });
    if constexpr (ShardedEstimator<E>)
      if (sharded_) return estimator_.estimate_sharded(acc_, *comm_);  // no keys to tie: a family on its own
    if (comm_) detail::sum_over_ranks(acc_, *comm_);
    tie_keys(acc_);
    return estimator_.estimate(std::nullopt, acc_);
  }

 private:
  E estimator_;  // a copy: estimators are small and const, and a stepper must not outlive a temporary
  std::vector<double> ones_;
  typename E::accumulator_type acc_;
  ReduceScratch<typename E::accumulator_type> scratch_;
  const Communicator* comm_;
  bool sharded_;
};

/// One EM step of model (EmStepper::step with fresh storage).
template <class E>
[[nodiscard]] typename E::distribution_type em_step(const typename E::distribution_type& model,
                                                    const typename E::distribution_type::batch_type& batch,
                                                    const E& estimator, std::span<double> log_p_out,
                                                    const ParallelOptions& parallel) {
  return EmStepper<E>(estimator, batch.n_rows()).step(model, batch, log_p_out, parallel);
}

/// Fits estimator's family to batch by EM. @throws ValueError when the data has no rows (on every rank), and every
/// validation / impossible-evidence error of the steps.
template <class E>
[[nodiscard]] OptimizeResult<typename E::distribution_type> optimize(
    const typename E::distribution_type::batch_type& batch, const E& estimator, const OptimizeOptions& options,
    std::optional<typename E::distribution_type> prev_estimate = std::nullopt,
    const typename E::distribution_type::batch_type* valid = nullptr,
    const OptimizeCheckpoints<typename E::distribution_type>* checkpoints = nullptr) {
  using D = typename E::distribution_type;
  using Clock = std::chrono::steady_clock;
  options.validate();
  const OptimizeState<D>* resume = checkpoints ? checkpoints->resume : nullptr;
  if (checkpoints && checkpoints->every <= 0)
    throw ValueError("optimize: checkpoints every " + std::to_string(checkpoints->every) +
                     " iterations (must be > 0)");
  if (resume && resume->iteration > options.max_its)
    throw ValueError("optimize: the saved state is after iteration " + std::to_string(resume->iteration) +
                     ", beyond max_its = " + std::to_string(options.max_its));
  const ParallelOptions parallel = options.parallel();
  const Communicator* comm = options.communicator;
  detail::require_rows(batch.n_rows(), comm);  // also with prev_estimate, and before max_its = 0 returns it
  D model = resume          ? resume->model
            : prev_estimate ? std::move(*prev_estimate)
                            : initialize_model(batch, estimator, options);
  OptimizeResult<D> result = resume ? resume->result : OptimizeResult<D>{model};
  if (options.max_its == 0) return result;
  const int first = resume ? resume->iteration + 1 : 1;
  const auto save = [&](int i, const std::optional<double>& best, const std::optional<double>& previous) {
    if (checkpoints && checkpoints->save && i % checkpoints->every == 0)
      checkpoints->save(OptimizeState<D>{i, model, result, best, previous});
  };

  const auto report = [&](int i, double ll, double dll, const D& reported, bool converged, Clock::time_point t0) {
    result.scores.push_back(ll);
    if (!options.on_iteration || !(i % options.print_iter == 0 || converged)) return;
    IterationReport r{i, ll, dll, std::nullopt, std::chrono::duration<double>(Clock::now() - t0).count()};
    if (valid) r.valid_log_likelihood = global_score(reported, *valid, parallel, comm);
    options.on_iteration(r);
  };
  std::vector<double> log_p(static_cast<size_t>(batch.n_rows()));
  EmStepper<E> stepper(estimator, batch.n_rows(), comm, options.sharded_mstep);
  bool converged = false;

  if (options.reuse_estep_ll) {
    std::optional<double> best_score = resume ? resume->best : std::nullopt;
    std::optional<double> prev = resume ? resume->previous : std::nullopt;
    for (int i = first; i <= options.max_its; ++i) {
      const auto t0 = Clock::now();
      D next = stepper.step(model, batch, log_p, parallel);
      const double ll = detail::sum_over_ranks(pairwise_sum(log_p), comm);
      if (!best_score || ll >= *best_score) {
        result.model = model;
        result.best_iteration = i;
        best_score = ll;
      }
      const double dll = prev ? ll - *prev : kInf;
      converged = options.delta && prev && dll < *options.delta;
      result.n_iterations = i;
      report(i, ll, dll, model, converged, t0);
      if (converged) break;
      if (std::isfinite(ll)) prev = ll;
      model = std::move(next);
      save(i, best_score, prev);
    }
    if (!converged) {
      const double s = global_score(model, batch, parallel, comm);
      if (s >= *best_score) {
        result.model = model;
        result.best_iteration = options.max_its + 1;
      }
    }
  } else {
    // Classic loop: accept a step iff its score is finite and (it did not decrease or delta is None).
    double old = resume ? resume->previous.value_or(kNegInf) : global_score(model, batch, parallel, comm);
    std::optional<double> best_valid = resume ? resume->best : std::nullopt;
    for (int i = first; i <= options.max_its; ++i) {
      const auto t0 = Clock::now();
      D next = stepper.step(model, batch, log_p, parallel);
      const double ll = global_score(next, batch, parallel, comm);
      const double dll = ll - old;
      const bool accept = std::isfinite(ll) && (dll >= 0.0 || !options.delta);
      if (accept) {
        model = next;
        if (valid) {
          const double v = global_score(model, *valid, parallel, comm);
          if (!best_valid || v >= *best_valid) {
            best_valid = v;
            result.model = model;
            result.best_iteration = i;
          }
        } else {
          result.model = model;
          result.best_iteration = i;
        }
      }
      if (std::isfinite(ll)) old = ll;
      converged = options.delta && dll < *options.delta;
      result.n_iterations = i;
      report(i, ll, dll, next, converged, t0);
      if (converged) break;
      save(i, best_valid, old);
    }
  }
  result.status = converged ? OptimizeStatus::kConverged : OptimizeStatus::kMaxIterations;
  return result;
}

}  // namespace attnmix
