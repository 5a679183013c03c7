# The two commands of the README: `make test` and `make bench`. `make gpu` is for the GPU machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch lies on disk on the dev and CI machines; installing it before the
# project keeps pip from pulling a multi-GB CUDA build for the bare `torch` requirement.
CPU_TORCH ?= torch==2.13.0
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
OUT ?= gpu-out

.PHONY: test bench gpu lint setup clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(HAS_GPU),,$(PY) -m pip install -q $(CPU_TORCH))
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(VENV)/bin/ruff check --output-format concise variants harness tests benchmarks

test: setup lint
	$(if $(HAS_GPU),,TRITON_INTERPRET=1) $(VENV)/bin/pytest -q -m "not gpu"

bench: setup
	$(VENV)/bin/ipa-bench check $(if $(HAS_GPU),--device cuda,--device cpu)

# GPU machine: no network, nothing installed; run from the repo root.
gpu:
	mkdir -p $(OUT)
	set -o pipefail; PYTHONPATH=. python3 -m pytest -q -m gpu 2>&1 | tee $(OUT)/gpu-tests.log

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
