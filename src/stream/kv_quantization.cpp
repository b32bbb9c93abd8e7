// SPDX-License-Identifier: Apache-2.0
// Int8 keys and values and the outlier store of moment closure; see include/attnmix/stream/kv_quantization.hpp.
#include "attnmix/stream/kv_quantization.hpp"

#include "attnmix/core/errors.hpp"
#include "attnmix/stream/moment_closure.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace attnmix::stream {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

int64_t tensor_bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// Row-wise affine quantisation of a float64 tensor whose values are known to be finite.
QuantizedKv quantize_rows(const torch::Tensor& x64) {
  const auto low = std::get<0>(x64.min(-1, /*keepdim=*/true));
  const auto high = std::get<0>(x64.max(-1, /*keepdim=*/true));
  const auto scale = ((high - low) / 255.0).to(torch::kFloat).to(torch::kDouble);  // the stored scale
  const auto low32 = low.to(torch::kFloat).to(torch::kDouble);
  // Codes from the stored (float32) low and scale, so that x̂ is the nearest grid point of what is stored.
  const auto steps = torch::where(scale > 0, (x64 - low32) / scale.clamp_min(std::numeric_limits<double>::min()),
                                  torch::zeros_like(x64));
  QuantizedKv q;
  q.codes = (steps.round().clamp(0.0, 255.0) - 128.0).to(torch::kChar);
  q.low = low32.squeeze(-1).to(torch::kFloat);
  q.scale = scale.squeeze(-1).to(torch::kFloat);
  return q;
}

// The store's rows flat_slots (indices into the B·S slots) set to zero.
void clear_slots(QuantizedKv& q, const torch::Tensor& flat_slots) {
  for (auto* t : {&q.codes, &q.low, &q.scale}) t->flatten(0, 1).index_fill_(0, flat_slots, 0);
}

// The store's rows flat_slots replaced by the rows of `rows` (same count, rows' per-slot shape).
void write_slots(QuantizedKv& q, const torch::Tensor& flat_slots, const QuantizedKv& rows) {
  q.codes.flatten(0, 1).index_copy_(0, flat_slots, rows.codes);
  q.low.flatten(0, 1).index_copy_(0, flat_slots, rows.low);
  q.scale.flatten(0, 1).index_copy_(0, flat_slots, rows.scale);
}

QuantizedKv clone(const QuantizedKv& q) { return {q.codes.clone(), q.low.clone(), q.scale.clone()}; }

// One candidate for a cluster's slots: a stored slot (slot ≥ 0) or a new outlier (row of the stream's outliers).
struct Candidate {
  double residual;
  int64_t slot;  // −1 for a new token
  int64_t row;   // new tokens: the row in the gathered outliers
};

}  // namespace

int64_t QuantizedKv::bytes() const { return tensor_bytes(codes) + tensor_bytes(low) + tensor_bytes(scale); }

QuantizedKv quantize_kv_cache(const torch::Tensor& x) {
  const std::string where = "quantize_kv_cache";
  if (!x.defined() || x.dim() < 1 || x.size(-1) < 1) {
    throw ValueError(where + ": x must be a tensor with at least one dimension and a non-empty last dimension");
  }
  if (!x.is_floating_point()) {
    throw ValueError(where + ": x must be floating point (got " + std::string(c10::toString(x.scalar_type())) + ")");
  }
  const auto x64 = x.detach().to(torch::kDouble);
  if (!torch::isfinite(x64).all().item<bool>()) throw ValueError(where + ": x holds a non-finite value");
  return quantize_rows(x64);
}

torch::Tensor dequantize_kv_cache(const QuantizedKv& q, torch::ScalarType dtype) {
  const std::string where = "dequantize_kv_cache";
  if (!q.codes.defined() || !q.low.defined() || !q.scale.defined() || q.codes.scalar_type() != torch::kChar ||
      q.codes.dim() < 1) {
    throw ValueError(where + ": codes must be an int8 tensor with low and scale beside it");
  }
  const auto rows = q.codes.sizes().slice(0, static_cast<size_t>(q.codes.dim() - 1));
  if (q.low.sizes() != rows || q.scale.sizes() != rows) {
    throw ValueError(where + ": low and scale must have the codes' shape without its last dimension");
  }
  const auto codes = q.codes.to(torch::kDouble) + 128.0;
  return (q.low.to(torch::kDouble).unsqueeze(-1) + codes * q.scale.to(torch::kDouble).unsqueeze(-1)).to(dtype);
}

int64_t OutlierStore::held(int64_t b) const {
  const auto first = owner.begin() + b * slots();
  return std::count_if(first, first + slots(), [](int64_t c) { return c >= 0; });
}

int64_t OutlierStore::bytes() const { return k.bytes() + v.bytes() + tensor_bytes(k_hat) + tensor_bytes(v_hat); }

