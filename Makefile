# The two commands of the README: `make test` and `make bench`. `make gpu` is for the GPU machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# Where no NVIDIA GPU is present, the CPU build of torch is installed before the project, so
# that pip never pulls a multi-GB CUDA build for the bare `torch` requirement. On this
# project's dev and CI machines `torch==2.13.0` is the CPU build and lies on local disk; elsewhere
# point TORCH_INDEX_URL at PyTorch's CPU wheel index (README "Install"), e.g.
#   make test TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
CPU_TORCH ?= torch==2.13.0
TORCH_INDEX_URL ?=
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
OUT ?= gpu-out
export PYTHONUNBUFFERED := 1
export TRITON_CACHE_DIR ?= $(CURDIR)/build/triton-cache
# torch.compile's (Inductor's) cache, in the tree too: the default /tmp/torchinductor_$USER is
# shared by every process of the user, and a truncated module another left there failed a
# smoke sweep's compiled cell on 2026-12-05 (`ImportError: ... main.so: file too short`).
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/build/inductor-cache
# The CUDA extension's build cache (default ~/.cache/ipa-bench); in the tree, so that one
# device call builds once and later calls on a warm machine reuse it.
export IPA_BENCH_CACHE ?= $(CURDIR)/build/ipa-bench-cache

.PHONY: test bench gpu lint setup clean run

# The dev extra is test + ruff + the ray extra (Ray pinned), so that CI runs tests/test_ray.py.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(HAS_GPU),,$(PY) -m pip install -q $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) '$(CPU_TORCH)')
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

lint: setup
	$(VENV)/bin/ruff check --output-format concise .

# Any ipa-bench command without activating the venv: make run ARGS="list --device cpu"
run: setup
	$(VENV)/bin/ipa-bench $(ARGS)

test: setup lint
	$(if $(HAS_GPU),,TRITON_INTERPRET=1) $(VENV)/bin/pytest -q -m "not gpu"
	mkdir -p out
	$(if $(HAS_GPU),,TRITON_INTERPRET=1) $(VENV)/bin/pytest benchmarks --benchmark-only -q \
		-p no:cacheprovider --benchmark-json out/benchmarks.json

# The quick sweep on a GPU, the smoke sweep on CPU; rerunning resumes into the same folder.
BENCH_PRESET := $(if $(HAS_GPU),quick,smoke)
BENCH_OUT ?= out/bench-$(BENCH_PRESET)
bench: setup
	$(VENV)/bin/ipa-bench sweep --preset $(BENCH_PRESET) --device $(if $(HAS_GPU),cuda,cpu) -o $(BENCH_OUT)
	$(VENV)/bin/ipa-bench report $(BENCH_OUT)/results.csv

# GPU machine: no network, nothing installed; run from the repo root. GPU tests, the
# pytest-benchmark proof, then the quick sweep and its report; each stage has a time limit so
# that the whole fits one 10-minute device call (2026-12-02 on the H200, third session, with
# GPU_TEST_S=330 GPU_SWEEP_S=90: all 169 GPU tests, extension build included, 295 s;
# pytest-benchmark 37 s; the quick sweep about 60 s; 410 s in all. A cut sweep resumes when
# rerun into $(OUT)).
# Plots are drawn where the CSV is fetched to: $$OUT returns at most 8 files.
GPU_PRESET ?= quick
GPU_TEST_S ?= 340
GPU_SWEEP_S ?= 150
gpu:
	mkdir -p $(OUT)
	-set -o pipefail; PYTHONPATH=. timeout -s INT $(GPU_TEST_S) python3 -m pytest -q -m gpu \
		-p no:cacheprovider -rfE --tb=short --durations=20 2>&1 | tee $(OUT)/gpu-tests.log
	-set -o pipefail; PYTHONPATH=. timeout -s INT 60 python3 -m pytest benchmarks --benchmark-only \
		-p no:cacheprovider --benchmark-json $(OUT)/benchmarks.json 2>&1 | tee $(OUT)/benchmarks.log
	-set -o pipefail; PYTHONPATH=. timeout -s INT $(GPU_SWEEP_S) python3 -m harness.cli sweep \
		--preset $(GPU_PRESET) --device cuda -o $(OUT)/$(GPU_PRESET) --no-plots --no-progress \
		2>&1 | tee $(OUT)/sweep.log
	PYTHONPATH=. python3 -m harness.cli report $(OUT)/$(GPU_PRESET)/results.csv | tee $(OUT)/report.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
