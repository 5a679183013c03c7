#!/usr/bin/env bash
# One device call for problem `openfold`'s fused forwards (issue #18): the GPU tests of OF_TESTS
# (default tests/test_openfold_triton.py: `triton` (fused) and `triton-bias` (three kernels)),
# torch.profiler on one OF_PROFILE (default triton-bias) forward at N = 2048 in fp32 and bf16
# (time per kernel, each autotuned kernel's configs), with OF_AB an A/B of OF_PROFILE at N = 2048
# in both dtypes (CUDA-graph replay, one process) under each of OF_AB's MODULE:NAME=VALUE settings,
# then the `openfold-default` sweep for OF_VARIANTS (default triton, triton-bias, torch-compile)
# and its report. The CUDA kernel (thirtieth and thirty-first sessions):
#   OF_TESTS=tests/test_openfold_cuda.py OF_PROFILE=cuda-fused OF_VARIANTS="cuda-fused triton-bias"
#   OF_AB="variants.openfold.cuda_fused:BALANCED_ROLES=True variants.openfold.cuda_fused:BALANCED_ROLES=False"
# With OF_BENCH=1 also the fused kernel timed at N = 1024 / 2048 / 4096 with every autotune
# config's time and the compiled kernels' registers and spills (kernel_bench.py). Each stage
# runs under its own limit (LIM_TEST, LIM_PROF per profile, LIM_AB per dtype, LIM_BENCH,
# LIM_SWEEP seconds; 150 + 2 x 55 + 300 + 20 s < 10 min without the A/B and the bench: the sweep
# is resumable and fsyncs each cell, so a cut one still reports what finished); a limit of 0
# skips its stage. Writes gpu-tests.log, profile.log, ab.log, sweep.log, report.md (bench.log)
# and the sweep (results.csv, metadata.json) in $OUT/openfold: at most 8 files, the device's
# limit.
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

# stage LIMIT: whether a stage with this limit runs (a limit of 0 skips it: `timeout 0` never stops)
stage() { [ -z "${OF_DRY:-}" ] && [ "$1" -gt 0 ]; }
if stage "${LIM_TEST:-150}"; then
    # shellcheck disable=SC2086  # OF_TESTS may name several files
    timeout -s INT "${LIM_TEST:-150}" python3 -m pytest -q -m gpu ${OF_TESTS:-tests/test_openfold_triton.py} \
        -p no:cacheprovider -rfE --tb=short 2>&1 | tail -40 > "$OUT/gpu-tests.log"
fi
if stage "${LIM_PROF:-55}"; then
    for precision in fp32 bf16; do
        timeout -s INT "${LIM_PROF:-55}" python3 gpu_diagnostics/profile_call.py 2048 \
            "$precision" "${OF_PROFILE:-triton-bias}" --problem openfold --pass forward
    done > "$OUT/profile.log" 2>&1
fi
if [ -n "${OF_AB:-}" ] && stage "${LIM_AB:-60}"; then
    for precision in bf16 fp32; do
        # shellcheck disable=SC2086  # OF_AB holds several settings
        timeout -s INT "${LIM_AB:-60}" python3 gpu_diagnostics/profile_call.py 2048 "$precision" \
            "${OF_PROFILE:-triton-bias}" --problem openfold --pass forward --graph --ab $OF_AB 2>&1 \
            | grep -E "A/B|median|rror"
    done > "$OUT/ab.log"
fi
if [ -n "${OF_DRY:-}${OF_BENCH:-}" ]; then
    timeout -s INT "${LIM_BENCH:-170}" python3 gpu_diagnostics/kernel_bench.py openfold \
        --device "${OF_DEVICE:-cuda}" --lengths ${OF_LENGTHS:-1024 2048 4096} 2>&1 \
        | grep -v Warn > "$OUT/bench.log"
fi
if stage "${LIM_SWEEP:-300}"; then
    timeout -s INT "${LIM_SWEEP:-300}" python3 -m harness.cli sweep --preset openfold-default \
        --problem openfold --device cuda -o "$OUT/openfold" --no-plots --no-progress \
        $(for v in ${OF_VARIANTS:-triton triton-bias torch-compile}; do echo --variant "$v"; done) \
        > "$OUT/sweep.log" 2>&1
    timeout -s INT 20 python3 -m harness.cli report "$OUT/openfold/results.csv" \
        > "$OUT/report.md" 2>&1
    rm -f "$OUT/openfold/.ipa-bench.lock"
fi
[ -f "$OUT/gpu-tests.log" ] && tail -5 "$OUT/gpu-tests.log"
[ -f "$OUT/ab.log" ] && cat "$OUT/ab.log"
[ -f "$OUT/bench.log" ] && cat "$OUT/bench.log"
[ -f "$OUT/profile.log" ] && grep -E "_kernel " "$OUT/profile.log"
[ -f "$OUT/report.md" ] && head -40 "$OUT/report.md"
exit 0
