// SPDX-License-Identifier: Apache-2.0
// RoPE (docs/mechanisms.md#streaming-language-model, acceptance row E1-1) against the RoPE test vector and a
// hand-written per-pair rotation.
//
// Oracles written here, from docs/mechanisms.md#streaming-language-model and not from src/stream/rope.cpp:
//   * the RoPE test vector (head_dim 4, x = [1, 2, 3, 4], positions 1 and 2), generated independently by
//       python3 -c "import math; x=[1,2,3,4]
//       for p in (1,2):
//         a=[p*10000**(-2*k/4) for k in (0,1)]; c=[math.cos(v) for v in a]; s=[math.sin(v) for v in a]
//         y=[x[0]*c[0]-x[2]*s[0], x[1]*c[1]-x[3]*s[1], x[2]*c[0]+x[0]*s[0], x[3]*c[1]+x[1]*s[1]]
//         print([round(v,4) for v in y])"
//     which prints [-1.9841, 1.9599, 2.4624, 4.0198] and [-3.144, 1.9196, -0.3391, 4.0392];
//   * naive_rope: each pair (x_k, x_{k+h/2}) rotated by the angle p·10000^(−2k/h), computed in double by std::pow,
//     std::cos and std::sin.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnmix/core/errors.hpp"
#include "attnmix/core/rng.hpp"
#include "attnmix/stream/rope.hpp"
#include "testing/all_close.hpp"
#include "testing/torch_values.hpp"

