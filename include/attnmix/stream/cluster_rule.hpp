// SPDX-License-Identifier: Apache-2.0
/// @file cluster_rule.hpp
/// The rule by which moment closure's far field births and merges clusters (moment_closure.hpp), torch-free so
/// that model configurations (language_model.hpp) can name it.
#pragma once

#include "attnmix/core/errors.hpp"

#include <string>

namespace attnmix::stream {

/// How the far field decides births and merges (docs/decisions/0010-cluster-budget.md).
///   kThreshold  a chunk births a cluster when its mean key fits none (best logit below birth_threshold in every
///               head) and a slot is free; two clusters merge whenever their distance is below merge_threshold.
///   kBudget     every chunk births its own cluster; when all max_clusters slots are live, the two closest (the
///               same distance) merge first to make room; there are no other merges, and birth_threshold and
///               merge_threshold are not used. A chunk unlike its successors (key-value pairs before filler) keeps
///               its own cluster until the budget runs out. With max_clusters = 1 a full bank takes the soft update.
enum class ClusterRule { kThreshold, kBudget };

/// "threshold" or "budget". @throws ValueError naming `where` for any other text.
inline ClusterRule parse_cluster_rule(const std::string& text, const std::string& where) {
  if (text == "threshold") return ClusterRule::kThreshold;
  if (text == "budget") return ClusterRule::kBudget;
  throw ValueError(where + ": cluster_rule must be \"threshold\" or \"budget\", not \"" + text + "\"");
}

/// The rule's name as parse_cluster_rule reads it and checkpoints and model configurations write it: "budget" for
/// ClusterRule::kBudget, "threshold" for ClusterRule::kThreshold. The result is a static string.
inline const char* cluster_rule_name(ClusterRule rule) {
  return rule == ClusterRule::kBudget ? "budget" : "threshold";
}

}  // namespace attnmix::stream
