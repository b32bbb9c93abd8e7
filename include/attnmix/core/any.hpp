// SPDX-License-Identifier: Apache-2.0
/// @file any.hpp
/// Type-erased value handles at batch granularity: AnyBatch, AnyAccumulator, AnyDistribution and
/// AnyEstimator. One virtual call covers a whole chunk of rows, so Mixture, Composite, optimize() and the key pool
/// are written once against these handles while each family's kernels stay static.
///
/// Batches, distributions and estimators are immutable, so their handles share one instance (cheap copies with
/// value semantics); accumulators are mutable and deep-copied.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "attnmix/core/accumulator.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/core/types.hpp"

namespace attnmix {

class AnyAccumulator;
class AnyDistribution;
class AnyEstimator;
class Communicator;

/// The key pool of keyed tying: key → the first site (in depth-first order) carrying that key, for one pass.
using KeyPool = std::map<std::string, AnyAccumulator*>;

// ---------------------------------------------------------------------------------------------------------------
/// An immutable batch of any family.
class AnyBatch {
 public:
  AnyBatch() = default;
  /// Wraps a family's batch (moved into one shared, immutable instance; copies of the handle share it).
  template <class B>
    requires(!std::same_as<std::remove_cvref_t<B>, AnyBatch>)
  explicit AnyBatch(B batch) : self_(std::make_shared<const Model<B>>(std::move(batch))) {}

  /// Whether this handle holds a batch (false for a default-constructed one).
  [[nodiscard]] bool has_value() const noexcept { return self_ != nullptr; }
  /// The number of rows of the batch held; 0 for an empty handle.
  [[nodiscard]] Index n_rows() const { return self_ ? self_->n_rows() : 0; }
  /// Rows [begin, begin + count) as a batch of the same family, through the family's O(1) slice; the range must
  /// lie within the batch (the family checks it). The handle must not be empty.
  [[nodiscard]] AnyBatch slice(Index begin, Index count) const {
    AnyBatch out;
    out.self_ = self_->slice(begin, count);
    return out;
  }
  /// The concrete batch. @throws TypeError when this batch holds another family's rows.
  template <class B>
  [[nodiscard]] const B& get(std::string_view where) const {
    if (!self_ || self_->type() != typeid(B))
      throw TypeError(std::string(where) + ": the data batch belongs to another family (got " +
                      (self_ ? self_->type().name() : "an empty batch") + ")");
    return static_cast<const Model<B>&>(*self_).batch;
  }

 private:
  struct Concept {
    virtual ~Concept() = default;
    [[nodiscard]] virtual Index n_rows() const = 0;
    [[nodiscard]] virtual std::shared_ptr<const Concept> slice(Index begin, Index count) const = 0;
    [[nodiscard]] virtual const std::type_info& type() const = 0;
  };
  template <class B>
  struct Model final : Concept {
    explicit Model(B b) : batch(std::move(b)) {}
    Index n_rows() const override { return batch.n_rows(); }
    std::shared_ptr<const Concept> slice(Index begin, Index count) const override {
      return std::make_shared<const Model<B>>(batch.slice(begin, count));
    }
    const std::type_info& type() const override { return typeid(B); }
    B batch;
  };
  std::shared_ptr<const Concept> self_;
};

/// Unwraps an AnyBatch to the batch type a family expects (identity when the family takes AnyBatch).
template <class B>
[[nodiscard]] const B& batch_as(const AnyBatch& batch, std::string_view where) {
  if constexpr (std::same_as<B, AnyBatch>)
    return batch;
  else
    return batch.template get<B>(where);
}

// ---------------------------------------------------------------------------------------------------------------
/// acc.initialize_shard(batch, …) (a distributed fit's initialisation, inference/optimize.hpp) when the family has
/// it; a family defined outside the library may not, and then cannot be fitted distributed: ValueError.
template <class A, class B>
void initialize_shard(A& acc, const B& batch, std::span<const double> w, Rng& rng, Index rows_before,
                      Index rows_after) {
  if constexpr (requires { acc.initialize_shard(batch, w, rng, rows_before, rows_after); })
    acc.initialize_shard(batch, w, rng, rows_before, rows_after);
  else
    throw ValueError(std::string(A::kWhere) + ": a distributed fit of this family is not supported (it has no "
                     "initialize_shard, which replays the other ranks' initialisation draws)");
}

/// A mutable accumulator of any family (deep copy). Copying, moving, get() and get_if() accept an empty
/// (default-constructed) handle; every other member requires one that holds an accumulator.
class AnyAccumulator {
 public:
  /// The batches initialize() takes: any family's, unwrapped to the held family's batch type.
  using batch_type = AnyBatch;

