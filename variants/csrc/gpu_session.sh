#!/usr/bin/env bash
# One GPU call for the CUDA variants (run from the repo root on the GPU machine; OUT= a folder):
# build + kernel diagnostics, kernel-only A/B of the fused kernel's scheduling flags, end-to-end
# timings, the GPU tests, compute-sanitizer, then torch.compile timings. Each stage has its own
# time limit (LIM_* seconds) so that a slow one cannot starve the rest; logs go to $OUT.
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
TAIL=8 stage "${LIM_DIAG:-150}" diag.log python3 variants/csrc/measure.py env diag --out "$OUT"
TAIL=18 stage "${LIM_AB:-60}" ab.log python3 variants/csrc/measure.py ab --reps 10 --out /tmp/ab
TAIL=14 stage "${LIM_TIME:-80}" time.log python3 variants/csrc/measure.py time --reps 10 --out "$OUT"
TAIL=12 stage "${LIM_TEST:-120}" pytest.log python3 -m pytest -q -m gpu tests/test_cuda.py -k "not sanitizer"
TAIL=12 stage "${LIM_SAN:-100}" sanitizer.log python3 -m pytest -q -s -m gpu tests/test_cuda.py -k sanitizer
TAIL=10 stage "${LIM_COMPILE:-90}" compile.log python3 variants/csrc/measure.py time --compile --only torch-compile --reps 10 --out /tmp/compile-timings
grep -h '"finite": false\|rel_l2": [0-9.e-]*[1-9]e-0[1-5]' "$OUT/diag.log" | head -5  # any bad diag rows
exit 0
