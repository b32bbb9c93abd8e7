# SPDX-License-Identifier: Apache-2.0
"""attnmix.models.moment_propagation: the reference design's path of ``attention_law`` and ``GaussianLaw`` on numpy
arrays (the same functions as ``attnmix.experimental``; ``attnmix.torch`` has them on tensors with autograd).
``GaussianLaw(mu=..., covar=...)`` and ``proj_bias=None`` are accepted as the reference writes them."""
from attnmix import experimental as _experimental

GaussianLaw = _experimental.GaussianLaw
attention_law = _experimental.attention_law

__all__ = ["GaussianLaw", "attention_law"]
