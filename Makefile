# The README's two commands. Each installs what it needs (Debian 12, root), builds, and runs.
BUILD ?= build
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: deps build test fuzz demo bench clean

deps:
	bash scripts/install_deps.sh

build: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && OMP_NUM_THREADS=1 ctest --output-on-failure -j $(JOBS) --timeout 900

# libFuzzer on every parser, 10 million executions each, one target at a time under nice (docs/FUZZING.md);
# not part of `make test` (which runs a few seconds of each).
fuzz: build
	bash tests/fuzz/run_fuzz.sh $(BUILD)/fuzz long 10000000

demo: build
	bash scripts/demo.sh

bench: build
	bash bench/run_cpu_bench.sh

clean:
	rm -rf $(BUILD)
