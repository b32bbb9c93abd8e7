// SPDX-License-Identifier: Apache-2.0
/// @file moment_closure.hpp
/// Moment-closure attention (`docs/mechanisms.md#moment-closure-far-field`): per layer, an exact sliding window (the
/// near field of context_spine.hpp) plus a streaming Gaussian mixture, a cluster bank, over the (key, value) pairs
/// evicted from the window (the far field). Each query attends to near tokens and far clusters in one joint softmax.
///
/// Cluster c of head h in stream b holds a soft count n_c, means μ_k, μ_v, diagonal key variances σ²_kk and the full
/// cross-covariance Σ_vk = Cov(v, k) (row = value dim). For a query q (d = head_dim):
///   logit_c(q) = q·μ_k/√d + (1/2d) Σ_j q_j² σ²_kk,j + log max(n_c, 1e-8)   ≈ log Σ_{tokens in c} e^{q·k/√d}
///   out_c(q)   = μ_v + Σ_vk q/√d                                          (the MGF identity)
/// Evicted tokens join the bank by a differentiable Chan/Welford combination weighted by their responsibilities
/// softmax_c logit_c(k), after a once-per-chunk birth/merge step; conservation receipts check that every token
/// seen is represented exactly once (in the window or in the bank). Every stream of a batch has its own mixture.
/// Cost per query O(window·d + C·d²), state O(layers·B·(window·d + C·H·d²)), both independent of stream length.
#pragma once

#include "attnmix/stream/cluster_rule.hpp"
#include "attnmix/stream/context_spine.hpp"
#include "attnmix/stream/kv_quantization.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <string>
#include <vector>

namespace attnmix {

/// One layer's far-field mixtures, one per stream. B streams, H heads, C = max_clusters, d = head_dim.
/// Slots at and beyond n_clusters[b] are inactive and all zero.
struct ClusterBank {
  torch::Tensor count;     ///< (B, H, C) soft token counts
  torch::Tensor mu_k;      ///< (B, H, C, d)
  torch::Tensor mu_v;      ///< (B, H, C, d)
  torch::Tensor sigma_kk;  ///< (B, H, C, d) diagonal key variances
  torch::Tensor sigma_vk;  ///< (B, H, C, d, d) Cov(v, k), row = value dim
  std::vector<int64_t> n_clusters;  ///< (B) live prefix per stream, shared by its heads
  int64_t max_clusters = 0;

