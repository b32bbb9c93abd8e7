// SPDX-License-Identifier: Apache-2.0
/// @file reduce.hpp
/// The deterministic multi-threaded E-step and scoring pass (`docs/mechanisms.md#training`).
///
/// Rows are split into fixed chunks of chunk_rows rows (by default chosen from the statistics' size, never from the
/// thread count: chunk_rows_for). Chunk c fills a zeroed
/// partial P_c; partials are added into the total in chunk order, total = ((0 + P_0) + P_1) + …, so the result is
/// bitwise identical for any thread count. One thread reuses one partial, and its merge also clears it for the next
/// chunk (one pass over both buffers). Several threads own 3 partials each, which they zero themselves before use,
/// and whichever thread completes the next chunk in order merges it, so no thread waits for another at every chunk
/// (a lock-step ordered loop collapses when the machine is oversubscribed). Impossible rows of all chunks are
/// collected before the total is added to the caller's accumulator, so the E-step stays atomic; of other errors, the
/// first failing chunk's is rethrown.
/// Cost: the family's per-row cost, plus one flat add (and one zeroing) of the statistics per chunk
/// (docs/PERFORMANCE.md); memory: 1 (one thread) or 3·threads partials, kept between calls in a ReduceScratch.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/types.hpp"
#include "attnmix/stats/log_math.hpp"

