// SPDX-License-Identifier: Apache-2.0
#include "attnmix/stream/progress_record.hpp"

namespace attnmix::stream {

nlohmann::ordered_json progress_record(const Progress& progress) {
  nlohmann::ordered_json record{{"step", progress.step},
                                {"loss", progress.loss},
                                {"tokens_per_second", progress.tokens_per_second},
                                {"elapsed_seconds", progress.elapsed_seconds}};
  if (!progress.clusters.empty()) {
    record["clusters"] = progress.clusters;
    record["bank_mass"] = progress.bank_mass;
    record["far_share"] = progress.far_share;
  }
  if (progress.heldout_bits_per_byte) record["heldout_bits_per_byte"] = *progress.heldout_bits_per_byte;
  return record;
}

}  // namespace attnmix::stream
