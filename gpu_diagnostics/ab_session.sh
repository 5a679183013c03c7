#!/usr/bin/env bash
# One device call for the A/Bs that wait for a GPU, each in one process behind its module-level
# switch (`profile_call.py --ab`; docs/perf-notes.md, nineteenth session, built without a GPU):
#   1. `triton`'s bias GEMM before the O(N) prologue (pipeline.BIAS_FIRST), eager latency
#      (`--latency`: an L2 flush, then device events around each call alone, as the sweep
#      times an eager row), bf16 and fp32 at N = 1024 and fp32 at N = 4096;
#   2. the same for problem openfold's triton-bias (triton_bias.BIAS_FIRST), fp32 and bf16 at
#      N = 2048;
#   3. triton-train's 16-bit narrow pair pass from its own config table
#      (bias_backward.NARROW_16BIT_TABLE), bf16 training step at N = 4096;
#   4. openfold triton-bias's flat pair pass at one program per SM, beside the sums of dS
#      (openfold.bias_backward.PAIR_PROGRAMS_PER_SM), training step at N = 2048;
# after `launch_overhead.py` (the host's time to issue a torch op, a GEMM, a Triton launch).
# Each A/B under LIM_AB seconds (default 60), so the whole fits a 10-minute call. Writes
# ab.log (and prints it).
#
#   OUT=DIR bash gpu_diagnostics/ab_session.sh
source gpu_diagnostics/session_env.sh
ab() {  # ab ARGS...: one profile_call.py A/B, its output appended to ab.log
    echo "## profile_call.py $*" >> "$OUT/ab.log"
    timeout -s INT "${LIM_AB:-60}" python3 gpu_diagnostics/profile_call.py "$@" \
        >> "$OUT/ab.log" 2>&1
}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  timeout -s INT 40 python3 gpu_diagnostics/launch_overhead.py
} > "$OUT/ab.log" 2>&1
first=variants.triton.pipeline:BIAS_FIRST
for cell in "1024 bf16" "1024 fp32" "4096 fp32"; do
    # shellcheck disable=SC2086  # N and dtype, two arguments
    ab $cell triton --pass forward --ab "$first" --latency
done
for dtype in fp32 bf16; do
    ab 2048 "$dtype" triton-bias --problem openfold --pass forward \
        --ab variants.openfold.triton_bias:BIAS_FIRST --latency
done
ab 4096 bf16 triton-train --ab variants.triton.bias_backward:NARROW_16BIT_TABLE
flat=variants.openfold.bias_backward:PAIR_PROGRAMS_PER_SM
for dtype in fp32 bf16; do
    ab 2048 "$dtype" triton-bias --problem openfold --ab "$flat=None" "$flat=1"
done
cat "$OUT/ab.log"
exit 0
