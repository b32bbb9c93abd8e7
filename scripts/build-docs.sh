#!/usr/bin/env bash
# The attnmix site (`make docs`): Doxygen reads the public headers, then Sphinx (docs/conf.py) builds the user manual,
# the Python API reference and, through Breathe, the C++ API reference, then runs the examples of the manual and of
# the docstrings as doctests. Every warning of either tool is an error. Needs the built Python module.
#   bash scripts/build-docs.sh [BUILD]   (default build; writes BUILD/docs/html, opens at BUILD/docs/html/index.html)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=$build/docs
rm -rf "$out"
mkdir -p "$out/doxygen"

# Doxygen: the headers' own comments as XML, which Breathe renders inside the Sphinx site (docs/api/cpp.md). Every
# public name must be documented: an undocumented one, like any other warning, fails the build. libtorch's
# TORCH_MODULE(Name) is expanded to the class it declares (a ModuleHolder of NameImpl), so that the holders are
# documented as the classes they are rather than as functions named TORCH_MODULE.
doxygen - > "$out/doxygen.log" <<DOXYFILE
PROJECT_NAME = attnmix
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
MACRO_EXPANSION = YES
EXPAND_ONLY_PREDEF = YES
PREDEFINED = "TORCH_MODULE(Name)=class Name : public torch::nn::ModuleHolder<Name##Impl> { public: using torch::nn::ModuleHolder<Name##Impl>::ModuleHolder; }"
OUTPUT_DIRECTORY = $out/doxygen
GENERATE_HTML = NO
GENERATE_XML = YES
XML_PROGRAMLISTING = NO
GENERATE_LATEX = NO
HAVE_DOT = NO
QUIET = YES
WARN_IF_UNDOCUMENTED = YES
WARN_IF_DOC_ERROR = YES
WARN_AS_ERROR = FAIL_ON_WARNINGS
DOXYFILE

# Doxygen's Markdown reads a `--` outside code as an en dash (<ndash/>), which Breathe 4.34 renders as the literal text
# "&#8212;"; in these comments a `--` is a command-line flag (CLI --max-its), so the XML gets the authored hyphens back.
sed -i 's|<ndash/>|--|g; s|<mdash/>|---|g' "$out"/doxygen/xml/*.xml

# The C++ reference's pages (docs/api/cpp/<folder>.rst, generated, git-ignored): each public name of each header once.
/usr/bin/python3 "$root/scripts/cpp_api_pages.py" "$out/doxygen/xml" "$root/docs/api/cpp"

# Sphinx: the manual and both API references; -W turns every warning (a broken reference or link, a docstring that
# is not valid reStructuredText) into a failure, -n checks every cross-reference.
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
export ATTNMIX_DOXYGEN_XML=$out/doxygen/xml
/usr/bin/python3 -m sphinx -b html -W --keep-going -n -q -d "$out/doctrees" "$root/docs" "$out/html"
/usr/bin/python3 -m sphinx -b doctest -W --keep-going -q -d "$out/doctrees" "$root/docs" "$out/doctest"
echo "docs: wrote $out/html/index.html (C++ reference: $out/html/api/cpp.html)"
