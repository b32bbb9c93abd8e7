# SPDX-License-Identifier: Apache-2.0
"""attnmix: attention as a mixture (docs/mechanisms.md).

Probabilistic attention mechanisms in which *which context position is attended* is a latent variable, fitted by
exact EM (the variational families by variational EM, with the Adam state carried by the model). The classes keep
the reference design's names and call signatures (mixle), so

    from attnmix import ResponsibilityAttentionEstimator, optimize

    est = ResponsibilityAttentionEstimator(16, 6, 16, 16, sigma2=0.5)
    model = optimize(data, est, max_its=40)          # data: (context, query, target) triples

fits a responsibility-attention head. Everything runs in the compiled module ``attnmix._core`` (C++20); this
package re-exports it. ``import attnmix`` needs only numpy.
"""
from attnmix import _core
from attnmix._core import *  # noqa: F403 -- every public class and function of the compiled module
from attnmix import assign, inference

__version__ = _core.__version__

__all__ = sorted([name for name in vars(_core) if not name.startswith("_")] + ["assign", "inference"])
