# SPDX-License-Identifier: Apache-2.0
"""attnmix.experimental.context_spine: the reference design's path of the sliding-window spine. Like the reference's
module it works on torch tensors (importing it imports torch): the names are those of ``attnmix.torch``."""
from attnmix.torch import (  # noqa: F401
    SlidingWindowSpine,
    SlidingWindowState,
    apply_rope,
    rope_tables,
    rotate_half,
    train_tbptt,
)

__all__ = ["SlidingWindowSpine", "SlidingWindowState", "apply_rope", "rope_tables", "rotate_half", "train_tbptt"]
