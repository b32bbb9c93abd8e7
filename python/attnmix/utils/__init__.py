# SPDX-License-Identifier: Apache-2.0
"""attnmix.utils: the reference design's ``mixle.utils`` path (``attnmix.utils.vector``)."""
