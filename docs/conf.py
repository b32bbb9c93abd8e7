# SPDX-License-Identifier: Apache-2.0
"""Sphinx configuration of the attnmix site (`make docs`, scripts/build-docs.sh): the user manual (the Markdown pages
of docs/, through MyST), the Python API reference (autodoc on the built module) and, copied in, the C++ API reference
that Doxygen wrote from the public headers. The build treats every warning as an error."""
import os

project = "attnmix"
author = "the attnmix authors"
copyright = "2026, the attnmix authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 4  # the manual links to its sections by their GitHub-style anchors
nitpicky = True

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the signatures come from the docstrings of the compiled module

# Doxygen's HTML (its cpp/ folder) is copied into the site as it is.
html_extra_path = [os.environ["ATTNMIX_DOXYGEN_HTML"]] if os.environ.get("ATTNMIX_DOXYGEN_HTML") else []

html_theme = "alabaster"
html_title = "attnmix"

# NumPy's types have no pages here to link to; every reference to attnmix's own names must resolve.
nitpick_ignore_regex = [
    ("py:class", r"numpy\..*"),
]
