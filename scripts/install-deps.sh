#!/usr/bin/env bash
# Installs every Debian package that building and testing attnmix needs. Idempotent; silent when all is present.
# With --bench also what only the benchmarks read: the King James Bible of bible-kjv (bench/real_corpus.py).
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libeigen3-dev nlohmann-json3-dev libcli11-dev libzip-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy python3-dev python3-pybind11 pybind11-dev python3-pytest python3-scipy
  python3-matplotlib  # attnmix.plot
  python3-sphinx python3-myst-parser python3-breathe doxygen  # make docs: the manual and the API reference (docs/conf.py)
  chromium  # the HTML page of `attnmix plot --html` opened in a real browser (tests/python/test_plot_browser.py)
  libopenmpi-dev openmpi-bin
  libtorch-dev python3-torch
  # The optimized BLAS that NumPy, PyTorch and attnmix's own libtorch operations load through Debian's libblas.so.3
  # alternative (the reference BLAS stays in blas/ and lapack/; bench/blas.py, compare.py --peer-blas).
  libopenblas0-pthread
  clang-14 libclang-rt-14-dev  # the fuzz targets: libFuzzer and the sanitizer runtimes of clang (docs/fuzzing.md)
)
if [ "${1:-}" = "--bench" ]; then packages+=(bible-kjv); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
