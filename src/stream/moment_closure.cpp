// SPDX-License-Identifier: Apache-2.0
// Moment-closure attention (docs/mechanisms.md#moment-closure-far-field); see
// include/attnmix/stream/moment_closure.hpp.
//
// Structure: the tensor path (MGF logits and outputs, responsibilities, the Chan/Welford update, the joint softmax)
// runs on differentiable torch tensors over the whole batch. The discrete bookkeeping (birth and merge decisions,
// misfit receipts, conservation checks) runs per stream in plain C++ on a detached double "mirror" of the bank,
// read in place from CPU tensors. A birth or merge rebuilds the bank from the mirrors when the bank carries no
// gradient history (after detach), and with tensor operations (the differentiable pooled combine) when it does.
// Cost per layer and step: O(B·t·H·n·d²) for the MGF outputs, the update and the misfit receipt, plus a few
// hundred small tensor operations whose dispatch dominates at the default sizes (docs/PERFORMANCE.md).
#include "attnmix/stream/moment_closure.hpp"

#include "attnmix/core/errors.hpp"
#include "attnmix/stream/self_attention.hpp"
#include "../attention/lanes_impl.hpp"
#include "dense_products_impl.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace attnmix::stream {
namespace {

constexpr double kCountFloor = 1e-8;
constexpr double kVarianceFloor = 1e-6;
constexpr double kConservationAtol = 1e-4;
constexpr double kConservationRtol = 1e-5;
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string str(int64_t v) { return std::to_string(v); }

// allclose(atol 1e-4, rtol 1e-5) plus the rounding of the counts themselves: a total T stored in a dtype with machine
// epsilon ε is only known to ~ε·T, so in float32 the growth of a bank that already holds 2·10⁴ tokens cannot be
// checked to 1e-4 (decision docs/decisions/0006-conservation-tolerance.md). `magnitude` is the size of the totals.
bool close(double actual, double expected, double magnitude = 0.0, double epsilon = 0.0) {
  return std::abs(actual - expected) <=
         kConservationAtol + kConservationRtol * std::abs(expected) + 8.0 * epsilon * std::abs(magnitude);
}

double epsilon_of(const torch::Tensor& t) {
  return t.scalar_type() == torch::kDouble ? std::numeric_limits<double>::epsilon()
                                           : static_cast<double>(std::numeric_limits<float>::epsilon());
}

// ---- the tensor path ------------------------------------------------------------------------------------------

// live (B, n): slot c is live in stream b iff c < n_clusters[b].
torch::Tensor live_slots(const ClusterBank& bank, int64_t n) {
  const auto counts = torch::tensor(bank.n_clusters, torch::kLong).to(bank.count.device());
  return torch::arange(n, counts.options()).unsqueeze(0) < counts.unsqueeze(1);
}

int64_t max_live(const ClusterBank& bank) {
  return bank.n_clusters.empty() ? 0 : *std::max_element(bank.n_clusters.begin(), bank.n_clusters.end());
}

// True when every stream has exactly n live clusters: then no slot of the first n needs masking.
bool all_live(const ClusterBank& bank, int64_t n) {
  return std::all_of(bank.n_clusters.begin(), bank.n_clusters.end(), [n](int64_t c) { return c == n; });
}

// logit_c(q) for the first n slots: (B, t, H, n), unmasked. The products run per (stream, head) on Eigen.
torch::Tensor mgf_logits(const torch::Tensor& q, const ClusterBank& bank, int64_t n) {
  const double d = static_cast<double>(q.size(-1));
  const auto qp = q.permute({0, 2, 1, 3});  // (B, H, t, d)
  const auto mu_k = bank.mu_k.narrow(2, 0, n);
  const auto sigma_kk = bank.sigma_kk.narrow(2, 0, n);
  const auto log_count = bank.count.narrow(2, 0, n).clamp_min(kCountFloor).log().unsqueeze(2);  // (B,H,1,n)
  const auto logits = detail::fast_bmm(qp, mu_k, /*transpose_b=*/true) / std::sqrt(d) +
                      detail::fast_bmm(qp * qp, sigma_kk, /*transpose_b=*/true) * (0.5 / d) + log_count;
  return logits.permute({0, 2, 1, 3});  // (B, t, H, n)
}

// out_c(q) = μ_v + Σ_vk q/√d for the first n slots: (B, t, H, n, d), unmasked.
torch::Tensor mgf_outputs(const torch::Tensor& q, const ClusterBank& bank, int64_t n) {
  const int64_t B = q.size(0), t = q.size(1), H = q.size(2), d = q.size(3);
  const auto qp = q.permute({0, 2, 1, 3});                                       // (B, H, t, d)
  const auto sigma_vk = bank.sigma_vk.narrow(2, 0, n).reshape({B, H, n * d, d});  // rows (c, i), cols j
  const auto linear = detail::fast_bmm(sigma_vk, qp, /*transpose_b=*/true)         // (B, H, n·d, t)
                          .view({B, H, n, d, t})
                          .permute({0, 4, 1, 2, 3});                              // (B, t, H, n, d)
  return linear / std::sqrt(static_cast<double>(d)) + bank.mu_v.narrow(2, 0, n).unsqueeze(1);
}

// x must have the bank's dtype and device (the products below do not convert).
void check_like_bank(const torch::Tensor& x, const ClusterBank& bank, const char* where, const char* name) {
  if (x.scalar_type() != bank.count.scalar_type() || x.device() != bank.count.device()) {
    throw ValueError(std::string(where) + ": " + name + " must have the bank's dtype " +
                     std::string(c10::toString(bank.count.scalar_type())) + " and device " +
                     bank.count.device().str() + " (got " + std::string(c10::toString(x.scalar_type())) + " on " +
                     x.device().str() + ")");
  }
}

void check_against_bank(const torch::Tensor& x, const ClusterBank& bank, const char* where, const char* name) {
  if (!x.defined() || x.dim() != 4 || x.size(0) != bank.batch_size() || x.size(2) != bank.mu_k.size(1) ||
      x.size(3) != bank.mu_k.size(3)) {
    throw ValueError(std::string(where) + ": " + name + " must be (batch " + str(bank.batch_size()) +
                     ", time, heads " + str(bank.mu_k.size(1)) + ", head_dim " + str(bank.mu_k.size(3)) + ")");
  }
  check_like_bank(x, bank, where, name);
}

// ---- the detached mirror of one stream's bank -----------------------------------------------------------------

// One stream's statistics in double, [H][C][d] (sigma_vk [H][C][d][d]), with the live prefix n.
struct Mirror {
  int64_t H = 0, C = 0, d = 0, n = 0;
  std::vector<double> count, mu_k, mu_v, sigma_kk, sigma_vk;

  double& cnt(int64_t h, int64_t c) { return count[static_cast<size_t>(h * C + c)]; }
  double* vec(std::vector<double>& f, int64_t h, int64_t c) { return f.data() + (h * C + c) * d; }
  double* mat(int64_t h, int64_t c) { return sigma_vk.data() + (h * C + c) * d * d; }

  double head_total(int64_t h) {
    double s = 0.0;
    for (int64_t c = 0; c < n; ++c) s += cnt(h, c);
    return s;
  }
};

// Copies x[i₀, …] with the given sizes and strides (in elements) into out, in row-major order.
template <class T>
double* copy_strided(const T* x, c10::IntArrayRef sizes, c10::IntArrayRef strides, size_t dim, double* out) {
  if (dim + 1 == sizes.size()) {
    for (int64_t i = 0; i < sizes[dim]; ++i) *out++ = static_cast<double>(x[i * strides[dim]]);
    return out;
  }
  for (int64_t i = 0; i < sizes[dim]; ++i) out = copy_strided(x + i * strides[dim], sizes, strides, dim + 1, out);
  return out;
}

// The values of t in double, row-major. A CPU float or double tensor (the training path) is read in place, with no
// tensor operation; anything else goes through one conversion.
std::vector<double> to_doubles(const torch::Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.numel() == 0) {
    return out;
  }
  if (t.device().is_cpu() && t.dim() > 0 && (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kDouble)) {
    if (t.scalar_type() == torch::kFloat) {
      copy_strided(t.data_ptr<float>(), t.sizes(), t.strides(), 0, out.data());
    } else {
      copy_strided(t.data_ptr<double>(), t.sizes(), t.strides(), 0, out.data());
    }
    return out;
  }
  const auto c = t.detach().to(torch::kCPU, torch::kDouble).contiguous();
  std::copy_n(c.data_ptr<double>(), out.size(), out.begin());
  return out;
}

