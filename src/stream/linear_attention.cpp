// SPDX-License-Identifier: Apache-2.0
// Causal linear attention over the whole stream; see include/attnmix/stream/linear_attention.hpp.
#include "attnmix/stream/linear_attention.hpp"

#include "attnmix/core/errors.hpp"
#include "dense_products_impl.hpp"
#include "layered_state.hpp"

#include <string>
#include <utility>

namespace attnmix::stream {
namespace {

constexpr double kDenominatorFloor = 1e-6;  // ε of the header

std::string str(int64_t v) { return std::to_string(v); }

torch::Tensor positive_features(const torch::Tensor& z) { return torch::elu(z) + 1.0; }

// S₀ followed by the running sums S_1 … S_t: one cumulative sum along time over [S₀; terms], in float64. The sum
// runs token by token (a sequential scan), so a chunk that starts from S_t continues exactly where one pass would.
torch::Tensor running_sums(const torch::Tensor& initial, const torch::Tensor& terms) {
  return torch::cumsum(torch::cat({initial.unsqueeze(1), terms}, 1), 1).narrow(1, 1, terms.size(1));
}

}  // namespace

int64_t LinearAttentionState::bytes() const {
  int64_t total = 0;
  for (const auto& layer : layers) {
    for (const auto* t : {&layer.sum_kv, &layer.sum_k, &layer.last_x}) {
      if (t->defined()) total += t->numel() * static_cast<int64_t>(t->element_size());
    }
  }
  return total;
}

LinearFeatures linear_features(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& shift, const torch::Tensor& x,
                               const torch::Tensor& last_x, int64_t n_head) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2), hd = d / n_head;
  const auto previous = torch::cat({last_x.unsqueeze(1), x.narrow(1, 0, t - 1)}, 1);  // x_{i−1}, (b, t, d)
  const auto parts = detail::fast_linear(x, qkv.weight, qkv.bias).split(d, -1);
  const auto q = parts[0].reshape({b, t, n_head, hd});
  const auto k = (parts[1] + detail::fast_linear(previous, shift.weight, torch::Tensor())).reshape({b, t, n_head, hd});
  const auto v = parts[2].reshape({b, t, n_head, hd});
  // Products of float32 factors are exact in float64: each later term φ(k_j) v_jᵀ is exact in its inputs.
  return {positive_features(q).to(torch::kDouble), positive_features(k).to(torch::kDouble), v.to(torch::kDouble)};
}

std::vector<torch::nn::Linear> register_token_shifts(torch::nn::Module& module, int64_t d_model, int64_t n_layer) {
  std::vector<torch::nn::Linear> shifts;
  for (int64_t l = 0; l < n_layer; ++l) {
    auto shift = torch::nn::Linear(torch::nn::LinearOptions(d_model, d_model).bias(false));
    torch::NoGradGuard no_grad;
    shift->weight.zero_();
    shifts.push_back(module.register_module("shift" + str(l), shift));
  }
  return shifts;
}

LinearAttentionSublayerStep linear_attention_sublayer(torch::nn::LinearImpl& qkv, torch::nn::LinearImpl& proj,
                                                      torch::nn::LinearImpl& shift, const torch::Tensor& x,
                                                      const LinearAttentionLayerState& state, int64_t n_head) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
  const auto [phi_q, phi_k, v] = linear_features(qkv, shift, x, state.last_x, n_head);
  const auto terms = phi_k.unsqueeze(-1) * v.unsqueeze(-2);  // (b, t, H, h_d, h_d)
  const auto sums_kv = running_sums(state.sum_kv, terms);
  const auto sums_k = running_sums(state.sum_k, phi_k);  // (b, t, H, h_d)
  const auto numerator = (phi_q.unsqueeze(-1) * sums_kv).sum(-2);  // S_iᵀ φ(q_i), (b, t, H, h_d)
  const auto denominator = (phi_q * sums_k).sum(-1, true) + kDenominatorFloor;
  const auto attended = (numerator / denominator).to(x.scalar_type()).reshape({b, t, d});
  LinearAttentionSublayerStep step;
  step.out = detail::fast_linear(attended, proj.weight, proj.bias);
  // Copies, so that the state holds only the last sums, not the chunk's whole scan.
  step.state.sum_kv = sums_kv.select(1, t - 1).clone();
  step.state.sum_k = sums_k.select(1, t - 1).clone();
  step.state.last_x = x.select(1, t - 1).clone();
  return step;
}

