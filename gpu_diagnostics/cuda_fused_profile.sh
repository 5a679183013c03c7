#!/usr/bin/env bash
# Profile of the cuda-fused kernel on the GPU machine (run from the repo root; OUT= a folder):
# the kernel alone in each kernel class that takes the default config (A/B timings, cuda_kernel_diag.py
# ab), then ncu's full section set on one launch at N = $NCU_N per kernel class in $NCU_KLASS,
# saved as the details page and the per-SASS-line source counters (stall samples).
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}
PRECISION=${PRECISION:-fp32}
mkdir -p "$OUT"
timeout "${LIM_AB:-150}" python3 gpu_diagnostics/cuda_kernel_diag.py env ab --lengths "${AB_N:-1024,4096}" \
  --out "$OUT" 2>&1 | tee "$OUT/ab.log"
for klass in ${NCU_KLASS:-2 0}; do
  rep=/tmp/ncu-fused-$PRECISION-k$klass
  echo "=== ncu, kernel class $klass"
  timeout "${LIM_NCU:-150}" ncu --clock-control none --kernel-name regex:"ipa_fused_(af2_)?kernel" \
    --launch-count 1 --set full --import-source yes -f -o "$rep" \
    python3 gpu_diagnostics/cuda_kernel_diag.py ncu-target --length "${NCU_N:-4096}" \
    --precision "$PRECISION" --klass "$klass" 2>&1 | tail -n 5
  ncu --import "$rep.ncu-rep" --page details > "$OUT/ncu-$PRECISION-k$klass.txt" 2>&1
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/ncu-$PRECISION-k$klass-sass.csv" 2>&1
  grep -E "Duration|Throughput|Warp Cycles Per Issued|Issued Ipc|Achieved Occupancy|Registers" \
    "$OUT/ncu-$PRECISION-k$klass.txt" | head -n 30
done
exit 0