// A tensor of the given shape and options holding x (row-major): written in place on the CPU, otherwise built in
// double and converted.
torch::Tensor from_doubles(const std::vector<double>& x, c10::IntArrayRef shape, const torch::TensorOptions& options) {
  if (options.device().is_cpu() && (options.dtype() == torch::kFloat || options.dtype() == torch::kDouble)) {
    auto out = torch::empty(shape, options);
    if (options.dtype() == torch::kFloat) {
      std::transform(x.begin(), x.end(), out.data_ptr<float>(), [](double v) { return static_cast<float>(v); });
    } else {
      std::copy(x.begin(), x.end(), out.data_ptr<double>());
    }
    return out;
  }
  return torch::tensor(x, torch::TensorOptions().dtype(torch::kDouble)).view(shape).to(options);
}

// Per (stream, head) totals of a (B, H, C) count tensor, summed in double: [b·H + h]. Inactive slots hold zeros.
std::vector<double> head_totals(const torch::Tensor& count) {
  const auto values = to_doubles(count);
  const int64_t C = count.size(2);
  std::vector<double> totals(values.size() / static_cast<size_t>(C), 0.0);
  for (size_t i = 0; i < totals.size(); ++i) {
    for (int64_t c = 0; c < C; ++c) totals[i] += values[i * static_cast<size_t>(C) + static_cast<size_t>(c)];
  }
  return totals;
}

std::vector<Mirror> mirrors_of(const ClusterBank& bank) {
  const int64_t B = bank.batch_size(), H = bank.mu_k.size(1), C = bank.max_clusters, d = bank.mu_k.size(3);
  const auto count = to_doubles(bank.count), mu_k = to_doubles(bank.mu_k), mu_v = to_doubles(bank.mu_v),
             sigma_kk = to_doubles(bank.sigma_kk), sigma_vk = to_doubles(bank.sigma_vk);
  std::vector<Mirror> out(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    auto& m = out[static_cast<size_t>(b)];
    m.H = H, m.C = C, m.d = d, m.n = bank.n_clusters[static_cast<size_t>(b)];
    const auto slice = [&](const std::vector<double>& all, int64_t per_stream) {
      return std::vector<double>(all.begin() + b * per_stream, all.begin() + (b + 1) * per_stream);
    };
    m.count = slice(count, H * C);
    m.mu_k = slice(mu_k, H * C * d);
    m.mu_v = slice(mu_v, H * C * d);
    m.sigma_kk = slice(sigma_kk, H * C * d);
    m.sigma_vk = slice(sigma_vk, H * C * d * d);
  }
  return out;
}

// logit_c(q) of head h against the mirror (docs/mechanisms.md#moment-closure-far-field).
double mirror_logit(Mirror& m, int64_t h, int64_t c, const double* q) {
  const double* mk = m.vec(m.mu_k, h, c);
  const double* sk = m.vec(m.sigma_kk, h, c);
  double lin = 0.0, quad = 0.0;
  for (int64_t j = 0; j < m.d; ++j) {
    lin += q[j] * mk[j];
    quad += q[j] * q[j] * sk[j];
  }
  const double dd = static_cast<double>(m.d);
  return lin / std::sqrt(dd) + quad * (0.5 / dd) + std::log(std::max(m.cnt(h, c), kCountFloor));
}

// Pooled (Chan) combination of slot j into slot i, in the mirror.
void mirror_combine(Mirror& m, int64_t i, int64_t j) {
  const int64_t d = m.d;
  for (int64_t h = 0; h < m.H; ++h) {
    const double na = m.cnt(h, i), nb = m.cnt(h, j);
    const double nn = std::max(na + nb, kCountFloor);
    const double frac = nb / nn, cross = na * nb / nn;
    double *mka = m.vec(m.mu_k, h, i), *mkb = m.vec(m.mu_k, h, j);
    double *mva = m.vec(m.mu_v, h, i), *mvb = m.vec(m.mu_v, h, j);
    double *ska = m.vec(m.sigma_kk, h, i), *skb = m.vec(m.sigma_kk, h, j);
    double *sva = m.mat(h, i), *svb = m.mat(h, j);
    std::vector<double> dk(static_cast<size_t>(d)), dv(static_cast<size_t>(d));
    for (int64_t a = 0; a < d; ++a) {
      dk[a] = mkb[a] - mka[a];
      dv[a] = mvb[a] - mva[a];
    }
    for (int64_t a = 0; a < d; ++a) {
      for (int64_t c = 0; c < d; ++c) {
        sva[a * d + c] = (sva[a * d + c] * na + svb[a * d + c] * nb + dv[a] * dk[c] * cross) / nn;
      }
      ska[a] = (ska[a] * na + skb[a] * nb + dk[a] * dk[a] * cross) / nn;
      mka[a] += dk[a] * frac;
      mva[a] += dv[a] * frac;
    }
    m.cnt(h, i) = na + nb;
  }
}

void mirror_copy_slot(Mirror& m, int64_t from, int64_t to) {
  for (int64_t h = 0; h < m.H; ++h) {
    m.cnt(h, to) = m.cnt(h, from);
    std::copy_n(m.vec(m.mu_k, h, from), m.d, m.vec(m.mu_k, h, to));
    std::copy_n(m.vec(m.mu_v, h, from), m.d, m.vec(m.mu_v, h, to));
    std::copy_n(m.vec(m.sigma_kk, h, from), m.d, m.vec(m.sigma_kk, h, to));
    std::copy_n(m.mat(h, from), m.d * m.d, m.mat(h, to));
  }
}

void mirror_zero_slot(Mirror& m, int64_t c) {
  for (int64_t h = 0; h < m.H; ++h) {
    m.cnt(h, c) = 0.0;
    std::fill_n(m.vec(m.mu_k, h, c), m.d, 0.0);
    std::fill_n(m.vec(m.mu_v, h, c), m.d, 0.0);
    std::fill_n(m.vec(m.sigma_kk, h, c), m.d, 0.0);
    std::fill_n(m.mat(h, c), m.d * m.d, 0.0);
  }
}

// RMS over heads and dims of Δμ_k² / max(½(σ²_i + σ²_j), 1e-6), square-rooted
// (docs/mechanisms.md#moment-closure-far-field).
double mirror_distance(Mirror& m, int64_t i, int64_t j) {
  double sum = 0.0;
  for (int64_t h = 0; h < m.H; ++h) {
    const double *a = m.vec(m.mu_k, h, i), *b = m.vec(m.mu_k, h, j);
    const double *sa = m.vec(m.sigma_kk, h, i), *sb = m.vec(m.sigma_kk, h, j);
    for (int64_t x = 0; x < m.d; ++x) {
      const double delta = a[x] - b[x];
      sum += delta * delta / std::max(0.5 * (sa[x] + sb[x]), kVarianceFloor);
    }
  }
  const double distance = std::sqrt(sum / static_cast<double>(m.H * m.d));
  if (!std::isfinite(distance)) {
    throw StateError("birth_and_merge: the distance between clusters " + str(i) + " and " + str(j) +
                     " is not finite");
  }
  return distance;
}

// ---- slot tensors of one stream (only built when a stream births or merges) -----------------------------------

struct Slot {
  torch::Tensor count, mu_k, mu_v, sigma_kk, sigma_vk;  // (H), (H,d), (H,d), (H,d), (H,d,d)
};

Slot slot_of(const ClusterBank& bank, int64_t b, int64_t c) {
  return {bank.count.select(0, b).select(1, c), bank.mu_k.select(0, b).select(1, c),
          bank.mu_v.select(0, b).select(1, c), bank.sigma_kk.select(0, b).select(1, c),
          bank.sigma_vk.select(0, b).select(1, c)};
}

Slot pooled_combine(const Slot& a, const Slot& b) {
  const auto n = a.count + b.count;
  const auto nn = n.clamp_min(kCountFloor);
  const auto frac = (b.count / nn).unsqueeze(-1);
  const auto cross = (a.count * b.count / nn).unsqueeze(-1);
  const auto dk = b.mu_k - a.mu_k;
  const auto dv = b.mu_v - a.mu_v;
  const auto na = a.count.unsqueeze(-1), nb = b.count.unsqueeze(-1);
  Slot out;
  out.count = n;
  out.mu_k = a.mu_k + dk * frac;
  out.mu_v = a.mu_v + dv * frac;
  out.sigma_kk = (a.sigma_kk * na + b.sigma_kk * nb + dk * dk * cross) / nn.unsqueeze(-1);
  out.sigma_vk = (a.sigma_vk * na.unsqueeze(-1) + b.sigma_vk * nb.unsqueeze(-1) +
                  dv.unsqueeze(-1) * dk.unsqueeze(-2) * cross.unsqueeze(-1)) /
                 nn.unsqueeze(-1).unsqueeze(-1);
  return out;
}

