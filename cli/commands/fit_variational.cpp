// SPDX-License-Identifier: Apache-2.0
// `attnmix fit --family variational` and `--family variational-multihop`: read the data files
// (variational embedding attention: context/query/target rows; variational multi-hop attention: the
// chained-attention rows), settle S, N, D, T and build the estimator from the library's options
// with the flags that were given. With --init the dimensions and σ² default to the model's, and the
// estimator's seed is the model's noise seed (SPEC.md §4.5: the fit continues the model's Adam
// trajectory; the estimator's seed only seeds a fresh initialisation).
#include <string>
#include <utility>
#include <vector>

#include "attnmix/attention/variational_embedding.hpp"
#include "attnmix/attention/variational_multihop.hpp"
#include "attnmix/family/spec.hpp"
#include "cli_support.hpp"
#include "commands/fit_data.hpp"
#include "commands/fit_problem.hpp"

namespace attnmix::cli {

namespace {

/// The options every variational estimator shares, from the flags (or the library's defaults), σ²
/// from the --init model when --sigma2 is absent.
template <class Options, class Model>
void apply_common_flags(const FitArgs& args, const FitInit* init, const Model* init_model, Options& options) {
  options.sigma2 = settle_sigma2(args, init, init_model ? init_model->sigma2() : 0.0, options.sigma2);
  if (given(args.emission_smoothing_opt)) options.emission_smoothing = args.emission_smoothing;
  if (given(args.lr_opt)) options.lr = args.lr;
  if (given(args.mc_opt)) options.mc = args.mc;
  if (given(args.prior_strength_opt)) options.prior_strength = args.prior_strength;
  options.seed = init_model ? init_model->optimizer_state().seed : args.optimize.seed;
}

/// D: --embed-dim, else the --init model's, else kDefaultEmbedDim.
template <class Model>
int64_t embed_dim(const FitArgs& args, const FitInit* init, const Model* init_model) {
  return settle_dim(args.embed_dim_opt, args.embed_dim, "--embed-dim", "D", init,
                    init_model ? init_model->embed_dim() : 0)
      .value_or(Dim{kDefaultEmbedDim, "the default"})
      .value;
}

std::string dims_brief(int64_t S, int64_t N, int64_t D, int64_t T) {
  return "S=" + std::to_string(S) + ", N=" + std::to_string(N) + ", D=" + std::to_string(D) +
         ", T=" + std::to_string(T);
}

std::string dims_summary(int64_t S, int64_t N, int64_t D, int64_t T) {
  return "S=" + std::to_string(S) + " symbols, N=" + std::to_string(N) +
         " context positions, D=" + std::to_string(D) + " embedding dims, T=" + std::to_string(T) +
         " targets";
}

}  // namespace

FitProblem prepare_variational_fit(const FitArgs& args, const FitInit* init) {
  using Model = VariationalEmbeddingAttention;
  const Model* init_model = init ? &init_model_as<Model>(*init, args.family) : nullptr;
  const auto model_dim = [&](int64_t (Model::*dim)() const) {
    return init_model ? (init_model->*dim)() : 0;
  };
  const Dims declared = declared_dims(
      {{"S", settle_dim(args.symbols_opt, args.symbols, "--symbols", "S", init, model_dim(&Model::n_symbols))},
       {"N", settle_dim(args.context_length_opt, args.context_length, "--context-length", "N", init,
                        model_dim(&Model::context_length))},
       {"T", settle_dim(args.targets_opt, args.targets, "--targets", "T", init, model_dim(&Model::n_targets))}});
  const int64_t D = embed_dim(args, init, init_model);

  FitProblem problem;
  FitRows rows = read_fit_rows(args, declared, *variational_embedding_attention_family().schema);
  const Dims dims = rows.dims;
  VariationalEmbeddingAttentionEstimatorOptions options;  // the library's M-step defaults
  apply_common_flags(args, init, init_model, options);
  options.precision = parse_precision(args.precision, "--precision");
  if (init_model && options.precision != init_model->precision())
    problem.initial = AnyDistribution(VariationalEmbeddingAttention(init_model->params(), options.precision));
  const auto S = dims.at("S").value, N = dims.at("N").value, T = dims.at("T").value;
  problem.mechanism = "variational embedding attention";
  // Built before the rows are encoded: dimensions too large for the model fail here, before anything is sized.
  problem.estimator = build_estimator([&] { return VariationalEmbeddingAttentionEstimator(S, N, D, T, std::move(options)); },
                                      {{"S", &dims.at("S")}, {"N", &dims.at("N")}, {"T", &dims.at("T")}});
  take_fit_rows(problem, std::move(rows), args, variational_embedding_attention_family().encode);
  problem.dims_brief = dims_brief(S, N, D, T);
  problem.dims_summary = dims_summary(S, N, D, T);
  return problem;
}

FitProblem prepare_variational_multihop_fit(const FitArgs& args, const FitInit* init) {
  using Model = VariationalMultiHopAttention;
  const Model* init_model = init ? &init_model_as<Model>(*init, args.family) : nullptr;
  // A multi-hop model fixes S and T, not the context length N (as chained attention).
  const Dims declared = declared_dims(
      {{"S", settle_dim(args.symbols_opt, args.symbols, "--symbols", "S", init, init_model ? init_model->n_symbols() : 0)},
       {"N", flag_dim(args.context_length_opt, args.context_length, "--context-length")},
       {"T", settle_dim(args.targets_opt, args.targets, "--targets", "T", init,
                        init_model ? init_model->n_targets() : 0)}});
  const int64_t D = embed_dim(args, init, init_model);

  FitProblem problem;
  FitRows rows = read_fit_rows(args, declared, *variational_multihop_attention_family().schema);
  const Dims dims = rows.dims;
  VariationalMultiHopAttentionEstimatorOptions options;  // the library's M-step defaults
  apply_common_flags(args, init, init_model, options);
  if (given(args.anneal_iters_opt)) options.anneal_iters = args.anneal_iters;
  const auto S = dims.at("S").value, N = dims.at("N").value, T = dims.at("T").value;
  problem.mechanism = "variational multi-hop attention (2 hops)";
  // Built before the rows are encoded: dimensions too large for the model fail here, before anything is sized.
  problem.estimator = build_estimator([&] { return VariationalMultiHopAttentionEstimator(S, D, T, std::move(options)); },
                                      {{"S", &dims.at("S")}, {"T", &dims.at("T")}});
  take_fit_rows(problem, std::move(rows), args, variational_multihop_attention_family().encode);
  problem.dims_brief = dims_brief(S, N, D, T);
  problem.dims_summary = dims_summary(S, N, D, T);
  return problem;
}

}  // namespace attnmix::cli
