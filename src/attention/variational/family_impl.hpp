// SPDX-License-Identifier: Apache-2.0
// What the descriptors of the two variational families share (private). Their model files keep the Adam state beside
// params, as "optimizer_state" (optimizer_state_to_json). A file without it loads with a fresh state (the
// constructor's default); a state that does not belong to the params (another family or geometry, mean/log_var not
// bit-identical) is rejected by the constructor, and the message names the field.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "attnmix/attention/optimizer_state.hpp"
#include "attnmix/core/any.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/core/json.hpp"

#include <nlohmann/json.hpp>

namespace attnmix::detail {

/// The optimizer state of a model object, when it has one.
inline std::optional<AttentionOptimizerState> state_from_json(const ModelJsonField* state) {
  if (!state) return std::nullopt;
  return optimizer_state_from_json(*state);
}

/// Runs a variational constructor: errors about the optimizer state name the "optimizer_state" field
/// ("model.json: optimizer_state.mean and …"), the others the params member as ModelJsonField::construct does.
template <class F>
AnyDistribution construct_variational(const ModelJsonField& params, const ModelJsonField* state,
                                      std::string_view family_where, F&& make) {
  try {
    return make();
  } catch (const std::invalid_argument& e) {
    const std::string_view message = e.what();
    const std::string prefix = std::string(family_where) + ": ";
    if (state && message.substr(0, prefix.size()) == prefix &&
        message.substr(prefix.size()).rfind("optimizer_state", 0) == 0) {
      // state->path() ends in "optimizer_state"; the message goes on from that word.
      const std::string& path = state->path();
      const std::string parent = path.substr(0, path.size() - std::string("optimizer_state").size());
      throw ValueError(state->source() + ": " + parent + std::string(message.substr(prefix.size())));
    }
    // Every other error: construct() names the params member (rethrowing the error being handled).
    return params.construct(family_where, [&]() -> AnyDistribution { throw; });
  }
}

/// ModelCodec::state_to_json: the model's Adam state.
template <class Model>
nlohmann::json state_to_json(const AnyDistribution& model) {
  return optimizer_state_to_json(model.get_if<Model>()->optimizer_state());
}

/// A fit from a saved model continues its Adam trajectory: " (its Adam trajectory goes on after step 3)".
template <class Model>
std::string adam_resume_note(const AnyDistribution& init) {
  return " (its Adam trajectory goes on after step " +
         std::to_string(init.get_if<Model>()->optimizer_state().iteration) + ")";
}

}  // namespace attnmix::detail