  AnyAccumulator() = default;
  /// Wraps a family's accumulator (moved in; the handle owns it).
  template <class A>
    requires(!std::same_as<std::remove_cvref_t<A>, AnyAccumulator>)
  explicit AnyAccumulator(A acc) : self_(std::make_unique<Model<A>>(std::move(acc))) {}
  /// @name Value semantics
  //@{
  /// A copy is a deep copy of the held accumulator (statistics, keys and children; an empty handle copies as
  /// empty); a move takes the accumulator over and leaves the source empty.
  AnyAccumulator(const AnyAccumulator& other) : self_(other.self_ ? other.self_->clone() : nullptr) {}
  AnyAccumulator(AnyAccumulator&&) noexcept = default;
  AnyAccumulator& operator=(const AnyAccumulator& other) {
    if (this != &other) self_ = other.self_ ? other.self_->clone() : nullptr;
    return *this;
  }
  AnyAccumulator& operator=(AnyAccumulator&&) noexcept = default;
  //@}

  /// The number of doubles pack() writes: a leaf's flat buffer; a combinator's own fields followed by its children's.
  [[nodiscard]] Index flat_size() const { return self_->flat_size(); }
  /// Writes the statistics to out, which must hold flat_size() doubles. @throws ValueError for a wrong size.
  void pack(std::span<double> out) const { self_->pack(out); }
  /// Validates, then overwrites. @throws ValueError when a check fails.
  void unpack(std::span<const double> in) { self_->unpack(in); }
  /// Validates other, then adds it. @throws ValueError (or TypeError).
  void combine(const AnyAccumulator& other) { self_->combine(*other.self_); }
  /// Validates v, then overwrites (keys stay). @throws ValueError (or TypeError).
  void from_value(const AnyAccumulator& v) { self_->from_value(*v.self_); }
  /// A snapshot: a deep copy of this handle, which later changes to it never alias.
  [[nodiscard]] AnyAccumulator value() const { return *this; }
  /// Multiplies every statistic by c (finite, ≥ 0). @throws ValueError otherwise.
  void scale(double c) { self_->scale(c); }
  /// Sets every statistic to 0 (keys stay).
  void set_zero() { self_->set_zero(); }
  /// Adds a partial produced by this library's own E-step (layout checked, values trusted).
  void merge_trusted(const AnyAccumulator& other) { self_->merge_trusted(*other.self_); }
  /// seq_initialize: the random initialisation of optimize() (`docs/mechanisms.md#training`).
  void initialize(const AnyBatch& batch, std::span<const double> w, Rng& rng) { self_->initialize(batch, w, rng); }
  /// The draws of initialize() over [rows_before other rows; batch; rows_after other rows], with only batch's rows
  /// accumulated: what each process of a distributed fit runs (inference/optimize.hpp).
  void initialize_shard(const AnyBatch& batch, std::span<const double> w, Rng& rng, Index rows_before,
                        Index rows_after) {
    self_->initialize_shard(batch, w, rng, rows_before, rows_after);
  }
  /// The key of keyed tying of the held accumulator (`docs/mechanisms.md#building-blocks`); nothing when untied.
  [[nodiscard]] std::optional<std::string> keys() const { return self_->keys(); }
  /// The type of the family's accumulator held (adapters find their wrappers by it).
  [[nodiscard]] const std::type_info& type() const { return self_->type(); }
  /// The sub-accumulators of a combinator (Mixture components, Composite fields); empty for a leaf.
  [[nodiscard]] std::span<AnyAccumulator> children() { return self_->children(); }
  /// The sub-accumulators of a combinator, read-only; empty for a leaf.
  [[nodiscard]] std::span<const AnyAccumulator> children() const { return self_->children(); }
  /// A leaf's flat statistics buffer (core/accumulator.hpp), or null for a combinator.
  [[nodiscard]] const FlatStats* flat_stats() const { return self_->flat_stats(); }
  /// Keyed tying (`docs/mechanisms.md#building-blocks`): this site then its children depth-first.
  /// The first site with a key becomes the pool's entry for it; a later site with the same key is combined into that
  /// entry (validated). pool holds pointers into the tree: keep the tree unchanged until key_replace has run.
  /// @throws ValueError (or TypeError) as combine.
  void key_merge(KeyPool& pool);
  /// The second half of keyed tying, after key_merge over the same pool: every keyed site other than the pool's entry
  /// reads the pooled statistics (from_value, so its own keys stay), this site then its children depth-first. Tied
  /// sites then hold identical statistics. @throws ValueError (or TypeError) as from_value.
  void key_replace(const KeyPool& pool);
  /// Whether both handles hold the same family with equal accumulators (the family's operator==); false across
  /// families.
  [[nodiscard]] bool operator==(const AnyAccumulator& other) const { return self_->equals(*other.self_); }

