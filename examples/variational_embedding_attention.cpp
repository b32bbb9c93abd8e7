// SPDX-License-Identifier: Apache-2.0
// Fit variational embedding attention (tied query/key embeddings) on the synonym task of
// docs/mechanisms.md#variational-embedding-attention and report how well it transfers to synonyms never seen as
// queries; then fit the two-hop sibling (variational multi-hop attention) on the transitive lookup a -> b -> c.
// Referenced from include/attnmix/attention/variational_embedding.hpp and variational_multihop.hpp; compiled in CI.
#include <cstdio>
#include <optional>
#include <vector>

#include "attnmix/attention/recall_task.hpp"
#include "attnmix/attention/transitive_task.hpp"
#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/inference/optimize.hpp"

namespace {

using namespace attnmix;

/// 6 concepts with 2 synonyms each (symbols 2c, 2c + 1); a context holds one synonym of each of 4 distinct concepts;
/// the query names one of them with synonym `query_synonym`, and the target is f_map[concept].
VariationalEmbeddingAttentionBatch synonym_rows(Index n, int64_t query_synonym, const std::vector<int64_t>& f_map,
                                                Rng& rng) {
  IdMatrix contexts(n, 4);
  IdVector queries(n), targets(n);
  for (Index row = 0; row < n; ++row) {
    const std::vector<int64_t> concepts = rng.sample_without_replacement(6, 4);
    for (Index i = 0; i < 4; ++i)
      contexts(row, i) = 2 * concepts[static_cast<size_t>(i)] + static_cast<int64_t>(rng.uniform_int(2));
    const int64_t queried = concepts[static_cast<size_t>(rng.uniform_int(4))];
    queries[row] = 2 * queried + query_synonym;
    targets[row] = f_map[static_cast<size_t>(queried)];
  }
  return VariationalEmbeddingAttentionEncoder{12, 4, 6}.encode(contexts, queries, targets);
}

}  // namespace

int main() {
  // --- one hop, tied embeddings: train on synonym 0, test on synonym 1 ---
  Rng rng(11);
  const std::vector<int64_t> f_map = rng.sample_without_replacement(6, 6);
  const auto train = synonym_rows(1500, /*query_synonym=*/0, f_map, rng);
  const auto test = synonym_rows(1000, /*query_synonym=*/1, f_map, rng);
  VariationalEmbeddingAttentionEstimatorOptions est;
  est.sigma2 = 0.5;
  est.lr = 0.08;
  est.mc = 5;
  OptimizeOptions options;
  options.max_its = 250;
  options.delta = std::nullopt;  // a stochastic fit: run every iteration
  options.print_iter = 50;
  options.on_iteration = [](const IterationReport& r) { std::fputs(format_progress_line(r).c_str(), stdout); };
  const auto fit = optimize(train, VariationalEmbeddingAttentionEstimator(/*S=*/12, /*N=*/4, /*D=*/8, /*T=*/6, est),
                            options);
  const double acc = accuracy(fit.model.predict_proba(test), test.targets());
  std::printf("tied embeddings: accuracy %.3f on queries by the held-out synonym (Adam step %lld)\n", acc,
              static_cast<long long>(fit.model.optimizer_state().iteration));

  // --- two hops, tied embeddings: query a -> key a, value b -> key b, value c ---
  const TransitiveTaskOptions task{/*n_symbols=*/18, /*n_pairs=*/3};
  const ChainedAttentionBatch hop_train = make_transitive_task(800, /*seed=*/1, task);
  const ChainedAttentionBatch hop_test = make_transitive_task(600, /*seed=*/2, task);
  VariationalMultiHopAttentionEstimatorOptions hop_est;
  hop_est.sigma2 = 0.3;
  hop_est.lr = 0.07;
  hop_est.prior_strength = 0.05;
  hop_est.mc = 2;
  hop_est.anneal_iters = 80;
  options.max_its = 140;
  options.print_iter = 35;
  const auto hop_fit = optimize(hop_train, VariationalMultiHopAttentionEstimator(18, /*D=*/8, 18, hop_est), options);
  const double hop_acc = accuracy(hop_fit.model.predict_proba(hop_test), hop_test.targets());
  std::printf("two hops: accuracy %.3f on the transitive lookup\n", hop_acc);
  return acc > 0.5 && hop_acc > 0.3 ? 0 : 1;
}