namespace attnmix {

/// How the E-step and scoring passes run in parallel (`docs/mechanisms.md#training`); OptimizeOptions::parallel()
/// makes one from optimize()'s options.
struct ParallelOptions {
  /// The threads to use (≥ 0; resolve_threads); the results do not depend on it.
  int n_threads = 0;        // 0: all hardware threads
  /// The rows per chunk, the unit of work and of the ordered reduction: > 0, or 0 to let chunk_rows_for choose it
  /// from the statistics' size. Results change with it only at rounding level.
  Index chunk_rows = 0;
  /// @throws ValueError when n_threads < 0 or chunk_rows < 0.
  void validate() const;
};

/// The smallest chunk chunk_rows_for chooses (and its choice for statistics that are not one flat buffer).
inline constexpr Index kMinAutoChunkRows = 1024;
/// The largest chunk chunk_rows_for chooses.
inline constexpr Index kMaxAutoChunkRows = 65536;

/// The rows per chunk of a pass whose statistics have stat_entries entries: options.chunk_rows when positive;
/// otherwise the largest power of two ≤ stat_entries / 16, kept within [kMinAutoChunkRows, kMaxAutoChunkRows]
/// (stat_entries = 0, as for scoring: kMinAutoChunkRows). Each chunk ends in one pass over the statistics (the
/// ordered merge), so large statistics get long chunks that keep that pass a few per cent of the chunk's row work
/// (docs/PERFORMANCE.md, "Chunk size"). The choice depends on the model's size only, never on the thread count, so
/// results stay bitwise thread-count invariant. Cost: O(1).
[[nodiscard]] Index chunk_rows_for(const ParallelOptions& options, size_t stat_entries);

/// Threads to use for n_threads (0 = hardware); 1 without OpenMP.
[[nodiscard]] int resolve_threads(int n_threads);

namespace detail {
/// True when A's merge and zeroing are exactly FlatStats' element-wise ones (no family-specific override).
template <class A>
consteval bool plain_flat_stats() {
  if constexpr (!std::is_base_of_v<FlatStats, A>) {
    return false;
  } else {
    return std::is_same_v<decltype(&A::merge_trusted), void (FlatAccumulator<A>::*)(const A&)> &&
           std::is_same_v<decltype(&A::set_zero), void (FlatStats::*)()>;
  }
}

/// The entries of acc's statistics when they are one flat buffer (the pass each chunk's merge makes); 0 otherwise.
template <class A>
size_t stat_entries(const A& acc) {
  if constexpr (std::is_base_of_v<FlatStats, A>) {
    return acc.flat().size();
  } else {
    return 0;
  }
}

/// total += partial, then partial = 0: the ordered merge of a chunk and the zeroing of its partial for the thread's
/// next chunk. For plain flat accumulators (both from model.make_accumulator(), so one layout) it is one pass over
/// both buffers with exactly the additions of merge_trusted; otherwise merge_trusted, then set_zero.
template <class A>
void merge_and_clear(A& total, A& partial) {
  if constexpr (plain_flat_stats<A>()) {
    const std::span<double> src = partial.flat();
    const std::span<double> dst = total.flat();
    ATTNMIX_ASSERT(dst.size() == src.size(), "partial and total statistics differ in size");
    double* __restrict d = dst.data();
    double* __restrict p = src.data();
    for (size_t k = 0; k < src.size(); ++k) {
      d[k] += p[k];
      p[k] = 0.0;
    }
  } else {
    total.merge_trusted(partial);
    partial.set_zero();
  }
}
}  // namespace detail

/// The total and the partials of parallel_accumulate, kept between calls (EmStepper holds one) with one accumulator
/// configuration (the first caller's), so repeated E-steps allocate no statistics: a freed large buffer goes back to
/// the system and faults in again on the next call, which on a VM costs more than the merge itself. Every buffer is
/// zeroed before use, so results do not depend on reuse.
template <class A>
struct ReduceScratch {
  /// The chunk-ordered total of a call, before it is added to the caller's accumulator (null until first used).
  std::unique_ptr<A> total;
  /// The partials: one with one thread, 3 per thread otherwise (grown to the most threads used so far).
  std::vector<std::unique_ptr<A>> partials;
};

namespace detail {
/// slot, zeroed: a copy of the caller's accumulator the first time (so partials share its configuration, e.g. the
/// Monte-Carlo sample count of the variational families), set_zero() afterwards.
template <class A>
A& zeroed(std::unique_ptr<A>& slot, const A& prototype) {
  if (!slot) slot = std::make_unique<A>(prototype);
  slot->set_zero();
  return *slot;
}
}  // namespace detail

/// acc += statistics of (batch, w) under model, atomically; log_p_out (if non-empty) receives per-row log p.
/// scratch holds the reducer's buffers between calls (results are the same with a fresh one).
/// @throws ImpossibleEvidenceError (listing rows of the whole batch) and every error of the family's E-step.
template <class D>
void parallel_accumulate(const D& model, const typename D::batch_type& batch, std::span<const double> w,
                         typename D::accumulator_type& acc, std::span<double> log_p_out,
                         const ParallelOptions& options, ReduceScratch<typename D::accumulator_type>& scratch) {
  options.validate();
  const Index n = batch.n_rows();
  if (static_cast<Index>(w.size()) != n)
    throw ValueError("E-step: weights must have one entry per row (" + std::to_string(n) + ", got " +
                     std::to_string(w.size()) + ")");
  if (!log_p_out.empty() && static_cast<Index>(log_p_out.size()) != n)
    throw ValueError("E-step: log-density output must have one entry per row");
  const Index chunk = chunk_rows_for(options, detail::stat_entries(acc));
  // An empty batch still runs one (empty) chunk: a family may attach something to its statistics in every E-step
  // (the variational families attach the model's optimizer state), and a rank with an empty shard must too.
  const Index n_chunks = std::max<Index>(1, (n + chunk - 1) / chunk);
  const int n_threads = std::max(1, std::min<int>(resolve_threads(options.n_threads), static_cast<int>(n_chunks)));

  auto& total = detail::zeroed(scratch.total, acc);
  std::mutex error_mutex;
  std::exception_ptr error;
  Index error_chunk = n_chunks;  // the first failing chunk's error is the one rethrown
  std::string impossible_where;
  std::vector<int64_t> impossible;
  bool failed = false;  // read and written under error_mutex only

  // Runs chunk c into a zeroed partial; false (error recorded) when the family's E-step throws.
  const auto run_chunk = [&](Index c, typename D::accumulator_type& partial) -> bool {
    const Index begin = c * chunk;
    const Index count = std::min(chunk, n - begin);
    try {
      model.accumulate(batch.slice(begin, count), w.subspan(static_cast<size_t>(begin), static_cast<size_t>(count)),
                       partial,
                       log_p_out.empty() ? log_p_out
                                         : log_p_out.subspan(static_cast<size_t>(begin), static_cast<size_t>(count)));
      return true;
    } catch (const ImpossibleEvidenceError& e) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      failed = true;
      impossible_where = e.where();
      for (int64_t row : e.rows()) impossible.push_back(row + begin);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      failed = true;
      if (c < error_chunk) {
        error_chunk = c;
        error = std::current_exception();
      }
    }
    return false;
  };