  /// The concrete accumulator of family type A, writable. @throws TypeError naming where when this handle is empty or
  /// holds another family's statistics.
  template <class A>
  [[nodiscard]] A& get(std::string_view where) {
    if (!self_ || self_->type() != typeid(A))
      throw TypeError(std::string(where) + ": the statistics belong to another family");
    return static_cast<Model<A>&>(*self_).acc;
  }
  /// The concrete accumulator of family type A, read-only. @throws TypeError as the writable overload.
  template <class A>
  [[nodiscard]] const A& get(std::string_view where) const {
    return const_cast<AnyAccumulator*>(this)->get<A>(where);
  }
  /// The concrete accumulator, or nullptr when this handle holds another family (bindings dispatch on it).
  template <class A>
  [[nodiscard]] A* get_if() noexcept {
    return self_ && self_->type() == typeid(A) ? &static_cast<Model<A>&>(*self_).acc : nullptr;
  }
  /// The concrete accumulator, read-only, or nullptr when this handle is empty or holds another family.
  template <class A>
  [[nodiscard]] const A* get_if() const noexcept {
    return const_cast<AnyAccumulator*>(this)->get_if<A>();
  }

 private:
  struct Concept {
    virtual ~Concept() = default;
    [[nodiscard]] virtual std::unique_ptr<Concept> clone() const = 0;
    [[nodiscard]] virtual const std::type_info& type() const = 0;
    [[nodiscard]] virtual Index flat_size() const = 0;
    virtual void pack(std::span<double> out) const = 0;
    virtual void unpack(std::span<const double> in) = 0;
    virtual void combine(const Concept& other) = 0;
    virtual void from_value(const Concept& other) = 0;
    virtual void scale(double c) = 0;
    virtual void set_zero() = 0;
    virtual void merge_trusted(const Concept& other) = 0;
    virtual void initialize(const AnyBatch& batch, std::span<const double> w, Rng& rng) = 0;
    virtual void initialize_shard(const AnyBatch& batch, std::span<const double> w, Rng& rng, Index rows_before,
                                  Index rows_after) = 0;
    [[nodiscard]] virtual std::optional<std::string> keys() const = 0;
    [[nodiscard]] virtual std::span<AnyAccumulator> children() = 0;
    [[nodiscard]] virtual const FlatStats* flat_stats() const = 0;
    [[nodiscard]] virtual bool equals(const Concept& other) const = 0;
  };
  template <class A>
  struct Model final : Concept {
    explicit Model(A a) : acc(std::move(a)) {}
    const A& peer(const Concept& other) const {
      if (other.type() != typeid(A)) throw TypeError(std::string(A::kWhere) + ": statistics of another family");
      return static_cast<const Model<A>&>(other).acc;
    }
    std::unique_ptr<Concept> clone() const override { return std::make_unique<Model<A>>(acc); }
    const std::type_info& type() const override { return typeid(A); }
    Index flat_size() const override { return acc.flat_size(); }
    void pack(std::span<double> out) const override { acc.pack(out); }
    void unpack(std::span<const double> in) override { acc.unpack(in); }
    void combine(const Concept& other) override { acc.combine(peer(other)); }
    void from_value(const Concept& other) override { acc.from_value(peer(other)); }
    void scale(double c) override { acc.scale(c); }
    void set_zero() override { acc.set_zero(); }
    void merge_trusted(const Concept& other) override { acc.merge_trusted(peer(other)); }
    void initialize(const AnyBatch& batch, std::span<const double> w, Rng& rng) override {
      acc.initialize(batch_as<typename A::batch_type>(batch, A::kWhere), w, rng);
    }
    void initialize_shard(const AnyBatch& batch, std::span<const double> w, Rng& rng, Index rows_before,
                          Index rows_after) override {
      attnmix::initialize_shard(acc, batch_as<typename A::batch_type>(batch, A::kWhere), w, rng, rows_before,
                                rows_after);
    }
    std::optional<std::string> keys() const override { return acc.keys(); }
    std::span<AnyAccumulator> children() override {
      if constexpr (requires { acc.children(); })
        return acc.children();
      else
        return {};
    }
    const FlatStats* flat_stats() const override {
      if constexpr (std::is_base_of_v<FlatStats, A>)
        return &acc;
      else
        return nullptr;
    }
    bool equals(const Concept& other) const override { return other.type() == typeid(A) && acc == peer(other); }
    A acc;
  };
  std::unique_ptr<Concept> self_;
};

/// An estimator with a sharded M-step for distributed fits (inference/sharded_mstep.hpp): it sums acc over the ranks of
/// comm in its own symbols only and returns the model estimate(nullopt, Σ acc) would.
template <class E>
concept ShardedEstimator = requires(const E& e, typename E::accumulator_type& acc, const Communicator& comm) {
  { e.estimate_sharded(acc, comm) } -> std::same_as<typename E::distribution_type>;
};

// ---------------------------------------------------------------------------------------------------------------
/// An immutable estimator (M-step) of any family.
class AnyEstimator {
 public:
  /// What estimate() returns: the held family's model, type-erased.
  using distribution_type = AnyDistribution;
  /// The statistics estimate() takes: the held family's accumulator, type-erased.
  using accumulator_type = AnyAccumulator;

