# SPDX-License-Identifier: Apache-2.0
"""attnmix.utils.vector: the reference design's path of ``ImpossibleEvidenceError`` (the same class as
``attnmix.ImpossibleEvidenceError``)."""
from attnmix import ImpossibleEvidenceError  # noqa: F401

__all__ = ["ImpossibleEvidenceError"]
