# SPDX-License-Identifier: Apache-2.0
"""attnmix.inference: the EM driver (SPEC.md §1.7), as in the reference's ``mixle.inference``.

``optimize`` fits an estimator's family to data by EM and returns the best-scoring model; ``score`` is the total
log-likelihood of data under a model, summed in the library's fixed order (what ``attnmix score`` prints).
Both run in the compiled module with the GIL released.
"""
from attnmix._core import optimize, score

__all__ = ["optimize", "score"]
