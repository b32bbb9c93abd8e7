// SPDX-License-Identifier: Apache-2.0
// attnmix._torch, the functional half: the cluster-bank operations, attention_law and RoPE on torch tensors, with
// autograd. The library's functions are built from differentiable torch operations, so calling them on the
// caller's tensors puts them in the caller's autograd graph; nothing is copied. Banks cross as tuples
// (torch_args.hpp) and python/attnmix/torch/functional.py wraps them in the ClusterBank dataclass (and maps the
// reference design's one-stream shapes onto one stream). The computing calls release the GIL.
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "../convert.hpp"
#include "../stream_receipts.hpp"
#include "attnmix/core/errors.hpp"
#include "attnmix/stream/kv_quantization.hpp"
#include "attnmix/stream/moment_closure.hpp"
#include "attnmix/stream/moment_propagation.hpp"
#include "attnmix/stream/rope.hpp"
#include "torch_args.hpp"

namespace attnmix::python {

using namespace attnmix::stream;  // the streaming models this file exposes

namespace py = pybind11;

namespace {

BirthMergeOptions birth_merge_options(py::handle birth_threshold, py::handle merge_threshold,
                                      py::handle outlier_top_k, py::handle cluster_rule, std::string_view where) {
  BirthMergeOptions o;
  o.cluster_rule = cluster_rule_arg(cluster_rule, where);
  o.birth_threshold = real_number(birth_threshold, where, "birth_threshold");
  if (!merge_threshold.is_none()) o.merge_threshold = real_number(merge_threshold, where, "merge_threshold");
  // A non-integer outlier_top_k (bool included) is a ValueError, as in the reference design.
  try {
    o.outlier_top_k = nonnegative_int(outlier_top_k, where, "outlier_top_k");
  } catch (const TypeError& e) {
    throw ValueError(e.what());
  }
  return o;
}

using IngestFunction = IngestResult (*)(const ClusterBank&, const torch::Tensor&, const torch::Tensor&,
                                        const BirthMergeOptions&);

// birth_and_merge and ingest_cluster_batch: (bank, k, v, birth_threshold, merge_threshold, outlier_top_k,
// cluster_rule) →
// (bank, [receipt per stream]).
void bind_ingestion(py::module_& m, const char* name, IngestFunction fn, bool ingest) {
  m.def(name, [fn, name, ingest](const py::object& bank_obj, const py::object& k_obj, const py::object& v_obj,
                                 const py::object& birth_threshold, const py::object& merge_threshold,
                                 const py::object& outlier_top_k, const py::object& cluster_rule) {
    const std::string_view w = name + 1;  // without the leading underscore
    const auto o = birth_merge_options(birth_threshold, merge_threshold, outlier_top_k, cluster_rule, w);
    const auto bank = bank_from_tuple(bank_obj, w, "bank");
    const auto k = real_tensor_arg(k_obj, w, "k");
    const auto v = real_tensor_arg(v_obj, w, "v");
    IngestResult result;
    {
      py::gil_scoped_release release;
      result = fn(bank, k, v, o);
    }
    py::list receipts;
    for (const auto& r : result.receipts) receipts.append(receipt_out(r, ingest, &tensor_object));
    return py::make_tuple(bank_to_tuple(result.bank), receipts);
  });
}

}  // namespace

void bind_functional(py::module_& m) {
  m.def("_empty_cluster_bank", [](const py::object& batch_size, const py::object& n_head,
                                  const py::object& max_clusters, const py::object& head_dim,
                                  const py::object& dtype) {
    constexpr std::string_view w = "empty_cluster_bank";
    return bank_to_tuple(empty_cluster_bank(positive_int(batch_size, w, "batch_size"),
                                            positive_int(n_head, w, "n_head"),
                                            positive_int(max_clusters, w, "max_clusters"),
                                            positive_int(head_dim, w, "head_dim"), dtype_arg(dtype, w, "dtype")));
  });

  m.def("_mgf_cluster_attention", [](const py::object& q_obj, const py::object& bank_obj) {
    constexpr std::string_view w = "mgf_cluster_attention";
    const auto q = real_tensor_arg(q_obj, w, "q", 4);
    const auto bank = bank_from_tuple(bank_obj, w, "bank");
    ClusterAttention result;
    {
      py::gil_scoped_release release;
      result = mgf_cluster_attention(q, bank);
    }
    return py::make_tuple(tensor_object(result.out), tensor_object(result.logits));
  });

  m.def("_cluster_responsibilities", [](const py::object& k_obj, const py::object& bank_obj) {
    constexpr std::string_view w = "cluster_responsibilities";
    const auto k = real_tensor_arg(k_obj, w, "k", 4);
    const auto bank = bank_from_tuple(bank_obj, w, "bank");
    py::gil_scoped_release release;
    return cluster_responsibilities(k, bank);
  });

  m.def("_update_cluster_bank", [](const py::object& bank_obj, const py::object& k_obj, const py::object& v_obj,
                                   const py::object& r_obj) {
    constexpr std::string_view w = "update_cluster_bank";
    const auto bank = bank_from_tuple(bank_obj, w, "bank");
    const auto k = real_tensor_arg(k_obj, w, "k", 4);
    const auto v = real_tensor_arg(v_obj, w, "v", 4);
    const auto r = real_tensor_arg(r_obj, w, "responsibilities", 4);
    ClusterBank out;
    {
      py::gil_scoped_release release;
      out = update_cluster_bank(bank, k, v, r);
    }
    return bank_to_tuple(out);
  });

  m.def("_quantize_kv_cache", [](const py::object& x_obj) {
    const auto x = real_tensor_arg(x_obj, "quantize_kv_cache", "x");
    QuantizedKv q;
    {
      py::gil_scoped_release release;
      q = quantize_kv_cache(x);
    }
    return py::make_tuple(tensor_object(q.codes), tensor_object(q.low), tensor_object(q.scale));
  });

  m.def("_dequantize_kv_cache", [](const py::object& codes, const py::object& low, const py::object& scale,
                                   const py::object& dtype) {
    constexpr std::string_view w = "dequantize_kv_cache";
    const QuantizedKv q{tensor_arg(codes, w, "codes"), tensor_arg(low, w, "low"), tensor_arg(scale, w, "scale")};
    const auto type = dtype_arg(dtype, w, "dtype");
    py::gil_scoped_release release;
    return dequantize_kv_cache(q, type);
  });

  bind_ingestion(m, "_birth_and_merge", &birth_and_merge, /*ingest=*/false);
  bind_ingestion(m, "_ingest_cluster_batch", &ingest_cluster_batch, /*ingest=*/true);

  m.def("_attention_law", [](const py::object& mean, const py::object& cov, const py::object& qkv_weight,
                             const py::object& qkv_bias, const py::object& proj_weight, const py::object& proj_bias,
                             const py::object& n_head) {
    constexpr std::string_view w = "attention_law";
    const GaussianLaw law{real_tensor_arg(mean, w, "law.mean", 1), real_tensor_arg(cov, w, "law.cov", 2)};
    const auto result = attention_law(law, real_tensor_arg(qkv_weight, w, "qkv_weight", 2),
                                      real_tensor_arg(qkv_bias, w, "qkv_bias", 1),
                                      real_tensor_arg(proj_weight, w, "proj_weight", 2),
                                      real_tensor_arg(proj_bias, w, "proj_bias", 1), positive_int(n_head, w, "n_head"));
    return py::make_tuple(tensor_object(result.law.mean), tensor_object(result.law.cov),
                          tensor_object(result.jacobian));
  });

  m.def(
      "rope_tables",
      [](const py::object& positions, const py::object& head_dim, const py::object& dtype) {
        constexpr std::string_view w = "rope_tables";
        const auto p = tensor_arg(positions, w, "positions");
        const auto type = dtype.is_none() ? torch::kFloat : dtype_arg(dtype, w, "dtype");
        const auto tables = rope_tables(p, positive_int(head_dim, w, "head_dim"), type);
        return py::make_tuple(tensor_object(tables.cos), tensor_object(tables.sin));
      },
      py::arg("positions"), py::arg("head_dim"), py::arg("dtype") = py::none(),
      R"doc(Rotary-embedding tables of integer positions (a 1-D int64 tensor): ``(cos, sin)``, each ``(t, head_dim)``, in
``dtype`` (torch.float32 or torch.float64; default float32). The angle at position ``p`` is ``p *
10000^(-2k/head_dim)``, ``k < head_dim/2``, repeated for both halves.

Example: positions 0, 1 and 2 for a head of 4 dimensions (angles ``p`` and ``p / 100``):

>>> import math
>>> import torch
>>> from attnmix.torch import rope_tables
>>> cos, sin = rope_tables(torch.tensor([0, 1, 2]), 4)
>>> tuple(cos.shape), cos.dtype
((3, 4), torch.float32)
>>> cos[0].tolist(), sin[0].tolist()  # position 0: no rotation
([1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0])
>>> [round(x, 4) for x in cos[1].tolist()], round(math.cos(1.0), 4)  # both halves repeat the angles
([0.5403, 0.9999, 0.5403, 0.9999], 0.5403)
)doc");
  m.def(
      "apply_rope",
      [](const py::object& x, const py::object& cos, const py::object& sin) {
        constexpr std::string_view w = "apply_rope";
        const auto t = real_tensor_arg(x, w, "x");
        const RopeTables tables{real_tensor_arg(cos, w, "cos", 2), real_tensor_arg(sin, w, "sin", 2)};
        if (t.dim() < 3 || tables.cos.sizes() != tables.sin.sizes() || tables.cos.size(0) != t.size(-3) ||
            tables.cos.size(1) != t.size(-1)) {
          throw ValueError("apply_rope: x must be (..., t, heads, head_dim) and cos, sin (t, head_dim)");
        }
        return py::cast(apply_rope(t, tables));  // a torch.Tensor (the signature says object, not at::Tensor)
      },
      py::arg("x"), py::arg("cos"), py::arg("sin"),
      R"doc(``RoPE(x) = x * cos + rotate_half(x) * sin`` for ``x (..., t, heads, head_dim)``, differentiable; the rotated
pairs are ``(x_k, x_{k + head_dim/2})``.

Example: rotating 3 positions of 2 heads keeps each vector's length, and equals the formula in plain torch:

>>> import torch
>>> from attnmix.torch import apply_rope, rope_tables
>>> _ = torch.manual_seed(0)
>>> x = torch.randn(1, 3, 2, 4)  # (batch, t, heads, head_dim)
>>> cos, sin = rope_tables(torch.arange(3), 4)
>>> y = apply_rope(x, cos, sin)
>>> tuple(y.shape), torch.allclose(y.norm(dim=-1), x.norm(dim=-1))
((1, 3, 2, 4), True)
>>> half = torch.cat([-x[..., 2:], x[..., :2]], dim=-1)
>>> torch.allclose(y, x * cos[:, None] + half * sin[:, None])
True
)doc");
  m.def(
      "rotate_half",
      [](const py::object& x) {
        const auto t = real_tensor_arg(x, "rotate_half", "x");
        if (t.dim() < 1 || t.size(-1) % 2 != 0) {
          throw ValueError("rotate_half: the last dimension of x must have even size");
        }
        return py::cast(rotate_half(t));
      },
      py::arg("x"), R"doc(``[-x2, x1]`` over the last dimension, where ``x1`` and ``x2`` are its two halves.

Example:

>>> import torch
>>> from attnmix.torch import rotate_half
>>> rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist()
[-3.0, -4.0, 1.0, 2.0]
)doc");
}

}  // namespace attnmix::python
