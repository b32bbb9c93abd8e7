# attnmix: `make demo` and `make test` set everything up on a fresh Debian 12 machine.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build demo test test-unit bench install-python clean lint

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

# Installs the attnmix Python package where /usr/bin/python3 finds it (site.getsitepackages()[0], e.g.
# /usr/local/lib/python3.11/dist-packages); ATTNMIX_PYTHON_INSTALL_DIR in the CMake cache overrides it.
install-python: build
	@cmake --install $(BUILD) --component python

bench: deps
	@cmake -S . -B $(BUILD)-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNMIX_BUILD_BENCHMARKS=ON -DATTNMIX_BUILD_TESTS=OFF >/dev/null
	@cmake --build $(BUILD)-bench -j $(JOBS) --target attnmix_bench
	@$(BUILD)-bench/bench/attnmix_bench

clean:
	rm -rf $(BUILD) $(BUILD)-bench