LinearAttentionSpineImpl::LinearAttentionSpineImpl(const LinearAttentionOptions& options) : options_(options) {
  SpineOptions sizes;
  sizes.vocab = options_.vocab;
  sizes.d_model = options_.d_model;
  sizes.n_layer = options_.n_layer;
  sizes.n_head = options_.n_head;
  sizes.window = std::nullopt;
  validate_spine_options(sizes, "LinearAttentionSpine");
  backbone_ = register_module("backbone", SpineBackbone(options_.vocab, options_.d_model, options_.n_layer));
  shifts_ = register_token_shifts(*this, options_.d_model, options_.n_layer);
}

LinearAttentionState LinearAttentionSpineImpl::init_state(int64_t batch_size, torch::Device device) const {
  if (batch_size <= 0) {
    throw ValueError("LinearAttentionSpine.init_state: batch_size must be a positive integer (got " +
                     str(batch_size) + ")");
  }
  const int64_t H = options_.n_head, hd = head_dim();
  const auto sums = torch::TensorOptions().dtype(torch::kDouble).device(device);
  const auto rows = torch::TensorOptions().dtype(backbone_->tok->weight.scalar_type()).device(device);
  LinearAttentionState state;
  state.batch_size = batch_size;
  for (int64_t l = 0; l < options_.n_layer; ++l) {
    state.layers.push_back({torch::zeros({batch_size, H, hd, hd}, sums), torch::zeros({batch_size, H, hd}, sums),
                            torch::zeros({batch_size, options_.d_model}, rows)});
  }
  return state;
}

void LinearAttentionSpineImpl::check_state(const LinearAttentionState& s, int64_t b, const char* where) const {
  const std::string w(where);
  detail::check_state_frame(s.batch_size, s.pos, static_cast<int64_t>(s.layers.size()), b, options_.n_layer, w);
  const auto fits = &detail::tensor_fits;
  const int64_t H = options_.n_head, hd = head_dim();
  const auto dtype = backbone_->tok->weight.scalar_type();
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const auto& layer = s.layers[l];
    if (!fits(layer.sum_kv, {b, H, hd, hd}, torch::kDouble) || !fits(layer.sum_k, {b, H, hd}, torch::kDouble) ||
        !fits(layer.last_x, {b, options_.d_model}, dtype)) {
      throw ValueError(w + ": layer " + str(static_cast<int64_t>(l)) + " of the state must hold sum_kv (batch " +
                       str(b) + ", n_head " + str(H) + ", head_dim " + str(hd) + ", head_dim) and sum_k (batch, " +
                       "n_head, head_dim) in float64 and last_x (batch, d_model " + str(options_.d_model) +
                       ") in the parameters' dtype");
    }
  }
}

LinearAttentionOutput LinearAttentionSpineImpl::advance(const LinearAttentionState& state, const torch::Tensor& x) {
  validate_tokens(x, options_.vocab, "LinearAttentionSpine.advance");
  return advance_checked(state, x);
}

LinearAttentionOutput LinearAttentionSpineImpl::advance_checked(const LinearAttentionState& state,
                                                                const torch::Tensor& x) {
  check_state(state, x.size(0), "LinearAttentionSpine.step");
  auto [next, logits] = detail::advance_layers(
      *backbone_, state, x, [&](size_t l, SpineLayerImpl& layer, const torch::Tensor& h, const auto& layer_state) {
        auto attn = linear_attention_sublayer(*layer.qkv, *layer.proj, *shifts_[l], h, layer_state, options_.n_head);
        return std::pair{std::move(attn.out), std::move(attn.state)};
      });
  return {std::move(next), std::move(logits)};
}

MechanismStep<LinearAttentionState> LinearAttentionSpineImpl::step(const LinearAttentionState& state,
                                                                    const torch::Tensor& x, const torch::Tensor& y) {
  validate_chunk(x, y, options_.vocab, "LinearAttentionSpine.step");
  auto out = advance_checked(state, x);
  return {std::move(out.state), mean_cross_entropy(out.logits, y)};
}

LinearAttentionState LinearAttentionSpineImpl::detach(const LinearAttentionState& state) const {
  LinearAttentionState out = state;
  for (auto& layer : out.layers) {
    layer.sum_kv = layer.sum_kv.detach();
    layer.sum_k = layer.sum_k.detach();
    layer.last_x = layer.last_x.detach();
  }
  return out;
}

}  // namespace attnmix::stream
