// SPDX-License-Identifier: Apache-2.0
#include "attnmix/inference/progress.hpp"

#include <cstdio>

namespace attnmix {

namespace {
std::string format_e(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%e", x);
  return buf;
}
}  // namespace

std::string format_progress_line(const IterationReport& report) {
  std::string line = "Iteration " + std::to_string(report.iteration) +
                     ": ln[p_mat(Data|Model)]=" + format_e(report.log_likelihood) +
                     ", ln[p_mat(Data|Model)]-ln[p_mat(Data|PrevModel)]=" + format_e(report.delta_log_likelihood);
  if (report.valid_log_likelihood) line += ", ln[p_mat(Valid Data|Model)]=" + format_e(*report.valid_log_likelihood);
  line += '\n';
  return line;
}

}  // namespace attnmix