Slot zero_slot(const ClusterBank& bank) {
  const auto H = bank.mu_k.size(1), d = bank.mu_k.size(3);
  const auto o = bank.mu_k.options();
  return {torch::zeros({H}, o), torch::zeros({H, d}, o), torch::zeros({H, d}, o), torch::zeros({H, d}, o),
          torch::zeros({H, d, d}, o)};
}

// Slot c of the mirror as tensors with the bank's options.
Slot mirror_slot(Mirror& m, int64_t c, const torch::TensorOptions& options) {
  const int64_t H = m.H, d = m.d;
  std::vector<double> count(static_cast<size_t>(H)), mu_k, mu_v, sigma_kk, sigma_vk;
  for (int64_t h = 0; h < H; ++h) {
    count[static_cast<size_t>(h)] = m.cnt(h, c);
    mu_k.insert(mu_k.end(), m.vec(m.mu_k, h, c), m.vec(m.mu_k, h, c) + d);
    mu_v.insert(mu_v.end(), m.vec(m.mu_v, h, c), m.vec(m.mu_v, h, c) + d);
    sigma_kk.insert(sigma_kk.end(), m.vec(m.sigma_kk, h, c), m.vec(m.sigma_kk, h, c) + d);
    sigma_vk.insert(sigma_vk.end(), m.mat(h, c), m.mat(h, c) + d * d);
  }
  return {from_doubles(count, {H}, options), from_doubles(mu_k, {H, d}, options), from_doubles(mu_v, {H, d}, options),
          from_doubles(sigma_kk, {H, d}, options), from_doubles(sigma_vk, {H, d, d}, options)};
}

// Rows of Σ_vk a birth accumulates per pass over the tokens (8 rows of 256 doubles and the token's row stay in L1).
constexpr int64_t kRowBlock = 8;

// Birth (docs/mechanisms.md#moment-closure-far-field) into slot c of the mirror from the stream's t tokens kb, vb
// ([t][H][d], double): count t, the means, the floored key variances and the value-key cross-covariance, all population
// moments.
void mirror_birth(Mirror& m, int64_t c, const double* kb, const double* vb, int64_t t) {
  const int64_t H = m.H, d = m.d;
  const double tt = static_cast<double>(t);
  std::vector<double> dk(static_cast<size_t>(t * d)), dv(static_cast<size_t>(t * d));
  for (int64_t h = 0; h < H; ++h) {
    double *mk = m.vec(m.mu_k, h, c), *mv = m.vec(m.mu_v, h, c), *sk = m.vec(m.sigma_kk, h, c), *sv = m.mat(h, c);
    std::fill_n(mk, d, 0.0);
    std::fill_n(mv, d, 0.0);
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t a = 0; a < d; ++a) {
        mk[a] += kb[(i * H + h) * d + a];
        mv[a] += vb[(i * H + h) * d + a];
      }
    }
    for (int64_t a = 0; a < d; ++a) mk[a] /= tt, mv[a] /= tt;
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t a = 0; a < d; ++a) {
        dk[i * d + a] = kb[(i * H + h) * d + a] - mk[a];
        dv[i * d + a] = vb[(i * H + h) * d + a] - mv[a];
      }
    }
    // Each variance and covariance sums its t products in token order; the loops run across a row (vectorised),
    // kRowBlock rows of Σ_vk per pass over the tokens.
    std::fill_n(sk, d, 0.0);
    std::fill_n(sv, d * d, 0.0);
    for (int64_t i = 0; i < t; ++i) {
      for (int64_t a = 0; a < d; ++a) sk[a] += dk[i * d + a] * dk[i * d + a];
    }
    for (int64_t a = 0; a < d; ++a) sk[a] = std::max(sk[a] / tt, kVarianceFloor);
    for (int64_t a0 = 0; a0 < d; a0 += kRowBlock) {
      const int64_t rows = std::min(kRowBlock, d - a0);
      for (int64_t i = 0; i < t; ++i) {
        const double* dk_i = dk.data() + i * d;
        for (int64_t a = a0; a < a0 + rows; ++a) {
          const double dv_ia = dv[i * d + a];
          double* row = sv + a * d;
          for (int64_t b = 0; b < d; ++b) row[b] += dv_ia * dk_i[b];
        }
      }
    }
    for (int64_t e = 0; e < d * d; ++e) sv[e] /= tt;
    m.cnt(h, c) = tt;
  }
}

// The whole bank as tensors from the mirrors (no gradient history): one conversion per field.
ClusterBank bank_from_mirrors(const std::vector<Mirror>& mirrors, const ClusterBank& like,
                              std::vector<int64_t> n_clusters) {
  std::vector<double> count, mu_k, mu_v, sigma_kk, sigma_vk;
  for (const auto& m : mirrors) {
    count.insert(count.end(), m.count.begin(), m.count.end());
    mu_k.insert(mu_k.end(), m.mu_k.begin(), m.mu_k.end());
    mu_v.insert(mu_v.end(), m.mu_v.begin(), m.mu_v.end());
    sigma_kk.insert(sigma_kk.end(), m.sigma_kk.begin(), m.sigma_kk.end());
    sigma_vk.insert(sigma_vk.end(), m.sigma_vk.begin(), m.sigma_vk.end());
  }
  const auto tensor = [](const std::vector<double>& x, const torch::Tensor& like_field) {
    return from_doubles(x, like_field.sizes(), like_field.options());
  };
  ClusterBank out;
  out.count = tensor(count, like.count);
  out.mu_k = tensor(mu_k, like.mu_k);
  out.mu_v = tensor(mu_v, like.mu_v);
  out.sigma_kk = tensor(sigma_kk, like.sigma_kk);
  out.sigma_vk = tensor(sigma_vk, like.sigma_vk);
  out.n_clusters = std::move(n_clusters);
  out.max_clusters = like.max_clusters;
  return out;
}

// Stacks per-stream slot lists back into a bank; streams without events keep their tensors.
ClusterBank rebuild(const ClusterBank& bank, const std::vector<std::optional<std::vector<Slot>>>& streams,
                    std::vector<int64_t> n_clusters) {
  const int64_t B = bank.batch_size();
  std::vector<torch::Tensor> count, mu_k, mu_v, sigma_kk, sigma_vk;
  for (int64_t b = 0; b < B; ++b) {
    const auto& slots = streams[static_cast<size_t>(b)];
    if (!slots) {
      count.push_back(bank.count.select(0, b));
      mu_k.push_back(bank.mu_k.select(0, b));
      mu_v.push_back(bank.mu_v.select(0, b));
      sigma_kk.push_back(bank.sigma_kk.select(0, b));
      sigma_vk.push_back(bank.sigma_vk.select(0, b));
      continue;
    }
    std::vector<torch::Tensor> c, mk, mv, sk, sv;
    for (const auto& s : *slots) {
      c.push_back(s.count), mk.push_back(s.mu_k), mv.push_back(s.mu_v), sk.push_back(s.sigma_kk),
          sv.push_back(s.sigma_vk);
    }
    count.push_back(torch::stack(c, 1));
    mu_k.push_back(torch::stack(mk, 1));
    mu_v.push_back(torch::stack(mv, 1));
    sigma_kk.push_back(torch::stack(sk, 1));
    sigma_vk.push_back(torch::stack(sv, 1));
  }
  ClusterBank out;
  out.count = torch::stack(count, 0);
  out.mu_k = torch::stack(mu_k, 0);
  out.mu_v = torch::stack(mu_v, 0);
  out.sigma_kk = torch::stack(sigma_kk, 0);
  out.sigma_vk = torch::stack(sigma_vk, 0);
  out.n_clusters = std::move(n_clusters);
  out.max_clusters = bank.max_clusters;
  return out;
}

// ---- the misfit receipt (docs/mechanisms.md#moment-closure-far-field), on the mirror after birth and merge ----

// Outlier tokens whose k and v are still to be gathered: rows `rows` of the (B·t) flattened chunk.
struct PendingOutliers {
  OutlierTokens* target;
  std::vector<int64_t> rows;
};

