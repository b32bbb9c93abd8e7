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

namespace attnmix::stream {

/// One layer's far-field mixtures, one per stream. B streams, H heads, C = max_clusters, d = head_dim.
/// Slots at and beyond n_clusters[b] are inactive and all zero.
struct ClusterBank {
  torch::Tensor count;     ///< (B, H, C) soft token counts
  torch::Tensor mu_k;      ///< (B, H, C, d)
  torch::Tensor mu_v;      ///< (B, H, C, d)
  torch::Tensor sigma_kk;  ///< (B, H, C, d) diagonal key variances
  torch::Tensor sigma_vk;  ///< (B, H, C, d, d) Cov(v, k), row = value dim
  std::vector<int64_t> n_clusters;  ///< (B) live prefix per stream, shared by its heads
  /// C, the slots per stream and head (the third dimension of every tensor).
  int64_t max_clusters = 0;

  /// B, the number of streams (the entries of n_clusters).
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
  torch::Tensor out;     ///< (B, t, n, H, d): out_c(q) = μ_v + Σ_vk q/√d, 0 for slots beyond a stream's live prefix
  torch::Tensor logits;  ///< (B, t, n, H): logit_c(q), −∞ for slots beyond a stream's live prefix
};
/// The MGF logits and outputs of the bank's live clusters for the un-rotated queries q (B, t, H, d), differentiable
/// in q and the bank. Cost O(B·t·H·n·d²).
/// @throws ValueError unless q is (B, t, H, d) with the bank's B, H, d, dtype and device.
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
  /// The chunk founded a new cluster, in the first free slot (after the budget rule's merge, if any).
  bool birthed = false;
  /// The birth absorbed the whole chunk (its count, means and moments), so the soft update skips this stream;
  /// set together with birthed.
  bool birth_incorporated_batch = false;
  std::vector<std::pair<int64_t, int64_t>> merged;  ///< (i, j): j was merged into i
  /// The distance of each merged pair, in the order of merged (RMS over heads and dimensions of the standardised
  /// key-mean difference).
  std::vector<double> merge_distances;
  std::map<int64_t, double> misfit;                 ///< per live cluster: mean residual norm of its members
  /// Per live cluster with members in the chunk: its BirthMergeOptions::outlier_top_k worst-predicted tokens.
  std::map<int64_t, OutlierTokens> per_cluster_outlier_tokens;
  /// The stream's misfit: the clusters' misfits averaged with their head-mean counts as weights (0 without clusters).
  double misfit_scalar = 0.0;
  // ingest_cluster_batch
  /// ingest_cluster_batch: the chunk joined the live clusters by the responsibility-weighted soft update (the stream
  /// has clusters and no birth absorbed the chunk).
  bool soft_update_applied = false;
  /// ingest_cluster_batch: per head, how much the bank's total count grew (H entries; t when conserved).
  std::vector<double> ingested_tokens_per_head;
  /// ingest_cluster_batch: t, the growth every head must show.
  int64_t expected_ingested_tokens_per_head = 0;
  /// ingest_cluster_batch: every head grew by t within the conservation tolerance (otherwise it throws).
  bool count_conserved = true;
  // MomentClosureAttention accounting
  /// The one-token/one-representation accounting of one stream after an eviction (evict_to_far_field): every
  /// position seen is in the window or in the bank, exactly once.
  struct Accounting {
    int64_t positions_seen = 0;   ///< tokens the stream has seen, the chunk included (pos + t)
    int64_t near_tokens = 0;      ///< tokens in the window after the chunk (the cache's length)
    int64_t evicted_tokens = 0;   ///< tokens evicted into the bank by this chunk
    std::vector<double> far_tokens_per_head;  ///< per head, the bank's total count Σ_c n_c after the eviction
    int64_t expected_far_tokens_per_head = 0;  ///< positions_seen − near_tokens
    /// Tokens also held as exact copies in the outlier store (counted once, in the bank); 0 without a store.
    int64_t overlap_tokens = 0;
    bool conserved = true;  ///< every head's far tokens equal the expected count within tolerance (otherwise it throws)
  };
  /// Set by evict_to_far_field (MomentClosureAttention's layers); nullopt for a bare ingest_cluster_batch.
  std::optional<Accounting> accounting;
};

