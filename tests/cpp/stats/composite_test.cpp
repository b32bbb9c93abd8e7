// SPDX-License-Identifier: Apache-2.0
// Composite (product) distribution (docs/mechanisms.md#building-blocks): batches, the summed log density, atomic
// E-step, all-or-nothing statistics validation, keyed children and initialisation order. The shared
// contract rows run in contract_test.cpp (categorical × Gaussian).
#include "attnmix/stats/composite.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnmix/attention/responsibility.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/inference/optimize.hpp"
#include "attnmix/stats/categorical.hpp"
#include "attnmix/stats/gaussian.hpp"
#include "attnmix/stats/mixture.hpp"
#include "testing/all_close.hpp"

namespace attnmix {
namespace {

std::vector<double> packed(const CompositeAccumulator& acc) {
  std::vector<double> out(static_cast<size_t>(acc.flat_size()));
  acc.pack(out);
  return out;
}

Categorical label_model() {
  return Categorical({(Vector(3) << 0.5, 0.0, 0.5).finished(), "label"});
}
DiagonalGaussian feature_model() {
  return DiagonalGaussian({Vector::Zero(2), Vector::Ones(2), "feature"});
}

ResponsibilityAttention head_model() {
  ResponsibilityAttentionParams p;
  p.key_means = Matrix::Identity(3, 2);
  p.emission = Matrix::Constant(3, 2, 0.5);
  p.position_prior = Vector::Constant(2, 0.5);
  return ResponsibilityAttention(std::move(p));
}

/// Rows: label ids {0, 2, 1, 0} (id 1 has probability 0), features [4, 2].
CompositeBatch label_feature_batch() {
  return CompositeBatch(
      {AnyBatch(CategoricalEncoder{3}.encode((IdVector(4) << 0, 2, 1, 0).finished())),
       AnyBatch(DiagonalGaussianEncoder{2}.encode(
           (Matrix(4, 2) << 0.1, 0.2, -1.0, 0.5, 2.0, 2.0, 0.0, -0.3).finished()))});
}

/// C-5: a composite batch needs at least one non-empty field, and all fields must have the same row
/// count.
TEST(CompositeTest, BatchRequiresAlignedFields) {
  EXPECT_THROW(CompositeBatch(std::vector<AnyBatch>{}), ValueError);
  EXPECT_THROW(CompositeBatch({AnyBatch()}), ValueError);
  EXPECT_THROW(CompositeBatch({AnyBatch(CategoricalEncoder{}.encode(IdVector::Zero(3))),
                               AnyBatch(DiagonalGaussianEncoder{}.encode(Matrix::Zero(2, 1)))}),
               ValueError);
  const CompositeBatch batch = label_feature_batch();
  EXPECT_EQ(batch.n_rows(), 4);
  const CompositeBatch tail = batch.slice(1, 3);
  EXPECT_EQ(tail.n_rows(), 3);
  EXPECT_EQ(tail.field(0).get<CategoricalBatch>("test").id(0), 2);
  EXPECT_THROW(Composite(std::vector<AnyDistribution>{}), ValueError);
  EXPECT_THROW(CompositeAccumulator(std::vector<AnyAccumulator>{}), ValueError);
}

/// log p(x) = Σ_f log p_f(x_f); a batch with another number of fields is a ValueError.
TEST(CompositeTest, LogDensityIsSumOverFields) {
  const Composite model({AnyDistribution(label_model()), AnyDistribution(feature_model())});
  const CompositeBatch batch = label_feature_batch();
  std::vector<double> total(4), label(4), feature(4);
  model.log_density(batch, total);
  model.components()[0].log_density(batch.field(0), label);
  model.components()[1].log_density(batch.field(1), feature);
  for (size_t n = 0; n < 4; ++n) EXPECT_EQ(total[n], label[n] + feature[n]) << "row " << n;
  EXPECT_EQ(AnyDistribution(model).family(), "composite");
  std::vector<double> out(4);
  EXPECT_THROW(model.log_density(CompositeBatch({batch.field(0)}), out), ValueError);
}

/// C-6: a row impossible in one field only is impossible for the composite; the error lists it and
/// no child's statistics change, even those of the field where the row is possible.
TEST(CompositeTest, ImpossibleRowInOneFieldLeavesEveryChildUnchanged) {
  const Composite model({AnyDistribution(label_model()), AnyDistribution(feature_model())});
  const CompositeBatch batch = label_feature_batch();
  CompositeAccumulator acc = model.make_accumulator();
  model.accumulate(batch, std::vector<double>{1.0, 1.0, 0.0, 2.0},
                   acc);  // row 2 has zero weight: accepted
  const std::vector<double> before = packed(acc);
  try {
    model.accumulate(batch, std::vector<double>(4, 1.0), acc);
    ADD_FAILURE() << "no ImpossibleEvidenceError";
  } catch (const ImpossibleEvidenceError& e) {
    EXPECT_EQ(e.rows(), std::vector<int64_t>{2});
  }
  EXPECT_EQ(packed(acc), before);
  // The impossible field last: the feature child must not have been touched either.
  const Composite swapped({AnyDistribution(feature_model()), AnyDistribution(label_model())});
  const CompositeBatch swapped_batch({batch.field(1), batch.field(0)});
  CompositeAccumulator swapped_acc = swapped.make_accumulator();
  EXPECT_THROW(swapped.accumulate(swapped_batch, std::vector<double>(4, 1.0), swapped_acc),
               ImpossibleEvidenceError);
  EXPECT_EQ(packed(swapped_acc), std::vector<double>(packed(swapped_acc).size(), 0.0));
}

/// C-7: unpack / combine / from_value validate every child before committing anything: a mass-law
/// violation in the second child (RA) leaves the first child (categorical) unchanged too.
TEST(CompositeTest, StatisticsAreValidatedInEveryChildBeforeCommitting) {
  const Composite model({AnyDistribution(label_model()), AnyDistribution(head_model())});
  const CompositeBatch batch(
      {AnyBatch(CategoricalEncoder{3}.encode((IdVector(3) << 0, 2, 0).finished())),
       AnyBatch(ResponsibilityAttentionEncoder{3, 2, 2, 2}.encode(
           (IdMatrix(3, 2) << 0, 1, 2, 0, 1, 1).finished(), Matrix::Zero(3, 2),
           (IdVector(3) << 0, 1, 1).finished()))});
  CompositeAccumulator acc = model.make_accumulator();
  model.accumulate(batch, std::vector<double>(3, 1.0), acc);
  const std::vector<double> before = packed(acc);

  CompositeAccumulator tampered = acc;
  tampered.children()[1].get<ResponsibilityAttentionAccumulator>("test").key_mass()[0] += 1.0;
  std::vector<double> buffer = packed(tampered);
  buffer[0] += 5.0;  // the categorical slice alone would be valid
  const auto expect_mass_law = [](auto&& f) {
    try {
      f();
      ADD_FAILURE() << "no ValueError";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot exceed"), std::string::npos) << e.what();
    }
  };
  expect_mass_law([&] { acc.unpack(buffer); });
  expect_mass_law([&] { acc.combine(tampered); });
  expect_mass_law([&] { acc.from_value(tampered); });
  expect_mass_law([&] { (void)model.estimator().estimate(std::nullopt, tampered); });
  EXPECT_EQ(packed(acc), before);
  // Children of another family → TypeError; another number of children → ValueError.
  const CompositeAccumulator swapped(
      {AnyAccumulator(ResponsibilityAttentionAccumulator(3, 2, 2, 2)),
       AnyAccumulator(CategoricalAccumulator(3))});
  EXPECT_THROW(acc.combine(swapped), TypeError);
  EXPECT_THROW(acc.combine(CompositeAccumulator({AnyAccumulator(CategoricalAccumulator(3))})),
               ValueError);
  EXPECT_EQ(packed(acc), before);
}

/// estimate(nobs) checks nobs against every child (docs/mechanisms.md#building-blocks): children with different masses
/// cannot pass.
TEST(CompositeTest, EstimatePassesNobsToEveryChild) {
  const CompositeEstimator estimator(
      {AnyEstimator(CategoricalEstimator(3)), AnyEstimator(DiagonalGaussianEstimator(2))});
  CompositeAccumulator acc = estimator.make_accumulator();
  acc.children()[0].get<CategoricalAccumulator>("test").counts() << 1.0, 2.0, 1.0;
  acc.children()[1].get<DiagonalGaussianAccumulator>("test").count() = 4.0;
  EXPECT_NO_THROW((void)estimator.estimate(4.0, acc));
  acc.children()[1].get<DiagonalGaussianAccumulator>("test").count() = 3.0;
  EXPECT_NO_THROW((void)estimator.estimate(std::nullopt, acc));
  EXPECT_THROW((void)estimator.estimate(4.0, acc), ValueError);
  EXPECT_THROW((void)estimator.estimate(
                   std::nullopt, CompositeAccumulator({AnyAccumulator(CategoricalAccumulator(3))})),
               ValueError);
}

/// F-5 inside a composite: two categorical fields whose estimators share a key get identical
/// parameters equal to estimate() of their summed counts.
TEST(CompositeTest, KeyedChildrenTie) {
  CategoricalEstimatorOptions options;
  options.keys = "label";
  const CategoricalEstimator child(3, options);
  const CompositeEstimator estimator({AnyEstimator(child), AnyEstimator(child)});
  const Composite model({AnyDistribution(Categorical({Vector::Constant(3, 1.0 / 3.0), "label"})),
                         AnyDistribution(Categorical({Vector::Constant(3, 1.0 / 3.0), "label"}))});
  const CompositeBatch batch(
      {AnyBatch(CategoricalEncoder{3}.encode((IdVector(4) << 0, 0, 1, 2).finished())),
       AnyBatch(CategoricalEncoder{3}.encode((IdVector(4) << 2, 2, 2, 1).finished()))});
  // Tie through the type-erased top-level handle (tie_keys on a concrete top-level accumulator does
  // not recurse).
  AnyAccumulator acc(estimator.make_accumulator());
  AnyDistribution(model).accumulate(AnyBatch(batch), std::vector<double>(4, 1.0), acc);
  tie_keys(acc);
  const Composite tied = estimator.estimate(std::nullopt, acc.get<CompositeAccumulator>("test"));
  const Vector expected = (Vector(3) << 2.0, 2.0, 4.0).finished() / 8.0;
  for (const AnyDistribution& c : tied.components())
    EXPECT_EQ(c.get_if<Categorical>()->params().p, expected);
}

/// seq_initialize: children initialise in field order from the same rng (an RA child draws
/// Dirichlet responsibilities for every row); the result equals initialising the children one after
/// the other.
TEST(CompositeTest, InitializeRunsChildrenInFieldOrder) {
  const uint64_t seed = testing::test_seed(31);
  const Composite model({AnyDistribution(head_model()), AnyDistribution(label_model())});
  const CompositeBatch batch(
      {AnyBatch(ResponsibilityAttentionEncoder{3, 2, 2, 2}.encode(
           (IdMatrix(2, 2) << 0, 1, 2, 0).finished(), Matrix::Ones(2, 2),
           (IdVector(2) << 0, 1).finished())),
       AnyBatch(CategoricalEncoder{3}.encode((IdVector(2) << 0, 2).finished()))});
  const std::vector<double> w{1.0, 0.5};
  Rng rng(seed);
  CompositeAccumulator acc = model.make_accumulator();
  acc.initialize(batch, w, rng);
  Rng oracle_rng(seed);
  AnyAccumulator head = model.components()[0].make_accumulator();
  head.initialize(batch.field(0), w, oracle_rng);
  AnyAccumulator label = model.components()[1].make_accumulator();
  label.initialize(batch.field(1), w, oracle_rng);
  EXPECT_TRUE(acc.components()[0] == head);
  EXPECT_TRUE(acc.components()[1] == label);
  EXPECT_EQ(rng.next_u64(), oracle_rng.next_u64());
  EXPECT_THROW(acc.initialize(CompositeBatch({batch.field(0)}), w, rng), ValueError);
}

/// The sampler draws every field with the requested number of rows, deterministically per seed.
TEST(CompositeTest, SamplerDrawsEveryField) {
  const uint64_t seed = testing::test_seed(32);
  const Composite model({AnyDistribution(label_model()), AnyDistribution(feature_model())});
  const CompositeBatch a = model.sampler(seed).sample(40);
  const CompositeBatch b = model.sampler(seed).sample(40);
  ASSERT_EQ(a.n_fields(), 2);
  EXPECT_EQ(a.n_rows(), 40);
  EXPECT_EQ(a.field(0).get<CategoricalBatch>("test").ids(),
            b.field(0).get<CategoricalBatch>("test").ids());
  EXPECT_EQ(a.field(1).get<DiagonalGaussianBatch>("test").values(),
            b.field(1).get<DiagonalGaussianBatch>("test").values());
  const Composite unsampled(
      {AnyDistribution(Mixture({AnyDistribution(label_model())}, Vector::Ones(1)))});
  EXPECT_THROW((void)unsampled.sampler(seed).sample(3), ValueError);
}

}  // namespace
}  // namespace attnmix