// Fills every pending outlier's k and v with one gather per tensor; each receipt gets a view of its rows.
void gather_outliers(const torch::Tensor& k, const torch::Tensor& v, std::vector<PendingOutliers>& pending) {
  std::vector<int64_t> rows;
  if (pending.empty()) {
    return;
  }
  for (const auto& p : pending) rows.insert(rows.end(), p.rows.begin(), p.rows.end());
  const auto index = torch::tensor(rows, torch::kLong).to(k.device());
  const auto k_rows = k.flatten(0, 1).index_select(0, index);
  const auto v_rows = v.flatten(0, 1).index_select(0, index);
  int64_t offset = 0;
  for (auto& p : pending) {
    const auto n = static_cast<int64_t>(p.rows.size());
    p.target->k = k_rows.narrow(0, offset, n);
    p.target->v = v_rows.narrow(0, offset, n);
    offset += n;
  }
}

// resid[i·n + c] += ‖v_i − (μ_v + Σ_vk w_i)‖ / H for the t tokens of head h against cluster c, with
// w_i = (k_i − μ_k) / max(σ², floor) (k, v: [t][H][d]). Every prediction entry μ_v[a] + Σ_b Σ_vk[a][b] w_i[b] adds
// its d terms in order b = 0 … d − 1. The product runs over Σ_vkᵀ padded to whole 8-lane columns: 8 tokens × 8
// entries of a accumulate in registers while b runs, one lane vector of Σ_vkᵀ per b. O(t·d²).
void add_head_residuals(Mirror& m, int64_t h, int64_t c, const double* k, const double* v, int64_t t, double* resid) {
  using lanes::Lanes;
  constexpr int64_t kTokens = 8;
  const int64_t H = m.H, d = m.d, n = m.n;
  const int64_t width = (d + lanes::kLanes - 1) / lanes::kLanes * lanes::kLanes;
  const double* mk = m.vec(m.mu_k, h, c);
  const double* sk = m.vec(m.sigma_kk, h, c);
  const double* sv = m.mat(h, c);
  std::vector<double> sv_t(static_cast<size_t>(d * width), 0.0), mv(static_cast<size_t>(width), 0.0);
  for (int64_t a = 0; a < d; ++a) {
    for (int64_t b = 0; b < d; ++b) sv_t[b * width + a] = sv[a * d + b];
  }
  std::copy_n(m.vec(m.mu_v, h, c), d, mv.begin());
  std::vector<double> whitened(static_cast<size_t>(kTokens * d)), pred(static_cast<size_t>(kTokens * width));
  for (int64_t i0 = 0; i0 < t; i0 += kTokens) {
    const int64_t tokens = std::min(kTokens, t - i0);
    std::fill(whitened.begin(), whitened.end(), 0.0);
    for (int64_t j = 0; j < tokens; ++j) {
      const double* kq = k + ((i0 + j) * H + h) * d;
      for (int64_t b = 0; b < d; ++b) whitened[j * d + b] = (kq[b] - mk[b]) / std::max(sk[b], kVarianceFloor);
    }
    for (int64_t a0 = 0; a0 < width; a0 += lanes::kLanes) {
      Lanes acc[kTokens];
      for (auto& x : acc) x = lanes::load(mv.data() + a0);
      for (int64_t b = 0; b < d; ++b) {
        const Lanes column = lanes::load(sv_t.data() + b * width + a0);
        for (int64_t j = 0; j < kTokens; ++j) acc[j] += column * whitened[j * d + b];
      }
      for (int64_t j = 0; j < kTokens; ++j) lanes::store(pred.data() + j * width + a0, acc[j]);
    }
    for (int64_t j = 0; j < tokens; ++j) {
      const double* vq = v + ((i0 + j) * H + h) * d;
      const double* p = pred.data() + j * width;
      double norm2 = 0.0;
      for (int64_t a = 0; a < d; ++a) norm2 += (vq[a] - p[a]) * (vq[a] - p[a]);
      resid[(i0 + j) * n + c] += std::sqrt(norm2) / static_cast<double>(H);
    }
  }
}

// The receipt's misfit, misfit_scalar and outliers (their k and v are queued on `pending`, rows offset by `row0`).
void misfit_receipt(Mirror& m, const double* k, const double* v, int64_t t, int64_t outlier_top_k, int64_t row0,
                    StreamReceipt& receipt, std::vector<PendingOutliers>& pending) {
  const int64_t n = m.n, H = m.H, d = m.d;
  receipt.misfit.clear();
  receipt.per_cluster_outlier_tokens.clear();
  receipt.misfit_scalar = 0.0;
  if (n == 0) {
    return;
  }
  // Hard membership: argmax_c of the head-mean responsibility; residual per (token, cluster) averaged over heads.
  std::vector<int64_t> member(static_cast<size_t>(t));
  std::vector<double> logits(static_cast<size_t>(n)), mean_r(static_cast<size_t>(n));
  for (int64_t i = 0; i < t; ++i) {
    std::fill(mean_r.begin(), mean_r.end(), 0.0);
    for (int64_t h = 0; h < H; ++h) {
      const double* kq = k + (i * H + h) * d;
      double top = -kInf;
      for (int64_t c = 0; c < n; ++c) {
        logits[c] = mirror_logit(m, h, c, kq);
        top = std::max(top, logits[c]);
      }
      double z = 0.0;
      for (int64_t c = 0; c < n; ++c) z += std::exp(logits[c] - top);
      for (int64_t c = 0; c < n; ++c) mean_r[c] += std::exp(logits[c] - top) / z / static_cast<double>(H);
    }
    member[static_cast<size_t>(i)] = std::max_element(mean_r.begin(), mean_r.end()) - mean_r.begin();
  }
  std::vector<double> resid(static_cast<size_t>(t * n), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t c = 0; c < n; ++c) add_head_residuals(m, h, c, k, v, t, resid.data());
  }
  double weighted = 0.0, total = 0.0;
  for (int64_t c = 0; c < n; ++c) {
    std::vector<int64_t> members;
    for (int64_t i = 0; i < t; ++i) {
      if (member[static_cast<size_t>(i)] == c) members.push_back(i);
    }
    double misfit = 0.0;
    if (!members.empty()) {
      for (const int64_t i : members) misfit += resid[static_cast<size_t>(i * n + c)];
      misfit /= static_cast<double>(members.size());
      auto order = members;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return resid[static_cast<size_t>(a * n + c)] > resid[static_cast<size_t>(b * n + c)];
      });
      order.resize(static_cast<size_t>(std::min<int64_t>(outlier_top_k, static_cast<int64_t>(order.size()))));
      auto& out = receipt.per_cluster_outlier_tokens[c];
      std::vector<int64_t> rows(order.size());
      std::transform(order.begin(), order.end(), rows.begin(), [&](int64_t i) { return row0 + i; });
      out.residuals.resize(order.size());
      std::transform(order.begin(), order.end(), out.residuals.begin(),
                     [&](int64_t i) { return resid[static_cast<size_t>(i * n + c)]; });
      out.indices = std::move(order);
      out.member_indices = std::move(members);
      pending.push_back({&out, std::move(rows)});
    }
    receipt.misfit[c] = misfit;
    double mean_count = 0.0;
    for (int64_t h = 0; h < H; ++h) mean_count += m.cnt(h, c) / static_cast<double>(H);
    mean_count = std::max(mean_count, kCountFloor);
    weighted += std::max(misfit, 0.0) * mean_count;
    total += mean_count;
  }
  receipt.misfit_scalar = weighted / total;
}

void validate_tokens_against_bank(const ClusterBank& bank, const torch::Tensor& k, const torch::Tensor& v,
                                  const BirthMergeOptions& o, const char* where) {
  const std::string w(where);
  if (o.outlier_top_k < 0) {
    throw ValueError(w + ": outlier_top_k must be a non-negative integer");
  }
  if (!k.defined() || !v.defined() || k.dim() != 4 || k.sizes() != v.sizes() || k.size(1) <= 0) {
    throw ValueError(w + ": k and v must be non-empty tensors of equal (batch, time, head, dim) shape");
  }
  if (k.size(0) != bank.batch_size()) {
    throw ValueError(w + ": k has batch size " + str(k.size(0)) + " but the bank's batch size is " +
                     str(bank.batch_size()));
  }
  if (k.device() != bank.mu_k.device() || v.device() != bank.mu_k.device() ||
      k.scalar_type() != bank.mu_k.scalar_type() || v.scalar_type() != bank.mu_k.scalar_type()) {
    throw ValueError(w + ": k and v must match the cluster bank's device and dtype");
  }
  if (k.size(2) != bank.mu_k.size(1) || k.size(3) != bank.mu_k.size(3)) {
    throw ValueError(w + ": k and v head dimensions must match the cluster bank");
  }
}