/// The birth and merge rule of birth_and_merge and ingest_cluster_batch
/// (`docs/mechanisms.md#moment-closure-far-field`).
struct BirthMergeOptions {
  /// kThreshold: the chunk founds a cluster when its mean key's best logit lies below this on every head (and a slot
  /// is free).
  double birth_threshold = -2.0;
  std::optional<double> merge_threshold;  ///< default 2.65 + 6/√max(n_small, 1)
  /// Outlier tokens reported per cluster in StreamReceipt::per_cluster_outlier_tokens (non-negative).
  int64_t outlier_top_k = 4;
  /// kThreshold (births and merges by the thresholds) or kBudget (every chunk births; the closest pair merges to
  /// make room; the thresholds are not used).
  ClusterRule cluster_rule = ClusterRule::kThreshold;
};

/// What birth_and_merge and ingest_cluster_batch return.
struct IngestResult {
  ClusterBank bank;  ///< the bank after the step
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
/// @throws ValueError for what birth_and_merge rejects.
/// @throws StateError for a non-finite cluster distance, or "cluster ingestion did not count every observation
///   exactly once …".
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

/// What quantize_cluster_outliers returns.
struct OutlierStoreUpdate {
  OutlierStore store;           ///< the store after the outliers joined it
  OutlierStoreReceipt receipt;  ///< what the update did, summed over the streams
};

/// Closes the moment-closure storage seam (the outlier store of kv_quantization.hpp): the outliers of one ingestion
/// (one StreamReceipt per stream, with the bank after it, whose n_clusters says how many clusters each stream has)
/// enter the store. Slot owners first follow the
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
  int64_t batch_size = 0;              ///< B, the number of streams
  std::vector<StreamReceipt> streams;  ///< one per stream, each with its accounting
  double misfit_scalar = 0.0;          ///< the mean of the streams' StreamReceipt::misfit_scalar
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
  ClusterBank bank;      ///< the bank after the evicted tokens joined it
  LayerReceipt receipt;  ///< the layer's receipt (far_attention_share and outliers are left to the caller)
};

/// Eviction, for one layer: the raw keys and values leaving the window, k_evicted and v_evicted
/// (B, e, H, d), join the bank by ingest_cluster_batch (with e = 0 the bank is unchanged and each stream gets the
/// null receipt); then each stream's receipt gets its accounting (positions_seen, near_tokens, evicted_tokens = e,
/// far tokens per head = positions_seen − near_tokens) and the layer's misfit is the mean over streams.
/// @throws ValueError for what ingest_cluster_batch rejects.
/// @throws StateError as ingest_cluster_batch, and ("one-token/one-representation", naming `label`) when the far
///   tokens do not add up.
FarFieldUpdate evict_to_far_field(const ClusterBank& bank, const torch::Tensor& k_evicted,
                                  const torch::Tensor& v_evicted, int64_t positions_seen, int64_t near_tokens,
                                  const BirthMergeOptions& options, const std::string& label);

/// Sizes and far-field settings of MomentClosureAttention (`docs/mechanisms.md#moment-closure-far-field`).
struct MomentClosureOptions {
  int64_t vocab = 256;       ///< V, the number of token ids
  int64_t d_model = 32;      ///< d, the residual width (a multiple of n_head)
  int64_t n_layer = 2;       ///< Transformer layers, each with its own bank
  int64_t n_head = 2;        ///< H, heads per layer; head_dim = d_model / n_head must be even (RoPE)
  int64_t window = 16;       ///< the exact near field: tokens a query sees, itself included (positive)
  int64_t max_clusters = 4;  ///< C, clusters per layer, stream and head (positive)
  double birth_threshold = -2.0;  ///< threshold rule: a chunk whose best logit is below this on every head births
  std::optional<double> merge_threshold;  ///< threshold rule: merge distance; nullopt: 2.65 + 6/√max(n_small, 1)
  int64_t outlier_capacity = 0;  ///< per layer, stream and cluster, outliers kept exactly (int8); 0: no store
  ClusterRule cluster_rule = ClusterRule::kThreshold;  ///< births and merges by the thresholds or by the budget
};

