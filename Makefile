# attnmix: `make demo` and `make test` set everything up on a fresh Debian 12 machine.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-unit docs bench bench-configure bench-compare bench-corpus install-python clean lint \
        test-sanitize fuzz-build fuzz-build-gcc fuzz-gate fuzz fuzz-replay fuzz-corpus

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	@$(BUILD)/cli/attnmix demo

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-unit: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L unit

# The site: the manual and the Python and C++ API references (Sphinx; the C++ one through Doxygen + Breathe), every warning an
# error, then the doctests; $(BUILD)/docs/html/index.html.
docs: build
	@bash scripts/build-docs.sh $(BUILD)

# The `unit` tests under AddressSanitizer + UndefinedBehaviorSanitizer (every report fatal; docs/fuzzing.md), in
# $(BUILD)-asan: a Debug build (ATTNMIX_DASSERT on) at -O1. Python and libtorch are left out: their tests run
# uninstrumented interpreters and libraries (labels python, torch); fuzz_checkpoint covers the checkpoint reader.
# CCACHE_NOHASHDIR: the GCC fuzz build below reuses these objects from ccache.
SANITIZE_BUILD ?= $(BUILD)-asan
SANITIZE_FLAGS = -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" -DATTNMIX_SANITIZE=address,undefined \
	-DATTNMIX_WITH_PYTHON=OFF
SANITIZE_ENV = ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:detect_stack_use_after_return=1:strict_string_checks=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 LSAN_OPTIONS=suppressions=$(CURDIR)/fuzz/lsan.supp:print_suppressions=0
test-sanitize: deps
	@cmake -S . -B $(SANITIZE_BUILD) $(SANITIZE_FLAGS) -DATTNMIX_WITH_TORCH=OFF $(CMAKE_FLAGS) >/dev/null
	@CCACHE_NOHASHDIR=1 cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	@cd $(SANITIZE_BUILD) && $(SANITIZE_ENV) ctest --output-on-failure -j $(JOBS) -L unit -LE mpi
	@# Open MPI's dynamically loaded components leak at exit (unloaded, so no suppression can name them): the
	@# distributed tests run with every check but the leak check.
	@cd $(SANITIZE_BUILD) && $(SANITIZE_ENV) ASAN_OPTIONS=detect_leaks=0:check_initialization_order=1 \
		ctest --output-on-failure -j $(JOBS) -L mpi

# The fuzz targets (fuzz/, docs/fuzzing.md). $(BUILD)-fuzz: clang++-14 with libFuzzer, ASan and UBSan (fuzz_jsonl,
# fuzz_npz, fuzz_model). $(BUILD)-fuzz-gcc: GCC with ASan, UBSan and fuzz/standalone_main.cpp (fuzz_checkpoint, which
# needs libtorch; its headers do not compile with clang in C++20). fuzz-gate (CI) replays every seed and regression
# input, then fuzzes each target for FUZZ_GATE_SECONDS; fuzz runs each for FUZZ_SECONDS, keeps going after a finding
# and copies every finding into fuzz/regressions/<target>/; fuzz-replay only replays. FUZZ_TARGETS: a subset.
FUZZ_BUILD ?= $(BUILD)-fuzz
FUZZ_GCC_BUILD ?= $(BUILD)-fuzz-gcc
FUZZ_CXX ?= clang++-14
FUZZ_GATE_SECONDS ?= 60
FUZZ_SECONDS ?= 600
FUZZ_TARGETS ?=
FUZZ_RUN = bash fuzz/run.sh --build $(FUZZ_BUILD) --build $(FUZZ_GCC_BUILD)
fuzz-build: deps
	@cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g" \
	  -DCMAKE_CXX_COMPILER=$(FUZZ_CXX) -DCMAKE_CXX_FLAGS=-Wno-unknown-warning-option -DATTNMIX_BUILD_FUZZERS=ON \
	  -DATTNMIX_BUILD_TESTS=OFF -DATTNMIX_BUILD_CLI=OFF -DATTNMIX_WITH_PYTHON=OFF -DATTNMIX_WITH_MPI=OFF \
	  -DATTNMIX_WITH_OPENMP=OFF -DATTNMIX_WITH_TORCH=OFF >/dev/null
	@# Without ccache: ccache 4.7 with clang-14 fails on src/core/json.cpp with errors at <built-in> lines.
	@CCACHE_DISABLE=1 cmake --build $(FUZZ_BUILD) -j $(JOBS) --target attnmix_fuzzers