// k and v in double (row-major (B, t, H, d)), checked finite: the copies the bookkeeping works on.
struct HostTokens {
  std::vector<double> k, v;
};

HostTokens host_tokens(const torch::Tensor& k, const torch::Tensor& v, const char* where) {
  HostTokens host{to_doubles(k), to_doubles(v)};
  const auto finite = [](const std::vector<double>& x) {
    return std::all_of(x.begin(), x.end(), [](double e) { return std::isfinite(e); });
  };
  if (!finite(host.k) || !finite(host.v)) {
    throw ValueError(std::string(where) + ": k and v must contain only finite values");
  }
  return host;
}

// birth_and_merge on validated input (shapes checked, `host` the finite double copies of k and v).
IngestResult birth_and_merge_checked(const ClusterBank& bank, const torch::Tensor& k, const torch::Tensor& v,
                                     const HostTokens& host, const BirthMergeOptions& o) {
  const int64_t B = bank.batch_size(), t = k.size(1), H = k.size(2), d = k.size(3), C = bank.max_clusters;
  auto mirrors = mirrors_of(bank);
  const auto& k_host = host.k;
  const auto& v_host = host.v;
  std::vector<PendingOutliers> pending;
  std::vector<std::optional<std::vector<Slot>>> rebuilt(static_cast<size_t>(B));
  std::vector<int64_t> n_clusters = bank.n_clusters;
  // Without gradient history the bank is rebuilt from the mirrors; otherwise merges run on the tensors too.
  const bool differentiable = bank.count.requires_grad() || bank.mu_k.requires_grad() || bank.mu_v.requires_grad() ||
                              bank.sigma_kk.requires_grad() || bank.sigma_vk.requires_grad();
  bool changed = false;
  IngestResult result;
  result.receipts.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    auto& m = mirrors[static_cast<size_t>(b)];
    auto& receipt = result.receipts[static_cast<size_t>(b)];
    const double* kb = k_host.data() + b * t * H * d;
    const double* vb = v_host.data() + b * t * H * d;
    std::vector<Slot> slots;
    const auto materialise = [&] {
      if (slots.empty()) {
        for (int64_t c = 0; c < C; ++c) slots.push_back(slot_of(bank, b, c));
      }
    };
    // Merge j into i: the pooled combine, the last live slot moved into j, the last slot zeroed.
    const auto merge = [&](int64_t i, int64_t j, double distance) {
      const int64_t last = m.n - 1;
      if (differentiable) {  // the pooled combine carries the gradient of both clusters
        materialise();
        slots[static_cast<size_t>(i)] = pooled_combine(slots[static_cast<size_t>(i)], slots[static_cast<size_t>(j)]);
        if (j != last) slots[static_cast<size_t>(j)] = slots[static_cast<size_t>(last)];
        slots[static_cast<size_t>(last)] = zero_slot(bank);
      }
      mirror_combine(m, i, j);
      if (j != last) mirror_copy_slot(m, last, j);
      mirror_zero_slot(m, last);
      --m.n;
      receipt.merged.emplace_back(i, j);
      receipt.merge_distances.push_back(distance);
    };
    const bool budget = o.cluster_rule == ClusterRule::kBudget;
    if (budget && m.n == C && C >= 2) {  // make room: the closest pair merges (the first such pair on ties)
      int64_t closest_i = 0, closest_j = 1;
      double closest = kInf;
      for (int64_t i = 0; i < m.n; ++i) {
        for (int64_t j = i + 1; j < m.n; ++j) {
          const double distance = mirror_distance(m, i, j);
          if (distance < closest) std::tie(closest, closest_i, closest_j) = std::tuple(distance, i, j);
        }
      }
      merge(closest_i, closest_j, closest);
    }
    // Birth: a free slot and (threshold rule) every head's best logit of the chunk mean below the threshold.
    bool birth = m.n < C;
    for (int64_t h = 0; h < H && birth && !budget; ++h) {
      std::vector<double> k_bar(static_cast<size_t>(d), 0.0);
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t a = 0; a < d; ++a) k_bar[a] += kb[(i * H + h) * d + a] / static_cast<double>(t);
      }
      double best = -kInf;
      for (int64_t c = 0; c < m.n; ++c) best = std::max(best, mirror_logit(m, h, c, k_bar.data()));
      birth = best < o.birth_threshold;
    }
    if (birth) {
      const int64_t slot = m.n;
      mirror_birth(m, slot, kb, vb, t);  // birth statistics are detached (docs/mechanisms.md#moment-closure-far-field)
      if (differentiable) {
        materialise();
        slots[static_cast<size_t>(slot)] = mirror_slot(m, slot, bank.mu_k.options());
      }
      ++m.n;
      receipt.birthed = receipt.birth_incorporated_batch = true;
    }
    // Merge (threshold rule): scan pairs (i < j); on a merge, rescan from the same i.
    int64_t i = 0;
    while (i < m.n && !budget) {
      bool merged_here = false;
      for (int64_t j = i + 1; j < m.n; ++j) {
        const double distance = mirror_distance(m, i, j);
        double n_small = kInf;
        for (int64_t h = 0; h < H; ++h) n_small = std::min({n_small, m.cnt(h, i), m.cnt(h, j)});
        const double threshold =
            o.merge_threshold ? *o.merge_threshold : 2.65 + 6.0 / std::sqrt(std::max(n_small, 1.0));
        if (distance < threshold) {
          merge(i, j, distance);
          merged_here = true;
          break;
        }
      }
      if (!merged_here) ++i;
    }
    n_clusters[static_cast<size_t>(b)] = m.n;
    changed = changed || receipt.birthed || !receipt.merged.empty();
    if (!slots.empty()) rebuilt[static_cast<size_t>(b)] = std::move(slots);
    misfit_receipt(m, kb, vb, t, o.outlier_top_k, b * t, receipt, pending);
  }
  gather_outliers(k.detach(), v.detach(), pending);
  if (!changed) {
    result.bank = bank;
  } else if (differentiable) {
    result.bank = rebuild(bank, rebuilt, std::move(n_clusters));
  } else {
    result.bank = bank_from_mirrors(mirrors, bank, std::move(n_clusters));
  }
  return result;
}

// Slots [first, first+count) of every stream, as a bank with max_clusters = count.
ClusterBank slot_range(const ClusterBank& bank, int64_t first, int64_t count) {
  ClusterBank out;
  out.count = bank.count.narrow(2, first, count);
  out.mu_k = bank.mu_k.narrow(2, first, count);
  out.mu_v = bank.mu_v.narrow(2, first, count);
  out.sigma_kk = bank.sigma_kk.narrow(2, first, count);
  out.sigma_vk = bank.sigma_vk.narrow(2, first, count);
  out.n_clusters = bank.n_clusters;
  out.max_clusters = count;
  return out;
}

// The slots of `head` followed by those of `tail`.
ClusterBank join_slots(const ClusterBank& head, const ClusterBank& tail) {
  ClusterBank out;
  out.count = torch::cat({head.count, tail.count}, 2);
  out.mu_k = torch::cat({head.mu_k, tail.mu_k}, 2);
  out.mu_v = torch::cat({head.mu_v, tail.mu_v}, 2);
  out.sigma_kk = torch::cat({head.sigma_kk, tail.sigma_kk}, 2);
  out.sigma_vk = torch::cat({head.sigma_vk, tail.sigma_vk}, 2);
  out.n_clusters = head.n_clusters;
  out.max_clusters = head.max_clusters + tail.max_clusters;
  return out;
}

// A receipt for a layer that evicted nothing this step.
StreamReceipt null_receipt(int64_t n_head) {
  StreamReceipt r;
  r.ingested_tokens_per_head.assign(static_cast<size_t>(n_head), 0.0);
  return r;
}

[[noreturn]] void accounting_violation(const std::string& detail) {
  throw StateError("moment-closure state violates one-token/one-representation accounting: " + detail);
}

}  // namespace

// ---- ClusterBank ----------------------------------------------------------------------------------------------

ClusterBank ClusterBank::detach() const {
  ClusterBank out = *this;
  out.count = count.detach();
  out.mu_k = mu_k.detach();
  out.mu_v = mu_v.detach();
  out.sigma_kk = sigma_kk.detach();
  out.sigma_vk = sigma_vk.detach();
  return out;
}

torch::Tensor ClusterBank::total_per_head() const {
  // Inactive slots hold zeros, so the sum over all slots is the live total.
  return count.sum(2);
}

