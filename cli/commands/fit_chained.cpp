// SPDX-License-Identifier: Apache-2.0
// `attnmix fit --family chained`: reads CA data files (--data, --valid), settles S, N, T and builds
// the L-hop estimator from the library's options with the flags that were given.
#include <string>
#include <utility>
#include <vector>

#include "attnmix/attention/chained.hpp"
#include "attnmix/family/spec.hpp"
#include "cli_support.hpp"
#include "commands/fit_data.hpp"
#include "commands/fit_problem.hpp"

namespace attnmix::cli {

FitProblem prepare_chained_fit(const FitArgs& args, const FitInit* init) {
  const ChainedAttention* init_model =
      init ? &init_model_as<ChainedAttention>(*init, args.family) : nullptr;
  // A chained model fixes S, T and L, not the context length N.
  const Dims declared = declared_dims(
      {{"S", settle_dim(args.symbols_opt, args.symbols, "--symbols", "S", init, init_model ? init_model->n_symbols() : 0)},
       {"N", flag_dim(args.context_length_opt, args.context_length, "--context-length")},
       {"T", settle_dim(args.targets_opt, args.targets, "--targets", "T", init,
                        init_model ? init_model->n_targets() : 0)}});
  const int64_t L = settle_dim(args.hops_opt, args.hops, "--hops", "L", init,
                               init_model ? init_model->n_hops() : 0)
                        .value_or(Dim{args.hops, "--hops"})
                        .value;
  FitProblem problem;
  FitRows rows = read_fit_rows(args, declared, *chained_attention_family().schema);
  const Dims dims = rows.dims;

  ChainedAttentionEstimatorOptions options;  // the library's M-step defaults
  options.sigma2 = settle_sigma2(args, init, init_model ? init_model->sigma2() : 0.0, options.sigma2);
  if (given(args.emission_smoothing_opt)) options.emission_smoothing = args.emission_smoothing;
  const auto S = dims.at("S").value, N = dims.at("N").value, T = dims.at("T").value;
  problem.mechanism = "chained attention (L = " + std::to_string(L) + (L == 1 ? " hop)" : " hops)");
  // Built before the rows are encoded: dimensions too large for the model fail here, before anything is sized.
  problem.estimator = build_estimator([&] { return ChainedAttentionEstimator(L, S, T, options); },
                                      {{"S", &dims.at("S")}, {"T", &dims.at("T")}});
  take_fit_rows(problem, std::move(rows), args, chained_attention_family().encode);
  problem.dims_brief = "L=" + std::to_string(L) + ", S=" + std::to_string(S) +
                       ", N=" + std::to_string(N) + ", T=" + std::to_string(T);
  problem.dims_summary = "L=" + std::to_string(L) + (L == 1 ? " hop, S=" : " hops, S=") +
                         std::to_string(S) + " symbols, N=" + std::to_string(N) +
                         " context positions, T=" + std::to_string(T) + " targets";
  return problem;
}

}  // namespace attnmix::cli
