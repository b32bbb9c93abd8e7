// SPDX-License-Identifier: Apache-2.0
// The parameters of an `attnmix lm train` checkpoint copied into a backbone; see
// include/attnmix/stream/checkpoint_weights.hpp.
#include "attnmix/stream/checkpoint_weights.hpp"

#include "attnmix/stream/language_model.hpp"

#include <torch/torch.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace attnmix::stream {
namespace {

[[noreturn]] void bad_weights(const std::string& path, const std::string& why) {
  throw std::runtime_error(path + ": cannot load the checkpoint's weights: " + why);
}

std::string shape_text(c10::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + "]";
}

// The tensor stored under parts[i] / parts[i+1] / … (nested archives, one per module of the path), undefined when
// the path is absent.
torch::Tensor read_path(torch::serialize::InputArchive& archive, const std::vector<std::string>& parts, size_t i) {
  torch::Tensor out;
  if (i + 1 == parts.size()) {
    if (!archive.try_read(parts[i], out)) return {};
    return out;
  }
  torch::serialize::InputArchive child;
  if (!archive.try_read(parts[i], child)) return {};
  return read_path(child, parts, i + 1);
}

std::vector<std::string> split_path(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', start)) {
    parts.push_back(key.substr(start, dot - start));
    start = dot + 1;
  }
  parts.push_back(key.substr(start));
  return parts;
}

}  // namespace

void load_checkpoint_weights(const std::string& path, torch::nn::Module& mechanism) {
  static_cast<void>(stream::read_checkpoint_info(path));  // the file's integrity, format and options
  torch::serialize::InputArchive root;
  torch::serialize::InputArchive model;
  try {
    root.load_from(path);
  } catch (const c10::Error&) {
    bad_weights(path, "the file is not a torch archive");
  }
  if (!root.try_read("model", model)) bad_weights(path, "the archive has no \"model\" record");
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (parameter, stored value)
  for (const auto& p : mechanism.named_parameters()) {
    const std::string& key = p.key();
    torch::Tensor stored;
    try {
      stored = read_path(model, split_path(key), 0);
    } catch (const c10::Error&) {
      bad_weights(path, "parameter " + key + " is not a tensor");
    }
    if (!stored.defined()) bad_weights(path, "the model record has no parameter " + key);
    if (stored.sizes() != p.value().sizes()) {
      bad_weights(path, "parameter " + key + " has shape " + shape_text(stored.sizes()) + ", the model needs " +
                            shape_text(p.value().sizes()));
    }
    if (stored.scalar_type() != torch::kFloat) bad_weights(path, "parameter " + key + " must be float32");
    if (!torch::isfinite(stored).all().item<bool>()) bad_weights(path, "parameter " + key + " has a non-finite value");
    copies.emplace_back(p.value(), std::move(stored));
  }
  torch::NoGradGuard no_grad;
  for (auto& [parameter, stored] : copies) parameter.copy_(stored);
}

}  // namespace attnmix::stream