int64_t ClusterBank::bytes() const {
  int64_t total = 0;
  for (const auto* t : {&count, &mu_k, &mu_v, &sigma_kk, &sigma_vk}) {
    total += t->numel() * static_cast<int64_t>(t->element_size());
  }
  return total;
}

void validate_cluster_bank(const ClusterBank& bank, const std::string& where) {
  const auto fail = [&](const std::string& what) { throw ValueError(where + ": " + what); };
  const auto shape_text = [](c10::IntArrayRef s) {
    std::string out = "(";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + ")";
  };
  for (const auto& [name, t] : {std::pair<const char*, const torch::Tensor*>{"count", &bank.count},
                                {"mu_k", &bank.mu_k}, {"mu_v", &bank.mu_v}, {"sigma_kk", &bank.sigma_kk},
                                {"sigma_vk", &bank.sigma_vk}}) {
    if (!t->defined()) fail(std::string(name) + " is missing");
  }
  const auto& count = bank.count;
  if (count.dim() != 3 || count.size(0) <= 0 || count.size(1) <= 0 || count.size(2) <= 0) {
    fail("count must be (batch, heads, max_clusters), each positive (got " + shape_text(count.sizes()) + ")");
  }
  const int64_t B = count.size(0), H = count.size(1), C = count.size(2);
  if (bank.mu_k.dim() != 4 || bank.mu_k.size(0) != B || bank.mu_k.size(1) != H || bank.mu_k.size(2) != C ||
      bank.mu_k.size(3) <= 0) {
    fail("mu_k must be (batch " + str(B) + ", heads " + str(H) + ", max_clusters " + str(C) +
         ", head_dim) (got shape " + shape_text(bank.mu_k.sizes()) + ")");
  }
  const int64_t d = bank.mu_k.size(3);
  for (const auto& [name, t, want] :
       {std::tuple<const char*, const torch::Tensor*, std::vector<int64_t>>{"mu_v", &bank.mu_v, {B, H, C, d}},
        {"sigma_kk", &bank.sigma_kk, {B, H, C, d}},
        {"sigma_vk", &bank.sigma_vk, {B, H, C, d, d}}}) {
    if (t->sizes() != c10::IntArrayRef(want)) {
      fail(std::string(name) + " must have shape " + shape_text(want) + " (got " + shape_text(t->sizes()) + ")");
    }
  }
  for (const auto* t : {&bank.mu_k, &bank.mu_v, &bank.sigma_kk, &bank.sigma_vk}) {
    if (t->scalar_type() != count.scalar_type() || t->device() != count.device()) {
      fail("every tensor must have count's dtype and device");
    }
  }
  if (bank.max_clusters != C) {
    fail("max_clusters is " + str(bank.max_clusters) + " but count has " + str(C) + " slots");
  }
  if (bank.batch_size() != B) {
    fail("n_clusters must hold one entry per stream (" + str(B) + ", got " + str(bank.batch_size()) + ")");
  }
  for (const int64_t n : bank.n_clusters) {
    if (n < 0 || n > C) fail("n_clusters must lie in [0, max_clusters " + str(C) + "] (got " + str(n) + ")");
  }
  const auto values = [](const torch::Tensor& t) { return to_doubles(t); };
  const auto count_v = values(count), mu_k = values(bank.mu_k), mu_v = values(bank.mu_v),
             sigma_kk = values(bank.sigma_kk), sigma_vk = values(bank.sigma_vk);
  for (const auto& [name, v, nonnegative] :
       {std::tuple<const char*, const std::vector<double>*, bool>{"count", &count_v, true}, {"mu_k", &mu_k, false},
        {"mu_v", &mu_v, false}, {"sigma_kk", &sigma_kk, true}, {"sigma_vk", &sigma_vk, false}}) {
    for (const double x : *v) {
      if (!std::isfinite(x)) fail(std::string(name) + " must be finite");
      if (nonnegative && x < 0.0) fail(std::string(name) + " must be >= 0");
    }
  }
  // Inactive slots are all zeros (docs/mechanisms.md#moment-closure-far-field): the live totals, and so the
  // conservation receipts, rely on it.
  const auto zero = [](const std::vector<double>& v, int64_t from, int64_t n) {
    return std::all_of(v.begin() + from, v.begin() + from + n, [](double x) { return x == 0.0; });
  };
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t c = bank.n_clusters[static_cast<size_t>(b)]; c < C; ++c) {
        const int64_t slot = (b * H + h) * C + c;
        if (!zero(count_v, slot, 1) || !zero(mu_k, slot * d, d) || !zero(mu_v, slot * d, d) ||
            !zero(sigma_kk, slot * d, d) || !zero(sigma_vk, slot * d * d, d * d)) {
          fail("the inactive slot " + str(c) + " of stream " + str(b) + " (head " + str(h) +
               ") must be all zeros (n_clusters[" + str(b) + "] = " + str(bank.n_clusters[static_cast<size_t>(b)]) +
               ")");
        }
      }
    }
  }
}

ClusterBank empty_cluster_bank(int64_t batch_size, int64_t n_head, int64_t max_clusters, int64_t head_dim,
                               torch::TensorOptions options) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"batch_size", batch_size},
                                    {"n_head", n_head}, {"max_clusters", max_clusters}, {"head_dim", head_dim}}) {
    if (value <= 0) {
      throw ValueError(std::string("empty_cluster_bank: ") + name + " must be a positive integer (got " + str(value) +
                       ")");
    }
  }
  ClusterBank bank;
  bank.count = torch::zeros({batch_size, n_head, max_clusters}, options);
  bank.mu_k = torch::zeros({batch_size, n_head, max_clusters, head_dim}, options);
  bank.mu_v = torch::zeros({batch_size, n_head, max_clusters, head_dim}, options);
  bank.sigma_kk = torch::zeros({batch_size, n_head, max_clusters, head_dim}, options);
  bank.sigma_vk = torch::zeros({batch_size, n_head, max_clusters, head_dim, head_dim}, options);
  bank.n_clusters.assign(static_cast<size_t>(batch_size), 0);
  bank.max_clusters = max_clusters;
  return bank;
}

ClusterAttention mgf_cluster_attention(const torch::Tensor& q, const ClusterBank& bank) {
  check_against_bank(q, bank, "mgf_cluster_attention", "q");
  const int64_t B = q.size(0), t = q.size(1), H = q.size(2), d = q.size(3);
  const int64_t n = max_live(bank);
  if (n == 0) {
    return {q.new_zeros({B, t, 0, H, d}), q.new_zeros({B, t, 0, H})};
  }
  auto logits = mgf_logits(q, bank, n);
  auto out = mgf_outputs(q, bank, n);
  if (!all_live(bank, n)) {
    const auto dead = live_slots(bank, n).logical_not();  // (B, n)
    logits = logits.masked_fill(dead.view({B, 1, 1, n}), -kInf);
    out = out.masked_fill(dead.view({B, 1, 1, n, 1}), 0.0);
  }
  return {out.transpose(2, 3), logits.transpose(2, 3)};
}

torch::Tensor cluster_responsibilities(const torch::Tensor& k, const ClusterBank& bank) {
  check_against_bank(k, bank, "cluster_responsibilities", "k");
  const int64_t B = k.size(0), t = k.size(1), H = k.size(2), C = bank.max_clusters;
  const int64_t n = max_live(bank);
  if (n == 0) {
    return k.new_zeros({B, t, H, C});
  }
  torch::Tensor r;
  if (all_live(bank, n)) {
    r = torch::softmax(mgf_logits(k, bank, n), -1);
  } else {
    const auto live = live_slots(bank, n);                    // (B, n)
    const auto has_clusters = live.any(1, /*keepdim=*/true);  // (B, 1)
    // −∞ only for dead slots of streams that have clusters; a stream without clusters gets zeros below.
    const auto hide = live.logical_not().logical_and(has_clusters).view({B, 1, 1, n});
    r = torch::softmax(mgf_logits(k, bank, n).masked_fill(hide, -kInf), -1) *
        live.to(k.scalar_type()).view({B, 1, 1, n});
  }
  if (n < C) {
    r = torch::constant_pad_nd(r, {0, C - n});
  }
  return r;
}

