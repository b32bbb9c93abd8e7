# SPDX-License-Identifier: Apache-2.0
"""attnmix.inference: the EM driver (docs/mechanisms.md#training), as in the reference's ``mixle.inference``.

``optimize`` fits an estimator's family to data by EM and returns the best-scoring model; ``score`` is the total
log-likelihood of data under a model, summed in the library's fixed order (what ``attnmix score`` prints).
Both run in the compiled module with the GIL released. ``seq_encode``, ``seq_log_density`` and
``seq_log_density_sum`` encode and score data in chunks (also in ``attnmix.stats``).
"""
from attnmix._core import optimize, score
from attnmix._sequences import seq_encode, seq_log_density, seq_log_density_sum

__all__ = ["optimize", "score", "seq_encode", "seq_log_density", "seq_log_density_sum"]
