#!/usr/bin/env bash
# The attnmix site (`make docs`): the C++ API reference by Doxygen from the public headers, then the user manual and
# the Python API reference by Sphinx (docs/conf.py) with the C++ pages inside, then the examples of the manual and of
# the docstrings as doctests. Every warning of either tool is an error. Needs the built Python module.
#   bash scripts/build-docs.sh [BUILD]   (default build; writes BUILD/docs/html, opens at BUILD/docs/html/index.html)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=$build/docs
rm -rf "$out"
mkdir -p "$out/doxygen"

# Doxygen: the headers' own comments as HTML pages under cpp/ of the site (docs/api/cpp.md links there). Every public
# name must be documented: an undocumented one, like any other warning, fails the build.
doxygen - > "$out/doxygen.log" <<DOXYFILE
PROJECT_NAME = attnmix
PROJECT_BRIEF = "C++ API reference"
INPUT = $root/include/attnmix
STRIP_FROM_PATH = $root/include
STRIP_FROM_INC_PATH = $root/include
RECURSIVE = YES
FILE_PATTERNS = *.hpp
EXCLUDE_SYMBOLS = detail *::detail
EXTRACT_ALL = NO
JAVADOC_AUTOBRIEF = YES
DISTRIBUTE_GROUP_DOC = YES
FULL_PATH_NAMES = YES
OUTPUT_DIRECTORY = $out/doxygen
GENERATE_HTML = YES
HTML_OUTPUT = cpp
GENERATE_LATEX = NO
HAVE_DOT = NO
QUIET = YES
WARN_IF_UNDOCUMENTED = YES
WARN_IF_DOC_ERROR = YES
WARN_AS_ERROR = FAIL_ON_WARNINGS
DOXYFILE

# Sphinx: the manual and the Python reference; -W turns every warning (a broken reference or link, a docstring that
# is not valid reStructuredText) into a failure, -n checks every cross-reference.
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
export ATTNMIX_DOXYGEN_HTML=$out/doxygen
/usr/bin/python3 -m sphinx -b html -W --keep-going -n -q -d "$out/doctrees" "$root/docs" "$out/html"
/usr/bin/python3 -m sphinx -b doctest -W --keep-going -q -d "$out/doctrees" "$root/docs" "$out/doctest"
echo "docs: wrote $out/html/index.html (C++ reference: $out/html/cpp/index.html)"
