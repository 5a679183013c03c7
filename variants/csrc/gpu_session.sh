#!/usr/bin/env bash
# One GPU call for the CUDA variants (run from the repo root on the GPU machine; OUT= a folder):
# build + kernel diagnostics, timings, the GPU tests, compute-sanitizer, then torch.compile timings.
# Each stage has its own time limit so that a slow one cannot starve the rest; logs go to $OUT.
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
stage() {  # stage SECONDS LOG CMD...
  local limit=$1 log=$2; shift 2
  echo "=== $* (limit ${limit}s)"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$log" | tail -n "${TAIL:-25}"
}
TAIL=60 stage "${LIM_DIAG:-150}" diag.log python3 variants/csrc/measure.py env diag --out "$OUT"
TAIL=16 stage "${LIM_TIME:-80}" time.log python3 variants/csrc/measure.py time --reps 10 --out "$OUT"
stage "${LIM_TEST:-110}" pytest.log python3 -m pytest -q -m gpu tests/test_cuda.py -k "not sanitizer and not other_configs"
stage "${LIM_SAN:-100}" sanitizer.log python3 -m pytest -q -s -m gpu tests/test_cuda.py -k sanitizer
stage "${LIM_OTHER:-50}" pytest-other.log python3 -m pytest -q -m gpu tests/test_cuda.py -k other_configs
TAIL=10 stage "${COMPILE_LIMIT:-90}" compile.log python3 variants/csrc/measure.py time --compile --only torch-compile --reps 10 --out /tmp/compile-timings
exit 0
