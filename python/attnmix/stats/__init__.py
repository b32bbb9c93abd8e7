# SPDX-License-Identifier: Apache-2.0
"""attnmix.stats: the reference design's ``mixle.stats`` path. Every family's classes (the same objects as
``attnmix.<Name>``) and the chunked-data helpers ``seq_encode``, ``seq_log_density`` and ``seq_log_density_sum``;
the attention families also under ``attnmix.stats.latent.<family>``."""
from attnmix import *  # noqa: F401,F403
from attnmix import __all__ as _names
from attnmix._sequences import seq_encode, seq_log_density, seq_log_density_sum

__all__ = list(_names) + ["seq_encode", "seq_log_density", "seq_log_density_sum"]
