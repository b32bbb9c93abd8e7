// SPDX-License-Identifier: Apache-2.0
/// @file concepts.hpp
/// The compile-time contract of a family's roles (`docs/mechanisms.md#building-blocks`): what optimize(),
/// parallel_accumulate() and the type-erased handles require. Each family header ends with static_asserts against them.
#pragma once

#include <concepts>
#include <optional>
#include <span>

#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

/// An immutable batch of rows that slices in O(1).
template <class B>
concept Batch = std::copyable<B> && requires(const B& b, Index i) {
  { b.n_rows() } -> std::convertible_to<Index>;
  { b.slice(i, i) } -> std::same_as<B>;
};

/// Additive statistics: a commutative monoid with validated value semantics.
template <class A>
concept Accumulator = std::copyable<A> && requires(A& a, const A& c, std::span<double> out,
                                                   std::span<const double> in, double x, Rng& rng,
                                                   const typename A::batch_type& b) {
  { a.flat_size() } -> std::convertible_to<Index>;
  a.pack(out);
  a.unpack(in);
  a.combine(c);
  a.from_value(c);
  a.merge_trusted(c);
  a.scale(x);
  a.set_zero();
  a.initialize(b, in, rng);
  { c.value() } -> std::same_as<A>;
};

/// A model whose E-step is a const method of the current parameters.
template <class D>
concept Distribution = std::copyable<D> && Accumulator<typename D::accumulator_type> &&
    requires(const D& d, const typename D::batch_type& b, std::span<double> out, std::span<const double> w,
             typename D::accumulator_type& acc) {
      d.log_density(b, out);
      d.accumulate(b, w, acc, out);
      { d.make_accumulator() } -> std::same_as<typename D::accumulator_type>;
    };

/// A const, stateless M-step.
template <class E>
concept Estimator = requires(const E& e, std::optional<double> nobs, const typename E::accumulator_type& acc) {
  { e.make_accumulator() } -> std::same_as<typename E::accumulator_type>;
  { e.estimate(nobs, acc) } -> std::same_as<typename E::distribution_type>;
};

}  // namespace attnmix