  int64_t batch_size() const { return static_cast<int64_t>(n_clusters.size()); }
  /// Stop-gradient on every tensor.
  ClusterBank detach() const;
  /// Per stream and head, the live total count Σ_c n_c: (B, H).
  torch::Tensor total_per_head() const;
  /// Bytes held by the tensors.
  int64_t bytes() const;
};

/// Checks a bank built by hand (the functions below take its invariants for granted): the shapes agree
/// ((B, H, C), (B, H, C, d) ×3, (B, H, C, d, d), B, H, C, d > 0), every tensor has count's dtype and device,
/// max_clusters = C, n_clusters has B entries in [0, C], every value is finite, counts and key variances are ≥ 0, and
/// the inactive slots are all zero. @throws ValueError naming `where` and the field.
void validate_cluster_bank(const ClusterBank& bank, const std::string& where);

/// An all-zero bank. @throws ValueError unless every size is positive.
ClusterBank empty_cluster_bank(int64_t batch_size, int64_t n_head, int64_t max_clusters, int64_t head_dim,
                               torch::TensorOptions options = torch::kFloat32);

/// Far-field attention against the bank: q (B, t, H, d) →
/// out (B, t, n, H, d) and logits (B, t, n, H) with n = max_b n_clusters[b]; slots beyond a stream's live prefix
/// get logit −∞ and output 0; with n = 0 both are empty.
struct ClusterAttention {
  torch::Tensor out;
  torch::Tensor logits;
};
ClusterAttention mgf_cluster_attention(const torch::Tensor& q, const ClusterBank& bank);

/// softmax_c logit_c(k) over each stream's live clusters, zero beyond them and for streams without clusters:
/// (B, t, H, C).
torch::Tensor cluster_responsibilities(const torch::Tensor& k, const ClusterBank& bank);

/// The differentiable Chan/Welford combination of the bank with a batch of tokens k, v (B, t, H, d) weighted by
/// responsibilities r (B, t, H, C). Population moments; n₁ = 0 leaves a slot unchanged.
ClusterBank update_cluster_bank(const ClusterBank& bank, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& r);

/// The tokens of one cluster with the largest misfit residuals.
struct OutlierTokens {
  torch::Tensor k;               ///< (n_out, H, d)
  torch::Tensor v;               ///< (n_out, H, d)
  std::vector<int64_t> indices;  ///< token indices within the stream, largest residual first
  std::vector<double> residuals;  ///< their residual norms (head mean), in the same order
  std::vector<int64_t> member_indices;  ///< every member token of the cluster, ascending
};

/// What ingestion did to one stream's bank.
struct StreamReceipt {
  bool birthed = false;
  bool birth_incorporated_batch = false;
  std::vector<std::pair<int64_t, int64_t>> merged;  ///< (i, j): j was merged into i
  std::vector<double> merge_distances;
  std::map<int64_t, double> misfit;                 ///< per live cluster: mean residual norm of its members
  std::map<int64_t, OutlierTokens> per_cluster_outlier_tokens;
  double misfit_scalar = 0.0;
  // ingest_cluster_batch
  bool soft_update_applied = false;
  std::vector<double> ingested_tokens_per_head;
  int64_t expected_ingested_tokens_per_head = 0;
  bool count_conserved = true;
  // MomentClosureAttention accounting
  struct Accounting {
    int64_t positions_seen = 0;
    int64_t near_tokens = 0;
    int64_t evicted_tokens = 0;
    std::vector<double> far_tokens_per_head;
    int64_t expected_far_tokens_per_head = 0;
    int64_t overlap_tokens = 0;
    bool conserved = true;
  };
  std::optional<Accounting> accounting;
};

struct BirthMergeOptions {
  double birth_threshold = -2.0;
  std::optional<double> merge_threshold;  ///< default 2.65 + 6/√max(n_small, 1)
  int64_t outlier_top_k = 4;
  ClusterRule cluster_rule = ClusterRule::kThreshold;
};

struct IngestResult {
  ClusterBank bank;
  std::vector<StreamReceipt> receipts;  ///< one per stream
};

/// Birth, merge and the misfit receipt, per stream, from the chunk's raw k, v (B, t, H, d).
/// Decisions and birth statistics are detached; merges combine the bank's own (differentiable) statistics.
/// @throws ValueError for shapes, device/dtype, non-finite values or a negative outlier_top_k;
///   StateError for a non-finite cluster distance.
IngestResult birth_and_merge(const ClusterBank& bank, const torch::Tensor& k, const torch::Tensor& v,
                             const BirthMergeOptions& options = {});

/// Birth/merge on detached k, v, then (for streams with clusters whose batch no birth absorbed) the
/// soft update with r = cluster_responsibilities(k); checks that every head's total grew by exactly t.
/// @throws as birth_and_merge; StateError "cluster ingestion did not count every observation exactly once …".
IngestResult ingest_cluster_batch(const ClusterBank& bank, const torch::Tensor& k, const torch::Tensor& v,
                                  const BirthMergeOptions& options = {});

/// Checks a store built by hand against the bank of its layer (quantize_cluster_outliers and outlier_attention take
/// these invariants for granted): capacity > 0; codes int8 (B, S, H, d) with B, H, d the bank's and
/// S = max_clusters · capacity; low and scale float32 (B, S, H), finite, scales ≥ 0; owner and residual B·S entries;
/// every owner −1 (free) or a live cluster of its stream, at most `capacity` slots per cluster; residuals finite and
/// ≥ 0; free slots all zero; k_hat and v_hat both undefined, or both floating (B, S, H, d) and finite; every tensor
/// on the bank's device. @throws ValueError naming `where` and the field (prefix + "owner" + suffix, …).
void validate_outlier_store(const OutlierStore& store, const ClusterBank& bank, const std::string& where,
                            const std::string& prefix = "", const std::string& suffix = "");

struct OutlierStoreUpdate {
  OutlierStore store;
  OutlierStoreReceipt receipt;
};

/// Closes the moment-closure storage seam (the outlier store of kv_quantization.hpp): the outliers of one ingestion (one StreamReceipt per stream, with the bank
/// after it, whose n_clusters says how many clusters each stream has) enter the store. Slot owners first follow the
/// receipt's merges (j merged into i, then the last cluster moved into j); then each cluster keeps the `capacity`
/// largest residuals among its stored tokens and its new outliers (ties: the stored token stays).
/// k_source, v_source: the evicted tokens the receipts were made from (B, e, H, d), or undefined; when they are given
/// and gradients are on, the result's k_hat, v_hat carry the gradient to them (kv_quantization.hpp).
/// @throws ValueError when the receipts do not fit the store (count, heads, head_dim).
OutlierStoreUpdate quantize_cluster_outliers(const OutlierStore& store, const std::vector<StreamReceipt>& receipts,
                                             const std::vector<int64_t>& n_clusters,
                                             const torch::Tensor& k_source = {}, const torch::Tensor& v_source = {});

/// Per layer, what the last step did: one receipt per stream and the mean misfit over streams.
struct LayerReceipt {
  int64_t batch_size = 0;
  std::vector<StreamReceipt> streams;
  double misfit_scalar = 0.0;
  std::optional<OutlierStoreReceipt> outliers;  ///< with an outlier store: what its update did
  /// The far field's share of the chunk's attention: the softmax weight on the clusters and the stored tokens,
  /// mean over streams, heads and the chunk's queries (0 while the far field is empty; the window has the rest).
  double far_attention_share = 0.0;
};

/// The representation receipt before a step: at position pos with c tokens in the window, each
/// stream's bank must hold exactly pos − c tokens per head. `label` names the layer in the message.
/// @throws StateError ("one-token/one-representation") otherwise.
void check_far_field_accounting(const ClusterBank& bank, int64_t pos, int64_t cache_len, const std::string& label);

/// What evict_to_far_field returns: the bank after the evicted tokens joined it and the layer's receipt.
struct FarFieldUpdate {
  ClusterBank bank;
  LayerReceipt receipt;
};

/// Eviction, for one layer: the raw keys and values leaving the window, k_evicted and v_evicted
/// (B, e, H, d), join the bank by ingest_cluster_batch (with e = 0 the bank is unchanged and each stream gets the
/// null receipt); then each stream's receipt gets its accounting (positions_seen, near_tokens, evicted_tokens = e,
/// far tokens per head = positions_seen − near_tokens) and the layer's misfit is the mean over streams.
/// @throws what ingest_cluster_batch throws; StateError ("one-token/one-representation", naming `label`) when the
///   far tokens do not add up.
FarFieldUpdate evict_to_far_field(const ClusterBank& bank, const torch::Tensor& k_evicted,
                                  const torch::Tensor& v_evicted, int64_t positions_seen, int64_t near_tokens,
                                  const BirthMergeOptions& options, const std::string& label);

/// Sizes and far-field settings of MomentClosureAttention (`docs/mechanisms.md#moment-closure-far-field`).
struct MomentClosureOptions {
  int64_t vocab = 256;
  int64_t d_model = 32;
  int64_t n_layer = 2;
  int64_t n_head = 2;
  int64_t window = 16;
  int64_t max_clusters = 4;
  double birth_threshold = -2.0;
  std::optional<double> merge_threshold;
  int64_t outlier_capacity = 0;  ///< per layer, stream and cluster, outliers kept exactly (int8); 0: no store
  ClusterRule cluster_rule = ClusterRule::kThreshold;
};

struct MomentClosureState {
  SlidingWindowState near;
  std::vector<ClusterBank> banks;  ///< one per layer
  std::vector<OutlierStore> stores;  ///< one per layer when outlier_capacity > 0, else none
  int64_t batch_size = 0;
  bool detach_horizon_clusters = true;  ///< detach() also stop-grads the banks

