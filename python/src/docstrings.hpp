// SPDX-License-Identifier: Apache-2.0
/// @file docstrings.hpp
/// The docstrings of the attributes that several hand-written classes share (a family's distribution, sampler and
/// data encoder), written once. The generated estimator, accumulator and factory classes compose theirs from the
/// family descriptor instead (estimator_class.cpp). Notation as in docs/mechanisms.md: S symbols, N context
/// positions, D query or embedding dimension, T targets, L hops, K categories.
#pragma once

namespace attnmix::python::doc {

// ---- every distribution, estimator and accumulator ----------------------------------------------------------------

inline constexpr const char* kName = "The name given at construction, a str or None.";
inline constexpr const char* kKeys =
    "The key of keyed tying, a str or None: after the E-step every site with the same key reads the pooled "
    "statistics.";
inline constexpr const char* kSamplerDist = "The distribution this sampler draws from.";
inline constexpr const char* kSample =
    "One observation (size=None) or a list of `size` observations; sample(size=m) equals m sample() calls.";

// ---- the sizes of a model ------------------------------------------------------------------------------------------

inline constexpr const char* kNumSymbols = "Number of symbols S, an int: symbols are the ids 0 .. S-1.";
inline constexpr const char* kContextLength = "Context length N, an int: the number of positions of a context.";
inline constexpr const char* kQueryDim = "Query dimension D, an int: the length of a query vector.";
inline constexpr const char* kEmbedDim = "Embedding dimension D, an int: the length of a symbol's embedding.";
inline constexpr const char* kNumTargets = "Number of targets T, an int: targets are the ids 0 .. T-1.";

// ---- the sizes a data encoder checks -------------------------------------------------------------------------------

inline constexpr const char* kEncoderNumSymbols =
    "The declared number of symbols S, an int, or None: symbol ids must lie in 0 .. S-1 (unchecked when None).";
inline constexpr const char* kEncoderContextLength =
    "The declared context length N, an int, or None: every context must have N positions (unchecked when None).";
inline constexpr const char* kEncoderQueryDim =
    "The declared query dimension D, an int, or None: every query must have D entries (unchecked when None).";
inline constexpr const char* kEncoderNumTargets =
    "The declared number of targets T, an int, or None: target ids must lie in 0 .. T-1 (unchecked when None).";

// ---- attention parameters ------------------------------------------------------------------------------------------

inline constexpr const char* kEmission =
    "Emission table B, a read-only float64 array of shape (S, T): row s is p(target | attended symbol s) and sums "
    "to 1.";
inline constexpr const char* kResponsibilities =
    "The posterior over attended positions of each row given its target, r[n, i] (each row sums to 1; a row "
    "impossible under the model is all zeros): (n, N). x: rows the model's encoder accepts, or an encoded batch.";
inline constexpr const char* kPositionPrior =
    "Position prior pi, a read-only float64 array of shape (N,) that sums to 1: the prior probability of attending "
    "each context position.";
inline constexpr const char* kEmbeddingSigma2 =
    "Gate variance sigma2 > 0, a float: the gate logits are minus the squared embedding distances divided by "
    "2 sigma2.";
inline constexpr const char* kPrecision =
    "The arithmetic of the gate in scoring and the E-step: 'float64' or 'mixed' (float distances and "
    "exponentials, double sums).";

}  // namespace attnmix::python::doc
