// SPDX-License-Identifier: Apache-2.0
#include "stream_receipts.hpp"

#include <pybind11/stl.h>

namespace attnmix::python {

using namespace attnmix::stream;  // the streaming models this file exposes

namespace py = pybind11;
using namespace pybind11::literals;

py::dict receipt_out(const StreamReceipt& r, bool ingest, TensorOut tensor_out) {
  py::dict out;
  out["birthed"] = r.birthed;
  out["birth_incorporated_batch"] = r.birth_incorporated_batch;
  py::list merged;
  for (const auto& [i, j] : r.merged) merged.append(py::make_tuple(i, j));
  out["merged"] = merged;
  if (!r.merge_distances.empty()) out["merge_distances"] = py::cast(r.merge_distances);
  py::dict misfit;
  for (const auto& [c, value] : r.misfit) misfit[py::int_(c)] = value;
  out["misfit"] = misfit;
  py::dict outliers;
  for (const auto& [c, o] : r.per_cluster_outlier_tokens) {
    outliers[py::int_(c)] = py::dict("k"_a = tensor_out(o.k), "v"_a = tensor_out(o.v),
                                     "indices"_a = py::cast(o.indices), "residuals"_a = py::cast(o.residuals),
                                     "member_indices"_a = py::cast(o.member_indices));
  }
  out["per_cluster_outlier_tokens"] = outliers;
  out["misfit_scalar"] = r.misfit_scalar;
  if (ingest) {
    out["soft_update_applied"] = r.soft_update_applied;
    out["ingested_tokens_per_head"] = py::cast(r.ingested_tokens_per_head);
    out["expected_ingested_tokens_per_head"] = r.expected_ingested_tokens_per_head;
    out["count_conserved"] = r.count_conserved;
  }
  if (r.accounting) {
    const auto& a = *r.accounting;
    out["accounting"] = py::dict(
        "positions_seen"_a = a.positions_seen, "near_tokens"_a = a.near_tokens,
        "evicted_tokens"_a = a.evicted_tokens, "far_tokens_per_head"_a = py::cast(a.far_tokens_per_head),
        "expected_far_tokens_per_head"_a = a.expected_far_tokens_per_head, "overlap_tokens"_a = a.overlap_tokens,
        "conserved"_a = a.conserved);
  }
  return out;
}

py::dict layer_receipt_out(const LayerReceipt& receipt, TensorOut tensor_out) {
  py::list streams;
  for (const auto& s : receipt.streams) streams.append(receipt_out(s, /*ingest=*/true, tensor_out));
  auto out = py::dict("batch_size"_a = receipt.batch_size, "streams"_a = streams,
                      "misfit_scalar"_a = receipt.misfit_scalar,
                      "far_attention_share"_a = receipt.far_attention_share);
  if (receipt.outliers) {
    const auto& o = *receipt.outliers;
    out["outliers"] = py::dict("offered"_a = o.offered, "stored"_a = o.stored, "evicted"_a = o.evicted,
                               "held"_a = o.held, "bytes"_a = o.bytes,
                               "max_reconstruction_error"_a = o.max_reconstruction_error);
  }
  return out;
}

}  // namespace attnmix::python