  /// Bytes held by the caches, the banks and the stores.
  int64_t bytes() const;
};

struct MomentClosureOutput {
  MomentClosureState state;
  torch::Tensor logits;  ///< (b, t, vocab)
};

/// A ContextMechanism over the spine's parameters (same construction order as SlidingWindowSpine, so a
/// seed gives both the same initial weights). Each layer's attention is moment_closure_sublayer
/// (self_attention.hpp).
class MomentClosureAttentionImpl : public torch::nn::Module {
 public:
  using state_type = MomentClosureState;

  /// @throws ValueError for invalid sizes or a non-finite threshold.
  explicit MomentClosureAttentionImpl(const MomentClosureOptions& options);

  MomentClosureState init_state(int64_t batch_size, torch::Device device = torch::kCPU) const;
  /// @throws ValueError for a bad chunk or a state that does not fit ("batch size");
  ///   StateError ("one-token/one-representation") when the conservation receipts fail.
  MomentClosureOutput advance(const MomentClosureState& state, const torch::Tensor& x);
  MechanismStep<MomentClosureState> step(const MomentClosureState& state, const torch::Tensor& x,
                                         const torch::Tensor& y);
  MomentClosureState detach(const MomentClosureState& state) const;

  const MomentClosureOptions& options() const { return options_; }
  int64_t head_dim() const { return options_.d_model / options_.n_head; }
  SpineBackbone& backbone() { return backbone_; }
  /// Receipts of the last step, one per layer, and their mean misfit.
  const std::vector<LayerReceipt>& last_receipts() const { return last_receipts_; }
  double last_misfit() const { return last_misfit_; }

 private:
  MomentClosureOutput advance_checked(const MomentClosureState& state, const torch::Tensor& x);

  MomentClosureOptions options_;
  SpineBackbone backbone_{nullptr};
  std::vector<LayerReceipt> last_receipts_;
  double last_misfit_ = 0.0;
};
TORCH_MODULE(MomentClosureAttention);

static_assert(ContextMechanism<MomentClosureAttentionImpl>);

}  // namespace attnmix