OutlierStore OutlierStore::detach() const {
  OutlierStore out = *this;
  out.k_hat = torch::Tensor();
  out.v_hat = torch::Tensor();
  return out;
}

OutlierStore empty_outlier_store(int64_t batch_size, int64_t n_head, int64_t max_clusters, int64_t head_dim,
                                 int64_t capacity) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"batch_size", batch_size},
                                    {"n_head", n_head},
                                    {"max_clusters", max_clusters},
                                    {"head_dim", head_dim},
                                    {"capacity", capacity}}) {
    if (value <= 0) {
      throw ValueError(std::string("empty_outlier_store: ") + name + " must be a positive integer (got " +
                       str(value) + ")");
    }
  }
  const int64_t slots = max_clusters * capacity;
  const auto empty = [&] {
    return QuantizedKv{torch::zeros({batch_size, slots, n_head, head_dim}, torch::kChar),
                       torch::zeros({batch_size, slots, n_head}, torch::kFloat),
                       torch::zeros({batch_size, slots, n_head}, torch::kFloat)};
  };
  OutlierStore store;
  store.k = empty();
  store.v = empty();
  store.owner.assign(static_cast<size_t>(batch_size * slots), -1);
  store.residual.assign(static_cast<size_t>(batch_size * slots), 0.0);
  store.capacity = capacity;
  return store;
}

void validate_outlier_store(const OutlierStore& store, const ClusterBank& bank, const std::string& where,
                            const std::string& prefix, const std::string& suffix) {
  const auto field = [&](const std::string& name) { return where + ": " + prefix + name + suffix; };
  if (store.capacity <= 0) {
    throw ValueError(field("capacity") + " must be a positive integer (got " + str(store.capacity) + ")");
  }
  const int64_t B = bank.batch_size(), H = bank.mu_k.size(1), d = bank.mu_k.size(3),
                S = bank.max_clusters * store.capacity;
  const auto device = bank.count.device();
  const auto check = [&](const torch::Tensor& t, const std::string& name, c10::IntArrayRef sizes,
                         torch::ScalarType dtype) {
    if (!t.defined() || t.sizes() != sizes || t.scalar_type() != dtype || t.device() != device) {
      std::string shape;
      for (const auto n : sizes) shape += (shape.empty() ? "" : ", ") + str(n);
      throw ValueError(field(name) + " must be a " + std::string(c10::toString(dtype)) + " tensor of shape (" + shape +
                       ") on the bank's device");
    }
  };
  for (const auto& [name, q] : {std::pair<std::string, const QuantizedKv*>{"k", &store.k}, {"v", &store.v}}) {
    check(q->codes, name + "_codes", {B, S, H, d}, torch::kChar);
    check(q->low, name + "_low", {B, S, H}, torch::kFloat);
    check(q->scale, name + "_scale", {B, S, H}, torch::kFloat);
    if (!torch::isfinite(q->low).all().item<bool>()) throw ValueError(field(name + "_low") + " must be finite");
    if (!torch::isfinite(q->scale).all().item<bool>() || q->scale.lt(0).any().item<bool>()) {
      throw ValueError(field(name + "_scale") + " must be finite and non-negative");
    }
  }
  if (static_cast<int64_t>(store.owner.size()) != B * S) {
    throw ValueError(field("owner") + " must hold one entry per stream and slot (" + str(B * S) + ")");
  }
  if (static_cast<int64_t>(store.residual.size()) != B * S) {
    throw ValueError(field("residual") + " must hold one entry per stream and slot (" + str(B * S) + ")");
  }
  if (store.k_hat.defined() != store.v_hat.defined()) {
    throw ValueError(field("k_hat") + " and " + prefix + "v_hat" + suffix + " must both be given or both be absent");
  }
  for (const auto& [name, hat] : {std::pair<const char*, const torch::Tensor*>{"k_hat", &store.k_hat},
                                  {"v_hat", &store.v_hat}}) {
    if (!hat->defined()) continue;
    check(*hat, name, {B, S, H, d}, hat->is_floating_point() ? hat->scalar_type() : torch::kFloat);
    if (!torch::isfinite(*hat).all().item<bool>()) throw ValueError(field(name) + " holds a non-finite value");
  }
  // A free slot's rows: all codes, lows and scales zero (one pass per tensor).
  const auto row_zero = [](const QuantizedKv& q) {
    return q.codes.eq(0).all(-1).logical_and(q.low.eq(0)).logical_and(q.scale.eq(0)).all(-1).to(torch::kCPU);
  };
  const auto k_zero = row_zero(store.k), v_zero = row_zero(store.v);
  const bool* kz = k_zero.data_ptr<bool>();
  const bool* vz = v_zero.data_ptr<bool>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t live = bank.n_clusters[static_cast<size_t>(b)];
    std::vector<int64_t> per_cluster(static_cast<size_t>(std::max<int64_t>(live, 0)), 0);
    for (int64_t slot = 0; slot < S; ++slot) {
      const auto i = static_cast<size_t>(b * S + slot);
      const int64_t c = store.owner[i];
      const double r = store.residual[i];
      const std::string at = " (stream " + str(b) + ", slot " + str(slot) + ")";
      if (c < -1 || c >= live) {
        throw ValueError(field("owner") + at + " names cluster " + str(c) +
                         ", which the stream's bank does not hold (" + str(live) + " live)");
      }
      if (c >= 0 && ++per_cluster[static_cast<size_t>(c)] > store.capacity) {
        throw ValueError(field("owner") + at + ": cluster " + str(c) + " holds more than outlier_capacity " +
                         str(store.capacity) + " tokens");
      }
      if (!std::isfinite(r) || r < 0.0) throw ValueError(field("residual") + at + " must be finite and >= 0");
      if (c < 0 && !(kz[i] && vz[i] && r == 0.0)) throw ValueError(field("owner") + at + " is free but not all zero");
    }
  }
}

