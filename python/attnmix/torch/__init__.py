# SPDX-License-Identifier: Apache-2.0
"""attnmix.torch: attnmix's streaming attention mechanisms as PyTorch building blocks.

Importing this package imports torch (``import attnmix`` alone never does). Everything runs in attnmix's C++
implementation on libtorch, the same library Python torch uses: tensors go in and come out without copies, and the
operations join your autograd graph, so your own losses, optimizers and modules work with them. CPU; float32 and
float64.

* Functional far-field operations (``attnmix.torch.functional``): ``ClusterBank``, ``empty_cluster_bank``,
  ``mgf_cluster_attention``, ``cluster_responsibilities``, ``update_cluster_bank``, ``birth_and_merge``,
  ``ingest_cluster_batch``, ``attention_law``, ``rope_tables``, ``apply_rope``, ``rotate_half``, and int8 keys and
  values: ``quantize_kv_cache``, ``dequantize_kv_cache``.
* Streaming language models (``attnmix.torch.mechanisms``): ``SlidingWindowSpine``, ``MomentClosureAttention``
  (with an outlier store: ``outlier_capacity``), their states, and ``train_tbptt``; and the bounded linear-feature
  memories (``attnmix.torch.sketch_spines``): ``LinearAttentionSpine``, ``FrequentDirectionsSpine``,
  ``TensorSketchSpine``.
* Attention layers for your own architectures (``attnmix.torch.layers``): ``SlidingWindowSelfAttention``,
  ``MomentClosureSelfAttention``.
* EM-fitted responsibility-attention heads inside autograd (``attnmix.torch.em_heads``):
  ``responsibility_log_density``, ``responsibility_predict_proba``.

docs/torch.md describes every name, the shapes, and what differs from the reference design.
"""
import torch  # noqa: F401  (the extension needs torch's runtime loaded first)

from attnmix.torch import em_heads, functional, layers, mechanisms, sketch_spines
from attnmix.torch.em_heads import *  # noqa: F401,F403
from attnmix.torch.functional import *  # noqa: F401,F403
from attnmix.torch.layers import *  # noqa: F401,F403
from attnmix.torch.mechanisms import *  # noqa: F401,F403
from attnmix.torch.sketch_spines import *  # noqa: F401,F403

__all__ = functional.__all__ + mechanisms.__all__ + sketch_spines.__all__ + layers.__all__ + em_heads.__all__