  AnyEstimator() = default;
  /// Wraps a family's estimator (moved into one shared, immutable instance; copies of the handle share it).
  template <class E>
    requires(!std::same_as<std::remove_cvref_t<E>, AnyEstimator>)
  explicit AnyEstimator(E estimator) : self_(std::make_shared<const Model<E>>(std::move(estimator))) {}

  /// A zeroed accumulator of the estimator's family and sizes, carrying its keys. The handle must not be empty.
  [[nodiscard]] AnyAccumulator make_accumulator() const { return self_->make_accumulator(); }
  /// The type of the family's estimator held (adapters find their wrappers by it).
  [[nodiscard]] const std::type_info& type() const { return self_->type(); }
  /// @throws ValueError on invalid statistics.
  [[nodiscard]] AnyDistribution estimate(std::optional<double> nobs, const AnyAccumulator& acc) const;
  /// Whether the family held has a sharded M-step (inference/sharded_mstep.hpp).
  [[nodiscard]] bool has_sharded_mstep() const { return self_->has_sharded_mstep(); }
  /// The family's sharded M-step. @throws ValueError when it has none (has_sharded_mstep()).
  [[nodiscard]] AnyDistribution estimate_sharded(AnyAccumulator& acc, const Communicator& comm) const;
  /// The concrete estimator, or nullptr when this handle is empty or holds another family (bindings dispatch on it).
  template <class E>
  [[nodiscard]] const E* get_if() const {
    return self_ && self_->type() == typeid(E) ? &static_cast<const Model<E>&>(*self_).estimator : nullptr;
  }

 private:
  struct Concept {
    virtual ~Concept() = default;
    [[nodiscard]] virtual const std::type_info& type() const = 0;
    [[nodiscard]] virtual AnyAccumulator make_accumulator() const = 0;
    [[nodiscard]] virtual AnyDistribution estimate(std::optional<double> nobs, const AnyAccumulator& acc) const = 0;
    [[nodiscard]] virtual bool has_sharded_mstep() const = 0;
    [[nodiscard]] virtual AnyDistribution estimate_sharded(AnyAccumulator& acc, const Communicator& comm) const = 0;
  };
  template <class E>
  struct Model final : Concept {
    explicit Model(E e) : estimator(std::move(e)) {}
    const std::type_info& type() const override { return typeid(E); }
    AnyAccumulator make_accumulator() const override { return AnyAccumulator(estimator.make_accumulator()); }
    AnyDistribution estimate(std::optional<double> nobs, const AnyAccumulator& acc) const override;
    bool has_sharded_mstep() const override { return ShardedEstimator<E>; }
    AnyDistribution estimate_sharded(AnyAccumulator& acc, const Communicator& comm) const override;
    E estimator;
  };
  std::shared_ptr<const Concept> self_;
};

// ---------------------------------------------------------------------------------------------------------------
/// An immutable distribution of any family. Every member but has_value() and get_if() requires a non-empty handle.
class AnyDistribution {
 public:
  /// The batches log_density() and accumulate() take: any family's, unwrapped to the held family's batch type.
  using batch_type = AnyBatch;
  /// The statistics accumulate() fills: the held family's accumulator, type-erased.
  using accumulator_type = AnyAccumulator;
  /// What estimator() returns: the held family's estimator, type-erased.
  using estimator_type = AnyEstimator;

