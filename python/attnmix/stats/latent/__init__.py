# SPDX-License-Identifier: Apache-2.0
"""attnmix.stats.latent: the reference design's module path of the attention families (one module each)."""