ClusterBank update_cluster_bank(const ClusterBank& bank, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& r) {
  check_against_bank(k, bank, "update_cluster_bank", "k");
  check_against_bank(v, bank, "update_cluster_bank", "v");
  if (!r.defined() || r.dim() != 4 || r.size(0) != k.size(0) || r.size(1) != k.size(1) || r.size(2) != k.size(2) ||
      r.size(3) != bank.max_clusters) {
    throw ValueError("update_cluster_bank: responsibilities must be (batch, time, heads, max_clusters)");
  }
  check_like_bank(r, bank, "update_cluster_bank", "responsibilities");
  const auto n1 = r.sum(1);                                      // (B, H, C)
  const auto n1_safe = n1.clamp_min(kCountFloor).unsqueeze(-1);  // (B, H, C, 1)
  const auto r_t = r.permute({0, 2, 3, 1});  // (B, H, C, t)
  const auto mean_k1 = detail::fast_bmm(r_t, k.permute({0, 2, 1, 3}), false) / n1_safe;  // (B, H, C, d)
  const auto mean_v1 = detail::fast_bmm(r_t, v.permute({0, 2, 1, 3}), false) / n1_safe;
  const auto dk = k.unsqueeze(3) - mean_k1.unsqueeze(1);  // (B, t, H, C, d)
  const auto dv = v.unsqueeze(3) - mean_v1.unsqueeze(1);
  const auto m2_k1 = detail::fast_bmm(r_t.unsqueeze(3), (dk * dk).permute({0, 2, 3, 1, 4}), false).squeeze(3);
  // C₁[b,h,c] = Σ_t (r dv)ᵀ dk: one (d × t)(t × d) product per (stream, head, cluster).
  const auto c2_1 = detail::fast_bmm((dv * r.unsqueeze(-1)).permute({0, 2, 3, 4, 1}), dk.permute({0, 2, 3, 1, 4}),
                                     false);

  const auto& n0 = bank.count;
  const auto n = n0 + n1;
  const auto n_safe = n.clamp_min(kCountFloor);
  const auto delta_k = mean_k1 - bank.mu_k;
  const auto delta_v = mean_v1 - bank.mu_v;
  const auto frac = (n1 / n_safe).unsqueeze(-1);
  const auto cross = (n0 * n1 / n_safe).unsqueeze(-1);
  ClusterBank out = bank;
  out.count = n;
  out.mu_k = bank.mu_k + delta_k * frac;
  out.mu_v = bank.mu_v + delta_v * frac;
  out.sigma_kk = (bank.sigma_kk * n0.unsqueeze(-1) + m2_k1 + delta_k * delta_k * cross) / n_safe.unsqueeze(-1);
  out.sigma_vk = (bank.sigma_vk * n0.unsqueeze(-1).unsqueeze(-1) + c2_1 +
                  delta_v.unsqueeze(-1) * delta_k.unsqueeze(-2) * cross.unsqueeze(-1)) /
                 n_safe.unsqueeze(-1).unsqueeze(-1);
  return out;
}

IngestResult birth_and_merge(const ClusterBank& bank, const torch::Tensor& k, const torch::Tensor& v,
                             const BirthMergeOptions& options) {
  validate_tokens_against_bank(bank, k, v, options, "birth_and_merge");
  return birth_and_merge_checked(bank, k, v, host_tokens(k, v, "birth_and_merge"), options);
}

IngestResult ingest_cluster_batch(const ClusterBank& bank, const torch::Tensor& k, const torch::Tensor& v,
                                  const BirthMergeOptions& options) {
  validate_tokens_against_bank(bank, k, v, options, "ingest_cluster_batch");
  const int64_t B = bank.batch_size(), t = k.size(1), H = k.size(2);
  const auto host = host_tokens(k, v, "ingest_cluster_batch");
  const auto before = head_totals(bank.count);
  auto result = birth_and_merge_checked(bank, k.detach(), v.detach(), host, options);
  // The soft update for streams with clusters whose batch no birth absorbed.
  std::vector<double> soft(static_cast<size_t>(B), 0.0);
  bool any_soft = false;
  for (int64_t b = 0; b < B; ++b) {
    auto& receipt = result.receipts[static_cast<size_t>(b)];
    receipt.soft_update_applied =
        result.bank.n_clusters[static_cast<size_t>(b)] > 0 && !receipt.birth_incorporated_batch;
    soft[static_cast<size_t>(b)] = receipt.soft_update_applied ? 1.0 : 0.0;
    any_soft = any_soft || receipt.soft_update_applied;
  }
  if (any_soft) {
    auto r = cluster_responsibilities(k, result.bank);
    if (std::any_of(soft.begin(), soft.end(), [](double s) { return s == 0.0; })) {
      r = r * torch::tensor(soft, r.options()).view({B, 1, 1, 1});
    }
    // Only the live prefix can change (responsibilities beyond it are exactly zero): update those slots alone.
    const int64_t n = max_live(result.bank);
    const int64_t C = result.bank.max_clusters;
    if (n < C) {
      auto prefix = slot_range(result.bank, 0, n);
      prefix = update_cluster_bank(prefix, k, v, r.narrow(3, 0, n));
      result.bank = join_slots(prefix, slot_range(result.bank, n, C - n));
    } else {
      result.bank = update_cluster_bank(result.bank, k, v, r);
    }
  }
  const auto after = head_totals(result.bank.count);
  const double epsilon = epsilon_of(result.bank.count);
  for (int64_t b = 0; b < B; ++b) {
    auto& receipt = result.receipts[static_cast<size_t>(b)];
    receipt.ingested_tokens_per_head.resize(static_cast<size_t>(H));
    for (int64_t h = 0; h < H; ++h) {
      const auto i = static_cast<size_t>(b * H + h);
      receipt.ingested_tokens_per_head[static_cast<size_t>(h)] = after[i] - before[i];
    }
    const double magnitude = *std::max_element(after.begin() + b * H, after.begin() + (b + 1) * H) *
                             static_cast<double>(std::max<int64_t>(result.bank.n_clusters[static_cast<size_t>(b)], 1));
    receipt.expected_ingested_tokens_per_head = t;
    receipt.count_conserved = std::all_of(receipt.ingested_tokens_per_head.begin(),
                                          receipt.ingested_tokens_per_head.end(),
                                          [&](double g) {
                                            return close(g, static_cast<double>(t), magnitude, epsilon);
                                          });
    if (!receipt.count_conserved) {
      std::string seen;
      for (const double g : receipt.ingested_tokens_per_head) seen += (seen.empty() ? "" : ", ") + std::to_string(g);
      throw StateError("cluster ingestion did not count every observation exactly once: stream " + str(b) +
                       " grew by [" + seen + "] per head, expected " + str(t) + " (heads " + str(H) + ")");
    }
  }
  return result;
}

// ---- one layer's accounting (receipt, eviction, counts; docs/mechanisms.md#moment-closure-far-field) ----------

void check_far_field_accounting(const ClusterBank& bank, int64_t pos, int64_t cache_len, const std::string& label) {
  const int64_t b = bank.batch_size(), n_head = bank.mu_k.size(1);
  const auto totals = head_totals(bank.count);
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t h = 0; h < n_head; ++h) {
      if (!close(totals[static_cast<size_t>(s * n_head + h)], static_cast<double>(pos - cache_len),
                 static_cast<double>(pos), epsilon_of(bank.count))) {
        accounting_violation(label + ", stream " + str(s) + ", head " + str(h) + ": far=" +
                             std::to_string(totals[static_cast<size_t>(s * n_head + h)]) + ", expected " +
                             str(pos - cache_len));
      }
    }
  }
}

FarFieldUpdate evict_to_far_field(const ClusterBank& bank, const torch::Tensor& k_evicted,
                                  const torch::Tensor& v_evicted, int64_t positions_seen, int64_t near_tokens,
                                  const BirthMergeOptions& options, const std::string& label) {
  const int64_t b = bank.batch_size(), n_head = bank.mu_k.size(1), evicted = k_evicted.size(1);
  FarFieldUpdate update;
  LayerReceipt& layer_receipt = update.receipt;
  layer_receipt.batch_size = b;
  if (evicted > 0) {
    auto ingested = ingest_cluster_batch(bank, k_evicted, v_evicted, options);
    update.bank = std::move(ingested.bank);
    layer_receipt.streams = std::move(ingested.receipts);
  } else {
    update.bank = bank;
    layer_receipt.streams.assign(static_cast<size_t>(b), null_receipt(n_head));
  }
  // Accounting (post): far tokens = positions seen − near tokens, per stream and head.
  const auto totals = head_totals(update.bank.count);
  double misfit_sum = 0.0;
  for (int64_t s = 0; s < b; ++s) {
    auto& receipt = layer_receipt.streams[static_cast<size_t>(s)];
    StreamReceipt::Accounting a;
    a.positions_seen = positions_seen;
    a.near_tokens = near_tokens;
    a.evicted_tokens = evicted;
    a.far_tokens_per_head.assign(totals.begin() + s * n_head, totals.begin() + (s + 1) * n_head);
    a.expected_far_tokens_per_head = positions_seen - near_tokens;
    a.conserved = std::all_of(a.far_tokens_per_head.begin(), a.far_tokens_per_head.end(), [&](double f_) {
      return close(f_, static_cast<double>(a.expected_far_tokens_per_head), static_cast<double>(positions_seen),
                   epsilon_of(update.bank.count));
    });
    if (!a.conserved) {
      accounting_violation(label + ", stream " + str(s) + ": far tokens do not equal " +
                           str(a.expected_far_tokens_per_head));
    }
    receipt.accounting = std::move(a);
    misfit_sum += receipt.misfit_scalar;
  }
  layer_receipt.misfit_scalar = misfit_sum / static_cast<double>(b);
  return update;
}

