#!/usr/bin/env bash
# One device call for `triton-pairdot` (issue #17, deliverable 2): its GPU tests and those of
# the openfold triton kernel it shares, every autotune config's kernel time and the forward at
# N = 1024 / 2048 / 4096 in fp32 and bf16 (the autotuner's best recorded), then a sweep of
# triton-pairdot against triton and cuda-fused along N (256..4096, eager, and CUDA-graph
# replay at N = 256) and its report. Each stage runs under its own limit (LIM_TEST, LIM_BENCH,
# LIM_SWEEP seconds; 100 + 150 + 240 s): the sweep is resumable and fsyncs each cell, so a cut
# one still reports what finished.
# Writes gpu-tests.log, bench.log, sweep.log, report.md, results.csv, metadata.json in $OUT:
# 6 files, under the device's 8.
#
#   OUT=DIR bash gpu_diagnostics/pairdot_session.sh
#
# The timing stage is gpu_diagnostics/kernel_bench.py. CPU dry run of it (the kernel under
# the interpreter, tiny N, no autotuning):
#   PD_DRY=1 OUT=/tmp/pd bash gpu_diagnostics/pairdot_session.sh
source gpu_diagnostics/session_env.sh
if [ -n "${PD_DRY:-}" ]; then
    export TRITON_INTERPRET=1 PD_DEVICE=cpu PD_LENGTHS=${PD_LENGTHS:-40}
else
    timeout -s INT "${LIM_TEST:-100}" python3 -m pytest -q -m gpu tests/test_variants.py \
        tests/test_openfold_triton.py -k "pairdot or openfold" -p no:cacheprovider -rfE \
        --tb=short 2>&1 | tail -30 > "$OUT/gpu-tests.log"
fi
timeout -s INT "${LIM_BENCH:-150}" python3 gpu_diagnostics/kernel_bench.py simplified \
    --device "${PD_DEVICE:-cuda}" --lengths ${PD_LENGTHS:-1024 2048 4096} 2>&1 \
    | grep -v Warn > "$OUT/bench.log"
if [ -z "${PD_DRY:-}" ]; then
    grid=$(mktemp --suffix .toml)
    printf '[base]\nmodes = ["eager", "graph"]\nseeds = 2\nbudget_s = 0.5\n\n[[slice]]\nlength = [256, 1024, 2048, 4096]\n' > "$grid"
    timeout -s INT "${LIM_SWEEP:-240}" python3 -m harness.cli sweep --grid "$grid" \
        --device cuda -o "$OUT/sweep" --no-plots --no-progress --variant triton-pairdot \
        --variant triton --variant cuda-fused > "$OUT/sweep.log" 2>&1
    timeout -s INT 20 python3 -m harness.cli report "$OUT/sweep/results.csv" > "$OUT/report.md" 2>&1
    mv "$OUT/sweep/results.csv" "$OUT/sweep/metadata.json" "$OUT/" 2>/dev/null
    rm -rf "$OUT/sweep"
    tail -5 "$OUT/gpu-tests.log"
fi
cat "$OUT/bench.log"
[ -f "$OUT/report.md" ] && head -60 "$OUT/report.md"
exit 0
