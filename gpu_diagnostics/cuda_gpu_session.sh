#!/usr/bin/env bash
# One GPU call for the CUDA variants (run from the repo root on the GPU machine; OUT= a folder):
# build + kernel diagnostics, the GPU tests, compute-sanitizer, then the headline sweep (timings).
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
TAIL=60 stage "${LIM_DIAG:-150}" diag.log python3 gpu_diagnostics/cuda_kernel_diag.py env diag --out "$OUT"
stage "${LIM_TEST:-110}" pytest.log python3 -m pytest -q -m gpu tests/test_cuda.py tests/test_variants.py \
  -k "(test_cuda or cuda-fused or cuda-hybrid) and not sanitizer and not other_configs"
stage "${LIM_SAN:-160}" sanitizer.log python3 -m pytest -q -s -m gpu tests/test_cuda.py -k sanitizer
stage "${LIM_OTHER:-50}" pytest-other.log python3 -m pytest -q -m gpu tests/test_cuda.py -k other_configs
TAIL=30 stage "${LIM_SWEEP:-240}" sweep.log python3 -m harness.cli sweep --grid benchmarks/grids/headline.toml \
  --device cuda -o "$OUT/headline" --no-plots --no-progress \
  --variant reference --variant cuda-fused --variant cuda-hybrid --variant torch-compile
exit 0