  AnyDistribution() = default;
  /// Wraps a family's model (moved into one shared, immutable instance; copies of the handle share it).
  template <class D>
    requires(!std::same_as<std::remove_cvref_t<D>, AnyDistribution>)
  explicit AnyDistribution(D model) : self_(std::make_shared<const Model<D>>(std::move(model))) {}

  /// Whether this handle holds a model (false for a default-constructed one).
  [[nodiscard]] bool has_value() const noexcept { return self_ != nullptr; }
  /// The model-file family name ("responsibility_attention", "mixture", ...).
  [[nodiscard]] std::string family() const { return self_->family(); }
  /// The type of the family's distribution held (adapters find their wrappers by it).
  [[nodiscard]] const std::type_info& type() const { return self_->type(); }
  /// Writes log p(row) of every row of batch to out, which must hold batch.n_rows() doubles; −∞ for a row the model
  /// gives probability zero. @throws TypeError for a batch of another family; ValueError for a wrong output length.
  void log_density(const AnyBatch& batch, std::span<double> out) const { self_->log_density(batch, out); }
  /// The E-step (atomic).
  /// @throws ImpossibleEvidenceError for rows the model gives probability zero.
  /// @throws ValueError (or TypeError) for a batch or statistics of another family or shape.
  void accumulate(const AnyBatch& batch, std::span<const double> w, AnyAccumulator& acc,
                  std::span<double> log_p_out = {}) const {
    self_->accumulate(batch, w, acc, log_p_out);
  }
  /// A zeroed accumulator of this model's family and sizes, ready for accumulate().
  [[nodiscard]] AnyAccumulator make_accumulator() const { return self_->make_accumulator(); }
  /// An estimator (M-step) of this model's family and sizes, as the family's estimator() builds it.
  [[nodiscard]] AnyEstimator estimator() const { return self_->estimator(); }
  /// Whether the family has a predictive distribution p(target | inputs) (the attention families; not a categorical,
  /// a Gaussian or a mixture).
  [[nodiscard]] bool predicts() const { return self_->predicts(); }
  /// p(t | inputs) [n, T]. @throws ValueError when the family has no predictive distribution.
  [[nodiscard]] Matrix predict_proba(const AnyBatch& batch) const { return self_->predict_proba(batch); }
  /// The most probabilities a block of rows holds where predictions go through predict_proba in blocks (32 MiB).
  static constexpr Index kPredictBlockCells = Index{1} << 22;
  /// log p(t_n | inputs_n) of every row, for the batch's targets: the family's own target_log_proba where it has one
  /// (responsibility attention, dense and sparse: the cost of the gate per row), else the targets' column of
  /// predict_proba, computed in blocks of at most kPredictBlockCells probabilities. @throws ValueError when the family
  /// has no predictive distribution.
  [[nodiscard]] Vector target_log_proba(const AnyBatch& batch) const { return self_->target_log_proba(batch); }
  /// m observations drawn with the family's sampler from seed. @throws ValueError when the family has none.
  [[nodiscard]] AnyBatch sample(Index m, uint64_t seed) const { return self_->sample(m, seed); }

  /// The concrete model, or nullptr when this handle is empty or holds another family (bindings dispatch on it).
  template <class D>
  [[nodiscard]] const D* get_if() const {
    return self_ && self_->type() == typeid(D) ? &static_cast<const Model<D>&>(*self_).model : nullptr;
  }