  if (scratch.partials.empty()) scratch.partials.emplace_back();
  if (n_threads == 1) {
    auto& partial = detail::zeroed(scratch.partials.front(), acc);  // kept zero between chunks by merge_and_clear
    for (Index c = 0; c < n_chunks; ++c) {
      if (run_chunk(c, partial))
        detail::merge_and_clear(total, partial);
      else
        partial.set_zero();  // whatever a failed chunk left behind
    }
  } else {
    // Each thread owns kSlotsPerThread partials and zeroes one itself before running a chunk into it, so the
    // chunk's scattered writes hit lines already in the thread's own cache (a partial zeroed by another core's merge
    // made every one of them a remote miss: two threads were slower than one). Threads take chunks in order from a
    // counter; whichever thread completes the next chunk to merge adds it (and every completed chunk after it) to
    // the total under merge_mutex, so total = ((0 + P_0) + P_1) + … in chunk order. A thread waits only when all
    // its partials hold chunks not yet merged, i.e. when it is kSlotsPerThread − 1 chunks ahead of a slower one;
    // the thread holding the oldest unmerged chunk always has a free partial (its earlier chunks are merged).
    constexpr Index kSlotsPerThread = 3;
    const Index n_slots = kSlotsPerThread * Index{n_threads};
    auto& slots = scratch.partials;
    if (static_cast<Index>(slots.size()) < n_slots) slots.resize(static_cast<size_t>(n_slots));
    for (auto& slot : slots) {
      if (!slot) slot = std::make_unique<typename D::accumulator_type>(acc);
    }
    enum class Slot : unsigned char { kFree, kBusy, kDone, kFailed };
    std::vector<Slot> state(static_cast<size_t>(n_slots), Slot::kFree);  // under merge_mutex
    std::vector<Index> slot_of(static_cast<size_t>(n_chunks), -1);      // chunk → slot, under merge_mutex
    std::mutex merge_mutex;
    std::condition_variable merged;
    Index next_merge = 0;  // under merge_mutex
    std::atomic<Index> next_chunk{0};
    std::atomic<int> next_thread{0};

#pragma omp parallel num_threads(n_threads)
    {
      const Index first_slot = kSlotsPerThread * next_thread.fetch_add(1);
      for (Index c = next_chunk.fetch_add(1); c < n_chunks; c = next_chunk.fetch_add(1)) {
        size_t slot = 0;
        {
          std::unique_lock<std::mutex> lock(merge_mutex);
          merged.wait(lock, [&] {
            for (Index s = first_slot; s < first_slot + kSlotsPerThread; ++s) {
              if (state[static_cast<size_t>(s)] == Slot::kFree) {
                slot = static_cast<size_t>(s);
                return true;
              }
            }
            return false;
          });
          state[slot] = Slot::kBusy;
          slot_of[static_cast<size_t>(c)] = static_cast<Index>(slot);
        }
        slots[slot]->set_zero();  // by the thread that writes it next
        const bool ok = run_chunk(c, *slots[slot]);
        {
          const std::lock_guard<std::mutex> lock(merge_mutex);
          state[slot] = ok ? Slot::kDone : Slot::kFailed;
          while (next_merge < n_chunks) {
            const Index s = slot_of[static_cast<size_t>(next_merge)];
            if (s < 0 || state[static_cast<size_t>(s)] == Slot::kBusy) break;
            if (state[static_cast<size_t>(s)] == Slot::kDone) total.merge_trusted(*slots[static_cast<size_t>(s)]);
            state[static_cast<size_t>(s)] = Slot::kFree;
            ++next_merge;
          }
        }
        merged.notify_all();
      }
    }
  }
  if (error) std::rethrow_exception(error);
  if (failed) {
    std::sort(impossible.begin(), impossible.end());
    throw ImpossibleEvidenceError(impossible_where, std::move(impossible));
  }
  acc.merge_trusted(total);
}

/// parallel_accumulate with fresh buffers.
template <class D>
void parallel_accumulate(const D& model, const typename D::batch_type& batch, std::span<const double> w,
                         typename D::accumulator_type& acc, std::span<double> log_p_out,
                         const ParallelOptions& options) {
  ReduceScratch<typename D::accumulator_type> scratch;
  parallel_accumulate(model, batch, w, acc, log_p_out, options, scratch);
}

/// out[n] = log p(x_n) computed chunk-parallel (no reduction, so trivially thread-count invariant). When rows fail,
/// the first failing chunk's error is thrown, whatever the thread count.
template <class D>
void parallel_log_density(const D& model, const typename D::batch_type& batch, std::span<double> out,
                          const ParallelOptions& options) {
  options.validate();
  const Index n = batch.n_rows();
  if (static_cast<Index>(out.size()) != n) throw ValueError("log_density: output must have one entry per row");
  const Index chunk = chunk_rows_for(options, 0);
  const Index n_chunks = (n + chunk - 1) / chunk;
  const int n_threads = std::max(1, std::min<int>(resolve_threads(options.n_threads), static_cast<int>(n_chunks)));
  std::mutex error_mutex;
  std::exception_ptr error;  // the first failing chunk's, whatever the thread count
  Index error_chunk = n_chunks;
#pragma omp parallel for num_threads(n_threads) schedule(static, 1)
  for (Index c = 0; c < n_chunks; ++c) {
    const Index begin = c * chunk;
    const Index count = std::min(chunk, n - begin);
    try {
      model.log_density(batch.slice(begin, count),
                        out.subspan(static_cast<size_t>(begin), static_cast<size_t>(count)));
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (c < error_chunk) {
        error_chunk = c;
        error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

/// Σ_n log p(x_n) with unit weights, summed in a fixed pairwise order.
template <class D>
[[nodiscard]] double score(const D& model, const typename D::batch_type& batch, const ParallelOptions& options) {
  std::vector<double> log_p(static_cast<size_t>(batch.n_rows()));
  parallel_log_density(model, batch, log_p, options);
  return pairwise_sum(log_p);
}

}  // namespace attnmix