OutlierStoreUpdate quantize_cluster_outliers(const OutlierStore& store, const std::vector<StreamReceipt>& receipts,
                                             const std::vector<int64_t>& n_clusters, const torch::Tensor& k_source,
                                             const torch::Tensor& v_source) {
  const std::string where = "quantize_cluster_outliers";
  const bool differentiable = k_source.defined() && v_source.defined() && torch::GradMode::is_enabled() &&
                              (k_source.requires_grad() || v_source.requires_grad());
  const int64_t B = store.batch_size(), S = store.slots();
  if (static_cast<int64_t>(receipts.size()) != B || static_cast<int64_t>(n_clusters.size()) != B) {
    throw ValueError(where + ": need one receipt and one cluster count per stream (" + str(B) + ")");
  }
  OutlierStoreUpdate out;
  out.store = store.detach();  // reconstructions are rebuilt below when the update is differentiable
  OutlierStore& s = out.store;
  OutlierStoreReceipt& r = out.receipt;
  // First the decisions, on the owner and residual lists; then one clear and one write per tensor.
  std::vector<int64_t> freed;                 // flat slots (b·S + slot) emptied
  std::vector<int64_t> written;               // flat slots filled, in the order of the rows below
  std::vector<torch::Tensor> k_rows, v_rows;  // (H, d) each, detached
  std::vector<int64_t> sources;               // differentiable: the rows' flat indices (b·e + token) in the sources
  for (int64_t b = 0; b < B; ++b) {
    const StreamReceipt& receipt = receipts[static_cast<size_t>(b)];
    const int64_t live_clusters = n_clusters[static_cast<size_t>(b)];
    int64_t* owner = s.owner.data() + b * S;
    double* residual = s.residual.data() + b * S;
    // Merges renumber the clusters: (i, j) moves j's tokens to i and the last live cluster into slot j.
    int64_t live = live_clusters + static_cast<int64_t>(receipt.merged.size());
    for (const auto& [i, j] : receipt.merged) {
      const int64_t last = --live;
      for (int64_t slot = 0; slot < S; ++slot) {
        if (owner[slot] == j) owner[slot] = i;
        else if (owner[slot] == last && j != last) owner[slot] = j;
      }
    }
    const auto free_slot = [&](int64_t slot) {
      owner[slot] = -1;
      residual[slot] = 0.0;
      freed.push_back(b * S + slot);
      ++r.evicted;
    };
    for (int64_t slot = 0; slot < S; ++slot) {  // a cluster that no longer exists keeps nothing
      if (owner[slot] >= live_clusters) free_slot(slot);
    }
    for (int64_t c = 0; c < live_clusters; ++c) {
      std::vector<Candidate> candidates;
      for (int64_t slot = 0; slot < S; ++slot) {
        if (owner[slot] == c) candidates.push_back({residual[slot], slot, -1});
      }
      const auto found = receipt.per_cluster_outlier_tokens.find(c);
      const OutlierTokens* fresh = found == receipt.per_cluster_outlier_tokens.end() ? nullptr : &found->second;
      const int64_t n_fresh = fresh ? static_cast<int64_t>(fresh->residuals.size()) : 0;
      if (n_fresh == 0 && static_cast<int64_t>(candidates.size()) <= s.capacity) continue;
      if (fresh && (fresh->k.dim() != 3 || fresh->k.size(0) != n_fresh || fresh->k.size(1) != s.k.codes.size(2) ||
                    fresh->k.size(2) != s.k.codes.size(3) || fresh->v.sizes() != fresh->k.sizes())) {
        throw ValueError(where + ": the outliers of stream " + str(b) + ", cluster " + str(c) +
                         " do not fit the store's heads and head_dim");
      }
      for (int64_t row = 0; row < n_fresh; ++row) {
        candidates.push_back({fresh->residuals[static_cast<size_t>(row)], -1, row});
      }
      r.offered += n_fresh;
      std::stable_sort(candidates.begin(), candidates.end(),
                       [](const Candidate& a, const Candidate& z) { return a.residual > z.residual; });
      const auto keep = static_cast<size_t>(std::min<int64_t>(s.capacity, static_cast<int64_t>(candidates.size())));
      for (size_t i = keep; i < candidates.size(); ++i) {
        if (candidates[i].slot >= 0) free_slot(candidates[i].slot);
      }
      int64_t slot = 0;
      for (size_t i = 0; i < keep; ++i) {
        if (candidates[i].slot >= 0) continue;
        while (owner[slot] >= 0) ++slot;  // a free slot exists: clusters ≤ max_clusters, each ≤ capacity
        owner[slot] = c;
        residual[slot] = candidates[i].residual;
        written.push_back(b * S + slot);
        k_rows.push_back(fresh->k[candidates[i].row]);
        v_rows.push_back(fresh->v[candidates[i].row]);
        if (differentiable) sources.push_back(b * k_source.size(1) + fresh->indices[static_cast<size_t>(candidates[i].row)]);
      }
    }
    r.held += s.held(b);
  }
  r.stored = static_cast<int64_t>(written.size());
  if (!freed.empty() || !written.empty()) {
    s.k = clone(store.k);
    s.v = clone(store.v);
  }
  // The differentiable reconstructions start from the previous ones (or the decoded codes) and change where the
  // codes change: freed slots become zero, written ones x̂ + (x − stop_grad(x)).
  if (differentiable) {
    const auto dtype = k_source.scalar_type();
    s.k_hat = (store.k_hat.defined() ? store.k_hat : dequantize_kv_cache(store.k, dtype)).flatten(0, 1);
    s.v_hat = (store.v_hat.defined() ? store.v_hat : dequantize_kv_cache(store.v, dtype)).flatten(0, 1);
  }
  if (!freed.empty()) {
    const auto index = torch::tensor(freed, torch::kLong);
    clear_slots(s.k, index);
    clear_slots(s.v, index);
    if (differentiable) {
      s.k_hat = s.k_hat.index_fill(0, index, 0.0);
      s.v_hat = s.v_hat.index_fill(0, index, 0.0);
    }
  }
  if (!written.empty()) {
    const auto index = torch::tensor(written, torch::kLong);
    const auto k64 = torch::stack(k_rows).detach().to(torch::kCPU, torch::kDouble);
    const auto v64 = torch::stack(v_rows).detach().to(torch::kCPU, torch::kDouble);
    const auto qk = quantize_rows(k64);
    const auto qv = quantize_rows(v64);
    r.max_reconstruction_error = std::max((dequantize_kv_cache(qk, torch::kDouble) - k64).abs().max().item<double>(),
                                          (dequantize_kv_cache(qv, torch::kDouble) - v64).abs().max().item<double>());
    write_slots(s.k, index, qk);
    write_slots(s.v, index, qv);
    if (differentiable) {
      const auto rows = torch::tensor(sources, torch::kLong).to(k_source.device());
      const auto straight = [&](const QuantizedKv& q, const torch::Tensor& source) {
        const auto x = source.flatten(0, 1).index_select(0, rows);
        return dequantize_kv_cache(q, x.scalar_type()).to(x.device()) + (x - x.detach());
      };
      s.k_hat = s.k_hat.index_copy(0, index.to(k_source.device()), straight(qk, k_source));
      s.v_hat = s.v_hat.index_copy(0, index.to(v_source.device()), straight(qv, v_source));
    }
  }
  if (differentiable) {
    s.k_hat = s.k_hat.view(s.k.codes.sizes());
    s.v_hat = s.v_hat.view(s.v.codes.sizes());
  }
  r.bytes = s.bytes();
  return out;
}

OutlierAttention outlier_attention(const torch::Tensor& q, const OutlierStore& store) {
  const auto decoded = [&](const torch::Tensor& hat, const QuantizedKv& codes) {
    return hat.defined() ? hat.to(q.scalar_type()) : dequantize_kv_cache(codes, q.scalar_type()).to(q.device());
  };
  const auto k_hat = decoded(store.k_hat, store.k);
  const auto visible =
      torch::tensor(store.owner, torch::kLong).ge(0).view({store.batch_size(), 1, store.slots(), 1}).to(q.device());
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const auto logits = torch::einsum("bthd,bshd->btsh", {q, k_hat}) * scale;
  OutlierAttention out;
  out.logits = logits.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  out.values = decoded(store.v_hat, store.v);
  return out;
}

}  // namespace attnmix::stream