// ---- MomentClosureAttention ------------------------------------------------------------------------------------

int64_t MomentClosureState::bytes() const {
  int64_t total = near.bytes();
  for (const auto& b : banks) total += b.bytes();
  for (const auto& s : stores) total += s.bytes();
  return total;
}

MomentClosureAttentionImpl::MomentClosureAttentionImpl(const MomentClosureOptions& options) : options_(options) {
  SpineOptions spine;
  spine.vocab = options_.vocab;
  spine.d_model = options_.d_model;
  spine.n_layer = options_.n_layer;
  spine.n_head = options_.n_head;
  spine.window = options_.window;
  validate_spine_options(spine, "MomentClosureAttention");
  if (options_.max_clusters <= 0) {
    throw ValueError("MomentClosureAttention: max_clusters must be a positive integer (got " +
                     str(options_.max_clusters) + ")");
  }
  if (!std::isfinite(options_.birth_threshold)) {
    throw ValueError("MomentClosureAttention: birth_threshold must be finite");
  }
  if (options_.outlier_capacity < 0) {
    throw ValueError("MomentClosureAttention: outlier_capacity must be a non-negative integer (got " +
                     str(options_.outlier_capacity) + ")");
  }
  if (options_.merge_threshold && !std::isfinite(*options_.merge_threshold)) {
    throw ValueError("MomentClosureAttention: merge_threshold must be finite when given");
  }
  backbone_ = register_module("backbone", SpineBackbone(options_.vocab, options_.d_model, options_.n_layer));
}

MomentClosureState MomentClosureAttentionImpl::init_state(int64_t batch_size, torch::Device device) const {
  if (batch_size <= 0) {
    throw ValueError("MomentClosureAttention.init_state: batch_size must be a positive integer (got " +
                     str(batch_size) + ")");
  }
  MomentClosureState state;
  state.near.cache_k.resize(static_cast<size_t>(options_.n_layer));
  state.near.cache_v.resize(static_cast<size_t>(options_.n_layer));
  state.near.batch_size = batch_size;
  state.near.n_head = options_.n_head;
  state.near.head_dim = head_dim();
  state.near.device = device;
  const auto options = torch::TensorOptions().dtype(backbone_->tok->weight.scalar_type()).device(device);
  for (int64_t l = 0; l < options_.n_layer; ++l) {
    state.banks.push_back(empty_cluster_bank(batch_size, options_.n_head, options_.max_clusters, head_dim(), options));
    if (options_.outlier_capacity > 0) {
      state.stores.push_back(empty_outlier_store(batch_size, options_.n_head, options_.max_clusters, head_dim(),
                                                 options_.outlier_capacity));
    }
  }
  state.batch_size = batch_size;
  return state;
}

MomentClosureOutput MomentClosureAttentionImpl::advance(const MomentClosureState& state, const torch::Tensor& x) {
  validate_tokens(x, options_.vocab, "MomentClosureAttention.advance");
  return advance_checked(state, x);
}

MomentClosureOutput MomentClosureAttentionImpl::advance_checked(const MomentClosureState& state,
                                                                const torch::Tensor& x) {
  const char* where = "MomentClosureAttention.step";
  const int64_t b = x.size(0), t = x.size(1), n_head = options_.n_head, hd = head_dim();
  if (b != state.batch_size) {
    throw ValueError(std::string(where) + ": the chunk's batch size " + str(b) +
                     " does not match the state's batch size " + str(state.batch_size));
  }
  if (static_cast<int64_t>(state.banks.size()) != options_.n_layer) {
    throw ValueError(std::string(where) + ": the state must hold one cluster bank per layer");
  }
  for (const auto& bank : state.banks) {
    if (bank.batch_size() != b || bank.max_clusters != options_.max_clusters || bank.mu_k.size(1) != n_head ||
        bank.mu_k.size(3) != hd) {
      throw ValueError(std::string(where) + ": a cluster bank's batch size or layout does not match the chunk");
    }
  }
  const bool with_store = options_.outlier_capacity > 0;
  if (static_cast<int64_t>(state.stores.size()) != (with_store ? options_.n_layer : 0)) {
    throw ValueError(std::string(where) + ": the state must hold one outlier store per layer when outlier_capacity > 0"
                                          " and none otherwise");
  }
  for (const auto& store : state.stores) {
    if (store.batch_size() != b || store.capacity != options_.outlier_capacity ||
        store.slots() != options_.max_clusters * options_.outlier_capacity || store.k.codes.size(2) != n_head ||
        store.k.codes.size(3) != hd) {
      throw ValueError(std::string(where) + ": an outlier store's batch size or layout does not match the chunk");
    }
  }
  const int64_t cache_len = checked_cache_length(state.near, b, options_.n_layer, n_head, hd, where);
  const int64_t pos = state.near.pos;
  // Representation receipt (pre): every evicted position is in the bank, exactly once.
  for (size_t l = 0; l < state.banks.size(); ++l) {
    check_far_field_accounting(state.banks[l], pos, cache_len, "layer " + std::to_string(l));
  }

  auto h = backbone_->tok(x);
  const auto geometry =
      near_field_geometry(pos, t, cache_len, hd, options_.window, h.scalar_type(), x.device());
  BirthMergeOptions ingest_options;
  ingest_options.birth_threshold = options_.birth_threshold;
  ingest_options.merge_threshold = options_.merge_threshold;
  ingest_options.cluster_rule = options_.cluster_rule;
  // A store is offered as many outliers per cluster as it can keep.
  ingest_options.outlier_top_k = std::max(ingest_options.outlier_top_k, options_.outlier_capacity);

  MomentClosureState next = state;
  std::vector<LayerReceipt> receipts;
  for (size_t l = 0; l < backbone_->layers.size(); ++l) {
    auto& layer = *backbone_->layers[l];
    auto attn = moment_closure_sublayer(*layer.qkv, *layer.proj, layer.ln1(h), state.near.cache_k[l],
                                        state.near.cache_v[l], state.banks[l], geometry, n_head, ingest_options,
                                        "layer " + std::to_string(l), with_store ? &state.stores[l] : nullptr);
    h = layer.finish(h, attn.out);
    next.near.cache_k[l] = std::move(attn.cache_k);
    next.near.cache_v[l] = std::move(attn.cache_v);
    next.banks[l] = std::move(*attn.bank);
    if (with_store) next.stores[l] = std::move(*attn.store);
    receipts.push_back(std::move(*attn.receipt));
  }
  next.near.pos = pos + t;
  last_misfit_ = 0.0;
  for (const auto& r : receipts) last_misfit_ += r.misfit_scalar / static_cast<double>(receipts.size());
  last_receipts_ = std::move(receipts);
  return {std::move(next), backbone_->logits(h)};
}

MechanismStep<MomentClosureState> MomentClosureAttentionImpl::step(const MomentClosureState& state,
                                                                    const torch::Tensor& x, const torch::Tensor& y) {
  validate_chunk(x, y, options_.vocab, "MomentClosureAttention.step");
  auto out = advance_checked(state, x);
  return {std::move(out.state), mean_cross_entropy(out.logits, y)};
}

MomentClosureState MomentClosureAttentionImpl::detach(const MomentClosureState& state) const {
  MomentClosureState out = state;
  for (auto* caches : {&out.near.cache_k, &out.near.cache_v}) {
    for (auto& c : *caches) {
      if (c.defined()) c = c.detach();
    }
  }
  if (out.detach_horizon_clusters) {
    for (auto& bank : out.banks) bank = bank.detach();
  }
  for (auto& store : out.stores) store = store.detach();
  return out;
}

}  // namespace attnmix::stream
