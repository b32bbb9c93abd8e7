// SPDX-License-Identifier: Apache-2.0
/// @file kv_quantization.hpp
/// Int8 storage for attention keys and values, and the outlier store of moment closure ("moment closure +
/// outliers").
///
/// Affine int8 quantisation, one scale per row (a row = the last dimension, e.g. one head of one token):
///   low = min_j x_j,  scale = (max_j x_j − low) / 255,  code_j = round((x_j − low) / scale) − 128  ∈ [−128, 127]
///   x̂_j = low + (code_j + 128) · scale,   |x_j − x̂_j| ≤ scale / 2 (up to float32 rounding of low and scale)
/// A constant row has scale 0 and is reconstructed exactly. Cost O(n); storage n bytes + 8 bytes per row.
///
/// The outlier store keeps, per layer, stream and cluster, at most `capacity` of the evicted tokens that the cluster
/// predicts worst: the misfit receipt of birth_and_merge (moment_closure.hpp) reports per cluster the tokens whose
/// value is furthest from the cluster's regression on the key (per_cluster_outlier_tokens, with their residuals);
/// the store keeps the `capacity` largest residuals it has seen for the cluster, as int8 rows, and evicts the
/// smallest when a larger one arrives (quantize_cluster_outliers, moment_closure.hpp). Stored tokens are attended
/// exactly — logit q·k̂/√d, value v̂, the far field's
/// unrotated convention — in the same softmax as the window and the clusters. A stored token also stays in its
/// cluster's moments (the store is an exact copy next to the mixture, not a replacement), so the accounting counts
/// it once in the bank and reports the copies as overlap tokens. While training, the stored keys and values pass the
/// gradient straight through the rounding to the tokens they were made from (x̂ + (x − stop_grad(x))), so that the
/// keys and queries can learn to find them; detach() ends that, and the int8 codes are all a state keeps.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace attnmix::stream {

/// Int8 codes with one affine scale per row.
struct QuantizedKv {
  torch::Tensor codes;  ///< int8, the shape of the quantised tensor
  torch::Tensor low;    ///< float32, the shape without its last dimension: each row's minimum
  torch::Tensor scale;  ///< float32, as low: (max − min) / 255 of each row

  /// Bytes held by codes, low and scale.
  int64_t bytes() const;
};

/// Quantises a floating tensor (at least one dimension, last dimension ≥ 1) row by row.
/// @throws ValueError for an undefined, non-floating or zero-dimensional tensor, or a non-finite value.
QuantizedKv quantize_kv_cache(const torch::Tensor& x);

/// The reconstruction x̂ in dtype. @throws ValueError when codes, low and scale do not fit together.
torch::Tensor dequantize_kv_cache(const QuantizedKv& q, torch::ScalarType dtype = torch::kFloat32);

/// One layer's outlier store: B streams, S = max_clusters · capacity slots, H heads, d = head_dim.
struct OutlierStore {
  QuantizedKv k;              ///< codes (B, S, H, d)
  QuantizedKv v;              ///< codes (B, S, H, d)
  std::vector<int64_t> owner;     ///< B·S: the cluster a slot's token belongs to, −1 for a free slot
  std::vector<double> residual;   ///< B·S: the token's misfit residual when it was stored (0 for a free slot)
  int64_t capacity = 0;           ///< tokens per cluster and stream
  /// While training (gradients on): the reconstructions x̂ (B, S, H, d) of the keys (k_hat) and values (v_hat),
  /// equal to the decoded codes and carrying the gradient to the stored tokens' sources; undefined otherwise (then
  /// the codes are decoded).
  /// @{
  torch::Tensor k_hat;
  torch::Tensor v_hat;
  /// @}

  /// B, the number of streams (the first dimension of the key codes).
  int64_t batch_size() const { return k.codes.size(0); }
  /// S = max_clusters · capacity, the slots per stream (the second dimension of the key codes).
  int64_t slots() const { return k.codes.size(1); }
  /// Occupied slots of stream b.
  int64_t held(int64_t b) const;
  /// Bytes of the codes and scales (and of k_hat, v_hat while they exist).
  int64_t bytes() const;
  /// The store without k_hat and v_hat: the same values, no gradient.
  OutlierStore detach() const;
};

/// An empty store. @throws ValueError unless every size is positive.
OutlierStore empty_outlier_store(int64_t batch_size, int64_t n_head, int64_t max_clusters, int64_t head_dim,
                                 int64_t capacity);

/// What one update did to a layer's store, summed over its streams.
struct OutlierStoreReceipt {
  int64_t offered = 0;   ///< outlier tokens the receipts reported
  int64_t stored = 0;    ///< of those, tokens that entered the store
  int64_t evicted = 0;   ///< tokens that left the store for larger residuals (or a merge that over-filled a cluster)
  int64_t held = 0;      ///< occupied slots after the update
  int64_t bytes = 0;     ///< the store's size
  double max_reconstruction_error = 0.0;  ///< max |x − x̂| over the rows stored by this update
};

/// The store as attention terms for queries q (B, t, H, d): logits (B, t, S, H) = q·k̂/√d (−∞ for free slots) and
/// values (B, S, H, d) = v̂, in q's dtype and on its device.
struct OutlierAttention {
  torch::Tensor logits;  ///< (B, t, S, H): q·k̂/√d per query, slot and head; −∞ where the slot is free
  torch::Tensor values;  ///< (B, S, H, d): v̂ of every slot (free slots decode to zero rows, masked by the logits)
};
/// The store's logits and values for the unrotated queries q (B, t, H, d), d = head_dim, to be joined to the window's
/// and the clusters' terms in one softmax. Uses k_hat and v_hat while they exist (so the gradient reaches the
/// stored tokens' sources), otherwise decodes the int8 codes. Does not validate: q must be floating, with the
/// store's B, H and d. Cost O(B·t·S·H·d).
OutlierAttention outlier_attention(const torch::Tensor& q, const OutlierStore& store);

}  // namespace attnmix::stream
