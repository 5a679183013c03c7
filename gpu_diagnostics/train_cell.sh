#!/usr/bin/env bash
# One training cell alone, for the question whether it fits: $VARIANT's forward+backward step
# at N = $LENGTH (default triton-train, 4096), eager, fp32 and bf16, seeds 2, through the sweep
# (so with the float64 oracle's gradients in the harness process beside the variant's worker),
# with the GPU's memory in use sampled every 2 s; then the parked-oracle GPU test. The fp32
# N = 4096 cell ran an 80 GB H100 out of memory until 2026-12-06 (twenty-second session), and
# takes ~160 s a dtype there, more than `checkpoint_session.sh`'s training stage leaves it.
# Stage limits LIM_CELL, LIM_TEST (seconds; 380 + 50). Writes t<N>.log, t<N>/ (the sweep: CSV,
# gradients, metadata) and t<N>-gpu-memory.log (MiB per sample) under $OUT.
#
#   OUT=DIR [VARIANT=...] [LENGTH=...] bash gpu_diagnostics/train_cell.sh
source gpu_diagnostics/session_env.sh
variant=${VARIANT:-triton-train}
length=${LENGTH:-4096}
grid=$(mktemp --suffix .toml)
printf '[base]\nmodes = ["eager"]\nseeds = 2\nbudget_s = 0.5\npasses = ["forward+backward"]\n
[[slice]]\nlength = [%s]\n' "$length" > "$grid"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -l 2 \
    > "$OUT/t$length-gpu-memory.log" &
sampler=$!
SECONDS=0
timeout -s INT "${LIM_CELL:-380}" python3 -m harness.cli sweep --grid "$grid" --device cuda \
    -o "$OUT/t$length" --no-plots --no-progress --variant "$variant" > "$OUT/t$length.log" 2>&1
echo "sweep rc=$? after ${SECONDS}s"
kill "$sampler"
rm -f "$OUT/t$length/.ipa-bench.lock"
python3 -c 'import sys; from harness.results import read_results
df = read_results(sys.argv[1])
print(df[["variant", "dtype", "length", "status", "median_ms", "host_ms", "peak_mem_mib",
          "err_ratio", "grad_err_ratio", "grad_worst", "reason"]].to_string(index=False))' \
    "$OUT/t$length/results.csv"
echo "GPU memory in use, most of any sample (MiB): $(sort -n "$OUT/t$length-gpu-memory.log" | tail -1)"
timeout "${LIM_TEST:-50}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_training.py \
    -k parked 2>&1 | tail -3