 private:
  struct Concept {
    virtual ~Concept() = default;
    [[nodiscard]] virtual const std::type_info& type() const = 0;
    [[nodiscard]] virtual std::string family() const = 0;
    virtual void log_density(const AnyBatch& batch, std::span<double> out) const = 0;
    virtual void accumulate(const AnyBatch& batch, std::span<const double> w, AnyAccumulator& acc,
                            std::span<double> log_p_out) const = 0;
    [[nodiscard]] virtual AnyAccumulator make_accumulator() const = 0;
    [[nodiscard]] virtual AnyEstimator estimator() const = 0;
    [[nodiscard]] virtual bool predicts() const = 0;
    [[nodiscard]] virtual Matrix predict_proba(const AnyBatch& batch) const = 0;
    [[nodiscard]] virtual Vector target_log_proba(const AnyBatch& batch) const = 0;
    [[nodiscard]] virtual AnyBatch sample(Index m, uint64_t seed) const = 0;
  };
  template <class D>
  struct Model final : Concept {
    using B = typename D::batch_type;
    using A = typename D::accumulator_type;
    explicit Model(D d) : model(std::move(d)) {}
    const std::type_info& type() const override { return typeid(D); }
    std::string family() const override { return D::kFamily; }
    void log_density(const AnyBatch& batch, std::span<double> out) const override {
      model.log_density(batch_as<B>(batch, D::kWhere), out);
    }
    void accumulate(const AnyBatch& batch, std::span<const double> w, AnyAccumulator& acc,
                    std::span<double> log_p_out) const override {
      model.accumulate(batch_as<B>(batch, D::kWhere), w, acc.get<A>(D::kWhere), log_p_out);
    }
    AnyAccumulator make_accumulator() const override { return AnyAccumulator(model.make_accumulator()); }
    AnyEstimator estimator() const override { return AnyEstimator(model.estimator()); }
    bool predicts() const override { return requires { model.predict_proba(std::declval<const B&>()); }; }
    [[noreturn]] static void no_predictive_distribution() {
      throw ValueError(std::string(D::kWhere) + ": this family has no predictive distribution p(target | input)");
    }
    Matrix predict_proba(const AnyBatch& batch) const override {
      if constexpr (requires { model.predict_proba(batch_as<B>(batch, D::kWhere)); })
        return model.predict_proba(batch_as<B>(batch, D::kWhere));
      else
        no_predictive_distribution();
    }
    Vector target_log_proba(const AnyBatch& any_batch) const override {
      const B& batch = batch_as<B>(any_batch, D::kWhere);
      if constexpr (requires { model.target_log_proba(batch); }) {
        return model.target_log_proba(batch);
      } else if constexpr (requires { model.predict_proba(batch); batch.target(0); }) {
        Vector out(batch.n_rows());
        Index block = 1;  // one row first, which gives T
        for (Index begin = 0, count = 0; begin < batch.n_rows(); begin += count) {
          count = std::min(block, batch.n_rows() - begin);
          const Matrix proba = model.predict_proba(batch.slice(begin, count));
          block = std::max<Index>(1, kPredictBlockCells / std::max<Index>(1, proba.cols()));
          for (Index row = 0; row < count; ++row) out[begin + row] = std::log(proba(row, batch.target(begin + row)));
        }
        return out;
      } else {
        no_predictive_distribution();
      }
    }
    AnyBatch sample(Index m, uint64_t seed) const override {
      if constexpr (requires { model.sampler(seed).sample(m); })
        return AnyBatch(model.sampler(seed).sample(m));
      else
        throw ValueError(std::string(D::kWhere) + ": this family has no sampler");
    }
    D model;
  };
  std::shared_ptr<const Concept> self_;
};

template <class E>
AnyDistribution AnyEstimator::Model<E>::estimate(std::optional<double> nobs, const AnyAccumulator& acc) const {
  return AnyDistribution(estimator.estimate(nobs, acc.get<typename E::accumulator_type>(E::kWhere)));
}

inline AnyDistribution AnyEstimator::estimate(std::optional<double> nobs, const AnyAccumulator& acc) const {
  return self_->estimate(nobs, acc);
}

template <class E>
AnyDistribution AnyEstimator::Model<E>::estimate_sharded(AnyAccumulator& acc, const Communicator& comm) const {
  if constexpr (ShardedEstimator<E>)
    return AnyDistribution(estimator.estimate_sharded(acc.get<typename E::accumulator_type>(E::kWhere), comm));
  else
    throw ValueError(std::string(E::kWhere) + ": this family has no sharded M-step");
}

inline AnyDistribution AnyEstimator::estimate_sharded(AnyAccumulator& acc, const Communicator& comm) const {
  return self_->estimate_sharded(acc, comm);
}

}  // namespace attnmix

#include "attnmix/core/concepts.hpp"
static_assert(attnmix::Batch<attnmix::AnyBatch>);
static_assert(attnmix::Distribution<attnmix::AnyDistribution>);
static_assert(attnmix::Estimator<attnmix::AnyEstimator>);