/// What MomentClosureAttention carries between chunks: the window caches of every layer, and per layer the bank of
/// the tokens evicted from them (and the outlier store).
struct MomentClosureState {
  SlidingWindowState near;  ///< the layers' raw key and value caches and the position, as SlidingWindowSpine's
  std::vector<ClusterBank> banks;  ///< one per layer
  std::vector<OutlierStore> stores;  ///< one per layer when outlier_capacity > 0, else none
  int64_t batch_size = 0;  ///< b, the number of streams
  bool detach_horizon_clusters = true;  ///< detach() also stop-grads the banks

  /// Bytes held by the caches, the banks and the stores.
  int64_t bytes() const;
};

/// What MomentClosureAttention::advance returns.
struct MomentClosureOutput {
  MomentClosureState state;  ///< the state after the chunk (caches, banks and stores advanced)
  torch::Tensor logits;  ///< (b, t, vocab)
};

/// A ContextMechanism over the spine's parameters (same construction order as SlidingWindowSpine, so a
/// seed gives both the same initial weights). Each layer's attention is moment_closure_sublayer
/// (self_attention.hpp).
class MomentClosureAttentionImpl : public torch::nn::Module {
 public:
  /// The state this mechanism carries between chunks (ContextMechanism).
  using state_type = MomentClosureState;

  /// @throws ValueError for invalid sizes or a non-finite threshold.
  explicit MomentClosureAttentionImpl(const MomentClosureOptions& options);

  /// An empty state for batch_size streams: empty caches, and per layer an all-zero bank in the parameters' dtype on
  /// `device` (and an empty outlier store when outlier_capacity > 0). @throws ValueError unless batch_size is positive.
  MomentClosureState init_state(int64_t batch_size, torch::Device device = torch::kCPU) const;
  /// Runs one chunk x (b, t) of int64 ids: logits of every position and the advanced state, after checking that
  /// every bank holds exactly the evicted tokens; the layers' receipts are kept for last_receipts().
  /// @throws ValueError for a bad chunk or a state that does not fit ("batch size");
  ///   StateError ("one-token/one-representation") when the conservation receipts fail.
  MomentClosureOutput advance(const MomentClosureState& state, const torch::Tensor& x);
  /// advance() plus the mean cross-entropy against y (same shape as x).
  /// @throws ValueError for what advance() rejects and for a bad y.
  /// @throws StateError when advance()'s conservation receipts fail.
  MechanismStep<MomentClosureState> step(const MomentClosureState& state, const torch::Tensor& x,
                                         const torch::Tensor& y);
  /// Stop-gradient on the caches and the stores, and on the banks when state.detach_horizon_clusters is set.
  MomentClosureState detach(const MomentClosureState& state) const;

  /// The sizes and far-field settings the mechanism was built with.
  const MomentClosureOptions& options() const { return options_; }
  /// h_d = d_model / n_head.
  int64_t head_dim() const { return options_.d_model / options_.n_head; }
  /// The parameters, laid out as SlidingWindowSpine's (registered as "backbone").
  SpineBackbone& backbone() { return backbone_; }
  /// Receipts of the last step, one per layer, and their mean misfit.
  const std::vector<LayerReceipt>& last_receipts() const { return last_receipts_; }
  /// The mean over layers of the last step's LayerReceipt::misfit_scalar (0 before the first step).
  double last_misfit() const { return last_misfit_; }

 private:
  MomentClosureOutput advance_checked(const MomentClosureState& state, const torch::Tensor& x);

  MomentClosureOptions options_;
  SpineBackbone backbone_{nullptr};
  std::vector<LayerReceipt> last_receipts_;
  double last_misfit_ = 0.0;
};
/// MomentClosureAttention, the module holder of MomentClosureAttentionImpl (libtorch's TORCH_MODULE).
TORCH_MODULE(MomentClosureAttention);

static_assert(ContextMechanism<MomentClosureAttentionImpl>);

}  // namespace attnmix::stream
