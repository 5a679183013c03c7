#!/usr/bin/env bash
# One device call that decides `triton_ipa`'s prologue on a side stream beside the bias GEMM
# (`variants.triton.pipeline.PROLOGUE_BESIDE_BIAS`, off until measured; built in the
# twenty-fifth session without a GPU): A/Bs in one process each (`profile_call.py --ab`, the
# switch off then on) of the `triton` forward replayed at N = 256 and 1024 (the kernels alone)
# and eager at N = 4096 and 1024 (device events after an L2 flush, as the sweep times an eager
# row: the fork's host time counts), then the GPU test that the output is bitwise the
# one-stream output, eager and replayed. Each stage under its own limit; lines on stdout.
# Prediction (H100): replayed fp32 N = 256 0.0735 -> 0.062-0.066 ms, N = 1024 0.374 ->
# 0.340-0.350; eager N = 4096 fp32 4.65 -> ~4.55; eager bf16 N = 1024 +0.015-0.025 ms with the
# switch on (host-bound: why "auto" forks only when captured or at B N^2 >= 2048^2).
#
#   OUT=DIR bash gpu_diagnostics/prologue_beside_session.sh
source gpu_diagnostics/session_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
# ab LIMIT N DTYPE MODE_FLAG: one A/B of the switch
ab() {
    echo "## $4 N = $2 $3"
    timeout -s INT "$1" python3 gpu_diagnostics/profile_call.py "$2" "$3" triton --pass forward \
        "$4" --ab variants.triton.pipeline:PROLOGUE_BESIDE_BIAS 2>&1 | grep "BESIDE"
}
ab "${LIM_AB:-45}" 256 fp32 --graph
ab "${LIM_AB:-45}" 1024 fp32 --graph
ab "${LIM_AB:-45}" 256 bf16 --graph
ab "${LIM_AB:-45}" 4096 fp32 --latency
ab "${LIM_AB:-45}" 1024 bf16 --latency
timeout -s INT "${LIM_TEST:-90}" python3 -m pytest -q -p no:cacheprovider -rfEpxX --tb=short \
    -m gpu tests/test_triton.py -k prologue_beside 2>&1 | tail -8
