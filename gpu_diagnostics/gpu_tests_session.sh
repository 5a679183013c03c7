#!/usr/bin/env bash
# One device call for the GPU tests of the open issues' kernels: triton-train (#16), `triton`
# (#17), problem openfold's triton-bias (#18), the host-bound flag, the busy host before each
# sample, DirectLaunch and the 3xTF32 projections, in SHARDS processes (default 5) under LIM_TEST
# seconds each (default 540: on a fresh machine a shard's first training test autotunes for
# minutes; 110 s finished 8 of 44 tests on 2026-12-06). Writes gpu-tests.log (each test by outcome,
# NOT RUN where a limit cut it) under $OUT.
#
#   OUT=DIR bash gpu_diagnostics/gpu_tests_session.sh
source gpu_diagnostics/session_env.sh
sharded_pytest "${SHARDS:-5}" "${LIM_TEST:-540}" "$OUT/gpu-tests.log" -m gpu \
    tests/test_triton_backward.py tests/test_variants.py tests/test_openfold_triton.py \
    tests/test_integrity.py tests/test_triton_launch.py tests/test_training.py tests/test_triton.py \
    -k "(triton-train and not fullfuse) or (test_matches_oracle_gpu and triton-B) or triton-bias \
        or test_triton_bias_training or tiny_launches or busy_host or direct_launches or parked \
        or linear_3xtf32"
grep -cE "^(PASSED|XFAIL|XPASS) " "$OUT/gpu-tests.log" | sed 's/^/passed or xfail: /'
grep -E "^(FAILED|ERROR|NOT RUN)" "$OUT/gpu-tests.log"
