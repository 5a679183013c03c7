#!/usr/bin/env bash
# One device call that decides the O(N) prologue on a side stream beside the pair-bias GEMM
# (`variants.triton.common.PROLOGUE_BESIDE`, off until measured; built in the twenty-fifth
# session without a GPU) for `triton` and problem openfold's `triton-bias`. A/Bs run in one
# process each (`profile_call.py --ab`, the switch off then on):
#   - the `triton` forward replayed at N = 256 and 1024 (the kernels alone);
#   - eager at N = 4096 and 1024 (device events after an L2 flush, as the sweep times an eager
#     row: the fork's host time counts);
#   - openfold triton-bias eager at N = 2048.
# Then the GPU test that the output is bitwise the one-stream output, eager and replayed. Each
# stage runs under its own limit; lines on stdout.
# Prediction (H100):
#   - replayed fp32 N = 256 0.0735 -> 0.062-0.066 ms, N = 1024 0.374 -> 0.340-0.350;
#   - eager N = 4096 fp32 4.65 -> ~4.55; openfold fp32 N = 2048 2.31 -> ~2.25;
#   - eager bf16 N = 1024 +0.015-0.025 ms with the switch on (host-bound: why "auto" forks only
#     when captured or at B N^2 >= 2048^2).
#
#   OUT=DIR bash gpu_diagnostics/prologue_beside_session.sh
source gpu_diagnostics/session_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
# ab LIMIT N DTYPE VARIANT PROFILE_CALL_ARGS...: one A/B of the switch
ab() {
    local limit=$1 n=$2 dtype=$3 variant=$4
    shift 4
    echo "## $variant N = $n $dtype $*"
    timeout -s INT "$limit" python3 gpu_diagnostics/profile_call.py "$n" "$dtype" "$variant" \
        --pass forward "$@" --ab variants.triton.common:PROLOGUE_BESIDE 2>&1 | grep "BESIDE"
}
ab "${LIM_AB:-45}" 256 fp32 triton --graph
ab "${LIM_AB:-45}" 1024 fp32 triton --graph
ab "${LIM_AB:-45}" 256 bf16 triton --graph
ab "${LIM_AB:-45}" 4096 fp32 triton --latency
ab "${LIM_AB:-45}" 1024 bf16 triton --latency
ab "${LIM_AB:-60}" 2048 fp32 triton-bias --problem openfold --latency
timeout -s INT "${LIM_TEST:-120}" python3 -m pytest -q -p no:cacheprovider -rfEpxX --tb=short \
    -m gpu tests/test_triton.py -k prologue_beside 2>&1 | tail -8