# fuzz_checkpoint (GCC, libtorch), part of every fuzz run unless FUZZ_CHECKPOINT=0 (docs/fuzzing.md).
FUZZ_CHECKPOINT ?= 1
fuzz-build-gcc: deps
	@cmake -S . -B $(FUZZ_GCC_BUILD) $(SANITIZE_FLAGS) -DATTNMIX_BUILD_FUZZERS=ON -DATTNMIX_BUILD_TESTS=OFF \
	  -DATTNMIX_BUILD_CLI=OFF -DATTNMIX_WITH_MPI=OFF -DATTNMIX_WITH_TORCH=ON $(CMAKE_FLAGS) >/dev/null
	@CCACHE_NOHASHDIR=1 cmake --build $(FUZZ_GCC_BUILD) -j $(JOBS) --target fuzz_checkpoint make_checkpoint_seed

FUZZ_BUILDS = fuzz-build $(if $(filter 1,$(FUZZ_CHECKPOINT)),fuzz-build-gcc)

fuzz-gate: $(FUZZ_BUILDS)
	@$(FUZZ_RUN) --seconds $(FUZZ_GATE_SECONDS) $(FUZZ_TARGETS)

fuzz: $(FUZZ_BUILDS)
	@$(FUZZ_RUN) --seconds $(FUZZ_SECONDS) --keep-going --save-regressions $(FUZZ_TARGETS)

fuzz-replay: $(FUZZ_BUILDS)
	@$(FUZZ_RUN) --replay-only $(FUZZ_TARGETS)

# Regenerates fuzz/corpus/ (the checkpoint seeds with make_checkpoint_seed of the GCC fuzz build, when it has one).
fuzz-corpus: $(FUZZ_BUILDS)
	@/usr/bin/python3 fuzz/make_corpus.py $(if $(wildcard $(FUZZ_GCC_BUILD)/fuzz/make_checkpoint_seed),--checkpoint-tool $(FUZZ_GCC_BUILD)/fuzz/make_checkpoint_seed)

# Installs the attnmix Python package where /usr/bin/python3 finds it (site.getsitepackages()[0], e.g.
# /usr/local/lib/python3.11/dist-packages); ATTNMIX_PYTHON_INSTALL_DIR in the CMake cache overrides it.
install-python: build
	@cmake --install $(BUILD) --component python

# The Google Benchmark programs (bench/) in $(BUILD)-bench: a Release build without the tests.
BENCH_BUILD = $(BUILD)-bench
bench-configure: deps
	@cmake -S . -B $(BENCH_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNMIX_BUILD_BENCHMARKS=ON -DATTNMIX_BUILD_TESTS=OFF >/dev/null

# `bench` runs attnmix_bench alone. Its NumPy/PyTorch/scipy peers (bench-compare, bench/compare.py) run on OpenBLAS,
# single-threaded (compare.py --peer-blas reference: on the reference BLAS, the C++ side's libtorch operations too).
bench: bench-configure
	@cmake --build $(BENCH_BUILD) -j $(JOBS) --target attnmix_bench
	@$(BENCH_BUILD)/bench/attnmix_bench

# The C++ benchmarks against their peers with compare.py's default options: responsibility attention (run), the
# variational embedding attention, the streaming spine and moment-closure attention (the last two need libtorch).
COMPARE = /usr/bin/python3 bench/compare.py
bench-compare: bench-configure
	@cmake --build $(BENCH_BUILD) -j $(JOBS) --target attnmix_bench attnmix_bench_spine attnmix_bench_moment_closure
	@$(COMPARE) run --bench $(BENCH_BUILD)/bench/attnmix_bench
	@$(COMPARE) variational --bench $(BENCH_BUILD)/bench/attnmix_bench
	@$(COMPARE) spine --bench-spine $(BENCH_BUILD)/bench/attnmix_bench_spine
	@$(COMPARE) moment-closure --bench-mca $(BENCH_BUILD)/bench/attnmix_bench_moment_closure

# Responsibility attention on a real corpus (bench/real_corpus.py): prefixes of the King James Bible, word-level.
bench-corpus: build
	@bash scripts/install-deps.sh --bench
	@/usr/bin/python3 bench/real_corpus.py --cli $(BUILD)/cli/attnmix

clean:
	rm -rf $(BUILD) $(BENCH_BUILD)
