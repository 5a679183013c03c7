#!/usr/bin/env bash
# Profile of the cuda-fused kernel on the GPU machine (run from the repo root; OUT= a folder):
# the kernel alone per scheduling-flag combination (A/B timings, benchmarks/cuda_kernel_diag.py
# ab), then ncu's full section set on one launch at N = $NCU_N per flag setting in $NCU_FLAGS,
# saved as the details page and the per-SASS-line source counters (stall samples).
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}
PRECISION=${PRECISION:-fp32}
mkdir -p "$OUT"
timeout "${LIM_AB:-150}" python3 benchmarks/cuda_kernel_diag.py env ab --lengths "${AB_N:-1024,4096}" \
  --out "$OUT" 2>&1 | tee "$OUT/ab.log"
for flags in ${NCU_FLAGS:-0 3}; do
  rep=/tmp/ncu-fused-$PRECISION-f$flags
  echo "=== ncu, flags $flags"
  timeout "${LIM_NCU:-150}" ncu --clock-control none --kernel-name regex:ipa_fused_kernel \
    --launch-count 1 --set full --import-source yes -f -o "$rep" \
    python3 benchmarks/cuda_kernel_diag.py ncu-target --length "${NCU_N:-4096}" \
    --precision "$PRECISION" --flags "$flags" 2>&1 | tail -n 5
  ncu --import "$rep.ncu-rep" --page details > "$OUT/ncu-$PRECISION-f$flags.txt" 2>&1
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/ncu-$PRECISION-f$flags-sass.csv" 2>&1
  grep -E "Duration|Throughput|Warp Cycles Per Issued|Issued Ipc|Achieved Occupancy|Registers" \
    "$OUT/ncu-$PRECISION-f$flags.txt" | head -n 30
done
exit 0
