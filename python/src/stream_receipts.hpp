// SPDX-License-Identifier: Apache-2.0
/// @file stream_receipts.hpp
/// What cluster-bank ingestion reports, as Python dicts, for both streaming extensions: attnmix._stream
/// (tensors leave as float64 numpy arrays) and attnmix._torch (tensors leave as torch tensors, shared). One
/// conversion, parameterised by how a tensor leaves.
///
/// A stream's receipt has the keys birthed, birth_incorporated_batch, merged [(i, j)], merge_distances (only
/// when a merge happened), misfit {cluster: float}, per_cluster_outlier_tokens {cluster: {k, v, indices,
/// member_indices}} and misfit_scalar; ingestion adds soft_update_applied, ingested_tokens_per_head,
/// expected_ingested_tokens_per_head and count_conserved; a mechanism's step adds accounting {positions_seen,
/// near_tokens, evicted_tokens, far_tokens_per_head, expected_far_tokens_per_head, overlap_tokens, conserved}.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/torch.h>

#include "attnmix/stream/moment_closure.hpp"

namespace attnmix::python {

/// How a tensor leaves for Python.
using TensorOut = pybind11::object (*)(const torch::Tensor&);

/// One stream's receipt; `ingest` adds the ingestion keys.
[[nodiscard]] pybind11::dict receipt_out(const stream::StreamReceipt& receipt, bool ingest, TensorOut tensor_out);

/// One layer's receipt of a mechanism step: {batch_size, streams: [receipt with accounting], misfit_scalar} and,
/// with an outlier store, outliers {offered, stored, evicted, held, bytes, max_reconstruction_error}.
[[nodiscard]] pybind11::dict layer_receipt_out(const stream::LayerReceipt& receipt, TensorOut tensor_out);

}  // namespace attnmix::python
