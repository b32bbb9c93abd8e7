# SPDX-License-Identifier: Apache-2.0
"""attnmix.models: the reference design's ``mixle.models`` path (``attnmix.models.moment_propagation``)."""
