#!/usr/bin/env bash
# One device call for problem `openfold`'s fused Triton forward (issue #18): its GPU tests,
# the variant timed at N = 1024 / 2048 / 4096 in fp32 and bf16 with every autotune config's
# time (the best one recorded), the compiled kernels' registers and spills (no ncu), then the
# `openfold-default` sweep for triton and torch-compile and its report. Each stage runs under
# its own limit (LIM_TEST, LIM_BENCH, LIM_SWEEP seconds; 130 + 170 + 180 + 20 s < 9 min:
# the sweep is resumable and fsyncs each cell, so a cut one still reports what finished).
# Writes gpu-tests.log, bench.log, sweep.log, report.md and the sweep (results.csv,
# metadata.json) in $OUT/openfold: 6 files, under the device's 8.
#
#   OUT=DIR bash gpu_diagnostics/openfold_session.sh
#
# The timing stage is gpu_diagnostics/kernel_bench.py. CPU dry run of it (the kernel under
# the interpreter, tiny N, no autotuning):
#   OF_DRY=1 OUT=/tmp/of bash gpu_diagnostics/openfold_session.sh
source gpu_diagnostics/session_env.sh
if [ -n "${OF_DRY:-}" ]; then
    export TRITON_INTERPRET=1 OF_DEVICE=cpu OF_LENGTHS=${OF_LENGTHS:-40}
fi

if [ -z "${OF_DRY:-}" ]; then
    timeout -s INT "${LIM_TEST:-130}" python3 -m pytest -q -m gpu tests/test_openfold_triton.py \
        -p no:cacheprovider -rfE --tb=short 2>&1 | tail -40 > "$OUT/gpu-tests.log"
fi
timeout -s INT "${LIM_BENCH:-170}" python3 gpu_diagnostics/kernel_bench.py openfold \
    --device "${OF_DEVICE:-cuda}" --lengths ${OF_LENGTHS:-1024 2048 4096} 2>&1 \
    | grep -v Warn > "$OUT/bench.log"
if [ -z "${OF_DRY:-}" ]; then
    timeout -s INT "${LIM_SWEEP:-180}" python3 -m harness.cli sweep --preset openfold-default \
        --problem openfold --device cuda -o "$OUT/openfold" --no-plots --no-progress \
        --variant triton --variant torch-compile > "$OUT/sweep.log" 2>&1
    timeout -s INT 20 python3 -m harness.cli report "$OUT/openfold/results.csv" \
        > "$OUT/report.md" 2>&1
    rm -f "$OUT/openfold/.ipa-bench.lock"
    tail -5 "$OUT/gpu-tests.log"
fi
cat "$OUT/bench.log"
[ -f "$OUT/report.md" ] && head -40 "$OUT/report.md"
exit 0