namespace attnmix::stream {
namespace {

using testing::ExpectAllClose;
using testing::to_vector;
using testing::normal_tensor;


/// The rotation of docs/mechanisms.md#streaming-language-model written pair by pair: x (t, H, h) at positions p (t), in
/// double.
std::vector<double> naive_rope(const std::vector<double>& x, const std::vector<int64_t>& positions, int64_t n_head,
                               int64_t h) {
  std::vector<double> out(x.size());
  const int64_t half = h / 2;
  for (size_t i = 0; i < positions.size(); ++i) {
    for (int64_t head = 0; head < n_head; ++head) {
      const size_t base = (i * static_cast<size_t>(n_head) + static_cast<size_t>(head)) * static_cast<size_t>(h);
      for (int64_t k = 0; k < half; ++k) {
        const double angle = static_cast<double>(positions[i]) *
                             std::pow(10000.0, -2.0 * static_cast<double>(k) / static_cast<double>(h));
        const double a = x[base + static_cast<size_t>(k)];
        const double b = x[base + static_cast<size_t>(k + half)];
        out[base + static_cast<size_t>(k)] = a * std::cos(angle) - b * std::sin(angle);
        out[base + static_cast<size_t>(k + half)] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
  return out;
}

torch::Tensor positions_tensor(const std::vector<int64_t>& positions) {
  return torch::tensor(positions, torch::kLong);
}

/// E1-1: head_dim 4, x = [1, 2, 3, 4] at positions 1 and 2 gives the RoPE test vector
/// (docs/mechanisms.md#streaming-language-model) to 4 decimals (tolerance 1e-4), in float32 (the default module dtype)
/// and float64.
TEST(RopeTest, MatchesSpecTestVector) {
  const std::vector<double> expected = {-1.9841, 1.9599, 2.4624, 4.0198,    // position 1
                                        -3.1440, 1.9196, -0.3391, 4.0392};  // position 2
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    SCOPED_TRACE(std::string("dtype ") + c10::toString(dtype));
    const auto x = torch::tensor({1.0, 2.0, 3.0, 4.0}, dtype).view({1, 1, 4}).expand({2, 1, 4});  // (t, H, h)
    const auto tables = rope_tables(positions_tensor({1, 2}), 4, dtype);
    const auto rotated = apply_rope(x, tables);
    EXPECT_EQ(rotated.scalar_type(), dtype);
    ASSERT_EQ(rotated.sizes(), torch::IntArrayRef({2, 1, 4}));
    ExpectAllClose(to_vector(rotated), expected, 0.0, 1e-4);
  }
}

/// E1-1: head_dim 8, random x (batch 3, 6 positions, 2 heads) in float64: apply_rope equals the per-pair rotation
/// of (x_k, x_{k+4}) by p·10000^(−2k/8) computed by hand (atol 1e-12; positions up to 4097 keep |angle| large).
TEST(RopeTest, MatchesNaivePairRotationInDouble) {
  const uint64_t seed = testing::test_seed(101);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t b = 3, h = 8, n_head = 2;
  const std::vector<int64_t> positions = {0, 1, 2, 13, 250, 4097};
  const auto t = static_cast<int64_t>(positions.size());
  const auto x = normal_tensor(rng, {b, t, n_head, h});
  const auto rotated = apply_rope(x, rope_tables(positions_tensor(positions), h, torch::kFloat64));
  ASSERT_EQ(rotated.sizes(), x.sizes());
  for (int64_t s = 0; s < b; ++s) {
    SCOPED_TRACE("stream " + std::to_string(s));
    ExpectAllClose(to_vector(rotated[s]), naive_rope(to_vector(x[s]), positions, n_head, h), 0.0, 1e-12);
  }
}

/// E1-1: the same rotation in float32 (angles computed in float32, as docs/mechanisms.md#streaming-language-model
/// prescribes the module dtype) at positions below 64, where the float32 angle error p·2⁻²⁴ stays under 4e-6: atol 2e-5
/// on |x| ≲ 4.
TEST(RopeTest, MatchesNaivePairRotationInFloat) {
  const uint64_t seed = testing::test_seed(102);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t h = 8, n_head = 3;
  const std::vector<int64_t> positions = {0, 3, 7, 31, 63};
  const auto t = static_cast<int64_t>(positions.size());
  const auto x = normal_tensor(rng, {t, n_head, h});
  const auto rotated = apply_rope(x.to(torch::kFloat32), rope_tables(positions_tensor(positions), h, torch::kFloat32));
  EXPECT_EQ(rotated.scalar_type(), torch::kFloat32);
  ExpectAllClose(to_vector(rotated), naive_rope(to_vector(x), positions, n_head, h), 0.0, 2e-5);
}

/// docs/mechanisms.md#streaming-language-model: the tables hold cos/sin of [p·inv_freq, p·inv_freq] with inv_freq_k =
/// 10000^(−2k/h) (float64, 1e-12).
TEST(RopeTest, TablesRepeatTheHalfLengthAngles) {
  const int64_t h = 6;
  const std::vector<int64_t> positions = {0, 1, 5, 100};
  const auto tables = rope_tables(positions_tensor(positions), h, torch::kFloat64);
  ASSERT_EQ(tables.cos.sizes(), torch::IntArrayRef({4, h}));
  ASSERT_EQ(tables.sin.sizes(), torch::IntArrayRef({4, h}));
  std::vector<double> cos_expected, sin_expected;
  for (const int64_t p : positions) {
    for (int64_t j = 0; j < h; ++j) {
      const int64_t k = j % (h / 2);
      const double angle = static_cast<double>(p) * std::pow(10000.0, -2.0 * static_cast<double>(k) / 6.0);
      cos_expected.push_back(std::cos(angle));
      sin_expected.push_back(std::sin(angle));
    }
  }
  ExpectAllClose(to_vector(tables.cos), cos_expected, 0.0, 1e-12);
  ExpectAllClose(to_vector(tables.sin), sin_expected, 0.0, 1e-12);
}

/// docs/mechanisms.md#streaming-language-model: rotate_half(x) = [−x₂, x₁] over the last axis (exact), on a vector and
/// row-wise on a matrix; applied twice it negates.
TEST(RopeTest, RotateHalfIsMinusSecondHalfThenFirstHalf) {
  const auto x = torch::tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, torch::kFloat64);
  EXPECT_EQ(to_vector(rotate_half(x)), (std::vector<double>{-4.0, -5.0, -6.0, 1.0, 2.0, 3.0}));
  const auto m = torch::arange(8, torch::kFloat64).view({2, 4});  // rows [0 1 2 3], [4 5 6 7]
  EXPECT_EQ(to_vector(rotate_half(m)), (std::vector<double>{-2.0, -3.0, 0.0, 1.0, -6.0, -7.0, 4.0, 5.0}));
  EXPECT_TRUE(torch::equal(rotate_half(rotate_half(m)), -m));
}

/// docs/mechanisms.md#streaming-language-model consequences: position 0 is the identity, the rotation preserves each
/// head's norm, and ⟨RoPE(q, p₁), RoPE(k, p₂)⟩ depends only on p₁ − p₂ (float64, 1e-12) — what lets a cache of raw keys
/// be rotated at absolute positions.
TEST(RopeTest, DotProductsDependOnlyOnRelativePosition) {
  const uint64_t seed = testing::test_seed(103);
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t h = 8;
  const auto q = normal_tensor(rng, {1, 1, h});
  const auto k = normal_tensor(rng, {1, 1, h});
  const auto at = [&](const torch::Tensor& x, int64_t p) {
    return apply_rope(x, rope_tables(positions_tensor({p}), h, torch::kFloat64));
  };
  EXPECT_TRUE(torch::allclose(at(q, 0), q, 0.0, 1e-15));
  EXPECT_NEAR(at(q, 37).norm().item<double>(), q.norm().item<double>(), 1e-12);
  const double reference = (at(q, 9) * at(k, 4)).sum().item<double>();  // offset 5
  for (const int64_t p : {5, 6, 20, 1000}) {
    EXPECT_NEAR((at(q, p) * at(k, p - 5)).sum().item<double>(), reference, 1e-12) << "p = " << p;
  }
  // A different offset gives a different product (the check above is not vacuous).
  EXPECT_GT(std::fabs((at(q, 9) * at(k, 3)).sum().item<double>() - reference), 1e-3);
}

/// docs/mechanisms.md#streaming-language-model: head_dim must be a positive even integer and positions a 1-D int64
/// tensor (ValueError).
TEST(RopeTest, InvalidArgumentsThrow) {
  const auto positions = positions_tensor({0, 1, 2});
  for (const int64_t h : {0, -2, 1, 3, 7}) {
    EXPECT_THROW(rope_tables(positions, h, torch::kFloat32), ValueError) << "head_dim " << h;
  }
  EXPECT_THROW(rope_tables(positions.to(torch::kFloat32), 4, torch::kFloat32), ValueError);
  EXPECT_THROW(rope_tables(positions.view({1, 3}), 4, torch::kFloat32), ValueError);
  EXPECT_NO_THROW(rope_tables(positions, 2, torch::kFloat32));
}

}  // namespace
}  // namespace attnmix::stream
